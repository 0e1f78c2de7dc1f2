"""Get a runnable kernel by kind and config: compiled here (JIT) where the CuTe DSL and a GPU
are both present, else loaded from an AOT build folder (``fa4trace build``).

One loader for every kernel fa4trace runs: the decode-attention variants, the calibration and
marker kernels (``fa4trace.kernels``) and upstream FlashAttention-4 (``fa4trace.fa4``). Both
routes give the same callable (a tvm-ffi function taking torch CUDA tensors), so launch code
does not care which one it got. JIT compiles and opened build folders are cached per process.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from .errors import DeviceUnavailable, Fa4traceError

DEFAULT_BUILD = "build/kernels"
# Where each kind's AOT build lives unless named: (environment variable, default folder).
BUILD_LOCATIONS = {"fa4": ("FA4TRACE_FA4_BUILD", "build/fa4_sm90")}
_DEFAULT_LOCATION = ("FA4TRACE_BUILD", DEFAULT_BUILD)
# Python packages a JIT compile of each kind needs besides cutlass.
_JIT_NEEDS = {"fa4": ("flash_attn",)}


@dataclass(frozen=True)
class Loaded:
    """A runnable kernel and what was compiled."""

    fn: Callable
    name: str
    config: dict
    how: str  # "jit" or "aot:<build folder>": stored in trace metadata
    build: Any = None  # the aot.BuildDir it came from (None when compiled here)


def gpu_arch(device: int = 0) -> str:
    """The CuTe DSL target of this GPU, e.g. "sm_90a" (H100/H200) or "sm_100a" (B200)."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


def can_jit(kind: str = "attention") -> bool:
    """True where kernels of ``kind`` can be compiled and run here: the DSL (and, for FA4,
    flash-attn-4) importable and a CUDA GPU present."""
    for mod in ("cutlass", *_JIT_NEEDS.get(kind, ())):
        if importlib.util.find_spec(mod) is None:
            return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def build_dir(path: str | os.PathLike | None = None, kind: str = "attention") -> Path:
    """The AOT build folder for ``kind``: ``path``, else its environment variable, else the default."""
    env, default = BUILD_LOCATIONS.get(kind, _DEFAULT_LOCATION)
    return Path(path or os.environ.get(env) or default)


def use_jit(build: str | os.PathLike | None = None, kind: str = "attention") -> bool:
    """JIT where it can run, unless a build folder is named (argument or environment)."""
    env, _ = BUILD_LOCATIONS.get(kind, _DEFAULT_LOCATION)
    return build is None and not os.environ.get(env) and can_jit(kind)


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
    key=value. FA4 takes its compile arguments as config (arch, schedule, d, hq, hkv, sq, dtype,
    traced) and has no names to look up."""
    if use_jit(build, kind):
        arch = gpu_arch()
        os.environ.setdefault("CUTE_DSL_ARCH", arch)
        key = (kind, arch, name, repr(sorted(config.items())))
        if key not in _JIT:
            _JIT[key] = _compile(kind, arch, name, config)
        return _JIT[key]
    path = build_dir(build, kind)
    if not (path / "manifest.json").is_file():
        how = (f"`fa4trace build -o {path}`" if kind not in BUILD_LOCATIONS
               else f"`python -m fa4trace.fa4.buildtool -o {path}`")
        raise DeviceUnavailable(f"no {kind} kernel build at {path} and no CuTe DSL with a GPU here to compile "
                                f"one: build it with {how} on any machine with nvidia-cutlass-dsl "
                                f"(or name a build folder)")
    bd = open_build(path)
    if name is None:
        name = bd.find(kind, **config)
    elif name not in bd.functions:
        raise Fa4traceError(f"no kernel {name} in {path}; rebuild it with this fa4trace (`fa4trace build`)")
    return Loaded(bd.function(name), name, bd.functions[name]["config"], f"aot:{path}", bd)


def _compile(kind: str, arch: str, name: Optional[str], config: dict) -> Loaded:
    if kind == "fa4":
        from .fa4.build import compile_fa4

        cfg = dict(config)
        fa4_arch = cfg.pop("arch")
        cfg.pop("variant", None)
        c = compile_fa4(fa4_arch, **cfg)
        return Loaded(c.fn, "fa4", dict(c.config, params=c.params), "jit")
    from . import kernels

    for n, thunk, entry in kernels.aot_variants(arch, only=(kind,)):
        if (name is not None and n == name) or (name is None and all(entry.config.get(k) == v
                                                                     for k, v in config.items())):
            return Loaded(thunk(), n, entry.config, "jit")
    want = name or ", ".join(f"{k}={v}" for k, v in config.items())
    raise Fa4traceError(f"no {kind} kernel {want} for {arch}")
