"""Known-answer kernels: spans and waits whose true durations are set by construction.

A warp spins on %clock64 between its events: ``spin(n)`` reads the clock, then loops until
it has advanced ``n`` cycles, so a spin lasts ``n`` cycles (plus one loop trip) whatever ran
before it. A span of ``cycles`` at density k is k sub-spins of ``cycles // k`` with an instant
recorded between two of them; what the trace shows beyond the untraced region is the
recorder's own cost (docs/compensation.md). The ``untraced`` variant runs the same code with
two %clock64 reads around each region and no recorder: the truth the traces are held against.
What the tests are, their events and the buffer sizes: ``known_answer_spec``.

Each recorder variant records as the product does:

* ``recorder_lanes`` / ``recorder_smem``: ``Recorder`` (hand-placed events), staged in lane
  registers or in shared memory;
* ``segment_gmem`` / ``segment_smem`` / ``segment_ring``: ``SegmentRecorder`` with that
  cursor, one segment per event as ``fa4trace.instrument``'s hooks record: a span with events
  inside stores its begin at once (a user span), a wait holds both records in one segment
  around the wait (a pipeline wait), a fill is recorded right after the arrive (a commit).

Between events that nothing else separates the kernel places ``_fence()`` (an empty volatile
asm: no instruction), so each event reads the timer itself where the segment recorder would
otherwise share one read among adjacent events.
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, const_expr

from fa4trace.device import Recorder, SegmentRecorder
from fa4trace.device.clock import after_barrier
from fa4trace.format.options import Placement
from fa4trace.format.vocab import ROLE

from .known_answer_spec import (CAL_EMPTY, CAL_EVENT, CAL_EVENTS, CAL_HELD, CAL_RUN, COMMIT, HANDOFF_WORDS, INNER,
                                JITTER_CYCLES, JITTER_MUL_J, JITTER_MUL_R, JITTER_STEPS, RING_RECORDS, ROUND, SPAN,
                                SPAN_WORDS, TESTS, UNTRACED, VARIANTS,
                                WAIT, WARPS_PER_CTA, check_variant)


def _fence():
    """An empty volatile asm that clobbers memory: no instruction, but to the compiler an op
    that may touch any memory, as the work between a real kernel's events does (barriers, loads,
    stores). So each event reads its own timer (``SegmentRecorder.timer`` shares a read only
    where nothing was emitted between) and reloads what it keeps in memory (a segment
    recorder's cursor), as it does in the kernels the product traces."""
    from cutlass._mlir.dialects import llvm

    llvm.inline_asm(None, [], "", "~{memory}", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@cute.jit
def spin(cycles: Int64) -> Int64:
    """Spin until %clock64 has advanced ``cycles`` from this call's own first read (after a
    ``_fence``: the spin stands for work that touches memory). Returns its overshoot: how far
    past ``cycles`` its last read was (the loop polls, so it ends up to a trip late)."""
    _fence()
    t0 = cute.arch.clock64()
    t = t0
    while t - t0 < cycles:
        t = cute.arch.clock64()
    return t - t0 - cycles


def _jitter(r: Int32, j: Int32) -> Int64:
    """Cycles added to sub-spin ``j`` of round ``r`` (``known_answer_spec.jitter``). A spin
    ends at the first trip of its loop past its length, so it overshoots by a phase that
    depends on the length and on where the code around it put the spin's first read; spread
    over a loop trip, the overshoot averages to half a trip whatever that placement (the twin
    and each recorder variant place it differently), so means compare like with like."""
    return Int64((r * JITTER_MUL_R + j * JITTER_MUL_J) % JITTER_STEPS) * JITTER_CYCLES


class KnownAnswer:
    """One known-answer kernel: ``variant`` (a recorder, or ``untraced``) x ``test``."""

    def __init__(self, variant: str = UNTRACED, test: str = "spans"):
        check_variant(variant, test)
        self.variant = variant
        self.test = test
        self.segment = variant.startswith("segment_")
        self.threads = 32 * WARPS_PER_CTA

    @cute.jit
    def __call__(self, out: cute.Tensor, trace: Optional[cute.Tensor], n_ctas: Int32, reps: Int32, cal_reps: Int32,
                 cycles: Int32, density: Int32, cons_cycles: Int32, cons_density: Int32):
        self.kernel(out, trace, reps, cal_reps, cycles, density, cons_cycles, cons_density).launch(
            grid=(n_ctas, 1, 1), block=(self.threads, 1, 1))

    # ---- the recorder, as the product places it ------------------------------------------------
    def _start(self, trace, role):
        """This warp's recorder. A ``Recorder`` is a DSL value that loops carry, so it is
        returned (off for the other variants); a ``SegmentRecorder`` needs no carrying and is
        kept on ``self._seg`` (None for the other variants), as instrument()'s hooks keep it."""
        self._seg = None
        if const_expr(self.variant == "recorder_lanes"):
            return Recorder.start(trace, role)
        if const_expr(self.variant == "recorder_smem"):
            return Recorder.start(trace, role, stage="smem", stage_warps=WARPS_PER_CTA)
        if const_expr(self.segment):
            self._seg = SegmentRecorder.start(trace, role, placement=Placement(
                cursor=self.variant.removeprefix("segment_"), ring=RING_RECORDS, l2="last"), ring_warps=WARPS_PER_CTA)
        return Recorder.start(None)

    def _finish(self, rec):
        if const_expr(self.segment):
            self._seg.finish()
        else:
            rec.finish()

    def _event(self, rec, kind: str, event: int, payload):
        """One event in a segment of its own (segment recorders) or staged (Recorder). Returns
        the recorder: callers rebind it, so loops carry a ``Recorder``'s state."""
        if const_expr(self.segment):
            seg = self._seg.open()
            getattr(seg, kind)(event, payload)
            seg.close()
        else:
            getattr(rec, kind)(event, payload)
        return rec

    def _empty(self, rec, event: int, i, held: bool):
        """An empty span: begin, nothing, end (``held``: both records in one segment)."""
        if const_expr(self.segment and held):
            seg = self._seg.open()
            seg.begin(event, i)
            _fence()
            seg.end(event, i)
            seg.close()
        else:
            rec = self._event(rec, "begin", event, i)
            _fence()
            rec = self._event(rec, "end", event, i)
        return rec

    @cute.jit
    def _spins(self, rec, sub: Int64, density: Int32, r: Int32):
        """``density`` sub-spins of ``sub`` cycles (each jittered: ``_jitter``), an inner
        instant (or, untraced, nothing) between each two. Each sub-spin is shortened by the one
        before's overshoot, so the spins of a region add up to their set cycles plus the last
        one's overshoot alone: how late a polling loop ends depends on where the compiler
        placed it, which differs between the twin and each recorder variant, and k sub-spins
        would otherwise carry k such phases into what a trace is held against."""
        debt = spin(sub + _jitter(r, Int32(0)))
        for j in cutlass.range(density - 1, unroll=1):
            if const_expr(self.variant == UNTRACED):
                _fence()
            else:
                rec = self._event(rec, "instant", INNER, j)
            debt = spin(sub + _jitter(r, j + 1) - debt)
        return rec

    @cute.kernel
    def kernel(self, out: cute.Tensor, trace: Optional[cute.Tensor], reps: Int32, cal_reps: Int32, cycles: Int32,
               density: Int32, cons_cycles: Int32, cons_density: Int32):
        if const_expr(self.test == "spans"):
            self.spans(out, trace, reps, cal_reps, cycles, density)
        else:
            self.handoff(out, trace, reps, cycles, density, cons_cycles, cons_density)

    # ---- spans: each warp on its own ------------------------------------------------------------
    @cute.jit
    def spans(self, out: cute.Tensor, trace: Optional[cute.Tensor], reps: Int32, cal_reps: Int32, cycles: Int32,
              density: Int32):
        bid, _, _ = cute.arch.block_idx()
        warp = cute.arch.warp_idx()
        lane = cute.arch.lane_idx()
        first = (bid * WARPS_PER_CTA + warp) * (3 * cal_reps + reps)  # this warp's first twin slot (spec)
        rec = self._start(trace, ROLE.BENCH)
        sub = Int64(cycles) // Int64(density)

        for i in cutlass.range(cal_reps, unroll=1):
            if const_expr(self.variant == UNTRACED):
                for s in cutlass.range_constexpr(3):  # empty, held, run: two reads around (almost) nothing
                    t0 = cute.arch.clock64()
                    for _ in cutlass.range_constexpr(CAL_EVENTS if s == 2 else 1):
                        _fence()
                    t1 = cute.arch.clock64()
                    if lane == 0:
                        out[(first + 3 * i + s) * SPAN_WORDS] = t0
                        out[(first + 3 * i + s) * SPAN_WORDS + 1] = t1
            else:  # fenced apart: no span begins at the read that ended the one before
                rec = self._empty(rec, CAL_EMPTY, i, held=False)
                _fence()
                rec = self._empty(rec, CAL_HELD, i, held=True)
                _fence()
                rec = self._event(rec, "begin", CAL_RUN, i)
                for _ in cutlass.range_constexpr(CAL_EVENTS):  # unrolled: nothing but the events
                    _fence()
                    rec = self._event(rec, "instant", CAL_EVENT, i)
                _fence()
                rec = self._event(rec, "end", CAL_RUN, i)

        for r in cutlass.range(reps, unroll=1):
            if const_expr(self.variant == UNTRACED):
                t0 = cute.arch.clock64()
                rec = self._spins(rec, sub, density, r)
                t1 = cute.arch.clock64()
                if lane == 0:
                    out[(first + 3 * cal_reps + r) * SPAN_WORDS] = t0
                    out[(first + 3 * cal_reps + r) * SPAN_WORDS + 1] = t1
            else:
                rec = self._event(rec, "begin", SPAN, r)
                rec = self._spins(rec, sub, density, r)
                rec = self._event(rec, "end", SPAN, r)
        self._finish(rec)

    # ---- handoff: a producer warp releases a consumer warp --------------------------------------
    def _round_barrier(self, rec, r):
        """The CTA barrier each handoff round starts at, recorded as instrument()'s barrier hook
        records one (a span around the call, both records in one segment): where both warps
        were last aligned, which the compensation of a wait reads (``fa4trace.analysis.compensate``).
        The twin syncs alone. Every variant waits for the release before its next timer read
        (``clock.after_barrier``): else the warp that got there first would read the span's end
        (the twin: its round's start) before the barrier let it go."""
        if const_expr(self.variant == UNTRACED):
            cute.arch.sync_threads()
            after_barrier()
        elif const_expr(self.segment):
            seg = self._seg.open()
            seg.begin(ROUND, r)
            cute.arch.sync_threads()
            after_barrier()
            seg.end(ROUND, r)
            seg.close()
        else:
            rec.begin(ROUND, r)
            cute.arch.sync_threads()
            after_barrier()
            rec.end(ROUND, r)
        return rec

    @cute.jit
    def handoff(self, out: cute.Tensor, trace: Optional[cute.Tensor], reps: Int32, cycles: Int32, density: Int32,
                cons_cycles: Int32, cons_density: Int32):
        bid, _, _ = cute.arch.block_idx()
        warp = cute.arch.warp_idx()
        lane = cute.arch.lane_idx()
        bar = cute.arch.alloc_smem(Int64, 1, alignment=8)
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(bar, 32)  # the producer's 32 lanes arrive
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        producer = warp == 0
        rec = self._start(trace, cutlass.select_(producer, Int32(ROLE.PRODUCER), Int32(ROLE.CONSUMER)))
        sub = Int64(cycles) // Int64(density)
        cons_sub = Int64(cons_cycles) // Int64(cons_density)

        for r in cutlass.range(reps, unroll=1):
            rec = self._round_barrier(rec, r)  # both warps start the round together
            word = (bid * reps + r) * HANDOFF_WORDS
            if producer:
                if const_expr(self.variant == UNTRACED):
                    t0 = cute.arch.clock64()
                rec = self._spins(rec, sub, density, r)
                if const_expr(self.segment):
                    seg = self._seg.open()  # as instrument()'s commit hook: open, the call, the instant
                    cute.arch.mbarrier_arrive(bar)
                    seg.instant(COMMIT, r)
                    seg.close()
                else:
                    cute.arch.mbarrier_arrive(bar)
                    rec.instant(COMMIT, r)
                if const_expr(self.variant == UNTRACED):
                    t1 = cute.arch.clock64()
                    if lane == 0:
                        out[word] = t0
                        out[word + 1] = t1
            else:
                rec = self._spins(rec, cons_sub, cons_density, r)
                if const_expr(self.variant == UNTRACED):
                    t2 = cute.arch.clock64()
                    cute.arch.mbarrier_wait(bar, r % 2)
                    t3 = cute.arch.clock64()
                    if lane == 0:
                        out[word + 2] = t2
                        out[word + 3] = t3
                elif const_expr(self.segment):
                    seg = self._seg.open()  # as instrument()'s wait hook: both records in one segment
                    seg.begin(WAIT, r)
                    cute.arch.mbarrier_wait(bar, r % 2)
                    seg.end(WAIT, r)
                    seg.close()
                else:
                    rec.begin(WAIT, r)
                    cute.arch.mbarrier_wait(bar, r % 2)
                    rec.end(WAIT, r)
        self._finish(rec)


def compile_variant(variant: str, test: str = "spans", *, tvm_ffi: bool = True, keep_ptx: bool = False,
                    traced: bool = True):
    """Compile one variant (``traced=False``: a recorder variant with no buffer, which compiles
    to the kernel without its recorder: the PTX tests compare it with ``untraced``'s spins)."""
    opts = []
    if tvm_ffi:
        opts.append("--enable-tvm-ffi")
    if keep_ptx:
        opts.append("--keep-ptx")
    i64 = lambda: cute.runtime.make_fake_compact_tensor(Int64, (cute.sym_int(),), assumed_align=16)  # noqa: E731
    trace = i64() if variant != UNTRACED and traced else None
    one = Int32(1)
    return cute.compile(KnownAnswer(variant, test), i64(), trace, one, one, one, one, one, one, one,
                        options=" ".join(opts))


def aot_variants(arch: str):
    from fa4trace.format.entry import Entry

    return [(f"known_answer_{t}_{v}", (lambda v=v, t=t: compile_variant(v, t)),
             Entry(f"known_answer_{t}_{v}", "known_answer",
                   {"test": t, "variant": v, "traced": v != UNTRACED, "warps_per_cta": WARPS_PER_CTA, "arch": arch}))
            for t in TESTS for v in VARIANTS]
