"""What a sweep costs per point beyond the kernels' own timing, on a GPU.

    python benchmarks/bench_sweep_overhead.py [--kernels base,pingpong,intrawg,cudnn,flash,fa4] [--d 128]
        [--heads 16:1] [--sk 4096,32768,131072] [--rounds 2] [--replays 15] [--out DIR] [--json out.json]

Runs a small grid the way ``fa4trace sweep`` does on one GPU (``run_sweep`` with a ``CudaRunner``
in this process, bundles recorded, compacted at the end) into a fresh dataset, and reads each
point's cost columns back (with pyarrow: no DuckDB needed):

    time_s    inside the timing harness (``bench_shape``: inputs, kernel loads, CUDA graphs and the
              timed replays of every kernel): the kernels' own timing
    record_s  recording one bundle per schedule of ours (a traced launch each), serializing and
              analysing it
    point_s   the point's wall time, handed out -> its rows ready to write (its bundles written)

Counted as the sweep's overhead per point: ``point_s - time_s`` (recording included: it is part
of the work a sweep does) and, apart, ``point_s - time_s - record_s`` (the rest: rows, files,
the loop; target <= 2 s). Once per sweep, outside the points: the runner's start (torch, CUDA,
power log) and the compaction. The first point also loads the kernels (inside ``time_s``).
Needs torch, pyarrow and the kernels (JIT or ``$FA4TRACE_BUILD``); ``--json`` writes the
"sweep-overhead" result file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

TARGET_S = 2.0


def per_point(rows: list[dict]) -> list[dict]:
    """One entry per point from its result rows (the cost columns repeat on each row of a point)."""
    out: dict = {}
    for r in rows:
        p = out.setdefault(r["point_id"], {"point": r["point_id"], "kernels": 0, "errors": 0, "time_s": r["time_s"],
                                           "record_s": r["record_s"], "point_s": r["point_s"]})
        p["kernels"] += 1
        p["errors"] += r["error"] is not None
    for p in out.values():
        t, rec, wall = p["time_s"] or 0.0, p["record_s"] or 0.0, p["point_s"]
        p["overhead_s"] = None if wall is None else round(wall - t, 3)
        p["other_s"] = None if wall is None else round(wall - t - rec, 3)
    return sorted(out.values(), key=lambda p: p["point"])


def summary(points: list[dict]) -> dict:
    """Medians (and the worst) over the points; ``met``: the median overhead <= TARGET_S."""
    def med(key):
        vals = [p[key] for p in points if p[key] is not None]
        return round(statistics.median(vals), 3) if vals else None

    worst = [p["overhead_s"] for p in points if p["overhead_s"] is not None]
    s = {"points": len(points), "time_s": med("time_s"), "record_s": med("record_s"), "other_s": med("other_s"),
         "overhead_s": med("overhead_s"), "overhead_max_s": round(max(worst), 3) if worst else None}
    s["met"] = s["overhead_s"] is not None and s["overhead_s"] <= TARGET_S
    return s


def measure(grid, root, make_runner, log=print) -> dict:
    """Run ``grid`` into ``root`` with the runner ``make_runner()`` builds; the sweep's costs."""
    from fa4trace.sweep import Dataset
    from fa4trace.sweep.run import run_sweep

    t = time.perf_counter()
    runner = make_runner()
    start_s = time.perf_counter() - t
    try:
        t = time.perf_counter()
        doc = run_sweep(grid, root, runner, compact=False, log=log)
        loop_s = time.perf_counter() - t
    finally:
        runner.close()
    from fa4trace.sweep.compact import compact

    t = time.perf_counter()
    compact(root)
    compact_s = time.perf_counter() - t
    points = per_point(Dataset(root).read_results().to_pylist())
    return {"sweep": doc, "points": points, "summary": summary(points), "start_s": round(start_s, 2),
            "loop_s": round(loop_s, 2), "compact_s": round(compact_s, 2)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default="base,pingpong,intrawg,cudnn,flash,fa4")
    ap.add_argument("--d", default="128")
    ap.add_argument("--heads", default="16:1")
    ap.add_argument("--sk", default="4096,32768,131072")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--out", help="dataset folder (default: a temporary one, removed after)")
    ap.add_argument("--json", help="write the 'sweep-overhead' result file here")
    args = ap.parse_args(argv)
    from fa4trace.sweep import grid as G
    from fa4trace.sweep.cuda import CudaRunner

    grid = G.from_flags(kernels=args.kernels, d=args.d, heads=args.heads, sk=args.sk)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or os.path.join(tmp, "ds")
        m = measure(grid, root, lambda: CudaRunner(rounds=args.rounds, replays=args.replays))
    s = m["summary"]
    for p in m["points"]:
        print(f"{p['point']}: point {p['point_s']:.2f} s = timing {p['time_s'] or 0:.2f} + recording "
              f"{p['record_s'] or 0:.2f} + other {p['other_s']:.2f} ({p['kernels']} kernels, {p['errors']} errors)")
    print(f"median per point: overhead {s['overhead_s']} s (recording {s['record_s']} s, other {s['other_s']} s), "
          f"worst {s['overhead_max_s']} s: target <= {TARGET_S:g} s {'met' if s['met'] else 'NOT met'}; "
          f"runner start {m['start_s']} s, compaction {m['compact_s']} s")
    if args.json:
        from fa4trace.bench.results import envelope, write

        row = {"grid": f"{s['points']} points x {len(grid.kernels)} kernels", **s}
        doc = envelope("sweep-overhead", "Sweep cost per point (median), one GPU", [row],
                       gpu=m["sweep"].get("gpu") or None,
                       columns=[["grid", "grid"], ["time_s", "timing s"], ["record_s", "recording s"],
                                ["other_s", "other s"], ["overhead_s", "overhead s"], ["overhead_max_s", "worst"],
                                ["met", "<= 2 s"]],
                       points=m["points"], start_s=m["start_s"], loop_s=m["loop_s"], compact_s=m["compact_s"],
                       sweep=m["sweep"])
        write(args.json, doc)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
