"""Render BENCHMARKS.md (current results) and the docs pages of ``PAGES`` (docs/not-kept.md: what was
tried and not kept; docs/tracing-cost.md: the tracing-cost tables in detail; ...) from the result files
in benchmarks/results/.

    python benchmarks/report.py            # rewrite them
    python benchmarks/report.py --check    # exit 1 if one is not what the results render to

Result files: one JSON file per area (several files may share an area; they render in file-name
order under it). Schema:

    {
      "area":    "decode",                  # which section; see AREAS for the order and the renderer
      "title":   "Decode attention vs ...", # heading of the table
      "date":    "2026-11-29",              # when it was measured (ISO date or date-time)
      "commit":  "9cf8eff",                 # the commit whose code was measured (results transcribed from
                                            # the old journal: where known, else the commit that recorded them)
      "gpu":     "NVIDIA H200 (...)",       # device; "none: <CPU machine>" for host-only runs, or "not recorded"
      "command": "fa4trace bench ...",      # the command that produced it, or "not recorded"
      "notes":   "...",                     # optional: anything needed to read it (machine state, provenance)
      "columns": [["key", "header"], ...],  # optional, generic areas: which row keys to show, in order
      "pivot":   {"rows": [...], "columns": [...], "value": "k", "base": "k"},   # keys or "b {b}" formats
                                            # optional, instead of columns: one line per distinct
                                            # rows-key tuple, one column per columns-key tuple, the
                                            # value in the cells ("base": a first line with that key)
      "rows":    [ {...}, ... ]             # the measurements
    }

Rows of the area "decode" are `fa4trace bench` rows (`bench_json`): d, hq, hkv,
sk, b, sq, dtype, kernel ("base", "pingpong", "intrawg", "cudnn", "flash", "fa4", "<ours>+ref",
"<ours>+trace", "+tracelead", "+tracestalls", "<ours>@<variant>"), us, us_spread, tbps, rel_err, plus
extras (gpu_state: power_cap_share, thermal_share, sm_mhz_min, sm_mhz_max). A tracing overhead is
us(<s>+trace) / us(<s>+ref, else <s>) - 1. Rows transcribed from older tables may carry the
table's own numbers instead: overhead_pct on a traced row whose us is null, vs_base_pct and
vs_cudnn_x on the pingpong row, shape_max_rel_err on any row; the renderer prefers them.

Rows of "not-kept" are {"idea", "result", "commit"} and render as one line each, on their own page
(docs/not-kept.md), not in BENCHMARKS.md. Any other area renders as a table of its "columns"
(default: every key of the rows, in first-seen order); None renders as "-". A file without "area" is
an error. An area of a page in ``PAGES`` (a page may hold several) renders there, not in BENCHMARKS.md.

Which script writes which area (each takes ``--json benchmarks/results/<file>.json``; the
envelope comes from ``fa4trace.bench.results``): decode, decode-traced: ``fa4trace bench`` (its
bench.json; decode-traced with --trace-at all); markers: bench_recorder.py (with iket_workload.py
under run-iket); host: bench_export.py; viewer: bench_app.py; floors: stream_floor.py;
trace-cost: trace_cost.py; decode-recorder-parts: decode_recorder_parts.py; cost-targets:
cost_targets.py (from the other result files, no GPU); fa4-sm90:
fa4_sm90_device.py; auto-kernels, auto-sample: auto_kernels.py, bench_cta_sample.py; fidelity,
fidelity-error, fidelity-shown, perturbation-line: bench_fidelity.py; known-answer, known-answer-lengths: bench_known_answer.py (run, lengths); sweep-page, sweep-query (CPU), sweep-overhead, sweep-pool (GPU):
bench_sweep_page.py, bench_sweep_query.py, bench_sweep_overhead.py, bench_sweep_pool.py; static-footprint (CPU): ``fa4trace sass -o``; merge, merge-ranks (CPU): bench_merge.py (--ranks 8). benchmarks/device_run.sh runs the GPU ones in one go. The other areas hold
tables made from runs of these (their "command" says which).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "BENCHMARKS.md"
REQUIRED = ("area", "title", "date", "commit", "gpu", "command", "rows")

# Section order: (area, section heading). Areas not listed follow in name order; those of PAGES render on their page.
AREAS = [
    ("timers", "Recorder overhead and timer calibration"),
    ("markers", None),
    ("host", "Host pipeline on the CPU"),
    ("decode", "Decode attention"),
    ("cost-targets", "Tracing cost"),
    ("floors", "Bandwidth floors"),
    ("fa4-sm90", "FlashAttention-4 SM90, traced"),
    ("perturbation-line", "Faithful timelines: what a trace reports, and how much it slowed"),
    ("fidelity-shown", None),
    ("known-answer-summary", None),
]
# Pages under docs/ that hold areas instead of BENCHMARKS.md: file name -> (title, intro, [(area, section
# heading or None), ...]). The areas render in the list's order, each area's files in file-name order; the
# header line of BENCHMARKS.md links the pages in this order.
PAGES = {
    "tracing-cost.md": ("Tracing cost in detail",
                        "The tables behind the tracing-cost targets in [BENCHMARKS.md](../BENCHMARKS.md): where our "
                        "decode kernel's recorder spends, and `fa4trace.instrument` on kernels it was never fitted "
                        "to (by family, cursor and build; every CTA and a sample). Generated by "
                        "`python benchmarks/report.py` from the result files each table names "
                        "([`benchmarks/results/`](../benchmarks/results/)); what they mean: "
                        "[instrument.md](instrument.md), [fidelity.md](fidelity.md).",
                        [("decode-traced", "Our decode kernel traced at every shape"),
                         ("decode-recorder-parts", "Where our decode kernel's tracing cost goes"),
                         ("decode-recorder-parts-sass", "What each part of our decode kernel's recorder adds in SASS"),
                         ("trace-cost-parts", "Our decode kernel's recorder"), ("trace-cost", None),
                         ("auto-kernels", "Automatic events on any CuTe DSL kernel"), ("auto-sample", None),
                         ("fa4-cost-parts", "Where the cost goes in FA4's SM90 prefill"),
                         ("fa4-cost-parts-sass", "What each part adds in SASS"),
                         ("static-footprint", "What tracing adds per warp role in SASS (static, no GPU)"),
                         ("fidelity", "Tracing cost by recording configuration (the fidelity kernels)")]),
    "fidelity-error.md": ("Fidelity error",
                          "Figure by figure, what a trace with every family reports against the lightest trace of "
                          "the same launch that reports the same figure, with that figure's noise; each table's "
                          "notes say how its figures were shown and what the noise is. Generated by "
                          "`python benchmarks/report.py` from the result files of area \"fidelity-error\" in "
                          "[`benchmarks/results/`](../benchmarks/results/) (written by "
                          "`benchmarks/bench_fidelity.py run --json`); "
                          "per kernel, and the perturbation line: [BENCHMARKS.md](../BENCHMARKS.md) (\"Faithful "
                          "timelines\"); what it means: [fidelity.md](fidelity.md).",
                          [("fidelity-error", None)]),
    "known-answer.md": ("Known-answer kernels",
                        "Every figure of the known-answer kernels (kernels/known_answer.py: spins of a set length "
                        "between events, a producer that releases a consumer after a set delay), raw and "
                        "compensated, against the untraced twin's, per recorder. Generated by "
                        "`python benchmarks/report.py` from the result files of area \"known-answer\" in "
                        "[`benchmarks/results/`](../benchmarks/results/) (written by "
                        "`benchmarks/bench_known_answer.py run --json`, and of area \"known-answer-lengths\" by its "
                        "`lengths --json`: the dense handoffs at each of 16 set lengths); the summary: "
                        "[BENCHMARKS.md](../BENCHMARKS.md); what compensation does: [compensation.md](compensation.md).",
                        [("known-answer", None), ("known-answer-lengths", None)]),
    "instrument-program.md": ("instrument() in a PyTorch program",
                              "What `fa4trace.instrument()` costs the program it traces: block entry and exit "
                              "against the heap's size, compile time under the block, and a plain call after it "
                              "against before (host time and CUDA-graph replay, with a control process whose block "
                              "is empty). Generated by `python benchmarks/report.py` from the result files of area "
                              "\"instrument-program\" in [`benchmarks/results/`](../benchmarks/results/); "
                              "what the block does: [instrument.md](instrument.md).",
                              [("instrument-program", None)]),
    "sweep-speed.md": ("Sweep speed",
                       "Reading, querying and drawing a sweep dataset, and what a sweep costs per point. Generated "
                       "by `python benchmarks/report.py` from the result files of the sweep areas in "
                       "[`benchmarks/results/`](../benchmarks/results/); sweeps: [sweeps.md](sweeps.md).",
                       [("sweep-page", None), ("sweep-query", None), ("sweep-overhead", None), ("sweep-pool", None)]),
    "make-test-time.md": ("make test time",
                          "How long the README's test command takes from a clean clone. Generated by "
                          "`python benchmarks/report.py` from "
                          "[`benchmarks/results/make_test_cpu.json`](../benchmarks/results/make_test_cpu.json); "
                          "what it installs and caches: [install.md](install.md).",
                          [("make-test", None)]),
    "viewer-speed.md": ("Viewer speed",
                        "How fast the Streamlit viewer (`make app`, `fa4trace view`) opens and redraws, on a 2-core "
                        "machine. Generated by `python benchmarks/report.py` from "
                        "[`benchmarks/results/viewer_cpu.json`](../benchmarks/results/viewer_cpu.json).",
                        [("viewer", None)]),
    "profiler-merge-speed.md": ("Merge speed",
                                "A 200 MB torch.profiler trace and 10 bundles of 1 M records each, merged on a 2-core "
                                "machine; and 8 ranks of them (`fa4trace merge --ranks`). Generated by "
                                "`python benchmarks/report.py` from "
                                "[`benchmarks/results/merge_cpu.json`](../benchmarks/results/merge_cpu.json) and "
                                "[`benchmarks/results/merge_ranks_cpu.json`](../benchmarks/results/merge_ranks_cpu.json); "
                                "the merge: [profiler.md](profiler.md).",
                                [("merge", None), ("merge-ranks", "Several ranks")]),
    "pdl.md": ("Programmatic dependent launch",
               "Our decode kernel launched back to back with programmatic dependent launch "
               "(`decode_attention(pdl=True)`, opt-in) against plain launches. Generated by "
               "`python benchmarks/report.py` from "
               "[`benchmarks/results/pdl_h200.json`](../benchmarks/results/pdl_h200.json); what it is: "
               "[decode-attention.md](decode-attention.md).",
               [("pdl", None)]),
    "not-kept.md": ("Tried and not kept",
                    "Ideas measured on the way to the current kernels, recorder and automatic events, and "
                    "dropped. Generated by `python benchmarks/report.py` from "
                    "[`benchmarks/results/not_kept.json`](../benchmarks/results/not_kept.json); the current "
                    "results are in [BENCHMARKS.md](../BENCHMARKS.md).",
                    [("not-kept", None)]),
    "profiler-alignment.md": ("Profiler alignment",
                              "Each traced launch's warps against its kernel slice in the same torch.profiler trace. "
                              "Generated by `python benchmarks/report.py` from "
                              "[`benchmarks/results/profiler_alignment_h200.json`](../benchmarks/results/profiler_alignment_h200.json); "
                              "how the clocks are aligned: [profiler.md](profiler.md).",
                              [("profiler", None)]),
}
# area -> the page that holds it
PAGE_OF = {area: page for page, (_, _, areas) in PAGES.items() for area, _ in areas}
DOCS = ROOT / "docs"

def load_results(folder: Path = RESULTS) -> list[dict]:
    """Every result file of ``folder``, checked against the schema (ValueError names the file)."""
    out = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        if "area" not in data:
            raise ValueError(f"{path.name}: no 'area' (see benchmarks/report.py's docstring)")
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise ValueError(f"{path.name}: missing {', '.join(missing)}")
        if not isinstance(data["rows"], list):
            raise ValueError(f"{path.name}: 'rows' must be a list")
        data["_file"] = path.name
        out.append(data)
    return out


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return repr(v)
    return str(v).replace("|", "\\|")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + \
        ["| " + " | ".join(r) + " |" for r in rows]


def _meta(res: dict, gpu: str = "") -> list[str]:
    where = "GPU as above" if gpu and res["gpu"] == gpu else res["gpu"]
    lines = [f"### {res['title']}", "",
             f"{res['date']} · commit `{res['commit']}` · {where} · `{res['_file']}` · `{res['command']}`", ""]
    if res.get("notes"):
        lines += [res["notes"], ""]
    return lines


def _ok(r) -> bool:
    return r is not None and r.get("us") is not None and r["us"] == r["us"]


def _shape_key(r: dict) -> tuple:
    return (r["d"], r["hq"], r["hkv"], r["sk"], r["b"], r["sq"], r.get("dtype", "bf16"))


def _shape_name(key) -> str:
    d, hq, hkv, sk, b, sq = key[:6]
    return f"d{d} {hq}:{hkv} sk {sk} b {b}" + (f" sq {sq}" if sq != 1 else "")


def _decode_groups(rows: list[dict]):
    by_shape: dict = {}
    kernels: list[str] = []
    for r in rows:
        by_shape.setdefault(_shape_key(r), {})[r["kernel"]] = r
        if r["kernel"] not in kernels and "+" not in r["kernel"].partition("@")[0]:
            kernels.append(r["kernel"])
    return by_shape, kernels


def _overhead(ks: dict, sched: str, suffix: str):
    """A traced variant's overhead against its "+ref" twin (else the plain kernel); ``sched`` may
    carry an @option ("pingpong@s8": the kernels "pingpong+trace@s8", "pingpong+ref@s8")."""
    name, at, opt = sched.partition("@")
    b = ks.get(name + suffix + at + opt)
    if b is None:
        return None
    if not _ok(b):
        return b.get("overhead_pct")
    ref = ks.get(name + "+ref" + at + opt)
    a = ref if _ok(ref) else ks.get(sched)
    return 100 * (b["us"] / a["us"] - 1) if _ok(a) else None


def render_decode(res: dict) -> list[str]:
    """`fa4trace bench` rows: one line per shape, µs per kernel (and the ping-pong's TB/s), the ping-pong against
    base and cuDNN, and the power cap; then the tracing overhead at the shapes that have it."""
    by_shape, kernels = _decode_groups(res["rows"])
    with_base, with_cudnn = "base" in kernels, "cudnn" in kernels
    head = ["shape"] + [f"{k} µs (TB/s)" if k == "pingpong" else f"{k} µs" for k in kernels] + \
        (["pp vs base"] if with_base else []) + (["pp vs cuDNN"] if with_cudnn else []) + ["power cap / min SM MHz"]
    body, errs = [], []
    for key, ks in by_shape.items():
        cells = [_shape_name(key)]
        for k in kernels:
            r = ks.get(k)
            cells.append(("-" if not _ok(r) else f"{r['us']:.1f} ({r['tbps']:.2f})" if k == "pingpong"
                          else f"{r['us']:.1f}"))
        pp, base, cud = ks.get("pingpong"), ks.get("base"), ks.get("cudnn")
        if with_base:
            if pp is not None and pp.get("vs_base_pct") is not None:
                cells.append(f"{pp['vs_base_pct']:+.1f}%")
            else:
                cells.append(f"{100 * (base['us'] / pp['us'] - 1):+.1f}%" if _ok(pp) and _ok(base) else "-")
        if with_cudnn:
            if pp is not None and pp.get("vs_cudnn_x") is not None:
                cells.append(f"{pp['vs_cudnn_x']:.2f}x")
            else:
                cells.append(f"{cud['us'] / pp['us']:.2f}x" if _ok(pp) and _ok(cud) else "-")
        st = next((r["gpu_state"] for r in ks.values() if r.get("gpu_state")), None)
        cells.append("-" if st is None or st["power_cap_share"] < 0.1 else
                     f"{100 * st['power_cap_share']:.0f}% / {st['sm_mhz_min']}")
        body.append(cells)
        for r in ks.values():
            for e in (r.get("rel_err"), r.get("shape_max_rel_err")):
                if e is not None and e == e:
                    errs.append(e)
    lines = _table(head, body)
    if errs:
        lines += ["", f"Max relative error vs float32: {max(errs):.1e}. Power cap: share of nvidia-smi samples "
                  "capped (from 10%) / lowest SM MHz."]
    ours = []  # our schedules (with their @options) that have a traced timing, in table order
    for s in ("base", "pingpong", "intrawg"):
        for r in res["rows"]:
            name, at, opt = r["kernel"].partition("@")
            if name == s + "+trace" and s + at + opt not in ours:
                ours.append(s + at + opt)
    traced = [(k, ks) for k, ks in by_shape.items() if any(_overhead(ks, s, "+trace") is not None for s in ours)]
    if traced:
        short = {"pingpong": "pp", "intrawg": "iw"}
        who = "/".join(short.get(s, s) for s in ours)
        head = ["shape", f"every warp {who}", f"lead warps {who}", f"+stalls events {who}"]
        body = []
        for key, ks in traced:
            cells = [_shape_name(key)]
            for sfx in ("+trace", "+tracelead", "+tracestalls"):
                vals = [_overhead(ks, s, sfx) for s in ours]
                cells.append(" / ".join("-" if v is None else f"{v:+.1f}%" for v in vals))
            body.append(cells)
        lines += ["", "Tracing cost per schedule (same run; core events unless said; overhead against the "
                  "untraced kernel timed next to it):", ""] + _table(head, body)
    return lines


def render_generic(res: dict) -> list[str]:
    cols = res.get("columns")
    if not cols:
        keys: list[str] = []
        for r in res["rows"]:
            keys += [k for k in r if k not in keys]
        cols = [[k, k] for k in keys]
    def cell(r, k):
        if k == "shape" and "shape" not in r and all(x in r for x in ("d", "hq", "hkv", "sk", "b", "sq")):
            return _shape_name([r[x] for x in ("d", "hq", "hkv", "sk", "b", "sq")])
        return _fmt(r.get(k))

    return _table([h for _, h in cols], [[cell(r, k) for k, _ in cols] for r in res["rows"]])


def render_pivot(res: dict) -> list[str]:
    """Rows that vary along two sets of keys as a grid: ``pivot`` says which keys label the lines,
    which the columns, which is the value (and which, if any, gives a first line per column)."""
    pv = res["pivot"]

    def label(r, keys):  # a key's value, or a format string over the row ("b {b}")
        return " · ".join(k.format(**r) if "{" in k else str(r.get(k)) for k in keys
                          if "{" in k or r.get(k) not in (None, ""))

    cols, lines, cell, base = [], [], {}, {}
    for r in res["rows"]:
        c, ln = label(r, pv["columns"]), label(r, pv["rows"])
        cols += [c] if c not in cols else []
        lines += [ln] if ln not in lines else []
        cell[(ln, c)] = r.get(pv["value"])
        if pv.get("base") and r.get(pv["base"]) is not None:
            base.setdefault(c, r[pv["base"]])
    body = [[f"*{pv['base']}*"] + [_fmt(base.get(c)) for c in cols]] if pv.get("base") else []
    body += [[ln] + [_fmt(cell.get((ln, c))) for c in cols] for ln in lines]
    return _table([pv["value"]] + cols, body)


def render_not_kept(res: dict) -> list[str]:
    return [f"- {r['idea']}: {r['result']} (`{r['commit']}`)" for r in res["rows"]]


def render_area(res: dict, gpu: str = "") -> list[str]:
    if res["area"] in ("decode", "decode-traced"):
        body = render_decode(res)
    elif "pivot" in res:
        body = render_pivot(res)
    else:
        body = render_generic(res)
    return _meta(res, gpu) + body + [""]


def render_page(page: str, results: list[dict]) -> str:
    """A docs page of ``PAGES`` (its file name): its title, intro, then each of its areas (under its
    section heading, if any): each file's table, or for not-kept its notes and lines."""
    title, intro, areas = PAGES[page]
    lines = [f"# {title}", "", intro, ""]
    for area, heading in areas:
        files = sorted((r for r in results if r["area"] == area), key=lambda r: r["_file"])
        if files and heading:
            lines += [f"## {heading}", ""]
        for res in files:
            body = render_not_kept(res) if area == "not-kept" else render_area(res)
            lines += ([res["notes"], ""] if res.get("notes") and area == "not-kept" else []) + body + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def pages_of(results: list[dict]) -> list[str]:
    """The pages of ``PAGES`` that hold at least one of the results, in ``PAGES`` order."""
    present = {r["area"] for r in results}
    return [p for p, (_, _, areas) in PAGES.items() if any(a in present for a, _ in areas)]


def render(results: list[dict], folder: Path = RESULTS) -> str:
    """BENCHMARKS.md: every area but those with a page of their own, in ``AREAS`` order."""
    order = {a: i for i, (a, _) in enumerate(AREAS)}
    heading = {a: h for a, h in AREAS if h}
    pages = pages_of(results)
    results = sorted((r for r in results if r["area"] not in PAGE_OF),
                     key=lambda r: (order.get(r["area"], len(order)), r["area"], r["_file"]))
    gpus = Counter(r["gpu"] for r in results)
    gpu = gpus.most_common(1)[0][0] if gpus and gpus.most_common(1)[0][1] > 1 else ""
    lines = ["# Benchmarks", "",
             "Current results, each with date, commit, GPU and command, made by "
             "`python benchmarks/report.py` from [`benchmarks/results/`](benchmarks/results/). Compare within "
             "one table (GPUs of a kind differ; H200s at b >= 8 hit the 700 W cap). History: git."
             + (f" GPU, where a table says \"as above\": {gpu}." if gpu else "")
             + "".join(f" {PAGES[p][0]}: [docs/{p}](docs/{p})." for p in pages),
             ""]
    seen = set()
    for res in results:
        area = res["area"]
        if area not in seen:
            seen.add(area)
            if area in heading:
                lines += [f"## {heading[area]}", ""]
            elif area not in order:
                lines += [f"## {area}", ""]
        lines += render_area(res, gpu)
    others = sorted(p.name for p in folder.iterdir() if p.suffix != ".json") if folder.is_dir() else []
    if others:
        lines += ["## Other result files", "",
                  "Raw outputs kept next to the JSON files: " +
                  ", ".join(f"[`{n}`](benchmarks/results/{n})" for n in others) + ".", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def outputs(results: list[dict], folder: Path, out: Path, docs: Path) -> dict[Path, str]:
    """Every file the results render to: BENCHMARKS.md, and each page of ``PAGES`` with an area present."""
    files = {out: render(results, folder)}
    for page in pages_of(results):
        files[docs / page] = render_page(page, results)
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if BENCHMARKS.md or a docs page is out of date")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--out", type=Path, default=OUT, help="BENCHMARKS.md to write")
    ap.add_argument("--docs", type=Path, default=DOCS, help="folder of the pages in PAGES (docs/)")
    args = ap.parse_args(argv)
    files = outputs(load_results(args.results), args.results, args.out, args.docs)
    if args.check:
        stale = [p for p, text in files.items() if (p.read_text() if p.exists() else "") != text]
        for p in stale:
            print(f"{p} is out of date: run python benchmarks/report.py", file=sys.stderr)
        if not stale:
            print(", ".join(str(p) for p in files) + " up to date")
        return 1 if stale else 0
    for p, text in files.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        print(f"wrote {p} ({len(text.encode())} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
