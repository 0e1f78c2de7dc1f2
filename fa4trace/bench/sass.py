"""What a kernel's PTX becomes in SASS, counted: the static footprint of a traced build against
its plain twin, on a machine without a GPU (``benchmarks/fa4_cost_parts.py sass``).

``ptxas`` (the CUDA toolkit's, on PATH or under $CUDA_HOME) assembles the PTX; ``nvdisasm``
(the toolkit's, or the copy Triton ships) prints the SASS. ``footprint`` counts what tracing
adds: instructions, timer reads (and whether ptxas read them into uniform registers: S2UR, or
per lane: CS2R), shared-memory stores and loads, global stores and branches. Those counts are of
the whole kernel, every copy of its body: they say how much was added and of what kind, not
where it runs. ``mainloop`` finds where it runs most: the loop that issues the kernel's tensor-core
instructions, whose length per iteration is what an issue-bound kernel pays for."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

# one SASS instruction line of nvdisasm: /*0420*/  [@!P0] OPCODE.MODS operands ;
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z0-9_]+)(\.[A-Z0-9_.]+)?\s*([^;]*);")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BACK_BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+`\((\.L_x_\d+)\)")
_MMA = re.compile(r"^(HGMMA|UTC\w*MMA|HMMA|IMMA)$")
_TIMER = re.compile(r"SR_(CLOCKLO|CLOCKHI|GLOBALTIMERLO|GLOBALTIMERHI|GLOBALTIMER)\b")


def find_tool(name: str) -> Optional[str]:
    """Path of a CUDA binary tool: on PATH, under $CUDA_HOME/bin, else (nvdisasm) Triton's copy."""
    found = shutil.which(name)
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.access(os.path.join(home, "bin", name), os.X_OK):
        return os.path.join(home, "bin", name)
    try:
        import importlib.util

        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        spec = None
    if spec and spec.origin:
        path = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / name
        if os.access(path, os.X_OK):
            return str(path)
    return None


_UNSUPPORTED = re.compile(r"Unsupported \.version ([\d.]+); current version is '([\d.]+)'")


def sass_of(ptx: str, arch: str = "sm_90a", ptxas: Optional[str] = None, nvdisasm: Optional[str] = None,
            ptxas_args: tuple = ()) -> str:
    """The SASS text of ``ptx`` (assembled for ``arch`` at -O3, plus ``ptxas_args``: the options
    the kernel's own build gives ptxas, such as ``--fmad=false``). A PTX ISA newer than the
    ptxas found (the CuTe DSL 4.8 writes 9.4; CUDA 13.0's ptxas reads up to 9.0) is assembled
    as the newest that ptxas reads, which holds while the kernel uses nothing newer (ptxas says
    so where it does). Raises RuntimeError in one line where a tool is missing or fails."""
    ptxas = ptxas or find_tool("ptxas")
    nvdisasm = nvdisasm or find_tool("nvdisasm")
    if not ptxas or not nvdisasm:
        raise RuntimeError("counting SASS needs ptxas and nvdisasm (the CUDA toolkit; nvdisasm also ships with "
                           "Triton): " + ", ".join(n for n, p in (("ptxas", ptxas), ("nvdisasm", nvdisasm)) if not p)
                           + " not found")
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        Path(src).write_text(ptx)
        assemble = [ptxas, f"-arch={arch}", "-O3", *ptxas_args, src, "-o", cubin]
        p = subprocess.run(assemble, capture_output=True, text=True)
        newer = _UNSUPPORTED.search(p.stderr)
        if p.returncode != 0 and newer:
            Path(src).write_text(re.sub(r"^\.version [\d.]+", f".version {newer.group(2)}", ptx, count=1, flags=re.M))
            p = subprocess.run(assemble, capture_output=True, text=True)
        _check(p, ptxas)
        p = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True)
        _check(p, nvdisasm)
    return p.stdout


def _check(proc, tool: str):
    if proc.returncode != 0:
        msgs = [ln for ln in proc.stderr.strip().splitlines() if "fatal" in ln or "error" in ln.lower()]
        raise RuntimeError(f"{os.path.basename(tool)} failed: {(msgs or proc.stderr.strip().splitlines() or ['no message'])[0]}")


def footprint(sass: str) -> dict:
    """Counts of one SASS listing: instructions, timer reads (uniform: S2UR; per lane: CS2R or
    S2R), shared stores / loads (STS, LDS), global stores (STG), branches (BRA), and the
    instructions of one iteration of its main loop (``mainloop``; None: no MMA loop)."""
    n = uniform = vector = sts = lds = stg = bra = 0
    for line in sass.splitlines():
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        op, operands = m.group(1), m.group(3)
        n += 1
        if _TIMER.search(operands):
            uniform += op == "S2UR"
            vector += op in ("CS2R", "S2R")
        sts += op == "STS"
        lds += op == "LDS"
        stg += op == "STG"
        bra += op == "BRA"
    loop = mainloop(sass)
    return {"instructions": n, "timer_reads": uniform + vector, "timer_reads_uniform": uniform,
            "timer_reads_per_lane": vector, "shared_stores": sts, "shared_loads": lds, "global_stores": stg,
            "branches": bra, "mainloop": None if loop is None else len(loop)}


def mainloop(sass: str) -> Optional[list]:
    """The instructions (text) of the kernel's main loop: of the loops (a branch back to an
    earlier label) that hold tensor-core instructions (HGMMA on sm_90) and overlap no shorter
    such loop, the one with the most of them; of two with as many, the longer (a traced kernel
    keeps an untraced copy of its body for the CTAs that do not record, and the traced copy is
    the longer). None where no loop holds an MMA."""
    lines, labels, loops = [], {}, []
    for line in sass.splitlines():
        lab = _LABEL.match(line)
        if lab:
            labels[lab.group(1)] = len(lines)
            continue
        if _INSTRUCTION.match(line):
            lines.append(line)
            back = _BACK_BRANCH.search(line)
            if back and back.group(1) in labels:
                loops.append((labels[back.group(1)], len(lines)))
    has_mma = [(a, b) for a, b in loops if any(_MMA.match(_INSTRUCTION.match(x).group(1)) for x in lines[a:b])]
    # innermost: no shorter MMA loop shares an instruction with it (ptxas rotates loops, so an
    # outer loop's range may overlap an inner one's without holding it whole)
    inner = [(a, b) for a, b in has_mma if not any(c < b and a < d and d - c < b - a for c, d in has_mma)]
    if not inner:
        return None
    def mmas(ab):
        return sum(bool(_MMA.match(_INSTRUCTION.match(x).group(1))) for x in lines[ab[0]:ab[1]])

    a, b = max(inner, key=lambda ab: (mmas(ab), ab[1] - ab[0]))
    return lines[a:b]


# the counts' columns of a result file of SASS counts (report.py's generic table), after its naming ones
COUNT_COLUMNS = (("instructions", "SASS instructions"), ("added", "added to the untraced kernel"),
                 ("mainloop", "main loop"), ("mainloop_added", "added there"),
                 ("timer_reads", "timer reads"), ("timer_reads_uniform", "of them S2UR"),
                 ("shared_stores", "STS"), ("shared_loads", "LDS"), ("global_stores", "STG"), ("branches", "BRA"))


def _minus(a, b):
    return None if a is None or b is None else a - b


def envelope(area: str, title: str, counted: list, untraced: dict, name_columns: list, notes: str) -> dict:
    """A result file of SASS counts: one row per (naming fields, ``footprint``) of ``counted``,
    with ``added``, its instructions above the ``untraced`` kernel's footprint."""
    from .results import envelope as result_envelope

    rows = [dict(names, **fp, added=fp["instructions"] - untraced["instructions"],
                 mainloop_added=_minus(fp.get("mainloop"), untraced.get("mainloop"))) for names, fp in counted]
    return result_envelope(area, title, rows, gpu="none: ptxas and nvdisasm on the CPU", notes=notes,
                           columns=[*name_columns, *COUNT_COLUMNS])
