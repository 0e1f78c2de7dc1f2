"""Get a runnable kernel: JIT through the CuTe DSL where it and a GPU exist, else an AOT build.

Both routes give the same callable (a tvm-ffi function taking torch CUDA tensors), so the
code that launches kernels does not care which one it got.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Callable

from .aot import BuildDir
from .errors import Fa4traceError

DEFAULT_BUILD = "build/kernels"


def build_dir(path: str | os.PathLike | None = None) -> Path:
    return Path(path or os.environ.get("FA4TRACE_BUILD") or DEFAULT_BUILD)


def can_jit() -> bool:
    if importlib.util.find_spec("cutlass") is None:
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


_JIT_CACHE: dict[tuple, Callable] = {}


def get_kernel(kind: str, *, build: str | os.PathLike | None = None, prefer_jit: bool | None = None,
               **config) -> tuple[Callable, str]:
    """(callable, how) for the kernel of this kind whose config matches; how = 'jit' or 'aot:<dir>'."""
    use_jit = can_jit() if prefer_jit is None else prefer_jit
    if use_jit and build is None:
        import torch

        from fa4trace import kernels

        p = torch.cuda.get_device_properties(0)
        arch = f"sm_{p.major}{p.minor}{'a' if p.major >= 9 else ''}"
        os.environ.setdefault("CUTE_DSL_ARCH", arch)
        for name, thunk, entry in kernels.aot_variants(arch, only=(kind,)):
            if all(entry.config.get(k) == v for k, v in config.items()):
                key = (name, arch)
                if key not in _JIT_CACHE:
                    _JIT_CACHE[key] = thunk()
                return _JIT_CACHE[key], "jit"
        want = ", ".join(f"{k}={v}" for k, v in config.items())
        raise Fa4traceError(f"no {kind} kernel variant with {want}")
    bd = BuildDir(build_dir(build))
    return bd.function(bd.find(kind, **config)), f"aot:{bd.path}"
