"""The marker microbenchmark's IKET variant, to run under NVIDIA's run-iket:

    python3 -m iket.cli.main --output-dir /tmp/iket profile --postprocess none -- \
        python3 benchmarks/iket_workload.py --work l2 --chain 1 --iters 1600 | tee -a iket.log
    python benchmarks/bench_recorder.py --iket iket.log --json benchmarks/results/markers_iket_h200.json

Prints one IKET_WORKLOAD line with the median µs of ``--reps`` launches (run-iket runs the
workload twice: sizing, then real; bench_recorder.py keeps the last line per config). Timed as
bench_recorder.py times (CUDA events around single launches), so the numbers compare directly.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-ctas", type=int, default=1056)
    ap.add_argument("--iters", type=int, default=1600)
    ap.add_argument("--chain", type=int, default=1)
    ap.add_argument("--work", default="l2", choices=["l2", "smem"])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--variant", default="iket")
    args = ap.parse_args(argv)

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_recorder.py")
    spec = importlib.util.spec_from_file_location("bench_recorder", here)
    recorder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recorder)

    from fa4trace.probes.markers import marker_inputs
    from fa4trace.run import loader

    kern = loader.load("markers", variant=args.variant, work=args.work)
    out, table = marker_inputs(args.n_ctas)
    med, lo, _ = recorder.event_time(kern.fn, (out, table, None, args.n_ctas, args.iters, args.chain), args.reps)
    print(f"IKET_WORKLOAD variant={args.variant} median_us={med:.2f} min_us={lo:.2f} "
          f"work={args.work} chain={args.chain} iters={args.iters}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
