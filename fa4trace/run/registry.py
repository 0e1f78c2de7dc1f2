"""The kinds of kernel ``fa4trace.run.loader`` can get, each registered once by name.

A ``KernelKind`` says where the kind's AOT builds live (an environment variable and a default
folder), which Python packages a JIT compile needs besides the CuTe DSL, how to compile one
kernel of it here, and the command that makes a build. The loader looks kinds up here and knows
none itself; the kinds fa4trace ships are registered by ``fa4trace.kinds``, and any
other package registers its own with ``register``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..format.errors import Fa4traceError


@dataclass(frozen=True)
class Loaded:
    """A runnable kernel and what was compiled."""

    fn: Callable
    name: str
    config: dict
    how: str  # "jit" or "aot:<build folder>": stored in trace metadata
    build: Any = None  # the aot.BuildDir it came from (None when compiled here)


@dataclass(frozen=True)
class KernelKind:
    """How the loader gets kernels of one kind.

    ``compile(arch, name, config)`` compiles the kernel named ``name`` (or, with no name, the
    one whose config holds every key=value of ``config``) for ``arch`` in this process and
    returns a ``Loaded`` with how="jit". ``build_command`` is shown when no AOT build is found;
    ``{path}`` stands for the folder looked in."""

    name: str
    compile: Callable[[str, Optional[str], dict], Loaded]
    build_env: str = "FA4TRACE_BUILD"
    default_build: str = "build/kernels"
    jit_needs: tuple[str, ...] = ()
    build_command: str = "fa4trace build -o {path}"


_KINDS: dict[str, KernelKind] = {}


def register(kind: KernelKind) -> KernelKind:
    """Make ``kind`` known to the loader; registering the same name again replaces it."""
    _KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Forget the kind called ``name`` (nothing happens when it is not registered)."""
    _KINDS.pop(name, None)


def names() -> list[str]:
    """The registered kinds, sorted."""
    return sorted(_KINDS)


def get(name: str) -> KernelKind:
    """The registered kind called ``name``, or a one-line Fa4traceError naming the known ones."""
    try:
        return _KINDS[name]
    except KeyError:
        raise Fa4traceError(f"no kernel kind {name!r}; registered kinds: {', '.join(names()) or 'none'}") from None
