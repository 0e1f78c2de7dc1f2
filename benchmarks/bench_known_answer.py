"""Known-answer kernels: a trace's spans, waits and lags, raw and compensated, against the truth.

    python benchmarks/bench_known_answer.py run --json benchmarks/results/known_answer_h200.json   # GPU, JIT
    python benchmarks/bench_known_answer.py compile        # any machine with the CuTe DSL: every variant compiles
    python benchmarks/bench_known_answer.py merge r1.json r2.json r3.json --json out.json   # runs made apart
    python benchmarks/bench_known_answer.py merge --refit r1.json r2.json r3.json --json out.json   # spans compensated again
    python benchmarks/bench_known_answer.py lengths --json benchmarks/results/known_answer_lengths_h100.json   # GPU

Needs a GPU with the CuTe DSL (nvidia-cutlass-dsl 4.8) for ``run``: the known-answer kernels
(kernels/known_answer.py) are compiled in process. For each recorder the product uses (Recorder
staged in lane registers or shared memory; SegmentRecorder with the gmem, smem and ring cursors)
and each of ``--runs`` rounds (each its own calibration, so the noise of the calibration is in
the spread):

* calibrate the recorder (``fa4trace.probes.known_answer.calibrate``: offset, held offset,
  cost per event, handoff lag and lag offset; measured on 2 µs spans with 0 to 31 events
  inside and on a light handoff);
* spans of ``SPAN_NS`` (100 ns to 50 µs at the measured clock) at each density of
  ``DENSITIES`` (density k: k sub-spins, k - 1 events inside), one CTA per SM, two warps each,
  ``--reps`` spans per warp;
* handoffs (``HANDOFFS``): a producer warp spins, then releases a consumer warp through an
  mbarrier; light, dense producer, dense consumer (events before its wait), both, and a
  consumer that reaches its wait after the fill (the lag is its own work); each at
  ``fa4trace.check.known_answer.HANDOFF_LENGTHS`` set lengths, pooled (``handoff_case``: where
  the two warps' records meet moves what they cost), each length's error kept.

``lengths``: the dense consumer's and both-dense waits of ``HANDOFFS`` at ``LENGTH_STEPS`` set
lengths, ``LENGTH_STEP`` cycles apart on the consumer's way (twice that on the producer's), one
length each (no pooling): what each recorder's compensated wait reads where the two warps'
records meet at each alignment (area "known-answer-lengths", on docs/known-answer.md).

Each figure (the mean over the launch's spans) is set raw and compensated
(``fa4trace.analysis.compensate``) beside the untraced twin's (``fa4trace.check.known_answer``:
the same spins, two %clock64 reads around each region). A row is one figure of one recorder:
the median over the runs of each run's mean, and the spread over runs (max - min) of the
compensated one and of the truth. The target: compensated within max(2%, 20 ns) of the truth
for figures of at least 200 ns (shorter ones are reported, not judged). Writes a result file of
area "known-answer" (benchmarks/report.py renders it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SPAN_NS = (100, 200, 500, 1000, 2000, 5000, 10_000, 20_000, 50_000)
DENSITIES = (1, 2, 4, 8, 16, 32)
QUICK_SPAN_NS = (200, 2000, 20_000)
QUICK_DENSITIES = (1, 4, 16)
# (case, producer ns, producer density, consumer ns, consumer density)
HANDOFFS = (
    ("light", 2000, 1, 0, 1),
    ("producer dense", 2000, 16, 0, 1),
    ("consumer dense", 2000, 1, 1000, 16),
    ("both dense", 2000, 16, 1000, 16),
    ("light", 20_000, 1, 0, 1),
    ("both dense", 20_000, 16, 10_000, 16),
    ("consumer late", 500, 1, 4000, 16),
)
KEYS = ("recorder", "figure", "case", "nominal_ns", "density", "cons_density")
LENGTH_STEPS, LENGTH_STEP = 16, 8  # ``lengths``: set lengths, cycles apart on the consumer's way
LENGTH_CASES = ("consumer dense", "both dense")
COLUMNS = [["recorder", "recorder"], ["figure", "figure"], ["case", "case"], ["nominal_ns", "set ns"],
           ["density", "events in (+1)"], ["truth_ns", "untraced ns"], ["raw_ns", "raw ns"],
           ["comp_ns", "compensated ns"], ["raw_err_pct", "raw error %"], ["comp_err_pct", "compensated error %"],
           ["comp_noise_ns", "spread ns (runs)"], ["length_err_range", "error ns by set length"],
           ["within_target", "<= max(2%, 20 ns)"]]


def _recorders():
    from fa4trace.kernels.known_answer_spec import RECORDERS

    return RECORDERS


# ---- what the runs measured, aggregated (CPU: tests/test_benchmarks_scripts.py) ------------------------
def aggregate(per_run: list[list[dict]]) -> list[dict]:
    """One row per figure (``KEYS``) over the runs: the median of the runs' means (truth, raw,
    compensated), their errors, the spread over runs (max - min) of the compensated figure and
    of the truth, and the verdict: within max(2%, 20 ns) where the truth is >= 200 ns."""
    import numpy as np

    from fa4trace.check.known_answer import MIN_TRUTH_NS, within_target

    groups: dict = {}
    for run in per_run:
        for r in run:
            groups.setdefault(tuple(r.get(k) for k in KEYS), []).append(r)
    rows = []
    for key, rs in groups.items():
        med = {f: float(np.median([r[f] for r in rs])) for f in ("truth_ns", "raw_ns", "comp_ns")}
        t = med["truth_ns"]
        judged = t >= MIN_TRUTH_NS
        rows.append({**dict(zip(KEYS, key)), **{k: round(v, 1) for k, v in med.items()},
                     "raw_err_pct": round(100 * (med["raw_ns"] - t) / t, 2) if t else None,
                     "comp_err_pct": round(100 * (med["comp_ns"] - t) / t, 2) if t else None,
                     "comp_err_ns": round(med["comp_ns"] - t, 1),
                     "comp_noise_ns": round(max(r["comp_ns"] for r in rs) - min(r["comp_ns"] for r in rs), 1),
                     "truth_noise_ns": round(max(r["truth_ns"] for r in rs) - min(r["truth_ns"] for r in rs), 1),
                     "within_target": within_target(med["comp_ns"], t) if judged else None,
                     "raw_within_target": within_target(med["raw_ns"], t) if judged else None,
                     "clamped": int(sum(r.get("clamped", 0) for r in rs)), "runs": len(rs),
                     **_length_range(rs)})
    return rows


def _length_range(rs: list[dict]) -> dict:
    """A handoff figure's compensated error at each of its set lengths, over every run: the
    lowest and highest ("lo..hi", ns; a merged row's from its runs' ranges); nothing for a span
    or a file written before lengths."""
    errs = [e for r in rs for e in (r.get("length_err_ns") or []) if e is not None]
    for r in rs:  # rows of one-run files (merge): their own range
        if r.get("length_err_range"):
            errs += [float(x) for x in r["length_err_range"].split("..")]
    return {"length_err_range": f"{min(errs):+.1f}..{max(errs):+.1f}"} if errs else {}


def summary(rows: list[dict]) -> dict:
    """Per recorder and figure: judged rows, how many within the target compensated and raw,
    the worst compensated error (% and ns), the runs each median came from and the largest
    spread over those runs of a judged figure (% of its truth): the noise beside the verdict."""
    out: dict = {}
    for r in rows:
        if r["within_target"] is None:
            continue
        s = out.setdefault(r["recorder"], {}).setdefault(r["figure"], {"judged": 0, "within": 0, "raw_within": 0,
                                                                        "worst_pct": 0.0, "worst_ns": 0.0,
                                                                        "runs": r.get("runs", 1), "spread_pct": 0.0})
        s["judged"] += 1
        s["within"] += bool(r["within_target"])
        s["raw_within"] += bool(r["raw_within_target"])
        s["runs"] = min(s["runs"], r.get("runs", 1))
        if r.get("comp_noise_ns") is not None and r["truth_ns"]:
            s["spread_pct"] = max(s["spread_pct"], round(100 * r["comp_noise_ns"] / r["truth_ns"], 2))
        if r["comp_err_pct"] is not None and abs(r["comp_err_pct"]) >= abs(s["worst_pct"]):
            s["worst_pct"], s["worst_ns"] = r["comp_err_pct"], r["comp_err_ns"]
    return out


SUMMARY_COLUMNS = [["recorder", "recorder"], ["figure", "figure"], ["judged", "judged (>= 200 ns)"],
                   ["within", "compensated within"], ["raw_within", "raw within"], ["worst_pct", "worst compensated %"],
                   ["worst_ns", "worst compensated ns"], ["spread_pct", "largest spread %"], ["status", "target"]]


def summary_path(path: str) -> str:
    """The summary file beside a result file: ``x.json`` -> ``x_summary.json``."""
    return path[:-5] + "_summary.json" if path.endswith(".json") else path + "_summary.json"


def write_summary(path: str, doc: dict, title_extra: str = "") -> str:
    """The per-recorder summary (area "known-answer-summary", BENCHMARKS.md) of the result file
    ``doc`` written to ``path``: one row per recorder and figure, "met" only where every judged
    figure is within the target; the run's date, commit, GPU and command kept."""
    from fa4trace.bench import results

    rows = [{"recorder": rec, "figure": fig, **s, "status": "met" if s["within"] == s["judged"] else "missed"}
            for rec, figs in summary(doc["rows"]).items() for fig, s in figs.items()]
    out = summary_path(path)
    env = results.envelope(
        "known-answer-summary", "Known-answer kernels: compensated figures within max(2%, 20 ns) of the truth"
        + title_extra,
        rows, columns=SUMMARY_COLUMNS, gpu=doc.get("gpu"), command=doc.get("command"),
        notes=("Per recorder and figure, of the figures of at least 200 ns: how many compensated (and raw) lie "
               "within max(2%, 20 ns) of the untraced twin's; every figure: docs/known-answer.md. Medians over the "
               "file's runs; largest spread: a judged figure's widest max - min over them, % of its truth."))
    env.update(date=doc.get("date", env["date"]), commit=doc.get("commit", env["commit"]))
    results.write(out, env)
    return out


def _lengths_note(rows: list[dict]) -> str:
    """What the notes say of the handoffs' set lengths, where the rows were measured at several."""
    from fa4trace.check.known_answer import HANDOFF_LENGTH_STEP, HANDOFF_LENGTHS

    if not any(r.get("length_err_range") for r in rows):
        return ""
    return (f" A handoff: pooled over {HANDOFF_LENGTHS} set lengths, the producer's {HANDOFF_LENGTH_STEP} cycles "
            "apart and the consumer's in proportion (error by set length: the lowest and highest of those "
            "lengths' own compensated errors, over the runs).")


def write_results(path: str, rows: list[dict], calibrations: list[dict], notes_extra: str = "",
                  gpu: str | None = None, date: str | None = None, title_extra: str = "") -> dict:
    """The result file (every figure) and its summary beside it (``date``: the runs' day, default
    today); returns what it wrote."""
    from fa4trace.bench import results

    doc = results.envelope(
        "known-answer", "Known-answer kernels: spans, waits and lags, raw and compensated, against the untraced twin"
        + title_extra,
        rows, columns=COLUMNS, gpu=gpu, summary=summary(rows), calibrations=calibrations,
        notes=("One CTA per SM, two warps each (one per SM sub-partition); each figure the mean over a "
               "launch's spans, then the median over runs of those means; spread: max - min over runs. "
               "untraced: the same spins timed by two %clock64 reads, less the gap between those two reads. "
               "events in: the density, the events inside a span being one fewer." + _lengths_note(rows) +
               " Target: compensated within "
               "max(2%, 20 ns) of untraced for figures >= 200 ns (shorter: not judged, '-')." + notes_extra))
    if date:
        doc["date"] = date
    results.write(path, doc)
    write_summary(path, doc, title_extra)
    return doc


# ---- the runs (GPU) ------------------------------------------------------------------------------------
def one_run(recorders, span_ns, densities, reps: int, log=print) -> tuple[list[dict], list[dict]]:
    """(figures, calibrations) of one run over every recorder (module doc)."""
    from fa4trace.analysis.compensate import Calibration
    from fa4trace.check.known_answer import handoff_case, span_case
    from fa4trace.probes.known_answer import calibrate

    rows, cals = [], []
    for rec in recorders:
        t0 = time.time()
        d = calibrate(rec, cache=False)
        cal = Calibration.from_dict(d)
        cals.append(cal.to_dict())
        ghz = cal.clock_ghz or 1.98
        for ns in span_ns:
            for k in densities:
                r = span_case(rec, cal, cycles=int(round(ns * ghz)), density=k, reps=reps)
                rows.append({**r, "case": "span", "nominal_ns": ns, "cons_density": None})
        for case, p_ns, p_k, c_ns, c_k in HANDOFFS:
            for r in handoff_case(rec, cal, cycles=int(round(p_ns * ghz)), density=p_k,
                                  cons_cycles=int(round(c_ns * ghz)), cons_density=c_k, reps=2 * reps):
                rows.append({**r, "case": case, "nominal_ns": p_ns, "density": p_k, "cons_density": c_k})
        log(f"{rec}: offset {cal.ns(cal.offset_cycles):.1f} ns, held {cal.ns(cal.held_offset_cycles):.1f} ns, "
            f"{cal.ns(cal.event_cycles):.1f} ns/event ({cal.ns(cal.fill_cycles):.1f} on the way to a fill, "
            f"{cal.ns(cal.wait_cycles):.1f} to a wait); "
            f"{len(span_ns) * len(densities)} span cases, "
            f"{len(HANDOFFS)} handoffs in {time.time() - t0:.0f} s")
    return rows, cals


def length_rows(recorders, reps: int, log=print) -> list[dict]:
    """``lengths`` (module doc): one row per recorder, case and set length, each length its own
    launch and twin (``handoff_case(lengths=1)``), each recorder calibrated first."""
    from fa4trace.analysis.compensate import Calibration
    from fa4trace.check.known_answer import handoff_case
    from fa4trace.probes.known_answer import calibrate

    rows = []
    for rec in recorders:
        cal = Calibration.from_dict(calibrate(rec, cache=False))
        ghz = cal.clock_ghz or 1.98
        for case, p_ns, p_k, c_ns, c_k in (h for h in HANDOFFS if h[0] in LENGTH_CASES and h[1] == 2000):
            for i in range(LENGTH_STEPS):
                d = i * LENGTH_STEP
                w = handoff_case(rec, cal, cycles=int(round(p_ns * ghz)) + 2 * d, density=p_k,
                                 cons_cycles=int(round(c_ns * ghz)) + d, cons_density=c_k, reps=2 * reps, lengths=1)[0]
                rows.append({"recorder": rec, "case": case, "added_cycles": d, "truth_ns": round(w["truth_ns"], 1),
                             "comp_ns": round(w["comp_ns"], 1), "comp_err_ns": round(w["comp_err_ns"], 1),
                             "within_target": bool(w["within"])})
        errs = [r["comp_err_ns"] for r in rows if r["recorder"] == rec]
        log(f"{rec}: compensated wait error {min(errs):+.1f}..{max(errs):+.1f} ns over {len(errs)} set lengths")
    return rows


def write_lengths(path: str, rows: list[dict], gpu: str | None = None) -> dict:
    """The ``lengths`` result file: a grid of the compensated wait's error, a line per recorder
    and case, a column per set length."""
    from fa4trace.bench import results

    doc = results.envelope(
        "known-answer-lengths", "A handoff's compensated wait by set length", rows, gpu=gpu,
        pivot={"rows": ["recorder", "case"], "columns": ["+{added_cycles}"], "value": "comp_err_ns"},
        notes=("The consumer-dense and both-dense waits of the benchmark (2 µs producer, 1 µs consumer, 16 "
               f"sub-spins each way that records), each at {LENGTH_STEPS} set lengths: the consumer's way "
               f"{LENGTH_STEP} cycles longer at each step (+N in the header, cycles), the producer's twice that; "
               "each cell the compensated wait less the untraced twin's (ns), one launch and its twin per length, "
               "each recorder calibrated first. Where the two warps' records meet moves what they cost: "
               "`run` pools each handoff over 8 lengths (fa4trace.check.known_answer.handoff_case)."))
    results.write(path, doc)
    return doc


def read_one_run_files(paths: list[str]) -> list[dict]:
    """The result files of ``run --runs 1 --json``, read and checked (one line each on error)."""
    docs = []
    for p in paths:
        try:
            doc = json.loads(open(p).read())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"{p}: not a readable result file ({exc})") from None
        if doc.get("area") != "known-answer":
            raise SystemExit(f"{p}: not a known-answer result file (area {doc.get('area')!r})")
        if any(r.get("runs", 1) != 1 for r in doc["rows"]):
            raise SystemExit(f"{p}: holds rows of more than one run (merge files of `run --runs 1`)")
        docs.append(doc)
    return docs


def merge_files(paths: list[str], out: str, refit: bool = False) -> dict:
    """Aggregate the runs of several result files (each written by ``run``) into one, as if one
    ``run`` had made them all: runs spread over separate invocations (a GPU lease that ends
    between them). Each file's rows are medians over its own runs, so a file of more than one
    run counts as one here: one-run files only. The merged file keeps every run's calibrations
    and names its parts' commands. ``refit``: each run's spans compensated again first
    (``refit_spans``)."""
    docs = read_one_run_files(paths)
    extra = ""
    if refit:
        fitted = [refit_spans(d) for d in docs]
        docs = [d for d, _ in fitted]
        extra = (" Spans compensated again offline (bench_known_answer.py merge --refit) with each run's "
                 "calibration refit by fit_event_cost on that run's own calibration spans (cost per event "
                 "and inner offset, the offset of a span with records inside); recomputing each run's own "
                 "compensation the same way lands within "
                 f"{max(x for _, x in fitted):.2f} ns of what the run computed. Waits and lags as measured.")
    gpus = {d.get("gpu") for d in docs}
    if len(gpus) != 1:
        raise SystemExit(f"the files were measured on different GPUs ({', '.join(sorted(map(str, gpus)))})")
    rows = aggregate([d["rows"] for d in docs])
    cals = [c for d in docs for c in d.get("calibrations", [])]
    notes = (f" Merged from {len(docs)} one-run files ({', '.join(sorted({d['commit'] for d in docs}))}; "
             f"{'; '.join(d['command'] for d in docs)}).{extra}")
    return write_results(out, rows, cals, notes_extra=notes, gpu=docs[0].get("gpu"), date=max(d["date"] for d in docs),
                         title_extra=" (spans compensated again offline: inner offset)" if refit else "")


def refit_spans(doc: dict) -> tuple[dict, float]:
    """A one-run result file whose span rows are compensated again as this checkout's calibration
    compensates them: each recorder's cost per event and inner offset refit
    (``fa4trace.probes.known_answer.fit_event_cost``) on that run's own calibration spans (the
    excess per density, kept in the file's calibrations). A span's compensation is its mean raw
    less (offset + records inside x cost per event) at the calibration's clock, so it can be
    redone from the means. Spans only: waits and lags depend on where each record lies, and stay
    as measured. Returns the new document and how far the run's own compensation, recomputed
    here with the calibration it used, lies from what the run computed (ns, the most over
    rows): what makes the recomputation trustworthy."""
    from fa4trace.analysis.compensate import Calibration
    from fa4trace.probes.known_answer import fit_event_cost

    runs = doc.get("calibrations") or []
    if len(runs) != 1:
        raise SystemExit("refit takes one-run result files (one calibration per recorder)")

    def cost_ns(cal: dict, k: int) -> float:  # a span with k records inside, as compensate costs it
        c = Calibration.from_dict(cal)
        return (float(c.span_offset_cycles(k > 0)) + k * c.event_cycles) / c.clock_ghz

    old, new_cals = {}, {}
    for c in runs[0]:
        n = [k - 1 for k in c["noise"]["densities"]]
        _offset, inner, event, res = fit_event_cost(n, c["noise"]["excess_cycles"])
        old[c["recorder"]] = c
        new_cals[c["recorder"]] = {**c, "event_cycles": event, "inner_offset_cycles": inner,
                                   "noise": {**c["noise"], "fit_residual_cycles": res}}
    rows, drift = [], 0.0
    for r in doc["rows"]:
        if r["figure"] != "span":
            rows.append(r)
            continue
        k = r["density"] - 1
        drift = max(drift, abs(r["raw_ns"] - cost_ns(old[r["recorder"]], k) - r["comp_ns"]))
        rows.append(aggregate([[{**r, "comp_ns": r["raw_ns"] - cost_ns(new_cals[r["recorder"]], k)}]])[0])
    new = {**doc, "rows": rows, "calibrations": [[new_cals[c["recorder"]] for c in runs[0]]]}
    return new, drift


def compile_only(tests=None, variants=None, log=print) -> dict:
    """Compile the known-answer variants here (no GPU: CUTE_DSL_ARCH, default sm_90a); what each
    holds: timer reads, record stores, spins."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from fa4trace.kernels.known_answer import compile_variant
    from fa4trace.kernels.known_answer_spec import TESTS, VARIANTS

    out = {}
    for t in tests or TESTS:
        for v in variants or VARIANTS:
            t0 = time.time()
            ptx = compile_variant(v, t, keep_ptx=True).__ptx__
            out[f"{t}_{v}"] = {"clock64": ptx.count("%clock64"), "globaltimer": ptx.count("%globaltimer"),
                               "record_stores": ptx.count("st.global.L2::cache_hint") + ptx.count("st.shared"),
                               "compile_s": round(time.time() - t0, 1)}
            log(f"{t}_{v}: {json.dumps(out[f'{t}_{v}'], sort_keys=True)}")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="calibrate, record and compare on this GPU")
    c = sub.add_parser("compile", help="compile the known-answer variants here (the CuTe DSL, no GPU)")
    sm = sub.add_parser("summarise", help="write a result file's summary beside it again (no GPU)")
    sm.add_argument("file", help="a result file of `run --json`")
    ln = sub.add_parser("lengths", help="the dense handoffs' compensated wait at each of several set lengths (GPU)")
    ln.add_argument("--recorders", default=None, help="comma list (default: every recorder)")
    ln.add_argument("--reps", type=int, default=8, help="rounds per launch: twice this")
    ln.add_argument("--json", default=None, help="result file")
    mg = sub.add_parser("merge", help="aggregate one-run result files into one (no GPU)")
    mg.add_argument("files", nargs="+", help="result files of `run --runs 1 --json`")
    mg.add_argument("--json", required=True, help="the merged result file (its summary beside it)")
    mg.add_argument("--refit", action="store_true",
                    help="compensate each run's spans again with this checkout's calibration fit (refit_spans)")
    r.add_argument("--runs", type=int, default=3, help="rounds, each with its own calibration (>= 3 for a spread)")
    r.add_argument("--reps", type=int, default=8, help="spans per warp per launch (handoffs: twice as many rounds)")
    r.add_argument("--recorders", default=None, help="comma list (default: every recorder)")
    r.add_argument("--quick", action="store_true", help=f"spans of {QUICK_SPAN_NS} ns at densities {QUICK_DENSITIES}")
    r.add_argument("--json", default=None, help="result file")
    c.add_argument("--tests", default=None, help="comma list of spans, handoff (default both)")
    c.add_argument("--variants", default=None, help="comma list (default every variant)")
    a = ap.parse_args(argv)
    if a.cmd == "summarise":
        try:
            doc = json.loads(open(a.file).read())
        except (OSError, ValueError) as exc:
            ap.error(f"{a.file}: not a readable result file ({exc})")
        if doc.get("area") != "known-answer":
            ap.error(f"{a.file}: not a known-answer result file (area {doc.get('area')!r})")
        print(f"wrote {write_summary(a.file, doc)}")
        return
    if a.cmd == "merge":
        merge_files(a.files, a.json, refit=a.refit)
        print(f"wrote {a.json}")
        return
    if a.cmd == "compile":
        compile_only(a.tests.split(",") if a.tests else None, a.variants.split(",") if a.variants else None)
        return
    recorders = a.recorders.split(",") if a.recorders else list(_recorders())
    bad = [x for x in recorders if x not in _recorders()]
    if bad or getattr(a, "runs", 1) < 1 or a.reps < 1:
        ap.error(f"unknown recorder(s) {', '.join(bad)}; choose from {', '.join(_recorders())}" if bad
                 else "--runs and --reps must be >= 1")
    if a.cmd == "lengths":
        rows = length_rows(recorders, a.reps)
        if a.json:
            write_lengths(a.json, rows)
            print(f"wrote {a.json}")
        return
    span_ns, densities = (QUICK_SPAN_NS, QUICK_DENSITIES) if a.quick else (SPAN_NS, DENSITIES)
    per_run, cals = [], []
    for i in range(a.runs):
        rows, c_run = one_run(recorders, span_ns, densities, a.reps)
        per_run.append(rows)
        cals.append(c_run)
        print(f"run {i + 1}/{a.runs} done")
    rows = aggregate(per_run)
    for rec, figs in summary(rows).items():
        for fig, s in figs.items():
            print(f"{rec} {fig}: {s['within']}/{s['judged']} within max(2%, 20 ns) compensated ({s['raw_within']} raw); "
                  f"worst {s['worst_pct']:+.2f}% ({s['worst_ns']:+.1f} ns)")
    if a.json:
        write_results(a.json, rows, cals)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
