"""Times per warp, sorted, so that how many a warp has in an interval is two binary searches.

The compensation counts each warp's records between two reads (fa4trace.analysis.compensate);
the barrier matcher counts the waits a warp began since a barrier (fa4trace.analysis.barriers).
Each time is kept as an offset from its warp's first, packed beside the warp id in one int64.
"""

from __future__ import annotations

import numpy as np

from ..format.errors import Fa4traceError

T_BITS = 41  # per-warp time offsets below 2**41 (cycles or ns: minutes) pack beside a warp (group) id


class WarpTimes:
    """``t`` (cycles or ns) of warps ``gid`` (dense ids below ``n_warps``), sorted per warp."""

    def __init__(self, gid: np.ndarray, t: np.ndarray, n_warps: int):
        gid = np.asarray(gid, np.int64)
        t = np.asarray(t, np.int64)
        self.lo = np.zeros(n_warps, np.int64)
        if t.size:
            self.lo = np.full(n_warps, np.iinfo(np.int64).max)
            np.minimum.at(self.lo, gid, t)
            self.lo[self.lo == np.iinfo(np.int64).max] = 0
            if int((t - self.lo[gid]).max()) >= 1 << T_BITS:
                raise Fa4traceError("a warp's records span more than 2**41 timer ticks: too long to compensate")
        self.keys = np.sort((gid << T_BITS) | (t - self.lo[gid]))

    def between(self, gid, t0, t1) -> np.ndarray:
        """How many times of warp ``gid`` lie strictly between ``t0`` and ``t1`` (arrays, same length)."""
        gid = np.asarray(gid, np.int64)
        base = gid << T_BITS
        a = np.clip(np.asarray(t0, np.int64) - self.lo[gid], -1, (1 << T_BITS) - 1)
        b = np.clip(np.asarray(t1, np.int64) - self.lo[gid], 0, (1 << T_BITS))
        left = np.searchsorted(self.keys, base + a + 1, side="left")  # first time > t0
        right = np.searchsorted(self.keys, base + b, side="left")  # first time >= t1
        return np.maximum(right - left, 0)
