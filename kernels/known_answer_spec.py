"""The known-answer kernels (``known_answer.py``) as the host sees them: their recorders, tests,
events, warps and buffer sizes. No cutlass here: the kernels, the probes that record them, the
benchmark and the tests size launches and read results with the same numbers.

Each kernel spins for a set number of cycles between its events, so what each span and wait
lasts is known by construction (docs/compensation.md). Two tests:

* ``spans``: every warp on its own. First ``cal_reps`` calibration rounds (an empty span,
  the same held in one segment, a span around ``CAL_EVENTS`` back-to-back instants), then
  ``reps`` spans of ``cycles`` cycles, spun in ``density`` sub-spins of ``cycles // density``
  cycles each with an instant recorded between two sub-spins (``density - 1`` inner events);
  sub-spin j of round r is ``jitter(r, j)`` cycles longer.
* ``handoff``: warp 0 (producer) spins ``cycles`` cycles in ``density`` sub-spins, then arrives
  on an mbarrier and records the fill (``handoff.commit``); warp 1 (consumer) spins
  ``cons_cycles`` cycles in ``cons_density`` sub-spins, then waits on the mbarrier inside a
  ``handoff.wait`` span. Both start each round at a CTA barrier (``handoff.round``, recorded as a
  barrier span); sub-spins are jittered as above.

Variants: one per recorder the product uses (``RECORDERS``: ``Recorder`` staged in lane
registers or in shared memory, hand-placed events; ``SegmentRecorder`` with each cursor, the
automatic events of ``fa4trace.instrument``) and ``untraced``: the same kernel with no recorder,
timing each region with two %clock64 reads into an output array (the truth the traces are held
against).
"""

from __future__ import annotations

from fa4trace.format.vocab import VOCAB, Vocabulary

RECORDERS = ("recorder_lanes", "recorder_smem", "segment_gmem", "segment_smem", "segment_ring")
UNTRACED = "untraced"
VARIANTS = RECORDERS + (UNTRACED,)
TESTS = ("spans", "handoff")
WARPS_PER_CTA = 2  # one warp per SM sub-partition: the warps never compete for issue slots
CAL_EVENTS = 32  # back-to-back instants in a calibration run span: one staging flush each
RING_RECORDS = 2048  # the segment_ring recorder's ring per warp (32 KiB for the two warps)
# Sub-spin j of round r is ((r * JITTER_MUL_R + j * JITTER_MUL_J) % JITTER_STEPS) * JITTER_CYCLES
# cycles longer (known_answer._jitter): 0..56, over a loop trip of the spin, so its overshoot
# averages out the same in the twin and the traces
JITTER_STEPS, JITTER_CYCLES, JITTER_MUL_R, JITTER_MUL_J = 8, 8, 5, 3

# Event ids (hand-placed events use 1..31; fa4trace's own vocabulary ends at 14)
SPAN, INNER, CAL_EMPTY, CAL_HELD, CAL_RUN, CAL_EVENT, WAIT, COMMIT, ROUND = range(20, 29)
PIPELINE = "handoff"  # the handoff's pipeline: its wait and commit are named like instrument()'s

# Twin output words: spans, per warp and slot (3 per calibration round, then 1 per span): the
# region's first and last %clock64; handoff, per CTA and round: producer start, producer fill
# (read right after its arrive), consumer wait begin, consumer wait end.
SPAN_WORDS = 2
HANDOFF_WORDS = 4


def vocabulary() -> Vocabulary:
    """fa4trace's vocabulary plus the known-answer events (stored in every bundle they record).
    The handoff's two events are a pipeline's wait and commit, as ``fa4trace.instrument`` names
    them, so the any-kernel analysis (fills, lags) and the compensation read them as such."""
    v = VOCAB.copy()
    v.register("ka.span", SPAN, role="bench", color="#31a354", description="spin of a set number of cycles")
    v.register("ka.inner", INNER, role="bench", color="#636363", description="event between two sub-spins")
    v.register("ka.empty", CAL_EMPTY, role="bench", color="#bdbdbd", description="calibration: nothing inside")
    v.register("ka.held", CAL_HELD, role="bench", color="#969696",
               description="calibration: nothing inside, both records in one segment")
    v.register("ka.run", CAL_RUN, role="bench", color="#fd8d3c", description="calibration: back-to-back events")
    v.register("ka.event", CAL_EVENT, role="bench", color="#e6550d", description="calibration: one of those")
    v.register(f"{PIPELINE}.wait", WAIT, role="consumer", color="#fa9fb5", family="pipeline", op="wait",
               resource=PIPELINE, stages=1, description="consumer waits for the producer's arrive")
    v.register(f"{PIPELINE}.commit", COMMIT, role="producer", color="#6baed6", family="pipeline", op="commit",
               resource=PIPELINE, stages=1, description="producer arrived on the mbarrier")
    v.register(f"{PIPELINE}.round", ROUND, role="bench", color="#9e9ac8", family="barrier", op="sync",
               resource="0", description="CTA barrier each handoff round starts at (both warps)")
    return v


def check_variant(variant: str, test: str) -> None:
    """A one-line ValueError for an unknown variant or test."""
    if variant not in VARIANTS:
        raise ValueError(f"known-answer variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    if test not in TESTS:
        raise ValueError(f"known-answer test must be one of {', '.join(TESTS)}, got {test!r}")


def jitter(r: int, j: int = 0) -> int:
    """Cycles added to sub-spin ``j`` of round ``r`` (the kernels' ``_jitter``)."""
    return (r * JITTER_MUL_R + j * JITTER_MUL_J) % JITTER_STEPS * JITTER_CYCLES


def set_cycles(cycles: int, density: int, reps: int) -> float:
    """The mean cycles a span's sub-spins are set to over ``reps`` rounds: ``density`` sub-spins
    of ``cycles // density``, each with its jitter."""
    sub = cycles // density
    return sum(density * sub + sum(jitter(r, j) for j in range(density)) for r in range(reps)) / reps


def span_slots(reps: int, cal_reps: int) -> int:
    """Twin slots per warp of the spans test: three per calibration round, one per span."""
    return 3 * cal_reps + reps


def out_words(test: str, n_ctas: int, reps: int, cal_reps: int = 0) -> int:
    """Int64 words of the twin's output array (traced variants take the same array, unused)."""
    if test == "spans":
        return n_ctas * WARPS_PER_CTA * span_slots(reps, cal_reps) * SPAN_WORDS
    return n_ctas * reps * HANDOFF_WORDS


def records_per_warp(test: str, reps: int, cal_reps: int = 0, density: int = 1, cons_density: int = 1) -> int:
    """The most records one warp of a launch makes (a slot this size drops nothing)."""
    if test == "spans":
        return cal_reps * (6 + CAL_EVENTS) + reps * (density + 1)
    return reps * (max(density, cons_density + 1) + 2)
