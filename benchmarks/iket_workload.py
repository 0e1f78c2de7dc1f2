"""The marker microbenchmark's IKET variant, to run under NVIDIA's run-iket:

    python3 -m iket.cli.main --output-dir /tmp/iket profile --postprocess none -- \
        python3 benchmarks/iket_workload.py --work l2 --chain 1 --iters 1600

Prints one line per timed launch (µs); run-iket runs the workload twice (sizing, then real).
"""

from __future__ import annotations

import argparse
import statistics
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-ctas", type=int, default=1056)
    ap.add_argument("--iters", type=int, default=1600)
    ap.add_argument("--chain", type=int, default=1)
    ap.add_argument("--work", default="l2", choices=["l2", "smem"])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--variant", default="iket")
    args = ap.parse_args()
    import torch

    from fa4trace.kernel_loader import get_kernel
    from fa4trace.record import marker_inputs

    fn, _ = get_kernel("markers", variant=args.variant, work=args.work)
    out, table = marker_inputs(args.n_ctas)
    fn(out, table, None, args.n_ctas, args.iters, args.chain)
    torch.cuda.synchronize()
    times = []
    for _ in range(args.reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(out, table, None, args.n_ctas, args.iters, args.chain)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    print(f"IKET_WORKLOAD variant={args.variant} median_us={statistics.median(times):.2f} min_us={min(times):.2f} "
          f"work={args.work} chain={args.chain} iters={args.iters}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
