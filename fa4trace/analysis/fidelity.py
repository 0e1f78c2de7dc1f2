"""How much a trace slowed what it shows, measured in the launch it comes from, and when that
measure cannot be trusted.

Kernels compiled by fa4trace.auto stamp every CTA's start and end into the trace buffer,
whether the CTA records or runs the untouched copy of the body (fa4trace.format.layout, the
CTA-lifetime region; the bundle's ``cta_lifetimes``). ``perturbation(trace)`` compares the
durations of the CTAs that recorded with those of the CTAs that did not, in the same launch:

    recorded CTAs ran +P% longer than untraced ones (R recorded, U untraced; noise ±N%)

(docs/fidelity.md shows the whole line on a synthetic bundle.)

Every figure is one launch's: a bundle of several launches gets one result per launch
(``per_launch``), never one of CTAs pooled across launches (fa4trace.analysis.launches).

Launch order biases such a comparison: the CTAs of a launch's opening wave start together and
contend for memory, those of its tail run beside idle SMs. Where both sets have enough CTAs
in between (started after the launch's first CTA ended, ended before its last CTA started),
those are compared ("steady-state waves"); else all of them, with a caveat. Caveats also say
when the sample is biased in other ways: recorded CTAs that all started before (or after) the
untraced ones, CTAs that do unequal work, a launch of one wave (a persistent kernel), one
instrumented body for every CTA.

The comparison assumes a CTA's duration is its own work. Where the kernel's CTAs wait on other
CTAs (``instrument.cta_dependencies``, read from the kernel's PTX by fa4trace.auto.ctadeps:
a split-KV combine, a dynamic tile scheduler, a spin on a global flag) the slowed recorded CTAs
make untraced ones wait longer or take less work, and the figure is **not valid for this
kernel**: it is shown as such, and the figure to go by is the plain twin's. A figure that cannot
be right is **unreliable**, never an answer: recorded CTAs faster than untraced ones beyond the
noise (recording cannot speed a CTA up), a build whose recorded CTAs record nothing but their
lifetimes showing a large difference, a plain twin timed from the host or over several launches.

Which figure to go by (``headline``): the plain twin's where it was timed on the device and
nothing says it is wrong, since it is what the traced launch cost; the in-launch figure says
how much the recorded CTAs were stretched, which is the launch's cost only where a CTA's time is
the launch's time (one CTA per SM, compute-bound: FA4's forward), not where several CTAs share
an SM or memory bandwidth bounds the launch (quack's RMSNorm; docs/fidelity.md has the
figures). Without a device-timed twin, the in-launch figure where it is valid and plausible.

The plain twin: the traced launch and its plain build timed next to each other, where the
metadata holds them: ``instrument.plain_twin`` ({"plain_ns", "traced_ns"} and, where the
recorder timed it on the device, "method", "rel", "noise_pct", "l2", "launch": one entry per
launch) or ``timing`` ({"kernel_us", "traced_us"}: our decode kernel's bundles, timed by
CUDA-graph replay).
docs/fidelity.md says what each figure means and where it stops.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..trace.bundle import Trace
from ..trace.meta import BundleMeta, CtaLifetimes, TimingMeta
from .launches import launch_ids, launch_of

MIN_CTAS = 5  # fewer CTAs than this in either set: the comparison is noisy (caveat), or not made
UNEQUAL_WORK_SPREAD = 0.25  # untraced CTAs' p90 / p10 above 1 + this: the CTAs do unequal work
ORDER_OVERLAP = 0.25  # fewer untraced CTAs than this share starting among the recorded ones: launch order
WARN = 0.10  # a perturbation above this is worth a warning (fa4trace check's cost rows)
FASTER_LIMIT = 0.03  # recorded CTAs faster than untraced ones by more than this: implausible
ROUNDS_DISAGREE = 0.01  # a twin's median ratio and its median times' ratio further apart: drift
LIFETIMES_ONLY_LIMIT = 0.05  # recorded CTAs that record nothing, reading more than this: the sample's bias
Z95 = 1.96  # the noise band: 95% of the difference of two medians, from the CTAs' own spread

TIMING_METHOD = "CUDA-graph replay on the recorded inputs"  # how a decode bundle's ``timing`` was taken
HOST_TIMED = ("timed from the host around one launch (launch latency, and after a recompile the compile, "
              "count in it): not the kernel's cost")


def cta_lifetimes(trace: Trace) -> pa.Table | None:
    """The bundle's timed CTAs: launch, cta, start_ns, end_ns, dur_ns, recorded, and ``phase``
    ("opening": started before the launch's first CTA ended; "tail": ended after its last CTA
    started; "steady": neither; a CTA of a one-wave launch is "opening"). None without
    lifetimes (bundles of kernels with their own recorder, or recorded before CTAs were timed)."""
    raw = trace.info.cta_lifetimes
    if raw is None or not raw.complete:
        return None
    cols = {k: np.asarray(getattr(raw, k), np.int64) for k in CtaLifetimes.COLUMNS}
    n = cols["cta"].size
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
        return {"n": 0, "median_ns": None, "p10_ns": None, "p90_ns": None, "se_median_ns": None}
    q25, q75 = np.percentile(d, [25, 75])
    # the median's standard error from a robust spread (IQR / 1.349 estimates sigma)
    return {"n": int(d.size), "median_ns": float(np.median(d)), "p10_ns": float(np.percentile(d, 10)),
            "p90_ns": float(np.percentile(d, 90)), "se_median_ns": float(1.2533 * (q75 - q25) / 1.349 / np.sqrt(d.size))}


def _comparison(dur: np.ndarray, recorded: np.ndarray) -> dict:
    """Recorded vs untraced durations: each set's stats, the relative difference of medians and
    its noise (``noise``: the 95% half-width of that difference, from both sets' spread)."""
    rec, unt = _stats(dur[recorded]), _stats(dur[~recorded])
    ok = rec["n"] and unt["n"] and unt["median_ns"] > 0
    rel = rec["median_ns"] / unt["median_ns"] - 1 if ok else None
    noise = (Z95 * float(np.hypot(rec["se_median_ns"], unt["se_median_ns"])) / unt["median_ns"]) if ok else None
    return {"rel": rel, "noise": noise, "recorded": rec, "untraced": unt}


# how the recorder timed a plain twin on the device (``instrument.plain_twin[].method``)
TWIN_METHODS = {"graph": "CUDA-graph replays alternating with the plain build's",
                "batch": "back-to-back launches alternating with the plain build's"}


def plain_twin(meta: BundleMeta) -> dict | None:
    """The traced launch against its plain build: {"plain_ns", "traced_ns", "rel", "n",
    "method", "noise_pct", "l2", "over_launches"} from ``instrument.plain_twin`` (one timing,
    or a list of timings of the launch: medians) or ``timing``'s ``kernel_us`` / ``traced_us``
    (module doc). ``rel``: the timing's own (the median of its rounds' ratios) where it has
    one, else traced / plain - 1. ``method`` None: timed from the host (a bundle made before
    the device timing). ``over_launches``: the timing covers that many launches of the bundle
    (fa4trace.analysis.launches). None where absent, not timed (``untimed_reason``) or unusable."""
    raw = meta.instrument.plain_twin if meta.instrument is not None else None
    if raw is None:
        raw = _timing_twin(meta.timing)
    items = raw if isinstance(raw, list) else [raw]
    rows = []
    for it in items:
        if not isinstance(it, dict) or ("method" in it and not it["method"]):  # not a timing, or nothing was timed
            continue
        try:
            p, t = float(it["plain_ns"]), float(it["traced_ns"])
        except (KeyError, TypeError, ValueError):
            continue
        if p > 0 and t > 0:
            own = it.get("rel")
            rows.append((p, t, float(own) if isinstance(own, (int, float)) else t / p - 1, it))
    if not rows:
        return None
    p, t, rel = (float(np.median([r[i] for r in rows])) for i in (0, 1, 2))
    rest = [r[3] for r in rows]
    noise = [float(r["noise_pct"]) for r in rest if isinstance(r.get("noise_pct"), (int, float))]
    methods = sorted({str(r["method"]) for r in rest if r.get("method")})
    l2 = sorted({str(r["l2"]) for r in rest if r.get("l2")})
    over = max(int(r.get("over_launches") or 0) for r in rest)
    return {"plain_ns": p, "traced_ns": t, "rel": rel, "n": len(rows),
            "method": methods[0] if len(methods) == 1 else ("; ".join(methods) or None),
            "noise_pct": max(noise) if noise else None, "l2": l2[0] if len(l2) == 1 else None,
            "over_launches": over if over > 1 else None}


def untimed_reason(meta: BundleMeta) -> str | None:
    """Why the recorder timed no plain twin, where its metadata says (``method`` null, ``reason``)."""
    raw = meta.instrument.plain_twin if meta.instrument is not None else None
    for it in raw if isinstance(raw, list) else [raw]:
        if isinstance(it, dict) and "method" in it and not it["method"] and it.get("reason"):
            return str(it["reason"])
    return None


def _timing_twin(timing: TimingMeta | None) -> dict | None:
    """A ``timing`` block's untraced and traced kernel times (µs) as one plain-twin timing (ns)."""
    if timing is None or timing.kernel_us is None or timing.traced_us is None:
        return None
    try:
        return {"plain_ns": 1e3 * float(timing.kernel_us), "traced_ns": 1e3 * float(timing.traced_us),
                "method": TIMING_METHOD}
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


def perturbation(trace: Trace, launch: int | None = None) -> dict:
    """How much longer the recorded CTAs ran than the untraced ones of the same launch, and
    which figure to go by (module doc).

    A bundle of several launches without ``launch``: {"per_launch": [one result per launch],
    "launch": None, "measured": False, "reason", "headline": None, ...}; nothing is pooled.
    One launch (the bundle's only one, or ``launch``): ``measured`` (a comparison was made),
    ``rel`` (median recorded / median untraced - 1) and ``noise`` (its 95% band), ``basis``
    ("steady" or "all"), ``recorded`` / ``untraced`` (n, median, p10, p90 ns), ``all`` and
    ``steady`` (each comparison where it could be made), ``timed``, ``launch_span_ns`` (the
    launch's first CTA start to last CTA end, over every timed CTA), ``caveats`` (``biased``: those
    saying the recorded CTAs are no fair sample), ``notes``,
    ``reason`` (why nothing was compared), ``plain_twin`` (``twin_reason``: why none was timed); then the judgement: ``valid``
    (False: the kernel's CTAs wait on each other, ``invalid`` says what was found),
    ``unreliable`` (why the in-launch figure cannot be right), ``twin_unreliable`` (the same
    of the plain twin), ``headline`` (the figure to go by, or None), ``headline_source``
    ("in_launch", "plain_twin" or None) and ``status`` ("ok", "unreliable", "not_measured")."""
    ids = launch_ids(trace)
    if launch is None and len(ids) > 1:
        per = [perturbation(trace, L) for L in ids]
        out = _empty(None)
        out.update(launch=None, per_launch=per, status=_worst([p["status"] for p in per]),
                   reason=f"this bundle holds {len(ids)} launches: each has its own figure")
        return out
    one = launch_of(trace, launch) if launch is not None else trace
    out = _one_launch(one)
    out["launch"] = launch if launch is not None else (ids[0] if ids else 0)
    return out


def _empty(meta: BundleMeta | None) -> dict:
    return {"measured": False, "rel": None, "noise": None, "basis": None, "recorded": None, "untraced": None,
            "all": None, "steady": None, "timed": None, "launch_span_ns": None, "caveats": [], "biased": [], "notes": [], "reason": None,
            "plain_twin": plain_twin(meta) if meta is not None else None,
            "twin_reason": untimed_reason(meta) if meta is not None else None, "valid": None, "invalid": None,
            "unreliable": [], "twin_unreliable": [], "headline": None, "headline_source": None,
            "status": "not_measured", "dependencies": None}


def _one_launch(trace: Trace) -> dict:
    info = trace.info
    out = _empty(info)
    deps = info.instrument.cta_dependencies if info.instrument is not None else None
    out["dependencies"] = deps.get("verdict") if isinstance(deps, dict) else None
    _in_launch(trace, out, deps)
    _judge(out)
    return out


def _in_launch(trace: Trace, out: dict, deps) -> None:
    """The comparison of recorded and untraced CTAs of the launch, its caveats and whether it holds."""
    life = cta_lifetimes(trace)
    if life is None:
        out["reason"] = ("no CTA lifetimes in this bundle: recorded before fa4trace timed CTAs, or by a kernel "
                         "with its own recorder")
        return
    dur = life["dur_ns"].to_numpy()
    rec = life["recorded"].to_numpy(zero_copy_only=False)
    phase = np.asarray(life["phase"].to_pylist())
    start, launch = life["start_ns"].to_numpy(), life["launch"].to_numpy()
    out["timed"] = {"recorded": int(rec.sum()), "untraced": int((~rec).sum())}
    out["launch_span_ns"] = float(life["end_ns"].to_numpy().max() - start.min()) if start.size else None
    if not rec.any():
        out["reason"] = "no recorded CTA was timed (they lie beyond the buffer's CTA-lifetime region)"
        return
    if rec.all():
        out["reason"] = (f"every timed CTA recorded ({int(rec.size)}): not measurable in this launch; "
                         "see the plain-twin timing")
        return
    out["all"] = _comparison(dur, rec)
    steady = phase == "steady"
    if (steady & rec).sum() >= MIN_CTAS and (steady & ~rec).sum() >= MIN_CTAS:
        out["steady"] = _comparison(dur[steady], rec[steady])
    basis = "steady" if out["steady"] else "all"
    chosen = out[basis]
    if chosen["rel"] is None:
        out["reason"] = "the untraced CTAs' median duration is 0 ns (stamps within one timer tick)"
        return
    sel = steady if basis == "steady" else np.ones(rec.size, bool)
    out.update(measured=True, basis=basis, rel=chosen["rel"], noise=chosen["noise"], recorded=chosen["recorded"],
               untraced=chosen["untraced"])
    out["biased"] = _sample_biases(chosen, phase, start[sel], launch[sel], rec[sel])
    out["caveats"] = _caveats(trace.info, chosen, phase, out["biased"])
    out["notes"] = _notes(deps)
    if isinstance(deps, dict) and deps.get("waits_on_previous_grid") and basis == "all":
        out["caveats"].append("the kernel waits for the previous grid (griddepcontrol.wait): launched with PDL, its "
                              "opening CTAs' durations include that wait")
    if not isinstance(deps, dict) or deps.get("verdict") in (None, "unknown"):
        out["caveats"].append("whether this kernel's CTAs wait on each other was not read (a bundle recorded before "
                              "fa4trace read the kernel's PTX, or a build without it): where they do (split-KV "
                              "combine, dynamic tile scheduler, spin waits) this figure is wrong")
    out["valid"] = not (isinstance(deps, dict) and deps.get("waits_on_ctas"))
    if not out["valid"]:
        out["invalid"] = f"its CTAs wait on each other ({deps.get('found') or 'waits_on_ctas'})"
        return
    out["unreliable"] = _implausible(trace, out["rel"], out["noise"])


def _implausible(trace: Trace, rel: float, noise: float | None) -> list[str]:
    """Why an in-launch figure cannot be right (module doc); [] where nothing says so."""
    why = []
    limit = min(noise, FASTER_LIMIT) if noise is not None else FASTER_LIMIT
    if rel < -limit:
        band = f"±{100 * noise:.1f}% noise" if noise is not None else "noise unknown"
        why.append(f"recorded CTAs ran {-100 * rel:.1f}% faster than untraced ones ({band}): recording cannot "
                   "speed a CTA up, so the two sets differ in more than recording (which CTAs record, the work "
                   "they were given, where in the launch they ran)")
    if _records_nothing(trace) and abs(rel) > max(LIFETIMES_ONLY_LIMIT, noise or 0.0):
        why.append(f"the recorded CTAs recorded nothing but their warps' lifetimes, yet ran {100 * rel:+.1f}% "
                   "against untraced ones: that is the sample's bias, not tracing")
    return why


def _records_nothing(trace: Trace) -> bool:
    """The recorded warps hold no event but their lifetime (a lifetimes-only build)."""
    return len(trace) > 0 and trace.event_names() <= {"WARP"}


def _twin_unreliable(tw: dict) -> list[str]:
    why = []
    if not tw.get("method"):
        why.append(HOST_TIMED)
    if tw.get("over_launches"):
        why.append(f"one timing over {tw['over_launches']} launches of this bundle, not this launch's own")
    noise = (tw.get("noise_pct") or 0.0) / 100
    if tw["rel"] < -(noise or FASTER_LIMIT):
        why.append(f"the traced launch ran faster than the plain one by {-100 * tw['rel']:.1f}%"
                   + (f" (beyond its ±{100 * noise:.1f}% noise)" if noise else "")
                   + ": recording does not speed a launch up, so the two builds differ in more than recording "
                   "(code layout, scheduling) or the GPU's speed drifted while they were timed")
    medians = tw["traced_ns"] / tw["plain_ns"] - 1
    if abs(medians - tw["rel"]) > max(2 * noise, ROUNDS_DISAGREE):
        why.append(f"its rounds disagree: their median ratio reads {_pct(tw['rel'])}, the median times "
                   f"{_pct(medians)}: the GPU's speed drifted between rounds")
    return why


def _judge(out: dict) -> None:
    """The figure to go by: the plain twin's where it was timed on the device and nothing says
    it is wrong (it is the launch's own cost), else the in-launch one where valid and plausible
    (the recorded CTAs' stretch: the launch's cost only where CTA time is launch time) and,
    beside a twin found wrong, from a fair sample of CTAs; else the twin's, marked unreliable."""
    tw = out["plain_twin"]
    if tw:
        out["twin_unreliable"] = _twin_unreliable(tw)
    if tw and not out["twin_unreliable"]:
        out.update(headline=tw["rel"], headline_source="plain_twin", status="ok")
    elif out["measured"] and out["valid"] and not out["unreliable"] and not (tw and out.get("biased")):
        out.update(headline=out["rel"], headline_source="in_launch", status="ok")
    elif tw:
        out.update(headline=tw["rel"], headline_source="plain_twin",
                   status="unreliable" if out["twin_unreliable"] else "ok")
    elif out["measured"]:
        out["status"] = "unreliable"


def _worst(statuses: list[str]) -> str:
    for s in ("unreliable", "not_measured", "ok"):
        if s in statuses:
            return s
    return "not_measured"


def _sample_biases(chosen: dict, phase: np.ndarray, start, launch, rec) -> list[str]:
    """Why the recorded CTAs are not a fair sample of the launch: they ran at another point of
    it, or the CTAs do unequal work (see perturbation)."""
    out = []
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
    return out


def _caveats(meta: BundleMeta, chosen: dict, phase: np.ndarray, biases: list[str]) -> list[str]:
    """Why the compared CTAs may differ for reasons other than tracing: few CTAs, one wave, the
    sample's ``biases`` (``_sample_biases``), stamps off, one body for every CTA."""
    out = []
    n_rec, n_unt = chosen["recorded"]["n"], chosen["untraced"]["n"]
    if min(n_rec, n_unt) < MIN_CTAS:
        out.append(f"only {min(n_rec, n_unt)} {'recorded' if n_rec < n_unt else 'untraced'} CTAs: the figure is noisy")
    if (phase == "opening").all():
        out.append("one wave (a persistent kernel or a small grid): each CTA's duration is the work it was given; "
                   "where CTAs take work as they finish (a dynamic tile scheduler) the slower recorded ones take "
                   "less, and the figure understates the slowdown")
    out += biases
    outside = sum(int(ln.ctas_outside_lifetime or 0) for ln in meta.launches)
    if outside:
        out.append(f"{outside} recorded CTAs have warps outside their lifetime entry: the stamps are off; report it")
    if meta.instrument is not None and meta.instrument.split is False:
        out.append("one instrumented body for every CTA: the untraced CTAs ran it too with their stores off, so "
                   "the figure shows only the record stores' share")
    return out


def _notes(deps) -> list[str]:
    """What the kernel's CTA dependencies say that does not bias the figure."""
    if isinstance(deps, dict) and deps.get("cluster_only") and not deps.get("waits_on_ctas"):
        return ["CTAs of one cluster wait on each other (cluster barriers, distributed shared memory); fa4trace "
                "samples whole clusters, so the comparison across clusters holds"]
    return []


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _in_launch_text(p: dict) -> str:
    rel = p["rel"]
    how = f"+{100 * rel:.1f}% longer" if rel >= 0 else f"{-100 * rel:.1f}% shorter"
    extra = "; steady-state waves" if p.get("basis") == "steady" else ""
    if p.get("noise") is not None:
        extra += f"; noise ±{100 * p['noise']:.1f}%"
    return f"recorded CTAs ran {how} than untraced ones ({p['recorded']['n']} recorded, {p['untraced']['n']} untraced{extra})"


def _twin_text(tw: dict) -> str:
    how = [f"{tw['traced_ns'] / 1e3:.2f} µs vs {tw['plain_ns'] / 1e3:.2f} µs"]
    if tw.get("method"):
        how.append(TWIN_METHODS.get(tw["method"], tw["method"]) + (f", L2 {tw['l2']}" if tw.get("l2") else "")
                   + (f", noise ±{tw['noise_pct']:.1f}%" if tw.get("noise_pct") is not None
                      else ", each timed once, not alternated: noise not measured"))
    return f"traced launch ran {_pct(tw['rel'])} against its plain twin ({'; '.join(how)})"


def perturbation_lines(p: dict | None) -> list[str]:
    """What ``fa4trace summary`` / ``compare``, the viewer and ``check`` print of
    ``perturbation()``: the in-launch figure (or why it is not valid, or unreliable), then the
    plain twin, the caveats and notes; one block per launch for a bundle of several."""
    if not p:
        return []
    if p.get("per_launch"):
        lines = []
        for q in p["per_launch"]:
            sub = perturbation_lines(q)
            lines += [f"launch {q.get('launch')}: {sub[0]}" if sub else f"launch {q.get('launch')}: n/a",
                      *[f"  {x}" for x in sub[1:]]]
        return lines
    lines = []
    if p.get("measured"):
        text = _in_launch_text(p)
        if p.get("valid") is False:
            lines.append(f"not valid for this kernel: {p['invalid']}; {text}, which says nothing of the tracing cost")
        elif p.get("unreliable"):
            lines.append(f"unreliable: {text}")
            lines += [f"why: {w}" for w in p["unreliable"]]
        else:
            lines.append(text)
    elif p.get("reason"):
        lines.append(f"not measured: {p['reason']}")
    tw = p.get("plain_twin")
    if tw:
        refused = p.get("measured") and (p.get("valid") is False or p.get("unreliable"))
        goes_by = p.get("headline_source") == "plain_twin"
        head = "instead: " if refused and goes_by else ""
        # beside a stretch that holds, say which of the two figures is the launch's cost
        tail = " — unreliable" if p.get("twin_unreliable") else (
            " — the launch's cost, the figure to go by" if goes_by and p.get("measured") and not refused else "")
        lines.append(head + _twin_text(tw) + tail)
        lines += [f"why: {w}" for w in p.get("twin_unreliable") or []]
    elif p.get("twin_reason"):
        lines.append(f"plain twin not timed: {p['twin_reason']}")
    if p.get("valid") is not False:  # a refused comparison's biases are beside the point
        lines += [f"caveat: {c}" for c in p.get("caveats") or []]
    lines += [f"note: {c}" for c in p.get("notes") or []]
    return lines


def headline(p: dict | None) -> float | None:
    """The perturbation to go by (``perturbation()``'s ``headline``): the in-launch figure where
    it is valid and plausible, else the plain twin's, else None; None for a bundle of several
    launches (each has its own: ``per_launch``)."""
    if not p or p.get("per_launch"):
        return None
    return p.get("headline")
