"""Hardware counters of our decode attention next to cuDNN's, for a few shapes (run under ncu).

    ncu --clock-control none --cache-control all --csv --metrics <list> \
        --kernel-name regex:'kernel_cutlass|sdpa|fmha|cudnn' python3 benchmarks/attn_ncu.py \
        --shapes 64:16:1:131072:8,128:16:1:131072:1

Each shape runs ours (``--kernels``, default pingpong) and cuDNN SDPA on the same inputs, twice
each (ncu flushes L2 before every profiled kernel: cold L2, as in the benchmark). The NVTX-free
way to tell the launches apart afterwards: they come in the order printed here on stdout.
What to read: DRAM bytes read against the bytes the problem needs (Q + K + V), DRAM throughput,
grid and block of each kernel. Counters, not times: no JSON output (times come from
``fa4trace bench``).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="64:16:1:131072:8,128:16:1:131072:1",
                    help="d:hq:hkv:sk:b,... (sq 1, bf16)")
    ap.add_argument("--kernels", default="pingpong", help="ours: comma list of schedules")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fa4trace.attention import decode_attention, validate

    for spec in args.shapes.split(","):
        d, hq, hkv, sk, b = (int(x) for x in spec.split(":"))
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, 1, hq, d, dtype=torch.bfloat16, device="cuda", generator=g)
        k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda", generator=g)
        v = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda", generator=g)
        need = validate(q, k, v).io_bytes()
        for sched in args.kernels.split(","):
            for _ in range(args.repeat):
                print(f"launch ours:{sched} d{d} {hq}:{hkv} sk{sk} b{b} io_bytes={need}", flush=True)
                decode_attention(q, k, v, schedule=sched)
                torch.cuda.synchronize()
        for _ in range(args.repeat):
            print(f"launch cudnn d{d} {hq}:{hkv} sk{sk} b{b} io_bytes={need}", flush=True)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               enable_gqa=True)
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
