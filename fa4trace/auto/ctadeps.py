"""Whether a kernel's CTAs wait on one another: a static read of its PTX.

fa4trace.analysis.fidelity compares the CTAs that recorded with those that did not, in the same
launch. That comparison assumes a CTA's duration is its own work: it breaks where CTAs wait on
other CTAs (the recorded, slowed CTAs make untraced ones wait longer) or take work from a shared
counter (the slowed CTAs take less). ``cta_dependencies(ptx)`` finds the instructions by which
CTAs of one launch talk to each other and sorts them into three classes:

* ``waits_on_ctas``: a CTA's time depends on other CTAs of the grid: atomics on global memory
  whose returned value is used (tickets, semaphores, a dynamic tile scheduler's counter),
  acquire / volatile / relaxed-gpu or -sys loads of global memory (spin waits on a flag or a
  counter) and ``griddepcontrol.wait`` (the CTA waits for the previous grid's CTAs).
* ``cluster_only``: CTAs of one cluster wait on each other (``barrier.cluster``, ``mapa`` and
  other distributed shared memory, multicast copies, remote mbarrier arrives). fa4trace samples
  whole clusters (device.slot's CTA selection), so a recorded cluster runs beside recorded
  CTAs only and the in-launch comparison across clusters stays valid.
* ``fire_and_forget``: reductions to global memory (``red``, ``cp.reduce.async.bulk``, atomics
  whose result is unused), release stores, gpu-scope fences, ``griddepcontrol.launch_dependents``:
  other CTAs may read what they publish, but nothing here waits.

Shared-memory atomics and CTA-scope loads are a CTA's own business and are not counted.
fa4trace's own instrumentation adds exactly two ``red.relaxed.gpu.global.max.u64`` per kernel
(the CTA-lifetime stamps, fa4trace.device.lifetimes) and plain loads and stores; read a traced
build with ``traced=True`` and those two reductions per entry are left out. Best read is the
plain build's PTX (compile_traced compiles it beside the traced one).
"""

from __future__ import annotations

import re

# fa4trace's CTA-lifetime stamps: one at each warp's start and end, per kernel entry
OWN_STAMP = "red.relaxed.gpu.global.max.u64"
OWN_STAMPS_PER_ENTRY = 2
CLASSES = ("waits_on_ctas", "waits_on_previous_grid", "cluster_only", "fire_and_forget")  # strongest first

_INSTR = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][\w.:]*)\s*(.*?);?\s*$")
_REG = re.compile(r"%[A-Za-z_]\w*")
_GPU_SCOPES = ("gpu", "sys")


def _space(parts: list[str]) -> str:
    """The state space an opcode names: "global", "shared" (the CTA's own), "cluster"
    (shared::cluster), "other" (param, local, const) or "generic" (none named: it may be
    global memory, so counted as such)."""
    if "shared::cluster" in parts:
        return "cluster"
    if "shared" in parts or "shared::cta" in parts:
        return "shared"
    if "global" in parts:
        return "global"
    if any(x in parts for x in ("param", "local", "const", "tex")):
        return "other"
    return "generic"


def _classify(op: str, operands: str, uses) -> tuple[str, str] | None:
    """(class, what) of one instruction, or None where it is no inter-CTA communication."""
    parts = op.split(".")
    head = parts[0]
    space = _space(parts)
    if head == "atom":
        if space == "shared":
            return None
        if space == "cluster":
            return "cluster_only", "atomics on distributed shared memory"
        dst = operands.split(",", 1)[0].strip()
        if dst == "_" or not uses(dst):
            return "fire_and_forget", "atomics on global memory whose result is unused"
        return "waits_on_ctas", "returning atomics on global memory (counters, tickets, semaphores, tile schedulers)"
    if head == "red":
        if space == "shared":
            return None
        if space == "cluster" or "async" in parts:
            return "cluster_only", "reductions into distributed shared memory"
        return "fire_and_forget", "reductions to global memory"
    if head == "ld" and space in ("global", "generic"):
        if "volatile" in parts:
            return "waits_on_ctas", "volatile loads of global memory (spin waits)"
        if ("acquire" in parts or "relaxed" in parts) and any(s in parts for s in _GPU_SCOPES):
            sem = "acquire" if "acquire" in parts else "relaxed"
            return "waits_on_ctas", f"{sem} gpu-scope loads of global memory (spin waits, polled counters)"
        return None
    if head == "ld" and space == "cluster":
        return "cluster_only", "loads of distributed shared memory"
    if head == "st" and space in ("global", "generic") and (
            "volatile" in parts or (("release" in parts or "relaxed" in parts) and any(s in parts for s in _GPU_SCOPES))):
        return "fire_and_forget", "release / volatile stores to global memory (flags other CTAs may read)"
    if head == "st" and (space == "cluster" or op.startswith("st.async")):
        return "cluster_only", "stores to distributed shared memory"
    if head == "barrier" and len(parts) > 1 and parts[1] == "cluster":
        return "cluster_only", "cluster barriers"
    if head == "mapa":
        return "cluster_only", "distributed shared memory (mapa)"
    if head == "mbarrier" and space == "cluster":
        return "cluster_only", "mbarrier arrivals on another CTA of the cluster"
    if head == "cp" and "multicast::cluster" in parts:
        return "cluster_only", "multicast copies to the cluster"
    if head == "cp" and "reduce" in parts and "global" in parts:
        return "fire_and_forget", "bulk reductions to global memory"
    if head == "griddepcontrol":
        if "wait" in parts:
            return "waits_on_previous_grid", "griddepcontrol.wait (waits for the previous grid when launched with PDL)"
        return "fire_and_forget", "griddepcontrol.launch_dependents"
    if head == "fence" and any(s in parts for s in _GPU_SCOPES) and "proxy" not in parts:
        return "fire_and_forget", "gpu-scope fences"
    if head == "membar" and any(s in parts for s in ("gl", "sys")):
        return "fire_and_forget", "gpu-scope fences"
    return None


def _instructions(ptx: str) -> list[tuple[str, str]]:
    """(opcode, operands) of every instruction, inline-asm blocks ({ ...; ...; }) included."""
    out = []
    for line in ptx.splitlines():
        for stmt in line.split("//", 1)[0].split(";"):
            stmt = stmt.strip().lstrip("{}").strip()
            if not stmt or stmt.startswith((".", "$")):
                continue
            m = _INSTR.match(stmt)
            if m:
                out.append((m.group(1), m.group(2)))
    return out


def cta_dependencies(ptx: str, *, traced: bool = False) -> dict:
    """Inter-CTA communication in ``ptx`` (module doc), as a JSON-able dict:

    ``verdict``: the strongest class found (``CLASSES``, strongest first) or "none"; one list
    per class of [{"what", "ops" ({opcode: count})}]; ``found``: one line naming what decided the verdict; ``entries``:
    kernel entries read; ``fa4trace_own``: instructions left out as fa4trace's own (``traced``)."""
    instrs = _instructions(ptx)
    counts: dict[str, int] = {}
    for _op, operands in instrs:
        for r in set(_REG.findall(operands)):
            counts[r] = counts.get(r, 0) + 1

    def uses(reg: str) -> bool:  # a register read anywhere beyond its definition
        return counts.get(reg, 0) > 1

    entries = len(re.findall(r"^\s*\.(?:visible\s+)?(?:weak\s+)?\.entry\b", ptx, re.M)) or \
        len(re.findall(r"\.entry\b", ptx))
    own_left = OWN_STAMPS_PER_ENTRY * max(entries, 1) if traced else 0
    own = 0
    found: dict[str, dict[str, dict[str, int]]] = {c: {} for c in CLASSES}
    for op, operands in instrs:
        if own_left and op == OWN_STAMP:
            own_left -= 1
            own += 1
            continue
        got = _classify(op, operands, uses)
        if got is None:
            continue
        cls, what = got
        ops = found[cls].setdefault(what, {})
        ops[op] = ops.get(op, 0) + 1
    out: dict = {c: [{"what": w, "ops": o} for w, o in found[c].items()] for c in CLASSES}
    verdict = next((c for c in CLASSES if out[c]), "none")
    out.update(verdict=verdict, found=describe(out, verdict), entries=entries, fa4trace_own=own,
               source="traced build" if traced else "plain build")
    return out


def describe(deps: dict, verdict: str | None = None) -> str:
    """One line: what the verdict's class holds, e.g. "returning atomics on global memory
    (counters, ...): atom.global.acq_rel.add.u32 x1"; "" for "none"."""
    verdict = verdict or deps.get("verdict") or "none"
    if verdict == "none":
        return ""
    items = deps.get(verdict) or []
    return "; ".join(f"{it['what']}: " + ", ".join(f"{op} x{n}" for op, n in it["ops"].items()) for it in items)


def dependencies_of(plain_ptx: str | None, traced_ptx: str | None) -> dict:
    """``cta_dependencies`` of the plain build's PTX where there is one, else of the traced
    build's (fa4trace's stamps left out), else {"verdict": "unknown", "reason": ...}."""
    if plain_ptx:
        return cta_dependencies(plain_ptx)
    if traced_ptx:
        return cta_dependencies(traced_ptx, traced=True)
    return {"verdict": "unknown", "reason": "no PTX kept for this build"}


def keep_ptx(kwargs: dict, folder: str, compile_fn=None) -> dict:
    """``kwargs`` of a ``cute.compile`` call with its string ``options`` asking the DSL to keep
    the PTX (written into ``folder``, read into the compiled function's ``__ptx__``). Without
    ``options``, one is added only where ``compile_fn`` carries no options of its own (plain
    ``cute.compile``, not ``cute.compile[...]``): a string replaces those. Options given another
    way (a CompileOptions object) are left alone."""
    opts = kwargs.get("options")
    if opts is None and _default_options(compile_fn):
        opts = ""
    if opts is None or not isinstance(opts, str) or "--keep-ptx" in opts:
        return kwargs
    extra = "--keep-ptx" + ("" if "--dump-dir" in opts else f" --dump-dir={folder}")
    return dict(kwargs, options=f"{opts} {extra}".strip())


def _default_options(compile_fn) -> bool:
    """Whether ``compile_fn`` (a CuTe DSL compile callable, or the block's wrapper of one,
    which shows them as ``compile_options``) holds only the default options."""
    held = getattr(compile_fn, "compile_options", None) or getattr(compile_fn, "_compile_options", None)
    if held is None or not hasattr(held, "options"):
        return False
    try:
        from cutlass.base_dsl.compiler import CompileOptions

        fresh = CompileOptions().options
        return all(getattr(v, "value", None) == getattr(fresh.get(k), "value", None) for k, v in held.options.items())
    except Exception:  # noqa: BLE001 (another DSL version: leave its options alone)
        return False
