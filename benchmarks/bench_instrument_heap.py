"""``fa4trace.instrument()``: block entry + exit against the size of the Python heap (CPU only:
a few tiny kernels compiled for sm_90a, nothing launched, so no GPU is needed).

    python benchmarks/bench_instrument_heap.py --json benchmarks/results/instrument_heap_cpu.json
    git archive 8f9f4a6 | (mkdir -p build/before && tar -x -C build/before)   # an earlier tree to compare
    python benchmarks/bench_instrument_heap.py --before build/before --before-commit 8f9f4a6 --json ...

Each case runs in a fresh process: a synthetic heap of N gc-tracked objects (dicts, lists,
tuples holding lists, small objects), fa4trace imported, ``--kernels`` kernels compiled into
the places libraries keep them (a module-level dict, a decorator's closure dict as quack's
``jit_cache``, a function attribute's object as FA4's ``compile_cache``, a dict of plan
NamedTuples, a local dict), then ``--repeat`` empty ``with fa4trace.instrument(families=()):``
blocks, each timed at its entry and its exit (the first block of the process apart: it also
imports fa4trace's compiler modules). Cases:

* blocks: per heap size (``--sizes``, millions of objects added);
* import-after: the kernels compiled before fa4trace is imported: ``import fa4trace`` then
  looks for them once (one heap pass), timed, and the blocks after it;
* libraries: with torch, quack and FA4 imported (their modules are searched for caches), at
  the largest size;
* before: the same blocks with another checkout's fa4trace (``--before``: a tree exported
  with ``git archive``), the numbers it gave.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tests" / "tools"


def build_heap(n: int) -> list:
    """About ``n`` gc-tracked objects: a list, a dict, a tuple and an object, each holding the
    list (a dict or tuple of plain values only is not tracked by the collector)."""

    class Obj:
        def __init__(self, i):
            self.i = i

    heap = []
    for i in range(n // 4):
        inner = [i]
        heap += [inner, {"l": inner}, (i, inner), Obj(inner)]
    return heap


def setup_kernels(n: int) -> tuple:
    """``n`` kernels compiled into the places libraries keep them (module doc)."""
    import functools
    from typing import NamedTuple

    sys.path.insert(0, str(TOOLS))
    from tiny_kernels import Copy

    copy = Copy()

    def jit_cache(fn):
        cache = {}

        @functools.wraps(fn)
        def wrapper(*args):
            if args not in cache:
                cache[args] = fn(*args)
            return cache[args]
        return wrapper

    @jit_cache
    def quack_style(key):
        return copy.compile()

    class JITCache:
        def __init__(self):
            self.cache = {}

    def fwd(key):
        if key not in fwd.compile_cache.cache:
            fwd.compile_cache.cache[key] = copy.compile()
        return fwd.compile_cache.cache[key]

    fwd.compile_cache = JITCache()

    class Plan(NamedTuple):
        compiled_fn: object
        tile: int

    plan_cache, local_cache = {}, {}
    places = [lambda k: quack_style(k), lambda k: fwd(k),
              lambda k: plan_cache.setdefault(k, Plan(copy.compile(), 128)),
              lambda k: local_cache.setdefault(k, copy.compile()),
              lambda k: _MODULE_CACHE.setdefault(k, copy.compile())]
    for i in range(n):
        places[i % len(places)](i)
    return quack_style, fwd, plan_cache, local_cache


_MODULE_CACHE: dict = {}


def child(args) -> dict:
    os.environ["CUTE_DSL_ARCH"] = "sm_90a"
    out = {}
    if args.libraries:
        import flash_attn.cute.interface  # noqa: F401
        import quack.gemm_interface  # noqa: F401
        import quack.rmsnorm  # noqa: F401
        import torch  # noqa: F401
    heap = build_heap(int(args.size * 1e6))
    if args.mode == "import-after":
        import cutlass.cute  # noqa: F401
        quack_style, fwd, plan_cache, local_cache = setup_kernels(args.kernels)  # the program keeps them
        gc.collect()
        t = time.perf_counter()
        import fa4trace
        out["import_s"] = time.perf_counter() - t
    else:
        import fa4trace
        quack_style, fwd, plan_cache, local_cache = setup_kernels(args.kernels)
    gc.collect()
    out["objects"] = len(gc.get_objects())
    blocks = []
    for _ in range(args.repeat + 1):
        t0 = time.perf_counter()
        with fa4trace.instrument(families=()) as rec:
            t1 = time.perf_counter()
        t2 = time.perf_counter()
        blocks.append((t1 - t0, t2 - t1, rec.hidden))
    out["first"] = blocks[0]
    out["blocks"] = blocks[1:]
    del heap, quack_style, fwd, plan_cache, local_cache
    return out


def run_case(mode: str, size: float, a, pythonpath: str, libraries: bool = False, repeat=None) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--mode", mode, "--size", str(size),
           "--kernels", str(a.kernels), "--repeat", str(repeat or a.repeat)] + (["--libraries"] if libraries else [])
    env = dict(os.environ, PYTHONPATH=pythonpath + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode != 0:
        last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
        raise SystemExit(f"{mode} at {size} M failed: {last}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def row(case: str, impl: str, size: float, got: dict) -> dict:
    entry = [b[0] * 1e3 for b in got["blocks"]]
    exit_ = [b[1] * 1e3 for b in got["blocks"]]
    total = [e + x for e, x in zip(entry, exit_)]
    out = {"case": case, "impl": impl, "added_m": size, "objects": got["objects"],
           "entry_ms": round(statistics.median(entry), 2), "exit_ms": round(statistics.median(exit_), 2),
           "entry_exit_ms": round(statistics.median(total), 2), "entry_exit_max_ms": round(max(total), 2),
           "first_block_ms": round((got["first"][0] + got["first"][1]) * 1e3, 1),
           "entries_moved": got["blocks"][0][2], "blocks": len(total)}
    if "import_s" in got:
        out["import_fa4trace_s"] = round(got["import_s"], 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="0.1,1,3", help="millions of objects added to the heap, one case each")
    ap.add_argument("--kernels", type=int, default=8, help="kernels compiled into the caches")
    ap.add_argument("--repeat", type=int, default=7, help="blocks timed per case (after a first one)")
    ap.add_argument("--before", default=None, help="another checkout's tree (git archive) to time the same blocks with")
    ap.add_argument("--before-commit", default="not recorded", help="the commit of --before")
    ap.add_argument("--before-repeat", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the result file here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="blocks", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=float, default=0.1, help=argparse.SUPPRESS)
    ap.add_argument("--libraries", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a)))
        return 0
    sizes = [float(s) for s in a.sizes.split(",") if s]
    sys.path.insert(0, str(ROOT))
    from fa4trace.bench.results import current_commit, envelope, write

    here = current_commit()
    rows = []
    for size in sizes:
        rows.append(row("blocks", here, size, run_case("blocks", size, a, str(ROOT))))
        print(rows[-1], file=sys.stderr)
    for size in sizes:
        rows.append(row("import-after", here, size, run_case("import-after", size, a, str(ROOT))))
        print(rows[-1], file=sys.stderr)
    try:
        import importlib.util

        libs = all(importlib.util.find_spec(m) for m in ("torch", "quack", "flash_attn"))
    except (ImportError, ValueError):
        libs = False
    if libs:
        rows.append(row("libraries", here, sizes[-1], run_case("blocks", sizes[-1], a, str(ROOT), libraries=True)))
        print(rows[-1], file=sys.stderr)
    if a.before:
        for size in sizes:
            rows.append(row("blocks", a.before_commit, size,
                            run_case("blocks", size, a, a.before, repeat=a.before_repeat)))
            print(rows[-1], file=sys.stderr)
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    machine = (f"none: {os.cpu_count()}-core {cpu} VM (shared), Python {platform.python_version()}, "
               f"load {os.getloadavg()[0]:.1f} at the end")
    doc = envelope("instrument-program",
                   "instrument() block entry + exit against the heap's size (CPU, nothing launched)", rows, gpu=machine,
                   columns=[["case", "case"], ["impl", "commit"], ["objects", "gc objects"],
                            ["entry_ms", "entry ms"], ["exit_ms", "exit ms"], ["entry_exit_ms", "entry + exit ms"],
                            ["entry_exit_max_ms", "... max"], ["first_block_ms", "first block ms"],
                            ["import_fa4trace_s", "import fa4trace s"], ["entries_moved", "entries moved"]],
                   notes=(f"Fresh process per case; {a.kernels} tiny kernels (sm_90a, CPU) compiled into a "
                          "module-level "
                          "dict, a decorator's closure dict (quack's jit_cache), a function attribute's object (FA4's "
                          "compile_cache), a dict of plan NamedTuples and a local dict; empty blocks, median of the "
                          "blocks after the first (the first also imports fa4trace's compiler modules). "
                          "import-after: the kernels compiled before fa4trace is imported (its import looks for them "
                          "once). libraries: torch, quack and FA4 imported too."))
    doc["commit"] = here  # the commit measured (HEAD may move while the cases run)
    if a.json:
        write(a.json, doc)
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
