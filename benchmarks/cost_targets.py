"""Tracing cost against its targets: each target's best measured cost, read from the result files.

    python benchmarks/cost_targets.py                  # benchmarks/results/ -> benchmarks/results/cost_targets.json
    python benchmarks/cost_targets.py --results DIR --json F
    python benchmarks/cost_targets.py --check          # exit 1 if cost_targets.json's rows are not what the files give

Writes area "cost-targets" (BENCHMARKS.md, first under "Tracing cost"), one row per target. Every
target is the cost with every warp of every recording CTA recording every event asked for:

1. FA4's SM90 prefill, pipeline + barrier families with its softmax and rescale spans: <= 8%;
2. FA4's SM90 prefill, every family with the spans: <= 12%;
3. quack's SM90 GEMM at 8192^3, every family: <= 3%;
4. our decode kernel, its own recorder (traced build against the untraced kernel): <= 3% at
   every shape of the benchmark matrix and at ``fa4trace check``'s shape;
5. the marker microbenchmark: fa4trace <= IKET under run-iket in every configuration.

A target is judged per build (cursor, L2 policy, split body) on the rows that measure exactly its
configuration (kernel, shape, families, spans): each build's median over its repeated runs, with
their spread (min..max) beside it; the best build is the one with the lowest median. It is "met"
only where that median is within the limit over at least MIN_RUNS runs, "missed" where the median
is over it, and "unconfirmed (n runs)" where fewer runs are within it. Rows where only some warps
or CTAs record (lead warps, a CTA sample), or whose ring overwrote records (each warp kept only its
newest ones: not every event), are other configurations and left out, as are other variants of
the kernel (FA4 causal, quack's dynamic scheduler). Item 4
reads the newest result file holding our decode kernel's traced-vs-untraced overheads and takes
the build whose worst shape is lowest. No matching row: "not measured", never a number.

Rows come from the files matching ``SOURCES`` (``auto_kernels*_h200.json`` and the like, so a new
file of an area is read without a change here); a file whose area is not the one expected is
skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import auto_kernels as ak  # noqa: E402  (its kernels' shapes)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
OUT_NAME = "cost_targets.json"
AREA = "cost-targets"

# file pattern -> the area its files must have
SOURCES = {"auto": ("auto_kernels*_h200.json", "auto-kernels"),
           "sample": ("cta_sample*_h200.json", "auto-sample"),
           "fidelity": ("fidelity*_cost.json", "fidelity"),
           "decode": ("decode*_h200.json", "decode"),
           "decode-traced": ("traced_decode*_h200.json", "decode-traced"),
           "parts": ("trace_cost_parts*_h200.json", "trace-cost-parts"),
           "markers": ("markers*_h200.json", "markers"),
           "fa4-parts": ("fa4_cost_parts*_h200.json", "fa4-cost-parts")}

GEMM = "quack GEMM"
FA4 = "FA4 SM90 prefill"
GEMM_SHAPE = "x".join(str(n) for n in ak.GEMM_SHAPES["square_8192"])
FA4_SHAPE = "b{b} s{seqlen} h{h} d{d}".format(**ak.FA4_PREFILL)
DECODE_LIMIT_PCT = 3.0
MIN_RUNS = 3  # runs of one build before a median within its limit counts as "met"


def _all_families() -> str:
    from fa4trace.auto.events import FAMILIES

    return "+".join(sorted(FAMILIES))


ALL = _all_families()
# (key, target text, limit %, kernel, shape, families, spans)
TARGETS = [("fa4-spans-pipeline-barrier",
            f"FA4 SM90 prefill ({FA4_SHAPE}): pipeline + barrier families, softmax and rescale spans",
            8.0, FA4, FA4_SHAPE, "barrier+pipeline", True),
           ("fa4-every-family", f"FA4 SM90 prefill ({FA4_SHAPE}): every family, softmax and rescale spans",
            12.0, FA4, FA4_SHAPE, ALL, True),
           ("gemm-every-family", "quack GEMM 8192^3: every family", 3.0, GEMM, GEMM_SHAPE, ALL, False)]


# ---- reading the result files -----------------------------------------------------------------------
def source_files(folder: Path, kind: str) -> list[dict]:
    """The result files of ``SOURCES[kind]`` in ``folder`` (name order), each with "_file"; those of
    another area are skipped."""
    pattern, area = SOURCES[kind]
    out = []
    for path in sorted(folder.glob(pattern)):
        doc = json.loads(path.read_text())
        if doc.get("area") == area:
            out.append(dict(doc, _file=path.name))
    return out


def kernel_name(name: str) -> str:
    """A row's kernel as the targets name it: the result files spell the same kernel several ways
    ("quack GemmSm90", "quack GEMM"; "FA4 SM90 prefill full", "FA4 SM90"); variants keep their suffix."""
    low = name.lower()
    if "gemm" in low:
        return GEMM + (", dynamic" if "dynamic" in low else "")
    if low.startswith("fa4 sm90"):
        return FA4 + (", causal" if "causal" in low else "")
    if "decode" in low:
        return "our decode, generic events"
    return name


def shape_name(kernel: str, shape: str) -> str:
    """One spelling per shape: GEMM "8192^3 (132 CTAs)" -> "8192x8192x8192"; FA4 "b2 s8192 h16" ->
    "b2 s8192 h16 d128" (auto_kernels.py has always run d 128; its first file's labels left d out)."""
    if kernel.startswith(GEMM):
        m = re.match(r"(\d+)\^3", shape)
        return "x".join([m.group(1)] * 3) if m else shape.split(" (")[0]
    if kernel.startswith(FA4):
        m = re.search(r"b(\d+) s(\d+) h(\d+)(?: d(\d+))?", shape)
        if m:
            return f"b{m.group(1)} s{m.group(2)} h{m.group(3)} d{m.group(4) or ak.FA4_PREFILL['d']}"
    return shape


def families_of(label: str, fa4_spans_unless_said: bool = False) -> tuple[str, bool, bool]:
    """(families, spans, every warp) of a row's families label. "all families" is the four
    automatic ones; a "; ..." tail names a subset of recorders (lead warps): not every warp.
    ``fa4_spans_unless_said``: the label's file marks span-less FA4 builds "(no spans)" and
    leaves the spans of the others unsaid (its notes say so)."""
    head, _, who = label.partition(";")
    if "spans" in head:
        spans = "(no spans)" not in head
    else:
        spans = fa4_spans_unless_said
    fams = head.split(" + ")[0].replace("(no spans)", "").strip()
    if fams == "all families":
        fams = ALL
    elif fams.startswith("lifetimes only"):
        fams = "lifetimes only"
    else:
        fams = "+".join(sorted(f.strip() for f in fams.split("+")))
    return fams, spans, not who.strip()


def _measure(doc: dict, kernel: str, shape: str, families: str, spans: bool, every: bool, build: str,
             cost, overwritten=None) -> dict:
    """One cost row in one form. A ring build keeps every event only where its row says none was
    overwritten (``overwritten`` 0); a ring row that does not say is not counted as every event."""
    kept_all = "ring" not in build or overwritten == 0
    return {"kernel": kernel, "shape": shape, "families": families, "spans": spans,
            "every": every and kept_all, "build": build, "cost_pct": cost, "file": doc["_file"],
            "date": doc["date"], "commit": doc["commit"]}


def auto_measurements(doc: dict) -> list[dict]:
    """auto_kernels.py rows: cursor "" is the smem cursor (the first file's notes)."""
    old_style = any("(no spans)" in r.get("families", "") for r in doc["rows"])
    out = []
    for r in doc["rows"]:
        kernel = kernel_name(r["kernel"])
        fams, spans, every = families_of(r.get("families", ""), old_style and kernel.startswith(FA4))
        out.append(_measure(doc, kernel, shape_name(kernel, r.get("shape", "")), fams, spans, every,
                            r.get("cursor") or "smem", r.get("cost_pct"), r.get("overwritten")))
    return out


def sample_measurements(doc: dict) -> list[dict]:
    """bench_cta_sample.py rows: every automatic family (FA4 with its spans) at auto_kernels.py's
    shapes; "all" CTAs recording is every CTA, each of the split and one-body builds."""
    out = []
    for r in doc["rows"]:
        kernel = kernel_name(r["kernel"])
        shape = FA4_SHAPE if kernel.startswith(FA4) else shape_name(kernel, r.get("shape", ""))
        for key, build in (("cost_split_pct", "smem, body split"), ("cost_one_body_pct", "smem, one body")):
            out.append(_measure(doc, kernel, shape, ALL, kernel.startswith(FA4), r.get("recording") == "all", build,
                                r.get(key)))
    return out


def fidelity_measurements(doc: dict) -> list[dict]:
    """bench_fidelity.py's cost rows: builds dense (every family; FA4 with its spans), pipeline,
    lifetimes, at auto_kernels.py's shapes; timed with every CTA recording and with a sample."""
    fams = {"dense": ALL, "pipeline": "pipeline", "lifetimes": "lifetimes only"}
    shapes = {GEMM: GEMM_SHAPE, FA4: FA4_SHAPE}
    out = []
    for r in doc["rows"]:
        kernel = kernel_name(r["kernel"])
        f = fams.get(r.get("build"), r.get("build"))
        spans = kernel.startswith(FA4) and r.get("build") == "dense"
        for key, every in (("cost_all_pct", True), ("cost_sample_pct", False)):
            # a row kept from an earlier run by `bench_fidelity --merge` names its own commit
            out.append(_measure(dict(doc, commit=r.get("commit", doc["commit"])), kernel,
                                shapes.get(kernel, r.get("shape", "")), f, spans, every, "smem, body split", r.get(key)))
    return out


def fa4_parts_measurements(doc: dict) -> list[dict]:
    """fa4_cost_parts.py rows (FA4's prefill, every warp of every CTA): the parts that are a
    target's configuration (``fa4_cost_parts.configuration``: "every family + spans", "spans +
    pipeline + barrier") as fa4trace builds them by default (``families.STORE_AT_BEGIN``: which
    span begins are stored before the call); parts with timer reads taken out are measurements,
    not builds, and no configuration."""
    import fa4_cost_parts
    from fa4trace.auto.families import STORE_AT_BEGIN

    default = ", ".join(sorted(STORE_AT_BEGIN)) or "none"
    fams = {"every family + spans": ALL, "spans + pipeline + barrier": "barrier+pipeline"}
    out = []
    for r in doc["rows"]:
        conf = fa4_cost_parts.configuration(r)
        if conf is not None and r.get("begins_first") == default:
            out.append(_measure(doc, FA4, FA4_SHAPE, fams[conf], True, True, r.get("cursor") or "smem",
                                r.get("cost_pct")))
    return out


def measurements(folder: Path) -> list[dict]:
    """Every cost row of the automatic-event result files, in one form."""
    out = []
    for kind, read in (("auto", auto_measurements), ("sample", sample_measurements),
                       ("fidelity", fidelity_measurements), ("fa4-parts", fa4_parts_measurements)):
        for doc in source_files(folder, kind):
            out += read(doc)
    return out


# ---- the targets ------------------------------------------------------------------------------------
def _from(file: str, date: str, commit: str) -> str:
    return f"`{file}` ({date}, `{commit}`)"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _status(median, limit, runs: int) -> str:
    if median is None:
        return "not measured"
    if median > limit:
        return "missed"
    return "met" if runs >= MIN_RUNS else f"unconfirmed ({_count(runs, 'run')})"


def family_target(ms: list[dict], key, text, limit, kernel, shape, families, spans) -> dict:
    """The build with the lowest median over the rows of exactly this configuration (every warp
    of every CTA, every event kept), its spread and its status (module doc)."""
    import statistics

    hits = [m for m in ms if m["kernel"] == kernel and m["shape"] == shape and m["families"] == families
            and m["spans"] == spans and m["every"] and m["cost_pct"] is not None]
    row = {"key": key, "target": text, "limit": f"<= {limit:g}%", "target_pct": limit}
    if not hits:
        return dict(row, best_pct=None, best="not measured", build=None, status="not measured",
                    detail="no row of this configuration", **{"from": None})
    builds: dict = {}
    for m in hits:
        builds.setdefault(m["build"], []).append(m)
    stats = {b: (statistics.median(m["cost_pct"] for m in rs), len(rs)) for b, rs in builds.items()}
    build = min(stats, key=lambda b: (stats[b][0], -stats[b][1]))
    runs = sorted(builds[build], key=lambda m: (m["date"], m["file"]))
    med, n = stats[build]
    lo, hi = min(m["cost_pct"] for m in runs), max(m["cost_pct"] for m in runs)
    newest = runs[-1]
    files = sorted({m["file"] for m in runs})
    spread = f"{lo:+.2f}..{hi:+.2f}%" if n > 1 else "one run: no spread"
    return dict(row, best_pct=round(med, 2), best=f"{med:+.2f}% (median of {_count(n, 'run')})", build=build,
                status=_status(med, limit, n), runs=n, spread_pct=[lo, hi],
                detail=f"{spread} over {_count(n, 'run')} in {_count(len(files), 'file')}; "
                       f"{_count(len(builds), 'build')} of this configuration measured",
                source=newest["file"], source_date=newest["date"], source_commit=newest["commit"],
                **{"from": _from(newest["file"], newest["date"], newest["commit"])})


def _decode_shape(d, hq, hkv, sk, b, sq) -> str:
    return f"d{d} {hq}:{hkv} sk {sk} b {b}" + (f" sq {sq}" if sq != 1 else "")


def _ok(r) -> bool:
    return r is not None and r.get("us") is not None and r["us"] == r["us"]


def decode_overheads(doc: dict) -> dict:
    """{build: {shape: (overhead %, splits or None)}} of a result file with our decode kernel
    traced (every warp, core events) against the untraced kernel: a `fa4trace bench` file (build:
    the schedule, with its @variant; untraced: its "+ref" twin, else the plain kernel) or a
    trace_cost.py parts file (its "full" columns)."""
    out: dict = {}
    if doc["area"] == "trace-cost-parts":
        for r in doc["rows"]:
            m = re.match(r"d(\d+) (\d+):(\d+) b (\d+), sk (\d+)", r.get("shape", ""))
            if not m:
                continue
            d, hq, hkv, b, sk = (int(x) for x in m.groups())
            for k, v in r.items():
                if k.endswith("_full_pct") and v is not None:
                    out.setdefault(k[:-len("_full_pct")], {})[_decode_shape(d, hq, hkv, sk, b, 1)] = (v, None)
        return out
    by_shape: dict = {}
    for r in doc["rows"]:
        by_shape.setdefault((r["d"], r["hq"], r["hkv"], r["sk"], r["b"], r["sq"]), {})[r["kernel"]] = r
    for key, ks in by_shape.items():
        for kernel, r in ks.items():
            base, at, opt = kernel.partition("@")
            if not base.endswith("+trace"):
                continue
            sched = base[:-len("+trace")]
            ref = ks.get(sched + "+ref" + at + opt)
            ref = ref if _ok(ref) else ks.get(sched + at + opt)
            if _ok(r) and _ok(ref):
                pct = round(100 * (r["us"] / ref["us"] - 1), 2)
            elif r.get("overhead_pct") is not None:
                pct = r["overhead_pct"]
            else:
                continue
            out.setdefault(sched + at + opt, {})[_decode_shape(*key)] = (pct, r.get("splits"))
    return out


def decode_target(folder: Path) -> dict:
    """Item 4: the newest file's build whose worst shape is lowest (among the builds timed at the
    most shapes), how many of its shapes meet the limit; and `fa4trace check`'s shape (ping-pong,
    the check's split count), from the newest file that has it."""
    from fa4trace.bench.decode import bench_matrix
    from fa4trace.check.rows import DEFAULT_SHAPE, decode_splits

    limit = DECODE_LIMIT_PCT
    matrix = [_decode_shape(s.d, s.hq, s.hkv, s.sk, s.b, s.sq) for s in bench_matrix()]
    s = DEFAULT_SHAPE
    check_shape = _decode_shape(s.d, s.hq, s.hkv, s.sk, s.b, s.sq)
    splits = decode_splits(DEFAULT_SHAPE)
    docs = [(doc, decode_overheads(doc)) for kind in ("decode", "decode-traced", "parts")
            for doc in source_files(folder, kind)]
    docs = sorted(((d, o) for d, o in docs if o), key=lambda x: (x[0]["date"], x[0]["_file"]), reverse=True)
    row = {"key": "decode-own-recorder",
           "target": "our decode kernel, its own recorder (traced vs untraced): every shape of the benchmark "
                     "matrix and `fa4trace check`'s shape",
           "limit": f"<= {limit:g}% at every shape", "target_pct": limit, "matrix_shapes": len(matrix),
           "check_shape": f"{check_shape}, {splits} splits, pingpong"}
    check = None
    for doc, over in docs:  # newest first; ping-pong as the planner split it, or at the check's count
        hits = [over.get(b, {}).get(check_shape) for b in ("pingpong", f"pingpong@s{splits}")]
        hit = next((h for h in hits if h is not None and h[1] in (None, splits)), None)
        if hit is not None:
            check = {"check_pct": hit[0], "check_source": doc["_file"]}
            break
    check_text = ("`fa4trace check`'s shape (" + row["check_shape"] + "): " +
                  ("not measured" if check is None else f"{check['check_pct']:+.2f}% ({check['check_source']})"))
    if not docs:
        return dict(row, best_pct=None, best="not measured", build=None, status="not measured",
                    detail=check_text, **{"from": None})
    # the matrix from the file that timed it traced at the most of its shapes (newest on a tie)
    doc, over = max(docs, key=lambda x: max(sum(s in matrix for s in shapes) for shapes in x[1].values()))
    cover = {b: [s for s in shapes if s in matrix] for b, shapes in over.items()}
    most = max(len(c) for c in cover.values())
    build = min((b for b in over if len(cover[b]) == most),
                key=lambda b: max(over[b][s][0] for s in cover[b] or over[b]))
    shapes = {s: v[0] for s, v in over[build].items() if not cover[build] or s in matrix}
    worst = max(shapes, key=shapes.get)
    met = sum(v <= limit for v in shapes.values())
    everywhere = len(shapes) == len(matrix) and check is not None
    if max(shapes.values()) > limit or (check is not None and check["check_pct"] > limit):
        status = "missed"
    else:
        status = "met" if everywhere else "met where measured"
    return dict(row, best_pct=shapes[worst], best=f"{shapes[worst]:+.2f}% at its worst shape",
                build=f"{build}, every warp, core events", status=status,
                detail=f"{met} of {len(shapes)} shapes meet {limit:g}%, worst {worst}; "
                       + ("every shape of the matrix timed traced; " if len(cover[build]) == len(matrix) else
                          f"{len(matrix) - len(cover[build])} of the matrix's {len(matrix)} shapes not timed traced; ")
                       + check_text,
                worst_shape=worst, shapes_timed=len(shapes), shapes_met=met, **(check or {}),
                source=doc["_file"], source_date=doc["date"], source_commit=doc["commit"],
                **{"from": _from(doc["_file"], doc["date"], doc["commit"])})


def markers_target(folder: Path) -> dict:
    """Item 5: in the newest marker file, the fa4trace build (a column whose header starts
    "fa4trace") that meets "IKET under run-iket" in the most configurations; met only where one
    build meets every configuration (a user picks one build, not one per workload)."""
    row = {"key": "markers-vs-iket", "target": "marker microbenchmark: fa4trace against IKET under run-iket, "
                                               "every configuration",
           "limit": "<= IKET under run-iket", "target_pct": None, "best_pct": None}
    docs = sorted(source_files(folder, "markers"), key=lambda d: (d["date"], d["_file"]), reverse=True)
    doc = docs[0] if docs else None
    cols = (doc or {}).get("columns") or []
    ours = [(k, h[len("fa4trace "):].removesuffix(" %")) for k, h in cols if h.startswith("fa4trace")]
    iket = next((k for k, h in cols if h.startswith("IKET under run-iket")), None)
    rows = [r for r in (doc or {}).get("rows", []) if iket is not None and r.get(iket) is not None]
    builds = []
    for k, name in ours:
        configs = [{"work": r.get("work"), "fa4trace_pct": r[k], "iket_pct": r[iket], "met": r[k] <= r[iket]}
                   for r in rows if r.get(k) is not None]
        if configs:
            builds.append((sum(c["met"] for c in configs), -sum(c["fa4trace_pct"] for c in configs), name, configs))
    if not builds:
        return dict(row, best="not measured", build=None, status="not measured", detail="no configuration with both",
                    **{"from": None})
    met, _, name, configs = max(builds, key=lambda b: b[:2])
    noise = _plain_noise(doc)
    return dict(row, best=f"{met} of {len(configs)} configurations", build=name,
                status="met" if met == len(configs) else "missed",
                detail="; ".join(f"{c['work']} {c['fa4trace_pct']:+.1f}% vs {c['iket_pct']:+.1f}%"
                                 + (f" (±{noise[c['work']]:.1f})" if c["work"] in noise else "") for c in configs)
                + ("; ±: half the plain build's min..max over its launches, % of its median" if noise else ""),
                configurations=configs, configurations_met=met, source=doc["_file"], source_date=doc["date"],
                source_commit=doc["commit"], **{"from": _from(doc["_file"], doc["date"], doc["commit"])})


def _plain_noise(doc: dict) -> dict:
    """{"work:chain": half the plain build's min..max over its launches, % of its median} of a
    marker file (its ``variants``): the noise beside each configuration's verdict."""
    out = {}
    for v in doc.get("variants") or []:
        if v.get("variant") == "plain" and v.get("median_us"):
            out[f"{v['work']}:{v['chain']}"] = 50 * (v["max_us"] - v["min_us"]) / v["median_us"]
    return out


def target_rows(folder: Path) -> list[dict]:
    """One row per target, in the issue's order."""
    ms = measurements(folder)
    return [family_target(ms, *t) for t in TARGETS] + [decode_target(folder), markers_target(folder)]


COLUMNS = [["target", "target"], ["limit", "limit"], ["best", "best measured"], ["build", "build"],
           ["status", "status"], ["detail", "detail"], ["from", "from"]]
NOTES = ("Every warp of every recording CTA, every event asked for and kept. Best: the build with the lowest "
         "median over its runs of exactly that configuration, its spread (min..max) in the detail; met only where "
         "that median is within the limit over at least 3 runs. Rows of lead warps or a CTA sample, rings that "
         "overwrote records, FA4 causal and quack's dynamic scheduler are other configurations. Written by "
         "`python benchmarks/cost_targets.py` from the files named; the tables behind it: "
         "[docs/tracing-cost.md](docs/tracing-cost.md).")


def document(folder: Path) -> dict:
    """The result file: the envelope (date: the newest source's; the rows are read, not measured)."""
    from fa4trace.bench.results import envelope

    rows = target_rows(folder)
    dates = [r["source_date"] for r in rows if r.get("source_date")]
    doc = envelope(AREA, "Tracing cost against its targets", rows, gpu="none: read from the H200 result files named",
                   command="python benchmarks/cost_targets.py", columns=COLUMNS, notes=NOTES)
    if dates:
        doc["date"] = max(dates)
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder of the result files read")
    ap.add_argument("--json", type=Path, default=None, help=f"file to write (default: RESULTS/{OUT_NAME})")
    ap.add_argument("--check", action="store_true", help="exit 1 if the file's rows are not what the results give")
    args = ap.parse_args(argv)
    out = args.json or args.results / OUT_NAME
    doc = document(args.results)
    if args.check:
        old = json.loads(out.read_text())["rows"] if out.exists() else None
        if old != json.loads(json.dumps(doc["rows"])):
            print(f"{out} is out of date: run python benchmarks/cost_targets.py", file=sys.stderr)
            return 1
        print(f"{out} up to date")
        return 0
    from fa4trace.bench.results import write

    write(out, doc)
    for r in doc["rows"]:
        print(f"{r['status']:>18}  {r['best']:<28} {r['target']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
