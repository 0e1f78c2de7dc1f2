"""Time the in-launch combine's plans against each other (run on the GPU machine).

    FA4TRACE_BUILD=build/kernels python benchmarks/combine_plans.py [--shapes d:hq:hkv:sk:b,...]
        [--schedule pingpong] [--rounds 5]

The combine's cut (combiner CTAs per group, float4 columns and split partitions per item) is
a runtime argument, chosen by ``fa4trace.attention.plan_splits``. This runs the same kernel
with every legal cut of the default split count: output checked against the float32
reference (its bits equal the default plan's only where the partitions, and so the merge
order, are the same), then timed as the benchmark times (CUDA-graph replay, L2 cold; the
median of the rounds but the first, ``attention.reported_us``; every round times every plan
again). For deciding whether the plan heuristic leaves time on the table at the short
shapes, where the combine is ~1.6 us of ~21.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def plans_for(A, shape, plan, num_sms):
    """Every cut the kernel accepts for this split count (``attention.combine_cuts``), each with
    the most combiners the deadlock rule allows and with half as many."""
    out = []
    for t_max, nc4, parts, n_items in A.combine_cuts(shape, plan.n_splits, plan.groups, num_sms, plan.block_rows):
        for t in sorted({min(t_max, n_items), min(t_max, max(1, n_items // 2))}):
            out.append(dataclasses.replace(plan, n_comb=t, comb_nc4=nc4, comb_parts=parts))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="128:16:1:131072:1,64:16:1:131072:1,128:16:2:131072:1,128:16:1:32768:1")
    ap.add_argument("--schedule", default="pingpong")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replays", type=int, default=15)
    args = ap.parse_args(argv)
    import torch

    from fa4trace import attention as A

    dev = torch.device("cuda")
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    print("| shape | n_comb | nc4 | parts | default | µs | vs default | rel err |")
    print("|---|---|---|---|---|---|---|---|")
    for item in args.shapes.split(","):
        d, hq, hkv, sk, b = (int(x) for x in item.split(":"))
        shape = A.Shape(b, 1, hq, hkv, sk, d, "bf16")
        sets, per_graph = A.cold_l2_inputs(shape, seed=1)
        q, k, v, _ = sets[0]
        kern, plan = A._resolve(shape, args.schedule, False, None, dev)
        plans = plans_for(A, shape, plan, num_sms)
        scale = 1.0 / math.sqrt(d)
        lse, o_part, lse_part, count = A.workspaces(shape, plan, dev)
        ref = A.reference(q, k, v)[0]
        errs = []
        for p in plans:
            o = torch.full_like(q, float("nan"))
            kern.fn(q, k, v, o, lse, o_part, lse_part, count, *p.kernel_args(scale), None)
            torch.cuda.synchronize()
            errs.append(A.rel_error(o, ref) if not torch.isnan(o).any() else float("nan"))
        times = {i: [] for i in range(len(plans))}
        for _ in range(args.rounds):
            for i, p in enumerate(plans):
                def launch(j, p=p):
                    qq, kk, vv, oo = sets[j]
                    kern.fn(qq, kk, vv, oo, lse, o_part, lse_part, count, *p.kernel_args(scale), None)
                times[i].append(A._graph_time(launch, len(sets), args.replays, per_graph)[0])
        us = [A.reported_us(ts) for ts in times.values()]  # as fa4trace bench reports its passes
        base = next(u for p, u in zip(plans, us) if p == plan)
        for p, u, e in zip(plans, us, errs):
            print(f"| d{d} {hq}:{hkv} sk{sk} b{b} | {p.n_comb} | {p.comb_nc4} | {p.comb_parts} | "
                  f"{'yes' if p == plan else ''} | {u:.2f} | {100 * (u / base - 1):+.1f}% | {e:.1e} |", flush=True)


if __name__ == "__main__":
    main()
