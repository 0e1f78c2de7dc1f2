"""Kernels that change state while they are traced. ``StatefulKernel``, as CUTLASS's Hopper
GEMM examples do, sets a runtime field of the TiledMma it is passed (``tiled_mma.set(ACCUMULATE,
False)``) and replaces an attribute of its object with a traced value (``self.bias``) after
reading it: fa4trace's split traces the body twice, and each copy must start from the same
state. ``GlobalStateKernel`` keeps its state where fa4trace cannot reach it (tests in
tests/test_auto_compile.py). Import after CUTE_DSL_ARCH is set."""

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup


class StatefulKernel:
    @cute.jit
    def __call__(self, dst: cute.Tensor):
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            cutlass.Float16, cutlass.Float16, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K,
            cutlass.Float32, (1, 1, 1), tiler_mn=(64, 64))
        self.bias = 1.0
        self.kernel(tiled_mma, dst).launch(grid=(1, 1, 1), block=(128, 1, 1))

    @cute.kernel
    def kernel(self, tiled_mma: cute.TiledMma, dst: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        thr_mma = tiled_mma.get_slice(tidx)  # uses the atom's value: in the second copy too
        bias = self.bias  # the host's 1.0: in the second copy too, not the first copy's value
        self.bias = dst[tidx] * 2.0 + bias
        tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
        acc = thr_mma.partition_shape_C((64, 64))
        dst[tidx] = self.bias + cute.size(acc)


MEMO: dict = {}  # state kept where fa4trace cannot give each copy its own


class GlobalStateKernel:
    """Keeps a traced value in a module-level dict and reuses it when present: the second copy
    of a split body would use the first copy's value (compile_traced then compiles one body)."""

    @cute.jit
    def __call__(self, dst: cute.Tensor):
        MEMO.clear()
        self.kernel(dst).launch(grid=(1, 1, 1), block=(32, 1, 1))

    @cute.kernel
    def kernel(self, dst: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        if cutlass.const_expr("scale" not in MEMO):
            MEMO["scale"] = dst[0] * 2.0
        dst[tidx] = dst[tidx] * MEMO["scale"]
