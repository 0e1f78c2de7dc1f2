"""Sweep figures benchmark: reading and drawing a 1 000-point sweep dataset (target: <= 3 s to draw).

    python benchmarks/bench_sweep_page.py [--points 1000] [--no-apptest] [--json benchmarks/results/sweep_page.json]

A synthetic dataset in the sweep layout (one Parquet file per point, made-up bandwidths: a scale
test, not a measurement): 6 kernels x d 64/128 x GQA 16:1/16:2 x KV lengths (x query lengths
above 1 008 points). Timed, best of --repeat:
  load      fa4trace.sweep.figures.load (DuckDB over every file, newest row per point)
  fig 9/10/overlap  building the figure and serializing it to JSON (what the page sends)
  page      the viewer's Sweep tab as streamlit.testing.v1.AppTest runs it in a fresh process
            (cold: imports, the read and the figure; warm: a rerun)

``--json`` writes the "sweep-page" area of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TARGET_S = 3.0

APPTEST_CHILD = r"""
import json, sys, time
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(sys.argv[1], default_timeout=600)
t = time.perf_counter(); at.run(); cold = time.perf_counter() - t
assert not at.exception, [e.value for e in at.exception]
t = time.perf_counter(); at.run(); warm = time.perf_counter() - t
charts = [c for c in at.get("plotly_chart") if c.proto.id and "sweep_chart" in c.proto.id]
assert charts, "no sweep chart"
print(json.dumps({"cold_s": cold, "warm_s": warm, "traces": len(json.loads(charts[0].proto.spec)["data"])}))
"""


def make_dataset(root: Path, points: int) -> int:
    from tests.tools import sweep_dataset as S

    kernels = ("base", "pingpong", "intrawg", "cudnn", "flash", "fa4")
    per_sk = len(kernels) * 2 * 2
    n_sk = min(max(1, -(-points // per_sk)), 42)
    sks = [1024 * (1 + i * 3) for i in range(n_sk)]
    sqs = list(range(1, max(1, points // (per_sk * n_sk)) + 1))
    rows = S.grid_rows(kernels=kernels, sks=sks, sqs=sqs)[:points]
    for i, r in enumerate(rows):
        if i % 97 == 0:  # a few failures, drawn as gaps
            r.update(S.row(r["kernel"], d=r["d"], hkv=r["hkv"], sk=r["sk"], sq=r["sq"], error="synthetic failure"))
    S.write_rows(root, rows)
    S.write_sweep_json(root)
    return len(rows)


def best(fn, repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-apptest", action="store_true", help="Skip the AppTest page run.")
    ap.add_argument("--json", default=None, help="Write the result file (the 'sweep-page' area).")
    args = ap.parse_args()

    from fa4trace.sweep import figures as F

    results = {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
               "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        n = make_dataset(root, args.points)
        results["points"] = n
        results["load_s"] = best(lambda: F.load(root), args.repeat)
        df = F.load(root)
        kernels = F.kernels_in(df)
        for which in F.FIGURES:
            results[f"fig_{which}_s"] = best(lambda: F.figure(df, which, kernels).to_json(), args.repeat)
            results[f"fig_{which}_traces"] = len(F.figure(df, which, kernels).data)
        if not args.no_apptest:
            main_py = str(Path(F.__file__).with_name("main.py"))
            env = {**os.environ, "FA4TRACE_SWEEP": str(root), "FA4TRACE_TRACES_DIR": str(root / "no_traces")}
            env.pop("FA4TRACE_BUNDLES", None)
            r = subprocess.run([sys.executable, "-c", APPTEST_CHILD, main_py], capture_output=True, text=True,
                               env=env, cwd=str(REPO), timeout=600)
            if r.returncode != 0:
                print(r.stderr[-2000:], file=sys.stderr)
                return 1
            results["page"] = json.loads(r.stdout.strip().splitlines()[-1])
    results["load_after"] = os.getloadavg()[0]
    draw = results["load_s"] + results["fig_9_s"]
    results["draw_s"] = draw
    print(f"{n} points: load {results['load_s']:.2f} s, figure 9 {results['fig_9_s']:.2f} s "
          f"({results['fig_9_traces']} traces), figure 10 {results['fig_10_s']:.2f} s, overlap "
          f"{results['fig_overlap_s']:.2f} s; read + figure 9 {draw:.2f} s (target <= {TARGET_S:.0f} s)")
    if "page" in results:
        print(f"Sweep tab (AppTest): cold {results['page']['cold_s']:.2f} s, warm {results['page']['warm_s']:.2f} s")
    if args.json:
        from fa4trace.bench.results import envelope, write

        def sec(x):
            return None if x is None else round(x, 3)

        page = results.get("page", {})
        rows = [{"case": f"{n} points, 6 kernels", "load": sec(results["load_s"]), "fig9": sec(results["fig_9_s"]),
                 "fig10": sec(results["fig_10_s"]), "overlap": sec(results["fig_overlap_s"]),
                 "draw": sec(draw), "target": f"<= {TARGET_S:.0f}", "page_cold": sec(page.get("cold_s")),
                 "page_warm": sec(page.get("warm_s")),
                 "cpu_load": f"{results['load_before']:.1f}-{results['load_after']:.1f}"}]
        doc = envelope("sweep-page", "Sweep figures: reading and drawing a sweep dataset", rows,
                       gpu=f"none: {results['cpus']}-core {results['machine']}, Python {results['python']}",
                       columns=[("case", "case"), ("load", "read s (DuckDB)"), ("fig9", "figure 9 s"),
                                ("fig10", "figure 10 s"), ("overlap", "overlap s"), ("draw", "read + figure 9 s"),
                                ("target", "target s"), ("page_cold", "Sweep tab cold s (AppTest)"),
                                ("page_warm", "Sweep tab warm s"), ("cpu_load", "1-min load")],
                       notes="Synthetic dataset (made-up bandwidths), one Parquet file per point; figures built "
                             "and serialized to JSON, best of --repeat.", results=results)
        print(f"wrote {write(args.json, doc)}")
    return 0 if draw <= TARGET_S else 2


if __name__ == "__main__":
    sys.exit(main())
