"""The figures a trace of any kernel reports, by flat name: what passes and benchmarks compare.

One definition for every place that sets a figure of one recording against another's:
fa4trace.analysis.passes (each figure from the lightest pass of a bundle that reports it) and
benchmarks/bench_fidelity.py (a dense trace against lighter ones). The names:

* ``cta.median_ns``: the recorded CTAs' median lifetime (the bundle's CTA lifetimes, else the
  span of each CTA's warps);
* ``span.<event>.median_ns``: the median duration of each span event (per-stage durations:
  pipeline waits, MMA waits, barriers, named spans);
* ``lag.<pipeline>.median_ns`` / ``.p90_ns``: producer -> consumer lag (fa4trace.analysis.kernel);
* ``waiting.<role>.<event>``: the share of the role's lifetime spent in that wait;
* ``overlap.<span>.mma``: the share of a named span with the warp's MMA groups in flight.

A recording reports a figure when the events behind it were recorded: a trace of warp
lifetimes alone reports ``cta.median_ns`` and nothing else.
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from ..trace.bundle import Trace


def span_medians(trace: Trace) -> dict:
    """{"span.<name>.median_ns": median duration} of every span event of the trace."""
    ev = trace.events
    spans = ev.filter(pc.equal(ev["kind"].cast("string"), "span"))
    if not spans.num_rows:
        return {}
    names = np.asarray(spans["name"].cast("string").to_pylist())
    dur = (spans["end_ns"].to_numpy() - spans["start_ns"].to_numpy()).astype(np.float64)
    return {f"span.{n}.median_ns": float(np.median(dur[names == n])) for n in sorted(set(names.tolist()))}


def recorded_cta_ns(trace: Trace) -> float | None:
    """Median lifetime of the recorded CTAs: from the bundle's CTA lifetimes, else from the span
    of each CTA's warps."""
    from .fidelity import cta_lifetimes

    life = cta_lifetimes(trace)
    if life is not None:
        rec = life.filter(life["recorded"])
        return float(np.median(rec["dur_ns"].to_numpy())) if rec.num_rows else None
    w = trace.events.filter(pc.equal(trace.events["kind"].cast("string"), "warp"))
    if not w.num_rows:
        return None
    g = w.group_by(["launch", "cta"]).aggregate([("start_ns", "min"), ("end_ns", "max")])
    return float(np.median(g["end_ns_max"].to_numpy() - g["start_ns_min"].to_numpy()))


def trace_metrics(trace: Trace, roles: dict | None = None) -> dict:
    """What a trace reports, by flat name (module docstring), figures it cannot report left
    out. ``roles``: warp -> role, so traces of different families name the same warps alike."""
    from .autoevents import AutoCols
    from .kernel import lag_stats, pipeline_lags, waiting_by_event
    from .mma_flight import mma_in_flight, overlap_share
    from .roles import assign_roles

    out: dict = {"cta.median_ns": recorded_cta_ns(trace)}
    out.update(span_medians(trace))
    tr = assign_roles(trace, roles)
    c = AutoCols.of(tr)
    for p, d in lag_stats(pipeline_lags(c)).items():
        out[f"lag.{p}.median_ns"], out[f"lag.{p}.p90_ns"] = d["median_ns"], d["p90_ns"]
    for role, shares in waiting_by_event(c).items():
        for ev, v in shares.items():
            out[f"waiting.{role}.{ev}"] = v
    flight = mma_in_flight(c)
    if flight.num_rows:
        for e in trace.vocab.events:
            if e.family == "user":
                out[f"overlap.{e.name}.mma"] = overlap_share(c, e.name, flight)
    return {k: v for k, v in out.items() if v is not None}


def is_duration(metric: str) -> bool:
    """A figure in ns (else a share of a lifetime or span, 0..1)."""
    return metric.endswith("_ns")
