"""Where the decode-attention tracing overhead goes (run on the GPU machine).

    python benchmarks/trace_cost.py [--shapes d:hq:hkv:sk:b,...] [--schedule pingpong] [--json out.json]

One traced kernel, several recorder buffers that select who stores records (the kernel reads
the selection from the buffer header, so the instructions executed are the same in all of them):

- ``plain``      the uninstrumented kernel (the reference);
- ``all``        every warp of every CTA records (what ``fa4trace bench`` calls ``+trace``);
- ``consumers``  only warps 0-3 (the consumer warpgroup) record, the producer warp does not;
- ``cap32``      every warp records its first 32 records, then drops the rest (bounds check):
                 headers and one flush per warp, no mainloop record traffic;
- ``first``      only CTA 0 records (``+trace1``: the recorder's instruction cost);
- ``all2x``, ``all+32``  as ``all`` with twice / 32 more records of room per warp (the same
                 stores at other addresses: does the slot stride matter?).

Timing as in the benchmark: CUDA-graph replay, L2 cold (KV sets rotated, >= 256 MB), median of
``--replays``; all buffers on the same inputs, in one process. Prints a table; ``--json`` keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

VARIANTS = ("plain", "all", "consumers", "cap32", "first", "all2x", "all+32")


def buffer_for(variant, plan, device):
    import numpy as np
    import torch

    from fa4trace import attention as A
    from fa4trace.layout import BufferSpec

    cap = A.trace_capacity(plan)
    warps = A.WARPS_PER_CTA
    if variant == "all":
        spec = BufferSpec.for_grid(plan.n_ctas, warps, cap)
    elif variant == "consumers":
        spec = BufferSpec.for_grid(plan.n_ctas, warps - 1, cap)  # the producer is the last warp
    elif variant == "cap32":
        spec = BufferSpec.for_grid(plan.n_ctas, warps, 32)
    elif variant == "all2x":
        spec = BufferSpec.for_grid(plan.n_ctas, warps, 2 * cap)
    elif variant == "all+32":
        spec = BufferSpec.for_grid(plan.n_ctas, warps, cap + 32)
    elif variant == "first":
        spec = BufferSpec.for_grid(plan.n_ctas, warps, cap, max_ctas=1)
    else:
        raise ValueError(variant)
    return torch.from_numpy(spec.new_buffer().view(np.int64)).to(device)


def run_shape(d, hq, hkv, sk, b, schedule, replays):
    import torch

    from fa4trace import attention as A

    shape = A.Shape(b, 1, hq, hkv, sk, d, "bf16")
    g = torch.Generator(device="cuda").manual_seed(0)
    n_sets = max(1, min(64, -(-A.L2_ROTATE_BYTES // shape.kv_bytes())))
    per_graph = max(n_sets, 4 if shape.kv_bytes() >= A.L2_ROTATE_BYTES else 2 * n_sets)
    sets = []
    for _ in range(n_sets):
        q = torch.randn(b, 1, hq, d, dtype=torch.bfloat16, device="cuda", generator=g)
        k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda", generator=g)
        v = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda", generator=g)
        sets.append((q, k, v, torch.empty_like(q)))
    _, plan = A._resolve(shape, schedule, True, None, sets[0][0].device)
    row = {"shape": f"d{d} {hq}:{hkv} sk{sk} b{b}", "schedule": schedule, "ctas": plan.n_ctas}
    for variant in VARIANTS:
        buf = None if variant == "plain" else buffer_for(variant, plan, "cuda")

        def launch(i, buf=buf):
            q, k, v, o = sets[i]
            return A.decode_attention(q, k, v, schedule=schedule, out=o, trace=buf)

        us, spread = A._graph_time(launch, n_sets, replays, per_graph)
        row[variant] = round(us, 2)
        row[variant + "_spread"] = round(spread, 2)
    sets.clear()
    torch.cuda.empty_cache()
    return row


def launch_once(spec, schedule, variants):
    import torch

    from fa4trace import attention as A

    d, hq, hkv, sk, b = (int(x) for x in spec.split(":"))
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, 1, hq, d, dtype=torch.bfloat16, device="cuda", generator=g)
    k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda", generator=g)
    v = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda", generator=g)
    _, plan = A._resolve(A.validate(q, k, v), schedule, True, None, q.device)
    for variant in variants:
        buf = None if variant == "plain" else buffer_for(variant, plan, "cuda")
        print(f"launch {variant} {spec} {schedule}", flush=True)
        A.decode_attention(q, k, v, schedule=schedule, trace=buf)
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="128:16:1:131072:1,128:16:1:131072:8,128:16:2:131072:8,"
                                        "64:16:1:131072:1,64:16:1:131072:8")
    ap.add_argument("--schedule", default="pingpong")
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--json")
    ap.add_argument("--once", help="comma list of variants: one launch each at the first shape "
                                   "(for ncu), no timing")
    args = ap.parse_args()
    if args.once:
        return launch_once(args.shapes.split(",")[0], args.schedule, args.once.split(","))
    rows = []
    head = "| shape | " + " | ".join(VARIANTS) + " | " + " | ".join(f"{v} ovh" for v in VARIANTS[1:]) + " |"
    print(head, flush=True)
    for spec in args.shapes.split(","):
        d, hq, hkv, sk, b = (int(x) for x in spec.split(":"))
        for sched in args.schedule.split(","):
            r = run_shape(d, hq, hkv, sk, b, sched, args.replays)
            rows.append(r)
            ovh = [f"{100 * (r[v] / r['plain'] - 1):+.1f}%" for v in VARIANTS[1:]]
            print(f"| {r['shape']} {sched} | " + " | ".join(f"{r[v]:.1f}" for v in VARIANTS) + " | "
                  + " | ".join(ovh) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
