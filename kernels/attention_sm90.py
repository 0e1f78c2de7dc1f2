"""Decode attention for Hopper (sm_90a) in the CuTe DSL, instrumented with the fa4trace recorder.

Problem: q [b, sq, hq, d], k/v [b, sk, hkv, d] (FA layout, contiguous), o [b, sq, hq, d],
lse [b, hq, sq] (natural log, fp32). sq 1..8, hq/hkv = 1..16, d in {64, 128}, any sk >= 1.

One CTA = one (split, m-block, kv head, batch):
  * the sq x (hq/hkv) query rows of one KV head are packed into one wgmma M-tile (packed row
    m <-> token m // ratio, query head h*ratio + m % ratio), so the KV stream is read once per
    KV head, not once per query head. A CTA serves 64 packed rows (two per consumer thread) or,
    when they fit, 32 (one per thread, half the softmax work; ``block_rows``);
  * warp 4 is the producer: TMA loads of K and V blocks (L2 evict-first: read once) on two
    mbarrier pipelines, every stage requested at launch (3 x 64 KB at d128 base, 6 x 32 KB
    ping-pong, ...): K0 at once, the others right after the consumers have issued their Q loads;
  * warps 0-3 are one consumer warpgroup: they load the (tiny, non-affine) packed Q tile with
    16-byte loads into the swizzled smem tile, then S = Q K^T with wgmma from shared memory,
    online softmax in registers, O += P V with P taken from registers (wgmma RS);
  * split-KV: the grid's y dimension splits the KV blocks of a (batch, kv head) into
    `n_splits` contiguous ranges so that every SM streams KV (decode is memory-bound, and at
    batch 1 there is only one (batch, kv head) pair per KV head).  Each split writes an fp32
    partial O and its LSE; the LSE-weighted combine runs inside the same launch: the last
    `n_comb` CTAs of a (batch, kv head, m-block) to finish (a ticket from an atomic counter)
    wait for the rest and combine one share each.  No second launch.  The arrival counter is
    never reset: a second word holds its value at the start of the launch (the last arrival
    advances it by n_splits), so combiners poll the counter itself for base + n_splits (one
    hop after the last arrival's atomic) and graph replays need no memset.

Numerics: ptxas runs with --fmad=false and the hot FMAs are explicit, so the instrumented
build rounds exactly like the plain one (outputs are bitwise equal; tested on the H200).

Schedules (compile time):
  * ``base``: QK(i) -> wait -> softmax(i) -> rescale O -> PV(i) -> wait -> next.
  * ``pingpong``: two S register buffers.  QK(i+1) is issued before softmax(i) and waited
    after PV(i) is issued, so the tensor core works on QK(i+1) (and PV(i-1)) while the
    warpgroup runs softmax(i).  The producer loads K0, K1, V0, K2, V1, ... to match.
  * ``intrawg``: FA3's intra-warpgroup overlap, the reference point: one S buffer.  Step i
    issues QK(i), corrects O for softmax(i-1) meanwhile, issues PV(i-1), waits for QK(i) and
    runs softmax(i) while PV(i-1) is in flight.  The QK wait is exposed; the softmax hides
    behind PV.  Same producer order as the ping-pong.

Tracing: ``trace=None`` compiles every recorder call away (the uninstrumented kernel).
Events (payload = global KV block index): producer LOAD_K(i), LOAD_V(i) (wait for a free
stage + issue); consumer LOAD_Q (payload = m-block), QK(i) and PV(i) in flight (issue -> the
wait that retires them), SOFTMAX(i), CORRECTION(i), EPILOGUE (payload = split), MARK instant
when the split took its ticket and COMBINE (payload = ticket, i.e. the split's finishing
order); in the "stalls" event set also WAIT_K(i) / WAIT_V(i) (only when the block had not
landed yet). The variant's event set picks them (``decode_spec.EVENT_SETS``).

Deadlock freedom of the in-launch combine: only combiners wait, and the host keeps
``groups * (n_comb - 1) < SM count`` (see ``fa4trace.attention.planner.plan_splits``), so at least
one SM is never held by a waiting CTA and every pending CTA eventually runs.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float16, Float32, Int32, Int64, const_expr, pipeline
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from fa4trace.device import Recorder
from fa4trace.format.vocab import EV, ROLE

from .decode_spec import (COMBINE_UNROLL, EVENTS_PER_STEP, NUM_CONSUMER_THREADS, NUM_THREADS, PRODUCER_WARP,
                          TILE_M, Variant, all_variants)

ARCH = "sm_90a"
PTXAS_OPTIONS = "--ptxas-options=--fmad=false"
SMEM_BUDGET = 227 * 1024  # sm_90 max dynamic shared memory per block
MAX_STAGES = 8  # more bought nothing at d64 (the consumer is the limit there) and cost registers
PREFETCH_TILES = 3  # at most this many K / V tiles prefetched into L2 at launch (prefetch_kv)
# L2 policy of the KV loads (the createpolicy encoding CUTLASS names CacheHintSm90::EVICT_FIRST):
# every KV byte is read once, so its lines go first and what is reused stays in L2 - the split
# partials the combine reads back, Q, and the trace records when tracing.
_L2_EVICT_FIRST = 0x12F0000000000000
# Where the recorder stages records (Recorder.start): shared memory, one st.shared per event
# instead of a compare and two selects into lane registers (docs/recorder.md).
RECORD_STAGE = "smem"
# Named barrier ids (0 is __syncthreads).
_BAR_CONSUMER = 1
_BAR_Q_ISSUED = 2  # consumers arrive once their Q loads are issued; the producer waits on it


def default_stages(head_dim: int, tile_n: int) -> int:
    """As many K+V stages as shared memory holds: decode streams KV, so bytes in flight matter."""
    q_bytes = TILE_M * head_dim * 2
    stage_bytes = 2 * tile_n * head_dim * 2
    reserve = 8 * 1024  # mbarriers, combine scratch, alignment
    return max(2, min(MAX_STAGES, (SMEM_BUDGET - q_bytes - reserve) // stage_bytes))


class GmemTensors(NamedTuple):
    """The kernel's global tensors: inputs, outputs and the split-KV combine's scratch."""

    q: cute.Tensor  # (b, sq, hq, d)
    k: cute.Tensor  # (b, sk, hkv, d)
    v: cute.Tensor  # (b, sk, hkv, d)
    o: cute.Tensor  # (b, sq, hq, d)
    lse: cute.Tensor  # (b, hq, sq) fp32
    o_part: cute.Tensor  # fp32 split partials
    lse_part: cute.Tensor  # fp32 split LSEs
    counters: cute.Tensor  # int32, COUNTER_WORDS per group


class SmemTiles(NamedTuple):
    """The CTA's shared memory: the Q tile, the K and V stages and the rest of the storage."""

    q: cute.Tensor
    k: cute.Tensor
    v: cute.Tensor
    storage: object  # the SharedStorage struct (mbarriers, ticket, combine scratch)


class KvTma(NamedTuple):
    """TMA views of K and V and their copy atoms (the producer's loads)."""

    k: cute.Tensor
    v: cute.Tensor
    atom_k: cute.CopyAtom
    atom_v: cute.CopyAtom


class Pipes(NamedTuple):
    """The K and V mbarrier pipelines between the producer warp and the consumer warpgroup."""

    k: object
    v: object


class Mmas(NamedTuple):
    """The tiled wgmmas: S = Q K^T from shared memory, O += P V with P from registers."""

    qk: cute.TiledMma
    pv: cute.TiledMma


class CtaWork(NamedTuple):
    """What one CTA works on (runtime values): its (batch, kv head, m-block) group and KV split."""

    b_idx: Int32
    h_idx: Int32
    m_block: Int32
    group: Int32  # (b_idx * hkv + h_idx) * m_blocks + m_block
    ratio: Int32  # query heads per KV head
    rows_total: Int32  # packed query rows of the KV head: sq * ratio
    sk: Int32
    split_idx: Int32
    n_splits: Int32
    n_blocks: Int32  # KV blocks of the whole sequence
    n_begin: Int32  # this split's first KV block
    blocks: Int32  # this split's KV blocks (>= 1)


class CombineCut(NamedTuple):
    """How the in-launch combine is cut (``fa4trace.attention.planner.Plan``)."""

    n_comb: Int32  # combiner CTAs per group
    nc4_log2: Int32  # log2 of the float4 columns per work item
    parts_log2: Int32  # log2 of the split partitions per output


class DecodeAttentionSm90:
    """One compiled variant (``decode_spec.Variant``): head dim, schedule, rows per CTA, event set
    and launch mode are compile-time; shapes are runtime."""

    def __init__(self, variant: Variant):
        self.variant = variant
        self.d = variant.head_dim
        self.schedule = variant.schedule
        self.tile_n = variant.tile_n
        # Query rows one CTA serves. 64: the whole wgmma M tile, two rows per thread. 32: rows
        # 0-7 of each warp's 16-row slab, one row per thread; the other 8 rows of the slab are
        # padding with no softmax and no stores (half the exp2s and about 20% of the consumer's
        # instructions; the host takes it when sq * hq/hkv <= 32, e.g. 16:1 decode).
        # ptxas keeps the wgmma pipeline asynchronous only if every accumulator register is
        # read and redefined by ordinary code between wgmmas and read after the last one; else
        # it serializes all wgmmas ("insufficient register resources for the wgmma pipeline").
        # So padding rows still get one multiply per element (S scaled, O corrected) and a
        # final read (``_keep_padding_live``), a few percent of what the real rows cost.
        self.block_rows = variant.block_rows
        self.rpt = 2 if self.block_rows == TILE_M else 1  # rows per thread
        self.num_stages = default_stages(self.d, self.tile_n)
        # Traced builds: the event ids that record (Recorder.start compiles the others away).
        self.trace_events = variant.event_ids
        # Programmatic dependent launch: the launch may start while the stream's previous kernel
        # finishes; every thread waits for that kernel (griddepcontrol.wait) before it touches
        # global memory, and the CTAs let the next kernel launch once their mainloop is done.
        self.pdl = variant.pdl

    def config(self) -> dict:
        """The variant's manifest config plus what this kernel derives from it."""
        return {**self.variant.config(), "tile_m": TILE_M, "num_stages": self.num_stages, "threads": NUM_THREADS}

    # ------------------------------------------------------------------------------------
    # host side
    # ------------------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (b, sq, hq, d)
        mK: cute.Tensor,  # (b, sk, hkv, d)
        mV: cute.Tensor,  # (b, sk, hkv, d)
        mO: cute.Tensor,  # (b, sq, hq, d)
        mLSE: cute.Tensor,  # (b, hq, sq) fp32
        mOpart: cute.Tensor,  # (>= groups * n_splits * 64 * d,) fp32 workspace
        mLSEpart: cute.Tensor,  # (>= groups * n_splits * 64,) fp32 workspace
        mCount: cute.Tensor,  # (>= 4 * groups,) int32 [count, base, -, -] per group; zero once
        softmax_scale: Float32,
        n_splits: Int32,
        n_comb: Int32,  # combiner CTAs per group (1..n_splits)
        comb_nc4_log2: Int32,  # combine: log2 of the float4 columns per item (dividing d/4)
        comb_parts_log2: Int32,  # combine: log2 of the split partitions per output (nc4*parts <= 128)
        trace: Optional[cute.Tensor],
        stream,
    ):
        dtype = mQ.element_type
        if const_expr(dtype not in (BFloat16, Float16)):
            raise TypeError(f"q must be bf16 or fp16, got {dtype}")
        if const_expr(mK.element_type != dtype or mV.element_type != dtype or mO.element_type != dtype):
            raise TypeError("q, k, v, o must have the same dtype")
        self.dtype = dtype
        d, tile_n, stages = self.d, self.tile_n, self.num_stages

        # K as (sk, d, hkv, b): K-major B operand of S = Q K^T.
        mKt = cute.make_tensor(mK.iterator, cute.select(mK.layout, mode=[1, 3, 2, 0]))
        # V as (d, sk, hkv, b): the B operand of O = P V is V^T (N = d, K = keys), MN-major.
        mVt = cute.make_tensor(mV.iterator, cute.select(mV.layout, mode=[3, 1, 2, 0]))

        tiled_mma_qk = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K, Float32,
            (1, 1, 1), (TILE_M, tile_n))
        tiled_mma_pv = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN, Float32,
            (1, 1, 1), (TILE_M, d), warpgroup.OperandSource.RMEM)

        sQ_layout = cute.slice_(
            sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (TILE_M, tile_n, d), dtype, 1),
            (None, None, 0))
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (TILE_M, tile_n, d), dtype, stages)
        sV_layout = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, (TILE_M, d, tile_n), dtype, stages)

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_k, tma_k = cpasync.make_tiled_tma_atom(
            g2s, mKt, cute.slice_(sK_layout, (None, None, 0)), (tile_n, d))
        tma_atom_v, tma_v = cpasync.make_tiled_tma_atom(
            g2s, mVt, cute.slice_(sV_layout, (None, None, 0)), (d, tile_n))
        self.k_bytes = cute.size_in_bytes(dtype, cute.slice_(sK_layout, (None, None, 0)))
        self.v_bytes = cute.size_in_bytes(dtype, cute.slice_(sV_layout, (None, None, 0)))

        @cute.struct
        class SharedStorage:
            mbar_k: cute.struct.MemRange[cutlass.Int64, stages * 2]
            mbar_v: cute.struct.MemRange[cutlass.Int64, stages * 2]
            ticket: cute.struct.MemRange[Int32, 4]
            # combine scratch: per-thread (max, sum, acc[4]) partials of the cross-warp merge
            comb_acc: cute.struct.Align[cute.struct.MemRange[Float32, NUM_CONSUMER_THREADS * 6], 16]
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sV_layout)], 1024]

        self.shared_storage = SharedStorage

        b, sq, hq = mQ.shape[0], mQ.shape[1], mQ.shape[2]
        hkv = mK.shape[2]
        ratio = hq // hkv
        m_blocks = (sq * ratio + self.block_rows - 1) // self.block_rows
        scale_log2 = softmax_scale * Float32(math.log2(math.e))

        self.kernel(
            mQ, mK, mV, tma_k, tma_v, mO, mLSE, mOpart, mLSEpart, mCount,
            tma_atom_k, tma_atom_v, tiled_mma_qk, tiled_mma_pv,
            sQ_layout, sK_layout, sV_layout,
            softmax_scale, scale_log2, n_splits, n_comb, comb_nc4_log2, comb_parts_log2, trace,
        ).launch(
            # (kv head, m-block) fastest: the CTAs of the kv heads of one split are launched
            # next to each other, land on neighbouring SMs at the same time and stream the same
            # keys, whose rows interleave in memory ([b, sk, hkv, d]) at 128 B (d64) / 256 B.
            grid=[m_blocks * hkv, n_splits, b],
            block=[NUM_THREADS, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
            use_pdl=self.pdl,
        )

    # ------------------------------------------------------------------------------------
    # device side
    # ------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        tma_k: cute.Tensor,
        tma_v: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mOpart: cute.Tensor,
        mLSEpart: cute.Tensor,
        mCount: cute.Tensor,
        tma_atom_k: cute.CopyAtom,
        tma_atom_v: cute.CopyAtom,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        softmax_scale: Float32,
        scale_log2: Float32,
        n_splits: Int32,
        n_comb: Int32,
        comb_nc4_log2: Int32,
        comb_parts_log2: Int32,
        trace: Optional[cute.Tensor],
    ):
        tile_n = self.tile_n
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        # The TMA descriptors live in the kernel's parameter buffer in device memory: every warp
        # asks for them first thing (a producer-only prefetch sat behind ~120 instructions of
        # index math that ptxas hoisted above its branch). Measured alone it changed nothing on
        # the H200; it costs nothing either.
        cpasync.prefetch_descriptor(tma_atom_k)
        cpasync.prefetch_descriptor(tma_atom_v)
        y, split_idx, b_idx = cute.arch.block_idx()

        sq, hq, sk, hkv = mQ.shape[1], mQ.shape[2], tma_k.shape[0], tma_k.shape[2]
        ratio = hq // hkv
        rows_total = sq * ratio
        m_blocks = (rows_total + self.block_rows - 1) // self.block_rows
        h_idx = y // m_blocks
        m_block = y - h_idx * m_blocks
        group = (b_idx * hkv + h_idx) * m_blocks + m_block

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)

        producer_group = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumer_group = pipeline.CooperativeGroup(pipeline.Agent.Thread, NUM_CONSUMER_THREADS // 32)
        pipe_k = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_k.data_ptr(), num_stages=self.num_stages,
            producer_group=producer_group, consumer_group=consumer_group,
            tx_count=self.k_bytes, defer_sync=True)
        pipe_v = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_v.data_ptr(), num_stages=self.num_stages,
            producer_group=producer_group, consumer_group=consumer_group,
            tx_count=self.v_bytes, defer_sync=True)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()  # nothing above reads or writes global memory

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)

        # This split's KV blocks [n_begin, n_end): contiguous, sizes differ by at most one.
        n_blocks = (sk + tile_n - 1) // tile_n
        n_begin = split_idx * n_blocks // n_splits
        n_end = (split_idx + 1) * n_blocks // n_splits
        count = n_end - n_begin  # >= 1: the host keeps n_splits <= n_blocks

        smem_tiles = SmemTiles(sQ, sK, sV, storage)
        pipes = Pipes(pipe_k, pipe_v)
        work = CtaWork(b_idx, h_idx, m_block, group, ratio, rows_total, sk, split_idx, n_splits, n_blocks,
                       n_begin, count)
        if warp_idx == PRODUCER_WARP:
            self.produce(trace, smem_tiles, KvTma(tma_k, tma_v, tma_atom_k, tma_atom_v), pipes, work)
        if warp_idx < PRODUCER_WARP:
            self.consume(trace, GmemTensors(mQ, mK, mV, mO, mLSE, mOpart, mLSEpart, mCount), smem_tiles,
                         Mmas(tiled_mma_qk, tiled_mma_pv), pipes, tidx, softmax_scale, scale_log2, work,
                         CombineCut(n_comb, comb_nc4_log2, comb_parts_log2))

    @cute.jit
    def prefetch_kv(self, mK, mV, tidx, b_idx, h_idx, n_begin, count, sk):
        """Consumer threads, between issuing Q and storing it: an L2 prefetch of the split's
        first K / V tiles after K0 (V0, K1, V1, ...), one key row per thread
        (cp.async.bulk.prefetch with the evict_first policy of the TMA loads that will then hit
        them). How many: a tenth of the split's tiles (count // 5 of its 2 * count), at most
        ``PREFETCH_TILES``.

        Why: the producer's K0 goes out at once, but its next TMA issue blocks for a few hundred
        nanoseconds, so HBM has little to do at the start of a launch; these requests fill that
        gap (the gain per shape is in BENCHMARKS.md). The consumers issue them because a warp
        that does stalls for microseconds (UBLKPF takes a uniform address, so ptxas loops over
        the warp's rows, one request per trip): the consumers can afford that before their
        first block lands, the producer cannot. More tiles, per-tile or per-line requests, and
        other warps issuing them were slower (BENCHMARKS.md, "tried and not kept").
        """
        d, tile_n = self.d, self.tile_n
        n_pf = cutlass.min(count // 5, PREFETCH_TILES)
        if n_pf > 0:
            key0 = n_begin * tile_n + tidx
            for i in cutlass.range_constexpr(PREFETCH_TILES):
                # request i of V0, K1, V1, K2, ...: K0 is the producer's first TMA
                src = mV if i % 2 == 0 else mK
                key = key0 + ((i + 1) // 2) * tile_n
                if (i < n_pf) & (tidx < tile_n) & (key < sk):
                    _bulk_prefetch_l2(src[b_idx, key, h_idx, None].iterator, d * 2)

    # ---- producer warp ------------------------------------------------------------------
    @cute.jit
    def produce(self, trace, smem: SmemTiles, tma: KvTma, pipes: Pipes, work: CtaWork):
        """Warp 4: TMA loads of this split's K and V blocks, as fast as stages free up."""
        tile_n, d = self.tile_n, self.d
        # settle=False: the first loads (K0, K1, V0) go out before the warp waits for the trace
        # buffer's header (its slot is claimed right after them); see Recorder.start.
        rec = Recorder.start(trace, role=ROLE.PRODUCER, events=self.trace_events, settle=False, stage=RECORD_STAGE,
                             stage_warps=1)
        gK = cute.local_tile(tma.k[None, None, work.h_idx, work.b_idx], (tile_n, d), (None, 0))  # (n, d, blocks)
        gV = cute.local_tile(tma.v[None, None, work.h_idx, work.b_idx], (d, tile_n), (0, None))  # (d, n, blocks)
        tKsK, tKgK = cpasync.tma_partition(tma.atom_k, 0, cute.make_layout(1),
                                           cute.group_modes(smem.k, 0, 2), cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma.atom_v, 0, cute.make_layout(1),
                                           cute.group_modes(smem.v, 0, 2), cute.group_modes(gV, 0, 2))
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)

        # Q is loaded by the consumers (``issue_q`` / ``store_q``). Its loads go out before all
        # KV requests of this CTA but the first: issued behind the first stages they would wait
        # in the same memory queues and start the consumers late, with the stages full and no
        # new request issued meanwhile. K0 alone goes first, since the consumers need a few
        # hundred instructions (Q addresses) before they can issue Q. The producer waits only
        # for the Q loads to be *issued* (tens of ns), not to land.
        rec, k_state = self.load_kv(rec, EV.LOAD_K, pipes.k, k_state, tma.atom_k, tKgK, tKsK, work.n_begin)
        cute.arch.barrier(barrier_id=_BAR_Q_ISSUED, number_of_threads=NUM_THREADS)
        if const_expr(self.schedule != "base"):
            # K1's records go outside `if blocks > 1` (``when=``): recorded inside it, they made
            # ptxas move the *consumers'* stage indices, phases and wgmma descriptors from
            # uniform to vector registers for their whole mainloop (SASS of the traced d64
            # ping-pong: 512 vs 463 instructions per two steps, 32 R2UR; untraced 377).
            rec, k_state = self.load_kv_if(work.blocks > 1, rec, EV.LOAD_K, pipes.k, k_state, tma.atom_k, tKgK, tKsK,
                                           work.n_begin + 1)
        rec, v_state = self.load_kv(rec, EV.LOAD_V, pipes.v, v_state, tma.atom_v, tVgV, tVsV, work.n_begin)
        # The slot is claimed once the first loads are out: waiting for the trace buffer's header
        # before K1 and V0 held a one-block split's V0 back by an L2 round trip (H200, d64 sk 4096
        # b 1: the recorder's start and finish alone cost +9%).
        rec = rec.settle()

        if const_expr(self.schedule != "base"):
            # K0 K1 V0 | K2 V1 | K3 V2 | ... | V(last)
            for j in cutlass.range(2, work.blocks, unroll=1):
                rec = rec.open_block(4)
                rec, k_state = self.load_kv(rec, EV.LOAD_K, pipes.k, k_state, tma.atom_k, tKgK, tKsK, work.n_begin + j)
                rec, v_state = self.load_kv(rec, EV.LOAD_V, pipes.v, v_state, tma.atom_v, tVgV, tVsV,
                                            work.n_begin + j - 1)
                rec = rec.close_block()
            rec, v_state = self.load_kv_if(work.blocks > 1, rec, EV.LOAD_V, pipes.v, v_state, tma.atom_v, tVgV, tVsV,
                                           work.n_begin + work.blocks - 1)
        else:
            for j in cutlass.range(1, work.blocks, unroll=1):
                rec = rec.open_block(4)
                rec, k_state = self.load_kv(rec, EV.LOAD_K, pipes.k, k_state, tma.atom_k, tKgK, tKsK, work.n_begin + j)
                rec, v_state = self.load_kv(rec, EV.LOAD_V, pipes.v, v_state, tma.atom_v, tVgV, tVsV, work.n_begin + j)
                rec = rec.close_block()
        rec.finish()

    @cute.jit
    def load_kv(self, rec: Recorder, event: cutlass.Constexpr, pipe, state, atom, gsrc, sdst, n_block):
        """Producer: wait for a free K or V stage, then issue its TMA load (event LOAD_K/LOAD_V)."""
        rec.begin(event, n_block)
        state = self.issue_kv(pipe, state, atom, gsrc, sdst, n_block)
        rec.end(event, n_block)
        return rec, state

    @cute.jit
    def load_kv_if(self, cond, rec: Recorder, event: cutlass.Constexpr, pipe, state, atom, gsrc, sdst, n_block):
        """``load_kv`` where the runtime ``cond`` holds; the records go outside the dynamic if
        (``when=``, see the K1 note in ``produce``)."""
        rec.begin(event, n_block, when=cond)
        if cond:
            state = self.issue_kv(pipe, state, atom, gsrc, sdst, n_block)
        rec.end(event, n_block, when=cond)
        return rec, state

    @cute.jit
    def issue_kv(self, pipe, state, atom, gsrc, sdst, n_block):
        pipe.producer_acquire(state)
        cute.copy(atom, gsrc[None, n_block], sdst[None, state.index],
                  tma_bar_ptr=pipe.producer_get_barrier(state), cache_policy=Int64(_L2_EVICT_FIRST))
        state.advance()
        return state

    def tile_row_to_block_row(self, t):
        """Tile row (0..63) -> the block's query row it holds. 32-row blocks: rows 0-7 of warp w's
        16-row slab hold block rows 8w..8w+7, rows 8-15 repeat them (padding, never stored)."""
        if const_expr(self.block_rows == TILE_M):
            return t
        return ((t >> 4) << 3) + (t & 7)

    @cute.jit
    def issue_q(self, mQ, tidx, b_idx, h_idx, m_block, ratio, rows_total):
        """Packed GQA rows of Q into registers, 16 B per load (``store_q`` puts them in smem).

        Row r of the tile is token m // ratio, query head h*ratio + m % ratio, where m =
        block_rows * m_block + tile_row_to_block_row(r): not an affine map of r when ratio does
        not divide 64, hence no TMA for Q.  All loads are issued before any store (one memory
        latency, not one per load), and before the producer issues any KV load after K0
        (barrier ``_BAR_Q_ISSUED``, arrived here); rows past the last one repeat it (their S
        rows are computed and never stored), so no load is predicated.
        """
        d = self.d
        chunks = d // 8  # 16-byte chunks per row
        n_it = TILE_M * chunks // NUM_CONSUMER_THREADS
        dtype = mQ.element_type
        frags = []
        for it in cutlass.range_constexpr(n_it):
            idx = it * NUM_CONSUMER_THREADS + tidx
            r = idx // chunks
            c = idx - r * chunks
            m = cutlass.min(m_block * self.block_rows + self.tile_row_to_block_row(r), rows_total - 1)
            tok = m // ratio
            qh = h_idx * ratio + (m - tok * ratio)
            addr = (mQ[b_idx, tok, qh, None].iterator + c * 8).toint()
            src = cute.make_tensor(cute.make_ptr(dtype, addr, cute.AddressSpace.gmem, assumed_align=16),
                                   cute.make_layout(8))
            frag = cute.make_rmem_tensor((8,), dtype)
            cute.autovec_copy(src, frag)
            frags.append(frag)
        # The producer may start the KV stream now: Q's requests are ahead of it.
        cute.arch.barrier_arrive(barrier_id=_BAR_Q_ISSUED, number_of_threads=NUM_THREADS)
        return frags

    @cute.jit
    def store_q(self, sQ, tidx, frags):
        """The Q rows of ``issue_q`` -> the swizzled smem tile, visible to wgmma."""
        chunks = self.d // 8
        for it in cutlass.range_constexpr(len(frags)):
            idx = it * NUM_CONSUMER_THREADS + tidx
            r = idx // chunks
            c = idx - r * chunks
            dst = cute.local_tile(sQ, (1, 8), (r, c))
            cute.autovec_copy(frags[it], dst[0, None])
        cute.arch.fence_proxy("async.shared", space="cta")  # generic-proxy stores -> wgmma reads
        cute.arch.barrier(barrier_id=_BAR_CONSUMER, number_of_threads=NUM_CONSUMER_THREADS)

    # ---- consumer warpgroup ---------------------------------------------------------------
    @cute.jit
    def consume(self, trace, gmem: GmemTensors, smem: SmemTiles, mma: Mmas, pipes: Pipes, tidx,
                softmax_scale, scale_log2, work: CtaWork, cut: CombineCut):
        d, tile_n = self.d, self.tile_n
        # settle=False: the Q loads go out before the warp waits for the trace buffer's header.
        rec = Recorder.start(trace, role=ROLE.CONSUMER, events=self.trace_events, settle=False,
                             stage=RECORD_STAGE, stage_warps=NUM_CONSUMER_THREADS // 32)
        # The arrival counter's value at the start of this launch, read long before this split
        # can finish: the last arrival advances it only after every CTA has arrived.
        base0 = Int32(0)
        if work.n_splits > 1:
            base0 = cute.arch.load((gmem.counters.iterator + 4 * work.group + 1).llvm_ptr, Int32, sem="relaxed",
                                   scope="gpu")
        rec.begin(EV.LOAD_Q, work.m_block)
        q_frags = self.issue_q(gmem.q, tidx, work.b_idx, work.h_idx, work.m_block, work.ratio, work.rows_total)
        # while Q is on its way (see prefetch_kv)
        self.prefetch_kv(gmem.k, gmem.v, tidx, work.b_idx, work.h_idx, work.n_begin, work.blocks, work.sk)
        self.store_q(smem.q, tidx, q_frags)
        rec.end(EV.LOAD_Q, work.m_block)
        rec = rec.settle()
        thr_qk = mma.qk.get_slice(tidx)
        thr_pv = mma.pv.get_slice(tidx)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(smem.q))  # (MMA, 1, d/16)
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(smem.k))  # (MMA, 1, d/16, stages)
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(smem.v))  # (MMA, 1, tile_n/16, stages)
        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((TILE_M, d)), Float32)
        acc_O.fill(0.0)
        tOrP = cute.make_rmem_tensor(thr_pv.partition_shape_A((TILE_M, tile_n)), self.dtype)
        s_shape = thr_qk.partition_shape_C((TILE_M, tile_n))
        acc_S0 = cute.make_rmem_tensor(s_shape, Float32)
        # Column of every S element (for the masked last block) and row of every O element.
        tScS = _acc_mn_view(thr_qk.partition_C(cute.make_identity_tensor((TILE_M, tile_n))))
        row_max = cute.make_rmem_tensor((2,), Float32)
        row_sum = cute.make_rmem_tensor((2,), Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        # Keys in the last global block: it alone needs the -inf mask.
        last_valid = work.sk - (work.n_blocks - 1) * tile_n

        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)

        ctx = _Ctx(mma.qk, mma.pv, tSrQ, tSrK, tOrV, tOrP, acc_O, tScS, row_max,
                   row_sum, scale_log2, work.n_blocks, last_valid, pipes.k, pipes.v)
        if const_expr(self.schedule == "base"):
            for j in cutlass.range(work.blocks - 1, unroll=1):
                rec, k_state, v_state = self.base_step(rec, ctx, acc_S0, k_state, v_state, work.n_begin + j, False)
            # The split's last block is the only one that can hold keys past sk.
            rec, k_state, v_state = self.base_step(rec, ctx, acc_S0, k_state, v_state,
                                                   work.n_begin + work.blocks - 1, True)
        elif const_expr(self.schedule == "intrawg"):
            # Prologue: QK(first) -> softmax(first) -> P(first); PV(first) goes out in the next
            # step (or below, when the split has one block).
            corr = cute.make_rmem_tensor((2,), Float32)
            if work.blocks == 1:
                rec, k_state = self.intrawg_first(rec, ctx, acc_S0, corr, k_state, work.n_begin, True)
            else:
                rec, k_state = self.intrawg_first(rec, ctx, acc_S0, corr, k_state, work.n_begin, False)
                for j in cutlass.range(1, work.blocks - 1, unroll=1):
                    rec, k_state, v_state = self.intrawg_step(rec, ctx, acc_S0, corr, k_state, v_state,
                                                              work.n_begin + j, False)
                rec, k_state, v_state = self.intrawg_step(rec, ctx, acc_S0, corr, k_state, v_state,
                                                          work.n_begin + work.blocks - 1, True)
            rec = self.correct(rec, ctx, corr, work.n_begin + work.blocks - 1)
            rec = self.issue_pv(rec, ctx, v_state, work.n_begin + work.blocks - 1)
            warpgroup.wait_group(0)
            rec, v_state = self.retire(rec, EV.PV, ctx.pipe_v, v_state, work.n_begin + work.blocks - 1)
        else:
            acc_S1 = cute.make_rmem_tensor(s_shape, Float32)
            # Prologue: QK(first) issued and waited.
            rec, _t = self.issue_qk(rec, ctx, acc_S0, k_state, work.n_begin)
            warpgroup.wait_group(0)
            rec, k_state = self.retire(rec, EV.QK, ctx.pipe_k, k_state, work.n_begin)
            # Step j works on S[j % 2] and issues QK(j+1) into the other buffer.  The loop is
            # unrolled by two so that both buffers stay in registers (no dynamic indexing).
            if work.blocks == 1:
                rec, k_state, v_state = self.pingpong_step(rec, ctx, acc_S0, acc_S1, k_state, v_state, work.n_begin,
                                                           False, False)
            else:
                rec, k_state, v_state = self.pingpong_step(rec, ctx, acc_S0, acc_S1, k_state, v_state, work.n_begin,
                                                           True, False)
                for jj in cutlass.range((work.blocks - 2) // 2, unroll=1):
                    j = work.n_begin + 1 + 2 * jj
                    rec, k_state, v_state = self.pingpong_step(rec, ctx, acc_S1, acc_S0, k_state, v_state, j,
                                                               True, True)
                    rec, k_state, v_state = self.pingpong_step(rec, ctx, acc_S0, acc_S1, k_state, v_state, j + 1,
                                                               True, True)
                if (work.blocks - 2) % 2 == 1:
                    rec, k_state, v_state = self.pingpong_step(rec, ctx, acc_S1, acc_S0, k_state, v_state,
                                                               work.n_begin + work.blocks - 2, True, True)
                    rec, k_state, v_state = self.pingpong_step(rec, ctx, acc_S0, acc_S1, k_state, v_state,
                                                               work.n_begin + work.blocks - 1, False, True)
                else:
                    rec, k_state, v_state = self.pingpong_step(rec, ctx, acc_S1, acc_S0, k_state, v_state,
                                                               work.n_begin + work.blocks - 1, False, True)
            warpgroup.wait_group(0)
            rec, v_state = self.retire(rec, EV.PV, ctx.pipe_v, v_state, work.n_begin + work.blocks - 1)

        if const_expr(self.pdl):
            # This CTA's stream is done: the next kernel may launch (its CTAs take SMs as ours
            # exit and wait for this grid to finish before they touch memory).
            cute.arch.griddepcontrol_launch_dependents()
        # Finish the row sums across the 4 threads of a row (quad), then normalize.
        rec.begin(EV.EPILOGUE, work.split_idx)
        for r in cutlass.range_constexpr(self.rpt):
            row_sum[r] = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
        lse = cute.make_rmem_tensor((2,), Float32)
        inv = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(self.rpt):
            s = row_sum[r]
            inv[r] = 1.0 / s
            lse[r] = cute.math.fma(row_max[r], softmax_scale, cute.math.log(s, fastmath=True))
        acc_O_mn = _acc_mn_view(acc_O)
        tOcO = _acc_mn_view(thr_pv.partition_C(cute.make_identity_tensor((TILE_M, d))))
        if const_expr(self.rpt == 1):
            _keep_padding_live(acc_O_mn, work.n_splits, gmem.lse, work.b_idx)
        lane4 = cute.arch.lane_idx() % 4
        if work.n_splits == 1:
            for r in cutlass.range_constexpr(self.rpt):
                row = self.tile_row_to_block_row(tOcO[r, 0][0])
                m = work.m_block * self.block_rows + row
                if m < work.rows_total:
                    tok = m // work.ratio
                    qh = work.h_idx * work.ratio + (m - tok * work.ratio)
                    gO = gmem.o[work.b_idx, tok, qh, None]
                    for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                        gO[tOcO[r, c][1]] = (acc_O_mn[r, c] * inv[r]).to(self.dtype)
                    if lane4 == 0:
                        gmem.lse[work.b_idx, qh, tok] = lse[r]
            rec = _end(rec, EV.EPILOGUE, work.split_idx)
        else:
            base = work.group * work.n_splits + work.split_idx
            for r in cutlass.range_constexpr(self.rpt):
                row = self.tile_row_to_block_row(tOcO[r, 0][0])
                m = work.m_block * self.block_rows + row
                if m < work.rows_total:
                    off = (base * TILE_M + row) * d
                    for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                        gmem.o_part[off + tOcO[r, c][1]] = acc_O_mn[r, c] * inv[r]
                    if lane4 == 0:
                        gmem.lse_part[base * TILE_M + row] = lse[r]
            rec = _end(rec, EV.EPILOGUE, work.split_idx)
            rec = self.combine(rec, smem.storage, tidx, base0, gmem, work, cut)
        rec.finish()

    # ---- mainloop pieces --------------------------------------------------------------------
    @cute.jit
    def wait_full(self, rec: Recorder, pipe, state, event: cutlass.Constexpr, n_block):
        """Wait until a K or V stage has landed; traced, the wait is event WAIT_K / WAIT_V.

        The probe is mbarrier.test_wait, which never blocks. The pipeline's try_wait may
        suspend the thread up to a hardware time limit before answering "not yet": used as the
        probe, it answered "ready" after waiting and not one WAIT was ever recorded (H200
        traces, memory-bound shapes). Only stages that had not landed cost events. Without the
        WAIT events (the "core" set) there is no probe: the wait is the untraced kernel's.
        """
        if const_expr(rec.records(event)):
            ready = pipe.sync_object_full.test_wait(state.index, state.phase)
            if not ready:
                rec = _begin(rec, event, n_block)
                pipe.consumer_wait(state)
                rec = _end(rec, event, n_block)
        else:
            pipe.consumer_wait(state)
        return rec

    @cute.jit
    def issue_qk(self, rec: Recorder, ctx, acc_S, k_state, n_block):
        """Issue QK(n_block) once its K stage has landed. Returns (rec, t): ``t`` is the timer
        read of QK's begin, which the work issued right after the wgmmas (the ping-pong's
        softmax, the intra-warpgroup correction) takes as its own begin. A second read there
        would be a scheduling fence: ptxas moves nothing across a timer read, and the untraced
        kernel interleaves the wgmma issue with that work (SASS); behind the fence the issue
        runs alone first (fa4trace check's shape: +29.6% -> see docs/recorder.md)."""
        rec = self.wait_full(rec, ctx.pipe_k, k_state, EV.WAIT_K, n_block)
        t = rec.timer()
        rec.begin(EV.QK, n_block, t=t)
        warpgroup.fence()
        atom = cute.make_mma_atom(ctx.mma_qk.op)
        for kk in cutlass.range_constexpr(cute.size(ctx.tSrQ, mode=[2])):
            atom.set(warpgroup.Field.ACCUMULATE, kk != 0)
            cute.gemm(atom, acc_S, ctx.tSrQ[None, None, kk], ctx.tSrK[None, None, kk, k_state.index], acc_S)
        warpgroup.commit_group()
        return rec, t

    @cute.jit
    def retire(self, rec: Recorder, event: cutlass.Constexpr, pipe, state, n_block):
        """After the wait that covers QK or PV(n_block): close its span, free its K or V stage."""
        rec, state, _t = self.retire_then(rec, event, pipe, state, n_block)
        return rec, state

    @cute.jit
    def retire_then(self, rec: Recorder, event: cutlass.Constexpr, pipe, state, n_block):
        """``retire``, also returning its timer read: the work that starts right after the
        release (one mbarrier arrive) begins at it, as fenceless as the untraced kernel."""
        t = rec.timer()
        rec.end(event, n_block, t=t)
        pipe.consumer_release(state)
        state.advance()
        return rec, state, t

    @cute.jit
    def qk_then_softmax(self, rec: Recorder, ctx, acc_S, k_state, n_block, is_last: cutlass.Constexpr):
        """QK(n_block) issued and waited for, then its softmax: nothing overlaps the two."""
        rec, _t = self.issue_qk(rec, ctx, acc_S, k_state, n_block)
        warpgroup.wait_group(0)
        rec, k_state, t = self.retire_then(rec, EV.QK, ctx.pipe_k, k_state, n_block)
        rec, corr = self.softmax(rec, ctx, acc_S, n_block, is_last, t=t)
        return rec, k_state, corr

    @cute.jit
    def issue_pv(self, rec: Recorder, ctx, v_state, n_block):
        rec = self.wait_full(rec, ctx.pipe_v, v_state, EV.WAIT_V, n_block)
        rec.begin(EV.PV, n_block)
        warpgroup.fence()
        atom = cute.make_mma_atom(ctx.mma_pv.op)
        atom.set(warpgroup.Field.ACCUMULATE, True)  # O starts at zero
        for kk in cutlass.range_constexpr(cute.size(ctx.tOrP, mode=[2])):
            cute.gemm(atom, ctx.acc_O, ctx.tOrP[None, None, kk], ctx.tOrV[None, None, kk, v_state.index],
                      ctx.acc_O)
        warpgroup.commit_group()
        return rec

    @cute.jit
    def softmax(self, rec: Recorder, ctx, acc_S, n_block, may_mask: cutlass.Constexpr, t=None):
        """Online softmax of one S block in place (S -> exp), returns the O correction factors.
        ``t``: a timer read to begin with (``issue_qk``'s), else one now.

        ``may_mask``: this is the split's last block, which may be the global last one.  Only
        there are keys past sk (TMA zero-filled them); masking nowhere else keeps the per-column
        compares out of the mainloop (hoisted, they would pin registers for the whole loop).
        """
        rec.begin(EV.SOFTMAX, n_block, t=t)
        s_mn = _acc_mn_view(acc_S)
        ncol = cute.size(s_mn, mode=[1])
        if const_expr(may_mask):
            if n_block == ctx.n_blocks - 1:
                for r in cutlass.range_constexpr(self.rpt):
                    for c in cutlass.range_constexpr(ncol):
                        if ctx.tScS[r, c][1] >= ctx.last_valid:
                            s_mn[r, c] = -Float32.inf
        corr = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(self.rpt):
            m_old = ctx.row_max[r]
            m = _tree_max([s_mn[r, c] for c in range(ncol)] + [m_old])
            m = cute.arch.warp_reduction_max(m, threads_in_group=4)
            ctx.row_max[r] = m
            # Explicit FMAs (and ptxas --fmad=false for the rest): the traced build must compute
            # the same bits, and ptxas would otherwise fuse mul+add differently per build.
            neg_m_scaled = -(m * ctx.scale_log2)
            corr[r] = cute.math.exp2(cute.math.fma(m_old, ctx.scale_log2, neg_m_scaled), fastmath=True)
            rs = Float32(0.0)
            for c in cutlass.range_constexpr(ncol):
                p = cute.math.exp2(cute.math.fma(s_mn[r, c], ctx.scale_log2, neg_m_scaled), fastmath=True)
                s_mn[r, c] = p
                rs = rs + p
            # Per-thread partial sums; the quad reduction happens once, in the epilogue.
            ctx.row_sum[r] = cute.math.fma(ctx.row_sum[r], corr[r], rs)
        if const_expr(self.rpt == 1):
            # The padding row: scaled scores (finite) become its P; they reach padding rows of
            # O only (rows of a GEMM do not mix). One multiply keeps the wgmma async (above).
            for c in cutlass.range_constexpr(ncol):
                s_mn[1, c] = s_mn[1, c] * ctx.scale_log2
        rec.end(EV.SOFTMAX, n_block)
        return rec, corr

    @cute.jit
    def correct(self, rec: Recorder, ctx, corr, n_block, t=None):
        """O *= the correction factors of softmax(n_block), before PV(n_block) adds to O.
        ``t``: a timer read to begin with (``issue_qk``'s), else one now."""
        rec.begin(EV.CORRECTION, n_block, t=t)
        o_mn = _acc_mn_view(ctx.acc_O)
        for r in cutlass.range_constexpr(2):  # padding rows too: keeps the wgmma async
            for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
                o_mn[r, c] = o_mn[r, c] * corr[r if r < self.rpt else 0]
        rec.end(EV.CORRECTION, n_block)
        return rec

    @cute.jit
    def convert_p(self, ctx, acc_S):
        """P (fp32 accumulator layout) -> A-operand registers of the PV wgmma."""
        ctx.tOrP.store(_acc_as_frg_a(acc_S).load().to(self.dtype))

    @cute.jit
    def correct_and_convert(self, rec: Recorder, ctx, acc_S, corr, n_block, t=None):
        rec = self.correct(rec, ctx, corr, n_block, t=t)
        self.convert_p(ctx, acc_S)
        return rec

    @cute.jit
    def base_step(self, rec: Recorder, ctx, acc_S, k_state, v_state, n_block, is_last: cutlass.Constexpr):
        rec = rec.open_block(EVENTS_PER_STEP)
        rec, k_state, corr = self.qk_then_softmax(rec, ctx, acc_S, k_state, n_block, is_last)
        rec = self.correct_and_convert(rec, ctx, acc_S, corr, n_block)
        rec = self.issue_pv(rec, ctx, v_state, n_block)
        warpgroup.wait_group(0)
        rec, v_state = self.retire(rec, EV.PV, ctx.pipe_v, v_state, n_block)
        rec = rec.close_block()
        return rec, k_state, v_state

    @cute.jit
    def pingpong_step(self, rec: Recorder, ctx, acc_cur, acc_nxt, k_state, v_state, n_block,
                      has_next: cutlass.Constexpr, has_prev_pv: cutlass.Constexpr):
        """QK(n_block) is done (in acc_cur); PV(n_block-1) may still run (has_prev_pv)."""
        rec = rec.open_block(EVENTS_PER_STEP)
        t = None
        if const_expr(has_next):
            rec, t = self.issue_qk(rec, ctx, acc_nxt, k_state, n_block + 1)
        rec, corr = self.softmax(rec, ctx, acc_cur, n_block, not has_next, t=t)
        # O and P are operands of PV(n_block-1): wait for it (the oldest pending group) first.
        if const_expr(has_next):
            warpgroup.wait_group(1)
        else:
            warpgroup.wait_group(0)
        t = None
        if const_expr(has_prev_pv):
            rec, v_state, t = self.retire_then(rec, EV.PV, ctx.pipe_v, v_state, n_block - 1)
        rec = self.correct_and_convert(rec, ctx, acc_cur, corr, n_block, t=t)
        rec = self.issue_pv(rec, ctx, v_state, n_block)
        if const_expr(has_next):
            warpgroup.wait_group(1)  # QK(n_block+1) is older than PV(n_block): it is done now
            rec, k_state = self.retire(rec, EV.QK, ctx.pipe_k, k_state, n_block + 1)
        rec = rec.close_block()
        return rec, k_state, v_state

    @cute.jit
    def intrawg_first(self, rec: Recorder, ctx, acc_S, corr, k_state, n_block, is_last: cutlass.Constexpr):
        """Intra-warpgroup schedule, the split's first block: QK, softmax, P; no PV yet."""
        rec = rec.open_block(EVENTS_PER_STEP)
        rec, k_state, c = self.qk_then_softmax(rec, ctx, acc_S, k_state, n_block, is_last)
        for r in cutlass.range_constexpr(self.rpt):
            corr[r] = c[r]
        self.convert_p(ctx, acc_S)
        rec = rec.close_block()
        return rec, k_state

    @cute.jit
    def intrawg_step(self, rec: Recorder, ctx, acc_S, corr, k_state, v_state, n_block,
                     is_last: cutlass.Constexpr):
        """FA3's intra-warpgroup overlap: softmax(n_block) runs while PV(n_block-1) does.

        On entry P(n_block-1) is in registers and ``corr`` holds softmax(n_block-1)'s factors.
        QK(n_block) is issued first (into the one S buffer: P was converted out of it), O is
        corrected while it runs, then PV(n_block-1) goes out behind it; the wait for QK is
        exposed, the softmax hides behind PV. One S tile in registers, as in ``base``.
        """
        rec = rec.open_block(EVENTS_PER_STEP)
        rec, t = self.issue_qk(rec, ctx, acc_S, k_state, n_block)
        rec = self.correct(rec, ctx, corr, n_block - 1, t=t)
        rec = self.issue_pv(rec, ctx, v_state, n_block - 1)
        warpgroup.wait_group(1)  # QK(n_block) is older than PV(n_block-1): it is done now
        rec, k_state, t = self.retire_then(rec, EV.QK, ctx.pipe_k, k_state, n_block)
        rec, c = self.softmax(rec, ctx, acc_S, n_block, is_last, t=t)
        # P and O are operands of PV(n_block-1): wait for it before they are rewritten.
        warpgroup.wait_group(0)
        rec, v_state = self.retire(rec, EV.PV, ctx.pipe_v, v_state, n_block - 1)
        for r in cutlass.range_constexpr(self.rpt):
            corr[r] = c[r]
        self.convert_p(ctx, acc_S)
        rec = rec.close_block()
        return rec, k_state, v_state

    # ---- split-KV combine inside the launch ---------------------------------------------
    @cute.jit
    def combine(self, rec: Recorder, storage, tidx, base0, gmem: GmemTensors, work: CtaWork, cut: CombineCut):
        """Take a ticket; the last ``n_comb`` CTAs of the group wait for all splits and combine.

        Arrival: count[group] += 1 (acq_rel, after a fence that releases this CTA's partials)
        gives the ticket (count - base, the finishing order). The last arrival stores base + n
        as the next launch's base; combiners wait until count reaches base + n_splits (one hop
        after the last arrival's atomic, and nothing to undo afterwards).

        Partials per group: one per split.
        Work item = (R rows, NC4 float4 columns). Thread t = ((r * P) + p) * NC4 + c4: row r,
        partition p (partials p, p+P, ...: at most COMBINE_UNROLL of them), column c4; NC4, P
        and the row count per item are powers of two (shifts, computed before the wait).
        Consecutive lanes read consecutive 16-byte pieces of one partial's row (coalesced); all
        loads of an item are issued before any is used (one L2 round trip; indices past the end
        are clamped and weighted zero, not branched on). Each partition keeps (max, sum,
        acc[4]) and the partitions merge log-sum-exp style: a shuffle butterfly inside the warp,
        then one shared-memory round across warps. The merge order depends on the plan only.
        """
        d = self.d
        ticket_s = storage.ticket.get_tensor(cute.make_layout(4))
        count_ptr = gmem.counters.iterator + 4 * work.group
        base_ptr = gmem.counters.iterator + 4 * work.group + 1
        # Index math first: none of it depends on the partials.
        nc4 = Int32(1) << cut.nc4_log2
        parts = Int32(1) << cut.parts_log2
        gt_log2 = cut.nc4_log2 + cut.parts_log2  # log2(threads per row work.group) <= 7
        group_threads = Int32(1) << gt_log2
        rows_par_log2 = 7 - gt_log2  # NUM_CONSUMER_THREADS = 128 = 2^7
        cc_log2 = (d // 4).bit_length() - 1 - cut.nc4_log2  # log2 of the column chunks
        rows_here = cutlass.min(work.rows_total - work.m_block * self.block_rows, self.block_rows)
        n_items = ((rows_here + (Int32(1) << rows_par_log2) - 1) >> rows_par_log2) << cc_log2
        c4 = tidx & (nc4 - 1)
        p = (tidx >> cut.nc4_log2) & (parts - 1)
        rr = tidx >> gt_log2
        lane = cute.arch.lane_idx()
        warp = tidx >> 5
        in_warp = cutlass.min(group_threads, 32)
        warps_per_row = group_threads >> 5  # 0 when a row fits in part of a warp
        gbase = work.group * work.n_splits
        first = work.n_splits - cut.n_comb

        cute.arch.barrier(barrier_id=_BAR_CONSUMER, number_of_threads=NUM_CONSUMER_THREADS)
        if tidx == 0:
            # Release this split's partials (every consumer thread stored part of them; the
            # barrier above orders those stores before this release). The acq_rel atomic is
            # the whole release pattern: ptxas puts a MEMBAR.GPU before it, so a separate
            # fence.acq_rel here doubled the wait for the stores' acknowledgements (SASS).
            t = cute.arch.atomic_add(count_ptr.llvm_ptr, Int32(1), sem="acq_rel", scope="gpu") - base0
            ticket_s[0] = t
            if t == work.n_splits - 1:  # last arrival: the next launch starts from here
                cute.arch.store(base_ptr.llvm_ptr, base0 + work.n_splits, sem="relaxed", scope="gpu")
        cute.arch.barrier(barrier_id=_BAR_CONSUMER, number_of_threads=NUM_CONSUMER_THREADS)
        ticket = ticket_s[0]
        rec.instant(EV.MARK, ticket)  # this split is done; payload = its finishing order
        if ticket >= first:
            if tidx == 0:
                if ticket != work.n_splits - 1:  # the last arrival's own atomic acquired the others
                    target = base0 + work.n_splits
                    seen = cute.arch.load(count_ptr.llvm_ptr, Int32, sem="acquire", scope="gpu")
                    while seen != target:
                        seen = cute.arch.load(count_ptr.llvm_ptr, Int32, sem="acquire", scope="gpu")
            # Thread 0's acquire + this barrier order every thread's loads below after it.
            cute.arch.barrier(barrier_id=_BAR_CONSUMER, number_of_threads=NUM_CONSUMER_THREADS)
            rec = _begin(rec, EV.COMBINE, ticket)
            red = storage.comb_acc.get_tensor(cute.make_layout((6, NUM_CONSUMER_THREADS)))
            for item in cutlass.range(ticket - first, n_items, cut.n_comb, unroll=1):
                cc = item & ((Int32(1) << cc_log2) - 1)
                row = ((item >> cc_log2) << rows_par_log2) + rr
                row_c = cutlass.min(row, rows_here - 1)
                col = ((cc << cut.nc4_log2) + c4) * 4
                lse_v = cute.make_rmem_tensor((COMBINE_UNROLL,), Float32)
                o_v = cute.make_rmem_tensor(cute.make_layout((COMBINE_UNROLL, 4), stride=(4, 1)), Float32)
                for i in cutlass.range_constexpr(COMBINE_UNROLL):
                    s_i = p + i * parts
                    base = (gbase + cutlass.min(s_i, work.n_splits - 1)) * TILE_M + row_c
                    l = cute.arch.load((gmem.lse_part.iterator + base).llvm_ptr, Float32)
                    lse_v[i] = cutlass.select_(s_i < work.n_splits, l, -Float32.inf)
                    src = cute.make_tensor(
                        cute.make_ptr(Float32, (gmem.o_part.iterator + base * d + col).toint(),
                                      cute.AddressSpace.gmem, assumed_align=16),
                        cute.make_layout(4))
                    cute.autovec_copy(src, o_v[i, None])
                st = cute.make_rmem_tensor((6,), Float32)  # (max, sum, acc0..acc3) of this partition
                mx = lse_v[0]
                for i in cutlass.range_constexpr(1, COMBINE_UNROLL):
                    mx = cute.arch.fmax(mx, lse_v[i])
                mx_safe = cutlass.select_(mx == -Float32.inf, Float32(0.0), mx)
                st.fill(0.0)
                st[0] = mx
                for i in cutlass.range_constexpr(COMBINE_UNROLL):
                    w = cute.math.exp(lse_v[i] - mx_safe, fastmath=True)  # 0 for padded entries
                    st[1] = st[1] + w
                    for j in cutlass.range_constexpr(4):
                        st[2 + j] = cute.math.fma(w, o_v[i, j], st[2 + j])
                _merge_partitions(st, red, tidx, lane, warp, nc4, in_warp, warps_per_row)
                if (p == 0) & (row < rows_here):
                    inv = 1.0 / st[1]
                    m = work.m_block * self.block_rows + row
                    tok = m // work.ratio
                    qh = work.h_idx * work.ratio + (m - tok * work.ratio)
                    gO = gmem.o[work.b_idx, tok, qh, None]
                    for j in cutlass.range_constexpr(4):
                        gO[col + j] = (st[2 + j] * inv).to(self.dtype)
                    if col == 0:
                        gmem.lse[work.b_idx, qh, tok] = st[0] + cute.math.log(st[1], fastmath=True)
            rec = _end(rec, EV.COMBINE, ticket)
        return rec


def _bulk_prefetch_l2(ptr, nbytes: int):
    """cp.async.bulk.prefetch.L2 of nbytes at ptr with the KV loads' evict_first policy (no
    DSL wrapper takes a cache hint for it, so asm)."""
    from cutlass._mlir.dialects import llvm

    llvm.inline_asm(None, [ptr.toint().ir_value(), Int32(nbytes).ir_value(), Int64(_L2_EVICT_FIRST).ir_value()],
                    "cp.async.bulk.prefetch.L2.global.L2::cache_hint [$0], $1, $2;", "l,r,l",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def _tree_max(values: list):
    """max of the values as a balanced tree: log2(n) dependent FMNMX instead of a chain of n.
    The row max heads the softmax's critical path (S -> max -> exp2 -> P -> PV), where the
    chain put 17 dependent FMNMX per step (SASS); the tree is 5 deep (ping-pong up to 0.8%
    faster on the H200). max is exact, so the result is the same bits in any order. Plain
    Python: it unrolls while the kernel is traced."""
    while len(values) > 1:
        pairs = [cute.arch.fmax(values[i], values[i + 1]) for i in range(0, len(values) - 1, 2)]
        values = pairs + values[len(pairs) * 2:]
    return values[0]


@cute.jit
def _lse_merge(st: cute.Tensor, o: cute.Tensor):
    """st <- st (+) o for (max, sum, acc0..3) partials of one softmax (log-sum-exp merge)."""
    mx = cute.arch.fmax(st[0], o[0])
    mx_safe = cutlass.select_(mx == -Float32.inf, Float32(0.0), mx)
    fa = cute.math.exp(st[0] - mx_safe, fastmath=True)
    fb = cute.math.exp(o[0] - mx_safe, fastmath=True)
    st[0] = mx
    for j in cutlass.range_constexpr(1, 6):
        st[j] = cute.math.fma(st[j], fa, o[j] * fb)


@cute.jit
def _merge_partitions(st: cute.Tensor, red: cute.Tensor, tidx: Int32, lane: Int32, warp: Int32,
                      stride: Int32, in_warp: Int32, warps_per_row: Int32):
    """Merge the partials of the partitions of one output (lanes ``stride`` apart, then warps).

    Every thread of the row group ends with the same merged state, built in the same order.
    """
    other = cute.make_rmem_tensor((6,), Float32)
    off = stride
    for _ in cutlass.range_constexpr(5):  # butterfly over up to 32 lanes
        if off < in_warp:
            for j in cutlass.range_constexpr(6):
                other[j] = cute.arch.shuffle_sync_bfly(st[j], offset=off)
            _lse_merge(st, other)
        off = off * 2
    if warps_per_row > 1:
        for j in cutlass.range_constexpr(6):
            red[j, tidx] = st[j]
        cute.arch.barrier(barrier_id=_BAR_CONSUMER, number_of_threads=NUM_CONSUMER_THREADS)
        w0 = warp - (warp & (warps_per_row - 1))
        for j in cutlass.range_constexpr(6):
            st[j] = red[j, w0 * 32 + lane]
        for k in cutlass.range(1, warps_per_row, unroll=1):
            for j in cutlass.range_constexpr(6):
                other[j] = red[j, (w0 + k) * 32 + lane]
            _lse_merge(st, other)
        # the scratch is rewritten by the next item
        cute.arch.barrier(barrier_id=_BAR_CONSUMER, number_of_threads=NUM_CONSUMER_THREADS)


@cute.jit
def _keep_padding_live(acc_O_mn: cute.Tensor, n_splits: Int32, mLSE: cute.Tensor, b_idx: Int32):
    """Read the padding rows of O after the last wgmma (see ``block_rows``): a store under a
    condition that never holds (the host passes n_splits >= 1) but ptxas cannot prove."""
    pad = Float32(0.0)
    for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
        pad = pad + acc_O_mn[1, c]
    if n_splits < 0:
        mLSE[b_idx, 0, 0] = pad


def _begin(rec, event, payload):
    """``rec.begin`` as an expression: inside a dynamic if, the DSL tracer carries only locals
    that are rebound in the branch, so write ``rec = _begin(rec, ...)`` there."""
    rec.begin(event, payload)
    return rec


def _end(rec, event, payload):
    rec.end(event, payload)
    return rec


class _Ctx:
    """Loop-invariant handles of the consumer mainloop (tensors are views, nothing is copied)."""

    def __init__(self, mma_qk, mma_pv, tSrQ, tSrK, tOrV, tOrP, acc_O, tScS, row_max, row_sum,
                 scale_log2, n_blocks, last_valid, pipe_k, pipe_v):
        self.mma_qk, self.mma_pv = mma_qk, mma_pv
        self.tSrQ, self.tSrK, self.tOrV, self.tOrP = tSrQ, tSrK, tOrV, tOrP
        self.acc_O, self.tScS, self.row_max, self.row_sum = acc_O, tScS, row_max, row_sum
        self.scale_log2, self.n_blocks, self.last_valid = scale_log2, n_blocks, last_valid
        self.pipe_k, self.pipe_v = pipe_k, pipe_v


def _acc_mn_view(acc: cute.Tensor) -> cute.Tensor:
    """wgmma accumulator ((2, 2, N/8), 1, 1) viewed as (rows=2, cols=N/4) per thread.

    Value mode 0 steps one column, mode 1 steps eight rows, mode 2 steps eight columns.
    """
    lay = acc.layout
    v = lay.shape[0]
    st = lay.stride[0]
    mn = cute.make_layout((v[1], (v[0], v[2])), stride=(st[1], (st[0], st[2])))
    return cute.make_tensor(acc.iterator, mn)


def _acc_as_frg_a(acc: cute.Tensor) -> cute.Tensor:
    """S accumulator ((2, 2, N/8), 1, 1) viewed as the wgmma A fragment ((2, 2, 2), 1, N/16).

    The 16-bit A operand of m64k16 holds, per thread, the same (row, column) positions as two
    consecutive 8-column groups of the fp32 accumulator, so this is a reshape, no data movement.
    """
    lay = acc.layout
    v = lay.shape[0]
    st = lay.stride[0]
    shape = ((v[0], v[1], 2), 1, v[2] // 2)
    stride = ((st[0], st[1], st[2]), 0, st[2] * 2)
    return cute.make_tensor(acc.iterator, cute.make_layout(shape, stride=stride))


# ----------------------------------------------------------------------------------------
# compilation (CPU-only machines too: name the target with CUTE_DSL_ARCH=sm_90a)
# ----------------------------------------------------------------------------------------
DSL_DTYPES = {"bf16": BFloat16, "fp16": Float16}


def fake_arguments(head_dim: int, dtype: str, traced: bool):
    """Fake tensors for ``cute.compile``: every extent dynamic except the head dim.

    Layouts are the row-major (contiguous) torch layouts; workspaces and the trace are 1-D.
    """
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    el = DSL_DTYPES[dtype]
    b, sq, hq, hkv, sk = (cute.sym_int() for _ in range(5))
    row_major4 = (3, 2, 1, 0)
    q = make_fake_compact_tensor(el, (b, sq, hq, head_dim), stride_order=row_major4, assumed_align=16)
    k = make_fake_compact_tensor(el, (b, sk, hkv, head_dim), stride_order=row_major4, assumed_align=16)
    v = make_fake_compact_tensor(el, (b, sk, hkv, head_dim), stride_order=row_major4, assumed_align=16)
    o = make_fake_compact_tensor(el, (b, sq, hq, head_dim), stride_order=row_major4, assumed_align=16)
    lse = make_fake_compact_tensor(Float32, (b, hq, sq), stride_order=(2, 1, 0), assumed_align=4)
    o_part = make_fake_compact_tensor(Float32, (cute.sym_int(),), assumed_align=16)
    lse_part = make_fake_compact_tensor(Float32, (cute.sym_int(),), assumed_align=16)
    count = make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)
    trace = make_fake_compact_tensor(cutlass.Int64, (cute.sym_int(),), assumed_align=16) if traced else None
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    scalars = (Float32(1.0), Int32(1), Int32(1), Int32(1), Int32(1))
    return (q, k, v, o, lse, o_part, lse_part, count, *scalars, trace, stream)


def compile_variant(variant: Variant, *, options: str = "--enable-tvm-ffi"):
    """Compile one variant for sm_90a (a GPU is not needed); returns (compiled, kernel object)."""
    kern = DecodeAttentionSm90(variant)
    if "--gpu-arch" not in options:  # wgmma/setmaxnreg need sm_90a whatever CUTE_DSL_ARCH says
        options = f"{options} --gpu-arch {ARCH}"
    if "--ptxas-options" not in options:
        # No mul+add contraction by ptxas: where it fuses depends on the surrounding code, so
        # the traced build would round differently (outputs differed in the last bit on the
        # H200). The kernel writes its hot FMAs explicitly instead.
        options = f"{options} {PTXAS_OPTIONS}"
    return cute.compile(kern, *fake_arguments(variant.head_dim, variant.dtype, variant.traced), options=options), kern


def aot_variants(arch: str):
    """(name, compile thunk, Entry) for every variant ``fa4trace build`` exports."""
    from fa4trace.format.entry import Entry

    if not arch.startswith("sm_90"):
        return []
    return [(v.name, (lambda v=v: compile_variant(v)[0]), Entry(v.name, "attention", {**v.config(), "arch": arch}))
            for v in all_variants()]
