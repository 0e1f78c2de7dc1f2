"""Compile kernel variants once, in parallel, and keep their PTX: the one compile that the PTX
tests and ``ptx_digests.py`` read.

Workers are spawned (not forked) so that each sets the DSL's environment before importing it:
the target arch and a PTX dump folder of its own (the DSL names a dump after the host function
and argument types, which variants share, so processes sharing a folder would read each
other's files).

``cache``: a folder of results keyed by everything a compile reads - the DSL's and Python's
versions, the target, the variant's name and the bytes of every source file the kernels are
built from (``kernels/``, ``fa4trace/device/``, ``fa4trace/format/``). A
changed line anywhere there is a new key, so a hit is the compile of exactly this source.
"""

from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("kernels", "fa4trace/device", "fa4trace/format")


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
            # no tvm-ffi wrapper: the tests read the device code, the same without it (checked
            # for every variant), and it cost a tenth of each compile
            fn, kern = compile_variant(variant, options="")
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


def source_key(arch: str, sources=SOURCES, packages=("nvidia-cutlass-dsl",), extra: str = "") -> str:
    """sha256 of the installed ``packages``' versions, Python's, the target, ``extra`` and every
    source file under ``sources`` (paths from the checkout's root)."""
    from importlib.metadata import version

    h = hashlib.sha256(f"{[(p, version(p)) for p in packages]} {arch} {sys.version} {extra}\n".encode())
    for top in sources:
        path = ROOT / top
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def cached_json(path: str | os.PathLike, make):
    """The JSON in ``path`` if it is there, else ``make()``'s result, written there atomically (a
    reader never sees half a file, two processes may race harmlessly)."""
    path = Path(path)
    if path.is_file():
        return json.loads(path.read_text())
    value = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)
    return value


# what a probe script (tests/tools/*_probe.py: compiles under fa4trace, prints JSON) can read
# (of benchmarks/, only the kernels module the probes import: editing a benchmark recompiles nothing)
PROBE_SOURCES = ("fa4trace", "kernels", "benchmarks/auto_kernels.py", "tests/tools")
PROBE_PACKAGES = ("nvidia-cutlass-dsl", "quack-kernels", "flash-attn-4")


def installed(packages) -> tuple:
    """Those of ``packages`` that are installed (a probe that needs one that is not skips)."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for p in packages:
        try:
            version(p)
            out.append(p)
        except PackageNotFoundError:
            pass
    return tuple(out)


def probe_json(script: str, args, cache: str | os.PathLike | None = None) -> dict:
    """The JSON a probe script prints last (``python script *args`` in a fresh process, the DSL's
    target arch left to the script, the checkout importable), kept in ``cache``/<script>/ under
    a key of every source and version it can read (``PROBE_SOURCES``, ``PROBE_PACKAGES``) and
    the arguments: a hit is what this exact source would print."""
    args = [str(a) for a in args]

    def run() -> dict:
        r = _run_probe(script, args, timeout=900)
        if r.returncode != 0:
            raise AssertionError(r.stderr[-3000:])
        return _last_json(r.stdout)

    if cache is None:
        return run()
    return cached_json(_probe_path(script, args, cache), run)


def probe_batch(script: str, arg_lists, cache: str | os.PathLike) -> None:
    """Fill ``cache`` with what ``probe_json`` would keep for each argument list of ``arg_lists``
    (one target) that it lacks, from one run of ``script --batch``: the imports and the DSL's
    first compile paid once, not once per compile. A compile that fails in the batch is left out
    (``probe_json`` then runs it alone, where its error is the test's message)."""
    import subprocess

    todo = [[str(a) for a in args] for args in arg_lists]
    todo = [args for args in todo if not _probe_path(script, args, cache).is_file()]
    if not todo:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(todo, f)
    try:
        r = _run_probe(script, ["--batch", f.name], timeout=1800)
        results = _last_json(r.stdout) if r.returncode == 0 else []
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        results = []  # each compile is then run alone, with its own error
    finally:
        os.unlink(f.name)
    for args, got in zip(todo, results):
        if "batch_error" not in got:
            cached_json(_probe_path(script, args, cache), lambda got=got: got)


def _run_probe(script: str, argv: list, timeout: float):
    """``python script *argv`` in a fresh process: the checkout importable, the DSL's target left
    to the script, and a PTX dump folder of its own (the DSL names a dump after the function and
    the target, so two probes of one kernel sharing a folder would read each other's PTX)."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="fa4trace-probe-") as dump:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   CUTE_DSL_DUMP_DIR=dump)
        env.pop("CUTE_DSL_ARCH", None)
        return subprocess.run([sys.executable, script, *argv], capture_output=True, text=True, env=env,
                              timeout=timeout, cwd=ROOT)


def _last_json(stdout: str):
    """What a probe printed last: its JSON."""
    return json.loads(stdout.strip().splitlines()[-1])


def _probe_path(script: str, args: list, cache) -> Path:
    """Where ``probe_json`` keeps what ``script`` printed for ``args`` (strings)."""
    key = hashlib.sha256(f"{_probe_sources_key()} {json.dumps(args)}".encode()).hexdigest()
    return Path(cache) / Path(script).stem / f"{key}.json"


@functools.lru_cache(maxsize=None)
def _probe_sources_key() -> str:
    """``source_key`` of what every probe can read: hashed once per process, not per probe."""
    return source_key("", PROBE_SOURCES, installed(PROBE_PACKAGES))


def compile_all(arch: str, names: list[str], jobs: int | None = None, progress=None,
                cache: str | os.PathLike | None = None) -> dict[str, dict]:
    """{name: {"ptx", "config", "kind", "compile_s"}} for each name, compiled in ``jobs`` processes
    (or read from ``cache`` when this exact source was compiled before; see the module doc)."""
    jobs = jobs or os.cpu_count() or 1
    out = {}
    folder = Path(cache) / source_key(arch) if cache else None
    todo = []
    for name in names:
        hit = folder / f"{name}.json" if folder else None
        if hit is not None and hit.is_file():
            out[name] = json.loads(hit.read_text())
        else:
            todo.append(name)
    if todo:
        with tempfile.TemporaryDirectory(prefix="fa4trace_ptx_") as dump, \
                ProcessPoolExecutor(min(jobs, len(todo)), mp_context=multiprocessing.get_context("spawn"),
                                    initializer=_init, initargs=(arch, dump)) as pool:
            for i, r in enumerate(pool.map(_compile, [arch] * len(todo), todo), 1):
                out[r["name"]] = cached_json(folder / f"{r['name']}.json", lambda r=r: r) if folder else r
                if progress:
                    progress(i, len(todo), r)
    return {name: out[name] for name in names}
