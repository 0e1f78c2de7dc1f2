"""How a merge places and writes what it merges: ``MergeOptions``, one frozen object made once
(by ``fa4trace merge``, or by ``merge`` / ``merge_ranks`` from their keywords) and handed down
whole to the steps that match, place and draw each launch.

Checked when it is made (one ``BadOption`` line naming the bad value), one default per setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..format.errors import BadOption
from ..format.options import count
from .collectives import RANK_CLOCKS
from .match import DEFAULT_MAX_CLOCK_OFFSET_NS, DEFAULT_TOLERANCE_NS

# "start": each launch's first warp at its kernel slice's start; "clock": one offset for every launch
ALIGN_MODES = ("start", "clock")


@dataclass(frozen=True)
class MergeOptions:
    """``align``: "start" or "clock" (``fa4trace.profiler.merge``'s module doc). ``rank_clock``:
    "nccl" or "epoch", several ranks only (``fa4trace.profiler.ranks``). ``max_launches``: draw
    the warps of the first N traced launches of each bundle only (None: all). ``compress``: zlib
    the warp packets. ``analysis``: busy / waiting / overlap per launch in the report.
    ``tolerance_ns`` and ``max_clock_offset_ns`` (None: no limit): how launches are matched to
    kernels (``fa4trace.profiler.match``). ``allow_unmatched``: write the merge even where a
    bundle has no launch in the profiler trace."""

    align: str = "start"
    rank_clock: str = "nccl"
    max_launches: Optional[int] = None
    compress: bool = False
    analysis: bool = True
    tolerance_ns: int = DEFAULT_TOLERANCE_NS
    max_clock_offset_ns: Optional[int] = DEFAULT_MAX_CLOCK_OFFSET_NS
    allow_unmatched: bool = False

    def __post_init__(self):
        if self.align not in ALIGN_MODES:
            raise BadOption(f"align must be one of {', '.join(ALIGN_MODES)}, not {self.align!r}")
        if self.rank_clock not in RANK_CLOCKS:
            raise BadOption(f"rank_clock must be one of {', '.join(RANK_CLOCKS)}, not {self.rank_clock!r}")
        for name, none in (("max_launches", True), ("tolerance_ns", False), ("max_clock_offset_ns", True)):
            object.__setattr__(self, name, count(name, getattr(self, name), 0, none=none))
