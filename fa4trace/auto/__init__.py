"""Automatic events for any CuTe DSL kernel (``fa4trace.instrument``).

    events    the per-compile event table and vocabulary (host-only)
    patches   swap / restore attributes while a kernel compiles (host-only)
    state     what the hooks know while one kernel traces
    families  the hooks: pipeline, tma, mma, barrier (needs cutlass)
    entry     the trace buffer as one more kernel argument (needs cutlass)
    compiler  compile_traced: cute.compile with all of the above (needs cutlass)
    run       Instrumented: run, check against the plain kernel, decode (torch + GPU)
    registry  the process's compiled kernels and the caches that may hold them (from import fa4trace on)
    plans     what moves out of a cache: a compiled kernel, or a plan around one (host-only)
    reach     a window's hold on the caches, the calls it could not reach, the disk switches
    reuse     traced builds kept for later windows and blocks
    schedule  which steps of a long run trace (torch.profiler's schedule)
    block     one block: the compile hook, its windows, everything put back
    api       instrument(): the context manager users call
"""

from .events import FAMILIES  # noqa: F401
