"""How much a trace slowed what it shows, measured in the launch it comes from.

Kernels compiled by fa4trace.auto stamp every CTA's start and end into the trace buffer,
whether the CTA records or runs the untouched copy of the body (fa4trace.format.layout, the
CTA-lifetime region; the bundle's ``cta_lifetimes``). ``perturbation(trace)`` compares the
durations of the CTAs that recorded with those of the CTAs that did not, in the same launch:

    recorded CTAs ran +25.3% longer than untraced ones (124 recorded, 1650 untraced)

Launch order biases such a comparison: the CTAs of a launch's opening wave start together and
contend for memory, those of its tail run beside idle SMs. Where both sets have enough CTAs
in between (started after the launch's first CTA ended, ended before its last CTA started),
those are compared ("steady-state waves"); else all of them, with a caveat. Caveats also say
when the sample is biased in other ways: recorded CTAs that all started before (or after) the
untraced ones, CTAs that do unequal work, a launch of one wave (a persistent kernel), one
instrumented body for every CTA. Where every CTA recorded nothing can be compared in the
launch; the traced launch and its plain build timed next to each other are reported instead
where the metadata holds them: ``instrument.plain_twin`` ({"plain_ns", "traced_ns"}: kernels
compiled by fa4trace.auto) or ``timing`` ({"kernel_us", "traced_us"}: our decode kernel's own
recorder, which stamps no CTA lifetimes).
docs/fidelity.md says what the figure means and where it stops.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..trace.bundle import Trace

MIN_CTAS = 5  # fewer CTAs than this in either set: the comparison is noisy (caveat), or not made
UNEQUAL_WORK_SPREAD = 0.25  # untraced CTAs' p90 / p10 above 1 + this: the CTAs do unequal work
ORDER_OVERLAP = 0.25  # fewer untraced CTAs than this share starting among the recorded ones: launch order
WARN = 0.10  # a perturbation above this is worth a warning (fa4trace check's cost rows)

_COLUMNS = ("launch", "cta", "start_ns", "end_ns", "recorded")


def cta_lifetimes(trace: Trace) -> pa.Table | None:
    """The bundle's timed CTAs: launch, cta, start_ns, end_ns, dur_ns, recorded, and ``phase``
    ("opening": started before the launch's first CTA ended; "tail": ended after its last CTA
    started; "steady": neither; a CTA of a one-wave launch is "opening"). None without
    lifetimes (bundles of kernels with their own recorder, or recorded before CTAs were timed)."""
    raw = trace.meta.get("cta_lifetimes")
    if not raw or not all(k in raw for k in _COLUMNS):
        return None
    cols = {k: np.asarray(raw[k], np.int64) for k in _COLUMNS}
    n = cols["cta"].size
    if n == 0 or any(v.size != n for v in cols.values()):
        return None
    start, end, launch = cols["start_ns"], cols["end_ns"], cols["launch"]
    phase = np.full(n, "steady", dtype=object)
    for ln in np.unique(launch):
        m = launch == ln
        first_end, last_start = end[m].min(), start[m].max()
        phase[m & (end > last_start)] = "tail"
        phase[m & (start < first_end)] = "opening"
    return pa.table({"launch": cols["launch"], "cta": cols["cta"], "start_ns": start, "end_ns": end,
                     "dur_ns": end - start, "recorded": cols["recorded"].astype(bool),
                     "phase": pa.array(phase.tolist(), pa.string())})


def _stats(dur: np.ndarray) -> dict:
    d = np.asarray(dur, np.float64)
    if not d.size:
        return {"n": 0, "median_ns": None, "p10_ns": None, "p90_ns": None}
    return {"n": int(d.size), "median_ns": float(np.median(d)), "p10_ns": float(np.percentile(d, 10)),
            "p90_ns": float(np.percentile(d, 90))}


def _comparison(dur: np.ndarray, recorded: np.ndarray) -> dict:
    """Recorded vs untraced durations: each set's stats and the relative difference of medians."""
    rec, unt = _stats(dur[recorded]), _stats(dur[~recorded])
    rel = rec["median_ns"] / unt["median_ns"] - 1 if rec["n"] and unt["n"] and unt["median_ns"] > 0 else None
    return {"rel": rel, "recorded": rec, "untraced": unt}


def plain_twin(meta: dict) -> dict | None:
    """The traced launch against its plain build as {"plain_ns", "traced_ns", "rel", "n"}:
    ``instrument.plain_twin`` (one timing, or the medians of a list of them, one per launch),
    else ``timing``'s ``kernel_us`` / ``traced_us`` (module doc); None where absent or unusable."""
    raw = (meta.get("instrument") or {}).get("plain_twin")
    if raw is None:
        raw = _timing_twin(meta.get("timing"))
    items = raw if isinstance(raw, list) else [raw]
    pairs = []
    for it in items:
        if not isinstance(it, dict):
            continue
        try:
            p, t = float(it["plain_ns"]), float(it["traced_ns"])
        except (KeyError, TypeError, ValueError):
            continue
        if p > 0 and t > 0:
            pairs.append((p, t))
    if not pairs:
        return None
    p, t = (float(np.median([x[i] for x in pairs])) for i in (0, 1))
    return {"plain_ns": p, "traced_ns": t, "rel": t / p - 1, "n": len(pairs)}


def _timing_twin(timing) -> dict | None:
    """A ``timing`` block's untraced and traced kernel times (µs) as one plain-twin timing (ns)."""
    if not isinstance(timing, dict) or timing.get("kernel_us") is None or timing.get("traced_us") is None:
        return None
    try:
        return {"plain_ns": 1e3 * float(timing["kernel_us"]), "traced_ns": 1e3 * float(timing["traced_us"])}
    except (TypeError, ValueError):
        return None


def _order_overlap(start: np.ndarray, launch: np.ndarray, recorded: np.ndarray) -> float | None:
    """Share of untraced CTAs that started between the first and the last recorded CTA of
    their launch (0: the recorded CTAs all started before, or all after, every untraced one)."""
    inside = total = 0
    for ln in np.unique(launch):
        m = launch == ln
        rs, us = start[m & recorded], start[m & ~recorded]
        if rs.size and us.size:
            inside += int(((us >= rs.min()) & (us <= rs.max())).sum())
            total += us.size
    return inside / total if total else None


def perturbation(trace: Trace) -> dict:
    """How much longer the recorded CTAs ran than the untraced ones of the same launch (module
    doc): ``measured`` (a comparison was made), ``rel`` (median recorded / median untraced - 1),
    ``basis`` ("steady" or "all": which CTAs were compared), ``recorded`` / ``untraced`` (n,
    median, p10, p90 ns of the compared CTAs), ``all`` and ``steady`` (each comparison where
    it could be made), ``timed`` (CTAs timed, recorded and untraced), ``caveats`` (why the figure
    may be biased), ``reason`` (why nothing was compared) and ``plain_twin``."""
    out: dict = {"measured": False, "rel": None, "basis": None, "recorded": None, "untraced": None,
                 "all": None, "steady": None, "timed": None, "caveats": [], "reason": None,
                 "plain_twin": plain_twin(trace.meta)}
    life = cta_lifetimes(trace)
    if life is None:
        out["reason"] = ("no CTA lifetimes in this bundle: recorded before fa4trace timed CTAs, or by a kernel "
                         "with its own recorder")
        return out
    dur = life["dur_ns"].to_numpy()
    rec = life["recorded"].to_numpy(zero_copy_only=False)
    phase = np.asarray(life["phase"].to_pylist())
    start, launch = life["start_ns"].to_numpy(), life["launch"].to_numpy()
    out["timed"] = {"recorded": int(rec.sum()), "untraced": int((~rec).sum())}
    if not rec.any():
        out["reason"] = "no recorded CTA was timed (they lie beyond the buffer's CTA-lifetime region)"
        return out
    if rec.all():
        out["reason"] = (f"every timed CTA recorded ({int(rec.size)}): not measurable in this launch; "
                         "see the plain-twin timing")
        return out
    out["all"] = _comparison(dur, rec)
    steady = phase == "steady"
    if (steady & rec).sum() >= MIN_CTAS and (steady & ~rec).sum() >= MIN_CTAS:
        out["steady"] = _comparison(dur[steady], rec[steady])
    basis = "steady" if out["steady"] else "all"
    chosen = out[basis]
    if chosen["rel"] is None:
        out["reason"] = "the untraced CTAs' median duration is 0 ns (stamps within one timer tick)"
        return out
    sel = steady if basis == "steady" else np.ones(rec.size, bool)
    out.update(measured=True, basis=basis, rel=chosen["rel"], recorded=chosen["recorded"],
               untraced=chosen["untraced"])
    out["caveats"] = _caveats(trace.meta, chosen, phase, start[sel], launch[sel], rec[sel])
    return out


def _caveats(meta: dict, chosen: dict, phase: np.ndarray, start, launch, rec) -> list[str]:
    """Why the compared CTAs may differ for reasons other than tracing (see perturbation)."""
    out = []
    n_rec, n_unt = chosen["recorded"]["n"], chosen["untraced"]["n"]
    if min(n_rec, n_unt) < MIN_CTAS:
        out.append(f"only {min(n_rec, n_unt)} {'recorded' if n_rec < n_unt else 'untraced'} CTAs: the figure is noisy")
    if (phase == "opening").all():
        out.append("one wave (a persistent kernel or a small grid): each CTA's duration is the work it was given; "
                   "where CTAs take work as they finish (a dynamic tile scheduler) the slower recorded ones take "
                   "less, and the figure understates the slowdown")
    overlap = _order_overlap(start, launch, rec)
    if overlap is not None and overlap < ORDER_OVERLAP and not (phase == "opening").all():
        first = start[rec].min() <= start[~rec].min()
        out.append(f"the recorded CTAs started {'before' if first else 'after'} almost all untraced ones "
                   f"({100 * overlap:.0f}% of those started among them): where in the launch a CTA runs counts "
                   "as perturbation here; record CTAs spread over the grid (cta_stride) to compare like with like")
    u = chosen["untraced"]
    if u["n"] >= MIN_CTAS and u["p10_ns"] and u["p90_ns"] / u["p10_ns"] - 1 > UNEQUAL_WORK_SPREAD:
        out.append(f"untraced CTAs ran {u['p10_ns'] / 1e3:.1f}-{u['p90_ns'] / 1e3:.1f} µs (p10-p90): CTAs do "
                   "unequal work, and which ones record moves the figure")
    outside = sum(int(ln.get("ctas_outside_lifetime") or 0) for ln in meta.get("launches") or [] if isinstance(ln, dict))
    if outside:
        out.append(f"{outside} recorded CTAs have warps outside their lifetime entry: the stamps are off; report it")
    if (meta.get("instrument") or {}).get("split") is False:
        out.append("one instrumented body for every CTA: the untraced CTAs ran it too with their stores off, so "
                   "the figure shows only the record stores' share")
    return out


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def perturbation_lines(p: dict | None) -> list[str]:
    """What ``fa4trace summary`` / ``compare``, the viewer and ``check`` print of
    ``perturbation()``: the headline first, then the plain twin and the caveats."""
    if not p:
        return []
    lines = []
    if p.get("measured"):
        rel = p["rel"]
        how = f"+{100 * rel:.1f}% longer" if rel >= 0 else f"{-100 * rel:.1f}% shorter"
        lines.append(f"recorded CTAs ran {how} than untraced ones "
                     f"({p['recorded']['n']} recorded, {p['untraced']['n']} untraced"
                     + ("; steady-state waves" if p.get("basis") == "steady" else "") + ")")
    elif p.get("reason"):
        lines.append(f"not measured: {p['reason']}")
    tw = p.get("plain_twin")
    if tw:
        lines.append(f"traced launch ran {_pct(tw['rel'])} against its plain twin "
                     f"({tw['traced_ns'] / 1e3:.2f} µs vs {tw['plain_ns'] / 1e3:.2f} µs)")
    lines += [f"caveat: {c}" for c in p.get("caveats") or []]
    return lines


def headline(p: dict | None) -> float | None:
    """The perturbation to judge by: the in-launch figure, else the plain twin's, else None."""
    if not p:
        return None
    if p.get("measured"):
        return p["rel"]
    tw = p.get("plain_twin")
    return tw["rel"] if tw else None
