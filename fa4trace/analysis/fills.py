"""Which fill released which pipeline wait, in automatic-event bundles.

A pipeline count of a CTA is keyed by (CTA, pipeline, count); its fill is the first commit of
the count (the producer's arrive), else the end of its first acquire where the kernel records
no commits. A consumer wait of a count is released by that count's fill. Lags
(fa4trace.analysis.kernel) and compensated waits (fa4trace.analysis.compensate) both match
waits to fills this way.
"""

from __future__ import annotations

import numpy as np

from .autoevents import AutoCols


def count_key(c: AutoCols, rows: np.ndarray, it=None) -> np.ndarray:
    """One int64 per row: its CTA, pipeline and count (``it``: counts other than the rows' own)."""
    it = c.iter[rows] if it is None else it
    return (c.cta_gid[rows].astype(np.int64) << 30) | (c.resource[rows].astype(np.int64) << 21) | (it + 1)


def fills(c: AutoCols, pipeline: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(key, fill ns, filling warp gid) per count of ``pipeline`` per CTA, sorted by key."""
    rows = np.flatnonzero(c.where("pipeline", "commit", pipeline) & (c.iter >= 0))
    t = c.start[rows] if rows.size else rows
    if not rows.size:
        rows = np.flatnonzero(c.where("pipeline", "acquire", pipeline) & (c.kind == 0) & (c.iter >= 0))
        t = c.end[rows]
    k = count_key(c, rows)
    o = np.lexsort((t, k))
    k, t, rows = k[o], t[o], rows[o]
    first = np.r_[True, k[1:] != k[:-1]] if k.size else np.zeros(0, bool)
    return k[first], t[first], c.warp_gid[rows[first]]


def filled_waits(c: AutoCols, pipeline: str, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, fill index) of ``pipeline``'s consumer waits whose count has a fill in ``keys``
    (``fills``' sorted keys): each wait row and the position of the fill that released it."""
    waits = np.flatnonzero(c.where("pipeline", "wait", pipeline) & (c.kind == 0) & (c.iter >= 0))
    if not keys.size or not waits.size:
        return waits[:0], waits[:0]
    wk = count_key(c, waits)
    pos = np.minimum(np.searchsorted(keys, wk), keys.size - 1)
    hit = keys[pos] == wk
    return waits[hit], pos[hit]
