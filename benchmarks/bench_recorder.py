"""Recorder overhead on the marker-dense microbenchmark (2 events per iteration per warp).

    python benchmarks/bench_recorder.py [--config l2:1 smem:3 ...] [--iket iket.log] [--json out.json]

Times the marker kernel plain and with each recorder variant (``kernels/markers.py``), and
reports the overhead, the added cycles per event per warp, and the added issue slots per event
(cycles per event / warps per scheduler: what an issue-bound kernel pays). ``--json`` writes the
"markers" area of BENCHMARKS.md.

Timing: CUDA events around single launches, ``--reps`` per variant per round, the variants in
turn within each of ``--rounds`` rounds, the median of the rounds' medians; not ``fa4trace.run.timing``:
one launch runs for milliseconds (launch cost is noise), the pointer-chase table is L2-resident
by design (a cold L2 would measure DRAM, not the recorder), and IKET's timings
(``benchmarks/iket_workload.py`` under NVIDIA's run-iket, in its own process; ``--iket`` reads
its lines) are taken the same way, so the two compare directly.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys

VARIANTS = ("plain", "fa4trace", "fa4trace_block", "fa4trace_lane", "fa4trace_gt", "fa4trace_smem",
            "fa4trace_smem_block", "iket")
# variant -> (row key, column header) of the JSON rows
COLUMN = {"fa4trace": ("staged_pct", "fa4trace staged %"), "fa4trace_block": ("block_pct", "fa4trace_block %"),
          "fa4trace_smem": ("smem_pct", "fa4trace smem-staged %"),
          "fa4trace_smem_block": ("smem_block_pct", "fa4trace smem-staged, blocks %"),
          "fa4trace_lane": ("lane0_pct", "fa4trace lane-0 stores %"),
          "fa4trace_gt": ("globaltimer_pct", "fa4trace globaltimer %"),
          "iket": ("iket_placeholders_pct", "IKET placeholders only %")}
WARPS_PER_SCHEDULER = 16  # 8 warps per CTA, 8 CTAs per SM, 4 schedulers


def event_time(fn, args, reps: int):
    """(median, min, max) µs of ``fn(*args)`` over ``reps`` launches after 3 warm-up launches."""
    import torch

    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(*args)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times), min(times), max(times)


def variant_launch(variant: str, work: str, n_ctas: int, iters: int, chain: int):
    """(kernel, its arguments, how it was loaded) of one variant, with a trace buffer that holds
    every record where the variant records."""
    import numpy as np
    import torch

    from fa4trace.format.layout import BufferSpec
    from fa4trace.probes.markers import MARKER_WARPS, marker_inputs
    from fa4trace.run import loader

    kern = loader.load("markers", variant=variant, work=work)
    out, table = marker_inputs(n_ctas)
    trace = None
    if variant.startswith("fa4trace"):
        spec = BufferSpec.for_grid(n_ctas, MARKER_WARPS, 2 * iters + 8)
        trace = torch.from_numpy(spec.new_buffer().view(np.int64)).cuda()
    return kern.fn, (out, table, trace, n_ctas, iters, chain), kern.how


def time_variants(work: str, n_ctas: int, iters: int, chain: int, reps: int, rounds: int):
    """{variant: (median, min, max µs, how)}: every variant timed ``reps`` launches per round,
    the variants in turn within each round (interleaved: clock or thermal drift over the run
    falls on all of them alike); the median of the rounds' medians."""
    import statistics

    launches = {v: variant_launch(v, work, n_ctas, iters, chain) for v in VARIANTS}
    per = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        for v, (fn, args, _how) in launches.items():
            per[v].append(event_time(fn, args, reps))
    return {v: (statistics.median(m for m, _, _ in per[v]), min(lo for _, lo, _ in per[v]),
                max(hi for _, _, hi in per[v]), launches[v][2]) for v in VARIANTS}


def read_iket(path: str) -> dict:
    """{(work, chain): median µs} from iket_workload.py's IKET_WORKLOAD lines (the last per config)."""
    found = {}
    for line in open(path):
        m = re.search(r"IKET_WORKLOAD .*median_us=([\d.]+).*work=(\w+) chain=(\d+)", line)
        if m:
            found[(m.group(2), int(m.group(3)))] = float(m.group(1))
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-ctas", type=int, default=1056)
    ap.add_argument("--iters", type=int, default=1600)
    ap.add_argument("--config", nargs="+", default=["l2:1", "l2:2", "smem:3", "smem:10"],
                    help="work:chain pairs (work l2 = latency-bound, smem = issue-bound)")
    ap.add_argument("--reps", type=int, default=10, help="launches per variant per round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (every variant once per round)")
    ap.add_argument("--clock-ghz", type=float, default=1.98, help="SM clock under load, for cycle counts")
    ap.add_argument("--iket", help="log of iket_workload.py runs under run-iket: adds the IKET column")
    ap.add_argument("--json", help="write the 'markers' result file here")
    args = ap.parse_args(argv)

    from fa4trace.bench.results import envelope, gpu_name, write

    ghz = args.clock_ghz
    iket = read_iket(args.iket) if args.iket else {}
    rows, detail = [], []
    for cfg in args.config:
        work, chain = cfg.split(":")[0], int(cfg.split(":")[1])
        row = {"work": cfg}
        timed = time_variants(work, args.n_ctas, args.iters, chain, args.reps, args.rounds)
        base = timed["plain"][0]
        for v in VARIANTS:
            med, lo, hi, how = timed[v]
            added_cycles = (med - base) * 1e3 * ghz / (2 * args.iters)
            detail.append({"work": work, "chain": chain, "variant": v, "median_us": med, "min_us": lo, "max_us": hi,
                           "overhead_pct": 100 * (med - base) / base, "added_cycles_per_event": added_cycles,
                           "added_issue_slots_per_event": added_cycles / WARPS_PER_SCHEDULER, "how": how})
            if v == "plain":
                row["plain_us"] = round(med, 1)
                row["cycles_per_iter"] = round(med * 1e3 * ghz / args.iters)
            else:
                row[COLUMN[v][0]] = round(100 * (med - base) / base, 1)
        if (work, chain) in iket:
            row["iket_pct"] = round(100 * (iket[(work, chain)] / row["plain_us"] - 1), 1)
        rows.append(row)

    print(f"{gpu_name()}; {args.n_ctas} CTAs x 8 warps, {args.iters} iterations")
    print(f"{'work':>4} {'chain':>5} {'variant':16s} {'median µs':>10} {'overhead':>9} {'cyc/event':>9} {'slots/ev':>8}")
    for r in detail:
        print(f"{r['work']:>4} {r['chain']:>5} {r['variant']:16s} {r['median_us']:10.1f} {r['overhead_pct']:8.1f}% "
              f"{r['added_cycles_per_event']:9.1f} {r['added_issue_slots_per_event']:8.2f}")
    if args.json:
        cols = [("work", "work:chain"), ("plain_us", "plain µs"), ("cycles_per_iter", "cycles/iter")] + \
            [COLUMN[v] for v in VARIANTS[1:]] + ([("iket_pct", "IKET under run-iket %")] if iket else [])
        doc = envelope("markers", "Recorder overhead: marker-dense microbenchmark, ours vs IKET", rows,
                       columns=cols, notes=f"{args.n_ctas} CTAs x 8 warps, {args.iters} iterations, 2 events per "
                       f"iteration per warp; CUDA events around single launches, {args.reps} per variant per round, "
                       f"{args.rounds} interleaved rounds, the median of the rounds' medians; cycles at "
                       f"{ghz} GHz.", variants=detail)
        print(f"wrote {write(args.json, doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
