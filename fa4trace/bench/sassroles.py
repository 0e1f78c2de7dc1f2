"""Which warp role each part of a warp-specialized kernel's SASS belongs to, and what each
role's code holds: the per-role half of ``fa4trace sass``.

How a role is assigned (docs/static-footprint.md says the same for users):

1. **Signatures.** A loop carries the signature of the work it issues, instructions tracing
   never adds: tensor-core MMA (``HGMMA`` on sm_90, ``UTC*MMA`` on sm_100), ``MUFU.EX2``
   (softmax's exponentials), TMA loads (``UTMALDG``) and stores (``UTMASTG``), tensor-memory
   loads and stores (``LDTM``/``STTM``, sm_100). ``RULES`` names a role from them, first match:
   consumer (MMA and EX2 in one warp's loops: a Hopper warpgroup), mma, softmax, producer (TMA
   loads), correction (tensor-memory loads and stores, no EX2), epilogue (TMA stores).
2. **Warp-index branches.** A forward data-flow pass marks registers holding the warp index
   (``SR_TID.X`` shifted right by 5 or more, and what is computed from it) and the predicates
   compared from them; a branch on such a predicate (or an indirect ``BRX`` through such a
   register) is a warp-index branch. A block entered only from warp-index branches opens a
   body; a role's region is the code that block dominates. Nested bodies: a body whose own
   loops carry a signature takes in the bodies nested in it (the same warps, a later phase,
   such as our decode kernel's split-KV combine after its main loop); a body without loops of
   its own is a dispatch level, and the bodies in it are roles of their own.
   Confidence "high": a signature, reached through a recovered warp-index branch.
3. **Fallback.** Signature loops in no body (the warp-index branch was not recovered, or the
   kernel is not warp-specialized): the largest dominator subtree around them that holds no
   other role's loops. Confidence "medium".
4. Everything else (the prologue before the dispatch, the warps' common exit, idle warps, loops
   without a signature outside every role) is "unattributed".

Per role: the region's counts (``sass.counts``: instructions, timer reads, shared / global /
local-memory stores and loads), the ``setmaxnreg`` (``USETMAXREG``) values in it, or else the
nearest one above its entry on the dominator chain (a warpgroup that sets its registers before a
nested dispatch picks the warp that issues its work), and its main loop: the innermost loop issuing the role's primary signature, the most of it (tie: the longer),
counted over the loop's own blocks (inner loops, such as a barrier's try-wait retry, excluded):
every instruction of one iteration, each path once.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from .sass import counts, is_mma
from .sasscfg import Cfg, Function

# role, signatures it needs, its primary signature (its main loop issues the most of it)
RULES = (
    ("consumer", ("mma", "ex2"), "mma"),
    ("mma", ("mma",), "mma"),
    ("softmax", ("ex2",), "ex2"),
    ("producer", ("tma_load",), "tma_load"),
    ("correction", ("tmem_load", "tmem_store"), "tmem_load"),
    ("epilogue", ("tma_store",), "tma_store"),
)
SIGNATURES = ("mma", "ex2", "tma_load", "tma_store", "tmem_load", "tmem_store")
ROLE_ORDER = ("producer", "mma", "consumer", "softmax", "correction", "epilogue")


def signature(ins) -> Optional[str]:
    """The signature one instruction carries (an element of SIGNATURES), or None."""
    op, mods = ins.op, ins.mods
    if is_mma(op):
        return "mma"
    if op == "MUFU" and mods.startswith(".EX2"):
        return "ex2"
    if op == "UTMALDG" or (op == "UBLKCP" and mods.startswith(".S.G")):
        return "tma_load"
    if op in ("UTMASTG", "UTMAREDG") or (op == "UBLKCP" and mods.startswith(".G.S")):
        return "tma_store"
    if op == "LDTM":
        return "tmem_load"
    if op == "STTM":
        return "tmem_store"
    return None


def signatures(instrs) -> Counter:
    return Counter(s for s in map(signature, instrs) if s)


def role_of(sig: Counter) -> Optional[tuple]:
    """(role, primary signature) of a set of signatures: the first of ``RULES`` they satisfy."""
    for role, needs, primary in RULES:
        if all(sig.get(n) for n in needs):
            return role, primary
    return None


# ---- warp-index branches ------------------------------------------------------------------------
_REG = re.compile(r"(?<![\w.])(U?R\d+|U?P\d)(?![\w])")
_PRED = re.compile(r"^!?(U?P[T0-9]+)$")
_IMM = re.compile(r"^-?0x([0-9a-f]+)$")
_NO_DEST = {"ST", "STS", "STG", "STL", "STSM", "STTM", "RED", "BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "CALL",
            "BAR", "BSSY", "BSYNC", "WARPSYNC", "NOP", "MEMBAR", "FENCE", "DEPBAR", "UTMALDG", "UTMASTG",
            "UTMACCTL", "UTMAPF", "UTCBAR", "UBLKCP", "UBLKPF", "CCTL", "NANOSLEEP", "BPT", "KILL", "ERRBAR"}
_COMPARES = {"ISETP", "UISETP", "FSETP", "PLOP3", "UPLOP3", "DSETP", "HSETP2", "VOTE", "VOTEU"}
_SHIFT_RIGHT = re.compile(r"^U?SHF$")


def _operands(ins) -> list:
    return [o.strip() for o in ins.operands.split(",")] if ins.operands else []


def _dests(ins, ops: list) -> list:
    """Registers and predicates an instruction writes: its leading predicate operands, then its
    first register operand (SASS writes destinations first)."""
    if ins.op in _NO_DEST or not ops:
        return []
    out = []
    for o in ops:
        m = _PRED.match(o)
        if m:
            out.append(m.group(1))
            continue
        m = _REG.fullmatch(o.split(".")[0])
        if m and not out:
            out.append(m.group(1))
        break
    return [d for d in out if d not in ("PT", "UPT")]


def _sources(ops: list, n_dests: int) -> set:
    regs = set()
    for o in ops[n_dests:]:
        regs.update(r for r in _REG.findall(o))
    return regs


def _transfer(ins, thread: set, warp: set) -> None:
    """One instruction's effect on the registers holding the thread index (``thread``) and
    values of the warp index (``warp``), in place."""
    ops = _operands(ins)
    dests = _dests(ins, ops)
    if not dests:
        return
    if ins.op in ("S2R", "S2UR", "CS2R"):
        kind = "thread" if "SR_TID.X" in ins.operands else None
    else:
        src = _sources(ops, len(dests))
        if src & warp:
            kind = "warp"
        elif src & thread:
            kind = "thread"
            imms = [int(m.group(1), 16) for m in (_IMM.match(o) for o in ops[len(dests):]) if m]
            if _SHIFT_RIGHT.match(ins.op) and ".R" in ins.mods and any(k >= 5 for k in imms):
                kind = "warp"  # tid >> 5 (or more): the warp index
            elif ins.op in _COMPARES and imms and all(k % 32 == 0 for k in imms):
                kind = "warp"  # tid < 128: a whole number of warps
        else:
            kind = None
    for d in dests:
        if kind is None:
            if not ins.guard:  # a guarded write may not happen: keep what the register held
                thread.discard(d)
                warp.discard(d)
        elif kind == "warp":
            warp.add(d)
        else:
            thread.add(d)


def warp_branches(cfg: Cfg) -> dict:
    """{block id: instruction index} of the blocks that end in a warp-index branch (module
    docstring, step 2): a forward may-analysis over the CFG to a fixed point."""
    state_out: dict = {}
    changed = True
    while changed:
        changed = False
        for b in cfg.order:
            thread, warp = _flow_through(cfg, b, state_out, last=True)
            new = (frozenset(thread), frozenset(warp))
            if state_out.get(b) != new:
                state_out[b] = new
                changed = True
    out = {}
    for b in cfg.order:
        blk = cfg.blocks[b]
        _thread, warp = _flow_through(cfg, b, state_out, last=False)
        last = cfg.fn.instrs[blk.end - 1]
        # a branch on the warp index, or a warp-index EXIT: the warps that go on are chosen by it
        if (len(blk.succs) > 1 or last.op == "EXIT") and _on_warp(last, warp):
            out[b] = last.index
    return out


def _flow_through(cfg: Cfg, b, state_out: dict, last: bool) -> tuple[set, set]:
    """The (thread-dependent, warp-dependent) registers after block ``b``: the union of its
    predecessors' ``state_out``, carried through its instructions (``last``: its final one too)."""
    blk = cfg.blocks[b]
    thread, warp = set(), set()
    for p in blk.preds:
        t, w = state_out.get(p, ((), ()))
        thread.update(t)
        warp.update(w)
    for ins in cfg.fn.instrs[blk.start:blk.end if last else blk.end - 1]:
        _transfer(ins, thread, warp)
    return thread, warp


def _on_warp(ins, warp: set) -> bool:
    if ins.op in ("BRX", "JMX"):
        return bool(set(_REG.findall(ins.operands.split("(")[0])) & warp)
    if ins.op not in ("BRA", "EXIT"):
        return False
    preds = set()
    if ins.guard:
        preds.add(ins.guard.lstrip("@!"))
    ops = _operands(ins)
    if ops and _PRED.match(ops[0]):
        preds.add(_PRED.match(ops[0]).group(1))
    return bool(preds & warp)


# ---- regions ---------------------------------------------------------------------------------
@dataclass
class Region:
    """The code of one role in one place of the kernel: ``blocks`` (ids), its ``entry`` block,
    the loops in it (indices into cfg.loops), how it was found."""

    role: str
    primary: str
    entry: int
    blocks: set
    loops: list
    confidence: str  # "high" | "medium"
    evidence: dict = field(default_factory=dict)


def attribute(cfg: Cfg) -> list[Region]:
    """The role regions of one function (module docstring): bodies entered through warp-index
    branches first, then the fallback for signature loops in none."""
    loop_sig = [signatures(cfg.instrs(lp.blocks)) for lp in cfg.loops]
    signed = [k for k, s in enumerate(loop_sig) if s]
    branches = warp_branches(cfg)
    entries = set()
    for b in cfg.blocks:  # entered only from warp-index branches (a loop's branch back to it aside)
        into = [p for p in b.preds if p in cfg.idom and not cfg.dominates(b.id, p)]
        if b.id in cfg.idom and into and all(p in branches for p in into):
            entries.add(b.id)

    def chain(block: int) -> list:  # the entries dominating a block, outermost first
        out = []
        while True:
            if block in entries:
                out.append(block)
            up = cfg.idom.get(block)
            if up is None or up == block:
                return out[::-1]
            block = up

    nearest = {k: (chain(cfg.loops[k].header) or [None])[-1] for k in signed}
    owns = {e for e in nearest.values() if e is not None}
    bodies: dict = {}
    for k in signed:
        ch = chain(cfg.loops[k].header)
        if ch:
            bodies.setdefault(next(e for e in ch if e in owns), []).append(k)
    regions = []
    for entry, _ in sorted(bodies.items()):
        blocks = cfg.subtree(entry)
        loops = [k for k, lp in enumerate(cfg.loops) if lp.header in blocks]
        named = role_of(sum((loop_sig[k] for k in loops), Counter()))
        if named is None:
            continue
        via = [p for p in cfg.blocks[entry].preds if p in branches]
        regions.append(Region(named[0], named[1], entry, blocks, loops, "high",
                              {"entered_from": [_offset(cfg, branches[p]) for p in via]}))
    taken = set().union(*(r.blocks for r in regions)) if regions else set()
    regions += _fallback(cfg, [k for k in signed if cfg.loops[k].header not in taken], loop_sig, taken)
    return regions


def _fallback(cfg: Cfg, loops: list, loop_sig: list, taken: set) -> list[Region]:
    """Signature loops outside every body: per role, the largest dominator subtree around each
    that holds no other role's loop and no body's block."""
    role = {k: role_of(loop_sig[k]) for k in loops}
    roots: dict = {}
    for k in loops:
        if role[k] is None:
            continue
        b = cfg.loops[k].header
        while True:
            up = cfg.idom.get(b)
            if up is None or up == b:
                break
            tree = cfg.subtree(up)
            other = any(role[j] and role[j][0] != role[k][0] and cfg.loops[j].header in tree for j in loops)
            if other or tree & taken:
                break
            b = up
        roots.setdefault((role[k], b), []).append(k)
    out = []
    for ((name, primary), root), _ in sorted(roots.items(), key=lambda x: x[0][1]):
        blocks = cfg.subtree(root) - taken
        out.append(Region(name, primary, root, blocks, [k for k, lp in enumerate(cfg.loops) if lp.header in blocks],
                          "medium", {"entered_from": []}))
    return out


def _offset(cfg: Cfg, index: int) -> str:
    m = re.match(r"/\*([0-9a-f]+)\*/", cfg.fn.instrs[index].text)
    return "0x" + m.group(1) if m else str(index)


# ---- the report of one function ----------------------------------------------------------------
_HEX = re.compile(r"0x([0-9a-f]+)\s*$")


def setmaxnreg(instrs) -> list:
    """The register counts the ``USETMAXREG`` (PTX setmaxnreg) instructions set, in order."""
    out = []
    for ins in instrs:
        if ins.op == "USETMAXREG":
            m = _HEX.search(ins.operands)
            if m:
                out.append(int(m.group(1), 16))
    return out


def setmaxnreg_before(cfg: Cfg, block: int) -> Optional[int]:
    """The register count the nearest ``USETMAXREG`` above ``block`` on its dominator chain sets
    (code every warp reaching the block has run: a role's warpgroup may set its registers at a
    dispatch level above the body that issues its work), or None."""
    b = cfg.idom.get(block)
    while b is not None:
        found = setmaxnreg(cfg.instrs([b]))
        if found:
            return found[-1]
        up = cfg.idom.get(b)
        b = None if up == b else up
    return None


def main_loop(cfg: Cfg, region: Region) -> Optional[int]:
    """Index of the region's main loop (module docstring), or None."""
    prim = {k: signatures(cfg.instrs(cfg.own_blocks(k))).get(region.primary, 0) for k in region.loops}
    with_prim = {k: signatures(cfg.instrs(cfg.loops[k].blocks)).get(region.primary, 0) for k in region.loops}
    cands = [k for k in region.loops if with_prim[k]
             and not any(with_prim.get(c) for c in _descendants(cfg, k))]
    if not cands:
        return None
    return max(cands, key=lambda k: (prim[k], len(cfg.instrs(cfg.own_blocks(k)))))


def _descendants(cfg: Cfg, k: int) -> list:
    out, todo = [], list(cfg.loops[k].children)
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(cfg.loops[c].children)
    return out


def region_report(cfg: Cfg, region: Region) -> dict:
    """A role region's counts, setmaxnreg and main loop (plain data)."""
    instrs = cfg.instrs(region.blocks)
    out = dict(counts(i.text for i in instrs))
    out["signatures"] = dict(sorted(signatures(instrs).items()))
    out["setmaxnreg"] = setmaxnreg(instrs)
    out["setmaxnreg_before"] = setmaxnreg_before(cfg, region.entry)
    k = main_loop(cfg, region)
    if k is None:
        out["mainloop"] = None
    else:
        own = cfg.instrs(cfg.own_blocks(k))
        body = dict(counts(i.text for i in own))
        body["signatures"] = dict(sorted(signatures(own).items()))
        body["at"] = _offset(cfg, cfg.blocks[cfg.loops[k].header].start)
        body["inner_loops"] = len(_descendants(cfg, k))
        out["mainloop"] = body
    out["entry"] = _offset(cfg, cfg.blocks[region.entry].start)
    out["confidence"] = region.confidence
    out["evidence"] = region.evidence
    return out


def function_roles(fn: Function) -> dict:
    """{"roles": {role: [region report, ...]}, "unattributed": counts, "warp_branches": n,
    "loops": n} of one function."""
    cfg = Cfg(fn)
    regions = attribute(cfg)
    roles: dict = {}
    for r in regions:
        roles.setdefault(r.role, []).append(region_report(cfg, r))
    covered = set().union(*(r.blocks for r in regions)) if regions else set()
    rest = [i for b in cfg.blocks if b.id not in covered for i in fn.instrs[b.start:b.end]]
    un = dict(counts(i.text for i in rest))
    un["setmaxnreg"] = setmaxnreg(rest)
    return {"roles": {k: roles[k] for k in sorted(roles, key=_role_key)}, "unattributed": un,
            "warp_branches": len(warp_branches(cfg)), "loops": len(cfg.loops)}


def _role_key(name: str):
    return (ROLE_ORDER.index(name) if name in ROLE_ORDER else len(ROLE_ORDER), name)
