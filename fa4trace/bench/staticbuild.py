"""Compile a kernel plain and traced on a machine without a GPU, and keep what the compile made:
the cubin (as the CuTe DSL's own ptxas built it) and the launch configuration its host code set.
The compile half of ``fa4trace sass`` (fa4trace.bench.static reads the cubins).

The DSL reads its target once per process (CUTE_DSL_ARCH), so each architecture compiles in a
process of its own: ``python -m fa4trace.bench.staticbuild SPEC.json OUT_DIR``, where SPEC holds
the architecture and the targets. OUT_DIR/manifest.json lists, per target, its builds (plain,
traced): the cubin's file, the launches (grid, block, dynamic shared memory), the compile time,
or the target's error in one line. Importing this module needs nothing beyond fa4trace.

Targets (``TARGETS``; ``parse_target``): our decode kernel (``decode``, sm_90a; traced: the
recorder's core events), FlashAttention-4's forward (``fa4-sm100-pingpong``, ``fa4-sm100-base``:
sm_100a, S/P ping-pong on and off; ``fa4-sm90``: sm_90a; traced: FA4's own events through
fa4trace.fa4, plus any generic families asked for), and any CuTe DSL kernel
(``FILE.py:FUNCTION``: FUNCTION() returns (jit function or kernel object, compile arguments[,
keyword arguments]) as ``cute.compile`` takes them, fake tensors included; traced:
fa4trace.auto's events of the families asked for, every family by default, one instrumented
body).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..format.errors import Fa4traceError

ARCHS = ("sm_90a", "sm_100a")
DECODE_ROWS = 32  # fa4trace check's decode kernel: one query row per consumer thread


@dataclass(frozen=True)
class Target:
    """One kernel to compile for one architecture: ``kind`` "decode" | "fa4" | "user"."""

    name: str
    kind: str
    arch: str
    config: dict = field(default_factory=dict)


# name -> (kind, arch, config)
TARGETS = {
    "decode": ("decode", "sm_90a", {"schedule": "pingpong"}),
    "decode-base": ("decode", "sm_90a", {"schedule": "base"}),
    "decode-intrawg": ("decode", "sm_90a", {"schedule": "intrawg"}),
    "fa4-sm100-pingpong": ("fa4", "sm_100a", {"fa4_arch": "sm100", "schedule": "pingpong"}),
    "fa4-sm100-base": ("fa4", "sm_100a", {"fa4_arch": "sm100", "schedule": "base"}),
    "fa4-sm90": ("fa4", "sm_90a", {"fa4_arch": "sm90", "schedule": "pingpong"}),
}
DEFAULT_TARGETS = ("decode", "fa4-sm100-pingpong", "fa4-sm100-base")


def parse_target(spec: str, archs=ARCHS, *, d: int = 128, hq: int = 16, hkv: int = 1, families=None) -> list[Target]:
    """The targets one name or ``FILE.py:FUNCTION`` stands for (a user kernel: one per arch of
    ``archs``). ``families``: the generic event families of traced FA4 and user builds (None:
    none for FA4, which records its own events; every family for a user kernel). One-line
    Fa4traceError for anything unknown."""
    from ..auto.events import FAMILIES

    if spec in TARGETS:
        kind, arch, cfg = TARGETS[spec]
        cfg = dict(cfg, d=d)
        if kind == "decode":
            cfg.update(block_rows=DECODE_ROWS, events="core")
        else:
            cfg.update(hq=hq, hkv=hkv, families=list(families or ()))
        return [Target(spec, kind, arch, cfg)]
    path, sep, func = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not func.isidentifier():
        raise Fa4traceError(f"unknown kernel {spec!r}: one of {', '.join(TARGETS)}, or FILE.py:FUNCTION")
    if not os.path.isfile(path):
        raise Fa4traceError(f"{path}: no such file")
    fams = list(FAMILIES if families is None else families)
    return [Target(spec, "user", a, {"file": os.path.abspath(path), "function": func, "families": fams})
            for a in archs]


def spec_json(arch: str, targets: list[Target]) -> str:
    return json.dumps({"arch": arch, "targets": [asdict(t) for t in targets]})


# ---- in the worker process (the DSL imported for one architecture) ----------------------------------
class _Launches:
    """Records every kernel launch the DSL traces (``KernelLauncher.launch``'s keywords)."""

    def __init__(self):
        self.seen: list = []

    def __enter__(self):
        from cutlass.cutlass_dsl import cutlass as dsl

        from ..auto.patches import Patches

        real = dsl.KernelLauncher.launch
        seen = self.seen

        def launch(launcher, *args, **kwargs):
            body = launcher.funcBody
            seen.append({"kernel": f"{getattr(body, '__module__', '')}.{getattr(body, '__qualname__', '')}",
                         "grid": _dims(kwargs.get("grid")), "block": _dims(kwargs.get("block")),
                         "cluster": _dims(kwargs.get("cluster")), "dynamic_smem_bytes": _int(kwargs.get("smem"))})
            return real(launcher, *args, **kwargs)

        self.patches = Patches()
        self.patches.set(dsl.KernelLauncher, "launch", launch)
        return self

    def __exit__(self, *exc):
        self.patches.restore()


def _int(v):
    """A compile-time integer, else None (a value the host code computes at run time)."""
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _dims(v):
    if v is None:
        return None
    try:
        return [_int(x) for x in v]
    except TypeError:
        return [_int(v)]


# the host code's launch configuration (cudaLaunchConfig_t) in the compiled module's LLVM dialect:
# its third field is the dynamic shared memory, stored from a constant
_SMEM_FIELD = re.compile(r"(%\w+) = llvm\.getelementptr %\w+\[0, 2\] : \(!llvm\.ptr\) -> !llvm\.ptr, "
                         r"!llvm\.struct<\(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32\)>")
_CONSTANT = re.compile(r"(%\w+) = llvm\.mlir\.constant\((-?\d+) : i\d+\)")
_STORE = re.compile(r"llvm\.store (%\w+), (%\w+) : i64")


def launch_smem(ir: str) -> list:
    """The dynamic shared memory (bytes) of each kernel launch the compiled host code makes, in
    order, read from its module (None where the value is not a constant): where a kernel leaves
    ``smem=`` out of its launch, the DSL sizes it from the kernel's allocations after tracing, and
    this is where the size lands."""
    out, consts, fields = [], {}, set()
    for line in ir.splitlines():
        if "llvm.func " in line:
            consts, fields = {}, set()
        m = _CONSTANT.search(line)
        if m:
            consts[m.group(1)] = int(m.group(2))
            continue
        m = _SMEM_FIELD.search(line)
        if m:
            fields.add(m.group(1))
            continue
        m = _STORE.search(line)
        if m and m.group(2) in fields:
            out.append(consts.get(m.group(1)))
    return out


def _fill_smem(launches: list, fn) -> None:
    """Launches whose ``smem=`` was left out: the size the DSL gave them (``launch_smem``)."""
    if all(ln["dynamic_smem_bytes"] is not None for ln in launches):
        return
    sizes = launch_smem(str(getattr(fn, "ir_module", "") or ""))
    for ln, size in zip(launches, sizes):
        if ln["dynamic_smem_bytes"] is None:
            ln["dynamic_smem_bytes"] = size


def _compile(target: Target, traced: bool):
    """(compiled function, what the build records) of one build of ``target``."""
    cfg = target.config
    if target.kind == "decode":
        from ..kernels.attention_sm90 import compile_variant
        from ..kernels.decode_spec import Variant

        v = Variant(cfg["d"], cfg["schedule"], block_rows=cfg["block_rows"], events=cfg["events"] if traced else None)
        return compile_variant(v)[0], (f"the recorder's {cfg['events']} events, every warp" if traced else "untraced")
    if target.kind == "fa4":
        from ..fa4.build import compile_fa4

        c = compile_fa4(cfg["fa4_arch"], schedule=cfg["schedule"], d=cfg["d"], hq=cfg["hq"], hkv=cfg["hkv"],
                        traced=traced, families=tuple(cfg["families"]))
        if not traced:
            return c.fn, "untraced (FA4's own compile)"
        fams = ", ".join(cfg["families"])
        return c.fn, (f"FA4's events (every role, cursor {c.config['cursor']})" + (f" + families {fams}" if fams else ""))
    import importlib.util

    import cutlass.cute as cute

    spec = importlib.util.spec_from_file_location(f"fa4trace_static_{Path(cfg['file']).stem}", cfg["file"])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # fa4trace.auto finds the kernels of the entry's module there
    spec.loader.exec_module(mod)
    made = getattr(mod, cfg["function"], None)
    if made is None:
        raise Fa4traceError(f"{cfg['file']} has no function {cfg['function']}")
    got = made()
    if not isinstance(got, tuple) or len(got) not in (2, 3):
        raise Fa4traceError(f"{cfg['function']}() must return (function, args) or (function, args, kwargs)")
    fn, args, kwargs = (*got, {}) if len(got) == 2 else got
    if not traced:
        return cute.compile(fn, *args, **kwargs), "untraced"
    from ..auto.compiler import compile_traced
    from ..format.options import Placement

    c = compile_traced(fn, *args, placement=Placement(families=tuple(cfg["families"]), split=False), check=False,
                       **kwargs)
    return c.fn, f"fa4trace.instrument families {', '.join(cfg['families']) or 'none'} (warp lifetimes), one body"


def build_target(target: Target, out: Path) -> dict:
    """Compile ``target`` plain and traced into ``out`` (cubins); its manifest entry."""
    entry = {**asdict(target), "builds": []}
    try:
        for build in ("plain", "traced"):
            t = time.time()
            with _Launches() as launches:
                fn, what = _compile(target, build == "traced")
            _fill_smem(launches.seen, fn)
            cubin = getattr(fn, "__cubin__", None)
            if not cubin:
                raise Fa4traceError("the compile kept no cubin (CUTE_DSL_KEEP must include cubin)")
            name = f"{len(os.listdir(out))}_{build}.cubin"
            (out / name).write_bytes(cubin if isinstance(cubin, bytes) else cubin.encode())
            entry["builds"].append({"build": build, "records": what, "cubin": name, "launches": launches.seen,
                                    "compile_s": round(time.time() - t, 1)})
    except Exception as e:  # noqa: BLE001 - one line per target, the others still compile
        text = str(e).strip()
        entry["error"] = f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".strip(": ")
    return entry


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m fa4trace.bench.staticbuild SPEC.json OUT_DIR", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    os.environ["CUTE_DSL_ARCH"] = spec["arch"]
    os.environ["CUTE_DSL_KEEP"] = "cubin"
    from importlib.metadata import PackageNotFoundError, version

    try:
        dsl = version("nvidia-cutlass-dsl")
    except PackageNotFoundError:
        dsl = None
    with tempfile.TemporaryDirectory(prefix="fa4trace-static-") as dump:
        os.environ["CUTE_DSL_DUMP_DIR"] = dump  # the DSL's kept files, read back into each compile's artifacts
        entries = [build_target(Target(**t), out) for t in spec["targets"]]
    (out / "manifest.json").write_text(json.dumps({"arch": spec["arch"], "dsl": dsl, "targets": entries}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
