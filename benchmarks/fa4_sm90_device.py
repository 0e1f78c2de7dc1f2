"""FA4's SM90 forward on the H200, traced by fa4trace hooks: correctness, overhead, a bundle.

Run on the device machine (the kernels were built here on the CPU machine with
``python -m fa4trace.fa4.buildtool -o build/fa4_sm90``; carry ``.devkit`` and ``build/fa4_sm90``):

    source .devkit/device-env.sh && PYTHONPATH=. PYTHONUNBUFFERED=1 python3 benchmarks/fa4_sm90_device.py

Checks, per shape: the traced kernel's output equals FA4's untraced output bit for bit (fresh
random inputs, outputs poisoned with NaN first), both are within bf16 error of an fp32
reference, and the trace buffer decodes. Then times plain vs traced (CUDA events, median) and
records one bundle. Everything is written under $OUT (log.txt, results.json, the bundle).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

OUT = Path(os.environ.get("OUT", "out"))
OUT.mkdir(parents=True, exist_ok=True)
LOG = open(OUT / "log.txt", "w")
BUILD = Path(os.environ.get("FA4TRACE_FA4_BUILD", "build/fa4_sm90"))
RESULTS: dict = {"checks": [], "timing": [], "errors": []}


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.write(s + "\n")
    LOG.flush()


def save():
    (OUT / "results.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def ref_attention(q, k, v):
    import torch

    b, sq, hq, d = q.shape
    hkv = k.shape[2]
    qf = q.float().permute(0, 2, 1, 3)  # b hq sq d
    kf = k.float().permute(0, 2, 1, 3).repeat_interleave(hq // hkv, dim=1)
    vf = v.float().permute(0, 2, 1, 3).repeat_interleave(hq // hkv, dim=1)
    s = torch.matmul(qf, kf.transpose(-1, -2)) / math.sqrt(d)
    o = torch.matmul(torch.softmax(s, dim=-1), vf)
    return o.permute(0, 2, 1, 3)


def bench(fn, iters=30, warmup=5):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    return times[len(times) // 2], times[0], times[-1]


def check_shape(d, hq, hkv, sk, b, seed):
    import numpy as np
    import torch

    from fa4trace import layout as L
    from fa4trace.decode import decode_buffer
    from fa4trace.fa4.run import call_args, capacity_for, load_fn

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    scale = 1.0 / math.sqrt(d)
    kplain = load_fn("sm90", schedule="fa3", d=d, hq=hq, hkv=hkv, sq=1, dtype="bf16", traced=False, build=BUILD)
    plain, pp = kplain.fn, kplain.params
    o_plain = torch.full_like(q, float("nan"))
    plain(*call_args(pp, q=q, k=k, v=v, out=o_plain, softmax_scale=scale))
    torch.cuda.synchronize()
    ref = ref_attention(q, k, v)
    rel_plain = float((o_plain.float() - ref).norm() / ref.norm())
    row = {"d": d, "hq": hq, "hkv": hkv, "sk": sk, "b": b, "rel_err_plain_vs_fp32": rel_plain,
           "plain_nan": bool(torch.isnan(o_plain).any())}
    try:
        ktraced = load_fn("sm90", schedule="fa3", d=d, hq=hq, hkv=hkv, sq=1, dtype="bf16", traced=True,
                          build=BUILD)
        traced, tp, tcfg = ktraced.fn, ktraced.params, ktraced.config
    except Exception as e:  # no traced build of this shape: plain only
        row["traced"] = f"not built ({e})"
        return row, plain, pp, None, None, (q, k, v)
    tiles = b * hkv
    spec = L.BufferSpec.for_grid(tiles, tcfg["warps_per_cta"], capacity_for("sm90", sk))
    buf = torch.from_numpy(spec.new_buffer().view(np.int64)).cuda()
    o_tr = torch.full_like(q, float("nan"))
    traced(*call_args(tp, q=q, k=k, v=v, out=o_tr, softmax_scale=scale, trace=buf))
    torch.cuda.synchronize()
    row["bitwise_equal"] = bool(torch.equal(o_tr, o_plain))
    row["traced_nan"] = bool(torch.isnan(o_tr).any())
    dec = decode_buffer(buf.cpu().numpy(), grid_ctas=tiles)
    row["decoded_rows"] = dec.table.num_rows
    row["decode_summary"] = dec.summary
    names = dec.table["name"].cast("string").to_pylist()
    roles = dec.table["role"].cast("string").to_pylist()
    counts = {}
    for n, r in zip(names, roles):
        counts[f"{r}:{n}"] = counts.get(f"{r}:{n}", 0) + 1
    row["rows_by_role_event"] = counts
    return row, plain, pp, traced, tp, (q, k, v)


def main():
    import subprocess

    import numpy as np
    import torch

    from fa4trace import layout as L
    from fa4trace.decode import decode_buffer
    from fa4trace.fa4.run import call_args, capacity_for, load_fn, record, sm90_runner

    log("gpu", torch.cuda.get_device_name(0), "torch", torch.__version__)
    man = json.loads((BUILD / "manifest.json").read_text())
    log("build", BUILD, list(man["functions"]))
    RESULTS["gpu"] = torch.cuda.get_device_name(0)

    # 0. the GPU tests
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/gpu/test_fa4_gpu.py"], capture_output=True, text=True, timeout=240)
    (OUT / "pytest.txt").write_text(p.stdout + p.stderr)
    RESULTS["pytest"] = {"rc": p.returncode, "tail": p.stdout.strip().splitlines()[-1:],
                         "seconds": round(time.time() - t0, 1)}
    log("pytest", json.dumps(RESULTS["pytest"]))
    save()

    # 1. correctness + decode of the default traced build; plain-only shapes for the bench
    cases = [(128, 16, 1, 32768, 1), (128, 16, 1, 4096, 4), (128, 16, 1, 131072, 1),
             (128, 16, 2, 32768, 2), (64, 16, 1, 32768, 1), (64, 16, 2, 131072, 1)]
    runners = {}
    for i, (d, hq, hkv, sk, b) in enumerate(cases):
        t0 = time.time()
        try:
            row, plain, pp, traced, tp, qkv = check_shape(d, hq, hkv, sk, b, seed=100 + i)
            runners[(d, hq, hkv, sk, b)] = (plain, pp, traced, tp, qkv)
        except Exception:
            row = {"case": [d, hq, hkv, sk, b], "error": traceback.format_exc()}
            RESULTS["errors"].append(row)
        row["seconds"] = round(time.time() - t0, 2)
        log("check", json.dumps({k: v for k, v in row.items() if k != "decode_summary"}, default=str))
        RESULTS["checks"].append(row)
        save()

    # 2. the bench hook (plain FA4 SM90) on every shape
    for key, (plain, pp, traced, tp, (q, k, v)) in runners.items():
        d, hq, hkv, sk, b = key
        out = torch.empty_like(q)
        run = sm90_runner(q, k, v, build=BUILD, out=out)  # the `fa4trace bench` hook
        t_plain = bench(run)
        trow = {"d": d, "hq": hq, "hkv": hkv, "sk": sk, "b": b, "plain_us_median_min_max": t_plain,
                "bytes": (q.numel() + k.numel() + v.numel() + out.numel()) * 2}
        trow["plain_TBps"] = trow["bytes"] / (t_plain[0] * 1e-6) / 1e12
        log("bench", json.dumps(trow))
        RESULTS["timing"].append(trow)
        save()

    # 3. recorder cost, broken down: which roles record, where the cursor lives
    variants = sorted({f["config"]["variant"] for f in man["functions"].values() if f["config"]["traced"]})
    RESULTS["overhead"] = []
    for d, hq, hkv, sk, b in [(128, 16, 1, 32768, 1), (128, 16, 1, 131072, 1), (128, 16, 1, 4096, 4)]:
        kplain = load_fn("sm90", schedule="fa3", d=d, hq=hq, hkv=hkv, sq=1, dtype="bf16", traced=False,
                         build=BUILD)
        plain, pp = kplain.fn, kplain.params
        g = torch.Generator(device="cuda").manual_seed(sk + b)
        q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        scale = 1.0 / math.sqrt(d)
        ref = torch.full_like(q, float("nan"))
        pargs = call_args(pp, q=q, k=k, v=v, out=ref, softmax_scale=scale)
        plain(*pargs)
        row = {"d": d, "hq": hq, "hkv": hkv, "sk": sk, "b": b, "plain_us": bench(lambda: plain(*pargs))[0]}
        for var in variants:
            ktraced = load_fn("sm90", schedule="fa3", d=d, hq=hq, hkv=hkv, sq=1, dtype="bf16", traced=True,
                              build=BUILD, variant=var)
            fn, tp, tcfg = ktraced.fn, ktraced.params, ktraced.config
            spec = L.BufferSpec.for_grid(b * hkv, tcfg["warps_per_cta"], capacity_for("sm90", sk))
            buf = torch.from_numpy(spec.new_buffer().view(np.int64)).cuda()
            o = torch.full_like(q, float("nan"))
            targs = call_args(tp, q=q, k=k, v=v, out=o, softmax_scale=scale, trace=buf)
            try:
                fn(*targs)
                torch.cuda.synchronize()
                dec = decode_buffer(buf.cpu().numpy(), grid_ctas=b * hkv)
                us = bench(lambda: fn(*targs))[0]
                row[var] = {"us": us, "overhead_pct": 100 * (us / row["plain_us"] - 1),
                            "bitwise_equal": bool(torch.equal(o, ref)), "rows": dec.table.num_rows,
                            "dropped": dec.summary["dropped"]}
            except Exception as e:
                row[var] = {"error": f"{type(e).__name__}: {e}"[:400]}
        row["plain_again_us"] = bench(lambda: plain(*pargs))[0]
        log("overhead", json.dumps(row))
        RESULTS["overhead"].append(row)
        save()

    # 4. bundles through the function `fa4trace record --impl fa4` calls
    from fa4trace.bundle import load

    d, hq, hkv, sk, b = 128, 16, 1, 32768, 1
    RESULTS["bundles"] = []
    for var in ["default", "smem"]:
        if var not in variants:
            continue
        trace = record(schedule="pingpong", d=d, hq=hq, hkv=hkv, sk=sk, b=b, sq=1, dtype="bf16", build=BUILD,
                       variant=var)
        name = f"fa4_sm90_d{d}_h{hq}kv{hkv}_sk{sk}_b{b}" + ("" if var == "default" else f"_{var}") + ".parquet"
        p = trace.save(OUT / name, overwrite=True)
        back = load(p)
        info = {"file": name, "bytes": p.stat().st_size, "rows": len(back), "check": trace.meta.get("check"),
                "fa4": trace.meta.get("fa4"), "dropped": trace.meta.get("total_dropped")}
        log("bundle", json.dumps(info))
        RESULTS["bundles"].append(info)
        save()


if __name__ == "__main__":
    try:
        main()
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
        log(traceback.format_exc())
        save()
        sys.exit(1)
    log("done")
