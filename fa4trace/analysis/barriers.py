"""Where two warps were last aligned: the last CTA barrier both passed.

A barrier (``barrier.sync``: fa4trace.instrument's barrier hook, or any event registered with
family ``barrier`` and op ``sync``) releases every warp of the CTA at one instant, whatever each
had done before. So what a recorder cost the warps before it is absorbed there; between it and a
later pipeline fill and wait, each warp's own records are all that moved one against the other.
The compensation of a wait (fa4trace.analysis.compensate) counts them from here.

An occurrence of a barrier is matched across warps by time, not by count (a ring or a full slot
drops early records, so counts need not agree): the producer's exit of the same barrier nearest
the consumer's, within ``TOLERANCE_NS`` and half the consumer's gap between its exits of it.
A barrier counts only while it is each warp's last point of alignment: a wait either warp began
after it (an earlier pipeline wait, another barrier) may have absorbed what came before, so the
pair is dropped there (``waits_between``) and the caller falls back.
"""

from __future__ import annotations

import numpy as np

from ..format.errors import Fa4traceError
from .autoevents import AutoCols
from .warptimes import T_BITS, WarpTimes

TOLERANCE_NS = 1000  # two warps' exits of one occurrence read their timers this close, at most


def last_common_exit(c: AutoCols, cons_gid: np.ndarray, cons_t: np.ndarray, prod_gid: np.ndarray,
                     prod_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per query, ``(x_cons, x_prod)``: the end (ns) of the last barrier sync the consumer warp
    ``cons_gid`` left at or before ``cons_t``, and the end of the same occurrence in the producer
    warp ``prod_gid``, left at or before ``prod_t``; -1 for both where there is no such pair."""
    n = np.asarray(cons_gid).size
    none = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    rows = np.flatnonzero(c.where("barrier", "sync") & (c.kind == 0))
    if not rows.size or not n:
        return none
    t0 = int(min(c.start.min(), np.min(cons_t), np.min(prod_t)))
    gid = c.warp_gid[rows].astype(np.int64)
    res = c.resource[rows].astype(np.int64)
    end = c.end[rows].astype(np.int64) - t0
    n_res = int(res.max()) + 1
    pairs = np.unique(gid * n_res + res)  # (warp, barrier) pairs present: dense group ids
    if max(int(gid.max()), pairs.size) >= 1 << (63 - T_BITS) or int(end.max()) >= 1 << T_BITS:
        raise Fa4traceError("too many warps or too long a trace to match its barriers (2**22 warps, 2**41 ns)")
    by_warp = np.lexsort((end, gid))  # every exit of a warp, in time order
    w_key = (gid[by_warp] << T_BITS) | end[by_warp]
    group = np.searchsorted(pairs, gid * n_res + res)
    by_group = np.lexsort((end, group))  # every exit of one barrier in one warp, in time order
    g_key = (group[by_group] << T_BITS) | end[by_group]

    def group_of(g, r):  # the dense id of (warp g, barrier r), -1 where that warp has no such exit
        q = g * n_res + r
        at = np.minimum(np.searchsorted(pairs, q), pairs.size - 1)
        return np.where(pairs[at] == q, at, -1)

    cg = np.asarray(cons_gid, np.int64)
    pg = np.asarray(prod_gid, np.int64)
    i = np.searchsorted(w_key, (cg << T_BITS) | (np.asarray(cons_t, np.int64) - t0), side="right") - 1
    ok = i >= 0
    i = np.maximum(i, 0)
    ok &= gid[by_warp][i] == cg
    xc = end[by_warp][i]
    rc = res[by_warp][i]
    # the consumer's previous exit of the same barrier: how far apart its occurrences are
    cgrp = group_of(cg, rc)
    k = np.searchsorted(g_key, (np.maximum(cgrp, 0) << T_BITS) | xc, side="left")
    prev_same = (k > 0) & (group[by_group][np.maximum(k - 1, 0)] == cgrp)
    gap = np.where(prev_same, xc - end[by_group][np.maximum(k - 1, 0)], np.iinfo(np.int64).max)
    tol = np.minimum(TOLERANCE_NS, gap // 2)
    # the producer's exits of that barrier either side of the consumer's: the nearer one
    pgrp = group_of(pg, rc)
    ok &= pgrp >= 0
    j = np.searchsorted(g_key, (np.maximum(pgrp, 0) << T_BITS) | xc, side="left")
    best = np.full(n, -1, np.int64)
    best_d = np.full(n, np.iinfo(np.int64).max)
    for cand in (j - 1, j):
        inside = (cand >= 0) & (cand < g_key.size)
        cc = np.clip(cand, 0, g_key.size - 1)
        same = inside & (group[by_group][cc] == pgrp)
        d = np.abs(end[by_group][cc] - xc)
        take = same & (d < best_d)
        best = np.where(take, end[by_group][cc], best)
        best_d = np.where(take, d, best_d)
    ok &= (best >= 0) & (best_d <= tol) & (best <= np.asarray(prod_t, np.int64) - t0)
    return np.where(ok, xc + t0, -1), np.where(ok, best + t0, -1)


def waits_between(c: AutoCols, gid: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """Per query: how many wait spans (``AutoCols.is_wait``: pipeline waits, barriers, ...) warp
    ``gid`` began strictly between ``t0`` and ``t1`` (ns)."""
    rows = np.flatnonzero(c.is_wait)
    return WarpTimes(c.warp_gid[rows], c.start[rows], c.n_warps).between(gid, t0, t1)
