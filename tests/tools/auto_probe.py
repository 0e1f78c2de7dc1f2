"""Compile a kernel under fa4trace's automatic events in this (fresh) process and print a JSON
summary: what the compile found, the PTX's marker counts, and whether every hook was removed.

    python tests/tools/auto_probe.py quack_gemm sm_90a [--families pipeline,mma] [--cursor smem|gmem|ring] [--ring 64]
    python tests/tools/auto_probe.py plain_copy sm_90a
    python tests/tools/auto_probe.py --batch FILE   # a JSON list of argument lists, one target: a JSON list
"""


import argparse
import re
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmarks"))
from barrier_reads import waits_after_barriers  # noqa: E402  (beside this script)


def copy_kernel():
    """An element-wise copy with no pipeline, no TMA, no MMA, no named barrier."""
    import cutlass.cute as cute

    @cute.kernel
    def copy_kernel(src: cute.Tensor, dst: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * 128 + tidx
        dst[i] = src[i]

    @cute.jit
    def copy_entry(src: cute.Tensor, dst: cute.Tensor):
        copy_kernel(src, dst).launch(grid=(src.shape[0] // 128, 1, 1), block=(128, 1, 1))

    return copy_entry, copy_kernel


def _static_smem_kernel():
    """A copy through 32 KB of static shared memory (cute.arch.alloc_smem): it fits the 48 KB a
    kernel may hold statically once, not twice."""
    import cutlass
    import cutlass.cute as cute

    @cute.kernel
    def smem_kernel(src: cute.Tensor, dst: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        buf = cute.make_tensor(cute.arch.alloc_smem(cutlass.Float32, 8192, alignment=16), cute.make_layout(8192))
        i = bidx * 128 + tidx
        buf[tidx * 64] = src[i]
        cute.arch.sync_threads()
        dst[i] = buf[tidx * 64]

    @cute.jit
    def smem_entry(src: cute.Tensor, dst: cute.Tensor):
        smem_kernel(src, dst).launch(grid=(src.shape[0] // 128, 1, 1), block=(128, 1, 1))

    return smem_entry, smem_kernel


def originals():
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import warpgroup
    from cutlass.pipeline import PipelineTmaAsync

    return {"copy": cute.copy, "wait_group": warpgroup.wait_group, "barrier": cute.arch.barrier,
            "compile": cute.compile, "acquire": PipelineTmaAsync.producer_acquire}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel", choices=["quack_gemm", "plain_copy", "static_smem", "stateful", "global_state",
                                       "fa4_prefill", "span_loop", "span_barrier"])
    ap.add_argument("--payload", default=None, help="span_loop: the step span's payload argument")
    ap.add_argument("arch")
    ap.add_argument("--families", default=None)
    ap.add_argument("--cursor", default="smem")
    ap.add_argument("--ring", type=int, default=None, help="records per warp of --cursor ring")
    ap.add_argument("--no-split", action="store_true", help="one instrumented body for every CTA (split=False)")
    ap.add_argument("--no-lifetimes", action="store_true", help="no CTA-lifetime stamps (cta_lifetimes=False)")
    ap.add_argument("--hold-begins", action="store_true",
                    help="every span holds its begin across its call (families.STORE_AT_BEGIN empty)")
    return ap


def main():
    """One compile (the arguments), or ``--batch FILE``: every argument list of the JSON list in
    FILE compiled one after another in this process (one target: the DSL reads it at import),
    their summaries printed as one JSON list - the imports and the DSL's first compile paid once."""
    if sys.argv[1:2] == ["--batch"]:
        with open(sys.argv[2]) as f:
            batch = json.load(f)
        archs = {parser().parse_args(args).arch for args in batch}
        if len(archs) > 1:
            raise SystemExit(f"auto_probe --batch: one target per batch, got {sorted(archs)}")
        print(json.dumps([_or_error(args) for args in batch]))
    else:
        print(json.dumps(run_one(sys.argv[1:])))


def _or_error(argv: list) -> dict:
    """``run_one``, or where it raised, {"batch_error": what} (the caller runs that one alone, where
    its traceback is the test's message; the rest of the batch goes on)."""
    try:
        return run_one(argv)
    except Exception as exc:  # noqa: BLE001
        return {"batch_error": f"{type(exc).__name__}: {exc}"}


def run_one(argv: list) -> dict:
    """What one compile under fa4trace's automatic events found (the module doc's summary)."""
    a = parser().parse_args(argv)
    os.environ["CUTE_DSL_ARCH"] = a.arch
    import fa4trace.auto.families as families

    held = families.STORE_AT_BEGIN
    if a.hold_begins:
        families.STORE_AT_BEGIN = frozenset()
    try:
        return _compile(a)
    finally:
        families.STORE_AT_BEGIN = held  # the next compile of a batch stores its begins as the product does


def _compile(a) -> dict:
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    from fa4trace.auto.compiler import compile_traced

    fams = tuple(f for f in a.families.split(",") if f) if a.families is not None else None
    ring = {} if a.ring is None else {"ring": a.ring}
    before = originals()
    if a.kernel == "fa4_prefill":
        # FA4's forward for a prefill shape through FA4's own interface; on sm_100a with a span
        # named on FA4's softmax step (its tcgen05 MMAs are issued by FA4's own PTX helpers)
        from fa4trace.fa4.build import capture, target

        arch = "sm100" if a.arch.startswith("sm_100") else "sm90"
        spans = {"softmax": ("flash_attn.cute.flash_fwd_sm100:FlashAttentionForwardSm100.softmax_step" if arch == "sm100"
                             else "flash_attn.cute.softmax:Softmax.online_softmax")}
        with target(arch):
            cap = capture(arch, schedule="base" if arch == "sm100" else "pingpong", d=128, hq=16, hkv=16, sq=8192,
                          sk=8192, b=2)
            kw = {} if fams is None else {"families": fams}
            c = compile_traced(cap.kernel, *cap.args, spans=spans, check=False, cursor=a.cursor, **ring,
                               options=cap.options + " --keep-ptx", **kw)
        plain_ptx = None
    elif a.kernel == "quack_gemm":
        import auto_kernels as ak

        c = ak.compile_quack_gemm(arch=a.arch, keep_ptx=True, check=False, families=fams, cursor=a.cursor, **ring,
                                  split=not a.no_split, cta_lifetimes=not a.no_lifetimes)
        plain_ptx = None
    elif a.kernel == "span_loop":
        # a module-level helper, named as a user names one: "module:function"
        import span_loop_kernel as sk
        from fa4trace.format.errors import Fa4traceError

        spec = "span_loop_kernel:step" if a.payload is None else {"target": "span_loop_kernel:step",
                                                                  "payload": a.payload}
        t = make_fake_compact_tensor(cutlass.Float32, (cute.sym_int(),), assumed_align=16)
        try:
            c = compile_traced(sk.loop_entry, t, cutlass.Int32(4), kernels=[sk.loop_kernel], families=(),
                               spans={"step": spec}, check=False, options="--keep-ptx")
        except (Fa4traceError, ValueError) as exc:
            return {"error": type(exc).__name__, "message": str(exc), "restored": True}
        plain_ptx = None
    elif a.kernel == "span_barrier":
        # a user's span around a helper that syncs a named barrier (a hooked call inside it)
        import span_loop_kernel as sk

        t = make_fake_compact_tensor(cutlass.Float32, (cute.sym_int(),), assumed_align=16)
        c = compile_traced(sk.sync_loop_entry, t, cutlass.Int32(4), kernels=[sk.sync_loop_kernel],
                           families=fams if fams is not None else ("barrier",),
                           spans={"step": "span_loop_kernel:step_sync"}, check=False, options="--keep-ptx")
        plain_ptx = None
    elif a.kernel in ("stateful", "global_state"):
        import stateful_kernel as sk

        t = make_fake_compact_tensor(cutlass.Float32, (cute.sym_int(),), assumed_align=16)
        k = sk.StatefulKernel() if a.kernel == "stateful" else sk.GlobalStateKernel()
        c = compile_traced(k, t, check=False, options="--keep-ptx", split=not a.no_split)
        plain_ptx = None
    else:
        entry, kern = _static_smem_kernel() if a.kernel == "static_smem" else copy_kernel()
        t = make_fake_compact_tensor(cutlass.Float32, (cute.sym_int(),), assumed_align=16)
        kw = {} if fams is None else {"families": fams}
        c = compile_traced(entry, t, t, kernels=[kern], check=True, cursor=a.cursor, options="--keep-ptx", **ring,
                           split=not a.no_split, cta_lifetimes=not a.no_lifetimes, **kw)
        plain_ptx = c.plain.__ptx__
    after = originals()
    ptx = c.ptx or ""
    entry_ptx = ptx[ptx.index(".entry"):] if ".entry" in ptx else ""
    return {
        "meta": c.meta, "params": c.params,
        "vocab": [e.name for e in c.vocab.events if e.family],
        "restored": all(before[k] is after[k] for k in before),
        "ptx_globaltimer": ptx.count("%globaltimer"), "ptx_cluster_sregs": sorted(set(re.findall(r"%(nclusterid|clusterid|cluster_nctarank|cluster_ctarank)\.?[xyz]?", ptx))), "ptx_clock64": ptx.count("%clock64"),
        "ptx_record_stores": ptx.count("st.global.L2::cache_hint"),
        # a ring's record stores (8 bytes into shared memory); the global record stores of a
        # ring's copy at the warp's exit; conditional branches (a slot's record store has its
        # bounds branch)
        "ptx_shared_b64_stores": len(re.findall(r"\bst\.shared\.[bu]64\b", ptx)),
        "ptx_exit_record_stores": _exit_record_stores(entry_ptx),
        "ptx_branches": len(re.findall(r"@!?%p\d+\s+bra\b", entry_ptx)),
        # the CTA-lifetime stamps (and any other reduction or atomic of the kernel's own)
        "ptx_red_max_u64": len(re.findall(r"\bred(\.\w+)*\.global\.max\.u64\b|\bred\.global(\.\w+)*\.max\.u64\b", ptx)),
        "ptx_atomics": len(re.findall(r"\b(red|atom)\.", ptx)),
        # a payload read at run time: shifted into bits 44.. or, in a loop, stepped by 1 << 44
        "ptx_payload_ops": len(re.findall(r"shl\.b64\s+%rd\d+,\s*%rd\d+,\s*44;|,\s*17592186044416;", ptx)),
        "plain_globaltimer": None if plain_ptx is None else plain_ptx.count("%globaltimer"),
        "ptx_mma": len(re.findall(r"wgmma\.mma_async|tcgen05\.mma", ptx)),
        "ptx_static_smem": sum(int(n) for n in re.findall(r"^\s*\.shared\s.*\.b8\s+\w+\[(\d+)\];", ptx, re.M)),
        "ptx_barriers": len(re.findall(r"\bbar(rier)?\.sync", ptx)),
        "ptx_barriers_settled": sum(waits_after_barriers(ptx)),  # clock.after_barrier before the next read
        # the kernel's first and last timer reads, global loads and reductions, in order
        "ptx_top": _memory_ops(entry_ptx)[:4], "ptx_tail": _memory_ops(_after_last_join(entry_ptx)),
    }


def _exit_record_stores(ptx: str) -> int:
    """Record stores (st.global.L2::cache_hint) in a ring's copy at the warp's exit: after its
    bar.warp.sync, with no timer read between (an event's record would follow its timer read)."""
    lines = ptx.splitlines()
    n, sync = 0, None
    for i, ln in enumerate(lines):
        if "bar.warp.sync" in ln:
            sync = i
        elif "%clock64" in ln or "%globaltimer" in ln:
            sync = None
        elif "st.global.L2::cache_hint" in ln and sync is not None and i - sync < 40:
            n += 1
    return n


def _after_last_join(ptx: str) -> str:
    """The PTX from the last label before the kernel's last timer read (where the body's
    branches meet again) to its end."""
    last_timer = ptx.rfind("%globaltimer")
    return ptx[max(ptx.rfind("\n$L__", 0, last_timer), 0):] if last_timer >= 0 else ""


def _memory_ops(ptx: str) -> list:
    """'timer', 'load' (ld.global) and 'red' in the order the PTX holds them."""
    kinds = {"%globaltimer": "timer", "ld.global": "load", "red.": "red"}
    found = re.finditer(r"%globaltimer|ld\.global|\bred\.", ptx)
    return [kinds[m.group(0)] for m in found]


if __name__ == "__main__":
    main()
