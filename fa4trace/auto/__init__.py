"""Automatic events for any CuTe DSL kernel (``fa4trace.instrument``).

    events    the per-compile event table and vocabulary (host-only)
    patches   swap / restore attributes while a kernel compiles (host-only)
    state     what the hooks know while one kernel traces
    families  the hooks: pipeline, tma, mma, barrier (needs cutlass)
    entry     the trace buffer as one more kernel argument (needs cutlass)
    compiler  compile_traced: cute.compile with all of the above (needs cutlass)
    run       Instrumented: run, check against the plain kernel, decode (torch + GPU)
    api       instrument(): the context manager users call
"""

from .events import FAMILIES  # noqa: F401
