"""What a sampled trace costs: a launch where only some CTAs record, with the kernel's body
split (CTAs that do not record run an uninstrumented copy; fa4trace.auto.split, the default)
and as one instrumented body for every CTA (``split=False``).

    python benchmarks/bench_cta_sample.py build build/sample          # here (CuTe DSL, no GPU)
    python benchmarks/bench_cta_sample.py run build/sample --json benchmarks/results/cta_sample_h200.json

Kernels: those of auto_kernels.py (quack's SM90 GEMM, also with quack's dynamic persistent
scheduler, FA4's SM90 prefill full and causal, our decode kernel through the generic layer), all
automatic families on. Per kernel: the sampled
launch's output against the plain build (bit for bit) and its bundle (the CTAs asked for and
no others), then plain, split and one-body builds timed in interleaved rounds, with every CTA
recording and with the sample. CUDA-graph replay, inputs rotating (cold L2).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import auto_kernels as ak  # noqa: E402

SPLITS = (("", True), ("_onebody", False))


def build(out: str) -> None:
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from fa4trace.auto import compiler
    from fa4trace.auto.build import entries
    from fa4trace.run.aot import build_library

    real = compiler.compile_traced
    ents = {}
    try:
        for sfx, split in SPLITS:
            compiler.compile_traced = lambda *a, _s=split, **k: real(*a, **{**k, "split": _s})
            c = ak.compile_quack_gemm(check=split)
            ents.update(entries("gemm" + sfx, c, {"kernel": "quack GemmSm90", "split": split}))
            c = ak.compile_quack_gemm(check=split, dynamic=True)
            ents.update(entries("gemm_dynamic" + sfx, c, {"kernel": "quack GemmSm90, dynamic scheduler", "split": split}))
            for causal in (False, True):
                c, cfg = ak.compile_fa4_prefill(causal=causal, check=split)
                ents.update(entries(("fa4_causal" if causal else "fa4_full") + sfx, c, dict(cfg, split=split)))
            c, variant = ak.compile_decode(check=split)
            ents.update(entries("decode" + sfx, c, {"kernel": "decode", "variant": variant.name, "split": split}))
    finally:
        compiler.compile_traced = real
    build_library(ents, out, arch="sm_90a", overwrite=True)
    print("built", ", ".join(ents))


def _grid_ctas(bdir: str, base: str, args, upper: int) -> int:
    """How many CTAs a launch has: one traced launch with room for every CTA up to ``upper``
    and a few records per warp, counted in its bundle."""
    from fa4trace.auto.build import load
    from fa4trace.auto.run import RecordOptions
    from fa4trace.format.options import Sampling

    kern = load(bdir, base, options=RecordOptions(Sampling(ctas=upper, capacity=8), check=False))
    kern(*args(0))
    return len(set(kern.trace(config={}).events.column("cta").to_pylist()))


def _cases(bdir: str):
    """(kernel, shape, build base name, args(i), input sets, grid CTAs, [(sample label, ctas, stride)], per graph)."""
    import torch

    from fa4trace.auto.build import load
    from fa4trace.fa4.run import call_args

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # quack's GEMM at 8192^3 (the skinny shape's 64 CTAs behave the same), with its static and
    # its dynamic persistent scheduler (CTAs take tiles from a counter as they finish)
    m, n, k = ak.GEMM_SHAPES["square_8192"]
    ns = max(1, min(8, (256 << 20) // ((m * k + n * k) * 2)))
    sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
             torch.randn(n, k, device="cuda", dtype=torch.bfloat16),
             torch.empty(m, n, device="cuda", dtype=torch.bfloat16)) for _ in range(ns)]
    sem = torch.zeros(1, dtype=torch.int32, device="cuda")  # wraps back to 0 at the end of each launch
    gemms = {"gemm": lambda i, s=sets: s[i], "gemm_dynamic": lambda i, s=sets, sem=sem: (*s[i], sem.data_ptr())}
    for base, args in gemms.items():
        grid = _grid_ctas(bdir, base, args, sms)  # persistent: at most one CTA per SM
        sample = min(16, grid // 2)
        yield ("quack GEMM" + (", dynamic" if base == "gemm_dynamic" else ""), f"8192^3 ({grid} CTAs)", base, args,
               ns, grid, [(f"{sample} spread", sample, max(1, grid // sample))], 4)
    p = ak.FA4_PREFILL
    scale = 1 / math.sqrt(p["d"])
    n_ctas = p["b"] * p["h"] * math.ceil(p["seqlen"] / 128)
    for v in ("full", "causal"):
        sets = []
        for _ in range(4):
            q, kk, vv = (torch.randn(p["b"], p["seqlen"], p["h"], p["d"], device="cuda", dtype=torch.bfloat16)
                         for _ in range(3))
            sets.append((q, kk, vv, torch.empty_like(q)))
        params = load(bdir, f"fa4_{v}").meta["params"][:-1]
        yield (f"FA4 SM90{', causal' if v == 'causal' else ''}", f"({n_ctas} CTAs)",
               f"fa4_{v}", lambda i, s=sets, pr=params: call_args(pr, q=s[i][0], k=s[i][1], v=s[i][2], out=s[i][3],
                                                                 softmax_scale=scale, trace=None),
               4, n_ctas, [("128 spread", 128, n_ctas // 128), ("first 256 (default)", 256, 1)], 2)
    d = ak.DECODE
    plan, sets, ws = ak.decode_inputs(sms)
    yield ("our decode", f"({plan.n_ctas} CTAs)", "decode",
           lambda i, s=sets: (*s[i], *ws, *plan.kernel_args(1 / math.sqrt(d["d"])), None), 8, plan.n_ctas,
           [("16 spread", 16, max(1, plan.n_ctas // 16))], 8)


def run(bdir: str, rounds: int, replays: int) -> list:
    import torch

    from fa4trace.auto.build import load
    from fa4trace.auto.run import RecordOptions
    from fa4trace.format.options import Sampling
    from fa4trace.run.record import new_trace_tensor
    from fa4trace.run.timing import graph_time

    rows = []
    for kernel, shape, base, args, n_sets, n_ctas, samples, per in _cases(bdir):
        every = RecordOptions(Sampling(ctas=n_ctas, capacity=1 << 13), check=False)
        timed = {"plain": None}
        for sfx, _split in SPLITS:
            kern = load(bdir, base + sfx, options=every)
            timed[f"every{sfx}"] = (kern.fn, [new_trace_tensor(every.spec(kern.warps_per_cta)) for _ in range(n_sets)])
            timed["plain"] = timed["plain"] or (kern.plain, None)
        checks = {}
        for label, ctas, stride in samples:
            chk = load(bdir, base,
                       options=RecordOptions(Sampling(ctas=ctas, cta_stride=stride, capacity=1 << 14)))
            chk(*args(0))
            torch.cuda.synchronize()
            tr = chk.trace(config={})
            got = sorted(set(tr.events.column("cta").to_pylist()))
            want = [c for c in range(0, n_ctas, stride)][:ctas]
            checks[label] = {"bitwise_equal": all(chk.checked), "ctas_recorded": len(got),
                             "only_those_asked": set(got) <= set(want), "events": len(tr)}
            opts = RecordOptions(Sampling(ctas=ctas, cta_stride=stride, capacity=1 << 13), check=False)
            for sfx, _split in SPLITS:
                kern = load(bdir, base + sfx, options=opts)
                timed[f"{label}{sfx}"] = (kern.fn, [new_trace_tensor(opts.spec(kern.warps_per_cta)) for _ in range(n_sets)])
        times: dict = {k: [] for k in timed}
        for _ in range(rounds):
            for nm, (fn, bufs) in timed.items():
                launch = (lambda i, f=fn: f(*args(i))) if bufs is None else (lambda i, f=fn, b=bufs: f(*args(i), b[i]))
                times[nm].append(graph_time(launch, n_sets, replays, n_sets * per)[0])
        med = {nm: sorted(v)[len(v) // 2] for nm, v in times.items()}
        cost = {nm: round(100 * (t / med["plain"] - 1), 2) for nm, t in med.items()}
        for label, _c, _s in [("all", n_ctas, 1)] + samples:
            key = "every" if label == "all" else label
            ck = checks.get(label, {})
            rows.append({"kernel": kernel, "shape": shape, "grid_ctas": n_ctas, "recording": label,
                         "plain_us": round(med["plain"], 2), "cost_split_pct": cost[key],
                         "cost_one_body_pct": cost[key + "_onebody"],
                         "bitwise_equal": ck.get("bitwise_equal"), "ctas_recorded": ck.get("ctas_recorded"),
                         "only_those_asked": ck.get("only_those_asked")})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("out")
    r = sub.add_parser("run")
    r.add_argument("build")
    r.add_argument("--json", default=None)
    r.add_argument("--rounds", type=int, default=7)
    r.add_argument("--replays", type=int, default=20)
    a = ap.parse_args(argv)
    if a.cmd == "build":
        build(a.out)
        return
    rows = run(a.build, a.rounds, a.replays)
    if a.json:
        from fa4trace.bench import results

        doc = results.envelope(
            "auto-sample", "A sampled trace: only the recording CTAs run instrumented code", rows,
            columns=[["kernel", "kernel"], ["shape", "shape (grid)"], ["recording", "CTAs recording"],
                     ["plain_us", "plain µs"], ["cost_split_pct", "cost % split (default)"],
                     ["cost_one_body_pct", "cost % one body"]],
            notes=(f"All families on; FA4: prefill b{ak.FA4_PREFILL['b']} s{ak.FA4_PREFILL['seqlen']} "
                   f"h{ak.FA4_PREFILL['h']} d{ak.FA4_PREFILL['d']}; decode: d{ak.DECODE['d']} {ak.DECODE['hq']}:"
                   f"{ak.DECODE['hkv']} sk {ak.DECODE['sk']} b {ak.DECODE['b']}. split: the other CTAs run an "
                   "uninstrumented copy; one body: the instrumented one, stores off. Sampled outputs "
                   "= plain, bit for bit."))
        results.write(a.json, doc)


if __name__ == "__main__":
    main()
