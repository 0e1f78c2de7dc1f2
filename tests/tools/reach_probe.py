"""Caches a program filled before ``fa4trace.instrument()``, compiled here (no GPU), in this
fresh process; prints one JSON line of what each cache held before, inside and after the block.

    python tests/tools/reach_probe.py sm_90a QUACK_CACHE_DIR
    python tests/tools/reach_probe.py sm_90a --pair   # twice over one new folder: {"runs": [...]}

``--pair`` runs the probe in two fresh processes, one after the other, over one new cache
folder (the second starts from the object files the first wrote: a cache warm across
processes), FutureWarnings as errors, each run's stderr kept beside its JSON.

The caches: a user's dict named like a cache, a registry dict (not a cache: left alone),
quack's ``jit_cache`` (in memory and on disk), FA4's ``JITCache`` and ``JITPersistentCache``.
"""

import json
import os
import sys


# module-level plan caches, as quack keeps its GEMM plans
_plan_cache: dict = {}
_outer_plan_cache: dict = {}


def main():
    arch, qdir = sys.argv[1], sys.argv[2]
    os.environ["CUTE_DSL_ARCH"] = arch
    os.environ["QUACK_CACHE_DIR"] = qdir
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    import quack.cache as qcache
    from flash_attn.cute import cache_utils as fa_cache

    import fa4trace
    from fa4trace.auto.run import Instrumented

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import auto_probe

    copy_entry, _copy = auto_probe.copy_kernel()

    def fake():
        return make_fake_compact_tensor(cutlass.Float32, (cute.sym_int(),), assumed_align=16)

    def compile_copy():
        return cute.compile(copy_entry, fake(), fake(), options="--enable-tvm-ffi")

    # a user's own cache and registry, quack's jit_cache (memory + disk), FA4's caches
    kernel_cache = {}
    registry = {}

    @qcache.jit_cache
    def quack_compile(n):
        return compile_copy()

    fa_mem = fa_cache.JITCache()
    fa_disk = fa_cache.JITPersistentCache(__import__("pathlib").Path(qdir) / "fa4")

    def user_get(key):
        if key not in kernel_cache:
            kernel_cache[key] = compile_copy()
        return kernel_cache[key]

    def fa_get(cache, key):
        if key not in cache:
            cache[key] = compile_copy()
        return cache[key]

    def kinds():
        return {"user": type(user_get("k")).__name__, "quack": type(quack_compile(1)).__name__,
                "fa4": type(fa_get(fa_mem, "k")).__name__, "fa4_disk": type(fa_get(fa_disk, "k")).__name__}

    warm = {"user": user_get("k"), "quack": quack_compile(1), "fa4": fa_get(fa_mem, "k"),
            "fa4_disk": fa_get(fa_disk, "k")}
    registry["copy"] = warm["user"]
    # plans that hold compiled kernels (as quack's GEMM keeps them), one inside another
    from collections import namedtuple

    Plan = namedtuple("Plan", "fn cfg")
    Outer = namedtuple("Outer", "inner")
    _plan_cache["p"] = Plan(warm["user"], 1)
    _outer_plan_cache["o"] = Outer(Plan(warm["quack"], 2))
    plans_before = (_plan_cache["p"], _outer_plan_cache["o"])
    disk_before = sorted((p.name, p.stat().st_mtime_ns) for p in __import__("pathlib").Path(qdir).rglob("*.o"))
    with fa4trace.instrument(check=True, families=()) as rec:
        hidden = rec.hidden
        inside = kinds()
        inside_registry = registry["copy"] is warm["user"]
        plans_inside = ("p" in _plan_cache, "o" in _outer_plan_cache)
        _plan_cache["new"] = Plan(user_get("k"), 3)  # a plan made inside the block: it holds the traced kernel
        try:  # a kernel held where no cache is: its call is counted (it fails here: no GPU)
            registry["copy"](None, None)
        except Exception:  # noqa: BLE001
            pass
        compiled_inside = len(rec.kernels)
        same_objects_inside = {k: (v is warm[k]) for k, v in {"user": user_get("k"), "quack": quack_compile(1),
                                                              "fa4": fa_get(fa_mem, "k")}.items()}
    after = {"user": user_get("k") is warm["user"], "quack": quack_compile(1) is warm["quack"],
             "fa4": fa_get(fa_mem, "k") is warm["fa4"], "fa4_disk": fa_get(fa_disk, "k") is warm["fa4_disk"]}
    disk_after = sorted((p.name, p.stat().st_mtime_ns) for p in __import__("pathlib").Path(qdir).rglob("*.o"))
    print(json.dumps({
        "hidden": hidden, "inside": inside, "inside_registry_untouched": inside_registry,
        "compiled_inside": compiled_inside, "served_again_inside": same_objects_inside,
        "after_same_objects": after, "closed": [not k.active for k in rec.kernels],
        "instrumented_left": sum(isinstance(v, Instrumented) for v in list(kernel_cache.values())
                                 + list(quack_compile.cache.values()) + list(fa_mem.cache.values())
                                 + list(fa_disk.cache.values())),
        "quack_cache_enabled_after": qcache.CACHE_ENABLED,
        "fa4_disk_class_after": type(fa_disk).__name__,
        "disk_before": len(disk_before), "disk_after": len(disk_after), "disk_same": disk_before == disk_after,
        "unreached": rec.unreached, "plans_inside": plans_inside,
        "plans_after": [_plan_cache.get("p") is plans_before[0], _outer_plan_cache.get("o") is plans_before[1],
                        "new" in _plan_cache],
    }))


def pair(arch: str) -> dict:
    """Two runs of this probe over one new cache folder (module doc)."""
    import subprocess
    import tempfile

    runs = []
    with tempfile.TemporaryDirectory(prefix="fa4trace_reach_") as d:
        for _ in range(2):
            r = subprocess.run([sys.executable, "-W", "error::FutureWarning", __file__, arch, d],
                               capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                sys.stderr.write(r.stderr[-3000:])
                raise SystemExit(r.returncode)
            runs.append(dict(json.loads(r.stdout.strip().splitlines()[-1]), stderr=r.stderr))
    return {"runs": runs}


if __name__ == "__main__":
    if sys.argv[2:] == ["--pair"]:
        print(json.dumps(pair(sys.argv[1])))
    else:
        main()
