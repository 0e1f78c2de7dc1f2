"""The events an instrumented kernel records, named while it compiles.

Each distinct (family, op, resource) met while tracing gets the next free event id from
``FIRST_ID`` up, and a name: ``<resource>.<op>`` for a pipeline (``ab.wait``), else
``<family>.<op>`` (``tma.load``, ``mma.wait``, ``barrier.sync``). The resulting vocabulary
travels with the compiled kernel (and its AOT manifest) and is stored in every bundle, so the
decoder, Perfetto and the viewer name the events without knowing the kernel.
"""

from __future__ import annotations

import re

from ..format.options import FAMILIES  # the automatic ones (the options' leaf defines them); "user": spans
from ..format.vocab import MAX_EVENT_ID, VOCAB, Vocabulary

__all__ = ["FAMILIES", "FIRST_ID", "OPS", "EventTable"]
FIRST_ID = 32  # hand-placed events use 1..31; 255 is the anchor

# What each op is: (span?, description). Spans are waits or issue windows of the warp itself.
OPS = {
    ("pipeline", "acquire"): (True, "producer waits for an empty stage (and arms its barrier)"),
    ("pipeline", "commit"): (False, "producer marks a stage filled / its copy issued"),
    ("pipeline", "wait"): (True, "consumer waits for a full stage"),
    ("pipeline", "release"): (False, "consumer frees a stage"),
    ("tma", "load"): (False, "TMA load issued (global -> shared)"),
    ("tma", "store"): (False, "TMA store issued (shared -> global)"),
    ("mma", "commit"): (False, "MMA group committed (wgmma commit_group / tcgen05 commit)"),
    ("mma", "issue"): (False, "tcgen05 MMA issued (Blackwell)"),
    ("mma", "wait"): (True, "warp waits until all but the newest k MMA groups finished"),
    ("barrier", "sync"): (True, "named barrier: arrive and wait"),
    ("barrier", "arrive"): (False, "named barrier: arrive without waiting"),
    ("user", "span"): (True, "a function the user named (fa4trace.instrument spans=)"),
}

_COLORS = {
    "acquire": "#fdd0a2", "commit": "#6baed6", "wait": "#fa9fb5", "release": "#a1d99b",
    "load": "#3182bd", "issue": "#e6550d", "span": "#31a354", "store": "#756bb1", "sync": "#c51b8a", "arrive": "#bcbddc",
}


def _ident(s: str) -> str:
    s = re.sub(r"[^0-9A-Za-z_]+", "_", str(s)).strip("_")
    return s or "x"


class EventTable:
    """Ids and names of one compile's automatic events (trace time, one thread)."""

    def __init__(self):
        self.vocab: Vocabulary = VOCAB.copy()
        self._ids: dict[tuple, int] = {}
        self.pipelines: dict[str, dict] = {}  # name -> {"class": ..., "stages": n}
        self.placed: dict[str, int] = {}  # event name -> call sites instrumented

    def event(self, family: str, op: str, resource: str = "", stages: int = 0) -> int:
        key = (family, op, resource)
        eid = self._ids.get(key)
        if eid is None:
            is_span, what = OPS[(family, op)]
            eid = FIRST_ID + len(self._ids)
            if eid >= MAX_EVENT_ID:
                raise RuntimeError(f"fa4trace: more than {MAX_EVENT_ID - FIRST_ID} distinct automatic events "
                                   "in one kernel; record fewer families")
            name = (f"{_ident(resource)}.{op}" if family == "pipeline" else _ident(resource) if family == "user"
                    else f"{family}.{op}")
            desc = f"{resource}: {what}" if resource else what
            self.vocab.register(name, eid, role="", is_async=False, color=_COLORS.get(op, "#969696"),
                                description=desc, family=family, op=op, resource=str(resource),
                                stages=int(stages))
            self._ids[key] = eid
        name = self.vocab.event(eid).name
        self.placed[name] = self.placed.get(name, 0) + 1
        return eid

    def is_span(self, family: str, op: str) -> bool:
        return OPS[(family, op)][0]

    def families_found(self) -> set[str]:
        return {f for f, _op, _r in self._ids}
