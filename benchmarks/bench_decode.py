"""Decode-attention benchmark on the H200: ours (base, pingpong, intrawg) vs cuDNN and FLASH SDPA.

    FA4TRACE_BUILD=build/attn python benchmarks/bench_decode.py [--quick] [--kernels ...] [--out DIR]

Method (METHOD.md of the device docs): CUDA-graph replay, L2 cold (input sets rotated, >= 256 MB
of KV per graph), median of >= 15 replays, one process, the same inputs for every kernel, the
output poisoned with NaN and checked against an fp32 reference before timing. bytes = Q + K +
V + O; TB/s and % of the 4.8 TB/s datasheet peak. At sk 131072, sq 1 the traced variants
(full event set) are timed too. Writes bench.json and bench.md to --out.
The driver is fa4trace.attention.bench_cli (also behind `fa4trace bench`).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__":
    from fa4trace.attention import bench_cli

    sys.exit(bench_cli())
