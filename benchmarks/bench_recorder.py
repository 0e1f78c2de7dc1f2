"""Recorder overhead on the marker-dense microbenchmark (run on the GPU machine).

    python benchmarks/bench_recorder.py [--iters N] [--chain C] [--json out.json]

Times the same kernel plain and with each recorder variant (CUDA events around each launch,
median of --reps launches after warm-up; the chase table is L2-resident by design), and
reports overhead %, added cycles per event per warp, and added issue slots per event
(cycles per event / warps per scheduler: what an issue-bound kernel pays). IKET is timed by
benchmarks/iket_workload.py under NVIDIA's run-iket (it cannot run in the same process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np


def call(fn, out, table, trace, n_ctas, iters, chain):
    fn(out, table, trace, n_ctas, iters, chain)


def time_variant(variant, work, n_ctas, iters, chain, reps, capacity_factor=1.0):
    import torch

    from fa4trace import layout as L
    from fa4trace.kernel_loader import get_kernel
    from fa4trace.record import marker_inputs

    fn, how = get_kernel("markers", variant=variant, work=work)
    out, table = marker_inputs(n_ctas)
    trace = None
    if variant.startswith("fa4trace"):
        spec = L.BufferSpec.for_grid(n_ctas, 8, int(2 * iters * capacity_factor) + 8)
        trace = torch.from_numpy(spec.new_buffer().view(np.int64)).cuda()
    for _ in range(3):
        call(fn, out, table, trace, n_ctas, iters, chain)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call(fn, out, table, trace, n_ctas, iters, chain)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)  # µs
    return statistics.median(times), min(times), max(times), how


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-ctas", type=int, default=1056)
    ap.add_argument("--iters", type=int, default=1600)
    ap.add_argument("--config", nargs="+", default=["l2:1", "l2:2", "smem:3", "smem:10"],
                    help="work:chain pairs (work l2 = latency-bound, smem = issue-bound)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--clock-ghz", type=float, default=None, help="SM clock for cycle counts (default: measured by the calibration kernel if available, else 1.98)")
    args = ap.parse_args(argv)
    import torch

    ghz = args.clock_ghz or 1.98
    rows = []
    for cfg in args.config:
        work, chain = cfg.split(":")[0], int(cfg.split(":")[1])
        base = None
        for v in ("plain", "fa4trace", "fa4trace_block", "fa4trace_lane", "fa4trace_gt", "iket"):
            med, lo, hi, how = time_variant(v, work, args.n_ctas, args.iters, chain, args.reps)
            if v == "plain":
                base = med
            events_per_warp = 2 * args.iters
            row = {"work": work, "chain": chain, "variant": v if v != "iket" else "iket (placeholders, no run-iket)",
                   "median_us": med, "min_us": lo, "max_us": hi,
                   "overhead_pct": 100 * (med - base) / base,
                   "added_cycles_per_event": (med - base) * 1e3 * ghz / events_per_warp,
                   "added_issue_slots_per_event": (med - base) * 1e3 * ghz / events_per_warp / 16,
                   "plain_cycles_per_iteration": base * 1e3 * ghz / args.iters, "how": how}
            rows.append(row)
    print(f"device: {torch.cuda.get_device_name(0)}; n_ctas={args.n_ctas} x 8 warps, iters={args.iters}")
    print(f"{'work':>4} {'chain':>5} {'variant':34s} {'median µs':>10} {'overhead':>9} {'cyc/event':>9} {'slots/ev':>8} {'cyc/iter(plain)':>15}")
    for r in rows:
        print(f"{r['work']:>4} {r['chain']:>5} {r['variant']:34s} {r['median_us']:10.1f} {r['overhead_pct']:8.1f}% "
              f"{r['added_cycles_per_event']:9.1f} {r['added_issue_slots_per_event']:8.2f} {r['plain_cycles_per_iteration']:15.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
