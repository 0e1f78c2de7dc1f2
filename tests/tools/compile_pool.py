"""Compile kernel variants once, in parallel, and keep their PTX: the one compile that the PTX
tests and ``ptx_digests.py`` read.

Workers are spawned (not forked) so that each sets the DSL's environment before importing it:
the target arch and a PTX dump folder of its own (the DSL names a dump after the host function
and argument types, which variants share, so processes sharing a folder would read each
other's files).
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor


def _init(arch: str, dump_dir: str) -> None:
    mine = os.path.join(dump_dir, str(os.getpid()))
    os.makedirs(mine, exist_ok=True)
    os.environ["CUTE_DSL_ARCH"] = arch
    os.environ["CUTE_DSL_KEEP"] = "ptx"
    os.environ["CUTE_DSL_DUMP_DIR"] = mine


def _compile(arch: str, name: str) -> dict:
    from fa4trace import kernels

    t = time.time()
    for n, thunk, entry in kernels.aot_variants(arch):
        if n != name:
            continue
        if entry.kind == "attention":
            from fa4trace.kernels.attention_sm90 import compile_variant
            from fa4trace.kernels.decode_spec import all_variants

            variant = next(v for v in all_variants() if v.name == name)
            fn, kern = compile_variant(variant)
            config = {**kern.config(), "smem_bytes": kern.shared_storage.size_in_bytes()}
        else:
            fn, config = thunk(), dict(entry.config)
        return {"name": name, "kind": entry.kind, "ptx": fn.artifacts.PTX, "config": config,
                "compile_s": time.time() - t}
    raise KeyError(f"no {arch} kernel variant {name}")


def variant_names(arch: str, kinds=None) -> list[str]:
    """Names of the variants ``fa4trace build`` exports for ``arch`` (without compiling)."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    from fa4trace import kernels

    return [n for n, _t, e in kernels.aot_variants(arch) if kinds is None or e.kind in kinds]


def compile_all(arch: str, names: list[str], jobs: int | None = None, progress=None) -> dict[str, dict]:
    """{name: {"ptx", "config", "kind", "compile_s"}} for each name, compiled in ``jobs`` processes."""
    jobs = jobs or os.cpu_count() or 1
    out = {}
    with tempfile.TemporaryDirectory(prefix="fa4trace_ptx_") as dump, \
            ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                initializer=_init, initargs=(arch, dump)) as pool:
        for i, r in enumerate(pool.map(_compile, [arch] * len(names), names), 1):
            out[r["name"]] = r
            if progress:
                progress(i, len(names), r)
    return out
