"""One-off: an observer warp records pipeline full-barrier completions (FA4 SM90 prefill, quack GEMM)."""
import os, sys, json, math
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import auto_kernels as ak
OBS = {"fa4": (1, 1), "gemm": (9, 0)}
ak.VARIANTS[:] = [("", "smem", None, "first"), ("_none", "smem", (), "first"), ("_obs", "smem", (), "first")]
ak.FA4_VARIANTS[:] = [("_none", (), False), ("_obs", (), False)]
if sys.argv[1] == "build":
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from fa4trace.aot import build_library
    from fa4trace.auto.build import entries
    from fa4trace.auto import compiler as C
    orig = C.compile_traced
    ents = {}
    for sfx, fams in (("", None), ("_none", ()), ("_obs", ())):
        def ct(*a, **k):
            if sfx == "_obs":
                k["_observe"] = OBS[which]
            return orig(*a, **k)
        C.compile_traced = ct
        which = "gemm"
        c = ak.compile_quack_gemm(check=not sfx, families=fams)
        ents.update(entries("quack_gemm_sm90" + sfx, c, {"kernel": "quack GemmSm90", "cursor": "smem" + (", observer" if sfx == "_obs" else ""), "l2": "first", "families": sorted(c.meta["families"])}))
        which = "fa4"
        c, cfg = ak.compile_fa4_prefill(causal=False, check=not sfx, families=fams, spans=not sfx)
        print(sfx, c.meta["placed"])
        ents.update(entries("fa4_sm90_prefill_full" + sfx, c, dict(cfg, kernel="FA4 prefill", cursor="smem" + (", observer" if sfx == "_obs" else ""), l2="first", families=sorted(c.meta["families"]), spans=sorted(ak.FA4_SPANS) if not sfx else [])))
        if not sfx:
            c, cfg = ak.compile_fa4_prefill(causal=True)
            ents.update(entries("fa4_sm90_prefill_causal", c, dict(cfg, kernel="FA4 causal", cursor="smem", families=sorted(c.meta["families"]), spans=sorted(ak.FA4_SPANS))))
            c, variant = ak.compile_decode()
            ents.update(entries("decode_sm90_generic", c, {"kernel": "decode generic", "variant": variant.name, "cursor": "smem", "l2": "first", "families": sorted(c.meta["families"]), **ak.DECODE}))
            c, variant = ak.compile_decode(l2="last", check=False)
            ents.update(entries("decode_sm90_generic_l2last", c, {"kernel": "decode generic", "variant": variant.name, "cursor": "smem", "l2": "last", "families": sorted(c.meta["families"]), **ak.DECODE}))
    C.compile_traced = orig
    build_library(ents, sys.argv[2], arch="sm_90a", overwrite=True)
    print("built", list(ents))
elif sys.argv[1] == "check":
    import torch
    from fa4trace.auto.build import load
    from fa4trace.auto.run import RecordOptions
    from fa4trace.fa4.run import call_args
    b = sys.argv[2]
    p = ak.FA4_PREFILL
    q, k, v = (torch.randn(p["b"], p["seqlen"], p["h"], p["d"], device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    kern = load(b, "fa4_sm90_prefill_full_obs", options=RecordOptions(ctas=8, cta_stride=17, capacity=1 << 13, check=False))
    args = call_args(kern.meta["params"][:-1], q=q, k=k, v=v, out=o, softmax_scale=1 / math.sqrt(p["d"]), trace=None)
    kern(*args); torch.cuda.synchronize()
    tr = kern.trace(config=dict(p))
    names = tr.events.column("name").to_pylist()
    from collections import Counter
    print("FA4 observer bundle:", Counter(names).most_common(6), flush=True)
    tr.save(os.path.join(sys.argv[3], "fa4_obs.parquet"), overwrite=True)
    m = n = kk = 8192
    a = torch.randn(m, kk, device="cuda", dtype=torch.bfloat16); bb = torch.randn(n, kk, device="cuda", dtype=torch.bfloat16)
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    kern = load(b, "quack_gemm_sm90_obs", options=RecordOptions(ctas=8, cta_stride=16, capacity=1 << 14, check=False))
    kern(a, bb, d); torch.cuda.synchronize()
    tr = kern.trace(config={"m": m})
    print("GEMM observer bundle:", Counter(tr.events.column("name").to_pylist()).most_common(6), flush=True)
    tr.save(os.path.join(sys.argv[3], "gemm_obs.parquet"), overwrite=True)
else:
    ak.main(sys.argv[1:])
