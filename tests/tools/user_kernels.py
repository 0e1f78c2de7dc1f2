"""A user's own CuTe DSL kernel, defined at module level as users write them (the GPU reach tests
compile it and keep the compiled function in the places a program keeps one)."""

import cutlass.cute as cute


@cute.kernel
def scale_kernel(src: cute.Tensor, dst: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    dst[i] = src[i] * 2.0


@cute.jit
def scale(src: cute.Tensor, dst: cute.Tensor):
    scale_kernel(src, dst).launch(grid=(src.shape[0] // 128, 1, 1), block=(128, 1, 1))


def compile_scale(x, y):
    """``cute.compile`` of ``scale`` for torch tensors like x, y (called with torch tensors)."""
    from cutlass.cute.runtime import from_dlpack

    return cute.compile(scale, from_dlpack(x, assumed_align=16), from_dlpack(y, assumed_align=16),
                        options="--enable-tvm-ffi")
