"""Trace fidelity: shown figures against the lightest trace; the perturbation line against the launch cost.

    python benchmarks/bench_fidelity.py run --json benchmarks/results/fidelity_h100.json   # GPU (H100/H200; name it in the file), JIT
    python benchmarks/bench_fidelity.py run --quick --kernels gemm,rmsnorm                 # a subset, one round
    python benchmarks/bench_fidelity.py run --dry-run                                      # the plan, no GPU
    python benchmarks/bench_fidelity.py compile --kernels gemm --builds lifetimes          # any machine with the DSL
    python benchmarks/bench_fidelity.py build gemm:lifetimes --out DIR                     # one AOT build (the run's workers)

Needs, for ``run``, an SM90 GPU with the CuTe DSL (nvidia-cutlass-dsl 4.8), flash-attn-4 4.0.0b36
and quack-kernels 0.6.5 installed, and a C++ compiler (the builds are linked as AOT libraries).

**Fidelity** (kernels ``fa4``: FA4's SM90 prefill b2 s8192 h16 d128, 2048 CTAs; ``gemm``: quack's
SM90 GEMM 8192^3, 132 persistent CTAs; ``decode``: our split-KV decode kernel traced by the
generic layer, d128 16:1 sk 131072 b1). Each round records, on the same inputs and the same
sample of CTAs (spread over the grid: FA4 64 of 2048, quack's GEMM 16 of 132; every CTA of our
decode, whose CTAs wait on each other; every warp), each launch starting from a flushed L2
(``RecordOptions.flush_l2``, what passes do):

* the dense build (every family; FA4 also its softmax and rescale spans) with passes
  (``Instrumented`` with ``RecordOptions.passes``: the launch replayed from the same memory with
  the lifetimes-only build, then one family at a time, then the named spans alone; the tma
  pass is left out: its events are instants and report no figure a lighter pass does not),
  each pass replayed ``--launches`` times (default 1; ``RecordOptions.pass_launches``) and
  read over those launches together;
* every pass build again, twice, each time ``--launches`` launches read together (the
  references), and the dense build with one warp per warpgroup recording, twice alike; each
  reference recorded as ``instrument()`` records by default (checked: the plain build runs
  right before it, as before the dense launch), so that it starts from the GPU state, and SM
  clock, the passes start from.

What a trace reports is fa4trace.analysis.figures (per-stage durations, waits, lags, overlaps, the
CTA lifetime). Each figure is shown three ways and each is set against the lightest reference
that reports it (fewest events per recorded CTA; the lead-warps trace last, set against the same
figure of the shown trace's lead warps): (a) **passes**: the figure fa4trace.analysis.passes
takes from the lightest pass of the bundle; (b) **compensated**: the dense trace's spans and lags
less the recorder's own cost (fa4trace.analysis.compensate, calibrated in the same run with the
known-answer kernels, fa4trace.probes.known_answer.calibrate), every other figure as recorded,
which is what ``fa4trace summary --compensate`` shows; (c) **raw** dense. The noise of each figure
is the reference build's second set of launches against its first: a figure noisier than 2% is
"noise-limited" and not judged; a duration under 50 ns, where one 1 ns tick of a bundle's times is
more than 2%, is "resolution-limited" and not judged either. Per figure the median over rounds;
per kernel the share of judged figures within 2% (target: 80%, for (a) or (b)).

**Perturbation line** (the three kernels above, and ``fa4-bwd``: FA4's SM90 backward b2 s2048 h16
d128 causal, ``rmsnorm``: quack's RMSNorm 16384 x 4096, both driven through their torch APIs
under ``fa4trace.instrument()``). The recording configurations (``CONFIGS``), each checked so
that fa4trace times its plain twin, every warp recording:

* "default": ``instrument()``'s defaults, the first 256 CTAs and 4096 records a warp (every CTA
  of quack's GEMM and our decode, which launch 132; quack's GEMM then drops records);
* "fidelity sample": the fidelity recordings' dense launch (FA4 64 of 2048 CTAs, quack's GEMM 16
  of 132, our decode every CTA; nothing dropped);
* "every CTA": every CTA with a capacity that drops nothing, where the default leaves CTAs out.

Per configuration the bundle's headline (fa4trace.analysis.fidelity, what ``fa4trace summary``
prints: the plain twin where it was timed on the device, else the in-launch figure where valid)
is set against the launch cost this script times on its own (fa4trace.run.timing.paired_costs:
CUDA graphs against the plain build, interleaved rounds; plain against plain gives the timing's
noise floor). Like is compared with like: a plain-twin headline times the bundle's own recording,
so it is set against that recording's cost timed as the twin is (one input set, warm L2, as many
launches per graph as make 200 µs: back-to-back launches of one kernel can overlap each other's
tails, and FA4's prefill reads less per launch at 8 a graph than at one); an in-launch headline
is the stretch of each recorded CTA, so it is set against the cost of every CTA recording. The
cost table is timed with several input sets for a cold L2 where they fit. Target: within 2
points, on the median over rounds.

**Speed** (about 6 minutes on an H100/H200 host with 16 cores; ``--deadline-s`` keeps it under
8). The builds of the fidelity kernels (and the known-answer kernels of the calibration) compile
in parallel worker processes into AOT build folders (``build``), while this process compiles
and measures the torch-API kernels; a build whose worker fails is compiled here instead
(``--jit``: every build here, one after another). Host-side analysis runs in worker processes
beside the GPU work; workers run at a lower priority than this process. Rounds go round by
round, kernel by kernel; a round that would end past ``--deadline-s`` is skipped, and the result
files are rewritten after every step, so a run cut short leaves what it measured. Four result
files from ``--json P``: P (area "fidelity-error", figure by figure: docs/fidelity-error.md),
P_shown (area "fidelity-shown": the shares), P_line (area "perturbation-line") and P_cost (area
"fidelity": the costs), rendered by benchmarks/report.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Callable, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# One definition with the product (fa4trace summary's figures by pass): fa4trace.analysis.figures.
from fa4trace.analysis.figures import trace_metrics  # noqa: E402

TARGET = 0.02  # relative error a shown figure may have against the lightest trace's
SHARE_TARGET = 0.80  # share of judged figures within TARGET (item 5's target)
LINE_TARGET_PTS = 2.0  # the perturbation headline against the graph-timed cost, points
MIN_ROUNDS = 3  # rounds before a target counts as met on their median
TICK_NS = 1.0  # a bundle's times are whole ns: a duration of under TICK_NS / TARGET ns cannot show 2%
FIDELITY_KERNELS = ("fa4", "gemm", "decode")
API_KERNELS = ("fa4-bwd", "rmsnorm")
KERNELS = FIDELITY_KERNELS + API_KERNELS
NAMES = {"fa4": "FA4 SM90 prefill", "gemm": "quack GEMM", "decode": "our decode",
         "fa4-bwd": "FA4 backward (SM90)", "rmsnorm": "quack RMSNorm"}
# the passes each call replays (fa4trace.auto.run.PASSES less "tma": instants only, no figure of its own)
PASS_BUILDS = ("lifetimes", "pipeline", "mma", "barrier", "spans")
MODES = ("passes", "compensated", "raw")
LEAD = "dense, lead warps"  # the reference of last resort: the dense build, one warp per warpgroup
CALIBRATION_JOB = "calibration"
RECORDER = "segment_smem"  # the recorder of the builds measured here (fa4trace.analysis.compensate.recorder_of)
DEFAULTS = {"rounds": 3, "cost_rounds": 5, "replays": 10, "launches": 1}
QUICK = {"rounds": 1, "cost_rounds": 3, "replays": 5, "launches": 1}
DEADLINE_S = 420.0  # start no round that would end later than this (the run's budget is 8 minutes)
# recording configurations of the perturbation line: what records in each
CONFIGS = {"default": "instrument() default", "sample": "fidelity sample", "every CTA": "every CTA"}
SOURCES = {"in_launch": "in-launch", "plain_twin": "plain twin"}


def lead_warps(warps_per_cta: int) -> tuple:
    """One warp per warpgroup: 0, 4, 8, ... below ``warps_per_cta``."""
    return tuple(range(0, warps_per_cta, 4))


# ---- what a trace reports, shown three ways (CPU: tests/test_bench_fidelity.py) -------------------
def dense_roles(trace) -> dict:
    """warp -> role as the analysis decides it on the dense trace (fa4trace.analysis.roles)."""
    from fa4trace.analysis.roles import decide_roles

    return dict(decide_roles(trace)["by_warp"])


def rel_error(value, ref) -> float | None:
    """|value - ref| / |ref| (None where either is missing or ref is 0)."""
    if value is None or ref is None or not ref:
        return None
    return abs(value - ref) / abs(ref)


def only_warps(trace, warps) -> object:
    """The trace's rows of ``warps`` (warp index in the CTA) only, meta kept: a trace seen on the
    warps a lead-warps trace records, so both report on the same warps."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from fa4trace.trace.bundle import Trace

    keep = pc.is_in(trace.events["warp"], value_set=pa.array(sorted(int(w) for w in warps), trace.events["warp"].type))
    return Trace(trace.events.filter(keep), trace.meta)


def metrics_of(trace, roles: dict) -> dict:
    """``trace_metrics`` with ``roles`` (warp -> role, decided on the dense trace) of the warps the
    trace holds: a trace of fewer warps (the lead warps) names its warps as the dense one does."""
    import pyarrow.compute as pc

    present = set(pc.unique(trace.events["warp"]).to_pylist()) if trace.events.num_rows else set()
    return trace_metrics(trace, {w: r for w, r in roles.items() if w in present})


def compensated_metrics(trace, cal, raw: dict) -> tuple[dict, set]:
    """What ``fa4trace summary --compensate`` shows of ``trace`` (mode b): each span's median and
    each pipeline lag's median and p90 less the recorder's own cost (fa4trace.analysis.compensate
    with calibration ``cal``), every other figure of ``raw`` (shares of a lifetime, overlaps, the
    CTA lifetime) as recorded. Returns (figures, the keys that were compensated)."""
    from fa4trace.analysis import compensate as C

    s = C.summary(trace, cal)
    out, done = dict(raw), set()
    for name, d in s["spans"].items():
        key = f"span.{name}.median_ns"
        if key in out:
            out[key] = d["median_ns"]
            done.add(key)
    for pipe, d in s["lags"].items():
        for q in ("median_ns", "p90_ns"):
            key = f"lag.{pipe}.{q}"
            if key in out:
                out[key] = d[q]
                done.add(key)
    return out, done


def reference_order(refs: dict) -> list[str]:
    """The references lightest first: fewest events per recorded CTA (fa4trace.analysis.passes'
    measure of lightness, on each reference's first launch), ties in the order given; the
    lead-warps trace last (it records every family, on fewer warps: a figure is taken from it only
    where no full-warp trace lighter than dense reports it)."""
    from fa4trace.analysis.passes import events_per_cta

    names = [n for n in refs if n != LEAD]
    weight = {n: events_per_cta(refs[n][0]) for n in names}
    return sorted(names, key=lambda n: (weight[n], names.index(n))) + ([LEAD] if LEAD in refs else [])


def clock_of(trace) -> float | None:
    """The SM clock (GHz) of a one-launch bundle's launch, where its recorder measured it."""
    if trace is None or not trace.info.launches:
        return None
    ghz = trace.info.launches[0].clock_ghz_median
    return None if ghz is None else round(float(ghz), 4)


def round_rows(kernel: str, bundle, refs: dict, lead: tuple | None, cal=None, *, reference: str = "first",
               launches: int = 1) -> tuple[list[dict], dict]:
    """One round of one kernel, figure by figure: each figure shown three ways (``MODES``: from the
    lightest pass of ``bundle``, compensated with ``cal``, raw dense) against the lightest reference
    of ``refs`` ({name: [first recording, second recording]}, each of ``launches`` launches;
    ``LEAD``: the dense build on the ``lead`` warps) that reports it, with the reference's own noise
    (its second recording against its first). ``reference``: the reference's value is its first
    recording's ("first") or the mean of both ("mean": half the variance of one, so less of a
    round's error is the reference's own noise). Each row says both (``launches``, ``reference_of``).
    Returns (rows, what the round used: the references' weights, the passes' order, how many
    compensated figures were clamped at 0)."""
    from fa4trace.analysis.passes import DENSE, pass_traces, sourced_figures

    by_pass = pass_traces(bundle)
    dense = by_pass[DENSE]
    if cal is not None:
        from fa4trace.analysis.compensate import recorder_of

        if recorder_of(dense.meta) not in (None, cal.recorder):  # another recorder's costs would be wrong here
            cal = None
    roles = dense_roles(dense)  # as sourced_figures decides them: on the dense pass
    sourced = sourced_figures(bundle)
    figs = sourced["figures"]
    raw = {k: f["dense"] for k, f in figs.items() if f["dense"] is not None}
    comp, compensated = compensated_metrics(dense, cal, raw) if cal is not None else ({}, set())
    ref_m = {n: [metrics_of(t, roles) for t in ts] for n, ts in refs.items()}
    order = reference_order(refs)
    on_lead: dict = {}

    def lead_view(mode: str, source: str) -> dict:
        """The figures ``mode`` shows, of the shown trace's lead warps only (cached)."""
        key = (mode, source)
        if key not in on_lead:
            sub = only_warps(by_pass[source], lead)
            m = metrics_of(sub, roles)
            on_lead[key] = compensated_metrics(sub, cal, m)[0] if mode == "compensated" else m
        return on_lead[key]

    ref_comp: dict = {}

    def compensated_ref(name: str) -> dict:
        """The reference's own figures less the recorder's cost (cached): what a compensated
        figure is set against in ``compensated_vs_ref_err_pct``, since the lightest trace that
        reports a figure records too (read as ``reference`` says, as the reference itself)."""
        if name not in ref_comp:
            used = 1 if reference == "first" else len(refs[name])  # the recordings its value reads
            each = [compensated_metrics(t, cal, m)[0] for t, m in zip(refs[name][:used], ref_m[name][:used])]
            ref_comp[name] = {k: reference_value(k, each, reference) for k in each[0]}
        return ref_comp[name]

    rows = []
    for key in sorted(figs):
        ref = next((n for n in order if key in ref_m[n][0]), None)
        src = figs[key]["pass"]
        shown = {"passes": figs[key]["value"], "compensated": comp.get(key) if cal is not None else None,
                 "raw": raw.get(key)}
        if ref == LEAD and lead:
            shown = {"passes": lead_view("passes", src).get(key),
                     "compensated": lead_view("compensated", DENSE).get(key) if cal is not None else None,
                     "raw": lead_view("raw", DENSE).get(key)}
        ref_v = reference_value(key, ref_m[ref], reference) if ref else None
        first = ref_m[ref][0][key] if ref else None
        again = ref_m[ref][1].get(key) if ref and len(ref_m[ref]) > 1 else None
        row = {"kernel": kernel, "metric": key, "reference": ref, "reference_value": ref_v,
               "noise_pct": _pct(rel_error(again, first)), "passes_from": src,
               "launches": launches, "reference_of": reference,
               "compensated": key in compensated,
               # each launch's SM clock (clock64 against globaltimer): a whole figure set off by one
               # factor from its reference is a clock difference between launches, not tracing
               "passes_clock_ghz": clock_of(by_pass.get(src)), "dense_clock_ghz": clock_of(dense),
               "reference_clock_ghz": clock_of(refs[ref][0]) if ref else None}
        for mode in MODES:
            row[f"{mode}_value"] = shown[mode]
            row[f"{mode}_err_pct"] = _pct(rel_error(shown[mode], ref_v))
        # a diagnostic beside mode b: compensated against the reference compensated alike
        both = cal is not None and ref is not None and ref != LEAD and key in compensated
        row["compensated_vs_ref_err_pct"] = (_pct(rel_error(shown["compensated"], compensated_ref(ref).get(key)))
                                             if both else None)
        rows.append(row)
    info = {"references": {n: _round(_weight(refs[n][0]), 1) for n in order},
            "passes": [p["pass"] for p in sourced["passes"]]}
    if cal is not None:
        from fa4trace.analysis import compensate as C

        s = C.summary(dense, cal)
        info["clamped"], info["compensated"] = s["clamped"], s["compensated"]
    return rows, info


REFERENCE_OF = {"first": "its first recording", "mean": "the mean of its two recordings"}


def reference_value(key: str, each: list[dict], reference: str):
    """A reference's value of figure ``key`` from its recordings' figures ``each`` (first
    recording first): the first's, or with ``reference="mean"`` the mean of those that report it
    (the first's alone where the second does not)."""
    if reference not in REFERENCE_OF:
        raise ValueError(f"reference must be one of {', '.join(REFERENCE_OF)}, not {reference!r}")
    first = each[0].get(key)
    if reference == "first" or first is None:
        return first
    vals = [m[key] for m in each if m.get(key) is not None]
    return sum(vals) / len(vals)


def _weight(trace) -> float:
    from fa4trace.analysis.passes import events_per_cta

    return events_per_cta(trace)


def _pct(x):
    return None if x is None else 100.0 * x


def _round(x, nd: int = 4):
    return None if x is None else round(float(x), nd)


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def resolution_limited(metric: str, value) -> bool:
    """A duration (``*_ns``) so short that one tick of a bundle's clock (``TICK_NS``) is more
    than the target: 31 against 32 ns reads 3%, so the figure cannot be judged at 2% (like a
    noise-limited one), whatever its noise between two launches says."""
    return metric.endswith("_ns") and value is not None and (value <= 0 or TICK_NS / value > TARGET)


def judged(noise_pct, err_pct, metric: str = "", value=None) -> bool:
    """A figure is judged where its error is defined, its noise is at most the target and its
    resolution allows the target (``resolution_limited``: ``metric`` and the reference
    ``value``)."""
    return (err_pct is not None and noise_pct is not None and noise_pct <= 100 * TARGET
            and not resolution_limited(metric, value))


def aggregate_metrics(per_round: list[list[dict]]) -> list[dict]:
    """One row per (kernel, figure) over the rounds: the medians of the reference, its noise, each
    mode's value and error; ``noise_limited`` (median noise above the target: not judged),
    ``resolution_limited`` (a duration too short for the target: not judged), ``judged`` and, per
    mode, ``<mode>_within`` (median error within the target)."""
    groups: dict = {}
    for rows in per_round:
        for r in rows:
            groups.setdefault((r["kernel"], r["metric"]), []).append(r)
    out = []
    for (kernel, metric), rs in groups.items():
        refs = Counter(r["reference"] for r in rs if r["reference"])
        row = {"kernel": kernel, "metric": metric, "reference": refs.most_common(1)[0][0] if refs else None,
               "reference_value": _round(_median(r["reference_value"] for r in rs)),
               "noise_pct": _round(_median(r["noise_pct"] for r in rs), 2),
               "passes_from": Counter(r["passes_from"] for r in rs).most_common(1)[0][0],
               "compensated": any(r["compensated"] for r in rs), "rounds": len(rs),
               # how the rounds read it (rows of files before these keys: one launch, first recording)
               "launches": Counter(r.get("launches", 1) for r in rs).most_common(1)[0][0],
               "reference_of": Counter(r.get("reference_of", "first") for r in rs).most_common(1)[0][0],
               **{k: _round(_median(r.get(k) for r in rs), 4)
                  for k in ("passes_clock_ghz", "dense_clock_ghz", "reference_clock_ghz")},
               "compensated_vs_ref_err_pct": _round(_median(r.get("compensated_vs_ref_err_pct") for r in rs), 2)}
        for mode in MODES:
            row[f"{mode}_value"] = _round(_median(r[f"{mode}_value"] for r in rs))
            row[f"{mode}_err_pct"] = _round(_median(r[f"{mode}_err_pct"] for r in rs), 2)
        errs = [row[f"{m}_err_pct"] for m in MODES if row[f"{m}_err_pct"] is not None]
        row["noise_limited"] = row["noise_pct"] is not None and row["noise_pct"] > 100 * TARGET and bool(errs)
        row["resolution_limited"] = bool(errs) and resolution_limited(metric, row["reference_value"])
        row["judged"] = bool(errs) and judged(row["noise_pct"], errs[0], metric, row["reference_value"])
        for mode in MODES:
            e = row[f"{mode}_err_pct"]
            row[f"{mode}_within"] = None if e is None else e <= 100 * TARGET
        out.append(row)
    return sorted(out, key=lambda r: (KERNEL_ORDER.get(r["kernel"], 99), r["metric"]))


KERNEL_ORDER = {NAMES[k]: i for i, k in enumerate(KERNELS)}


def _share(rows: list[dict], mode: str) -> tuple[int, int]:
    """(judged figures within the target in ``mode``, judged figures)."""
    j = [r for r in rows if r["judged"]]
    return sum(1 for r in j if r.get(f"{mode}_within")), len(j)


def _round_shares(rows: list[dict], mode: str) -> float | None:
    """The share within the target in one round's rows (each judged on that round's noise and
    reference value)."""
    j = [r for r in rows if judged(r["noise_pct"], r[f"{mode}_err_pct"], r["metric"], r["reference_value"])]
    if not j:
        return None
    return 100.0 * sum(1 for r in j if r[f"{mode}_err_pct"] <= 100 * TARGET) / len(j)


def status(share: float | None, rounds: int) -> str:
    """"met" (the median share at or above the target over at least MIN_ROUNDS rounds), "missed",
    "unconfirmed (n rounds)" (at or above, on fewer rounds), or "not measured"."""
    if share is None:
        return "not measured"
    if share < 100 * SHARE_TARGET:
        return "missed"
    return "met" if rounds >= MIN_ROUNDS else f"unconfirmed ({rounds} round{'s' if rounds != 1 else ''})"


def reading_of(rows: list[dict]) -> str:
    """How a kernel's figures were read, in words, from its ``aggregate_metrics`` rows: launches
    per pass and per reference recording, and which value of the reference its errors are against."""
    n = Counter(r["launches"] for r in rows).most_common(1)[0][0] if rows else 1
    ref = Counter(r["reference_of"] for r in rows).most_common(1)[0][0] if rows else "first"
    return f"{n} launch{'es' if n > 1 else ''} per recording; reference: {REFERENCE_OF[ref]}"


def shown_summary(metrics: list[dict], per_round: dict) -> list[dict]:
    """One row per kernel: figures compared, noise-limited, judged, and per mode how many judged
    figures are within the target (on the medians over rounds), their share, its range over the
    rounds, and the target's status (met where (a) or (b) reaches it). ``per_round``: {kernel:
    [rows of each round]}."""
    out = []
    for kernel in sorted({r["kernel"] for r in metrics}, key=lambda k: KERNEL_ORDER.get(k, 99)):
        rows = [r for r in metrics if r["kernel"] == kernel]
        compared = [r for r in rows if any(r[f"{m}_err_pct"] is not None for m in MODES)]
        rounds = per_round.get(kernel, [])
        row = {"kernel": kernel, "rounds": len(rounds), "reading": reading_of(rows), "figures": len(rows),
               "compared": len(compared),
               "noise_limited": sum(1 for r in compared if r["noise_limited"]),
               "resolution_limited": sum(1 for r in compared if r.get("resolution_limited")),
               "judged": sum(1 for r in compared if r["judged"])}
        best = None
        for mode in MODES:
            within, n = _share(compared, mode)
            share = 100.0 * within / n if n else None
            rs = [s for s in (_round_shares(x, mode) for x in rounds) if s is not None]
            row[f"{mode}_within"] = within
            row[f"{mode}_share_pct"] = _round(share, 1)
            row[f"{mode}_rounds_pct"] = [_round(min(rs), 1), _round(max(rs), 1)] if rs else None
            row[f"{mode}_rounds_median_pct"] = _round(statistics.median(rs), 1) if rs else None
            row[f"{mode}_cell"] = ("-" if share is None else f"{within} of {n} ({share:.0f}%"
                                   + (f"; rounds {min(rs):.0f}..{max(rs):.0f}%, median {statistics.median(rs):.0f}%"
                                      if len(rs) > 1 else "") + ")")
            # met only where the pooled share and the median of the rounds' own shares both reach it
            held = share if share is None or not rs else min(share, statistics.median(rs))
            if mode != "raw" and held is not None and (best is None or held > best):
                best = held
        row["status"] = status(best, len(rounds))
        out.append(row)
    return out


# ---- the perturbation line against the graph-timed cost (CPU: tests/test_bench_fidelity.py) ------
def line_round(kernel: str, config: str, bundle, costs: dict, warm: dict | None = None) -> dict:
    """One round of one recording configuration: the one-launch ``bundle``'s perturbation headline
    (fa4trace.analysis.fidelity, what ``fa4trace summary`` prints) and the graph-timed cost it is
    set against (``costs``: {configuration: cost %} of this round, the benchmark's L2 state;
    ``warm``: the same with one input set, warm L2): the cost of every CTA recording for an
    in-launch headline (the stretch of each recorded CTA), the configuration's own for a
    plain-twin headline (the twin times the bundle's own recording), warm where the twin was
    timed warm. ``stretch_vs_every_pts``: the in-launch figure against every CTA's cost, where
    it was measured (how far a CTA's stretch is from a launch's cost: not the target)."""
    from fa4trace.analysis.fidelity import perturbation

    p = perturbation(bundle)
    src = p.get("headline_source")
    tw = p.get("plain_twin") or {}
    use_warm = warm is not None and src == "plain_twin" and tw.get("l2") == "warm"
    table = warm if use_warm else costs
    key = "every CTA" if src == "in_launch" else config
    like = key + (", warm L2" if use_warm and warm is not costs else "")
    head = p.get("headline")
    cost = table.get(key)
    every = costs.get("every CTA")
    stretch = 100 * p["rel"] - every if p.get("measured") and every is not None else None
    return {"kernel": kernel, "config": config, "recorded": _recorded_text(bundle),
            "headline_pct": _pct(head), "source": src, "status": p.get("status"),
            "in_launch_pct": _pct(p["rel"]) if p.get("measured") else None,
            "in_launch_noise_pct": _pct(p.get("noise")) if p.get("measured") else None,
            "valid": p.get("valid"), "unreliable": len(p.get("unreliable") or []),
            "twin_pct": _pct(tw.get("rel")), "twin_noise_pct": tw.get("noise_pct"), "twin_method": tw.get("method"),
            "dependencies": p.get("dependencies"), "caveats": list(p.get("caveats") or []),
            "dropped": bundle.meta.get("total_dropped"), "compared_with": like, "cost_pct": cost,
            "plain_vs_plain_pct": table.get("plain"), "stretch_vs_every_pts": stretch,
            "diff_pts": None if head is None or cost is None else 100 * head - cost}


def _recorded_text(bundle) -> str:
    """"n of N CTAs" of a one-launch bundle: CTAs that recorded against those timed."""
    import numpy as np

    life = (bundle.meta.get("cta_lifetimes") or {})
    rec = np.asarray(life.get("recorded") or [], bool)
    n = len(set(bundle.events["cta"].to_pylist())) if bundle.events.num_rows else 0
    return f"{int(rec.sum()) if rec.size else n} of {rec.size} CTAs" if rec.size else f"{n} CTAs"


def aggregate_lines(per_round: list[dict]) -> list[dict]:
    """One row per (kernel, configuration) over the rounds: medians of the headline, the cost it is
    set against and their difference; the headline's source (or how it varied), the cost's noise
    (half its range over the rounds, and plain against plain), and ``within`` (the median
    difference within LINE_TARGET_PTS)."""
    groups: dict = {}
    for r in per_round:
        groups.setdefault((r["kernel"], r["config"]), []).append(r)
    out = []
    for (kernel, config), rs in groups.items():
        srcs = Counter(r["source"] for r in rs)
        likes = Counter(r["compared_with"] for r in rs)
        costs = [r["cost_pct"] for r in rs if r["cost_pct"] is not None]
        diff = _median(r["diff_pts"] for r in rs)
        pp = [abs(r["plain_vs_plain_pct"]) for r in rs if r["plain_vs_plain_pct"] is not None]
        spread = (max(costs) - min(costs)) / 2 if len(costs) > 1 else None
        head, cost = _median(r["headline_pct"] for r in rs), _median(costs)
        src = SOURCES.get(rs[0]["source"], "-") if len(srcs) == 1 else "mixed"
        top = likes.most_common(1)[0][0]
        against = ("every CTA records" if top.startswith("every CTA") and len(rs) and rs[0]["source"] == "in_launch"
                   else "the same recording") + (", warm L2" if top.endswith("warm L2") else "")
        noise = "; ".join(x for x in (f"±{spread:.1f}" if spread is not None else "",
                                      f"plain vs plain {_median(pp):.1f}%" if pp else "") if x)
        out.append({
            "kernel": kernel, "config": config,
            "recorded": rs[0]["recorded"], "rounds": len(rs),
            "source": srcs.most_common(1)[0][0] if len(srcs) == 1 else
            "mixed: " + ", ".join(f"{s} {n}" for s, n in srcs.most_common()),
            "status": Counter(r["status"] for r in rs).most_common(1)[0][0],
            "headline_pct": _round(_median(r["headline_pct"] for r in rs), 2),
            "in_launch_pct": _round(_median(r["in_launch_pct"] for r in rs), 2),
            "in_launch_noise_pct": _round(_median(r["in_launch_noise_pct"] for r in rs), 2),
            "twin_pct": _round(_median(r["twin_pct"] for r in rs), 2),
            "twin_noise_pct": _round(_median(r["twin_noise_pct"] for r in rs), 2),
            "compared_with": "; ".join(likes), "cost_pct": _round(_median(costs), 2),
            "cost_spread_pts": _round(spread, 2), "plain_vs_plain_pct": _round(_median(pp), 2),
            "diff_pts": _round(diff, 2), "within": None if diff is None else abs(diff) <= LINE_TARGET_PTS,
            "stretch_vs_every_pts": _round(_median(r.get("stretch_vs_every_pts") for r in rs), 2),
            "recording_cell": f"{CONFIGS.get(config, config)}: {rs[0]['recorded']}",
            "headline_cell": "-" if head is None else f"{head:+.1f}% ({src})",
            "cost_cell": "-" if cost is None else f"{cost:+.1f}% ({against}{'; ' + noise if noise else ''})",
            "valid": rs[0]["valid"], "dependencies": rs[0]["dependencies"],
            "caveats": sorted({c for r in rs for c in r["caveats"]}), "dropped": max((r["dropped"] or 0) for r in rs)})
    return sorted(out, key=lambda r: (KERNEL_ORDER.get(r["kernel"], 99), list(CONFIGS).index(r["config"])
                                      if r["config"] in CONFIGS else 9))


def aggregate_costs(per_round: list[dict]) -> list[dict]:
    """One row per kernel over the rounds (each round: {"kernel", "shape", "plain_us", "costs":
    {configuration or "plain": cost %}, "l2", "build"}): the median of each configuration's cost,
    plain against plain (the timing's noise floor), and the spread of the every-CTA cost over the
    rounds. Keys as benchmarks/cost_targets.py reads them: cost_all_pct (every CTA records),
    cost_sample_pct (the fidelity sample)."""
    groups: dict = {}
    for r in per_round:
        groups.setdefault(r["kernel"], []).append(r)
    out = []
    for kernel, rs in groups.items():
        def med(name):
            return _round(_median(r["costs"].get(name) for r in rs), 2)

        alls = [r["costs"]["every CTA"] for r in rs if r["costs"].get("every CTA") is not None]
        out.append({"kernel": kernel, "shape": rs[0]["shape"], "build": rs[0]["build"],
                    "plain_us": _round(_median(r["plain_us"] for r in rs), 2),
                    "cost_default_pct": med("default"), "cost_sample_pct": med("sample"), "cost_all_pct": med("every CTA"),
                    "plain_vs_plain_pct": med("plain"),
                    "cost_all_spread_pts": _round((max(alls) - min(alls)) / 2, 2) if len(alls) > 1 else None,
                    "rounds": len(rs), "l2": rs[0]["l2"], "recorded": rs[0].get("recorded")})
    return sorted(out, key=lambda r: KERNEL_ORDER.get(r["kernel"], 99))


# ---- result files ------------------------------------------------------------------------------------
def result_paths(base: str) -> dict[str, Path]:
    """{area: path} of the four result files of ``--json base``."""
    p = Path(base)

    def twin(tag):
        return p.with_name(f"{p.stem}_{tag}{p.suffix or '.json'}")

    return {"fidelity-error": p, "fidelity-shown": twin("shown"), "perturbation-line": twin("line"),
            "fidelity": twin("cost")}


ENVELOPE_KEYS = ("area", "title", "date", "commit", "gpu", "command", "notes", "columns", "rows")
PARTIAL = " Partial: the run stopped before every kernel and round was measured."
SHOWN_TITLE = "Shown figures within 2% of the lightest trace, per kernel"
SHOWN_NOTES = ("Judged figures (noise at most 2%; durations of 50 ns and longer, where a 1 ns tick is at most "
               "2%) within 2% of the lightest trace that reports them, on the medians over rounds (each round's share beside). Target: 80%, (a) or (b), over at least 3 rounds, on the "
               "medians and on the median of the rounds' own shares. Figure by figure: docs/fidelity-error.md.")
LINE_NOTES = ("headline: what the bundle's perturbation line goes by (the plain twin where it was timed on the device, "
              "else the in-launch figure where valid). Set against this benchmark's own CUDA-graph timing: a plain-twin "
              "headline against the same recording timed as the twin is (one input set, warm L2, launches per graph "
              "sized to 200 µs), an in-launch headline (each recorded CTA's stretch) against every CTA recording. ±: "
              "half the range over rounds. Target: within 2 points, median over rounds.")
FORMAT = 2  # the result files' layout (``merge`` keeps rows of files of this layout only)
METRIC_COLUMNS = [["kernel", "kernel"], ["metric", "figure"], ["reference", "reference trace"],
                  ["reference_value", "reference"], ["noise_pct", "noise %"], ["judged", "judged"],
                  ["passes_from", "(a) from pass"], ["passes_err_pct", "(a) passes err %"],
                  ["compensated", "compensated"], ["compensated_err_pct", "(b) compensated err %"],
                  ["raw_err_pct", "(c) raw err %"],
                  ["compensated_vs_ref_err_pct", "(b) against the reference compensated too, err %"],
                  ["passes_clock_ghz", "pass GHz"],
                  ["reference_clock_ghz", "reference GHz"], ["rounds", "rounds"]]
SHOWN_COLUMNS = [["kernel", "kernel"], ["rounds", "rounds"], ["reading", "read over"], ["compared", "figures compared"],
                 ["noise_limited", "noise-limited (> 2%)"],
                 ["resolution_limited", "resolution-limited (< 50 ns)"], ["judged", "judged"],
                 ["passes_cell", "(a) passes: within 2%"], ["compensated_cell", "(b) compensated: within 2%"],
                 ["raw_cell", "(c) raw dense: within 2%"], ["status", "target >= 80%, (a) or (b)"]]
LINE_COLUMNS = [["kernel", "kernel"], ["recording_cell", "recording"], ["headline_cell", "headline"],
                ["cost_cell", "graph-timed cost (noise)"], ["diff_pts", "headline - cost (pts)"],
                ["within", "within 2 pts"], ["rounds", "rounds"]]
COST_COLUMNS = [["kernel", "kernel"], ["shape", "shape"], ["plain_us", "plain µs"],
                ["cost_default_pct", "cost %, instrument() default"], ["cost_sample_pct", "cost %, fidelity sample"],
                ["cost_all_pct", "cost %, every CTA records"], ["plain_vs_plain_pct", "plain vs plain %"],
                ["cost_all_spread_pts", "every-CTA spread (pts)"], ["l2", "L2"], ["rounds", "rounds"]]


def plan_notes(plan: dict | None) -> str:
    """What the notes of a run's files say of its plan beyond the defaults, naming the kernels it
    measured (a merged file keeps other kernels' rows from earlier runs; the shown table's "read
    over" column says each kernel's): launches per pass and reference, the reference's value,
    plain launches before each pass."""
    plan = plan or {}
    n = int(plan.get("launches", 1))
    out = (f" Each pass and each reference: {n} launches of the call per round, its figures read over them "
           "together (fa4trace.analysis.passes; instrument(pass_launches=...)), the noise too." if n > 1 else "")
    if plan.get("reference", "first") == "mean":
        out += (" A reference's value: the mean of its two recordings (run --reference mean); its noise still the "
                "second against the first.")
    pre = int(plan.get("pass_prelude", 0))
    out += (f" Each pass launch after {pre} plain launch{'es' if pre > 1 else ''} of the call and an L2 flush "
            "(run --pass-prelude), as each reference." if pre else "")
    if out and plan.get("kernels"):
        out = f" This run ({', '.join(NAMES.get(k, k) for k in plan['kernels'])}):" + out
    return out


def write_results(base: str, *, metric_rounds: dict, lines: list, costs: list, extra: dict | None = None,
                  gpu: str | None = None, command: str | None = None, complete: bool = True,
                  merge: bool = False) -> dict[str, Path]:
    """The four result files (module doc) from what was measured: ``metric_rounds`` {kernel:
    [round_rows of each round]}, ``lines`` (line_round rows), ``costs`` (cost rounds). ``merge``:
    keep the rows of kernels not measured here from files of this layout already at the paths."""
    from fa4trace.bench import results

    per_round = {k: [rows for rows in rs] for k, rs in metric_rounds.items()}
    metrics = aggregate_metrics([rows for rs in per_round.values() for rows in rs])
    shown = shown_summary(metrics, per_round)
    line_rows = aggregate_lines(lines)
    cost_rows = aggregate_costs(costs)
    extra = dict(extra or {}, bench_fidelity_format=FORMAT, complete=complete)
    part = "" if complete else PARTIAL
    planned = plan_notes(extra.get("plan"))
    docs = {
        "fidelity-error": (
            "Fidelity figure by figure: what fa4trace shows of a dense recording against the lightest trace", metrics,
            METRIC_COLUMNS,
            "Each figure of a dense recording (every family; FA4 also its softmax and rescale spans) of a sample of "
            "CTAs (spread over the grid; every CTA of our decode), each launch from a flushed L2, shown (a) from the "
            "lightest pass of the same call (instrument passes), (b) compensated for the recorder's cost (spans and lags; calibrated in the same run), (c) raw; each against the lightest other "
            "launch that reports it (fewest events per recorded CTA, checked against the plain build as instrument() does, "
            "so that it starts from the passes' GPU state; 'dense, lead warps': one warp per warpgroup, set "
            "against the shown trace's same warps). noise: that reference's second launch against its first; judged "
            "where the noise is at most 2% and, for a duration, one 1 ns tick of a bundle's times is at most 2% of "
            "it (50 ns and longer). Medians over rounds." + planned + part,
            {"rounds_detail": per_round}),
        "fidelity-shown": (SHOWN_TITLE, shown, SHOWN_COLUMNS, SHOWN_NOTES + planned + part, {}),
        "perturbation-line": (
            "The perturbation line against the graph-timed launch cost", line_rows, LINE_COLUMNS, LINE_NOTES + part, {}),
        "fidelity": (
            "Tracing cost by recording configuration, graph-timed", cost_rows, COST_COLUMNS,
            "CUDA-graph replay against the plain build, interleaved rounds, medians over rounds. The dense build "
            "(every family; FA4 prefill with its softmax and rescale spans); FA4 backward and RMSNorm: instrument()'s "
            "(every family). default: instrument()'s first 256 CTAs, 4096 records a warp; every CTA: every event "
            "kept. plain vs plain: the timing's noise floor." + part, {}),
    }
    paths = result_paths(base)
    for area, (title, rows, cols, notes, more) in docs.items():
        path = paths[area]
        cmd = command
        old = _previous(path, area) if merge and path.exists() else None
        if old is not None:
            rows, cmd = _merged(old, rows, command)
            if "rounds_detail" in more:  # the kept kernels' rounds too: `shown` rereads them
                kept = {k: v for k, v in (old.get("rounds_detail") or {}).items() if k not in per_round}
                more = {"rounds_detail": {**kept, **per_round}}
        results.write(path, results.envelope(area, title, rows, columns=cols, notes=notes, gpu=gpu, command=cmd,
                                             **extra, **more))
    return paths


def _previous(path: Path, area: str) -> dict | None:
    """The result file at ``path`` where it is of ``area`` and this layout (what ``--merge``
    keeps rows and rounds from), read once; else None."""
    try:
        old = json.loads(path.read_text())
    except ValueError:
        return None
    if not isinstance(old, dict) or old.get("area") != area or old.get("bench_fidelity_format") != FORMAT:
        return None
    return old


def _merged(old: dict, rows: list, command: str | None) -> tuple[list, str | None]:
    """``rows`` with the rows of the kernels they lack from ``old`` (``_previous``), each kept row
    naming the commit it was measured at (``commit``), and the command that made each."""
    mine = {r["kernel"] for r in rows}
    kept = [dict(r, commit=r.get("commit", old.get("commit")))
            for r in old.get("rows", []) if r.get("kernel") not in mine]
    if not kept:
        return rows, command
    from fa4trace.bench.results import command_line

    cmd = f"{old.get('command')}; {command or command_line()}"
    return sorted(kept + rows, key=lambda r: KERNEL_ORDER.get(r.get("kernel"), 99)), cmd


# ---- builds: compiled here (JIT) or by worker processes (AOT) ------------------------------------------
class Build(NamedTuple):
    """One traced build: the compiled function (buffer last), its vocabulary, what the compile found
    (with the runtime parameter names, ``params``) and the plain build where one was compiled."""

    fn: Any
    vocab: Any
    meta: dict
    plain: Any = None


def builds_of(kernel: str) -> tuple:
    """The builds a fidelity kernel needs: dense, then one per pass (named spans: FA4 only)."""
    if kernel not in FIDELITY_KERNELS:
        raise ValueError(f"{kernel!r} has no builds of its own; choose from {', '.join(FIDELITY_KERNELS)}")
    return ("dense",) + tuple(b for b in PASS_BUILDS if b != "spans" or kernel == "fa4")


def recipe(build: str) -> tuple[tuple, bool]:
    """(families, named spans) of a build: dense every family and the spans, a pass its own."""
    from fa4trace.auto.events import FAMILIES

    if build == "dense":
        return tuple(FAMILIES), True
    if build == "lifetimes":
        return (), False
    if build == "spans":
        return (), True
    if build in FAMILIES:
        return (build,), False
    raise ValueError(f"unknown build {build!r}")


def pass_build_name(families, spans) -> str:
    """The build a pass replays with (``Instrumented``'s recompile arguments): spans None is the
    recording's own named spans, {} none."""
    fams = tuple(families or ())
    if not fams:
        return "spans" if spans is None else "lifetimes"
    return fams[0]


def compile_build(kernel: str, build: str) -> Build:
    """One build compiled here (the CuTe DSL; no GPU needed): the dense one with its plain twin."""
    import auto_kernels as ak

    fams, spans = recipe(build)
    dense = build == "dense"
    if kernel == "fa4":
        c = ak.compile_fa4_prefill(causal=False, families=fams, spans=spans, check=dense)[0]
    elif kernel == "gemm":
        c = ak.compile_quack_gemm(check=dense, families=fams)
    elif kernel == "decode":
        c = ak.compile_decode(check=dense, families=fams)[0]
    else:
        raise ValueError(f"unknown kernel {kernel!r}; choose from {', '.join(FIDELITY_KERNELS)}")
    return Build(c.fn, c.vocab, dict(c.meta, params=c.params), c.plain)


def build_jobs(kernels) -> list[str]:
    """The worker jobs of a run, longest first: each dense build (with its plain twin), the
    known-answer kernels of the calibration, then the pass builds."""
    fid = [k for k in kernels if k in FIDELITY_KERNELS]
    dense = [f"{k}:dense" for k in sorted(fid, key=lambda k: ("fa4", "decode", "gemm").index(k))]
    rest = [f"{k}:{b}" for k in fid for b in builds_of(k)[1:]]
    return dense + ([CALIBRATION_JOB] if fid else []) + rest


def aot_build(job: str, out: str) -> Path:
    """Compile one job (``kernel:build``, or ``CALIBRATION_JOB``) here and write it as an AOT build
    folder at ``out`` (fa4trace.run.aot.build_library)."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from fa4trace.auto.build import entries
    from fa4trace.run.aot import build_library

    arch = os.environ["CUTE_DSL_ARCH"]
    if job == CALIBRATION_JOB:
        from fa4trace.kernels import aot_variants
        from fa4trace.kernels.known_answer_spec import UNTRACED

        ents = {name: (thunk(), entry) for name, thunk, entry in aot_variants(arch, only=("known_answer",))
                if entry.config.get("variant") in (RECORDER, UNTRACED)}
        return build_library(ents, out, arch=arch, overwrite=True)
    kernel, _, build = job.partition(":")
    b = compile_build(kernel, build)
    c = _Compiled(b.fn, b.meta["params"], b.vocab, {k: v for k, v in b.meta.items() if k != "params"}, b.plain)
    return build_library(entries(job_name(job), c, {"kernel": NAMES[kernel], "build": build}), out, arch=arch,
                         overwrite=True)


class _Compiled(NamedTuple):
    """What fa4trace.auto.build.entries reads of a compile."""

    fn: Any
    params: list
    vocab: Any
    meta: dict
    plain: Any


def job_name(job: str) -> str:
    """The AOT function name of a job: ``fa4:dense`` -> ``fa4_dense``."""
    return job.replace(":", "_").replace("-", "_")


def load_build(folder: Path, job: str) -> Build:
    """A job's build from its AOT folder (fa4trace.auto.build.load)."""
    from fa4trace.auto.build import load

    k = load(folder, job_name(job))
    return Build(k.fn, k.vocab, dict(k.meta), k.plain)


class BuildPool:
    """Worker processes that compile ``jobs`` (``build_jobs``) into AOT build folders under
    ``work``, ``workers`` at a time; ``result(job)`` waits for one and gives its folder, or None
    where the worker failed (the tail of its log is printed). ``command(job, out)``: the worker's
    command line (default: this script's ``build``)."""

    def __init__(self, jobs: list[str], work: Path, workers: int, env: dict | None = None, log=print,
                 command: Callable[[str, Path], list] | None = None):
        self.queue = list(jobs)
        self.work = Path(work)
        self.workers = max(1, int(workers))
        self.env = dict(os.environ, **(env or {}))
        self.log = log
        self.command = command or (lambda job, out: [sys.executable, os.path.abspath(__file__), "build", job,
                                                      "--out", str(out)])
        self.nice = command is None  # this script's workers yield the CPU to the GPU process
        self.running: dict[str, tuple] = {}  # job -> (process, folder, log file, start)
        self.done: dict[str, Path | None] = {}
        self.seconds: dict[str, float] = {}
        self._start()

    def _start(self) -> None:
        while self.queue and len(self.running) < self.workers:
            job = self.queue.pop(0)
            out = self.work / job_name(job)
            out.parent.mkdir(parents=True, exist_ok=True)
            logf = open(self.work / f"{job_name(job)}.log", "w")  # noqa: SIM115 (closed when the worker ends)
            argv = self.command(job, out)
            if self.nice and shutil.which("nice"):
                argv = ["nice", "-n", str(NICE), *argv]
            p = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=self.env)
            self.running[job] = (p, out, logf, time.monotonic())

    def poll(self) -> None:
        """Collect finished workers and start queued ones."""
        for job, (p, out, logf, t0) in list(self.running.items()):
            if p.poll() is None:
                continue
            logf.close()
            del self.running[job]
            self.seconds[job] = round(time.monotonic() - t0, 1)
            ok = p.returncode == 0 and (out / "manifest.json").is_file()
            self.done[job] = out if ok else None
            if not ok:
                tail = (self.work / f"{job_name(job)}.log").read_text(errors="replace").strip().splitlines()[-3:]
                self.log(f"build {job} failed (exit {p.returncode}) after {self.seconds[job]} s: " + " | ".join(tail))
        self._start()

    def result(self, job: str, timeout: float | None = None) -> Path | None:
        """The folder of ``job`` once its worker ended (None: it failed, or ``timeout`` passed)."""
        t0 = time.monotonic()
        while job not in self.done:
            if job not in self.running and job not in self.queue:
                raise KeyError(f"no build job {job!r}")
            self.poll()
            if job in self.done:
                break
            if timeout is not None and time.monotonic() - t0 > timeout:
                return None
            time.sleep(0.2)
        return self.done[job]

    def close(self) -> None:
        """Stop every worker still running (their builds are not needed any more)."""
        self.queue.clear()
        for job, (p, _out, logf, _t0) in list(self.running.items()):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
            logf.close()
        self.running.clear()


def default_workers() -> int:
    """Build workers: the cores less four (this process, which drives the GPU, and the analysis),
    at most one per 4 GiB of memory."""
    cores = os.cpu_count() or 2
    try:
        mem_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError, AttributeError):
        mem_gib = 16.0
    return max(1, min(cores - 4, int(mem_gib // 4)))


def default_analysis_workers() -> int:
    """Processes analysing rounds: a quarter of the cores, 1..4."""
    return max(1, min(4, (os.cpu_count() or 2) // 4))


NICE = 10  # workers run at this niceness: the process that drives the GPU keeps its core


def can_link() -> bool:
    """AOT builds link with a C++ compiler and tvm-ffi (fa4trace.run.aot)."""
    import importlib.util

    return shutil.which(os.environ.get("CXX", "g++")) is not None and importlib.util.find_spec("tvm_ffi") is not None


# ---- host analysis beside the GPU work --------------------------------------------------------------------
def analyse_round(task: dict) -> dict:
    """A worker's part of one round (``round_rows``; ``save``: the round's bundles kept there)."""
    t0 = time.time()
    if task.get("save"):
        d = Path(task["save"])
        d.mkdir(parents=True, exist_ok=True)
        stem = task["kernel"].replace(" ", "_")
        task["bundle"].save(d / f"{stem}_passes.parquet", overwrite=True)
        for name, ts in task["refs"].items():
            for i, t in enumerate(ts):
                t.save(d / f"{stem}_{name.replace(', ', '_').replace(' ', '_')}_{i}.parquet", overwrite=True)
    rows, info = round_rows(task["kernel"], task["bundle"], task["refs"], task["lead"], task.get("cal"),
                            reference=task.get("reference", "first"), launches=task.get("launches", 1))
    return {"kernel": task["kernel"], "round": task["round"], "rows": rows, "info": info,
            "seconds": round(time.time() - t0, 1)}


class Analysis:
    """``analyse_round`` in ``workers`` spawned processes (0: here, at once); ``on_done(result)``
    is called in the thread that calls ``collect`` or ``wait``."""

    def __init__(self, workers: int, on_done: Callable[[dict], None], log=print):
        self.on_done, self.log = on_done, log
        self.pending: list = []
        self.pool = None
        if workers > 0:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                            initializer=os.nice, initargs=(NICE,))

    def submit(self, task: dict) -> None:
        if self.pool is None:
            self._finish(task, lambda: analyse_round(task))
        else:
            self.pending.append((task, self.pool.submit(analyse_round, task)))

    def _finish(self, task: dict, get) -> None:
        try:
            self.on_done(get())
        except Exception as exc:  # noqa: BLE001 (one round's analysis must not stop the run)
            self.log(f"{task['kernel']} round {task['round']}: analysis failed: {type(exc).__name__}: {exc}")
            traceback.print_exc()

    def collect(self) -> None:
        """Hand over the rounds whose analysis has finished."""
        for item in [p for p in self.pending if p[1].done()]:
            self.pending.remove(item)
            self._finish(item[0], item[1].result)

    def wait(self) -> None:
        for task, fut in list(self.pending):
            self._finish(task, fut.result)
        self.pending.clear()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


# ---- the fidelity kernels (GPU) --------------------------------------------------------------------------
class Case(NamedTuple):
    """One fidelity kernel: its builds, arguments per input set (no buffer), the CTA sample."""

    key: str
    kernel: str
    shape: str
    grid: int
    n_sets: int
    per_graph: int
    args: Callable[[int], tuple]
    builds: dict  # build -> Build
    sample: tuple = (16, 8)  # (CTAs recording, stride)
    capacity: int = 1 << 13  # records per warp with every CTA recording (nothing may drop)
    record_capacity: int = 1 << 14  # ... in the fidelity recordings (nothing may drop: it would cut the figures)
    l2: str = ""


def fa4_case(builds: dict) -> Case:
    import torch

    import auto_kernels as ak
    from fa4trace.fa4.run import call_args

    p = ak.FA4_PREFILL
    params = builds["dense"].meta["params"][:-1]
    sets = []
    for _ in range(4):
        q, k, v = (torch.randn(p["b"], p["seqlen"], p["h"], p["d"], device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        sets.append((q, k, v, torch.empty_like(q)))
    scale = 1 / math.sqrt(p["d"])
    grid = p["b"] * p["h"] * math.ceil(p["seqlen"] / 128)
    return Case("fa4", NAMES["fa4"], f"b{p['b']} s{p['seqlen']} h{p['h']} d{p['d']}", grid, 4, 8,
                lambda i: tuple(call_args(params, q=sets[i][0], k=sets[i][1], v=sets[i][2], out=sets[i][3],
                                          softmax_scale=scale, trace=None)),
                builds, sample=(64, grid // 64), l2="cold: 4 input sets of 256 MB")


def gemm_case(builds: dict) -> Case:
    import torch

    import auto_kernels as ak

    m, n, k = ak.GEMM_SHAPES["square_8192"]
    sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda", dtype=torch.bfloat16),
             torch.empty(m, n, device="cuda", dtype=torch.bfloat16))]
    grid = torch.cuda.get_device_properties(0).multi_processor_count  # persistent: one CTA per SM
    return Case("gemm", NAMES["gemm"], f"{m}x{n}x{k}", grid, 1, 4, lambda i: sets[i], builds,
                sample=(16, grid // 16), capacity=1 << 15, record_capacity=1 << 15,
                l2="one input set of 384 MB (beyond L2)")


def decode_case(builds: dict) -> Case:
    import torch

    import auto_kernels as ak

    d = ak.DECODE
    plan, sets, ws = ak.decode_inputs(torch.cuda.get_device_properties(0).multi_processor_count)
    scale = 1 / math.sqrt(d["d"])
    return Case("decode", NAMES["decode"], f"d{d['d']} {d['hq']}:{d['hkv']} sk {d['sk']} b {d['b']}", plan.n_ctas,
                8, 64, lambda i: (*sets[i], *ws, *plan.kernel_args(scale), None), builds,
                # every CTA: its CTAs wait on each other, so no in-launch comparison needs untraced
                # ones, and a 16-CTA sample of a 132-CTA grid leaves most figures noise-limited
                sample=(plan.n_ctas, 1), l2="cold: 8 input sets of 64 MB of KV")


CASES = {"fa4": fa4_case, "gemm": gemm_case, "decode": decode_case}


def prebuilt(builds: dict) -> Callable:
    """``Instrumented``'s recompile for the passes: the pass builds already compiled (by workers or
    here) instead of a compile in the call. A cursor fallback has no build here: it fails, and
    fa4trace says so."""
    from fa4trace.format.errors import Fa4traceError

    def recompile(cursor, families=None, spans=None):
        if families is None:
            raise Fa4traceError(f"no build with the {cursor} cursor was prepared")
        name = pass_build_name(families, spans)
        if name not in builds:
            raise Fa4traceError(f"the {name} pass build was not prepared")
        return builds[name]

    return recompile


def with_prelude(builds: dict, plain, n: int) -> dict:
    """``builds`` whose launches each run ``plain`` ``n`` times on the same arguments, then flush
    L2, before the traced launch (``run --pass-prelude N``): a pass then starts from what a
    reference starts from (the output check's plain launches, then a flush) instead of right
    after the launch before it. Only for kernels that overwrite their outputs (the fidelity
    kernels): the plain launches write what the traced one writes again."""
    from fa4trace.run import l2

    buf = l2.scratch()

    def wrap(build: Build) -> Build:
        def fn(*args, **kwargs):
            pa, pkw = (args[:-1], kwargs) if "fa4trace_buf" not in kwargs else (
                args, {k: v for k, v in kwargs.items() if k != "fa4trace_buf"})
            for _ in range(n):
                plain(*pa, **pkw)
            l2.flush(buf)
            return build.fn(*args, **kwargs)

        return build._replace(fn=fn)

    return {name: wrap(b) for name, b in builds.items()}


def _instrumented(build: Build, options, *, plain=None, recompile=None):
    from fa4trace.auto.run import Instrumented

    return Instrumented(build.fn, build.vocab, dict(build.meta), plain=plain, options=options, recompile=recompile)


def record(case: Case, build: str, options, config: dict, launches: int = 1):
    """``launches`` launches of ``build`` on input set 0, as ``options`` say (the references:
    checked against the plain build, not timed): one bundle of them, whose figures are read
    over them together, as a pass replayed ``launches`` times is."""
    k = _instrumented(case.builds[build], options, plain=case.builds["dense"].plain)
    for _ in range(launches):
        k(*case.args(0))
    return k.trace(config=config)


def fidelity_round(case: Case, r: int, launches: int = 1, prelude: int = 0) -> tuple[dict, dict]:
    """One round of a fidelity kernel on the GPU: (the analysis task: the dense recording with its
    passes, each pass ``launches`` times (each launch after ``prelude`` plain ones and a flush:
    ``with_prelude``), and the references, each twice, each of ``launches`` launches;
    {configuration: one-launch bundle} for the line)."""
    from dataclasses import replace

    from fa4trace.analysis.passes import DENSE, pass_traces
    from fa4trace.auto.run import RecordOptions
    from fa4trace.format.options import Sampling

    n, stride = case.sample
    dense = case.builds["dense"]
    passes = tuple(b for b in PASS_BUILDS if b in case.builds)
    cfg = {"kernel": case.kernel, "shape": case.shape, "round": r}
    k = _instrumented(dense, RecordOptions(Sampling(ctas=n, cta_stride=stride, capacity=case.record_capacity),
                                           check=True, passes=passes, pass_launches=launches),
                     plain=dense.plain,
                     recompile=prebuilt(with_prelude(case.builds, dense.plain, prelude) if prelude else case.builds))
    k(*case.args(0))
    bundle = k.trace(config=dict(cfg, recording="dense with passes"))
    # the references are recorded as instrument() records by default: the plain build runs
    # (twice: the output check) right before each, then L2 is flushed (fa4trace.run.l2), so a
    # reference starts from the GPU state the dense launch and its passes start from. Launched
    # from an idle GPU instead, our decode's references ran at a 1-2% higher SM clock than the
    # passes, every round: a difference of clocks, not of recordings.
    ref_opts = RecordOptions(Sampling(ctas=n, cta_stride=stride, capacity=case.record_capacity), check=True,
                             twin=False, flush_l2=True)
    lw = lead_warps(dense.meta["warps_per_cta"])
    lead_opts = replace(ref_opts, sampling=replace(ref_opts.sampling, warps=lw))
    refs: dict = {b: [] for b in passes}
    refs[LEAD] = []
    for _ in range(2):  # first launches of every build, then the second ones
        for b in passes:
            refs[b].append(record(case, b, ref_opts, dict(cfg, build=b), launches))
        refs[LEAD].append(record(case, "dense", lead_opts, dict(cfg, build="dense", warps=list(lw)), launches))
    lines = {"sample": pass_traces(bundle)[DENSE]}
    for config, opts in line_options(case).items():
        kk = _instrumented(dense, opts, plain=dense.plain)
        kk(*case.args(0))
        lines[config] = kk.trace(config=dict(cfg, recording=config))
    return {"kernel": case.kernel, "round": r, "bundle": bundle, "refs": refs, "lead": lw, "launches": launches}, lines


def line_options(case: Case, timed: bool = False) -> dict:
    """The recordings of the line besides the fidelity sample (each checked, so its plain twin is
    timed): instrument()'s defaults, and every CTA with a capacity that drops nothing where the
    defaults leave CTAs out (a grid beyond UNKNOWN_GRID_CTAS). ``timed``: the every-CTA one always
    (an in-launch headline is set against its cost)."""
    from fa4trace.auto.run import RecordOptions
    from fa4trace.format.options import UNKNOWN_GRID_CTAS, Sampling

    out = {"default": RecordOptions(check=True)}
    if timed or case.grid > UNKNOWN_GRID_CTAS:
        out["every CTA"] = RecordOptions(Sampling(ctas=case.grid, capacity=case.capacity), check=True)
    return out


def timed_specs(case: Case) -> dict:
    """{configuration: buffer spec} timed against the plain build: each line recording's own."""
    from fa4trace.auto.run import RecordOptions
    from fa4trace.format.options import Sampling

    n, stride = case.sample
    w = case.builds["dense"].meta["warps_per_cta"]
    specs = {c: o.spec(w) for c, o in line_options(case, timed=True).items()}
    specs["sample"] = RecordOptions(Sampling(ctas=n, cta_stride=stride, capacity=case.record_capacity)).spec(w)
    return specs


def cost_round(case: Case, cost_rounds: int, replays: int) -> dict:
    """This round's graph-timed costs (fa4trace.run.timing.paired_costs) of each configuration, and
    of the plain build against itself (the noise floor)."""
    import torch

    from fa4trace.run.record import new_trace_tensor
    from fa4trace.run.timing import launches_for, paired_costs

    dense = case.builds["dense"]
    bufs = {c: new_trace_tensor(s) for c, s in timed_specs(case).items()}

    def plain(i):
        dense.plain(*case.args(i))

    traced = {"plain": plain}
    for c, b in bufs.items():
        traced[c] = lambda i, b=b: dense.fn(*case.args(i), b)
    res = paired_costs(plain, traced, case.n_sets, replays, case.per_graph, cost_rounds)
    # the line's cost: timed as instrument() times a plain twin (one input set, warm L2, as many
    # launches per graph as make TWIN_TARGET_US: launches_for, as twin_times sizes them), since
    # back-to-back launches of one kernel can overlap each other's tails, and a graph of several
    # reads less than one launch costs
    plain_us = statistics.median(p for p, _t, _c in res.values())
    per_graph = launches_for(plain_us)
    warm = paired_costs(plain, traced, 1, replays, per_graph, cost_rounds)
    del bufs
    torch.cuda.empty_cache()
    return {"kernel": case.kernel, "shape": case.shape, "build": "dense", "l2": case.l2,
            "plain_us": plain_us, "twin_launches_per_graph": per_graph,
            "costs": {name: c for name, (_p, _t, c) in res.items()},
            "costs_warm": {name: c for name, (_p, _t, c) in warm.items()}}


# ---- the torch-API kernels (GPU): FA4 backward, quack RMSNorm under fa4trace.instrument() ----------
class CallSpy:
    """While open, every call of ``cls`` (fa4trace.auto.run.Instrumented) leaves its instance and
    arguments in ``calls`` (the last call per instance): the benchmark times a kernel that a
    library launched, with the arguments the library gave it. Benchmark glue: fa4trace has no API
    that hands out a traced kernel's arguments."""

    def __init__(self, cls):
        self.cls = cls
        self.calls: dict[int, tuple] = {}
        self._orig = None

    def __enter__(self):
        self._orig = orig = self.cls.__call__
        spy = self

        def call(inst, *args, **kwargs):
            spy.calls[id(inst)] = (inst, args, kwargs)
            return orig(inst, *args, **kwargs)

        self.cls.__call__ = call
        return self

    def __exit__(self, *exc):
        self.cls.__call__ = self._orig
        return False

    def find(self, is_main: Callable[[str], bool]):
        """(instance, args, kwargs) of the one called kernel whose name ``is_main`` picks."""
        hits = [c for c in self.calls.values() if is_main(str(c[0].meta.get("kernel", "")))]
        if len(hits) != 1:
            names = sorted(str(c[0].meta.get("kernel")) for c in self.calls.values())
            raise RuntimeError(f"expected one main kernel among {names}, found {len(hits)}")
        return hits[0]


class ApiKernel(NamedTuple):
    kernel: str
    shape: str
    setup: Callable[[], Callable[[], None]]  # -> the torch call that launches the kernel
    is_main: Callable[[str], bool]  # picks the kernel measured among those the call launches


def fa4_bwd_setup():
    """FA4's SM90 backward b2 s2048 h16 d128 causal: the forward once, plain, outside the block; the
    call runs the backward (preprocess, main kernel, postprocess) of the same graph again."""
    import torch
    from flash_attn.cute.interface import flash_attn_func

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 2048, 16, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
               for _ in range(3))
    o = flash_attn_func(q, k, v, causal=True)
    o = o[0] if isinstance(o, tuple) else o
    do = torch.randn(o.shape, device="cuda", dtype=o.dtype, generator=g)

    def call():
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

    return call


def rmsnorm_setup():
    """quack's RMSNorm over 16384 rows of 4096 (bf16, float32 weight): 128 MB in, 128 MB out; at
    most 16384 CTAs, so every CTA is timed (the bundle's CTA-lifetime region) and its grid known."""
    import torch
    from quack.rmsnorm import rmsnorm

    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(4096, device="cuda", dtype=torch.float32)

    def call():
        rmsnorm(x, w)

    return call


API = {"fa4-bwd": ApiKernel(NAMES["fa4-bwd"], "b2 s2048 h16 d128 causal", fa4_bwd_setup,
                            lambda n: "Backward" in n and "Preprocess" not in n and "Postprocess" not in n),
       "rmsnorm": ApiKernel(NAMES["rmsnorm"], "16384 x 4096 bf16", rmsnorm_setup,
                            lambda n: "RMSNorm" in n and "Backward" not in n)}


def _bytes_of(args, kwargs) -> int:
    import torch

    return sum(a.numel() * a.element_size() for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor))


def api_rounds(key: str, rounds: int, cost_rounds: int, replays: int, log=print, save: str | None = None,
               deadline: Callable[[float], bool] = lambda s: False) -> tuple[list, list]:
    """The line rounds of a torch-API kernel: inside one ``fa4trace.instrument()`` block, per round
    the call with instrument()'s defaults, then again with every CTA recording (the main kernel's
    options swapped, its plain twin timed again), each a bundle of the main kernel; then its
    graph-timed costs with the arguments the library gave it. Returns (line rows, cost rounds)."""
    import torch

    import fa4trace
    from fa4trace.auto.run import Instrumented, RecordOptions, call_traced, on_current_stream
    from fa4trace.format.options import DEFAULT_CAPACITY, Sampling
    from fa4trace.run.record import new_trace_tensor
    from fa4trace.run.timing import launches_for, paired_costs

    api = API[key]
    call = api.setup()
    torch.cuda.synchronize()
    lines, costs = [], []
    t_round = 0.0
    with fa4trace.instrument() as _rec, CallSpy(Instrumented) as spy:
        for r in range(rounds):
            if r and deadline(t_round):
                log(f"{api.kernel}: round {r + 1} skipped (deadline)")
                break
            t0 = time.monotonic()
            main = spy.find(api.is_main)[0] if spy.calls else None
            if main is not None:
                main.twins.clear()  # each round times its own plain twin
            call()
            main, args, kwargs = spy.find(api.is_main)
            default = main.options
            cfg = {"kernel": api.kernel, "shape": api.shape, "round": r}
            bundles = {"default": main.trace(config=dict(cfg, recording="default"))}
            life = bundles["default"].meta.get("cta_lifetimes") or {}
            grid = int(max(life.get("cta") or [0])) + 1
            every = RecordOptions(Sampling(ctas=grid, capacity=DEFAULT_CAPACITY), check=True)
            main.options, main.twins = every, {}
            try:
                call()
                bundles["every CTA"] = main.trace(config=dict(cfg, recording="every CTA"))
            finally:
                main.options = default
            main, args, kwargs = spy.find(api.is_main)
            w = main.warps_per_cta
            bufs = {"default": new_trace_tensor(default.spec(w)), "every CTA": new_trace_tensor(every.spec(w))}

            def plain(_i, k=main, a=args, kw=kwargs):
                aa, kk = on_current_stream(a, kw)
                k.plain(*aa, **kk)

            traced = {"plain": plain}
            for c, b in bufs.items():
                def launch(_i, k=main, a=args, kw=kwargs, b=b):
                    aa, kk = on_current_stream(a, kw)
                    call_traced(k.fn, aa, kk, k.to_arg(b))
                traced[c] = launch
            tw = (bundles["default"].meta.get("instrument") or {}).get("plain_twin") or [{}]
            plain_ns = (tw[0] if isinstance(tw, list) else tw).get("plain_ns") or 100_000
            per_graph = max(4, min(64, math.ceil(3000 / max(plain_ns / 1e3, 1e-3))))
            try:
                res = paired_costs(plain, traced, 1, replays, per_graph, cost_rounds)
                # the line's cost, timed as the plain twin is (cost_round says why)
                twin_res = paired_costs(plain, traced, 1, replays, launches_for(plain_ns / 1e3), cost_rounds)
            except Exception as exc:  # noqa: BLE001 (the headlines stand without a cost beside them)
                log(f"{api.kernel}: the graph timing failed: {type(exc).__name__}: {exc}")
                res, twin_res = {}, {}
            del bufs
            mb = _bytes_of(args, kwargs) / 2**20
            l2_mb = torch.cuda.get_device_properties(0).L2_cache_size / 2**20
            cost = {"kernel": api.kernel, "shape": api.shape, "build": "every family", "plain_us":
                    _median(p for p, _t, _c in res.values()),
                    "costs": {name: c for name, (_p, _t, c) in res.items()},
                    "l2": f"one input set of {mb:.0f} MB ({'beyond' if mb > l2_mb else 'within'} the {l2_mb:.0f} MB L2)",
                    "recorded": {c: _recorded_text(b) for c, b in bundles.items()}}
            if res:
                costs.append(cost)
            for config, b in bundles.items():
                lines.append(line_round(api.kernel, config, b, cost["costs"],
                                        {name: c for name, (_p, _t, c) in twin_res.items()}))
                log(json.dumps({k: v for k, v in lines[-1].items() if k != "caveats"}))
            if save and r == 0:
                Path(save).mkdir(parents=True, exist_ok=True)
                for config, b in bundles.items():
                    b.save(Path(save) / f"{key}_{config.replace(' ', '_')}.parquet", overwrite=True)
            t_round = time.monotonic() - t0
            log(f"{api.kernel}: round {r + 1} in {t_round:.1f} s")
    return lines, costs


# ---- the run ----------------------------------------------------------------------------------------------
class Plan(NamedTuple):
    kernels: list
    rounds: int
    cost_rounds: int
    replays: int
    jobs: list
    files: dict
    deadline_s: float
    launches: int = 1  # launches of each pass and of each reference per round (RecordOptions.pass_launches)
    prelude: int = 0  # plain launches (then a flush) before each pass launch (with_prelude)
    reference: str = "first"  # a reference's value: its first recording's, or the mean of both (reference_value)


def plan_of(a) -> Plan:
    """What ``run`` will do with arguments ``a`` (``--dry-run`` prints it)."""
    kernels = [k for k in a.kernels.split(",") if k]
    q = QUICK if a.quick else DEFAULTS
    rounds = a.rounds if a.rounds is not None else q["rounds"]
    cost_rounds = a.cost_rounds if a.cost_rounds is not None else q["cost_rounds"]
    replays = a.replays if a.replays is not None else q["replays"]
    launches = a.launches if a.launches is not None else q["launches"]
    jobs = [] if a.jit else build_jobs(kernels)
    files = {k: str(v) for k, v in result_paths(a.json).items()} if a.json else {}
    return Plan(kernels, rounds, cost_rounds, replays, jobs, files, a.deadline_s, launches, a.pass_prelude,
                a.reference)


class Collected:
    """Everything measured so far, written to the result files after every step."""

    def __init__(self, base: str | None, merge: bool, log=print):
        self.base, self.merge, self.log = base, merge, log
        self.metric_rounds: dict = {}
        self.infos: dict = {}
        self.lines: list = []
        self.costs: list = []
        self.extra: dict = {"errors": {}, "build_seconds": {}}
        self.gpu = None

    def add_analysis(self, res: dict) -> None:
        self.metric_rounds.setdefault(res["kernel"], []).append(res["rows"])
        self.infos.setdefault(res["kernel"], []).append(dict(res["info"], round=res["round"], seconds=res["seconds"]))
        n = len(self.metric_rounds[res["kernel"]])
        s = shown_summary(aggregate_metrics(self.metric_rounds[res["kernel"]]), {res["kernel"]:
                                                                                 self.metric_rounds[res["kernel"]]})
        for row in s:
            self.log(f"{row['kernel']} ({n} round{'s' if n > 1 else ''}): passes {row['passes_cell']}, compensated "
                     f"{row['compensated_cell']}, raw {row['raw_cell']}; noise-limited {row['noise_limited']}, "
                     f"resolution-limited {row['resolution_limited']}")

    def write(self, complete: bool) -> None:
        if not self.base:
            return
        self.extra["analysis"] = self.infos
        write_results(self.base, metric_rounds=self.metric_rounds, lines=self.lines, costs=self.costs,
                      extra=self.extra, gpu=self.gpu, complete=complete, merge=self.merge)


def calibration(pool: BuildPool | None, log=print):
    """The recorder's calibration on this GPU (fa4trace.probes.known_answer.calibrate), from the
    workers' known-answer build, else compiled here; None (and why, logged) where it fails."""
    from fa4trace.analysis.compensate import Calibration
    from fa4trace.probes.known_answer import calibrate

    folder = pool.result(CALIBRATION_JOB) if pool is not None else None
    try:
        d = calibrate(RECORDER, build=str(folder) if folder else None, cache=False)
    except Exception as exc:  # noqa: BLE001 (without it the compensated mode is "not measured")
        log(f"calibration of {RECORDER} failed: {type(exc).__name__}: {exc}")
        return None
    cal = Calibration.from_dict(d)
    log(f"calibration {RECORDER}: offset {cal.ns(cal.offset_cycles)} ns, {cal.ns(cal.event_cycles)} ns per event")
    return cal


def case_builds(kernel: str, pool: BuildPool | None, log=print) -> dict:
    """{build: Build} of a fidelity kernel: the workers' AOT builds, each compiled here where its
    worker failed (or with no workers)."""
    out = {}
    for b in builds_of(kernel):
        job = f"{kernel}:{b}"
        folder = pool.result(job) if pool is not None else None
        if folder is not None:
            try:
                out[b] = load_build(folder, job)
                continue
            except Exception as exc:  # noqa: BLE001
                log(f"{job}: its AOT build did not load ({type(exc).__name__}: {exc}); compiling it here")
        t0 = time.time()
        out[b] = compile_build(kernel, b)
        log(f"{job}: compiled here in {time.time() - t0:.0f} s")
    return out


def run(plan: Plan, *, json_base: str | None, save: str | None, workers: int, analysis_workers: int,
        merge: bool, log=print) -> Collected:
    """Measure ``plan`` (module doc); the result files are rewritten after every step."""
    import tempfile

    import torch

    from fa4trace.auto.run import Instrumented  # noqa: F401  (fails early without fa4trace.auto's needs)
    from fa4trace.bench.results import gpu_name
    from fa4trace.run.loader import gpu_arch

    start = time.monotonic()
    arch = gpu_arch()
    if arch != "sm_90a":
        raise SystemExit(f"bench_fidelity measures SM90 kernels (FA4 SM90, quack SM90); this GPU is {arch}")
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    got = Collected(json_base, merge, log)
    got.gpu = gpu_name()
    got.extra.update(plan={"kernels": plan.kernels, "rounds": plan.rounds, "cost_rounds": plan.cost_rounds,
                           "replays": plan.replays, "launches": plan.launches,
                           "pass_prelude": plan.prelude, "reference": plan.reference}, arch=arch)
    log(f"{got.gpu}: {', '.join(plan.kernels)}; {plan.rounds} rounds")

    def over(estimate_s: float) -> bool:
        return time.monotonic() - start + estimate_s > plan.deadline_s

    pool = None
    work = Path(tempfile.mkdtemp(prefix="bench-fidelity-"))
    if plan.jobs:
        if can_link():
            pool = BuildPool(plan.jobs, work, workers, env={"CUTE_DSL_ARCH": arch, "CUDA_VISIBLE_DEVICES": ""}, log=log)
            log(f"building {len(plan.jobs)} jobs in {pool.workers} workers under {work}")
        else:
            log("no C++ compiler or tvm-ffi to link AOT builds: every build is compiled here, one after another")
    analysis = Analysis(analysis_workers, got.add_analysis, log)
    old_term = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    finished = False
    try:
        for key in (k for k in plan.kernels if k in API_KERNELS):
            t0 = time.monotonic()
            try:
                lines, costs = api_rounds(key, plan.rounds, plan.cost_rounds, plan.replays, log, save, over)
                got.lines += lines
                got.costs += costs
            except Exception as exc:  # noqa: BLE001 (one kernel's failure leaves the others' results)
                got.extra["errors"][NAMES[key]] = f"{type(exc).__name__}: {exc}"
                log(f"{NAMES[key]} failed: {type(exc).__name__}: {exc}")
                traceback.print_exc()
            log(f"{NAMES[key]}: done after {time.monotonic() - t0:.0f} s (run {time.monotonic() - start:.0f} s)")
            got.write(complete=False)
        fid = [k for k in plan.kernels if k in FIDELITY_KERNELS]
        cal = calibration(pool, log) if fid else None
        if cal is not None:
            got.extra["calibration"] = cal.to_dict()
        cases: dict = {}
        took: dict = {}
        for r in range(plan.rounds):
            for key in fid:
                if key in got.extra["errors"]:
                    continue
                if r and over(took.get(key, 0.0)):
                    log(f"{NAMES[key]}: round {r + 1} skipped (deadline)")
                    continue
                t0 = time.monotonic()
                try:
                    if key not in cases:
                        cases[key] = CASES[key](case_builds(key, pool, log))
                        log(f"{NAMES[key]}: builds ready at {time.monotonic() - start:.0f} s")
                    case = cases[key]
                    t1 = time.monotonic()
                    task, bundles = fidelity_round(case, r, plan.launches, plan.prelude)
                    task.update(cal=cal, save=save if save and r == 0 else None, reference=plan.reference)
                    analysis.submit(task)
                    try:
                        costs = cost_round(case, plan.cost_rounds, plan.replays)
                        costs["recorded"] = {c: _recorded_text(b) for c, b in bundles.items()}
                        got.costs.append(costs)
                    except Exception as exc:  # noqa: BLE001 (the headlines stand without a cost beside them)
                        log(f"{NAMES[key]}: the graph timing failed: {type(exc).__name__}: {exc}")
                        costs = {"costs": {}}
                    for config, b in bundles.items():
                        got.lines.append(line_round(case.kernel, config, b, costs["costs"], costs.get("costs_warm")))
                        log(json.dumps({k: v for k, v in got.lines[-1].items() if k != "caveats"}))
                    took[key] = time.monotonic() - t1
                except Exception as exc:  # noqa: BLE001
                    got.extra["errors"][NAMES[key]] = f"{type(exc).__name__}: {exc}"
                    log(f"{NAMES[key]} failed: {type(exc).__name__}: {exc}")
                    traceback.print_exc()
                log(f"{NAMES[key]}: round {r + 1} in {time.monotonic() - t0:.0f} s (run {time.monotonic() - start:.0f} s)")
                analysis.collect()
                got.write(complete=False)
        analysis.wait()
        if pool is not None:
            got.extra["build_seconds"] = dict(pool.seconds)
        got.write(complete=True)
        finished = True
        log(f"done in {time.monotonic() - start:.0f} s")
        return got
    finally:
        signal.signal(signal.SIGTERM, old_term)
        if not finished:  # stopped (a signal, an error): what the finished analyses hold is written
            try:
                analysis.collect()
                got.write(complete=False)
            except Exception as exc:  # noqa: BLE001
                log(f"writing the partial results failed: {type(exc).__name__}: {exc}")
        analysis.close()
        if pool is not None:
            pool.close()
        shutil.rmtree(work, ignore_errors=True)  # the build workers' folders: loaded, no longer needed


def compile_only(kernels, builds=None, log=print) -> dict:
    """Compile the builds of ``kernels`` here (no GPU needed) and say what each found."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    out = {}
    for k in kernels:
        out[k] = {}
        for b in builds_of(k):
            if builds and b not in builds:
                continue
            t0 = time.time()
            c = compile_build(k, b)
            out[k][b] = {key: c.meta.get(key) for key in ("families", "found", "spans", "split", "cta_lifetimes",
                                                          "warps_per_cta", "cursor")}
            log(f"{k}:{b} in {time.time() - t0:.0f} s: {json.dumps(out[k][b], sort_keys=True, default=str)}")
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="build, record and time on this GPU (module doc)")
    r.add_argument("--kernels", default=",".join(KERNELS), help=f"comma list of {', '.join(KERNELS)}")
    r.add_argument("--quick", action="store_true", help=f"fewer repeats: {QUICK} (else {DEFAULTS})")
    r.add_argument("--rounds", type=int, default=None, help="rounds of the whole measurement (median reported)")
    r.add_argument("--cost-rounds", type=int, default=None, help="interleaved rounds of each graph timing")
    r.add_argument("--replays", type=int, default=None, help="graph replays per timing")
    r.add_argument("--launches", type=int, default=None,
                   help="launches of each pass and of each reference per round, read together")
    r.add_argument("--pass-prelude", type=int, default=0, metavar="N",
                   help="run the plain build N times, then flush L2, before each pass launch (as before each "
                        "reference); default 0: the passes as instrument() replays them")
    r.add_argument("--reference", choices=sorted(REFERENCE_OF), default="first",
                   help="a reference's value: its first recording's (default), or the mean of its two (the second "
                        "against the first is its noise either way)")
    r.add_argument("--json", default=None, metavar="P", help="result files P, P_shown, P_line, P_cost (rewritten "
                                                             "after every step)")
    r.add_argument("--merge", action="store_true", help="keep the rows of kernels not measured here from the files "
                                                        "already at those paths")
    r.add_argument("--save", default=None, metavar="DIR", help="keep the first round's bundles in DIR")
    r.add_argument("--jit", action="store_true", help="compile every build in this process (no build workers)")
    r.add_argument("--workers", type=int, default=None, help="build workers (default: cores - 4, 4 GiB each)")
    r.add_argument("--analysis-workers", type=int, default=None,
                   help="processes analysing rounds (0: in this one; default: cores / 4, 1..4)")
    r.add_argument("--deadline-s", type=float, default=DEADLINE_S, help="start no round past this many seconds")
    r.add_argument("--dry-run", action="store_true", help="print the plan and the files, measure nothing")
    c = sub.add_parser("compile", help="compile builds here (the CuTe DSL, no GPU)")
    c.add_argument("--kernels", default=",".join(FIDELITY_KERNELS), help=f"comma list of {', '.join(FIDELITY_KERNELS)}")
    c.add_argument("--builds", default=None, help="comma list of builds (default: every build of each kernel)")
    b = sub.add_parser("build", help="compile one job into an AOT build folder (what run's workers do)")
    b.add_argument("job", help=f"KERNEL:BUILD (e.g. gemm:lifetimes) or {CALIBRATION_JOB}")
    b.add_argument("--out", required=True, help="the build folder to write")
    sh = sub.add_parser("shown", help="write P_shown again from P's rounds (no GPU): after a change of the rule")
    sh.add_argument("file", metavar="P", help="a result file of `run --json P`")
    return ap


def rewrite_shown(base: str) -> Path:
    """P_shown again from the per-round figures kept in P (``rounds_detail``), under the current
    rule; P's date, commit, GPU and command kept. Raises ValueError for a file that is not P."""
    import json

    from fa4trace.bench import results

    try:
        doc = json.loads(Path(base).read_text())
    except ValueError:
        raise ValueError(f"{base}: not a JSON result file") from None
    if not isinstance(doc, dict) or doc.get("area") != "fidelity-error" or "rounds_detail" not in doc:
        raise ValueError(f"{base}: not a result file of `run --json` (area {doc.get('area')!r})")
    per_round = doc["rounds_detail"]
    metrics = aggregate_metrics([rows for rs in per_round.values() for rows in rs])
    path = result_paths(base)["fidelity-shown"]
    # the notes say the rule the rows were judged by: the current one; the run's own keys
    # (format, complete, errors, plan...) as write_results gives every file of a run
    notes = SHOWN_NOTES + plan_notes(doc.get("plan")) + ("" if doc.get("complete", True) else PARTIAL)
    if doc.get("rows_from"):  # a merged file's word on which run each kernel's rows came from
        notes += " " + doc["rows_from"]
    run_keys = {k: v for k, v in doc.items() if k not in ENVELOPE_KEYS + ("rounds_detail",)}
    env = results.envelope("fidelity-shown", SHOWN_TITLE, shown_summary(metrics, per_round), columns=SHOWN_COLUMNS,
                           gpu=doc.get("gpu"), command=doc.get("command"), notes=notes, **run_keys)
    env.update(date=doc.get("date"), commit=doc.get("commit"))
    results.write(path, env)
    return path


def main(argv=None) -> None:
    ap = parser()
    a = ap.parse_args(argv)
    if a.cmd == "shown":
        try:
            print(f"wrote {rewrite_shown(a.file)}")
        except (OSError, ValueError) as exc:
            ap.error(str(exc))
        return
    if a.cmd == "build":
        if a.job != CALIBRATION_JOB:
            kernel, _, build = a.job.partition(":")
            if kernel not in FIDELITY_KERNELS or build not in builds_of(kernel):
                ap.error(f"unknown job {a.job!r}: KERNEL:BUILD with KERNEL one of {', '.join(FIDELITY_KERNELS)}")
        t0 = time.time()
        out = aot_build(a.job, a.out)
        print(f"built {a.job} into {out} in {time.time() - t0:.0f} s")
        return
    choices = KERNELS if a.cmd == "run" else FIDELITY_KERNELS
    kernels = [k for k in a.kernels.split(",") if k]
    bad = [k for k in kernels if k not in choices]
    if bad or not kernels:
        ap.error(f"unknown kernel(s) {', '.join(bad) or '(none)'}; choose from {', '.join(choices)}")
    if a.cmd == "compile":
        builds = [b for b in (a.builds or "").split(",") if b] or None
        known = {"dense", *PASS_BUILDS}
        if builds and set(builds) - known:
            ap.error(f"unknown build(s) {', '.join(sorted(set(builds) - known))}; choose from {', '.join(sorted(known))}")
        compile_only(kernels, builds)
        return
    for name in ("rounds", "cost_rounds", "replays", "launches"):
        v = getattr(a, name)
        if v is not None and v < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.pass_prelude < 0:
        ap.error("--pass-prelude must be at least 0")
    plan = plan_of(a)
    if a.dry_run:
        print(json.dumps(plan._asdict(), indent=1))
        return
    workers = a.workers if a.workers is not None else default_workers()
    analysis = a.analysis_workers if a.analysis_workers is not None else default_analysis_workers()
    got = run(plan, json_base=a.json, save=a.save, workers=workers, analysis_workers=max(0, analysis), merge=a.merge)
    for row in shown_summary(aggregate_metrics([x for rs in got.metric_rounds.values() for x in rs]),
                             got.metric_rounds):
        print(f"{row['kernel']}: passes {row['passes_cell']}, compensated {row['compensated_cell']}, "
              f"raw {row['raw_cell']}; {row['status']}")
    for row in aggregate_lines(got.lines):
        print(f"{row['kernel']}, {row['config']}: headline {row['headline_pct']}% ({row['source']}) vs cost "
              f"{row['cost_pct']}% ({row['compared_with']}): {row['diff_pts']} pts")
    if a.json:
        print("wrote " + ", ".join(str(p) for p in result_paths(a.json).values()))


if __name__ == "__main__":
    main()
