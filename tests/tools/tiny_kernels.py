"""Tiny CuTe DSL kernels compiled on the CPU (no GPU: set CUTE_DSL_ARCH=sm_90a), for the tests of
``fa4trace.instrument()``'s block, caches, threads and capture windows.

``Copy()`` is one kernel: ``compile()`` compiles it (what a library does on a cache miss),
``compiles`` counts the DSL functions made since the object was made (every JitCompiledFunction
constructed in the process, traced and plain builds alike).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


def fake():
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    return make_fake_compact_tensor(cutlass.Float32, (cute.sym_int(),), assumed_align=16)


class Made:
    """Counts the DSL's compiled functions made in this process from now on (the DSL's own
    constructor, wrapped for the count and put back by ``close``)."""

    def __init__(self):
        from cutlass.base_dsl.jit_executor import JitCompiledFunction

        self.n = 0
        self._cls = JitCompiledFunction
        self._real = JitCompiledFunction.__init__
        made = self

        def __init__(obj, *a, **k):
            made.n += 1
            return made._real(obj, *a, **k)

        JitCompiledFunction.__init__ = __init__

    def close(self):
        self._cls.__init__ = self._real


class Copy:
    """One element-wise copy kernel; ``compile()`` compiles it through ``cute.compile``."""

    def __init__(self, options: str = "--enable-tvm-ffi"):
        import auto_probe

        self.entry, self.kernel = auto_probe.copy_kernel()
        self.options = options

    def compile(self):
        import cutlass.cute as cute

        return cute.compile(self.entry, fake(), fake(), options=self.options)
