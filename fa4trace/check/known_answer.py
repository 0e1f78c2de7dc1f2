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
                 reps: int = 16, n_ctas: int | None = None, build=None) -> list[dict]:
    """A producer that spins ``cycles`` (``density`` sub-spins) before it releases a consumer that
    spins ``cons_cycles`` (``cons_density`` sub-spins) before it waits: the wait and the lag,
    mean raw and compensated, against the twin's (two rows)."""
    from ..analysis import compensate as C
    from ..probes import known_answer as K

    kw = dict(reps=reps, cycles=cycles, density=density, cons_cycles=cons_cycles, cons_density=cons_density,
              n_ctas=n_ctas, build=build)
    trace = K.record(recorder, "handoff", **kw)
    twin = K.time_untraced("handoff", **kw)
    ghz = _ghz(trace)
    sp = C.spans(trace, cal)
    waits = sp.filter(np.asarray(sp["name"].to_pylist()) == "handoff.wait")
    lg = C.lags(trace, cal)
    case = dict(recorder=recorder, cycles=cycles, density=density, cons_cycles=cons_cycles, cons_density=cons_density,
                clock_ghz=ghz, dropped=int(trace.info.total_dropped or 0))
    wait = _figure(waits["raw_ns"].to_numpy(), waits["ns"].to_numpy(), float(np.mean(twin["wait"])) / ghz)
    wait.update(case, figure="wait", clamped=int(waits["clamped"].to_numpy(zero_copy_only=False).sum()),
                release_events=int(np.median(waits["n_release"].to_numpy())) if waits.num_rows else None)
    lag = _figure(lg["raw_ns"].to_numpy(), lg["ns"].to_numpy(), float(np.mean(twin["lag"])) / ghz)
    lag.update(case, figure="lag", clamped=int(lg["clamped"].to_numpy(zero_copy_only=False).sum()),
               consumer_events=int(np.median(lg["n_consumer"].to_numpy())) if lg.num_rows else None)
    return [wait, lag]
