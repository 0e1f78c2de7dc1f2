"""The static footprint of tracing, per warp role, without a GPU: ``fa4trace sass``.

A kernel is compiled plain and traced for its architecture on the CPU (fa4trace.bench.
staticbuild, one process per architecture); each cubin is disassembled (nvdisasm), its roles
found (fa4trace.bench.sassroles) and counted. The report, per kernel and per role: instructions
per main-loop iteration, the role's instructions, registers (the kernel's, or the role's
``setmaxnreg``), local-memory loads and stores (spills) and, per kernel, shared memory (the
cubin's static and the launch's dynamic bytes) and the stack frame; traced minus plain.

These are static counts: what the compiler emitted, not what runs, on no GPU. The report is a
result file (fa4trace.bench.results' envelope) with ``kind`` = ``KIND`` and ``schema`` =
``SCHEMA``; ``diff_static`` compares two of them (a DSL upgrade against the last, say), per role.
Reading, rendering and diffing reports needs no CUDA tool and no DSL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

from ..format.errors import Fa4traceError

KIND = "fa4trace.static-footprint"
SCHEMA = 1
DIFF_KIND = "fa4trace.static-diff"
AREA = "static-footprint"

# per-role and per-kernel metrics a diff compares; the first ones are what a regression is made of
ROLE_METRICS = ("mainloop", "mainloop_local_loads", "mainloop_local_stores", "local_loads", "local_stores",
                "registers", "instructions", "mainloop_timer_reads", "timer_reads")
KERNEL_METRICS = ("registers", "stack_frame_bytes", "local_loads", "local_stores", "smem_bytes",
                  "static_smem_bytes", "dynamic_smem_bytes", "instructions")
COLUMNS = [["kernel", "kernel"], ["arch", "arch"], ["role", "role"], ["confidence", "attribution"],
           ["mainloop_plain", "main loop, plain"], ["mainloop_traced", "traced"], ["mainloop_added", "added"],
           ["mainloop_timer_reads", "timer reads in it"], ["instructions_plain", "role instructions, plain"],
           ["instructions_added", "added"], ["registers_plain", "registers, plain"],
           ["registers_traced", "traced"], ["spills_plain", "LDL+STL, plain"], ["spills_traced", "traced"],
           ["smem_plain", "shared memory B, plain"], ["smem_traced", "traced"]]
NOTES = ("Static counts: each kernel compiled plain and traced on a CPU (CUTE_DSL_ARCH; the CuTe DSL's own ptxas "
         "made the cubin, nvdisasm read it), run on no GPU, measured on no B200. Main loop: the instructions of "
         "one iteration of the role's innermost loop issuing its work (each path once, wait-retry loops "
         "excluded). Registers: the role's setmaxnreg (in its code, else the nearest above its entry), else "
         "the kernel's. LDL+STL: "
         "local-memory loads and stores (spills). Shared memory: the kernel's static bytes plus the launch's "
         "dynamic bytes (whole CTA). Roles and how they were found: docs/static-footprint.md.")


# ---- compiling ---------------------------------------------------------------------------------
def compile_targets(targets: list, work: Path, log: Callable = lambda m: None) -> list[dict]:
    """Compile ``targets`` (staticbuild.Target) plain and traced, one worker process per
    architecture; their manifests' target entries, each with ``dir`` (where its cubins are).
    Fa4traceError in one line where a target fails to compile."""
    entries = []
    for arch in dict.fromkeys(t.arch for t in targets):
        from .staticbuild import spec_json

        mine = [t for t in targets if t.arch == arch]
        out = work / arch
        out.mkdir(parents=True, exist_ok=True)
        spec = out / "spec.json"
        spec.write_text(spec_json(arch, mine))
        log(f"compiling {', '.join(t.name for t in mine)} for {arch} (plain and traced)")
        p = subprocess.run([sys.executable, "-m", "fa4trace.bench.staticbuild", str(spec), str(out)],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
        manifest = out / "manifest.json"
        if p.returncode != 0 or not manifest.is_file():
            lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
            raise Fa4traceError(f"compiling for {arch} failed: {lines[-1] if lines else 'no message'}")
        doc = json.loads(manifest.read_text())
        for e in doc["targets"]:
            if e.get("error"):
                raise Fa4traceError(f"{e['name']} ({arch}) did not compile: {e['error']}")
            entries.append(dict(e, dir=str(out), dsl=doc.get("dsl")))
    return entries


# ---- one cubin -----------------------------------------------------------------------------------
def cubin_kernels(cubin: bytes, launches: list, keep: Optional[Path] = None) -> list[dict]:
    """The footprint of every kernel of a cubin: resources, counts, roles (``kernel_footprint``).
    ``launches``: what the build's host code launched (dynamic shared memory, block), matched to
    the cubin's kernels by name, else in order. ``keep``: also write the listing there."""
    from .sass import disassemble, resources

    code = disassemble(cubin)
    if keep is not None:
        keep.write_text(code)
    return listing_kernels(code, resources(disassemble(cubin, code_only=False)), launches)


def listing_kernels(code: str, res: dict, launches: list) -> list[dict]:
    """``cubin_kernels`` of an nvdisasm listing already made (``res``: ``sass.resources``)."""
    from .sasscfg import functions

    kernels = [fn for fn in functions(code) if fn.kernel]
    out = []
    for k, fn in enumerate(kernels):
        launch = _launch_of(fn.name, k, launches)
        out.append(kernel_footprint(fn, res.get(fn.name, {}), launch))
    return out


def _launch_of(symbol: str, k: int, launches: list) -> dict:
    flat = symbol.replace("_", "")
    for ln in launches:
        name = ln.get("kernel", "").rsplit(".", 1)[0].replace(".", "").replace("_", "")
        if name and name in flat:
            return ln
    return launches[k] if k < len(launches) else {}


def kernel_footprint(fn, res: dict, launch: dict) -> dict:
    """One kernel function's footprint: its resources, counts, roles and what is unattributed."""
    from .sass import counts
    from .sassroles import function_roles

    roles = function_roles(fn)
    regs = res.get("registers")
    static, dynamic = res.get("static_smem_bytes"), launch.get("dynamic_smem_bytes")
    block = launch.get("block") or []
    threads = None if not block or None in block else block[0] * (block[1] if len(block) > 1 else 1) * (
        block[2] if len(block) > 2 else 1)
    return {"symbol": fn.name, "registers": regs, "stack_frame_bytes": res.get("stack_frame_bytes"),
            "static_smem_bytes": static, "dynamic_smem_bytes": dynamic,
            "smem_bytes": None if dynamic is None else (static or 0) + dynamic, "threads": threads,
            **counts(i.text for i in fn.instrs), "warp_branches": roles["warp_branches"], "loops": roles["loops"],
            "roles": {name: role_summary(regions, regs) for name, regions in roles["roles"].items()},
            "unattributed": roles["unattributed"]}


def role_summary(regions: list, kernel_registers) -> dict:
    """One role's numbers, from its main region (the one recording the most timer reads, then
    the largest: a kernel that keeps an untraced copy of its body for the CTAs that do not record
    holds each role twice), and where its other regions are."""
    main = max(regions, key=lambda r: (r["timer_reads"], r["instructions"]))
    loop = main["mainloop"] or {}
    if main["setmaxnreg"]:
        regs, source = main["setmaxnreg"][-1], "setmaxnreg"
    elif main.get("setmaxnreg_before") is not None:
        regs, source = main["setmaxnreg_before"], "setmaxnreg before the role's entry"
    else:
        regs, source = kernel_registers, "kernel"
    return {"confidence": main["confidence"], "entry": main["entry"], "evidence": main["evidence"],
            "instructions": main["instructions"], "timer_reads": main["timer_reads"],
            "shared_stores": main["shared_stores"], "global_stores": main["global_stores"],
            "local_loads": main["local_loads"], "local_stores": main["local_stores"],
            "registers": regs, "registers_from": source, "setmaxnreg": main["setmaxnreg"],
            "setmaxnreg_before": main.get("setmaxnreg_before"), "signatures": main["signatures"],
            "mainloop": loop.get("instructions"), "mainloop_at": loop.get("at"),
            "mainloop_timer_reads": loop.get("timer_reads"), "mainloop_local_loads": loop.get("local_loads"),
            "mainloop_local_stores": loop.get("local_stores"), "mainloop_signatures": loop.get("signatures"),
            "mainloop_inner_loops": loop.get("inner_loops"),
            "other_regions": [{"entry": r["entry"], "instructions": r["instructions"]} for r in regions if r is not main]}


# ---- the report ----------------------------------------------------------------------------------
def report(entries: list, keep: Optional[Path] = None, command: Optional[str] = None) -> dict:
    """The report of compiled targets (``compile_targets``' entries): each build's cubin read."""
    from .sass import find_tool

    kernels = []
    for e in entries:
        builds = []
        for b in e["builds"]:
            cubin = (Path(e["dir"]) / b["cubin"]).read_bytes()
            where = None if keep is None else keep / f"{e['name'].replace('/', '_')}.{e['arch']}.{b['build']}.sass"
            builds.append({"build": b["build"], "records": b["records"], "compile_s": b["compile_s"],
                           "kernels": cubin_kernels(cubin, b["launches"], where)})
        kernels.append(kernel_entry(e["name"], e["arch"], e["config"], builds))
    tools = {"cute_dsl": entries[0].get("dsl") if entries else None, "nvdisasm": _tool_version(find_tool("nvdisasm"))}
    return document(kernels, tools, command)


def kernel_entry(name: str, arch: str, config: dict, builds: list) -> dict:
    """One kernel of a report: its builds (plain first, then traced: {"build", "records",
    "kernels": ``cubin_kernels``}) and traced minus plain (``delta``)."""
    if [b["build"] for b in builds] != ["plain", "traced"]:
        raise Fa4traceError(f"{name}: a report holds a plain and a traced build, in that order")
    return {"kernel": name, "arch": arch, "config": config, "builds": builds, "delta": delta(builds[0], builds[1])}


def document(kernels: list, tools: Optional[dict] = None, command: Optional[str] = None) -> dict:
    """The report as a result file (fa4trace.bench.results' envelope, ``kind`` and ``schema`` added)."""
    from . import results

    return results.envelope(AREA, "Static footprint of tracing per warp role (SASS, compiled on a CPU)",
                            rows_of(kernels), gpu="none: compiled on a CPU, no GPU (static counts)",
                            command=command, columns=COLUMNS, notes=NOTES, kind=KIND, schema=SCHEMA,
                            tools=tools or {}, kernels=kernels)


def _tool_version(path) -> Optional[str]:
    if not path:
        return None
    p = subprocess.run([path, "--version"], capture_output=True, text=True)
    lines = [ln for ln in p.stdout.splitlines() if "release" in ln]
    return lines[0].strip() if lines else None


def delta(plain: dict, traced: dict) -> list[dict]:
    """Traced minus plain, per kernel of the builds (matched in order): the kernel's metrics and
    each role's (a role found in one build only says so)."""
    out = []
    for kp, kt in zip(plain["kernels"], traced["kernels"]):
        roles = {}
        for name in dict.fromkeys([*kp["roles"], *kt["roles"]]):
            a, b = kp["roles"].get(name), kt["roles"].get(name)
            if a is None or b is None:
                roles[name] = {"found_in": "plain only" if b is None else "traced only"}
                continue
            roles[name] = {m: _minus(b.get(m), a.get(m)) for m in ROLE_METRICS}
        out.append({"symbol": kt["symbol"], **{m: _minus(kt.get(m), kp.get(m)) for m in KERNEL_METRICS},
                    "unattributed_instructions": kt["unattributed"]["instructions"] - kp["unattributed"]["instructions"],
                    "roles": roles})
    return out


def _minus(b, a):
    return None if a is None or b is None else b - a


def rows_of(kernels: list) -> list[dict]:
    """The report's table: per kernel, a whole-kernel row, then a row per role."""
    rows = []
    for k in kernels:
        plain, traced = k["builds"][0]["kernels"], k["builds"][1]["kernels"]
        for i, (kp, kt) in enumerate(zip(plain, traced)):
            name = k["kernel"] + (f"#{i}" if len(plain) > 1 else "")
            rows.append({"kernel": name, "arch": k["arch"], "role": "(kernel)", "confidence": None,
                         "mainloop_plain": None, "mainloop_traced": None, "mainloop_added": None,
                         "mainloop_timer_reads": None, "instructions_plain": kp["instructions"],
                         "instructions_traced": kt["instructions"],
                         "instructions_added": kt["instructions"] - kp["instructions"],
                         "registers_plain": kp["registers"], "registers_traced": kt["registers"],
                         "spills_plain": kp["local_loads"] + kp["local_stores"],
                         "spills_traced": kt["local_loads"] + kt["local_stores"],
                         "smem_plain": kp["smem_bytes"], "smem_traced": kt["smem_bytes"]})
            for role in dict.fromkeys([*kp["roles"], *kt["roles"]]):
                a, b = kp["roles"].get(role) or {}, kt["roles"].get(role) or {}
                rows.append({"kernel": name, "arch": k["arch"], "role": role,
                             "confidence": _weakest(a.get("confidence"), b.get("confidence")),
                             "mainloop_plain": a.get("mainloop"), "mainloop_traced": b.get("mainloop"),
                             "mainloop_added": _minus(b.get("mainloop"), a.get("mainloop")),
                             "mainloop_timer_reads": b.get("mainloop_timer_reads"),
                             "instructions_plain": a.get("instructions"), "instructions_traced": b.get("instructions"),
                             "instructions_added": _minus(b.get("instructions"), a.get("instructions")),
                             "registers_plain": a.get("registers"), "registers_traced": b.get("registers"),
                             "spills_plain": _spills(a), "spills_traced": _spills(b),
                             "smem_plain": None, "smem_traced": None})
    return rows


def _spills(r: dict):
    return None if not r else r["local_loads"] + r["local_stores"]


def _weakest(a, b):
    """The lower of two builds' attribution confidences ("high" > "medium")."""
    if a is None or b is None:
        return "unattributed in " + ("plain" if a is None else "traced")
    return "high" if a == b == "high" else "medium"


# ---- reading and rendering -----------------------------------------------------------------------
def load(path: str | os.PathLike) -> dict:
    """A static report from a file, or Fa4traceError in one line."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise Fa4traceError(f"{p}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise Fa4traceError(f"{p}: not a JSON file ({e.__class__.__name__})") from None
    if not is_report(doc):
        raise Fa4traceError(f"{p}: not a static footprint report (kind {KIND!r}; made by fa4trace sass -o)")
    if doc.get("schema") != SCHEMA:
        raise Fa4traceError(f"{p}: static report schema {doc.get('schema')!r}; this fa4trace reads {SCHEMA}")
    return doc


def is_report(doc) -> bool:
    return isinstance(doc, dict) and doc.get("kind") == KIND and isinstance(doc.get("kernels"), list)


def text(doc: dict) -> str:
    """The report's table as text: per kernel and role, plain -> traced."""
    head = ["kernel", "arch", "role", "main loop", "role instr", "registers", "LDL+STL", "smem B", "attribution"]
    lines = [head]
    for r in doc["rows"]:
        lines.append([r["kernel"], r["arch"], r["role"],
                      _arrow(r["mainloop_plain"], r["mainloop_traced"]),
                      _arrow(r["instructions_plain"], r["instructions_traced"]),
                      _arrow(r["registers_plain"], r["registers_traced"]),
                      _arrow(r["spills_plain"], r["spills_traced"]),
                      _arrow(r["smem_plain"], r["smem_traced"]), r["confidence"] or ""])
    widths = [max(len(str(row[c])) for row in lines) for c in range(len(head))]
    out = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    out.append("plain -> traced (+added). Static counts, compiled on the CPU for each arch; nothing ran on a GPU.")
    return "\n".join(out)


def _arrow(a, b) -> str:
    if a is None and b is None:
        return "-"
    if a is None or b is None:
        return f"{'-' if a is None else a} -> {'-' if b is None else b}"
    return f"{a}" if a == b else f"{a} -> {b} ({b - a:+d})"


# ---- diff ----------------------------------------------------------------------------------------
def diff_static(a: dict, b: dict, threshold_pct: float = 0.0) -> dict:
    """What changed from report ``a`` to report ``b``, per kernel, build, and role (kernel-wide
    metrics under role "(kernel)"): every metric of ``ROLE_METRICS`` / ``KERNEL_METRICS`` that
    differs. ``beyond``: the increases of at least ``threshold_pct`` percent, and any increase
    from zero (spills that were not there before). ``unmatched``: kernels, builds or roles in one
    report only (a role the attribution found in one and not the other says so here)."""
    if threshold_pct < 0:
        raise Fa4traceError(f"threshold must be >= 0, got {threshold_pct}")
    changes, unmatched = [], []
    ka = {(k["kernel"], k["arch"]): k for k in a["kernels"]}
    kb = {(k["kernel"], k["arch"]): k for k in b["kernels"]}
    for key in dict.fromkeys([*ka, *kb]):
        if key not in ka or key not in kb:
            unmatched.append({"kernel": key[0], "arch": key[1], "in": "b only" if key not in ka else "a only"})
            continue
        ba = {x["build"]: x for x in ka[key]["builds"]}
        bb = {x["build"]: x for x in kb[key]["builds"]}
        for build in dict.fromkeys([*ba, *bb]):
            if build not in ba or build not in bb:
                unmatched.append({"kernel": key[0], "arch": key[1], "build": build,
                                  "in": "b only" if build not in ba else "a only"})
                continue
            for x, y in zip(ba[build]["kernels"], bb[build]["kernels"]):
                where = {"kernel": key[0], "arch": key[1], "build": build}
                changes += _changed(dict(where, role="(kernel)"), x, y, KERNEL_METRICS, threshold_pct)
                for role in dict.fromkeys([*x["roles"], *y["roles"]]):
                    if role not in x["roles"] or role not in y["roles"]:
                        unmatched.append(dict(where, role=role, **{"in": "b only" if role not in x["roles"] else "a only"}))
                        continue
                    changes += _changed(dict(where, role=role), x["roles"][role], y["roles"][role],
                                        ROLE_METRICS, threshold_pct)
    return {"kind": DIFF_KIND, "threshold_pct": threshold_pct, "a": _ident(a), "b": _ident(b),
            "changes": changes, "beyond": [c for c in changes if c["beyond"]], "unmatched": unmatched}


def _changed(where: dict, x: dict, y: dict, metrics, threshold_pct: float) -> list:
    out = []
    for m in metrics:
        va, vb = x.get(m), y.get(m)
        if va is None or vb is None or va == vb:
            continue
        pct = None if va == 0 else 100.0 * (vb - va) / abs(va)
        up = vb > va
        out.append(dict(where, metric=m, a=va, b=vb, change=vb - va, pct=None if pct is None else round(pct, 2),
                        beyond=up and (pct is None or pct >= threshold_pct)))
    return out


def _ident(doc: dict) -> dict:
    return {k: doc.get(k) for k in ("date", "commit", "tools")}


def diff_text(d: dict) -> str:
    """A diff of two static reports as text: the changes beyond the threshold first."""
    lines = []
    beyond = d["beyond"]
    head = (f"{len(beyond)} increase(s) beyond {d['threshold_pct']:g}%" if beyond
            else f"nothing grew beyond {d['threshold_pct']:g}%")
    lines.append(f"{head}; {len(d['changes'])} change(s) in all (static counts, per role)")
    for c in sorted(d["changes"], key=lambda c: (not c["beyond"], c["kernel"], c["build"], c["role"])):
        pct = "new" if c["pct"] is None else f"{c['pct']:+.1f}%"
        mark = "!" if c["beyond"] else " "
        lines.append(f"{mark} {c['kernel']} {c['arch']} {c['build']} {c['role']}: {c['metric']} "
                     f"{c['a']} -> {c['b']} ({c['change']:+d}, {pct})")
    for u in d["unmatched"]:
        what = " ".join(str(u[k]) for k in ("kernel", "arch", "build", "role") if k in u)
        lines.append(f"? {what}: in report {u['in'].split()[0]} only")
    return "\n".join(lines)


def run(kernels: list, *, out: Optional[str] = None, keep: Optional[str] = None, command: Optional[str] = None,
        log: Callable = lambda m: None) -> dict:
    """Compile and report ``kernels`` (staticbuild.Target); ``keep``: a folder for the listings."""
    keep_dir = None
    if keep:
        keep_dir = Path(keep)
        keep_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fa4trace-sass-") as work:
        doc = report(compile_targets(kernels, Path(work), log), keep_dir, command)
    if out:
        from . import results

        results.write(out, doc)
    return doc
