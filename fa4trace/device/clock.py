"""Timer reads the recorders share: a warp's anchor pair, a per-lane %clock read, and the wait
that puts the read ending a barrier's span after the barrier.

An event's own timer read belongs to its recorder (``Recorder.read_timer``,
``SegmentRecorder.read_timer``); what is here is read the same way by both. The recorders call
these through the module (``clock.edge_anchor()``), so a measurement that builds the recorder
with a part taken out (benchmarks/decode_recorder_parts.py) replaces the function in one place.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def edge_anchor():
    """(%globaltimer, %clock64) read together right after the global timer ticks.

    %globaltimer advances in steps of a tick (32 ns on the H200), so a plain read can be up to a
    tick stale, and the first read a warp makes can be staler still (docs/recorder.md, "Times").
    Spinning until the value changes pins the pair to a tick edge: the anchor is then as
    precise as one loop trip (a few ns). Costs ≤ one tick per warp, at start and at finish only.
    """
    g0 = cute.arch.globaltimer()
    g = cute.arch.globaltimer()
    c = cute.arch.clock64()
    while g == g0:
        g = cute.arch.globaltimer()
        c = cute.arch.clock64()
    return g, c


def clock_lo_vector(lane: Int32) -> Int32:
    """%clock read into a per-lane register (a read predicated on lane < 32, true everywhere),
    where ptxas would read a uniform one and move it (S2UR, NOP, MOV) for a per-lane store."""
    from cutlass._mlir import ir
    from cutlass._mlir.dialects import llvm

    return Int32(llvm.inline_asm(ir.IntegerType.get_signless(32), [Int32(lane).ir_value()],
                                 "{ .reg .pred p; setp.lt.u32 p, $1, 32; mov.u32 $0, 0; @p mov.u32 $0, %clock; }",
                                 "=r,r", has_side_effects=True, is_align_stack=False,
                                 asm_dialect=llvm.AsmDialect.AD_ATT))


def after_barrier() -> None:
    """Emitted between a barrier (``bar.sync``) and the timer read that ends its span, so that
    the read comes after the barrier released the warp.

    ptxas emits ``bar.sync`` as ``BAR.SYNC.DEFER_BLOCKING``: a warp that reaches the barrier
    first goes on issuing past it until an instruction that has to wait (a branch, as far as
    the traces and the SASS show), so a %clock64 read placed right after the barrier runs
    before the barrier has released it (what that did to recorded exits: docs/compensation.md).
    Here that instruction is a branch on %nsmid (never 0, which ptxas cannot know), taken over
    a nanosleep: about four instructions, once per recorded barrier."""
    from cutlass._mlir.dialects import llvm

    llvm.inline_asm(None, [], "{ .reg .pred p; .reg .b32 n; mov.u32 n, %nsmid; setp.ne.u32 p, n, 0; "
                    "@p bra.uni SETTLED${:uid}; nanosleep.u32 1; SETTLED${:uid}: }", "~{memory}",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
