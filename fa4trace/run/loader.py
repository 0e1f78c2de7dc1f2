"""Get a runnable kernel by kind and config: compiled here (JIT) where the CuTe DSL and a GPU
are both present, else loaded from an AOT build folder.

The loader is the same for every kind of kernel: what differs (where a kind's builds live, what
its JIT compile needs, how it compiles) is the kind's ``KernelKind`` in
``fa4trace.run.registry``; the kinds fa4trace ships (``fa4trace.kinds``) are
registered when ``fa4trace`` is imported. Both routes give the same callable (a tvm-ffi function
taking torch CUDA tensors), so launch code does not care which one it got. JIT compiles and
opened build folders are cached per process.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Optional

from ..format.errors import DeviceUnavailable, Fa4traceError
from .registry import Loaded, get

__all__ = ["Loaded", "build_dir", "can_jit", "gpu_arch", "load", "open_build", "use_jit"]


def gpu_arch(device: int = 0) -> str:
    """The CuTe DSL target of this GPU, e.g. "sm_90a" (H100/H200) or "sm_100a" (B200)."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


def can_jit(kind: str) -> bool:
    """True where kernels of ``kind`` can be compiled and run here: the DSL and whatever else
    the kind's JIT compile needs importable, and a CUDA GPU present."""
    for mod in ("cutlass", *get(kind).jit_needs):
        if importlib.util.find_spec(mod) is None:
            return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def build_dir(path: str | os.PathLike | None, kind: str) -> Path:
    """The AOT build folder for ``kind``: ``path``, else its environment variable, else the default."""
    k = get(kind)
    return Path(path or os.environ.get(k.build_env) or k.default_build)


def use_jit(build: str | os.PathLike | None, kind: str) -> bool:
    """JIT where it can run, unless a build folder is named (argument or environment)."""
    return build is None and not os.environ.get(get(kind).build_env) and can_jit(kind)


_JIT: dict = {}
_BUILDS: dict = {}


def open_build(path: str | os.PathLike):
    """The ``aot.BuildDir`` at ``path`` (one per folder and process: its library loads once)."""
    from .aot import BuildDir

    key = str(Path(path).resolve())
    if key not in _BUILDS:
        _BUILDS[key] = BuildDir(path)
    return _BUILDS[key]


def load(kind: str, *, name: Optional[str] = None, build: str | os.PathLike | None = None, **config) -> Loaded:
    """The kernel of ``kind`` named ``name`` or, without a name, whose config holds every given
    key=value (a kind whose kernels have no names takes its compile arguments as config)."""
    k = get(kind)
    if use_jit(build, kind):
        arch = gpu_arch()
        os.environ.setdefault("CUTE_DSL_ARCH", arch)
        key = (kind, arch, name, repr(sorted(config.items())))
        if key not in _JIT:
            _JIT[key] = k.compile(arch, name, config)
        return _JIT[key]
    path = build_dir(build, kind)
    if not (path / "manifest.json").is_file():
        raise DeviceUnavailable(f"no {kind} kernel build at {path} and no CuTe DSL with a GPU here to compile "
                                f"one: build it with `{k.build_command.format(path=path)}` on any machine with "
                                "nvidia-cutlass-dsl (or name a build folder)")
    bd = open_build(path)
    if name is None:
        name = bd.find(kind, **config)
    elif name not in bd.functions:
        raise Fa4traceError(f"no kernel {name} in {path}; rebuild it with this fa4trace "
                            f"(`{k.build_command.format(path=path)}`)")
    return Loaded(bd.function(name), name, bd.functions[name]["config"], f"aot:{path}", bd)
