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
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:(?P<guard>@!?U?P[T0-9]+)\s+)?(?P<op>[A-Z0-9_]+)(?P<mods>\.[A-Z0-9_.]+)?"
                          r"\s*(?P<operands>[^;]*);")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BACK_BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+`\((\.L_x_\d+)\)")
_MMA = re.compile(r"^(HGMMA|UTC\w*MMA|HMMA|IMMA)$")
_TIMER = re.compile(r"SR_(CLOCKLO|CLOCKHI|GLOBALTIMERLO|GLOBALTIMERHI|GLOBALTIMER)\b")


def parse_instruction(line: str) -> Optional[tuple]:
    """(guard, opcode, modifiers, operands) of one instruction line of nvdisasm, e.g.
    ("@!P0", "MUFU", ".EX2", "R3, R3"); guard and modifiers "" where absent. None: not an
    instruction (a label, a directive, a blank line)."""
    m = _INSTRUCTION.match(line)
    if not m:
        return None
    return m.group("guard") or "", m.group("op"), m.group("mods") or "", m.group("operands").strip()


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


def disassemble(cubin: bytes, code_only: bool = True, nvdisasm: Optional[str] = None) -> str:
    """nvdisasm's text of a cubin (the bytes a compile made): its code (``nvdisasm -c``), or with
    ``code_only=False`` the whole listing, whose .nv.info and .nv.shared sections ``resources``
    reads. RuntimeError in one line where nvdisasm is missing or fails."""
    nvdisasm = nvdisasm or find_tool("nvdisasm")
    if not nvdisasm:
        raise RuntimeError("reading a cubin needs nvdisasm (the CUDA toolkit; it also ships with Triton): not found")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        Path(path).write_bytes(cubin)
        p = subprocess.run([nvdisasm, *(["-c"] if code_only else []), path], capture_output=True, text=True)
        _check(p, nvdisasm)
    return p.stdout


_NVINFO = re.compile(r"//-+\s*nvinfo\s*:\s*(EIATTR_\w+)")
_WORD = re.compile(r"\.word\s+(index@\((\S+)\)|0x[0-9a-f]+)")
_SECTION = re.compile(r"^\s*\.section\s+([^,\s]+)")
_ZERO = re.compile(r"^\s*\.zero\s+(\d+)")


def resources(listing: str) -> dict:
    """{kernel: {"registers", "stack_frame_bytes", "static_smem_bytes"}} from a whole nvdisasm
    listing (``disassemble(..., code_only=False)``): the cubin's EIATTR_REGCOUNT and
    EIATTR_FRAME_SIZE per function, and the size of its ``.nv.shared.<kernel>`` section (shared
    memory declared in the kernel; what the launch adds, dynamic shared memory, is not in the
    cubin). A function without an attribute has None there."""
    out: dict = {}
    attr, words, section = None, [], None

    def flush():
        if attr in ("EIATTR_REGCOUNT", "EIATTR_FRAME_SIZE") and len(words) >= 2 and words[0][1]:
            key = "registers" if attr == "EIATTR_REGCOUNT" else "stack_frame_bytes"
            out.setdefault(words[0][1], {})[key] = int(words[1][0], 16)

    for line in listing.splitlines():
        m = _NVINFO.search(line)
        sec = _SECTION.match(line)
        if m or sec or line.startswith("//-----"):
            flush()
            attr, words = (m.group(1) if m else None), []
        if sec:
            section = sec.group(1)
        w = _WORD.search(line)
        if w and attr:
            words.append((w.group(1), w.group(2)))
        z = _ZERO.match(line)
        if z and section and section.startswith(".nv.shared.") and not section.startswith(".nv.shared.reserved"):
            name = section[len(".nv.shared."):]
            entry = out.setdefault(name, {})
            entry["static_smem_bytes"] = entry.get("static_smem_bytes", 0) + int(z.group(1))
    flush()
    for entry in out.values():
        for key in ("registers", "stack_frame_bytes", "static_smem_bytes"):
            entry.setdefault(key, None)
    return out


def counts(lines) -> dict:
    """Counts of SASS instruction lines (any other line is skipped): instructions, timer reads
    (uniform: S2UR; per lane: CS2R or S2R), shared stores / loads (STS, LDS), global stores (STG),
    local-memory loads / stores (LDL, STL: register spills, or arrays ptxas could not keep in
    registers) and branches (BRA)."""
    n = uniform = vector = sts = lds = stg = ldl = stl = bra = 0
    for line in lines:
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        op, operands = m.group("op"), m.group("operands")
        n += 1
        if _TIMER.search(operands):
            uniform += op == "S2UR"
            vector += op in ("CS2R", "S2R")
        sts += op == "STS"
        lds += op == "LDS"
        stg += op == "STG"
        ldl += op == "LDL"
        stl += op == "STL"
        bra += op == "BRA"
    return {"instructions": n, "timer_reads": uniform + vector, "timer_reads_uniform": uniform,
            "timer_reads_per_lane": vector, "shared_stores": sts, "shared_loads": lds, "global_stores": stg,
            "local_loads": ldl, "local_stores": stl, "branches": bra}


def footprint(sass: str) -> dict:
    """``counts`` of one SASS listing, and the instructions of one iteration of its main loop
    (``mainloop``; None: no MMA loop)."""
    loop = mainloop(sass)
    return dict(counts(sass.splitlines()), mainloop=None if loop is None else len(loop))


def is_mma(op: str) -> bool:
    """Whether an opcode issues tensor-core math: HGMMA (sm_90 wgmma), UTC*MMA (sm_100 tcgen05),
    HMMA / IMMA (mma.sync)."""
    return bool(_MMA.match(op))


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
    has_mma = [(a, b) for a, b in loops if any(is_mma(_INSTRUCTION.match(x).group("op")) for x in lines[a:b])]
    # innermost: no shorter MMA loop shares an instruction with it (ptxas rotates loops, so an
    # outer loop's range may overlap an inner one's without holding it whole)
    inner = [(a, b) for a, b in has_mma if not any(c < b and a < d and d - c < b - a for c, d in has_mma)]
    if not inner:
        return None
    def mmas(ab):
        return sum(bool(is_mma(_INSTRUCTION.match(x).group("op"))) for x in lines[ab[0]:ab[1]])

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
