"""Automatic events on kernels fa4trace never saw: build here, then run, check, trace and time on a GPU.

    python benchmarks/auto_kernels.py build -o build/auto [--ring-only]   # CPU, CuTe DSL (sm_90a)
    python benchmarks/auto_kernels.py run build/auto --out DIR [--json F] [--kernels gemm,fa4,decode]   # GPU, torch + tvm-ffi only

Kernels: quack-kernels' SM90 GEMM (``GemmSm90``, bf16, tile 128x256, cluster 2x1, persistent),
instrumented by ``fa4trace.instrument`` with every family on and nothing of quack edited. ``run``
executes each shape with the plain build and the traced build on the same inputs (outputs must
match bit for bit), records one bundle per shape (a CTA subset, every warp) and times plain vs
traced with CUDA-graph replay, cold L2, interleaved rounds, every warp of every CTA recording
(the cost a user pays with all automatic events on).

Ring builds (``cursor="ring"``: each record one shared-memory store, copied out at the warp's
exit) stand next to the smem-cursor builds with the same events: quack's GEMM (every family),
FA4's prefill (every family + its spans; pipeline + barrier + its spans) and our decode kernel
(every family). Each is timed in the same rounds, its row says the smem twin's cost beside its
own (``smem_cost_pct``), and one launch of 8 CTAs is checked against the plain build and
decoded into a bundle (``<build>.parquet``: what the rings kept and overwrote). A build the GPU
refuses to launch gets a row saying why instead of a time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

GEMM_SHAPES = {"square_8192": (8192, 8192, 8192), "skinny_64x8192x8192": (64, 8192, 8192)}
# FA4 SM90 forward prefill: b, seqlen (q = k), heads, d
FA4_PREFILL = {"b": 2, "seqlen": 8192, "h": 16, "d": 128}
# our decode kernel, uninstrumented source, traced by the generic layer alone (beside the
# hand-placed bundle traces/decode_d128_16to1_sk131072_b1_pingpong.parquet)
DECODE = {"d": 128, "hq": 16, "hkv": 1, "sk": 131072, "b": 1, "sq": 1, "schedule": "pingpong"}
FA4_SPANS = {"softmax": "flash_attn.cute.softmax:Softmax.online_softmax",
             "rescale": "flash_attn.cute.softmax:Softmax.rescale_O"}
H200_SMS = 132
LEAD_WARPS = (0, 4, 8)  # one warp of each of the three warpgroups (quack's GEMM and FA4's SM90 forward)
CLUSTER = (2, 1, 1)
TILE = (128, 256)


# ---- build (CuTe DSL, no GPU) ---------------------------------------------------------------
def quack_gemm_entry(arch_major: int = 9, dynamic: bool = False):
    """A host entry over quack's GEMM: (A (m,k), B (n,k), D (m,n), stream), D = A @ B^T in bf16,
    everything else of quack's call fixed (no C, no epilogue extras, static persistent scheduler).
    ``dynamic``: quack's dynamic persistent scheduler instead (CTAs take the next tile from an
    Int32 counter in global memory, which wraps back to 0 by itself): the entry takes the
    counter's address after D, (A, B, D, semaphore, stream)."""
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
    clusters = Int32(H200_SMS // (CLUSTER[0] * CLUSTER[1]))
    mA, mB, mD, _mC, *_ = make_fake_gemm_tensors(BFloat16, BFloat16, BFloat16, None, "k", "k", "n", "n",
                                                 batched=False)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    if dynamic:
        from cutlass.cute.runtime import make_ptr

        @cute.jit
        def quack_gemm_dynamic(mA, mB, mD, semaphore, stream):
            sched = TileSchedulerOptions(max_active_clusters=clusters, tile_count_semaphore=semaphore)
            gemm(mA, mB, mD, None, epi, sched, None, stream, None, None)

        sem = make_ptr(Int32, 0, cute.AddressSpace.gmem, assumed_align=4)
        return quack_gemm_dynamic, (mA, mB, mD, sem, stream), type(gemm)

    sched = TileSchedulerOptions(max_active_clusters=clusters)

    @cute.jit
    def quack_gemm(mA, mB, mD, stream):
        gemm(mA, mB, mD, None, epi, sched, None, stream, None, None)

    return quack_gemm, (mA, mB, mD, stream), type(gemm)


def compile_quack_gemm(*, arch: str = "sm_90a", keep_ptx: bool = False, check: bool = True, families=None,
                       cursor: str = "smem", l2: str = "first", split: bool = True,
                       dynamic: bool = False, cta_lifetimes: bool = True, ring: int | None = None):
    """``fa4trace.instrument`` over quack's GEMM entry: the traced compile (and its plain twin).
    ``ring``: records per warp of ``cursor="ring"`` (None: fa4trace's default)."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    from fa4trace.auto.compiler import compile_traced
    from fa4trace.auto.events import FAMILIES

    entry, args, cls = quack_gemm_entry(9 if arch.startswith("sm_90") else 10, dynamic=dynamic)
    opts = "--enable-tvm-ffi" + (" --keep-ptx" if keep_ptx else "")
    return compile_traced(entry, *args, kernels=[cls], families=FAMILIES if families is None else families,
                          check=check, options=opts, cursor=cursor, l2=l2, split=split,
                          cta_lifetimes=cta_lifetimes, **({} if ring is None else {"ring": ring}))


# (name suffix, cursor, families, l2): the default build and the cost-by-family variants
VARIANTS = [("", "smem", None, "first"), ("_l2last", "smem", None, "last"), ("_gmem", "gmem", None, "first"),
            ("_pipeline", "smem", ("pipeline",), "first"), ("_mma", "smem", ("mma",), "first"),
            ("_tma", "smem", ("tma",), "first"), ("_barrier", "smem", ("barrier",), "first"),
            ("_none", "smem", (), "first"), ("_ring", "ring", None, "first")]
# Records per warp of the GEMM's ring build. quack's GEMM takes 230,400 B of dynamic shared
# memory (its stages fill the H200's 232,448 B a block may have but 2 KB), which starts at a 1 KB
# boundary after the static: the smem cursor's 128 B already hold that first 1 KB, and rings of 8
# records for its 12 warps (768 B more) fit in it too, so the ring build takes no more shared
# memory than the smem one (a ring of 16 would fill the block exactly; 128 does not launch). A
# record costs the same whatever the ring's size; only the copy at exit is shorter.
GEMM_RING = 8


# FA4 (non-causal) cost by family: (suffix, families, with the softmax / rescale spans, cursor);
# "_ring" is the default build's ring twin (every family + the spans)
FA4_VARIANTS = [("_l2last", None, True, "smem"), ("_nospans", None, False, "smem"),
                ("_pipeline", ("pipeline",), False, "smem"), ("_mma", ("mma",), False, "smem"),
                ("_barrier", ("barrier",), False, "smem"), ("_tma", ("tma",), False, "smem"),
                ("_spans", (), True, "smem"), ("_none", (), False, "smem"), ("_ring", None, True, "ring"),
                ("_spb", ("pipeline", "barrier"), True, "smem"), ("_spb_ring", ("pipeline", "barrier"), True, "ring")]
# our decode kernel, generic events: (suffix, l2, cursor)
DECODE_VARIANTS = [("", "first", "smem"), ("_l2last", "last", "smem"), ("_ring", "first", "ring")]


def compile_fa4_prefill(*, causal: bool, keep_ptx: bool = False, check: bool = True, cursor: str = "smem",
                        families=None, spans: bool = True, l2: str = "first"):
    """FA4's SM90 forward for a prefill shape, through FA4's own interface (its tile, its
    schedule), instrumented by the generic layer plus two named spans (softmax, rescale)."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from fa4trace.auto.compiler import compile_traced
    from fa4trace.fa4.build import capture, target

    p = FA4_PREFILL
    with target("sm90"):
        cap = capture("sm90", schedule="pingpong", d=p["d"], hq=p["h"], hkv=p["h"], sq=p["seqlen"], sk=p["seqlen"],
                      b=p["b"], causal=causal)
        opts = cap.options + (" --keep-ptx" if keep_ptx else "")
        from fa4trace.auto.events import FAMILIES

        c = compile_traced(cap.kernel, *cap.args, spans=FA4_SPANS if spans else None, check=check, cursor=cursor,
                           families=FAMILIES if families is None else families, options=opts, l2=l2)
    return c, cap.config


def decode_shape():
    from fa4trace.attention.shapes import Shape

    p = DECODE
    return Shape(b=p["b"], sq=p["sq"], hq=p["hq"], hkv=p["hkv"], sk=p["sk"], d=p["d"], dtype="bf16")


def decode_inputs(sms: int, n_sets: int = 8):
    """(split plan, ``n_sets`` input sets (q, k, v, out), workspace) for our decode kernel at
    DECODE's shape on a GPU of ``sms`` SMs: what a benchmark replays through its launches."""
    import torch

    from fa4trace.attention.api import variant_for
    from fa4trace.attention.planner import plan_splits

    d, shape = DECODE, decode_shape()
    variant = variant_for(shape, d["schedule"])
    plan = plan_splits(shape, variant.tile_n, sms, None, variant.block_rows)
    g = torch.Generator(device="cuda").manual_seed(0)
    sets = []
    for _ in range(n_sets):
        q = torch.randn(d["b"], d["sq"], d["hq"], d["d"], dtype=torch.bfloat16, device="cuda", generator=g)
        kk = torch.randn(d["b"], d["sk"], d["hkv"], d["d"], dtype=torch.bfloat16, device="cuda", generator=g)
        vv = torch.randn(d["b"], d["sk"], d["hkv"], d["d"], dtype=torch.bfloat16, device="cuda", generator=g)
        sets.append((q, kk, vv, torch.empty_like(q)))
    n_o, n_l = plan.workspace_floats(shape)
    ws = (torch.empty((d["b"], d["hq"], d["sq"]), dtype=torch.float32, device="cuda"),
          torch.empty(n_o, dtype=torch.float32, device="cuda"), torch.empty(n_l, dtype=torch.float32, device="cuda"),
          torch.zeros(4096, dtype=torch.int32, device="cuda"))
    return plan, sets, ws


def compile_decode(*, keep_ptx: bool = False, check: bool = True, l2: str = "first", families=None,
                   cursor: str = "smem"):
    """Our decode kernel's uninstrumented variant, with the generic layer's events only
    (``families``: which; default all)."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from fa4trace.attention.api import variant_for
    from fa4trace.auto.compiler import compile_traced
    from fa4trace.auto.events import FAMILIES
    from fa4trace.kernels import attention_sm90 as A

    variant = variant_for(decode_shape(), DECODE["schedule"])
    opts = f"--enable-tvm-ffi --gpu-arch {A.ARCH} {A.PTXAS_OPTIONS}" + (" --keep-ptx" if keep_ptx else "")
    c = compile_traced(A.DecodeAttentionSm90(variant), *A.fake_arguments(variant.head_dim, variant.dtype, False),
                       check=check, options=opts, l2=l2, families=FAMILIES if families is None else families,
                       cursor=cursor)
    return c, variant


# ``build --ring-only``: the ring builds, their smem-cursor twins and what ``run`` needs beside them
RING_BUILDS = ("quack_gemm_sm90", "quack_gemm_sm90_ring", "fa4_sm90_prefill_full", "fa4_sm90_prefill_full_ring",
               "fa4_sm90_prefill_full_spb", "fa4_sm90_prefill_full_spb_ring", "decode_sm90_generic",
               "decode_sm90_generic_l2last", "decode_sm90_generic_ring")


def build(out: str, force: bool, ring_only: bool = False) -> None:
    from fa4trace.auto.build import entries
    from fa4trace.run.aot import build_library

    def wanted(name: str) -> bool:
        return not ring_only or name in RING_BUILDS

    t = time.time()
    ents = {}
    for suffix, cursor, fams, l2 in VARIANTS:
        if not wanted("quack_gemm_sm90" + suffix):
            continue
        c = compile_quack_gemm(cursor=cursor, families=fams, check=not ents, l2=l2,
                               ring=GEMM_RING if cursor == "ring" else None)
        ents.update(entries("quack_gemm_sm90" + suffix, c,
                            {"kernel": "quack GemmSm90", "tile": list(TILE), "cluster": list(CLUSTER),
                             "quack": _version("quack-kernels"), "cursor": cursor, "l2": l2,
                             "ring": c.meta.get("ring"), "families": sorted(c.meta["families"])}))
    for causal in (False, True):
        if not wanted(f"fa4_sm90_prefill_{'causal' if causal else 'full'}"):
            continue
        c, cfg = compile_fa4_prefill(causal=causal)
        ents.update(entries(f"fa4_sm90_prefill_{'causal' if causal else 'full'}", c,
                            dict(cfg, kernel=f"FA4 {cfg['kernel_class']} prefill{' causal' if causal else ''}",
                                 cursor="smem", families=sorted(c.meta["families"]), spans=sorted(FA4_SPANS))))
    for sfx, fams, sp, cursor in FA4_VARIANTS:
        if not wanted(f"fa4_sm90_prefill_full{sfx}"):
            continue
        c, cfg = compile_fa4_prefill(causal=False, families=fams, spans=sp, check=False, cursor=cursor,
                                     l2="last" if sfx == "_l2last" else "first")
        ents.update(entries(f"fa4_sm90_prefill_full{sfx}", c,
                            dict(cfg, kernel="FA4 prefill", cursor=cursor, ring=c.meta.get("ring"), l2=c.meta["l2"],
                                 families=sorted(c.meta["families"]),
                                 spans=sorted(FA4_SPANS) if sp else [])))
    for sfx, l2, cursor in DECODE_VARIANTS:
        if not wanted("decode_sm90_generic" + sfx):
            continue
        c, variant = compile_decode(l2=l2, check=not sfx, cursor=cursor)
        ents.update(entries("decode_sm90_generic" + sfx, c,
                            {"kernel": f"fa4trace decode ({variant.name}), generic events only", "variant": variant.name,
                             "cursor": cursor, "ring": c.meta.get("ring"), "l2": l2,
                             "families": sorted(c.meta["families"]), **DECODE}))
    build_library(ents, out, arch="sm_90a", overwrite=force)
    print(f"built {', '.join(ents)} into {out} in {time.time() - t:.0f} s")


def _version(dist: str) -> str:
    from importlib import metadata

    return metadata.version(dist)


# ---- run (GPU: torch + tvm-ffi) -------------------------------------------------------------
def _cursor_text(cfg: dict) -> str:
    """A build's recorder placement as a row says it: "smem", "ring (8 records/warp)", ..."""
    text = f"ring ({cfg['ring']} records/warp)" if cfg.get("cursor") == "ring" else cfg.get("cursor", "smem")
    return text + (", L2 evict_last" if cfg.get("l2") == "last" else "")


def _refused(launch) -> str | None:
    """None where ``launch()`` runs; else the first line of why the GPU refused it (a build's
    shared memory, say), so that one build cannot stop the run."""
    import torch

    try:
        launch()
        torch.cuda.synchronize()
        return None
    except Exception as exc:  # noqa: BLE001 (the DSL and tvm-ffi raise their own types)
        lines = str(exc).strip().splitlines()
        return lines[0][:200] if lines else type(exc).__name__


def _ring_bundle(build_dir: str, name: str, call, options, config: dict, out: str, plain_of: str,
                 file: str | None = None) -> dict:
    """One launch of the ring build ``name`` through ``fa4trace.auto.build.load`` (``options``:
    who records; the output checked against the plain build of ``plain_of``), decoded into
    ``<out>/<file or name>.parquet``: the row fields that say what the rings kept and overwrote."""
    from fa4trace.analysis.overlap import ring_losses, summarize
    from fa4trace.analysis.text import dropped_text
    from fa4trace.auto.build import load

    kern = load(build_dir, name, options=options)
    if kern.plain is None:  # variants are built without their plain twin: the kernel's default build has it
        kern.plain = load(build_dir, plain_of).plain
    try:
        call(kern)
        trace = kern.trace(config=config)
    except Exception as exc:  # noqa: BLE001 (a refused launch, a buffer that does not decode)
        return {"bundle_error": (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]}
    path = os.path.join(out, f"{file or name}.parquet")
    trace.save(path, overwrite=True)
    losses = ring_losses(trace)
    return {"bitwise_equal": all(kern.checked) if kern.checked else None, "events": len(trace),
            "cursor_used": kern.meta.get("cursor"), "overwritten": losses.get("overwritten"),
            "ring_line": dropped_text(summarize(trace)), "bundle": os.path.basename(path)}


def _pair_rings(rows: list) -> None:
    """Each ring build's row gets the cost of its smem-cursor twin (the build of the same name
    without "_ring": the same kernel, shape and events), and one line says both."""
    for r in rows:
        if not str(r.get("build", "")).endswith("_ring") or r.get("cost_pct") is None:
            continue
        twin = next((t for t in rows if t.get("build") == r["build"][:-len("_ring")] and t["kernel"] == r["kernel"]
                     and t["shape"] == r["shape"] and "lead warps" not in t.get("families", "")
                     and t.get("cost_pct") is not None), None)
        if twin is not None:
            r["smem_cost_pct"] = twin["cost_pct"]
            print(f"ring vs smem cursor: {r['kernel']} {r['shape']}, {r['families']}: ring {r['cost_pct']:+.2f}% "
                  f"({r['cursor']}), smem {twin['cost_pct']:+.2f}%", flush=True)


def run(build_dir: str, out: str, json_path: str | None, rounds: int, replays: int,
        kernels=("gemm", "fa4", "decode")) -> None:
    import torch

    from fa4trace.auto.build import load
    from fa4trace.auto.run import RecordOptions
    from fa4trace.format.options import Sampling
    from fa4trace.bench import results
    from fa4trace.run.timing import graph_time

    os.makedirs(out, exist_ok=True)
    rows = []
    for label, (m, n, k) in GEMM_SHAPES.items() if "gemm" in kernels else ():
        torch.manual_seed(0)
        sets = []
        n_sets = max(1, min(8, (256 << 20) // ((m * k + n * k) * 2)))
        for _ in range(n_sets):
            sets.append((torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                         torch.randn(n, k, device="cuda", dtype=torch.bfloat16),
                         torch.empty(m, n, device="cuda", dtype=torch.bfloat16)))
        a, b, d = sets[0]
        # 1) the bundle: 8 CTAs spread over the persistent grid, every warp, output checked
        kern = load(build_dir, "quack_gemm_sm90",
                    options=RecordOptions(Sampling(ctas=8, cta_stride=16, capacity=16384)))
        kern(a, b, d)
        ref = (a.float() @ b.float().T)
        rel = float(((d.float() - ref).norm() / ref.norm()).item())
        trace = kern.trace(config={"m": m, "n": n, "k": k, "dtype": "bf16", "tile": list(TILE)})
        path = os.path.join(out, f"quack_gemm_sm90_{label}.parquet")
        trace.save(path, overwrite=True)
        # 2) the cost: every warp of every CTA records; each variant against the plain build,
        #    rounds interleaved (plain, variant 1, variant 2, ... per round)
        from fa4trace.run.aot import BuildDir
        from fa4trace.run.record import new_trace_tensor

        names = [f"quack_gemm_sm90{sfx}" for sfx, _c, _f, _l in VARIANTS if f"quack_gemm_sm90{sfx}" in BuildDir(build_dir).functions]
        opts = RecordOptions(Sampling(ctas=H200_SMS, capacity=1 << 15), check=False)
        kerns = {nm: load(build_dir, nm, options=opts) for nm in names}
        plain = kerns[names[0]].plain
        spec = opts.spec(kerns[names[0]].warps_per_cta)
        bufs = [new_trace_tensor(spec) for _ in range(n_sets)]
        refused = {nm: _refused(lambda kk=kk: kk.fn(*sets[0], bufs[0])) for nm, kk in kerns.items()}
        kerns = {nm: kk for nm, kk in kerns.items() if refused[nm] is None}
        # the default build with one warp per warpgroup recording (0, 4, 8): the others skip their stores
        lead = RecordOptions(Sampling(ctas=H200_SMS, capacity=1 << 15, warps=LEAD_WARPS), check=False)
        lbufs = [new_trace_tensor(lead.spec(kerns[names[0]].warps_per_cta)) for _ in range(n_sets)]
        times: dict = {"plain": [], "lead": []}
        for _ in range(rounds):
            times["plain"].append(graph_time(lambda i: plain(*sets[i]), n_sets, replays, n_sets * 4)[0])
            for nm, kk in kerns.items():
                times.setdefault(nm, []).append(graph_time(lambda i: kk.fn(*sets[i], bufs[i]), n_sets, replays,
                                                           n_sets * 4)[0])
            times["lead"].append(graph_time(lambda i: kerns[names[0]].fn(*sets[i], lbufs[i]), n_sets, replays,
                                            n_sets * 4)[0])
        med = {nm: sorted(v)[len(v) // 2] for nm, v in times.items()}
        tp = med["plain"]
        rows.append({"kernel": "quack GemmSm90", "shape": f"{m}x{n}x{k}", "build": names[0], "cursor": "smem",
                     "families": "barrier+mma+pipeline+tma; lead warps 0, 4, 8 record", "plain_us": round(tp, 2),
                     "traced_us": round(med["lead"], 2), "cost_pct": round(100 * (med["lead"] / tp - 1), 2)})
        print(json.dumps(rows[-1]), flush=True)
        dropped = int(trace.events.column("dropped").to_numpy().max()) if len(trace) else 0
        for nm in names:
            cfg = BuildDir(build_dir).functions[nm]["config"]
            row = {"kernel": "quack GemmSm90", "shape": f"{m}x{n}x{k}", "build": nm, "cursor": _cursor_text(cfg),
                   "families": "+".join(cfg["families"]) or "lifetimes only", "plain_us": round(tp, 2)}
            if refused[nm] is not None:
                rows.append(dict(row, traced_us=None, cost_pct=None, refused=refused[nm]))
                print(json.dumps(rows[-1]), flush=True)
                continue
            if cfg.get("cursor") == "ring":
                row.update(_ring_bundle(build_dir, nm, lambda kk: kk(a, b, d),
                                        RecordOptions(Sampling(ctas=8, cta_stride=16, capacity=16384)),
                                        {"m": m, "n": n, "k": k, "dtype": "bf16", "tile": list(TILE)}, out, names[0],
                                        f"{nm}_{label}"))
            rows.append({**row, "traced_us": round(med[nm], 2),
                         "cost_pct": round(100 * (med[nm] / tp - 1), 2),
                         "tflops_plain": round(2 * m * n * k / tp / 1e6, 1),
                         "bitwise_equal": ((all(kern.checked) if kern.checked else None) if nm == names[0]
                                           else row.get("bitwise_equal")),
                         "rel_err_vs_fp32": rel if nm == names[0] else None,
                         "events": len(trace) if nm == names[0] else row.get("events"),
                         "dropped": dropped if nm == names[0] else None,
                         "bundle": os.path.basename(path) if nm == names[0] else row.get("bundle")})
            print(json.dumps(rows[-1]), flush=True)
    if "fa4" in kernels:
        rows += run_fa4(build_dir, out, rounds, replays)
    if "decode" in kernels:
        rows += run_decode(build_dir, out, rounds, replays)
    _pair_rings(rows)
    if json_path:
        doc = results.envelope("auto-kernels", "Automatic events on kernels fa4trace never saw", rows,
                               columns=[["kernel", "kernel"], ["shape", "m x n x k"], ["cursor", "cursor"],
                                        ["families", "families"], ["plain_us", "plain µs"],
                                        ["traced_us", "traced µs"], ["cost_pct", "cost %"],
                                        ["bitwise_equal", "traced == plain"], ["events", "events in bundle"]],
                               notes="traced = every warp of every CTA records, all four families on; "
                                     "the bundle records 8 CTAs. CUDA-graph replay, cold L2, rounds interleaved. "
                                     "cursor ring: each record a shared-memory store, copied out at the warp's exit "
                                     "(smem_cost_pct: the smem-cursor twin's cost in the same rounds).")
        results.write(json_path, doc)


def run_fa4(build_dir: str, out: str, rounds: int, replays: int) -> list:
    """FA4 SM90 prefill, causal and not: bundle (8 CTAs spread, every warp, output checked) and
    cost (every CTA, every warp), against the plain build, rounds interleaved."""
    import math

    import torch

    from fa4trace.auto.build import load
    from fa4trace.auto.run import RecordOptions
    from fa4trace.format.options import Sampling
    from fa4trace.fa4.run import call_args
    from fa4trace.run.record import new_trace_tensor
    from fa4trace.run.timing import paired_costs

    p = FA4_PREFILL
    rows = []
    from fa4trace.run.aot import BuildDir

    for variant in ("full", "causal"):
        name = f"fa4_sm90_prefill_{variant}"
        if name not in BuildDir(build_dir).functions:  # a build --ring-only has no causal one
            continue
        torch.manual_seed(1)
        n_sets = 4
        sets = []
        for _ in range(n_sets):
            q, k, v = (torch.randn(p["b"], p["seqlen"], p["h"], p["d"], device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            sets.append((q, k, v, torch.empty_like(q)))
        scale = 1.0 / math.sqrt(p["d"])
        kern = load(build_dir, name, options=RecordOptions(Sampling(ctas=8, cta_stride=17, capacity=1 << 15)))
        params = kern.meta["params"][:-1]

        def args(i, trace=None):
            q, k, v, o = sets[i]
            return call_args(params, q=q, k=k, v=v, out=o, softmax_scale=scale, trace=trace)

        kern(*args(0))
        q, k, v, o = sets[0]
        ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(),
                                                               v.transpose(1, 2).float(), is_causal=variant == "causal")
        rel = float(((o.transpose(1, 2).float() - ref).norm() / ref.norm()).item())
        trace = kern.trace(config={"b": p["b"], "seqlen": p["seqlen"], "h": p["h"], "d": p["d"], "dtype": "bf16",
                                   "causal": variant == "causal"})
        path = os.path.join(out, f"{name}.parquet")
        trace.save(path, overwrite=True)
        n_ctas = p["b"] * p["h"] * math.ceil(p["seqlen"] / 128)
        full = load(build_dir, name, options=RecordOptions(Sampling(ctas=n_ctas, capacity=1 << 13), check=False))
        spec = full.options.spec(full.warps_per_cta)
        bufs = [new_trace_tensor(spec) for _ in range(n_sets)]
        others = [] if variant != "full" else [name + sfx for sfx, _f, _s, _c in FA4_VARIANTS
                                               if name + sfx in BuildDir(build_dir).functions]
        fns = {nm: load(build_dir, nm, options=full.options).fn for nm in others}
        refused = {nm: _refused(lambda fn=fn: fn(*args(0), bufs[0])) for nm, fn in fns.items()}
        fns = {nm: fn for nm, fn in fns.items() if refused[nm] is None}
        # the same build with one warp per warpgroup recording in every CTA (the others' stores
        # predicated off); a sample of CTAs is bench_cta_sample.py's
        lead_opts, lead_what = (RecordOptions(Sampling(ctas=n_ctas, capacity=1 << 13, warps=LEAD_WARPS),
                                              check=False),
                                "lead warps 0, 4, 8 record")
        sbufs = [new_trace_tensor(lead_opts.spec(full.warps_per_cta)) for _ in range(n_sets)]
        launches = {name: lambda i: full.fn(*args(i), bufs[i]), "lead": lambda i: full.fn(*args(i), sbufs[i])}
        launches.update({nm: (lambda i, fn=fn: fn(*args(i), bufs[i])) for nm, fn in fns.items()})
        timed = paired_costs(lambda i: full.plain(*args(i)), launches, n_sets, replays, n_sets * 2, rounds)
        mp, mt, cost = timed[name]
        lp, ls, lcost = timed["lead"]
        rows.append({"kernel": f"FA4 SM90 prefill {variant}", "shape": f"b{p['b']} s{p['seqlen']} h{p['h']} d{p['d']}",
                     "build": name, "cursor": "smem",
                     "families": f"barrier+mma+pipeline+tma + softmax, rescale spans; {lead_what}",
                     "plain_us": round(lp, 2), "traced_us": round(ls, 2), "cost_pct": round(lcost, 2)})
        print(json.dumps(rows[-1]), flush=True)
        for nm in others:
            cfg = BuildDir(build_dir).functions[nm]["config"]
            row = {"kernel": f"FA4 SM90 prefill {variant}", "shape": f"b{p['b']} s{p['seqlen']} h{p['h']} d{p['d']}",
                   "build": nm, "cursor": _cursor_text(cfg),
                   "families": ("+".join(cfg["families"]) or "lifetimes only")
                   + (" + softmax, rescale spans" if cfg.get("spans") else ""), "plain_us": round(mp, 2)}
            if refused[nm] is not None:
                rows.append(dict(row, traced_us=None, cost_pct=None, refused=refused[nm]))
            else:
                op, mo, ocost = timed[nm]
                if cfg.get("cursor") == "ring":
                    row.update(_ring_bundle(build_dir, nm, lambda kk: kk(*args(0)),
                                            RecordOptions(Sampling(ctas=8, cta_stride=17, capacity=1 << 15)),
                                            {"b": p["b"], "seqlen": p["seqlen"], "h": p["h"], "d": p["d"],
                                             "dtype": "bf16", "causal": False}, out, name))
                rows.append(dict(row, plain_us=round(op, 2), traced_us=round(mo, 2), cost_pct=round(ocost, 2)))
            print(json.dumps(rows[-1]), flush=True)
        flops = 4 * p["b"] * p["h"] * p["seqlen"] ** 2 * p["d"] / (2 if variant == "causal" else 1)
        rows.append({"kernel": f"FA4 SM90 prefill {variant}", "shape": f"b{p['b']} s{p['seqlen']} h{p['h']} d{p['d']}",
                     "build": name, "cursor": "smem", "families": "barrier+mma+pipeline+tma + softmax, rescale spans",
                     "plain_us": round(mp, 2), "traced_us": round(mt, 2), "cost_pct": round(cost, 2),
                     "tflops_plain": round(flops / mp / 1e6, 1), "bitwise_equal": all(kern.checked),
                     "rel_err_vs_fp32": rel, "events": len(trace),
                     "dropped": int(trace.events.column("dropped").to_numpy().max()), "bundle": os.path.basename(path)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def run_decode(build_dir: str, out: str, rounds: int, replays: int) -> list:
    """Our decode kernel traced by the generic layer alone: bundle (every CTA and warp, output
    checked) and cost against the same variant's plain build."""
    import math

    import torch

    from fa4trace.attention.api import variant_for
    from fa4trace.auto.build import load
    from fa4trace.auto.run import RecordOptions
    from fa4trace.format.options import Sampling
    from fa4trace.run.record import new_trace_tensor
    from fa4trace.run.timing import graph_time

    p = DECODE
    variant = variant_for(decode_shape(), p["schedule"])
    n_sets = 8
    plan, sets, (lse, o_part, lse_part, count) = decode_inputs(torch.cuda.get_device_properties(0).multi_processor_count,
                                                               n_sets)
    scale = 1.0 / math.sqrt(p["d"])

    def args(i):
        q, k, v, o = sets[i]
        return (q, k, v, o, lse, o_part, lse_part, count, *plan.kernel_args(scale), None)

    kern = load(build_dir, "decode_sm90_generic",
                options=RecordOptions(Sampling(ctas=plan.n_ctas, capacity=4096)))
    kern(*args(0))
    trace = kern.trace(config=dict(p, dtype="bf16", variant=variant.name))
    path = os.path.join(out, "decode_d128_16to1_sk131072_b1_pingpong_generic.parquet")
    trace.save(path, overwrite=True)
    full = load(build_dir, "decode_sm90_generic",
                options=RecordOptions(Sampling(ctas=plan.n_ctas, capacity=4096), check=False))
    last = load(build_dir, "decode_sm90_generic_l2last", options=full.options).fn
    bufs = [new_trace_tensor(full.options.spec(full.warps_per_cta)) for _ in range(n_sets)]
    from fa4trace.run.aot import BuildDir

    ring_name = "decode_sm90_generic_ring"
    ring = load(build_dir, ring_name, options=full.options).fn if ring_name in BuildDir(build_dir).functions else None
    ring_refused = None if ring is None else _refused(lambda: ring(*args(0), bufs[0]))
    tp, tt, tl, tr = [], [], [], []
    for _ in range(rounds):
        tp.append(graph_time(lambda i: full.plain(*args(i)), n_sets, replays, n_sets * 8)[0])
        tt.append(graph_time(lambda i: full.fn(*args(i), bufs[i]), n_sets, replays, n_sets * 8)[0])
        tl.append(graph_time(lambda i: last(*args(i), bufs[i]), n_sets, replays, n_sets * 8)[0])
        if ring is not None and ring_refused is None:
            tr.append(graph_time(lambda i: ring(*args(i), bufs[i]), n_sets, replays, n_sets * 8)[0])
    mp, mt, ml = sorted(tp)[len(tp) // 2], sorted(tt)[len(tt) // 2], sorted(tl)[len(tl) // 2]
    extra = {"kernel": "fa4trace decode, generic events only", "shape": "d128 16:1 sk131072 b1 pingpong",
             "build": "decode_sm90_generic_l2last", "cursor": "smem, L2 evict_last", "families": "barrier+mma+pipeline+tma",
             "plain_us": round(mp, 2), "traced_us": round(ml, 2), "cost_pct": round(100 * (ml / mp - 1), 2)}
    print(json.dumps(extra), flush=True)
    row = {"kernel": "fa4trace decode, generic events only", "shape": "d128 16:1 sk131072 b1 pingpong",
           "build": "decode_sm90_generic", "cursor": "smem", "families": "barrier+mma+pipeline+tma",
           "plain_us": round(mp, 2), "traced_us": round(mt, 2), "cost_pct": round(100 * (mt / mp - 1), 2),
           "bitwise_equal": all(kern.checked), "events": len(trace),
           "dropped": int(trace.events.column("dropped").to_numpy().max()), "bundle": os.path.basename(path)}
    print(json.dumps(row), flush=True)
    if ring is None:
        return [extra, row]
    cfg = BuildDir(build_dir).functions[ring_name]["config"]
    rrow = {"kernel": row["kernel"], "shape": row["shape"], "build": ring_name, "cursor": _cursor_text(cfg),
            "families": row["families"], "plain_us": round(mp, 2)}
    if ring_refused is not None:
        rrow.update(traced_us=None, cost_pct=None, refused=ring_refused)
    else:
        mr = sorted(tr)[len(tr) // 2]
        rrow.update(_ring_bundle(build_dir, ring_name, lambda kk: kk(*args(0)),
                                 RecordOptions(Sampling(ctas=plan.n_ctas, capacity=4096)),
                                 dict(p, dtype="bf16", variant=variant.name),
                                 out, "decode_sm90_generic"))
        rrow.update(traced_us=round(mr, 2), cost_pct=round(100 * (mr / mp - 1), 2))
    print(json.dumps(rrow), flush=True)
    return [extra, row, rrow]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("-o", "--out", default="build/auto")
    b.add_argument("--force", action="store_true")
    b.add_argument("--ring-only", action="store_true",
                   help="only the ring builds, their smem-cursor twins and what run needs beside them")
    r = sub.add_parser("run")
    r.add_argument("build")
    r.add_argument("--out", required=True)
    r.add_argument("--json")
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--replays", type=int, default=10)
    r.add_argument("--kernels", default="gemm,fa4,decode", help="comma list of gemm, fa4, decode (default all)")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        build(a.out, a.force, a.ring_only)
    else:
        kernels = tuple(k for k in a.kernels.split(",") if k)
        bad = [k for k in kernels if k not in ("gemm", "fa4", "decode")]
        if bad:
            ap.error(f"unknown kernel(s) {', '.join(bad)}; choose from gemm, fa4, decode")
        run(a.build, a.out, a.json, a.rounds, a.replays, kernels)


if __name__ == "__main__":
    main()
