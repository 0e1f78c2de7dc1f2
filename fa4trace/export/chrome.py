"""Events table -> Chrome trace-event JSON (chrome://tracing, Perfetto UI, speedscope...).

Layout: ``pid`` = SM (with a ``process_name`` metadata event "SM n"), one ``tid`` per track of
:func:`fa4trace.export.tracks.layout_tracks` (``thread_name`` "CTA c · warp w · role", plus
" · QK in flight" etc. for the async tracks and " · overlap k" for extra lanes). Viewers drop
or mangle X events that overlap on one tid without nesting, so async spans (MMA in flight) and
crossing spans get their own tids, exactly as in the Perfetto export. Multi-launch bundles
prefix thread names with "launch k · " (tids stay distinct). Threads are named by the ``role``
column as given (for automatically traced kernels: :func:`fa4trace.analysis.kernel.export_inputs`
assigns the roles first).

Times: ``ts``/``dur`` in µs as decimals with 3 places (exact ns), rebased so the earliest event
is 0. Spans and WARP rows are "X" events, instants are "i" events (thread scope); ``args``
holds ``iter`` where the row has one (and ``dropped`` on WARP rows of overflowed warps).

Speed: the event lines are assembled column-wise with Arrow string kernels (no Python loop per
event, no per-event dict) and written straight from the Arrow buffers.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._io import write_parts
from .tracks import EventColumns, TrackLayout, event_columns, layout_tracks, vocab_of

__all__ = ["to_chrome", "ChromeStats"]

CHUNK_ROWS = 1 << 20
_FRAC = pa.array([f"{i:03d}" for i in range(1000)])


@dataclass
class ChromeStats:
    """What :func:`to_chrome` wrote."""

    events: int  # X + i events (= events table rows)
    metadata_events: int
    processes: int
    threads: int
    bytes: int
    seconds: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("inf")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["events_per_s"] = self.events_per_s
        return d


def _us(ns: np.ndarray) -> pa.Array:
    """Non-negative int ns -> exact µs decimal strings ("12.345")."""
    ip = pc.cast(pa.array(ns // 1000), pa.string())
    return pc.binary_join_element_wise(ip, _FRAC.take(pa.array(ns % 1000)), ".")


def to_chrome(trace, path_or_file, *, chunk_rows: int = CHUNK_ROWS) -> ChromeStats:
    """Write ``trace`` (bundle Trace or anything with ``.events``/``.meta``) as Chrome JSON."""
    t_all = time.perf_counter()
    events: pa.Table = trace.events
    meta: dict = dict(getattr(trace, "meta", {}) or {})
    r = event_columns(events)
    lay = layout_tracks(events, vocab_of(meta), columns=r)
    pid_of_track = lay.warp_sm[lay.track_warp] if lay.n_tracks else np.zeros(0, np.int64)
    meta_events = _metadata_events(lay, pid_of_track)
    bodies = _event_lines(events, r, lay, pid_of_track, chunk_rows)
    written = _write(path_or_file, meta, meta_events, bodies)
    return ChromeStats(events=int(r.n), metadata_events=len(meta_events),
                       processes=int(np.unique(pid_of_track).size) if lay.n_tracks else 0, threads=lay.n_tracks,
                       bytes=written, seconds=time.perf_counter() - t_all)


def _metadata_events(lay: TrackLayout, pid_of_track: np.ndarray) -> list[dict]:
    """One process per SM, one thread per track: names and sort indices."""
    multi = np.unique(lay.warp_launch).size > 1
    tw = lay.track_warp
    out = []
    for sm in np.unique(pid_of_track).tolist():
        out.append({"ph": "M", "name": "process_name", "pid": sm, "tid": 0, "args": {"name": f"SM {sm}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": sm, "tid": 0, "args": {"sort_index": sm}})
    sort_key = [(int(tw[t]), lay.child_rank(t)) for t in range(lay.n_tracks)]
    sort_index = {k: i for i, k in enumerate(sorted(sort_key))}
    for t in range(lay.n_tracks):
        w = int(tw[t])
        label = lay.track_label(t)
        name = f"CTA {int(lay.warp_cta[w])} · " + (label if int(lay.track_class[t]) == 0 else
                                                  f"warp {int(lay.warp_index[w])} · {lay.warp_role[w]} · {label}")
        if multi:
            name = f"launch {int(lay.warp_launch[w])} · {name}"
        pid = int(pid_of_track[t])
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": t + 1, "args": {"name": name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": t + 1,
                    "args": {"sort_index": sort_index[sort_key[t]]}})
    return out


def _event_lines(events: pa.Table, r: EventColumns, lay: TrackLayout, pid_of_track: np.ndarray,
                 chunk_rows: int) -> list[pa.Array]:
    """The X and i events, one JSON line per row (each ending in ",\n"), ``chunk_rows`` rows
    per string array; times in µs from the earliest event."""
    t0 = int(r.start.min()) if r.n else 0
    start, end = r.start - t0, r.end - t0
    # event heads: '{"ph":"X","pid":P,"tid":T,"name":"N","ts":' per (track, name, kind)
    is_inst = r.kind == 1
    n_names = max(len(r.names), 1)
    combo = (lay.row_track * n_names + r.name) * 2 + is_inst
    uc, inv = np.unique(combo, return_inverse=True)
    heads = []
    for c in uc.tolist():
        inst, rest = c & 1, c >> 1
        t, nm = rest // n_names, rest % n_names
        ph = '"ph":"i","s":"t"' if inst else '"ph":"X"'
        heads.append(f'{{{ph},"pid":{int(pid_of_track[t])},"tid":{t + 1},"name":{json.dumps(r.names[nm])},"ts":')
    heads = pa.array(heads, pa.string())
    inv = inv.reshape(-1)

    # rows in (track group, start, -end) order: parents before children on every tid, which
    # matters to importers for X events that share a start time; instants last
    order = np.empty(r.n, np.int64)
    order[lay.rank] = np.arange(r.n)
    order = np.concatenate([order[~is_inst[order]], order[is_inst[order]]])

    bodies = []
    for a in range(0, r.n, chunk_rows):
        rows = order[a:a + chunk_rows]
        inst = is_inst[rows]
        it = r.iter[rows]
        pieces = [heads.take(pa.array(inv[rows])), _us(start[rows])]
        dur = pc.if_else(pa.array(inst), "", pc.binary_join_element_wise(',"dur":', _us(end[rows] - start[rows]), ""))
        pieces.append(dur)
        it_s = pc.cast(pa.array(it), pa.string())
        args = pc.if_else(pa.array(it >= 0), pc.binary_join_element_wise(',"args":{"iter":', it_s, "}", ""), "")
        if "dropped" in events.column_names:
            drop = events.column("dropped").take(pa.array(rows)).to_numpy().astype(np.int64)
            d_s = pc.binary_join_element_wise(',"args":{"dropped":', pc.cast(pa.array(drop), pa.string()), "}", "")
            args = pc.if_else(pa.array((drop > 0) & (it < 0)), d_s, args)
        pieces.append(args)
        pieces.append("},\n")
        bodies.append(pc.binary_join_element_wise(*pieces, ""))
    return bodies


def _write(path_or_file, meta: dict, meta_events: list[dict], bodies: list[pa.Array]) -> int:
    """The JSON document: otherData (the bundle's kernel, config, GPU...), the metadata events,
    then the event lines straight from their Arrow buffers. Returns the bytes written."""
    other = {k: meta[k] for k in ("kernel", "config", "gpu", "synthetic", "recorded_at", "fa4trace_version")
             if k in meta}
    head = ('{"displayTimeUnit":"ns","otherData":' + json.dumps(other, default=str, ensure_ascii=False)
            + ',"traceEvents":[\n').encode()
    meta_txt = "".join(json.dumps(e, ensure_ascii=False) + ",\n" for e in meta_events).encode()
    parts: list = [head, meta_txt]
    for b in bodies:
        parts.append(_string_bytes(b))
    # drop the trailing ",\n" of the last event (JSON has no trailing commas)
    for i in range(len(parts) - 1, 0, -1):
        if len(parts[i]):
            parts[i] = memoryview(parts[i])[:-2]
            break
    parts.append(b"\n]}\n")
    return write_parts(path_or_file, parts)


def _string_bytes(arr: pa.Array) -> memoryview:
    """The concatenated UTF-8 of a string array, straight from its value buffer."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if len(arr) == 0:
        return memoryview(b"")
    offs = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset:arr.offset + len(arr) + 1]
    data = arr.buffers()[2]
    return memoryview(data)[int(offs[0]):int(offs[-1])]


