"""The worker pool on one GPU: the same small grid with 1 worker and with 2 workers sharing GPU 0.

    python benchmarks/bench_sweep_pool.py [--gpus 0,0] [--kernels base,pingpong,intrawg,cudnn] [--d 128]
        [--heads 16:1] [--sk 4096,8192,16384,32768,65536,131072] [--rounds 2] [--replays 15] [--json out.json]

Runs the grid twice through ``fa4trace.sweep.pool.Pool`` (worker processes pinned with
``CUDA_VISIBLE_DEVICES``, a queue, the driver writing the dataset), each into a fresh dataset:
first one worker on GPU 0, then one worker per ``--gpus`` entry (default ``0,0``: two workers
sharing GPU 0, which measures the pool's mechanics where one GPU is all there is: two GPUs'
wall-time halving needs two GPUs). Reports per run: the workers' start, the sweep's wall time
(start excluded), the points' median ``point_s`` and ``time_s``; and per (point, kernel) the
microseconds of the second run against the first (the same inputs: ``point_seed``), their
median and worst difference next to the first run's own spread. Two workers on one GPU time
their kernels side by side, so their numbers may differ from a lone worker's: that is what the
comparison shows. Needs torch, pyarrow and the kernels (no DuckDB); ``--json`` writes the
"sweep-pool" result file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def run_once(grid, root, job, gpus: list, log=print) -> dict:
    """One sweep of ``grid`` into ``root`` on a pool of ``gpus`` workers: its walls and rows."""
    from fa4trace.sweep import Dataset
    from fa4trace.sweep.pool import Pool
    from fa4trace.sweep.run import run_sweep

    pool = Pool(job, gpus)
    t = time.perf_counter()
    try:
        pool.start(log)
        start_s = time.perf_counter() - t
        t = time.perf_counter()
        doc = run_sweep(grid, root, executor=pool, compact=False, log=log)
        wall_s = time.perf_counter() - t
    finally:
        pool.close()
    rows = Dataset(root).read_results().to_pylist()
    return {"workers": len(gpus), "start_s": round(start_s, 2), "wall_s": round(wall_s, 2), "rows": rows,
            "sweep": doc}


def _median(vals):
    vals = [v for v in vals if v is not None]
    return round(statistics.median(vals), 3) if vals else None


def per_point_costs(rows: list[dict]) -> dict:
    first = {}
    for r in rows:
        first.setdefault(r["point_id"], r)
    return {"point_s": _median(r["point_s"] for r in first.values()),
            "time_s": _median(r["time_s"] for r in first.values())}


def compare(base: list[dict], other: list[dict]) -> dict:
    """``other``'s us against ``base``'s per (point, kernel) timed in both: the differences in
    percent (median, worst by magnitude) and ``base``'s own spread (us_spread / us, median)."""
    a = {(r["point_id"], r["kernel"]): r for r in base if r.get("us") is not None}
    b = {(r["point_id"], r["kernel"]): r for r in other if r.get("us") is not None}
    both = sorted(set(a) & set(b))
    diffs = [100 * (b[k]["us"] / a[k]["us"] - 1) for k in both]
    spread = [100 * a[k]["us_spread"] / a[k]["us"] for k in both if a[k].get("us_spread") is not None]
    return {"pairs": len(both), "diff_pct_median": round(statistics.median(diffs), 2) if diffs else None,
            "diff_pct_worst": round(max(diffs, key=abs), 2) if diffs else None,
            "spread_pct_median": round(statistics.median(spread), 2) if spread else None,
            "per_pair": [{"point": k[0], "kernel": k[1], "us_1": a[k]["us"], "us_n": b[k]["us"],
                          "diff_pct": round(d, 2)} for k, d in zip(both, diffs)]}


def measure(grid, tmp, job, gpus: list, log=print) -> dict:
    """The grid with one worker on ``gpus[0]``, then with a worker per entry of ``gpus``."""
    one = run_once(grid, os.path.join(tmp, "one"), job, gpus[:1], log)
    many = run_once(grid, os.path.join(tmp, "many"), job, gpus, log)
    cmp = compare(one["rows"], many["rows"])
    rows = []
    for run in (one, many):
        c = per_point_costs(run["rows"])
        rows.append({"workers": f"{run['workers']} on GPU {','.join(str(g) for g in gpus[:run['workers']])}",
                     "start_s": run["start_s"], "wall_s": run["wall_s"], "point_s": c["point_s"],
                     "time_s": c["time_s"], "us_diff": None})
    if cmp["pairs"]:
        spread = "" if cmp["spread_pct_median"] is None else f", spread {cmp['spread_pct_median']:.1f}%"
        rows[1]["us_diff"] = f"{cmp['diff_pct_median']:+.1f}% (worst {cmp['diff_pct_worst']:+.1f}%{spread})"
    return {"rows": rows, "compare": cmp, "sweeps": [one["sweep"], many["sweep"]]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="0,0", help="the second run's workers (default 0,0: two on GPU 0)")
    ap.add_argument("--kernels", default="base,pingpong,intrawg,cudnn")
    ap.add_argument("--d", default="128")
    ap.add_argument("--heads", default="16:1")
    ap.add_argument("--sk", default="4096,8192,16384,32768,65536,131072")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--json", help="write the 'sweep-pool' result file here")
    args = ap.parse_args(argv)
    from fa4trace.sweep import grid as G
    from fa4trace.sweep import pool as P
    from fa4trace.sweep.cuda import CudaJob

    idx = P.pick_gpus(P.parse_gpus(args.gpus), P.visible_gpus())
    if len(idx) < 2:
        ap.error("--gpus: give at least two workers (e.g. 0,0 or 0,1)")
    gpus = [P.device_id(i) for i in idx]
    grid = G.from_flags(kernels=args.kernels, d=args.d, heads=args.heads, sk=args.sk)
    with tempfile.TemporaryDirectory() as tmp:
        m = measure(grid, tmp, CudaJob(rounds=args.rounds, replays=args.replays), gpus)
    for r in m["rows"]:
        print(f"{r['workers']}: start {r['start_s']} s, sweep {r['wall_s']} s; per point {r['point_s']} s "
              f"(timing {r['time_s']} s)" + (f"; us vs 1 worker {r['us_diff']}" if r["us_diff"] else ""))
    if args.json:
        from fa4trace.bench.results import envelope, write

        workers = m["sweeps"][1].get("workers") or []
        doc = envelope("sweep-pool", f"Sweep pool, {len(grid.points())} points: 1 vs {len(gpus)} workers (medians)",
                       m["rows"], gpu=next((w["gpu"] for w in workers if w.get("gpu")), None),
                       columns=[["workers", "workers"], ["start_s", "start s"], ["wall_s", "sweep s"],
                                ["point_s", "point s"], ["time_s", "timing s"], ["us_diff", "us vs 1 worker"]],
                       compare=m["compare"], sweeps=m["sweeps"])
        write(args.json, doc)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
