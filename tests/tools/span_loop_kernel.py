"""A kernel whose loop calls a helper with the loop index (fa4trace.instrument spans with a
payload, tests/test_auto_compile.py). Import after CUTE_DSL_ARCH is set."""

import cutlass
import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def step(dst: cute.Tensor, i: Int32, scale: float = 2.0):
    dst[i] = dst[i] * scale + 1.0


@cute.kernel
def loop_kernel(dst: cute.Tensor, n: Int32):
    for i in cutlass.range(n, unroll=1):
        step(dst, i)


@cute.jit
def loop_entry(dst: cute.Tensor, n: Int32):
    loop_kernel(dst, n).launch(grid=(1, 1, 1), block=(32, 1, 1))


@cute.jit
def step_sync(dst: cute.Tensor, i: Int32):
    """A helper with a named barrier inside: a span around it brackets a hooked call."""
    dst[i] = dst[i] + 1.0
    cute.arch.barrier()


@cute.kernel
def sync_loop_kernel(dst: cute.Tensor, n: Int32):
    for i in cutlass.range(n, unroll=1):
        step_sync(dst, i)


@cute.jit
def sync_loop_entry(dst: cute.Tensor, n: Int32):
    sync_loop_kernel(dst, n).launch(grid=(1, 1, 1), block=(32, 1, 1))
