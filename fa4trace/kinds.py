"""The kernel kinds fa4trace ships, registered into ``fa4trace.run.registry``.

* ``fa4trace.kernels``' kinds (``kernels.KINDS``: calibration, markers, known_answer, attention): a JIT
  compile is the matching entry of ``kernels.aot_variants``; builds come from ``fa4trace build``
  into ``$FA4TRACE_BUILD`` or build/kernels.
* ``fa4``: upstream FlashAttention-4 (``fa4trace.fa4``): a JIT compile needs flash-attn-4 and
  takes the compile arguments as config (arch, schedule, d, hq, hkv, sq, dtype, traced);
  builds come from ``python -m fa4trace.fa4.buildtool`` into ``$FA4TRACE_FA4_BUILD`` or
  build/fa4_sm90.

Importing this module imports neither cutlass nor the kernels; ``register_shipped`` only
records how to reach them.
"""

from __future__ import annotations

from typing import Optional

from .format.errors import Fa4traceError
from .run.registry import KernelKind, Loaded, register

FA4 = "fa4"


def compile_own(kind: str):
    """The JIT compile of one of ``fa4trace.kernels``' kinds: the variant named ``name``, or
    the first whose config holds every key=value given."""

    def compile_kernel(arch: str, name: Optional[str], config: dict) -> Loaded:
        from .kernels import aot_variants

        for n, thunk, entry in aot_variants(arch, only=(kind,)):
            if (name is not None and n == name) or (name is None and all(entry.config.get(k) == v
                                                                         for k, v in config.items())):
                return Loaded(thunk(), n, entry.config, "jit")
        want = name or ", ".join(f"{k}={v}" for k, v in config.items())
        raise Fa4traceError(f"no {kind} kernel {want} for {arch}")

    return compile_kernel


def compile_fa4(arch: str, name: Optional[str], config: dict) -> Loaded:
    """FA4's forward compiled here; ``config`` holds its compile arguments (its own ``arch``,
    "sm90" or "sm100", wins over the CuTe DSL target)."""
    from .fa4.build import compile_fa4 as compile_forward

    cfg = dict(config)
    fa4_arch = cfg.pop("arch")
    cfg.pop("variant", None)
    c = compile_forward(fa4_arch, **cfg)
    return Loaded(c.fn, FA4, dict(c.config, params=c.params), "jit")


def register_shipped() -> None:
    """Register every kind fa4trace ships (again: the same kinds)."""
    from .kernels import KINDS

    for kind in KINDS:
        register(KernelKind(kind, compile_own(kind)))
    register(KernelKind(FA4, compile_fa4, build_env="FA4TRACE_FA4_BUILD", default_build="build/fa4_sm90",
                        jit_needs=("flash_attn",), build_command="python -m fa4trace.fa4.buildtool -o {path}"))
