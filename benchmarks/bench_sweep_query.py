"""DuckDB over a sweep dataset: how long a GROUP BY takes over 10 000 points (CPU only).

    python benchmarks/bench_sweep_query.py [--points 10000] [--kernels 1] [--repeat 5] [--loose-repeat 2]
                                           [--no-loose] [--json out.json]

Writes a synthetic dataset into a temporary folder through ``fa4trace.sweep.Dataset`` (the same
files ``fa4trace sweep`` writes: one Parquet file per (point, kernel), hive-partitioned by
kernel / d / hkv; the numbers in them are made up, never a GPU measurement), then times
``fa4trace.sweep.query.query`` (a fresh connection each time, as ``fa4trace query`` runs it)
on a GROUP BY over every row: as written (one file per point: the first run, then the median of
``--loose-repeat`` more), then after ``fa4trace.sweep.compact.compact`` (one file per partition,
what ``fa4trace sweep`` leaves: the first run, then the median of ``--repeat`` more). Target: the
GROUP BY over 10 000 points in <= 1 s. ``--json`` writes the "sweep-query" result file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SQL = ("SELECT kernel, d, hkv, count(*) AS n, median(tbps) AS tbps_median, max(us) AS us_max, "
       "count(error) AS errors FROM results GROUP BY ALL ORDER BY ALL")
TARGET_S = 1.0


def synthetic_points(n: int):
    """n distinct shapes: d x heads x dtype x sq x b, sk growing until there are enough."""
    from fa4trace.sweep.grid import Point

    pts = []
    sk = 1024
    while len(pts) < n:
        for d in (64, 128):
            for hq, hkv in ((16, 1), (16, 2), (32, 4), (8, 1)):
                for dtype in ("bf16", "fp16"):
                    for sq in (1, 2, 4, 8):
                        for b in (1, 8):
                            if len(pts) < n:
                                pts.append(Point(d, hq, hkv, sk, b, sq, dtype))
        sk += 1024
    return pts


def write_dataset(root: str, n_points: int, kernels: list[str]) -> int:
    from fa4trace.sweep import Dataset

    ds = Dataset(root)
    now = dt.datetime.now(dt.timezone.utc)
    files = 0
    for i, p in enumerate(synthetic_points(n_points)):
        for j, k in enumerate(kernels):
            us = p.shape.io_bytes() / 3.5e12 * 1e6 + j
            ds.write_result({"sweep_id": "synthetic", "point_id": p.id, "kernel": k, "d": p.d, "hq": p.hq,
                             "hkv": p.hkv, "sk": p.sk, "b": p.b, "sq": p.sq, "dtype": p.dtype, "us": us,
                             "us_spread": 0.01 * us, "tbps": p.shape.io_bytes() / us / 1e6, "rel_err": 1e-3,
                             "error": "synthetic error" if i % 97 == 0 else None, "gpu": "none (synthetic)",
                             "worker": "synthetic", "finished_at": now})
            files += 1
    return files


def timed(root: str, repeat: int):
    """The first query's seconds, the median of ``repeat`` more, and the first's table."""
    from fa4trace.sweep.query import query

    t = time.perf_counter()
    table = query(root, SQL)
    first = time.perf_counter() - t
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        query(root, SQL)
        times.append(time.perf_counter() - t)
    return first, statistics.median(times) if times else first, table


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=10_000, help="distinct shapes (default 10000)")
    ap.add_argument("--kernels", type=int, default=1, choices=range(1, 7),
                    help="kernels per point, one result file each (default 1)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs after the first, compacted (default 5)")
    ap.add_argument("--loose-repeat", type=int, default=2,
                    help="timed runs after the first, one file per point (default 2)")
    ap.add_argument("--no-loose", action="store_true", help="skip the queries before compaction")
    ap.add_argument("--json", help="write the 'sweep-query' result file here")
    args = ap.parse_args(argv)
    from fa4trace.sweep.compact import compact
    from fa4trace.sweep.grid import KERNELS
    from fa4trace.sweep.query import format_table

    kernels = list(KERNELS[:args.kernels])
    rows = []
    with tempfile.TemporaryDirectory() as root:
        t = time.perf_counter()
        files = write_dataset(root, args.points, kernels)
        write_s = time.perf_counter() - t
        print(f"{args.points} points x {len(kernels)} kernel(s) = {files} result files, written in {write_s:.1f} s")
        if not args.no_loose:
            first, med, _ = timed(root, args.loose_repeat)
            rows.append({"layout": "a file per point", "points": args.points, "files": files,
                         "first_s": round(first, 4), "median_s": round(med, 4)})
        t = time.perf_counter()
        st = compact(root)
        compact_s = time.perf_counter() - t
        first, med, table = timed(root, args.repeat)
        rows.append({"layout": f"compacted ({compact_s:.0f} s)", "points": args.points, "files": st["written"],
                     "first_s": round(first, 4), "median_s": round(med, 4), "compact_s": round(compact_s, 2)})
    for r in rows:
        r.update(target_s=TARGET_S, met=max(r["first_s"], r["median_s"]) <= TARGET_S)
    print(format_table(table, max_rows=10))
    for r in rows:
        print(f"{r['layout']}: {r['files']} files, GROUP BY first {r['first_s']:.3f} s, median {r['median_s']:.3f} s "
              f"(target <= {TARGET_S:g} s: {'met' if r['met'] else 'NOT met'})")
    print(f"load average {os.getloadavg()[0]:.1f}")
    if args.json:
        import duckdb

        from fa4trace.bench.results import envelope, write

        doc = envelope("sweep-query", f"DuckDB GROUP BY over {args.points} synthetic points", rows,
                       gpu=f"none: {platform.node() or 'this machine'} ({os.cpu_count()} CPUs)",
                       columns=[["layout", "layout"], ["files", "files"], ["first_s", "first query (s)"],
                                ["median_s", "median (s)"], ["met", "<= 1 s"]],
                       notes=f"A fresh connection per query; DuckDB {duckdb.__version__}.")
        write(args.json, doc)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
