"""The control flow of a SASS listing (nvdisasm's text): its functions, their basic blocks,
dominators and natural loops.

``fa4trace sass`` reads a warp-specialized kernel through this: each warp role is a branch of
the kernel's body with loops of its own, and a loop's blocks (not the line range between a label
and the branch back to it, which ptxas's out-of-line wait stubs and rotated loops break) are what
one iteration can execute. Text in, plain data out: no GPU, no CUDA tool.

Control transfer as nvdisasm prints it (sm_90 and sm_100): ``BRA`` (conditional when guarded,
``@P0 BRA``, or given a predicate operand, ``BRA.U !UP0, `(.L_x_3)``), ``BRX``/``JMX`` (indirect:
the targets nvdisasm lists as ``BRANCH_TARGETS``), ``JMP``, ``EXIT``/``RET``/``KILL``/``BPT.TRAP``
(end the path unless guarded). ``CALL`` returns to the next instruction; ``BSSY``/``BSYNC``/
``WARPSYNC`` move no control."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from .sass import parse_instruction

_LABEL = re.compile(r"^\s*(\.L_x_\d+|\.L_\d+):")
_FUNCTION = re.compile(r"^\s*\.type\s+(\S+),\s*@function")
_GLOBAL = re.compile(r"^\s*\.global\s+(\S+)")
_TARGET = re.compile(r"`\(([^)]+)\)")
_BRANCH_TARGETS = re.compile(r'BRANCH_TARGETS\s+([^"*]+)')
_PRED_OPERAND = re.compile(r"^!?U?P[T0-9]+\s*,")

JUMPS = {"BRA", "JMP", "BRX", "JMX"}
ENDS = {"EXIT", "RET", "KILL", "BPT"}


@dataclass(frozen=True)
class Instr:
    """One SASS instruction: ``guard`` ("" or "@!P0"), ``op`` ("BRA"), ``mods`` (".U"), ``operands``."""

    index: int
    guard: str
    op: str
    mods: str
    operands: str
    text: str

    @property
    def name(self) -> str:
        """Opcode with modifiers: "MUFU.EX2"."""
        return self.op + self.mods

    def conditional(self) -> bool:
        """Whether the instruction may not run (a guard other than @PT), or, for BRA, branches on
        a predicate operand."""
        if self.guard and self.guard not in ("@PT", "@UPT"):
            return True
        return self.op == "BRA" and bool(_PRED_OPERAND.match(self.operands))

    def targets(self) -> list[str]:
        """Labels a jump may go to (BRA/JMP: the one named; BRX/JMX: nvdisasm's branch targets)."""
        if self.op not in JUMPS:
            return []
        listed = _BRANCH_TARGETS.search(self.text)
        if listed:
            return [t.strip() for t in listed.group(1).split(",") if t.strip()]
        return _TARGET.findall(self.operands)


@dataclass
class Function:
    """One function of the listing: its instructions and where its labels point."""

    name: str
    kernel: bool
    instrs: list = field(default_factory=list)
    labels: dict = field(default_factory=dict)  # label -> index of the instruction it precedes


def functions(listing: str) -> list[Function]:
    """The functions of a listing (``nvdisasm -c``, or the full listing), kernels marked. A
    listing without ``.type`` lines (a hand-written fragment) is one kernel named "kernel"."""
    out: list[Function] = []
    globals_: set = set()
    cur: Optional[Function] = None
    for line in listing.splitlines():
        g = _GLOBAL.match(line)
        if g:
            globals_.add(g.group(1))
            continue
        f = _FUNCTION.match(line)
        if f:
            cur = Function(f.group(1), False)
            out.append(cur)
            continue
        lab = _LABEL.match(line)
        ins = parse_instruction(line)
        if (lab or ins) and cur is None:
            cur = Function("kernel", True)
            out.append(cur)
        if lab:
            cur.labels[lab.group(1)] = len(cur.instrs)
        elif ins:
            guard, op, mods, operands = ins
            cur.instrs.append(Instr(len(cur.instrs), guard, op, mods, operands, line.strip()))
    for fn in out:
        fn.kernel = fn.kernel or fn.name in globals_
    return [fn for fn in out if fn.instrs]


@dataclass
class Block:
    """Instructions [start, end) of a function; successors and predecessors by block id."""

    id: int
    start: int
    end: int
    succs: list = field(default_factory=list)
    preds: list = field(default_factory=list)

    def __len__(self) -> int:
        return self.end - self.start


@dataclass
class Loop:
    """A natural loop: its header block and every block of it (inner loops' too)."""

    header: int
    blocks: frozenset
    back_edges: tuple  # (source block, header)
    parent: Optional[int] = None  # index of the innermost loop holding this one
    children: list = field(default_factory=list)


class Cfg:
    """Basic blocks, dominators and natural loops of one function."""

    def __init__(self, fn: Function):
        self.fn = fn
        self.blocks = _blocks(fn)
        self.at = {}  # instruction index -> block id
        for b in self.blocks:
            for i in range(b.start, b.end):
                self.at[i] = b.id
        self.order = _reverse_postorder(self.blocks)
        self.idom = _dominators(self.blocks, self.order)
        self.loops = _loops(self)
        self.children: dict = {b.id: [] for b in self.blocks}
        for b, d in self.idom.items():
            if d is not None and d != b:
                self.children[d].append(b)

    def instrs(self, block_ids) -> list:
        """The instructions of these blocks, in address order."""
        return [i for b in sorted(block_ids) for i in self.fn.instrs[self.blocks[b].start:self.blocks[b].end]]

    def dominates(self, a: int, b: int) -> bool:
        while b is not None:
            if a == b:
                return True
            nxt = self.idom.get(b)
            b = None if nxt == b else nxt
        return False

    def subtree(self, root: int) -> set:
        """Blocks ``root`` dominates (itself included)."""
        out, todo = set(), [root]
        while todo:
            b = todo.pop()
            out.add(b)
            todo.extend(self.children[b])
        return out

    def reachable(self) -> set:
        return set(self.idom)

    def own_blocks(self, loop_index: int) -> set:
        """A loop's blocks that no inner loop holds: one iteration's own code."""
        lp = self.loops[loop_index]
        inner = set().union(*(self.loops[c].blocks for c in lp.children)) if lp.children else set()
        return set(lp.blocks) - inner


def _blocks(fn: Function) -> list[Block]:
    n = len(fn.instrs)
    leaders = {0} | {i for i in fn.labels.values() if i < n}
    for ins in fn.instrs:
        if ins.op in JUMPS or ins.op in ENDS:
            leaders.add(ins.index + 1)
    starts = sorted(x for x in leaders if x < n)
    blocks = [Block(k, s, starts[k + 1] if k + 1 < len(starts) else n) for k, s in enumerate(starts)]
    first = {b.start: b.id for b in blocks}
    for b in blocks:
        last = fn.instrs[b.end - 1]
        succ = []
        for t in last.targets():
            if t in fn.labels and fn.labels[t] in first:
                succ.append(first[fn.labels[t]])
        falls = (last.op not in JUMPS and last.op not in ENDS) or last.conditional()
        if falls and b.end < n:
            succ.append(first[b.end])
        b.succs = list(dict.fromkeys(succ))
    for b in blocks:
        for s in b.succs:
            blocks[s].preds.append(b.id)
    return blocks


def _reverse_postorder(blocks: list[Block]) -> list[int]:
    seen, post = set(), []
    if not blocks:
        return []
    stack = [(0, iter(blocks[0].succs))]
    seen.add(0)
    while stack:
        node, it = stack[-1]
        nxt = next(it, None)
        if nxt is None:
            stack.pop()
            post.append(node)
        elif nxt not in seen:
            seen.add(nxt)
            stack.append((nxt, iter(blocks[nxt].succs)))
    return post[::-1]


def _dominators(blocks: list[Block], order: list[int]) -> dict:
    """Immediate dominator of each reachable block (the entry's is itself): Cooper, Harvey and
    Kennedy's iteration over reverse postorder."""
    if not order:
        return {}
    pos = {b: k for k, b in enumerate(order)}
    idom = {order[0]: order[0]}

    def meet(a, b):
        while a != b:
            while pos[a] > pos[b]:
                a = idom[a]
            while pos[b] > pos[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for b in order[1:]:
            done = [p for p in blocks[b].preds if p in idom]
            if not done:
                continue
            new = done[0]
            for p in done[1:]:
                new = meet(p, new)
            if idom.get(b) != new:
                idom[b] = new
                changed = True
    return idom


def _loops(cfg: Cfg) -> list[Loop]:
    """Natural loops (one per header, its back edges merged), each with its innermost parent. A
    branch back to a block that does not dominate its source (irreducible flow) makes no loop."""
    by_header: dict = {}
    for b in cfg.blocks:
        if b.id not in cfg.idom:
            continue
        for s in b.succs:
            if cfg.dominates(s, b.id):
                body, todo = {s}, [b.id]
                while todo:
                    x = todo.pop()
                    if x in body:
                        continue
                    body.add(x)
                    todo.extend(p for p in cfg.blocks[x].preds if p in cfg.idom)
                blocks, edges = by_header.get(s, (set(), []))
                by_header[s] = (blocks | body, edges + [(b.id, s)])
    loops = [Loop(h, frozenset(bl), tuple(ed)) for h, (bl, ed) in sorted(by_header.items())]
    for k, lp in enumerate(loops):
        holders = [j for j, o in enumerate(loops) if j != k and lp.blocks < o.blocks]
        if holders:
            lp.parent = min(holders, key=lambda j: len(loops[j].blocks))
            loops[lp.parent].children.append(k)
    return loops
