"""``fa4trace.instrument``: per-warp timelines of any CuTe DSL kernel, without editing it.

    with fa4trace.instrument() as recording:          # around the code that compiles
        gemm = cute.compile(my_gemm, a, b, c, stream)   # or any library call that compiles
    gemm(a, b, c, stream)                          # runs traced: a buffer is appended
    recording.trace().save("gemm.parquet")           # one bundle: Perfetto, analysis, viewer

Inside the block ``cute.compile`` (under every name it is imported by) compiles with automatic
events (``fa4trace.auto.compiler``) and returns an ``Instrumented`` callable that takes the
same arguments as the plain compiled function. Everything is put back when the block ends.
"""

from __future__ import annotations

import contextlib
from typing import Optional

from .events import FAMILIES
from .patches import Patches
from .run import DEFAULT_CAPACITY, DEFAULT_CTAS, Instrumented, RecordOptions


class Recording:
    """What one ``instrument`` block compiled: ``kernels`` (Instrumented, in compile order)."""

    def __init__(self, *, families, kernels, roles, cursor, options: RecordOptions, warps_per_cta, spans=None,
                 l2: str = "first", split: bool = True):
        self.families = tuple(families)
        self.extra_kernels = tuple(kernels)
        self.roles = dict(roles) if roles else None
        self.cursor = cursor
        self.options = options
        self.warps_per_cta = warps_per_cta
        self.spans = dict(spans or {})
        self.l2 = l2
        self.split = split
        self.kernels: list[Instrumented] = []

    def compile(self, real_compile, fn, *args, **kwargs) -> Instrumented:
        from .compiler import compile_traced

        c = compile_traced(fn, *args, families=self.families, kernels=self.extra_kernels, cursor=self.cursor,
                           check=self.options.check, spans=self.spans, l2=self.l2, split=self.split,
                           compile_fn=real_compile, **kwargs)
        meta = dict(c.meta, roles=self.roles, params=c.params)
        if self.warps_per_cta:
            meta["warps_per_cta"] = int(self.warps_per_cta)
        tvm_ffi = "enable-tvm-ffi" in str(kwargs.get("options", "")) or "enable-tvm-ffi" in str(
            getattr(real_compile, "_compile_options", ""))
        k = Instrumented(c.fn, c.vocab, meta, plain=c.plain, options=self.options,
                         to_arg=(lambda t: t) if tvm_ffi else _from_dlpack)
        k.compiled = c
        self.kernels.append(k)
        return k

    def trace(self, index: int = -1, **kw):
        """The bundle of the ``index``-th compiled kernel's launches (default: the last)."""
        from ..errors import Fa4traceError

        if not self.kernels:
            raise Fa4traceError("nothing was compiled inside fa4trace.instrument()")
        return self.kernels[index].trace(**kw)


def _from_dlpack(t):
    from cutlass.cute.runtime import from_dlpack

    return from_dlpack(t, assumed_align=16)


class _CompileProxy:
    """Stands in for ``cute.compile`` (a CompileCallable): same call, same ``[options]``."""

    def __init__(self, real, recording: Recording):
        self._real, self._recording = real, recording

    def __getitem__(self, options):
        return _CompileProxy(self._real[options], self._recording)

    def __getattr__(self, name):
        return getattr(self._real, name)

    def __call__(self, fn, *args, **kwargs):
        return self._recording.compile(self._real, fn, *args, **kwargs)


@contextlib.contextmanager
def instrument(*, families=FAMILIES, kernels=(), roles: Optional[dict] = None, cursor: str = "smem",
               ctas: int = DEFAULT_CTAS, capacity: int = DEFAULT_CAPACITY, cta_stride: int = 1,
               warps=None, check: bool = True, warps_per_cta: Optional[int] = None, spans: Optional[dict] = None,
               l2: str = "first", split: bool = True):
    """Compile every CuTe DSL kernel inside the block with automatic events.

    ``families``: which of pipeline, tma, mma, barrier to record (fewer cost less; warp
    lifetimes always record). ``kernels``: classes or ``@cute.kernel`` functions to instrument
    beyond those of the compiled entry. ``roles``: {"producer": [8, 9, 10, 11], ...} names warps
    by index in the CTA (else inferred from what they record). ``ctas`` / ``cta_stride`` /
    ``warps`` / ``capacity``: who records, how much. ``check``: each launch also runs the plain
    kernel and must match it bit for bit. ``spans``: {"softmax": "module:Class.method", ...}:
    every call of those functions becomes a span of that name (what no generic hook can know);
    {"step": {"target": "module:Class.method", "payload": "n_block"}} also records that integer
    argument of each call as the span's iteration.
    ``l2``: the record stores' L2 policy, "first" (records leave L2 before reused data) or "last".
    ``split``: CTAs that do not record run a copy of the kernel body with no instrumentation in
    it (default; a sampled launch then slows only the CTAs it records); False compiles one body.
    """
    import cutlass.cute as cute

    from .compiler import require_dsl

    require_dsl()
    recording = Recording(families=families, kernels=kernels, roles=roles, cursor=cursor,
                          options=RecordOptions(ctas=ctas, capacity=capacity, cta_stride=cta_stride,
                                                warps=tuple(warps) if warps else None, check=check),
                          warps_per_cta=warps_per_cta, spans=spans, l2=l2, split=split)
    real = cute.compile
    proxy = _CompileProxy(real, recording)
    patches = Patches()
    patches.set_everywhere({id(real): (real, proxy)})
    try:
        yield recording
    finally:
        patches.restore()
