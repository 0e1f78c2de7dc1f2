"""What the hooks know while one kernel compiles (the DSL traces on one thread, one kernel
at a time): the trace buffer of the kernel being traced, the warp's recorder, the event table.

``STATE`` and the hooks a traced compile places (``families``, ``entry``) are process-wide: a
compile on another thread while they are in would trace them too. ``COMPILE_LOCK`` is held
by whoever compiles while an ``instrument()`` block is open (fa4trace.auto.api): every
``cute.compile`` of the process, traced or plain, runs one at a time then.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

COMPILE_LOCK = threading.RLock()  # re-entrant: a compile may compile host code inside it


@dataclass
class TraceState:
    host_buf: Any = None  # the entry's trace tensor (host side), passed on to the kernel launch
    buf: Any = None  # the kernel's trace tensor
    rec: Any = None  # this kernel's SegmentRecorder (every warp starts one at entry)
    table: Any = None  # events.EventTable of this compile
    families: frozenset = frozenset()
    names: dict = field(default_factory=dict)  # id(pipeline) -> (name, object)
    found: dict = field(default_factory=dict)  # family -> hooked calls traced
    launches: list = field(default_factory=list)  # launch configs seen (block, grid, cluster)

    def reset(self, table=None, families=()):
        self.host_buf = self.buf = self.rec = None
        self.table = table
        self.families = frozenset(families)
        self.names, self.found, self.launches = {}, {}, []


STATE = TraceState()

