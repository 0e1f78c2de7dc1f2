"""MMA groups in flight, derived from automatic events: when the tensor core worked for a warp.

A warp records ``mma.commit`` (an instant: a wgmma group committed) and ``mma.wait`` (a span
around ``wait_group(k)``; iter = k). When a wait with k ends, every group the warp committed
before the wait began is done except the newest k. So each commit gets a retire time: the end
of the first wait after it that leaves fewer than (groups committed since) in flight. The
span commit -> retire is that group in flight; where the warp's own spans (a named softmax)
overlap it, the warp worked while its MMAs ran (Hopper's intra-warpgroup overlap).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .overlap import Columns, group_ids, overlap_length

FLIGHT_SCHEMA = pa.schema([("launch", pa.int16()), ("cta", pa.int32()), ("warp", pa.int16()),
                           ("start_ns", pa.int64()), ("end_ns", pa.int64())])


def _cols(trace_or_cols) -> Columns:
    """The analysis' columns (names decoded once) and a dense id per (launch, cta, warp)."""
    c = trace_or_cols if isinstance(trace_or_cols, Columns) else Columns(trace_or_cols.events)
    if not hasattr(c, "warp_gid"):
        c.warp_gid, c.n_warps, c.warp_keys = group_ids(c.launch, c.cta, c.warp)
    return c


def mma_in_flight(trace_or_cols) -> pa.Table:
    """One row per committed MMA group that a later wait retired: (launch, cta, warp, commit, retire)."""
    c = _cols(trace_or_cols)
    key, start, end, it = c.warp_gid, c.start, c.end, c.iter
    com = np.flatnonzero(c.mask("mma.commit"))
    wai = np.flatnonzero(c.mask("mma.wait"))  # always a span (fa4trace.auto.events)
    out = {f: [] for f in FLIGHT_SCHEMA.names}
    for k in np.unique(key[com]):
        t_com = np.sort(start[com[key[com] == k]])
        w = wai[key[wai] == k]
        w = w[np.argsort(start[w], kind="stable")]
        if not w.size:
            continue
        before = np.searchsorted(t_com, start[w], side="left")  # groups committed before each wait began
        retired = np.maximum.accumulate(np.maximum(before - np.maximum(it[w], 0), 0))
        j = np.searchsorted(retired, np.arange(1, t_com.size + 1), side="left")  # first wait retiring group i
        ok = j < w.size
        launch, cta, warp = c.warp_keys[k]
        out["launch"].append(np.full(ok.sum(), launch))
        out["cta"].append(np.full(ok.sum(), cta))
        out["warp"].append(np.full(ok.sum(), warp))
        out["start_ns"].append(t_com[ok])
        out["end_ns"].append(end[w[j[ok]]])
    if not out["start_ns"]:
        return FLIGHT_SCHEMA.empty_table()
    return pa.table({f: np.concatenate(v) for f, v in out.items()}, schema=FLIGHT_SCHEMA)


def overlap_share(trace_or_cols, span: str, flight: pa.Table | None = None) -> float | None:
    """Share of the time in ``span`` spans during which the same warp had an MMA group in flight.

    One sweep per warp (``overlap.overlap_length``: the spans' union against the groups'
    union). A warp's spans of one name are disjoint (a hooked call inside another records
    nothing), so their union is their total time."""
    c = _cols(trace_or_cols)
    flight = mma_in_flight(c) if flight is None else flight
    rows = np.flatnonzero(c.mask(span))
    if not rows.size or not flight.num_rows:
        return None
    gid = {tuple(int(x) for x in k): i for i, k in enumerate(c.warp_keys)}
    fkey = np.array([gid.get(k, -1) for k in zip(flight.column("launch").to_pylist(), flight.column("cta").to_pylist(),
                                                 flight.column("warp").to_pylist())], np.int64)
    known = fkey >= 0
    _, _, both = overlap_length(c.warp_gid[rows], c.start[rows], c.end[rows], fkey[known],
                                flight.column("start_ns").to_numpy()[known], flight.column("end_ns").to_numpy()[known],
                                c.n_warps)
    total = int((c.end[rows] - c.start[rows]).sum())
    return float(both.sum()) / total if total else None
