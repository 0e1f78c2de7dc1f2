"""Small CuTe DSL kernels whose CTAs do, or do not, talk to each other (tests/test_ctadeps.py):
a plain copy; a ticket (the last CTA to take one from a global counter does more work); a spin
wait on a global flag; a reduction into a global counter that nobody waits on; a cluster
barrier. Each ``entry_<name>`` launches its kernel over (src, dst[, counter])."""

import cutlass.cute as cute
from cutlass import Int32


@cute.kernel
def plain_kernel(src: cute.Tensor, dst: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    dst[i] = src[i] * 2.0


@cute.kernel
def ticket_kernel(src: cute.Tensor, dst: cute.Tensor, counter: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    i = bidx * 128 + tidx
    dst[i] = src[i]
    cute.arch.sync_threads()
    if tidx == 0:
        old = cute.arch.atomic_add(counter.iterator.llvm_ptr, Int32(1), sem="acq_rel", scope="gpu")
        if old == gdim - 1:  # the last CTA to arrive: it would combine the others' work here
            counter[1] = Int32(1)


@cute.kernel
def spin_kernel(src: cute.Tensor, dst: cute.Tensor, counter: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    if tidx == 0:  # wait until the CTAs before this one have counted themselves in
        v = cute.arch.load(counter.iterator.llvm_ptr, Int32, sem="acquire", scope="gpu")
        while v < bidx:
            v = cute.arch.load(counter.iterator.llvm_ptr, Int32, sem="acquire", scope="gpu")
    cute.arch.sync_threads()
    dst[i] = src[i]


@cute.kernel
def reduce_kernel(src: cute.Tensor, dst: cute.Tensor, counter: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    dst[i] = src[i]
    if tidx == 0:
        cute.arch.red(counter.iterator.llvm_ptr, Int32(1), op="add", dtype="s32", sem="relaxed", scope="gpu")


@cute.kernel
def cluster_kernel(src: cute.Tensor, dst: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    dst[i] = src[i]
    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()


@cute.jit
def entry_plain(src: cute.Tensor, dst: cute.Tensor):
    plain_kernel(src, dst).launch(grid=(src.shape[0] // 128, 1, 1), block=(128, 1, 1))


@cute.jit
def entry_ticket(src: cute.Tensor, dst: cute.Tensor, counter: cute.Tensor):
    ticket_kernel(src, dst, counter).launch(grid=(src.shape[0] // 128, 1, 1), block=(128, 1, 1))


@cute.jit
def entry_spin(src: cute.Tensor, dst: cute.Tensor, counter: cute.Tensor):
    spin_kernel(src, dst, counter).launch(grid=(src.shape[0] // 128, 1, 1), block=(128, 1, 1))


@cute.jit
def entry_reduce(src: cute.Tensor, dst: cute.Tensor, counter: cute.Tensor):
    reduce_kernel(src, dst, counter).launch(grid=(src.shape[0] // 128, 1, 1), block=(128, 1, 1))


@cute.jit
def entry_cluster(src: cute.Tensor, dst: cute.Tensor):
    cluster_kernel(src, dst).launch(grid=(src.shape[0] // 128, 1, 1), block=(128, 1, 1), cluster=(2, 1, 1))


KERNELS = {"plain": (entry_plain, plain_kernel, False), "ticket": (entry_ticket, ticket_kernel, True),
           "spin": (entry_spin, spin_kernel, True), "reduce": (entry_reduce, reduce_kernel, True),
           "cluster": (entry_cluster, cluster_kernel, False)}
