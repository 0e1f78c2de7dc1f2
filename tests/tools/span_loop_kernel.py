"""Kernels whose loop calls a module-level helper with the loop index (fa4trace.instrument spans
with a payload, and a span around a named barrier: tests/test_auto_compile.py). Import after
CUTE_DSL_ARCH is set."""

import cutlass
import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def step(dst: cute.Tensor, i: Int32, scale: float = 2.0):
    dst[i] = dst[i] * scale + 1.0


@cute.jit
def step_sync(dst: cute.Tensor, i: Int32):
    """A helper with a named barrier inside: a span around it brackets a hooked call."""
    dst[i] = dst[i] + 1.0
    cute.arch.barrier()


def _looped(helper: str):
    """(kernel, entry) of a one-CTA loop calling the helper of this module named ``helper``,
    looked up at trace time, so a span hook that replaced it is the one called."""

    @cute.kernel
    def kernel(dst: cute.Tensor, n: Int32):
        for i in cutlass.range(n, unroll=1):
            globals()[helper](dst, i)

    @cute.jit
    def entry(dst: cute.Tensor, n: Int32):
        kernel(dst, n).launch(grid=(1, 1, 1), block=(32, 1, 1))

    return kernel, entry


loop_kernel, loop_entry = _looped("step")
sync_loop_kernel, sync_loop_entry = _looped("step_sync")
