"""The known-answer kernels against their truth: raw and compensated spans, waits and lags.

Each case records a recorder variant of ``fa4trace.kernels.known_answer`` and times its
untraced twin (the same spins with two %clock64 reads around each region, no recorder), then
sets the trace's figures, raw and compensated (``fa4trace.analysis.compensate``), beside the
twin's. Truth is the twin's region less the gap between its own two reads (its empty region),
in ns at the traced launch's SM clock; each figure is the mean over a launch's spans. What ``fa4trace check``'s recorder-cost rows,
benchmarks/bench_known_answer.py and tests/gpu/test_known_answer_gpu.py compare.
"""

from __future__ import annotations

import numpy as np

from ..kernels import known_answer_spec as S

TARGET_REL = 0.02  # compensated within 2% of truth ...
TARGET_NS = 20.0  # ... or 20 ns, whichever is larger
MIN_TRUTH_NS = 200.0  # the target holds for figures at least this long
# A handoff is measured at this many set lengths, the producer's this many cycles apart
# (handoff_case): 8 x 32 cycles span one record's spacing of a producer recording 15 times in 2 µs.
HANDOFF_LENGTHS = 8
HANDOFF_LENGTH_STEP = 32


def within_target(value: float, truth: float) -> bool:
    """|value - truth| <= max(2% of truth, 20 ns)."""
    return abs(value - truth) <= max(TARGET_REL * abs(truth), TARGET_NS)


def _ghz(trace) -> float:
    return float(trace.info.launches[0].clock_ghz_median)


def _figure(raw: np.ndarray, comp: np.ndarray, truth_ns: float) -> dict:
    """Mean raw and compensated against the truth (means: the jittered sub-spins average the
    spin loop's overshoot, and a staging flush counts as often as it happens)."""
    r, c = float(np.mean(raw)), float(np.mean(comp))
    return {"truth_ns": truth_ns, "raw_ns": r, "comp_ns": c, "raw_err_ns": r - truth_ns, "comp_err_ns": c - truth_ns,
            "raw_err_pct": 100 * (r - truth_ns) / truth_ns if truth_ns else None,
            "comp_err_pct": 100 * (c - truth_ns) / truth_ns if truth_ns else None,
            "raw_within": within_target(r, truth_ns), "within": within_target(c, truth_ns),
            "judged": truth_ns >= MIN_TRUTH_NS, "n": int(raw.size)}


def span_case(recorder: str, cal, *, cycles: int, density: int, reps: int = 8, n_ctas: int | None = None,
              build=None) -> dict:
    """Spans of ``cycles`` at ``density`` (``density - 1`` events inside each): the mean raw and
    compensated (``cal``: a ``compensate.Calibration``) against the twin's, in ns, and the
    nominal duration (what the sub-spins are set to, with their jitter, at the launch's clock)."""
    from ..analysis import compensate as C
    from ..probes import known_answer as K

    trace = K.record(recorder, "spans", reps=reps, cycles=cycles, density=density, n_ctas=n_ctas, build=build)
    twin = K.time_untraced("spans", reps=reps, cal_reps=4, cycles=cycles, density=density, n_ctas=n_ctas, build=build)
    ghz = _ghz(trace)
    truth = (float(np.mean(twin["span"])) - float(np.mean(twin["empty"]))) / ghz
    sp = C.spans(trace, cal)
    sp = sp.filter(np.asarray(sp["name"].to_pylist()) == "ka.span")
    out = _figure(sp["raw_ns"].to_numpy(), sp["ns"].to_numpy(), truth)
    out.update(figure="span", recorder=recorder, cycles=cycles, density=density,
               nominal_ns=S.set_cycles(cycles, density, reps) / ghz,
               clock_ghz=ghz, clamped=int(sp["clamped"].to_numpy(zero_copy_only=False).sum()),
               inner=int(np.median(sp["n_inner"].to_numpy())) if sp.num_rows else None,
               dropped=int(trace.info.total_dropped or 0))
    return out


def handoff_case(recorder: str, cal, *, cycles: int, density: int = 1, cons_cycles: int = 0, cons_density: int = 1,
                 reps: int = 16, n_ctas: int | None = None, build=None, lengths: int = HANDOFF_LENGTHS) -> list[dict]:
    """A producer that spins ``cycles`` (``density`` sub-spins) before it releases a consumer that
    spins ``cons_cycles`` (``cons_density`` sub-spins) before it waits: the wait and the lag,
    mean raw and compensated, against the twin's (two rows).

    Measured at ``lengths`` set lengths (``handoff_lengths``): the two warps' records meet at
    other alignments at each, and where they meet changes what a record costs (a segment
    recorder's wait can read 20 ns off at one set length and 5 ns a few cycles away); each
    figure pools every length, its truth the mean of the lengths' twins, and
    ``length_err_ns`` gives each length's compensated error."""
    parts = [_handoff_at(recorder, cal, dict(reps=reps, cycles=p, density=density, cons_cycles=c,
                                             cons_density=cons_density, n_ctas=n_ctas, build=build))
             for p, c in handoff_lengths(cycles, cons_cycles, lengths)]
    case = dict(recorder=recorder, cycles=cycles, density=density, cons_cycles=cons_cycles, cons_density=cons_density,
                clock_ghz=float(np.mean([x["ghz"] for x in parts])), dropped=sum(x["dropped"] for x in parts),
                lengths=len(parts))
    out = []
    for figure, count in (("wait", "release_events"), ("lag", "consumer_events")):
        got = [x[figure] for x in parts]
        row = _figure(np.concatenate([g["raw"] for g in got]), np.concatenate([g["comp"] for g in got]),
                      float(np.mean([g["truth"] for g in got])))
        counts = np.concatenate([g["count"] for g in got])
        row.update(case, figure=figure, clamped=sum(g["clamped"] for g in got),
                   length_err_ns=[round(float(np.mean(g["comp"])) - g["truth"], 2) if g["comp"].size else None
                                  for g in got],
                   **{count: int(np.median(counts)) if counts.size else None})
        out.append(row)
    return out


def _handoff_at(recorder: str, cal, kw: dict) -> dict:
    """One traced handoff launch and its twin at one set length (``kw``: ``known_answer.record``'s
    parameters): per figure (wait, lag) the raw and compensated values, the twin's mean (ns),
    the clamped count and the records counted (the filling warp's for a wait, the consumer's for
    a lag); the launch's clock and dropped records."""
    from ..analysis import compensate as C
    from ..probes import known_answer as K

    trace = K.record(recorder, "handoff", **kw)
    twin = K.time_untraced("handoff", **kw)
    ghz = _ghz(trace)
    sp = C.spans(trace, cal)
    waits = sp.filter(np.asarray(sp["name"].to_pylist()) == "handoff.wait")
    lg = C.lags(trace, cal)

    def part(table, truth_cycles, count):
        return {"raw": table["raw_ns"].to_numpy(), "comp": table["ns"].to_numpy(),
                "truth": float(np.mean(truth_cycles)) / ghz, "count": table[count].to_numpy(),
                "clamped": int(table["clamped"].to_numpy(zero_copy_only=False).sum())}

    return {"ghz": ghz, "dropped": int(trace.info.total_dropped or 0),
            "wait": part(waits, twin["wait"], "n_release"), "lag": part(lg, twin["lag"], "n_consumer")}


def handoff_lengths(cycles: int, cons_cycles: int, lengths: int = HANDOFF_LENGTHS) -> list[tuple[int, int]]:
    """The (producer, consumer) set cycles of a handoff measured at ``lengths`` set lengths: the
    producer's ``cycles`` plus 0, ``HANDOFF_LENGTH_STEP``, 2 x that, ..., the consumer's grown in
    proportion, so the figure keeps its shape while the warps' records meet at other alignments."""
    if lengths < 1:
        raise ValueError(f"lengths must be >= 1, got {lengths}")
    out = []
    for i in range(lengths):
        d = i * HANDOFF_LENGTH_STEP
        out.append((cycles + d, cons_cycles + (round(d * cons_cycles / cycles) if cycles else 0)))
    return out
