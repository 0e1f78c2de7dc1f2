"""One H200 session for decode attention: smoke-check every built variant, GPU tests,
benchmark, a baseline build's benchmark, record traces.

    source .devkit/device-env.sh && export PYTHONPATH=.:$PYTHONPATH FA4TRACE_BUILD=build/attn && \
        python3 benchmarks/attn_device_run.py --phases smoke,tests,bench,baseline,traces --out $OUT

Each phase runs in its own process with a time limit (a hang or crash costs that phase only)
and the run stops starting phases past --deadline seconds. ``baseline``: the benchmark of an
older checkout (``--baseline-dir``: its fa4trace package and its AOT build in build/) in the
same session, for before/after numbers on the same machine.
Everything goes to --out (<= 8 files: the trace bundles are packed into one tar).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

TRACE_SHAPES = [  # (d, hq, hkv, sk, b): the three shapes
    (128, 16, 1, 131072, 1),
    (64, 16, 1, 131072, 1),
    (128, 16, 2, 32768, 8),
]


def smoke(log):
    import torch

    from fa4trace import attention as A
    from fa4trace.aot import BuildDir

    bd = BuildDir(A._build_dir())  # FA4TRACE_BUILD
    rows = []
    for name, info in sorted(bd.functions.items()):
        if info["kind"] != "attention":  # `fa4trace build` also holds the calibration and marker kernels
            continue
        c = info["config"]
        d, sched, dtype, traced, tn = c["head_dim"], c["schedule"], c["dtype"], c["traced"], c["tile_n"]
        occ = c.get("ctas_per_sm", 1)
        brows = c.get("block_rows", 64)
        for (b, sq, hq, hkv, sk, splits) in ((1, 1, 16, 1, 5000, None), (2, 3, 8, 2, 333, 1)):
            g = torch.Generator(device="cuda").manual_seed(len(rows))
            tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
            q = torch.randn(b, sq, hq, d, dtype=tdt, device="cuda", generator=g)
            k = torch.randn(b, sk, hkv, d, dtype=tdt, device="cuda", generator=g)
            v = torch.randn(b, sk, hkv, d, dtype=tdt, device="cuda", generator=g)
            o = torch.full_like(q, float("nan"))
            t = time.time()
            try:
                trace = (A.trace_buffer(q, k, v, schedule=sched, num_splits=splits, tile_n=tn,
                                        ctas_per_sm=occ, block_rows=brows)[0] if traced else None)
                A.decode_attention(q, k, v, schedule=sched, num_splits=splits, out=o, tile_n=tn,
                                   ctas_per_sm=occ, block_rows=brows, trace=trace)
                torch.cuda.synchronize()
                ref = A.reference(q, k, v)[0]
                err = A.rel_error(o, ref)
                status = "ok" if err <= 1e-2 else "WRONG"
            except Exception as exc:  # noqa: BLE001
                err, status = float("nan"), f"ERROR {type(exc).__name__}: {str(exc)[:160]}"
            rows.append((name, (b, sq, hq, hkv, sk, splits), err, status))
            log(f"smoke {name:48s} {str((b, sq, hq, hkv, sk, splits)):28s} err={err:.2e} {status} ({time.time() - t:.1f}s)")
    return rows


def traces(out, log, max_ctas=None, schedules=None, events="stalls"):
    """The shipped traces: every schedule at TRACE_SHAPES. ``events``: "stalls" is what the
    bundles in traces/ were recorded with (core + WAIT_K/WAIT_V)."""
    from fa4trace import attention as A

    tdir = os.path.join(out, "traces")
    os.makedirs(tdir, exist_ok=True)
    summary = []
    for (d, hq, hkv, sk, b) in TRACE_SHAPES:
        for sched in schedules or A.SCHEDULES:
            name = f"decode_d{d}_{hq}to{hkv}_sk{sk}_b{b}_{sched}.parquet"
            path = os.path.join(tdir, name)
            t = time.time()
            tr = A.record_attention(sched, d, hq, hkv, sk, b, 1, "bf16", path, max_ctas=max_ctas, overwrite=True,
                                    trace_events=events)
            size = os.path.getsize(path)
            tm = tr.meta.get("timing", {})
            summary.append({"file": name, "rows": len(tr), "bytes": size, **tm,
                            "dropped": tr.meta.get("total_dropped"), "cta_subset": tr.meta.get("cta_subset")})
            log(f"trace {name}: {len(tr)} rows, {size / 1e6:.2f} MB, untraced {tm.get('kernel_us', 0):.1f} us, "
                f"traced {tm.get('traced_us', 0):.1f} us, dropped {tr.meta.get('total_dropped')} ({time.time() - t:.1f}s)")
    with tarfile.open(os.path.join(out, "traces.tar"), "w") as tf:
        tf.add(tdir, arcname="traces")
    import shutil

    shutil.rmtree(tdir)
    return summary


PHASE_LIMITS = {"smoke": 60, "tests": 150, "bench": 330, "baseline": 120, "traces": 90}


def run_phase(name, args, log):
    """One phase in this process (called in the child)."""
    result = {}
    if name == "smoke":
        rows = smoke(log)
        result["smoke"] = rows
        bad = [r for r in rows if r[3] != "ok"]
        log(f"smoke: {len(rows) - len(bad)}/{len(rows)} ok")
    elif name == "tests":
        import subprocess

        res = subprocess.run([sys.executable, "-m", "pytest", "tests/gpu/test_attention_gpu.py", "-q", "-rf",
                              "-p", "no:cacheprovider"], capture_output=True, text=True)
        with open(os.path.join(args.out, "pytest.log"), "w") as f:
            f.write(res.stdout + res.stderr)
        log("tests: " + (res.stdout.strip().splitlines() or ["(no output)"])[-1])
        result["tests_rc"] = res.returncode
    elif name == "bench":
        from fa4trace.attention import bench_cli

        # ';' separates bench runs (e.g. other kernels per head dim): bench0/, bench1/, ...
        runs = [a for a in args.bench_args.split(";") if a.strip()]
        for i, a in enumerate(runs):
            bench_cli(a.split() + ["--out", args.out if len(runs) == 1 else os.path.join(args.out, f"bench{i}")])
    elif name == "baseline":
        import subprocess

        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(args.baseline_dir)] +
                                            [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p not in ("", ".")])
        env["FA4TRACE_BUILD"] = os.path.join(os.path.abspath(args.baseline_dir), "build")
        out = os.path.join(args.out, "baseline")
        root = os.path.abspath(args.baseline_dir)
        res = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "bench_decode.py")]
                             + args.baseline_args.split() + ["--out", out], capture_output=True, text=True, env=env,
                             cwd=root)
        log("baseline:\n" + res.stdout[-3000:] + res.stderr[-2000:])
    elif name == "traces":
        result["traces"] = traces(args.out, log, args.max_ctas, [x for x in args.schedules.split(",") if x],
                                  args.trace_events)
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", default="smoke,tests,bench,traces")
    ap.add_argument("--out", default=os.environ.get("OUT", "artifacts/device"))
    ap.add_argument("--bench-args", default="--quick")
    ap.add_argument("--baseline-dir", default="old")
    ap.add_argument("--baseline-args", default="--quick --only d=128,sq=1 --kernels base,pingpong --no-trace-overhead")
    ap.add_argument("--max-ctas", type=int, default=None)
    ap.add_argument("--schedules", default="", help="traces phase: these schedules (default: all of ours)")
    ap.add_argument("--trace-events", default="stalls", choices=("core", "stalls"),
                    help="traces phase: the event set (stalls: as the bundles in traces/)")
    ap.add_argument("--deadline", type=float, default=1e9, help="start no phase after this many seconds")
    ap.add_argument("--phase", default=None, help=argparse.SUPPRESS)  # internal: run one phase here
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "run.log"), "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    if args.phase:
        try:
            result = run_phase(args.phase, args, log)
        except Exception:  # noqa: BLE001
            log(traceback.format_exc())
            result = {"error": traceback.format_exc()[-2000:]}
        with open(os.path.join(args.out, f"result_{args.phase}.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
        return

    import subprocess

    from fa4trace.gpu import gpu_facts

    log(json.dumps(gpu_facts(0)))
    t0 = time.time()
    result = {}
    for name in args.phases.split(","):
        left = args.deadline - (time.time() - t0)
        if left < 10:
            log(f"phase {name}: skipped (deadline)")
            continue
        limit = min(PHASE_LIMITS.get(name, 120), left)
        t = time.time()
        cmd = [sys.executable, os.path.abspath(__file__), "--phase", name] + sys.argv[1:]
        try:
            rc = subprocess.run(cmd, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        log(f"phase {name}: rc={rc} {time.time() - t:.0f} s (limit {limit:.0f})")
        path = os.path.join(args.out, f"result_{name}.json")
        if os.path.exists(path):
            result[name] = json.load(open(path))
            os.remove(path)
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
