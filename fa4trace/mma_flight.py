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

from .bundle import Trace

FLIGHT_SCHEMA = pa.schema([("launch", pa.int16()), ("cta", pa.int32()), ("warp", pa.int16()),
                           ("start_ns", pa.int64()), ("end_ns", pa.int64())])


def _labels(col) -> np.ndarray:
    """A dictionary (or string) column as an object array, decoded once per distinct value."""
    import pyarrow.compute as pc

    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    return np.asarray(col.dictionary.to_pylist(), dtype=object)[col.indices.to_numpy(zero_copy_only=False)]


def _cols(trace: Trace):
    ev = trace.events
    name = _labels(ev.column("name"))
    kind = _labels(ev.column("kind"))
    key = (ev.column("launch").to_numpy().astype(np.int64) << 40) | (ev.column("cta").to_numpy().astype(np.int64) << 8) \
        | ev.column("warp").to_numpy().astype(np.int64)
    return ev, name, kind, key


def mma_in_flight(trace: Trace) -> pa.Table:
    """One row per committed MMA group that a later wait retired: (launch, cta, warp, commit, retire)."""
    ev, name, kind, key = _cols(trace)
    start = ev.column("start_ns").to_numpy()
    end = ev.column("end_ns").to_numpy()
    it = ev.column("iter").to_numpy()
    com = np.flatnonzero(name == "mma.commit")
    wai = np.flatnonzero((name == "mma.wait") & (kind == "span"))
    out = {f: [] for f in FLIGHT_SCHEMA.names}
    for k in np.unique(key[com]):
        c = np.sort(start[com[key[com] == k]])
        w = wai[key[wai] == k]
        w = w[np.argsort(start[w], kind="stable")]
        if not c.size or not w.size:
            continue
        before = np.searchsorted(c, start[w], side="left")  # groups committed before each wait began
        retired = np.maximum.accumulate(np.maximum(before - np.maximum(it[w], 0), 0))
        j = np.searchsorted(retired, np.arange(1, c.size + 1), side="left")  # first wait retiring group i
        ok = j < w.size
        out["launch"].append(np.full(ok.sum(), k >> 40))
        out["cta"].append(np.full(ok.sum(), (k >> 8) & 0xFFFFFFFF))
        out["warp"].append(np.full(ok.sum(), k & 0xFF))
        out["start_ns"].append(c[ok])
        out["end_ns"].append(end[w[j[ok]]])
    if not out["start_ns"]:
        return FLIGHT_SCHEMA.empty_table()
    return pa.table({f: np.concatenate(v) for f, v in out.items()}, schema=FLIGHT_SCHEMA)


def _union(s: np.ndarray, e: np.ndarray):
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    hi = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > hi[:-1]]
    idx = np.cumsum(new) - 1
    us = s[new]
    ue = np.zeros(us.size, dtype=e.dtype)
    np.maximum.at(ue, idx, e)
    return us, ue


def overlap_share(trace: Trace, span: str, flight: pa.Table | None = None) -> float | None:
    """Share of the time in ``span`` spans during which the same warp had an MMA group in flight."""
    ev, name, kind, key = _cols(trace)
    flight = mma_in_flight(trace) if flight is None else flight
    rows = np.flatnonzero((name == span) & (kind == "span"))
    if not rows.size or not flight.num_rows:
        return None
    fkey = (flight.column("launch").to_numpy().astype(np.int64) << 40) | \
        (flight.column("cta").to_numpy().astype(np.int64) << 8) | flight.column("warp").to_numpy().astype(np.int64)
    fs, fe = flight.column("start_ns").to_numpy(), flight.column("end_ns").to_numpy()
    s, e = ev.column("start_ns").to_numpy(), ev.column("end_ns").to_numpy()
    total = covered = 0
    for k in np.unique(key[rows]):
        r = rows[key[rows] == k]
        m = fkey == k
        total += int((e[r] - s[r]).sum())
        if not m.any():
            continue
        us, ue = _union(fs[m], fe[m])
        for a, b in zip(s[r], e[r]):  # spans of one warp: few per block
            i0 = np.searchsorted(ue, a, side="right")
            i1 = np.searchsorted(us, b, side="left")
            if i1 > i0:
                covered += int((np.minimum(ue[i0:i1], b) - np.maximum(us[i0:i1], a)).clip(min=0).sum())
    return covered / total if total else None
