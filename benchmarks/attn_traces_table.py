"""Markdown table of the decode-attention bundles in traces/ (for traces/README.md).

    python benchmarks/attn_traces_table.py [traces/decode_*.parquet ...] \
        [--bench benchmarks/results/decode_h200.json]

Numbers come from fa4trace.analysis.overlap.summarize (the same as `fa4trace summary`); the time of the
uninstrumented kernel at the same shape comes from a `fa4trace bench` result file (cold L2)
when one is given. A table for a README, not a measurement: no JSON output.
"""

import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundles", nargs="*")
    ap.add_argument("--bench", default=None, help="a `fa4trace bench` result file (bench.json): cold-L2 kernel times")
    args = ap.parse_args(argv)
    from fa4trace.analysis import overlap
    from fa4trace.trace import bundle

    paths = args.bundles or sorted(glob.glob("traces/decode_*.parquet"))
    bench = {}
    if args.bench:
        for r in json.load(open(args.bench))["rows"]:
            bench[(r["d"], r["hq"], r["hkv"], r["sk"], r["b"], r["sq"], r["kernel"])] = r["us"]
    head = ["bundle", "shape (d, hq:hkv, sk, b)", "schedule", "kernel µs (bench, cold L2)", "trace span µs",
            "QK∥SOFTMAX", "PV∥SOFTMAX", "tensor core busy", "SOFTMAX / QK / PV median ns", "block period ns",
            "KV blocks per CTA", "rows", "MB"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for p in paths:
        tr = bundle.load(p)
        s = overlap.summarize(tr)
        c = tr.meta["config"]
        key = (c["head_dim"], c["hq"], c["hkv"], c["sk"], c["b"], c.get("sq", 1), c["schedule"])
        us = bench.get(key)
        med = s["median_ns"]
        kb = s["kv_blocks_per_cta"]

        def pct(x):
            return "-" if x is None else f"{100 * x:.0f}%"

        print("| " + " | ".join([
            f"`{os.path.basename(p)}`",
            f"d{c['head_dim']}, {c['hq']}:{c['hkv']}, {c['sk']}, {c['b']}",
            c["schedule"],
            f"{us:.1f}" if us else "-",
            f"{s['kernel_span_ns'] / 1e3:.1f}",
            pct(s["qk_softmax_overlap"]), pct(s["pv_softmax_overlap"]), pct(s["tensor_core_busy"]),
            f"{med.get('softmax', 0):.0f} / {med.get('qk', 0):.0f} / {med.get('pv', 0):.0f}",
            f"{s['period_ns']:.0f} ({c['tile_n']} keys)",
            f"{kb['min']}-{kb['max']}" if kb else "-",
            str(s["rows"]), f"{os.path.getsize(p) / 1e6:.2f}",
        ]) + " |")


if __name__ == "__main__":
    main()
