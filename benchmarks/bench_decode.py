"""Decode-attention benchmark on the H200: ours (base, pingpong) vs cuDNN and FLASH SDPA.

    FA4TRACE_BUILD=build/attn python benchmarks/bench_decode.py [--quick] [--kernels ...] [--out DIR]

Method (../shared/../METHOD.md): CUDA-graph replay, L2 cold (input sets rotated, >= 256 MB of
KV per graph), median of >= 15 replays, one process, the same inputs for every kernel, output
poisoned with NaN and checked against an fp32 reference before timing. bytes = Q + K + V + O;
TB/s and % of the 4.8 TB/s datasheet peak. Writes bench.json and bench.md to --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

DEFAULT_KERNELS = ["base", "pingpong", "cudnn", "flash"]


def run(shapes, kernels, *, replays=15, trace_overhead=True, log=print):
    from fa4trace import attention as A

    rows = []
    for i, shape in enumerate(shapes):
        ks = list(kernels)
        if trace_overhead and shape.sk == 131072 and shape.sq == 1:
            ks += ["base+trace", "pingpong+trace"]
        t = time.time()
        r = A.bench_shape(shape, ks, replays=replays, seed=i)
        rows += r
        cells = " ".join(f"{x.kernel}={x.us:.1f}" for x in r)
        log(f"[{i + 1}/{len(shapes)}] {_shape_str(shape)}: {cells} ({time.time() - t:.1f} s)")
    return rows


def _shape_str(s) -> str:
    return f"d{s.d} {s.hq}:{s.hkv} sk={s.sk} b={s.b} sq={s.sq}"


def to_json(rows) -> list[dict]:
    out = []
    for r in rows:
        out.append({"d": r.shape.d, "hq": r.shape.hq, "hkv": r.shape.hkv, "sk": r.shape.sk, "b": r.shape.b,
                    "sq": r.shape.sq, "dtype": r.shape.dtype, "kernel": r.kernel, "us": r.us,
                    "us_spread": r.us_spread, "tbps": r.tbps, "rel_err": r.rel_err, **r.extra})
    return out


def table(rows, peak=4.8) -> str:
    """One markdown row per shape; every kernel's µs (TB/s), pingpong's % of peak and ratios."""
    by_shape: dict = {}
    for r in rows:
        by_shape.setdefault(r.shape, {})[r.kernel] = r
    kernels = []
    for r in rows:
        if r.kernel not in kernels and "+trace" not in r.kernel:
            kernels.append(r.kernel)
    head = ["d", "hq:hkv", "sk", "b", "sq"] + [f"{k} µs (TB/s)" for k in kernels] + \
        ["pp % of 4.8", "pp vs base", "pp vs cuDNN", "trace ovh base/pp", "max rel err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape, ks in by_shape.items():
        cells = [str(shape.d), f"{shape.hq}:{shape.hkv}", str(shape.sk), str(shape.b), str(shape.sq)]
        for k in kernels:
            r = ks.get(k)
            cells.append("-" if r is None or r.us != r.us else f"{r.us:.1f} ({r.tbps:.2f})")
        pp, base, cud = ks.get("pingpong"), ks.get("base"), ks.get("cudnn")
        ok = lambda x: x is not None and x.us == x.us  # noqa: E731
        cells.append(f"{100 * pp.tbps / peak:.0f}%" if ok(pp) else "-")
        cells.append(f"{100 * (base.us / pp.us - 1):+.1f}%" if ok(pp) and ok(base) else "-")
        cells.append(f"{cud.us / pp.us:.2f}x" if ok(pp) and ok(cud) else "-")
        ov = []
        for s in ("base", "pingpong"):
            a, b = ks.get(s), ks.get(s + "+trace")
            ov.append(f"{100 * (b.us / a.us - 1):+.1f}%" if ok(a) and ok(b) else "-")
        cells.append(" / ".join(ov))
        errs = [r.rel_err for r in ks.values() if r.rel_err == r.rel_err]
        cells.append(f"{max(errs):.1e}" if errs else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sk 131072 shapes only")
    ap.add_argument("--kernels", default=",".join(DEFAULT_KERNELS),
                    help="comma list: base, pingpong, base@n64, pingpong@n128, cudnn, flash")
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--no-trace-overhead", action="store_true")
    ap.add_argument("--only", default="", help="filter, e.g. 'd=128,hkv=1,sk=131072'")
    ap.add_argument("--out", default=os.environ.get("OUT", "artifacts/bench"))
    args = ap.parse_args(argv)
    import torch

    from fa4trace import attention as A
    from fa4trace.gpu import gpu_facts

    shapes = A.bench_matrix(quick=args.quick)
    for cond in filter(None, args.only.split(",")):
        key, val = cond.split("=")
        shapes = [s for s in shapes if str(getattr(s, key)) == val]
    dev = gpu_facts(0)
    print(f"{dev} {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}", flush=True)
    rows = run(shapes, args.kernels.split(","), replays=args.replays,
               trace_overhead=not args.no_trace_overhead, log=lambda m: print(m, flush=True))
    md = table(rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump({"device": dev, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                   "command": " ".join(sys.argv), "torch": torch.__version__, "rows": to_json(rows)}, f, indent=1)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
