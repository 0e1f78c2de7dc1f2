"""FlashAttention-4's SM90 forward on an H100/H200, traced by fa4trace hooks: correctness,
tracing cost, bundles.

    python -m fa4trace.fa4.buildtool -o build/fa4_sm90            # any machine with the DSL
    python benchmarks/fa4_sm90_device.py [--build build/fa4_sm90] [--out DIR] [--json out.json]

Per shape: FA4's untraced output against an fp32 reference; where the build holds a traced
kernel, its output equals the untraced one bit for bit (outputs poisoned with NaN first) and
its buffer decodes. Then FA4's time per shape and the tracing cost of every traced variant of
the build, timed like ``fa4trace bench`` (``fa4trace.run.timing``: CUDA-graph replay, cold
L2), and one bundle per variant "default" / "generic" through ``fa4trace.fa4.record`` (what
``fa4trace record --impl fa4`` calls). ``--json`` writes the "fa4-sm90" area of BENCHMARKS.md;
the log and the bundles go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

CHECK_SHAPES = [(128, 16, 1, 32768, 1), (128, 16, 1, 4096, 4), (128, 16, 1, 131072, 1),
                (128, 16, 2, 32768, 2), (64, 16, 1, 32768, 1), (64, 16, 2, 131072, 1)]  # (d, hq, hkv, sk, b)
VARIANT_ORDER = ["default", "generic", "gmem", "consumer", "consumer_gmem", "producer", "life"]  # table columns
COST_SHAPES = [(128, 16, 1, 32768, 1), (128, 16, 1, 131072, 1), (128, 16, 1, 4096, 4)]


def load(build, d, hq, hkv, traced, variant="default"):
    """The FA4 SM90 kernel of the build (``fa4trace.run.loader``): (fn, runtime parameter names, config)."""
    from fa4trace.run import loader

    kern = loader.load("fa4", build=build, arch="sm90", schedule="fa3", d=d, hq=hq, hkv=hkv, sq=1, dtype="bf16",
                       traced=traced, variant=variant)
    return kern.fn, kern.config["params"], kern.config


def trace_tensor(n_ctas, config, sk):
    import numpy as np
    import torch

    from fa4trace.fa4.run import capacity_for
    from fa4trace.format.layout import BufferSpec

    spec = BufferSpec.for_grid(n_ctas, config["warps_per_cta"],
                               capacity_for("sm90", sk, generic=bool(config.get("families"))))
    return torch.from_numpy(spec.new_buffer().view(np.int64)).cuda()


def check_shape(build, d, hq, hkv, sk, b, seed) -> dict:
    """Untraced vs fp32, traced vs untraced (bitwise), the decoded buffer."""
    import torch

    from fa4trace.attention import reference, rel_error
    from fa4trace.fa4.run import call_args
    from fa4trace.trace.decode import decode_buffer

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    scale = 1.0 / math.sqrt(d)
    fn, params, _ = load(build, d, hq, hkv, False)
    o_plain = torch.full_like(q, float("nan"))
    fn(*call_args(params, q=q, k=k, v=v, out=o_plain, softmax_scale=scale))
    torch.cuda.synchronize()
    row = {"d": d, "hq": hq, "hkv": hkv, "sk": sk, "b": b, "sq": 1,
           "rel_err": float(f"{rel_error(o_plain, reference(q, k, v)[0]):.3g}")}
    try:
        fn, params, config = load(build, d, hq, hkv, True)
    except Exception as exc:  # noqa: BLE001 - no traced kernel of this shape in the build: untraced only
        row["traced"] = f"not built ({str(exc)[:120]})"
        return row
    buf = trace_tensor(b * hkv, config, sk)
    o_tr = torch.full_like(q, float("nan"))
    fn(*call_args(params, q=q, k=k, v=v, out=o_tr, softmax_scale=scale, trace=buf))
    torch.cuda.synchronize()
    dec = decode_buffer(buf.cpu().numpy(), grid_ctas=b * hkv)
    row.update(bitwise_equal=bool(torch.equal(o_tr, o_plain)), decoded_rows=dec.table.num_rows,
               dropped=dec.summary.get("dropped"))
    return row


def time_shape(build, d, hq, hkv, sk, b, variants, replays) -> dict:
    """FA4 untraced and each traced variant, cold L2 (the input sets of ``fa4trace bench``)."""
    import torch

    from fa4trace.attention import Shape
    from fa4trace.fa4.run import call_args
    from fa4trace.run.timing import cold_l2_inputs
    from fa4trace.run.timing import graph_time

    shape = Shape(b, 1, hq, hkv, sk, d, "bf16")
    sets, per_graph = cold_l2_inputs(shape)
    scale = 1.0 / math.sqrt(d)

    def timed(fn, params, trace=None):
        args = [call_args(params, q=q, k=k, v=v, out=o, softmax_scale=scale, trace=trace) for q, k, v, o in sets]
        return graph_time(lambda i: fn(*args[i]), len(sets), replays, per_graph)[0]

    fn, params, _ = load(build, d, hq, hkv, False)
    plain = timed(fn, params)
    row = {"d": d, "hq": hq, "hkv": hkv, "sk": sk, "b": b, "sq": 1, "fa4_us": round(plain, 2),
           "tbps": round(shape.io_bytes() / plain / 1e6, 2)}
    for var in variants:
        try:
            fn, params, config = load(build, d, hq, hkv, True, var)
        except Exception:  # noqa: BLE001 - this variant is not built for this shape
            continue
        us = timed(fn, params, trace_tensor(b * hkv, config, sk))
        row[f"{var}_pct"] = round(100 * (us / plain - 1), 1)
    sets.clear()
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=None, help="FA4 AOT build folder (default $FA4TRACE_FA4_BUILD or build/fa4_sm90)")
    ap.add_argument("--out", default=os.environ.get("OUT", "artifacts/fa4_sm90"), help="folder for log.txt and bundles")
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--json", help="write the 'fa4-sm90' result file here")
    args = ap.parse_args(argv)

    from fa4trace.bench.results import envelope, gpu_name, write
    from fa4trace.fa4.run import record
    from fa4trace.run import loader

    build = loader.build_dir(args.build, "fa4")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logf = open(out / "log.txt", "w")

    def log(*a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        logf.write(s + "\n")
        logf.flush()

    log(gpu_name(), "build", build)
    functions = loader.open_build(build).functions
    built = {f["config"].get("variant", "default") for f in functions.values() if f["config"]["traced"]}
    variants = [v for v in VARIANT_ORDER if v in built] + sorted(built - set(VARIANT_ORDER))
    checks, errors = [], []
    for i, shape in enumerate(CHECK_SHAPES):
        t = time.time()
        try:
            row = check_shape(build, *shape, seed=100 + i)
        except Exception:  # noqa: BLE001 - reported; the other shapes still run
            row = {"shape": list(shape), "error": traceback.format_exc()[-1500:]}
            errors.append(row)
        log("check", json.dumps(row, default=str), f"({time.time() - t:.1f} s)")
        checks.append(row)
    rows = []
    for shape in CHECK_SHAPES:
        try:
            row = time_shape(build, *shape, variants if shape in COST_SHAPES else [], args.replays)
        except Exception:  # noqa: BLE001
            errors.append({"shape": list(shape), "error": traceback.format_exc()[-1500:]})
            log("time", shape, errors[-1]["error"])
            continue
        chk = next((c for c in checks if [c.get(x) for x in ("d", "hq", "hkv", "sk", "b")] == list(shape)), {})
        row.update({k: chk[k] for k in ("rel_err", "bitwise_equal") if k in chk})
        log("time", json.dumps(row))
        rows.append(row)
    bundles = []
    for var in ("default", "generic"):
        if var not in variants:
            continue
        try:
            trace = record(schedule="pingpong", d=128, hq=16, hkv=1, sk=32768, b=1, build=build, variant=var)
            p = trace.save(out / f"fa4_sm90_d128_h16kv1_sk32768_b1{'' if var == 'default' else '_' + var}.parquet",
                           overwrite=True)
            bundles.append({"file": p.name, "bytes": p.stat().st_size, "rows": len(trace),
                            "check": trace.meta.get("check"), "dropped": trace.meta.get("total_dropped")})
            log("bundle", json.dumps(bundles[-1]))
        except Exception:  # noqa: BLE001
            errors.append({"bundle": var, "error": traceback.format_exc()[-1500:]})
            log("bundle", var, errors[-1]["error"])
    if args.json:
        cols = [("shape", "shape"), ("fa4_us", "FA4 µs"), ("rel_err", "rel err"),
                ("bitwise_equal", "bit-equal")] + [(f"{v}_pct", f"{v} %") for v in variants]
        doc = envelope("fa4-sm90", "FA4's SM90 forward traced through hooks", rows, columns=cols,
                       notes="Cost % per traced build: default = FA4's events, every warp, cursor in shared memory; "
                             "generic = + every generic family; gmem = global cursor; consumer / producer = one role's "
                             "events; life = warp lifetimes. CUDA-graph replay, cold L2.",
                       checks=checks, bundles=bundles, errors=errors)
        log("wrote", write(args.json, doc))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
