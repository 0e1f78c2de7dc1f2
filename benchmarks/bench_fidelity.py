"""Trace fidelity: a dense trace's figures against lighter traces, and each bundle's perturbation line.

What a dense trace reports against lighter traces of the same launch (measurement error), and
what each bundle's perturbation line says against the launch's own timing:

    python benchmarks/bench_fidelity.py run --json benchmarks/results/fidelity_h200.json   # GPU, JIT
    python benchmarks/bench_fidelity.py compile                # any machine with the DSL: the builds compile

Needs a GPU with the CuTe DSL (nvidia-cutlass-dsl 4.8), flash-attn-4 4.0.0b36 and
quack-kernels 0.6.5 installed: the kernels are compiled in process (about three minutes of a
six-minute run). Kernels (benchmarks/auto_kernels.py builds them): FA4's SM90 prefill
(b2 s8192 h16 d128, 2048 CTAs), quack's SM90 GEMM 8192^3 (132 persistent CTAs) and our decode
kernel traced by the generic layer (d128 16:1 sk 131072 b1, 132 CTAs). Three builds of each,
the body split (CTAs that do not record run the plain copy) and every CTA timed:

* dense: every family (FA4: plus its softmax and rescale spans);
* pipeline: the pipeline family only (a sparse trace);
* lifetimes: no family (warp and CTA lifetimes only).

The same spread sample of CTAs records in each (FA4 64 of 2048, the others 16 of 132; every
warp), on the same inputs. What each trace reports (``trace_metrics``): per-stage durations
(the median of each span event: pipeline waits, MMA waits, barriers, named spans; the recorded
CTAs' lifetime), overlap fractions (each role's share of its lifetime in each wait; FA4: the
softmax span's share with the warp's MMAs in flight) and the producer -> consumer lag per
pipeline. ``metric_errors`` compares each dense figure with the lightest trace that reports it
(lifetimes, else pipeline, else the dense build with one warp per warpgroup recording, set
against the dense trace's figures of those same warps) and with a second dense launch (the noise between two launches): relative error per metric,
against the 2% target.

Then each build is timed (CUDA-graph replay, cold L2, interleaved rounds) against the plain
build: with every CTA recording, with the sample, and (lifetimes build) with no CTA recording
(the stamps alone: what the untraced CTAs pay). The bundle's perturbation line
(fa4trace.analysis.fidelity: recorded vs untraced CTAs of the sampled launch) stands next to the
every-CTA launch's cost: where the two agree, the line measures what the benchmark does.

Writes two result files: ``--json`` (the error per metric) and its ``_cost`` twin (the
perturbation and the costs), of areas "fidelity-error" (rendered on docs/fidelity-error.md) and
"fidelity" (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

TARGET = 0.02  # relative error a dense trace's figures may have against a lighter trace's
# how much slower the recorded CTAs may run (%): the targets README states (GEMM 3%, FA4 5%)
SLOWDOWN_TARGET_PCT = {"quack GEMM": 3.0, "FA4 SM90 prefill": 5.0}
KERNELS = ("fa4", "gemm", "decode")
BUILDS = ("dense", "pipeline", "lifetimes")


def lead_warps(warps_per_cta: int) -> tuple:
    """One warp per warpgroup: 0, 4, 8, ... below ``warps_per_cta``."""
    return tuple(range(0, warps_per_cta, 4))


# ---- what a trace reports (CPU: these run on any machine, tests/test_benchmarks_scripts.py) ----
# One definition with the product (fa4trace summary's figures by pass): fa4trace.analysis.figures.
from fa4trace.analysis.figures import recorded_cta_ns, span_medians, trace_metrics  # noqa: E402,F401


def dense_roles(trace) -> dict:
    """warp -> role as the analysis decides it on the dense trace (fa4trace.analysis.roles)."""
    from fa4trace.analysis.roles import decide_roles

    return dict(decide_roles(trace)["by_warp"])


def rel_error(value: float, ref: float) -> float | None:
    """|value - ref| / |ref| (None where ref is 0)."""
    return abs(value - ref) / abs(ref) if ref else None


def only_warps(trace, warps) -> object:
    """The trace's rows of ``warps`` (warp index in the CTA) only, meta kept: the dense trace seen
    on the warps a lead-warps trace records, so both report on the same warps."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from fa4trace.trace.bundle import Trace

    keep = pc.is_in(trace.events["warp"], value_set=pa.array(sorted(int(w) for w in warps), trace.events["warp"].type))
    return Trace(trace.events.filter(keep), trace.meta)


def metric_errors(kernel: str, dense: dict, refs: list, noise: dict | None = None) -> list[dict]:
    """One row per dense metric that a lighter trace also reports: the lightest such reference
    of ``refs`` ([(label, metrics)] or [(label, metrics, dense metrics on the reference's warps)],
    lightest first), the relative error against it, whether it is within TARGET, and the relative
    difference between two dense launches (``noise``). A reference that records fewer warps
    brings the dense figures of those warps: the error compares one quantity, not two samples."""
    rows = []
    for key, v in dense.items():
        ref = next((r for r in refs if key in r[1]), None)
        if ref is None:
            continue
        label, ref_m = ref[0], ref[1]
        v = ref[2].get(key, v) if len(ref) > 2 and ref[2] else v
        err = rel_error(v, ref_m[key])
        nz = rel_error(v, noise[key]) if noise and key in noise else None
        rows.append({"kernel": kernel, "metric": key, "dense": _round(v), "reference": label,
                     "reference_value": _round(ref_m[key]), "rel_err_pct": _round(None if err is None else 100 * err, 2),
                     "noise_pct": _round(None if nz is None else 100 * nz, 2),
                     "within_target": None if err is None else err <= TARGET})
    return rows


def _round(x, nd: int = 4):
    return None if x is None else round(float(x), nd)


def error_summary(rows: list[dict]) -> dict:
    """Per kernel: metrics compared, how many within TARGET, the worst relative error."""
    out: dict = {}
    for r in rows:
        s = out.setdefault(r["kernel"], {"metrics": 0, "within_target": 0, "worst_pct": 0.0, "worst": None})
        s["metrics"] += 1
        s["within_target"] += bool(r["within_target"])
        if r["rel_err_pct"] is not None and r["rel_err_pct"] >= s["worst_pct"]:
            s["worst_pct"], s["worst"] = r["rel_err_pct"], r["metric"]
    return out


def perturbation_row(kernel: str, build: str, trace, cost: dict) -> dict:
    """The bundle's perturbation line next to the launch's own timing (``cost``: percentages)."""
    from fa4trace.analysis.fidelity import perturbation

    p = perturbation(trace)
    rel = p["rel"] if p["measured"] else None
    target = SLOWDOWN_TARGET_PCT.get(kernel)
    return {"kernel": kernel, "build": build, "line_pct": _round(None if rel is None else 100 * rel, 2),
            "target_pct": target, "line_within_target": None if rel is None or target is None else 100 * rel <= target,
            "basis": p["basis"], "recorded": (p["recorded"] or {}).get("n"), "untraced": (p["untraced"] or {}).get("n"),
            "caveats": len(p["caveats"]), "caveat_text": p["caveats"], "dropped": trace.meta.get("total_dropped"), **cost,
            "line_minus_cost_all_pts": (_round(100 * rel - cost["cost_all_pct"], 2)
                                        if rel is not None and cost.get("cost_all_pct") is not None else None)}


# ---- the kernels (GPU) ---------------------------------------------------------------------------
class Case(NamedTuple):
    """One kernel: its three traced compiles, the plain one, arguments per input set, the sample."""

    kernel: str
    shape: str
    grid: int
    n_sets: int
    per_graph: int
    args: Callable[[int], tuple]
    compiled: dict  # build -> CompiledTraced
    plain: Any
    sample: tuple = (16, 8)  # (CTAs recording, stride)
    capacity: int = 1 << 13  # records per warp in the timed launches
    record_capacity: int = 1 << 14  # ... in the recorded ones (nothing may drop: it would cut the figures)


def _families(build: str):
    from fa4trace.auto.events import FAMILIES

    return {"dense": FAMILIES, "pipeline": ("pipeline",), "lifetimes": ()}[build]


def compile_builds(kernel: str) -> dict:
    """{build: CompiledTraced} of one kernel (``KERNELS``): dense (with the plain twin),
    pipeline, lifetimes; the CuTe DSL compiles them here (a GPU is not needed)."""
    import auto_kernels as ak

    if kernel == "fa4":
        return {b: ak.compile_fa4_prefill(causal=False, families=_families(b), spans=b == "dense",
                                          check=b == "dense")[0] for b in BUILDS}
    if kernel == "gemm":
        return {b: ak.compile_quack_gemm(check=b == "dense", families=_families(b)) for b in BUILDS}
    if kernel == "decode":
        return {b: ak.compile_decode(check=b == "dense", families=_families(b))[0] for b in BUILDS}
    raise ValueError(f"unknown kernel {kernel!r}; choose from {', '.join(KERNELS)}")


def fa4_case() -> Case:
    import torch

    import auto_kernels as ak
    from fa4trace.fa4.run import call_args

    p = ak.FA4_PREFILL
    comp = compile_builds("fa4")
    params = comp["dense"].params[:-1]
    sets = []
    for _ in range(4):
        q, k, v = (torch.randn(p["b"], p["seqlen"], p["h"], p["d"], device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        sets.append((q, k, v, torch.empty_like(q)))
    scale = 1 / math.sqrt(p["d"])
    grid = p["b"] * p["h"] * math.ceil(p["seqlen"] / 128)
    return Case("FA4 SM90 prefill", f"b{p['b']} s{p['seqlen']} h{p['h']} d{p['d']}", grid, 4, 8,
                lambda i: tuple(call_args(params, q=sets[i][0], k=sets[i][1], v=sets[i][2], out=sets[i][3],
                                          softmax_scale=scale, trace=None)),
                comp, comp["dense"].plain, sample=(64, grid // 64))


def gemm_case() -> Case:
    import torch

    import auto_kernels as ak

    comp = compile_builds("gemm")
    m, n, k = ak.GEMM_SHAPES["square_8192"]
    sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda", dtype=torch.bfloat16),
             torch.empty(m, n, device="cuda", dtype=torch.bfloat16))]
    grid = torch.cuda.get_device_properties(0).multi_processor_count  # persistent: one CTA per SM
    return Case("quack GEMM", f"{m}x{n}x{k}", grid, 1, 4, lambda i: sets[i], comp, comp["dense"].plain,
                sample=(16, grid // 16), capacity=1 << 15)


def decode_case() -> Case:
    import torch

    import auto_kernels as ak

    d = ak.DECODE
    comp = compile_builds("decode")
    plan, sets, ws = ak.decode_inputs(torch.cuda.get_device_properties(0).multi_processor_count)
    scale = 1 / math.sqrt(d["d"])
    return Case("our decode", f"d{d['d']} {d['hq']}:{d['hkv']} sk {d['sk']} b {d['b']}", plan.n_ctas, 8, 64,
                lambda i: (*sets[i], *ws, *plan.kernel_args(scale), None), comp, comp["dense"].plain,
                sample=(16, max(1, plan.n_ctas // 16)))


CASES = {"fa4": fa4_case, "gemm": gemm_case, "decode": decode_case}


def _instrumented(c, opts):
    from fa4trace.auto.run import Instrumented

    return Instrumented(c.fn, c.vocab, dict(c.meta, params=c.params), plain=None, options=opts)


def record(case: Case, build: str, opts, config: dict):
    """One traced launch of ``build`` on input set 0: its bundle."""
    k = _instrumented(case.compiled[build], opts)
    k(*case.args(0))
    return k.trace(config=config)


def run_case(case: Case, rounds: int, replays: int, log=print, save_dir: str | None = None) -> tuple[list, list]:
    """(error rows, perturbation rows) of one kernel (module doc); ``save_dir``: keep the recorded
    bundles there (<kernel>_<trace>.parquet)."""
    import torch

    from fa4trace.auto.run import RecordOptions
    from fa4trace.run.record import new_trace_tensor
    from fa4trace.run.timing import graph_time

    n, stride = case.sample
    rec = RecordOptions(ctas=n, cta_stride=stride, capacity=case.record_capacity, check=False)
    lw = lead_warps(case.compiled["dense"].meta["warps_per_cta"])
    lead = RecordOptions(ctas=n, cta_stride=stride, capacity=case.record_capacity, check=False, warps=lw)
    cfg = {"kernel": case.kernel, "shape": case.shape}
    traces = {b: record(case, b, rec, dict(cfg, build=b)) for b in BUILDS}
    traces["dense_again"] = record(case, "dense", rec, dict(cfg, build="dense"))
    traces["dense_lead"] = record(case, "dense", lead, dict(cfg, build="dense", warps=list(lw)))
    if save_dir:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        for k, t in traces.items():
            t.save(Path(save_dir) / f"{case.kernel.replace(' ', '_')}_{k}.parquet", overwrite=True)
    for k, t in traces.items():
        if t.meta.get("total_dropped"):
            log(f"{case.kernel}: the {k} trace dropped {t.meta['total_dropped']} records (raise record_capacity)")
    roles = dense_roles(traces["dense"])
    t0 = time.time()
    m = {k: trace_metrics(t, roles) for k, t in traces.items()}
    log(f"{case.kernel}: metrics of {len(traces)} traces in {time.time() - t0:.1f} s")
    on_lead = trace_metrics(only_warps(traces["dense"], lw), roles)  # the dense trace on the lead warps
    errors = metric_errors(case.kernel, m["dense"], [("lifetimes", m["lifetimes"]), ("pipeline", m["pipeline"]),
                                                     ("dense, lead warps", m["dense_lead"], on_lead)], m["dense_again"])

    sample = RecordOptions(ctas=n, cta_stride=stride, capacity=case.capacity, check=False)
    every = RecordOptions(ctas=case.grid, capacity=case.capacity, check=False)
    nobody = RecordOptions(ctas=1, cta_first=case.grid, capacity=8, check=False)  # CTA index past the grid
    timed = {"plain": (case.plain, None)}
    for b in BUILDS:
        w = case.compiled[b].meta["warps_per_cta"]
        for label, opts in (("all", every), ("sample", sample)):
            timed[f"{b}:{label}"] = (case.compiled[b].fn, [new_trace_tensor(opts.spec(w)) for _ in range(case.n_sets)])
    w = case.compiled["lifetimes"].meta["warps_per_cta"]
    timed["lifetimes:none"] = (case.compiled["lifetimes"].fn, [new_trace_tensor(nobody.spec(w)) for _ in range(case.n_sets)])
    times: dict = {k: [] for k in timed}
    for _ in range(rounds):
        for name, (fn, bufs) in timed.items():
            launch = (lambda i, f=fn: f(*case.args(i))) if bufs is None else \
                (lambda i, f=fn, bb=bufs: f(*case.args(i), bb[i]))
            times[name].append(graph_time(launch, case.n_sets, replays, case.per_graph)[0])
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    del timed
    torch.cuda.empty_cache()

    def pct(key):
        return _round(100 * (med[key] / med["plain"] - 1), 2)

    pert = []
    for b in BUILDS:
        cost = {"plain_us": _round(med["plain"], 2), "cost_all_pct": pct(f"{b}:all"),
                "cost_sample_pct": pct(f"{b}:sample"),
                "stamps_only_pct": pct("lifetimes:none") if b == "lifetimes" else None}
        pert.append(perturbation_row(case.kernel, b, traces[b], cost))
        log(json.dumps(pert[-1]))
    for r in errors:
        log(json.dumps(r))
    return errors, pert


def run(kernels, rounds: int, replays: int, log=print, save_dir: str | None = None) -> tuple[list, list]:
    errors, pert = [], []
    for name in kernels:
        t0 = time.time()
        case = CASES[name]()
        log(f"{case.kernel}: compiled in {time.time() - t0:.0f} s")
        e, p = run_case(case, rounds, replays, log, save_dir)
        errors += e
        pert += p
        log(f"{case.kernel}: done after {time.time() - t0:.0f} s")
    return errors, pert


def cost_path(json_path: str) -> Path:
    """Where the perturbation and cost rows go: next to ``json_path``, with ``_cost`` added."""
    p = Path(json_path)
    return p.with_name(p.stem + "_cost" + p.suffix)


def write_results(json_path: str, errors: list, pert: list, gpu: str | None = None) -> None:
    """The two result files (module doc); ``gpu``: default the visible one."""
    from fa4trace.bench import results

    summary = error_summary(errors)
    results.write(json_path, results.envelope(
        "fidelity-error", "Measurement error: a dense trace's figures against a lighter trace of the same launch", errors,
        columns=[["kernel", "kernel"], ["metric", "metric"], ["dense", "dense"], ["reference", "reference trace"],
                 ["reference_value", "reference"], ["rel_err_pct", "error %"], ["noise_pct", "dense vs dense %"],
                 ["within_target", f"<= {100 * TARGET:.0f}%"]],
        notes=("Medians over the recorded CTAs of one launch per trace, same inputs and CTA sample. reference: the "
               "lightest trace reporting the metric (lifetimes only; pipeline family only; the dense build with "
               "one warp per warpgroup, compared with the dense trace's same warps). dense vs dense: two dense "
               "launches (the noise)."),
        gpu=gpu, summary=summary))
    results.write(cost_path(json_path), results.envelope(
        "fidelity", "Perturbation line against the launch's own timing", pert,
        columns=[["kernel", "kernel"], ["build", "build"], ["line_pct", "line: recorded vs untraced %"],
                 ["target_pct", "target %"], ["recorded", "recorded"], ["untraced", "untraced"],
                 ["cost_all_pct", "cost %, every CTA records"], ["cost_sample_pct", "cost %, sample"],
                 ["stamps_only_pct", "cost %, stamps only"]],
        notes=("line: the sampled launch's recorded vs untraced CTAs (fa4trace.analysis.fidelity); cost: CUDA-graph replay vs "
               "the plain build, cold L2, interleaved rounds; stamps only: no CTA recording."), gpu=gpu))


def compile_only(kernels, log=print) -> dict:
    """Compile every build of ``kernels`` (no GPU needed) and say what each found."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    out = {}
    for k in kernels:
        t0 = time.time()
        comp = compile_builds(k)
        out[k] = {b: {key: c.meta.get(key) for key in ("families", "found", "spans", "split", "cta_lifetimes")}
                  for b, c in comp.items()}
        log(f"{k}: {len(comp)} builds in {time.time() - t0:.0f} s: {json.dumps(out[k], sort_keys=True)}")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="compile, record and time on this GPU")
    c = sub.add_parser("compile", help="compile every build here (the CuTe DSL, no GPU)")
    for p in (r, c):
        p.add_argument("--kernels", default=",".join(KERNELS), help=f"comma list of {', '.join(KERNELS)}")
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--replays", type=int, default=10)
    r.add_argument("--json", default=None, help="result file (its _cost twin is written next to it)")
    r.add_argument("--save", default=None, metavar="DIR", help="keep the recorded bundles in DIR")
    a = ap.parse_args(argv)
    kernels = [k for k in a.kernels.split(",") if k]
    bad = [k for k in kernels if k not in CASES]
    if bad:
        ap.error(f"unknown kernel(s) {', '.join(bad)}; choose from {', '.join(KERNELS)}")
    if a.cmd == "compile":
        compile_only(kernels)
        return
    errors, pert = run(kernels, a.rounds, a.replays, save_dir=a.save)
    for k, s in error_summary(errors).items():
        print(f"{k}: {s['within_target']}/{s['metrics']} metrics within {100 * TARGET:.0f}%; worst {s['worst']} "
              f"{s['worst_pct']:.2f}%")
    if a.json:
        write_results(a.json, errors, pert)
        print(f"wrote {a.json} and {cost_path(a.json)}")


if __name__ == "__main__":
    main()
