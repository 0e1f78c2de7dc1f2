"""Marker-dense microbenchmark: what does recording cost when markers are dense?

Each warp repeats ``iters`` times: begin(BENCH, i) · a dependent chain of ``chain`` loads
· end(BENCH, i). With 8 warps per CTA and 8 CTAs per SM that is 64 warps per SM.

Two kinds of work (compile-time ``work``):
* ``l2``: loads that miss L1 and hit L2 (``ld.global.cg`` through a small table): the warp
  mostly waits, as attention warps wait on loads and MMAs; with chain=1 a begin + end per
  warp comes about every 360 cycles with few instructions in between: dense markers
  in a memory-bound kernel.
* ``smem``: shared-memory loads: many instructions per cycle of latency, so the SM's issue
  slots are the bottleneck and every added instruction shows (a worst case for recorders).

Variants (compile-time): ``plain`` (no markers), ``fa4trace`` (our recorder, staged in lane
registers), ``fa4trace_block`` (the same, one room check per iteration), ``fa4trace_lane``
(lane-0 direct stores), ``fa4trace_gt`` (globaltimer per event), ``fa4trace_smem`` and
``fa4trace_smem_block`` (staged in shared memory, ``Recorder.start(stage="smem")``), and
``iket`` (NVIDIA's IKET markers; compile with options including ``iket`` and run under
``run-iket``).
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from fa4trace.device import Recorder
from fa4trace.format import layout as L
from fa4trace.format.vocab import EV, ROLE

from .marker_spec import L2_TABLE, VARIANTS, WARPS_PER_CTA, WORKS

TABLE = 256  # words in the shared-memory pointer-chase table


class MarkerBench:
    def __init__(self, variant: str = "fa4trace", work: str = "l2"):
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if work not in WORKS:
            raise ValueError(f"work must be one of {WORKS}, got {work!r}")
        self.variant = variant
        self.work = work
        self.threads = 32 * WARPS_PER_CTA

    @cute.jit
    def __call__(self, out: cute.Tensor, table: cute.Tensor, trace: Optional[cute.Tensor], n_ctas: Int32,
                 iters: Int32, chain: Int32):
        self.kernel(out, table, trace, iters, chain).launch(grid=(n_ctas, 1, 1), block=(self.threads, 1, 1))

    @cute.kernel
    def kernel(self, out: cute.Tensor, table: cute.Tensor, trace: Optional[cute.Tensor], iters: Int32,
               chain: Int32):
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        nxt = smem.allocate_tensor(Int32, cute.make_layout(TABLE), byte_alignment=16)
        # A permutation with stride 33: consecutive lanes chase through different banks.
        for i in range(tid, TABLE, self.threads):
            nxt[i] = (i * 33 + 1) % TABLE
        cute.arch.sync_threads()

        if const_expr(self.variant == "fa4trace_lane"):
            rec = Recorder.start(trace, ROLE.BENCH, staged=False)
        elif const_expr(self.variant == "fa4trace_gt"):
            rec = Recorder.start(trace, ROLE.BENCH, timebase=L.TIMEBASE_GLOBALTIMER)
        elif const_expr(self.variant in ("fa4trace", "fa4trace_block")):
            rec = Recorder.start(trace, ROLE.BENCH)
        elif const_expr(self.variant in ("fa4trace_smem", "fa4trace_smem_block")):
            rec = Recorder.start(trace, ROLE.BENCH, stage="smem", stage_warps=WARPS_PER_CTA)
        else:
            rec = Recorder.start(None)

        x = tid % TABLE
        if const_expr(self.work == "l2"):
            x = (bid * self.threads + tid) * 97 % L2_TABLE
        acc = Float32(0.0)
        for it in cutlass.range(iters, unroll=1):
            if const_expr(self.variant == "iket"):
                from cutlass.cute.experimental import iket

                tok = iket.range_start("BENCH", it)
            if const_expr(self.variant in ("fa4trace_block", "fa4trace_smem_block")):
                rec = rec.open_block(2)  # begin + end: one room check per iteration
            rec.begin(EV.BENCH, it)
            for _ in cutlass.range(chain, unroll=1):
                if const_expr(self.work == "smem"):
                    x = nxt[x]
                else:
                    x = cute.arch.load(table.iterator + x, Int32, cop="cg")
            acc = acc * Float32(0.999) + Float32(x)
            rec.end(EV.BENCH, it)
            if const_expr(self.variant in ("fa4trace_block", "fa4trace_smem_block")):
                rec = rec.close_block()
            if const_expr(self.variant == "iket"):
                iket.range_end(tok, it)
        rec.finish()
        out[bid * self.threads + tid] = acc


def compile_variant(variant: str, work: str = "l2", *, tvm_ffi: bool = True, keep_ptx: bool = False):
    opts = []
    if tvm_ffi:
        opts.append("--enable-tvm-ffi")
    if keep_ptx:
        opts.append("--keep-ptx")
    if variant == "iket":
        opts.append("iket")
    out = cute.runtime.make_fake_compact_tensor(Float32, (cute.sym_int(),))
    traced = variant.startswith("fa4trace")
    trace = cute.runtime.make_fake_compact_tensor(cutlass.Int64, (cute.sym_int(),)) if traced else None
    table = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),))
    return cute.compile(MarkerBench(variant, work), out, table, trace, Int32(1), Int32(1), Int32(1),
                        options=" ".join(opts))


def aot_variants(arch: str):
    from fa4trace.format.entry import Entry

    return [(f"markers_{w}_{v}", (lambda v=v, w=w: compile_variant(v, w)),
             Entry(f"markers_{w}_{v}", "markers", {"variant": v, "work": w, "traced": v.startswith("fa4trace"),
                                                   "warps_per_cta": WARPS_PER_CTA, "arch": arch}))
            for w in WORKS for v in VARIANTS]

