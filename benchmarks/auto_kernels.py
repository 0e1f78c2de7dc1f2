"""Automatic events on kernels fa4trace never saw: build here, then run, check, trace and time on a GPU.

    python benchmarks/auto_kernels.py build -o build/auto            # CPU, CuTe DSL (sm_90a)
    python benchmarks/auto_kernels.py run build/auto --out DIR [--json F]   # GPU, torch + tvm-ffi only

Kernels: quack-kernels' SM90 GEMM (``GemmSm90``, bf16, tile 128x256, cluster 2x1, persistent),
instrumented by ``fa4trace.instrument`` with every family on and nothing of quack edited. ``run``
executes each shape with the plain build and the traced build on the same inputs (outputs must
match bit for bit), records one bundle per shape (a CTA subset, every warp) and times plain vs
traced with CUDA-graph replay, cold L2, interleaved rounds, every warp of every CTA recording
(the cost a user pays with all automatic events on).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

GEMM_SHAPES = {"square_8192": (8192, 8192, 8192), "skinny_64x8192x8192": (64, 8192, 8192)}
H200_SMS = 132
CLUSTER = (2, 1, 1)
TILE = (128, 256)


# ---- build (CuTe DSL, no GPU) ---------------------------------------------------------------
def quack_gemm_entry(arch_major: int = 9):
    """A host entry over quack's GEMM: (A (m,k), B (n,k), D (m,n), stream), D = A @ B^T in bf16,
    everything else of quack's call fixed (no C, no epilogue extras, static persistent scheduler)."""
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32, Int32
    from quack.gemm_default_epi import GemmDefaultSm90, GemmDefaultSm100  # noqa: F401
    from quack.gemm_tvm_ffi_utils import make_fake_gemm_tensors
    from quack.tile_scheduler import TileSchedulerOptions

    cls = GemmDefaultSm90 if arch_major == 9 else GemmDefaultSm100
    if arch_major == 9:
        gemm = cls(Float32, BFloat16, TILE, CLUSTER, pingpong=False, is_persistent=True)
    else:
        gemm = cls(Float32, BFloat16, (256, 256), CLUSTER)
    gemm.b_transposed = gemm.a_transposed = gemm.cd_transposed = False
    gemm.cd_packed = None
    epi = cls.EpilogueArguments(alpha=None, beta=None, mRowVecBroadcast=None, mColVecBroadcast=None,
                                add_to_output=False, rounding_mode=0, sr_seed=None)
    sched = TileSchedulerOptions(max_active_clusters=Int32(H200_SMS // (CLUSTER[0] * CLUSTER[1])))

    @cute.jit
    def quack_gemm(mA, mB, mD, stream):
        gemm(mA, mB, mD, None, epi, sched, None, stream, None, None)

    mA, mB, mD, _mC, *_ = make_fake_gemm_tensors(BFloat16, BFloat16, BFloat16, None, "k", "k", "n", "n",
                                                 batched=False)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return quack_gemm, (mA, mB, mD, stream), type(gemm)


def compile_quack_gemm(*, arch: str = "sm_90a", keep_ptx: bool = False, check: bool = True, families=None,
                       cursor: str = "smem"):
    """``fa4trace.instrument`` over quack's GEMM entry: the traced compile (and its plain twin)."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    from fa4trace.auto.compiler import compile_traced
    from fa4trace.auto.events import FAMILIES

    entry, args, cls = quack_gemm_entry(9 if arch.startswith("sm_90") else 10)
    opts = "--enable-tvm-ffi" + (" --keep-ptx" if keep_ptx else "")
    return compile_traced(entry, *args, kernels=[cls], families=FAMILIES if families is None else families,
                          check=check, options=opts, cursor=cursor)


# (name suffix, cursor, families): the default build and the cost-by-family variants
VARIANTS = [("", "smem", None), ("_gmem", "gmem", None), ("_pipeline", "smem", ("pipeline",)),
            ("_mma", "smem", ("mma",)), ("_tma", "smem", ("tma",)), ("_barrier", "smem", ("barrier",)),
            ("_none", "smem", ())]


def build(out: str, force: bool) -> None:
    from fa4trace.aot import build_library
    from fa4trace.auto.build import entries

    t = time.time()
    ents = {}
    for suffix, cursor, fams in VARIANTS:
        c = compile_quack_gemm(cursor=cursor, families=fams, check=not ents)
        ents.update(entries("quack_gemm_sm90" + suffix, c,
                            {"kernel": "quack GemmSm90", "tile": list(TILE), "cluster": list(CLUSTER),
                             "quack": _version("quack-kernels"), "cursor": cursor,
                             "families": sorted(c.meta["families"])}))
    build_library(ents, out, arch="sm_90a", overwrite=force)
    print(f"built {', '.join(ents)} into {out} in {time.time() - t:.0f} s")


def _version(dist: str) -> str:
    from importlib import metadata

    return metadata.version(dist)


# ---- run (GPU: torch + tvm-ffi) -------------------------------------------------------------
def run(build_dir: str, out: str, json_path: str | None, rounds: int, replays: int) -> None:
    import torch

    from fa4trace.auto.build import load
    from fa4trace.auto.run import RecordOptions
    from fa4trace.bench import results
    from fa4trace.bench.timing import graph_time

    os.makedirs(out, exist_ok=True)
    rows = []
    for label, (m, n, k) in GEMM_SHAPES.items():
        torch.manual_seed(0)
        sets = []
        n_sets = max(1, min(8, (256 << 20) // ((m * k + n * k) * 2)))
        for _ in range(n_sets):
            sets.append((torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                         torch.randn(n, k, device="cuda", dtype=torch.bfloat16),
                         torch.empty(m, n, device="cuda", dtype=torch.bfloat16)))
        a, b, d = sets[0]
        # 1) the bundle: 8 CTAs spread over the persistent grid, every warp, output checked
        kern = load(build_dir, "quack_gemm_sm90", options=RecordOptions(ctas=8, cta_stride=16, capacity=16384))
        kern(a, b, d)
        ref = (a.float() @ b.float().T)
        rel = float(((d.float() - ref).norm() / ref.norm()).item())
        trace = kern.trace(config={"m": m, "n": n, "k": k, "dtype": "bf16", "tile": list(TILE)})
        path = os.path.join(out, f"quack_gemm_sm90_{label}.parquet")
        trace.save(path, overwrite=True)
        # 2) the cost: every warp of every CTA records; each variant against the plain build,
        #    rounds interleaved (plain, variant 1, variant 2, ... per round)
        from fa4trace.aot import BuildDir
        from fa4trace.record import new_trace_tensor

        names = [f"quack_gemm_sm90{sfx}" for sfx, _c, _f in VARIANTS if f"quack_gemm_sm90{sfx}" in BuildDir(build_dir).functions]
        opts = RecordOptions(ctas=H200_SMS, capacity=1 << 15, check=False)
        kerns = {nm: load(build_dir, nm, options=opts) for nm in names}
        plain = kerns[names[0]].plain
        spec = opts.spec(kerns[names[0]].warps_per_cta)
        bufs = [new_trace_tensor(spec) for _ in range(n_sets)]
        times: dict = {"plain": []}
        for _ in range(rounds):
            times["plain"].append(graph_time(lambda i: plain(*sets[i]), n_sets, replays, n_sets * 4)[0])
            for nm, kk in kerns.items():
                times.setdefault(nm, []).append(graph_time(lambda i: kk.fn(*sets[i], bufs[i]), n_sets, replays,
                                                           n_sets * 4)[0])
        med = {nm: sorted(v)[len(v) // 2] for nm, v in times.items()}
        tp = med["plain"]
        dropped = int(trace.events.column("dropped").to_numpy().max()) if len(trace) else 0
        for nm in names:
            cfg = BuildDir(build_dir).functions[nm]["config"]
            rows.append({"kernel": "quack GemmSm90", "shape": f"{m}x{n}x{k}", "build": nm, "cursor": cfg["cursor"],
                         "families": "+".join(cfg["families"]) or "lifetimes only",
                         "plain_us": round(tp, 2), "traced_us": round(med[nm], 2),
                         "cost_pct": round(100 * (med[nm] / tp - 1), 2),
                         "tflops_plain": round(2 * m * n * k / tp / 1e6, 1),
                         "bitwise_equal": (all(kern.checked) if kern.checked else None) if nm == names[0] else None,
                         "rel_err_vs_fp32": rel if nm == names[0] else None,
                         "events": len(trace) if nm == names[0] else None, "dropped": dropped if nm == names[0] else None,
                         "bundle": os.path.basename(path) if nm == names[0] else None})
            print(json.dumps(rows[-1]), flush=True)
    if json_path:
        doc = results.envelope("auto-kernels", "Automatic events on kernels fa4trace never saw", rows,
                               columns=[["kernel", "kernel"], ["shape", "m x n x k"], ["cursor", "cursor"],
                                        ["families", "families"], ["plain_us", "plain µs"],
                                        ["traced_us", "traced µs"], ["cost_pct", "cost %"],
                                        ["bitwise_equal", "traced == plain"], ["events", "events in bundle"]],
                               notes="traced = every warp of every CTA records, all four families on; "
                                     "the bundle records 8 CTAs. CUDA-graph replay, cold L2, rounds interleaved.")
        results.write(json_path, doc)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("-o", "--out", default="build/auto")
    b.add_argument("--force", action="store_true")
    r = sub.add_parser("run")
    r.add_argument("build")
    r.add_argument("--out", required=True)
    r.add_argument("--json")
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--replays", type=int, default=10)
    a = ap.parse_args(argv)
    if a.cmd == "build":
        build(a.out, a.force)
    else:
        run(a.build, a.out, a.json, a.rounds, a.replays)


if __name__ == "__main__":
    main()
