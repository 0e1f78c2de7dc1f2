"""Events table -> Perfetto TrackEvent protobuf trace (open it in ui.perfetto.dev or the app).

Track tree (every track has ``sibling_merge_behavior = NONE`` so the UI never merges siblings
with equal names, and ``child_ordering = EXPLICIT`` so SMs, CTAs and warps sort by index)::

    GPU <gpu> · <kernel>                      process-like root (a ProcessDescriptor)
      [launch k · <kernel>]                   only when the bundle holds several launches
        warps active                          counter: warps alive over time
        SM s
          CTA c
            [async in flight]                 counter, only with inflight_counters=True
            warp w · <role>                   the warp's own (sync) spans, instants and WARP row
              QK in flight                    one child track per async event (vocab is_async)
              PV in flight
              QK in flight (2)                extra lanes: spans that would break nesting
              warp w · <role> · overlap 1

Slices on one track must nest strictly (BEGIN/END). Async spans (MMA in flight) overlap the
warp's own SOFTMAX, so they live on their own child track; any other span that would break the
nesting of its track (two records that cross, e.g. SOFTMAX(i) ending a few cycles after
CORRECTION(i) begins) is moved to an extra lane: :func:`layout_tracks` does that, vectorized,
and the Chrome exporter uses the same layout.

Each row of the events table becomes exactly one slice: a span or WARP row -> BEGIN + END
(zero-length spans too), an instant -> INSTANT. So "BEGIN + INSTANT events on slice tracks"
equals the Arrow row count; counter tracks carry COUNTER events only.

Iteration: a debug annotation ``iter`` (interned name, int value) on the BEGIN/INSTANT of every
row with ``iter >= 0``; it shows in the slice details and as ``args.iter`` in SQL.

Flows: QK(i) -> SOFTMAX(i) and SOFTMAX(i) -> PV(i) within one warp (same launch, CTA, warp and
iteration), one flow id per edge: ``flow_ids`` on the source's BEGIN, ``terminating_flow_ids``
on the destination's BEGIN. An edge is drawn only where the source begins strictly before the
destination (the trace processor reads events in time order).

Size. The per-event packets are not built as pb2 objects (~18 us each): they are encoded in
bulk with numpy-vectorized varints. One packet sequence per track, whose first packet carries
``trace_packet_defaults`` (track_uuid, a sequence-scoped incremental clock) plus the interned
names and a clock snapshot; hot packets then hold only a delta timestamp, the sequence id, the
type, the name iid and the optional iter/flow fields. Descriptors and the per-sequence setup
packets (rare) are built with the ``perfetto`` package's pb2 classes. ``compress=True`` wraps
~1 MiB batches of packets in ``compressed_packets`` (zlib, as Perfetto's own service does),
compressed on a thread pool (zlib drops the GIL). Level 5 by default: nearly the size of
Perfetto's own level 6 in about half the CPU time.

Size: a BEGIN packet holds framing, delta timestamp, sequence id, type and name iid, plus the
``iter`` annotation and flow ids where on; an END packet the first part only. One packet per
BEGIN and per END is the floor of the format (TrackEvent has no duration field at ns
resolution), and the 2-byte sequence ids come from having one sequence per track; measured
bytes per slice are in BENCHMARKS.md (host pipeline). The pytest suite checks the semantics
in Python; tests/test_perfetto.py also loads the output in a real trace processor where one is
installed.

Wire details used for the hot packets (field numbers are read from the pb2 descriptors):
``flow_ids_old`` / ``terminating_flow_ids_old`` are the varint twins of ``flow_ids`` /
``terminating_flow_ids`` (fixed64: 8 bytes per id); the trace processor reads both, the varint
form costs 3 bytes per id instead of 8. Hot packets do not set ``SEQ_NEEDS_INCREMENTAL_STATE``
(2 bytes each): that flag only lets a reader skip packets after data loss, which a file written
in one go has none of.
"""

from __future__ import annotations

import os
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ._io import write_parts
from .vocab import VOCAB, Vocabulary

__all__ = ["to_perfetto", "PerfettoStats", "Placement", "layout_tracks", "TrackLayout", "slice_events",
           "encode_hot_packets"]

# ---- wire constants (from the pb2 descriptors, so a renumbering would be caught) ------------

def _fnum(msg, name: str) -> int:
    return msg.DESCRIPTOR.fields_by_name[name].number


def _tag(num: int, wire: int) -> bytes:
    return _varint_bytes((num << 3) | wire)


def _varint_bytes(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


_VARINT, _LEN = 0, 2
_T_PACKET = _tag(_fnum(pb.Trace, "packet"), _LEN)
_T_TS = _tag(_fnum(pb.TracePacket, "timestamp"), _VARINT)
_T_SEQ = _tag(_fnum(pb.TracePacket, "trusted_packet_sequence_id"), _VARINT)
_T_TE = _tag(_fnum(pb.TracePacket, "track_event"), _LEN)
_T_TYPE = _tag(_fnum(pb.TrackEvent, "type"), _VARINT)
_T_NAME_IID = _tag(_fnum(pb.TrackEvent, "name_iid"), _VARINT)
_T_DEBUG = _tag(_fnum(pb.TrackEvent, "debug_annotations"), _LEN)
_T_DA_NAME_IID = _tag(_fnum(pb.DebugAnnotation, "name_iid"), _VARINT)
_T_DA_INT = _tag(_fnum(pb.DebugAnnotation, "int_value"), _VARINT)
_T_FLOW = _tag(_fnum(pb.TrackEvent, "flow_ids_old"), _VARINT)
_T_TERM_FLOW = _tag(_fnum(pb.TrackEvent, "terminating_flow_ids_old"), _VARINT)
_T_COUNTER = _tag(_fnum(pb.TrackEvent, "counter_value"), _VARINT)
_T_COMPRESSED = _fnum(pb.TracePacket, "compressed_packets")

TYPE_BEGIN = pb.TrackEvent.TYPE_SLICE_BEGIN
TYPE_END = pb.TrackEvent.TYPE_SLICE_END
TYPE_INSTANT = pb.TrackEvent.TYPE_INSTANT
TYPE_COUNTER = pb.TrackEvent.TYPE_COUNTER

CLOCK_BOOTTIME = 6  # BuiltinClocks.BOOTTIME: the trace clock when no other is named
CLOCK_SEQ = 64  # first sequence-scoped user clock id; ours is incremental
ITER_IID = 1  # debug annotation name iid of "iter" (interned on every sequence)
UUID_BASE = 0xFA4 << 48  # track uuids: UUID_BASE + n (only descriptors carry them)
ROOT_PID = 0xFA4  # pid of the process-like GPU root track
CHUNK_BYTES = 1 << 20  # uncompressed bytes per compressed_packets batch

_NONE = pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_NONE
_EXPLICIT = pb.TrackDescriptor.EXPLICIT


# ---- columns -------------------------------------------------------------------------------

@dataclass
class _Rows:
    n: int
    launch: np.ndarray
    cta: np.ndarray
    sm: np.ndarray
    warp: np.ndarray
    role: np.ndarray  # codes into role_names
    role_names: list
    name: np.ndarray  # codes into names
    names: list
    kind: np.ndarray  # 0 span, 1 instant, 2 warp
    iter: np.ndarray
    start: np.ndarray
    end: np.ndarray


def _dict_codes(col) -> tuple[np.ndarray, list]:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if not pa.types.is_dictionary(col.type):
        col = col.dictionary_encode()
    codes = col.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, [str(x) for x in col.dictionary.to_pylist()]


def _int_col(t: pa.Table, name: str) -> np.ndarray:
    return t.column(name).fill_null(0).to_numpy().astype(np.int64, copy=False)


def _rows(events: pa.Table) -> _Rows:
    if any(events.column(c).num_chunks > 1 for c in ("role", "name", "kind")):
        events = events.unify_dictionaries().combine_chunks()
    role, role_names = _dict_codes(events.column("role"))
    name, names = _dict_codes(events.column("name"))
    kcodes, kdict = _dict_codes(events.column("kind"))
    kmap = np.array([{"span": 0, "instant": 1, "warp": 2}.get(k, 0) for k in kdict] or [0], np.int8)
    start = _int_col(events, "start_ns")
    end = np.maximum(_int_col(events, "end_ns"), start)
    it = events.column("iter").fill_null(-1).to_numpy().astype(np.int64, copy=False)
    return _Rows(events.num_rows, _int_col(events, "launch"), _int_col(events, "cta"), _int_col(events, "sm"),
                 _int_col(events, "warp"), role, role_names, name, names, kmap[kcodes], it, start, end)


# ---- sorting helpers -------------------------------------------------------------------------

def _bits(x: int) -> int:
    return max(int(x), 0).bit_length()


def _order(major: np.ndarray, minor: np.ndarray) -> np.ndarray:
    """Stable order by (major, minor), both non-negative int64; ties keep input order."""
    if major.size == 0:
        return np.zeros(0, np.int64)
    bm, bn = _bits(major.max()), _bits(minor.max())
    if bm + bn <= 63:
        return np.argsort((major << bn) | minor, kind="stable")
    o = np.argsort(minor, kind="stable")
    return o[np.argsort(major[o], kind="stable")]


# ---- track layout ----------------------------------------------------------------------------

@dataclass
class TrackLayout:
    """Where every row of an events table goes: one slice track per (warp, class, lane).

    class 0 is the warp's own track (sync spans, instants, the WARP row); class k > 0 is the
    in-flight track of async event ``async_names[k-1]``. Lane 0 is the class's main track,
    lanes > 0 hold spans that would otherwise break strict nesting. Tracks are numbered in
    (warp, class, lane) order; warps in (launch, cta, warp) order.
    """

    row_track: np.ndarray  # per row
    row_warp: np.ndarray  # per row
    rank: np.ndarray  # per row: position in (warp, class, start, -end) order
    track_warp: np.ndarray  # per track
    track_class: np.ndarray
    track_lane: np.ndarray
    warp_launch: np.ndarray  # per warp
    warp_cta: np.ndarray
    warp_sm: np.ndarray
    warp_index: np.ndarray
    warp_role: list
    async_names: list
    lane_rounds: int = 0
    greedy_groups: int = 0

    @property
    def n_tracks(self) -> int:
        return int(self.track_warp.size)

    def child_rank(self, t: int) -> int:
        """Order of a track under its warp: 0 = the warp's own track, then the async tracks
        in vocabulary order, then the extra lanes of the warp's own spans."""
        c, lane = int(self.track_class[t]), int(self.track_lane[t])
        if c == 0 and lane == 0:
            return 0
        return (c if c else len(self.async_names) + 1) * 1024 + lane

    def track_label(self, t: int) -> str:
        w, c, lane = int(self.track_warp[t]), int(self.track_class[t]), int(self.track_lane[t])
        base = f"warp {int(self.warp_index[w])} · {self.warp_role[w]}"
        if c == 0:
            return base if lane == 0 else f"{base} · overlap {lane}"
        name = f"{self.async_names[c - 1]} in flight"
        return name if lane == 0 else f"{name} ({lane + 1})"


MAX_LANE_ROUNDS = 12


def layout_tracks(events: pa.Table, vocab: Vocabulary | None = None, *, _rows_cache: _Rows | None = None) -> TrackLayout:
    """Assign every row to a track such that slices on each track nest strictly."""
    r = _rows_cache or _rows(events)
    vocab = vocab or VOCAB
    n = r.n
    # warps = (launch, cta, warp); the decoder writes them contiguously, use that when true
    wk = (r.launch << 48) | (r.cta << 16) | r.warp
    if n and (wk[1:] >= wk[:-1]).all():
        first = np.flatnonzero(np.r_[True, wk[1:] != wk[:-1]]) if n else np.zeros(0, np.int64)
        row_warp = np.cumsum(np.r_[False, wk[1:] != wk[:-1]]).astype(np.int64)
    else:
        _, first, row_warp = np.unique(wk, return_index=True, return_inverse=True)
        row_warp = row_warp.astype(np.int64).reshape(-1)
    n_warps = first.size

    async_set = vocab.async_names()
    ids = {e.name: e.id for e in vocab.events}
    async_names = sorted({nm for nm in r.names if nm in async_set}, key=lambda s: (ids.get(s, 999), s))
    cls_of_code = np.array([async_names.index(nm) + 1 if nm in async_set else 0 for nm in r.names] or [0], np.int64)
    row_cls = np.where(r.kind == 2, 0, cls_of_code[r.name]) if n else np.zeros(0, np.int64)
    n_cls = len(async_names) + 1
    group = row_warp * n_cls + row_cls

    # rank: (group, start, -end) order; the decoder's row order already sorts by start with
    # outer spans first, so a stable sort by group usually suffices (checked, else full sort)
    order = np.argsort(group.astype(np.int32) if n_warps * n_cls < 2**31 else group, kind="stable")
    gs, ss, es = group[order], r.start[order], r.end[order]
    ok = True
    if n > 1:
        same_g = gs[1:] == gs[:-1]
        ok = bool(((ss[1:] > ss[:-1]) | ((ss[1:] == ss[:-1]) & (es[1:] <= es[:-1])) | ~same_g).all())
    if not ok:
        emax = int(r.end.max()) if n else 0
        o2 = _order(r.start, emax - r.end)
        order = o2[np.argsort(group[o2], kind="stable")]
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)

    lane = np.zeros(n, np.int64)
    nonzero = (r.kind != 1) & (r.end > r.start)
    active = order[nonzero[order]]  # rank order
    rounds = 0
    while active.size and rounds < MAX_LANE_ROUNDS:
        rounds += 1
        tk = group[active] * (int(lane[active].max()) + 2) + lane[active]
        move = _nest_violations(tk, r.start[active], r.end[active])
        if move.size == 0:
            active = active[:0]
            break
        lane[active[move]] += 1
        touched = np.unique(group[active[move]])
        active = active[np.isin(group[active], touched)]
    greedy = 0
    if active.size:
        # pathological data (many mutually crossing spans): exact greedy per remaining group
        tk = group[active] * (int(lane[active].max()) + 2) + lane[active]
        move = _nest_violations(tk, r.start[active], r.end[active])
        bad_groups = np.unique(group[active[move]])
        greedy = int(bad_groups.size)
        for gg in bad_groups:
            idx = active[group[active] == gg]
            lane[idx] = _greedy_lanes(r.start[idx], r.end[idx])

    # lanes of a group are renumbered 0, 1, 2... (a round can empty a lane that others skip)
    if n and lane.any():
        lb = _bits(int(lane.max()))
        uk = np.unique((group << lb) | lane)
        ug = uk >> lb
        dense = np.arange(uk.size) - np.searchsorted(ug, ug)
        lane = dense[np.searchsorted(uk, (group << lb) | lane)]

    # tracks: (warp, class, lane), numbered in that order; each warp always has its own track
    tkey_lane_bits = _bits(int(lane.max()) if n else 0) + 1
    tkey = (group << tkey_lane_bits) | lane
    base_keys = (np.arange(n_warps, dtype=np.int64) * n_cls) << tkey_lane_bits
    all_keys = np.unique(np.concatenate([tkey, base_keys]))
    row_track = np.searchsorted(all_keys, tkey)
    tgroup = all_keys >> tkey_lane_bits
    track_lane = all_keys & ((1 << tkey_lane_bits) - 1)
    role_of_warp = [r.role_names[c] if r.role_names else "unknown" for c in r.role[first]] if n else []
    return TrackLayout(
        row_track=row_track.astype(np.int64), row_warp=row_warp, rank=rank,
        track_warp=tgroup // n_cls, track_class=tgroup % n_cls, track_lane=track_lane,
        warp_launch=r.launch[first], warp_cta=r.cta[first], warp_sm=r.sm[first], warp_index=r.warp[first],
        warp_role=role_of_warp, async_names=async_names, lane_rounds=rounds, greedy_groups=greedy)


def _nest_violations(tk: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Spans (given in rank order, start < end) that must move up a lane for their track to nest.

    Builds each track's BEGIN/END stream (ENDs before BEGINs at equal times, inner spans end
    first, outer spans begin first), takes the nesting level of every event and checks that the
    event following each BEGIN at its level is its own END. Where it is another span's END the
    two cross; :func:`_choose_moves` picks which of each crossing pair moves.
    """
    n = tk.size
    idx = np.arange(n, dtype=np.int64)
    ev_tk = np.concatenate([tk[::-1], tk])
    ev_ts = np.concatenate([end[::-1], start])
    ev_span = np.concatenate([idx[::-1], idx])
    o = _order(ev_tk, ev_ts * 2 + np.repeat(np.array([0, 1], np.int64), n))
    span = ev_span[o]
    typ = np.where(o >= n, 1, -1)
    trk = ev_tk[o]
    d = np.cumsum(typ)
    seg_start = np.r_[True, trk[1:] != trk[:-1]]
    seg = np.cumsum(seg_start) - 1
    d = d - (d - typ)[seg_start][seg]
    level = d - (typ > 0)
    ol = np.argsort(level.astype(np.int32) if level.size and level.max() < 2**31 else level, kind="stable")
    sp, ty, tr = span[ol], typ[ol], trk[ol]
    isb = np.flatnonzero(ty[:-1] > 0)
    bad = (sp[isb + 1] != sp[isb]) | (tr[isb + 1] != tr[isb]) | (ty[isb + 1] > 0)
    if not bad.any():
        return np.zeros(0, np.int64)
    j = isb[bad]
    return _choose_moves(np.minimum(sp[j], sp[j + 1]), np.maximum(sp[j], sp[j + 1]))


def _choose_moves(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Which spans of the crossing pairs (lo < hi, by rank) move up a lane.

    Moving every ``hi`` would empty a chain of spans that each cross the next (deep async
    pipelines: A1 x A2 x A3 ...) one span per round. Instead each candidate ``hi`` points to its
    nearest lower-ranked partner; along such chains (list ranking by pointer jumping) only every
    other span moves, so a chain splits over two lanes at once. What this misses, later rounds
    (and at worst the exact greedy) fix.
    """
    cand, inv = np.unique(hi, return_inverse=True)
    pred = np.full(cand.size, -1, np.int64)
    np.maximum.at(pred, inv.reshape(-1), lo)
    k = np.searchsorted(cand, pred)
    k = np.minimum(k, cand.size - 1)
    par = np.where((pred >= 0) & (cand[k] == pred), k, -1)  # parent = the partner when it is a candidate too
    dist = (par >= 0).astype(np.int64)
    p = par.copy()
    while (p >= 0).any():
        m = np.flatnonzero(p >= 0)
        dist_new, p_new = dist.copy(), p.copy()
        dist_new[m] += dist[p[m]]
        p_new[m] = p[p[m]]
        dist, p = dist_new, p_new
    return cand[dist % 2 == 0]


def _greedy_lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Exact first-fit lanes for spans in rank order (a Python loop: fallback only)."""
    stacks: list[list[int]] = []
    out = np.zeros(start.size, np.int64)
    for i, (s, e) in enumerate(zip(start.tolist(), end.tolist())):
        for k, st in enumerate(stacks):
            while st and st[-1] <= s:
                st.pop()
            if not st or e <= st[-1]:
                st.append(e)
                out[i] = k
                break
        else:
            stacks.append([e])
            out[i] = len(stacks) - 1
    return out


# ---- event stream ----------------------------------------------------------------------------

def _slice_stream(r: _Rows, lay: TrackLayout):
    """All BEGIN/END/INSTANT events of a bundle's rows (:func:`slice_events`)."""
    return slice_events(lay.row_track, r.start, r.end, r.kind == 1, lay.rank)


def slice_events(row_track: np.ndarray, start: np.ndarray, end: np.ndarray, instant: np.ndarray,
                 rank: np.ndarray):
    """All BEGIN/END/INSTANT events ordered by (track, time) with valid nesting tie-breaks.

    Per row: its track (``TrackLayout.row_track``), start and end ns, whether it is an instant,
    and its rank (``TrackLayout.rank``: (track group, start, -end) order). A span becomes BEGIN +
    END (a zero-length one too, adjacent), an instant INSTANT; at equal times ENDs come first,
    inner spans end first and outer ones begin first. Public for writers that lay out rows of
    their own with :func:`layout_tracks` (fa4trace.profiler.merge). Returns (track, ts, type, row).
    """
    n = start.size
    order = np.empty(n, np.int64)
    order[rank] = np.arange(n)
    is_span = ~instant
    nz = is_span & (end > start)
    zl = is_span & (end == start)
    rows_nz = order[nz[order]]
    rows_zi = order[(zl | ~is_span)[order]]
    cnt = np.where(zl[rows_zi], 2, 1)
    rep = np.repeat(rows_zi, cnt)
    first_of = np.cumsum(cnt) - cnt
    zi_type = np.full(rep.size, TYPE_INSTANT, np.int64)
    zl_rep = zl[rep]
    pos_in = np.arange(rep.size) - np.repeat(first_of, cnt)
    zi_type[zl_rep] = np.where(pos_in[zl_rep] == 0, TYPE_BEGIN, TYPE_END)
    e_rows = rows_nz[::-1]
    rows = np.concatenate([e_rows, rep, rows_nz])
    typ = np.concatenate([np.full(e_rows.size, TYPE_END, np.int64), zi_type, np.full(rows_nz.size, TYPE_BEGIN, np.int64)])
    ts = np.concatenate([end[e_rows], start[rep], start[rows_nz]])
    phase = np.concatenate([np.zeros(e_rows.size, np.int64), np.ones(rep.size, np.int64),
                            np.full(rows_nz.size, 2, np.int64)])
    trk = row_track[rows]
    o = _order(trk, ts * 4 + phase)
    return trk[o], ts[o], typ[o], rows[o]


def _flows(r: _Rows, row_warp: np.ndarray):
    """(src_row, dst_row) of the QK(i)->SOFTMAX(i) and SOFTMAX(i)->PV(i) edges of each warp."""
    code = {nm: i for i, nm in enumerate(r.names)}
    if r.n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    it_max = int(r.iter.max()) + 1
    key = row_warp * max(it_max, 1) + np.maximum(r.iter, 0)

    def firsts(nm):
        if nm not in code:
            return None
        rows = np.flatnonzero((r.name == code[nm]) & (r.kind == 0) & (r.iter >= 0))
        uk, fi = np.unique(key[rows], return_index=True)
        return uk, rows[fi]

    srcs, dsts = [], []
    chain = [firsts(nm) for nm in ("QK", "SOFTMAX", "PV")]
    for a, b in ((chain[0], chain[1]), (chain[1], chain[2])):
        if a is None or b is None:
            continue
        _, ia, ib = np.intersect1d(a[0], b[0], assume_unique=True, return_indices=True)
        s, d = a[1][ia], b[1][ib]
        keep = r.start[s] < r.start[d]
        srcs.append(s[keep])
        dsts.append(d[keep])
    if not srcs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(srcs), np.concatenate(dsts)


def _counter_points(key: np.ndarray, ts: np.ndarray, delta: np.ndarray):
    """Step counters from +/-1 changes: per key, the value after all changes at each time."""
    o = _order(key, ts * 2 + (delta > 0))
    k, t, dl = key[o], ts[o], delta[o]
    val = np.cumsum(dl)
    seg_start = np.r_[True, k[1:] != k[:-1]] if k.size else np.zeros(0, bool)
    seg = np.cumsum(seg_start) - 1
    val = val - (val - dl)[seg_start][seg]
    last = np.r_[(k[1:] != k[:-1]) | (t[1:] != t[:-1]), True] if k.size else np.zeros(0, bool)
    return k[last], t[last], val[last]


# ---- vectorized protobuf encoding ------------------------------------------------------------

def _vlen(v: np.ndarray) -> np.ndarray:
    """Varint length of each (unsigned) value."""
    n = np.ones(v.size, np.int8)
    if v.size:
        vmax = int(v.max())
        k = 7
        while k < 64 and vmax >> k:
            n += v >= (1 << k)
            k += 7
    return n


class _Encoder:
    """Writes the fields of many packets at once into one byte buffer (a cursor per packet).

    Values are unsigned arrays (uint32 where they fit, else uint64); a field is a tag (bytes)
    followed by an optional varint. The cursor of the selected packets is read once per
    :meth:`fields` call, so each byte of output costs one scatter store.
    """

    def __init__(self, lengths: np.ndarray):
        total = int(lengths.sum())
        it = np.int32 if total < 2**31 - 64 else np.int64
        self.end = np.cumsum(lengths, dtype=it)
        self.off = self.end - lengths.astype(it)
        self.buf = np.empty(total, np.uint8)
        self.cur = self.off.copy()

    def fields(self, items, sel: np.ndarray | None = None):
        buf = self.buf
        pos = self.cur if sel is None else self.cur[sel]
        for tag, v, vl in items:
            for j, b in enumerate(tag):
                buf[pos + j if j else pos] = b
            pos = pos + len(tag)
            if v is None or v.size == 0:
                continue
            vmax = int(v.max())
            if vmax < 0x80:
                buf[pos] = v
                pos = pos + 1
                continue
            one = np.asarray(1, v.dtype)
            buf[pos] = (v & 0x7F) | ((v >= 0x80).astype(v.dtype) << 7)
            for j in range(1, int(vl.max())):
                m = np.flatnonzero(vl > j)
                vv = v[m] >> (7 * j)
                buf[pos[m] + j] = (vv & 0x7F) | ((vv >= 0x80).astype(v.dtype) * (one << 7))
            pos = pos + vl
        if sel is None:
            self.cur = pos
        else:
            self.cur[sel] = pos


def _uarr(x: np.ndarray) -> np.ndarray:
    """int64 -> the narrowest of uint32/uint64 that holds it (negatives as 64-bit two's complement)."""
    if x.size and (x.min() < 0 or x.max() >= 2**32):
        return x.astype(np.int64).view(np.uint64)
    return x.astype(np.uint32)


def encode_hot_packets(seq, dts, typ, name_iid, iters, flow_out, flow_in, cval) -> tuple[np.ndarray, np.ndarray]:
    """Encode hot TracePackets as Trace.packet fields. Returns (bytes, packet end offsets).

    Public for writers that lay out their own tracks and sequences (fa4trace.profiler.merge):
    one packet per row, delta timestamps on each sequence's incremental clock, the debug
    annotation (interned name iid 1 on the sequence) where ``iters >= 0``.

    All inputs are per packet (int64). name_iid 0 = none, iters < 0 = none, flow 0 = none,
    cval used only where typ == COUNTER.
    """
    has_name = np.flatnonzero(name_iid > 0)
    has_iter = np.flatnonzero(iters >= 0)
    has_fo = np.flatnonzero(flow_out > 0)
    has_fi = np.flatnonzero(flow_in > 0)
    has_cv = np.flatnonzero(typ == TYPE_COUNTER)
    seq_u, dts_u, typ_u = _uarr(seq), _uarr(dts), _uarr(typ)
    name_u, iter_u = _uarr(name_iid[has_name]), _uarr(iters[has_iter])
    fo_u, fi_u, cv_u = _uarr(flow_out[has_fo]), _uarr(flow_in[has_fi]), _uarr(cval[has_cv])
    l_seq, l_dts, l_typ = _vlen(seq_u), _vlen(dts_u), _vlen(typ_u)
    l_name, l_iter, l_fo, l_fi, l_cv = _vlen(name_u), _vlen(iter_u), _vlen(fo_u), _vlen(fi_u), _vlen(cv_u)
    iid_u = np.full(has_iter.size, ITER_IID, np.uint32)
    l_iid = _vlen(iid_u)
    ann_u = (len(_T_DA_NAME_IID) + l_iid + len(_T_DA_INT) + l_iter).astype(np.uint32)
    l_ann = _vlen(ann_u)

    te = (len(_T_TYPE) + l_typ).astype(np.int32)
    te[has_name] += len(_T_NAME_IID) + l_name
    te[has_iter] += len(_T_DEBUG) + l_ann + ann_u.astype(np.int32)
    te[has_fo] += len(_T_FLOW) + l_fo
    te[has_fi] += len(_T_TERM_FLOW) + l_fi
    te[has_cv] += len(_T_COUNTER) + l_cv
    te_u = te.astype(np.uint32)
    l_te = _vlen(te_u)
    body = len(_T_TS) + l_dts + len(_T_SEQ) + l_seq + len(_T_TE) + l_te + te
    body_u = body.astype(np.uint32)
    l_body = _vlen(body_u)
    total = len(_T_PACKET) + l_body + body

    enc = _Encoder(total)
    enc.fields([(_T_PACKET, body_u, l_body), (_T_TS, dts_u, l_dts), (_T_SEQ, seq_u, l_seq),
                (_T_TE, te_u, l_te), (_T_TYPE, typ_u, l_typ)])
    if has_name.size:
        enc.fields([(_T_NAME_IID, name_u, l_name)], has_name)
    if has_iter.size:
        enc.fields([(_T_DEBUG, ann_u, l_ann), (_T_DA_NAME_IID, iid_u, l_iid), (_T_DA_INT, iter_u, l_iter)], has_iter)
    if has_fo.size:
        enc.fields([(_T_FLOW, fo_u, l_fo)], has_fo)
    if has_fi.size:
        enc.fields([(_T_TERM_FLOW, fi_u, l_fi)], has_fi)
    if has_cv.size:
        enc.fields([(_T_COUNTER, cv_u, l_cv)], has_cv)
    if not np.array_equal(enc.cur, enc.end):
        raise AssertionError("perfetto packet encoder: field lengths and bytes written disagree")
    return enc.buf, enc.end.astype(np.int64)


def _packet_bytes(pkt: pb.TracePacket) -> bytes:
    body = pkt.SerializeToString()
    return _T_PACKET + _varint_bytes(len(body)) + body


# ---- the exporter ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Placement:
    """Where :func:`to_perfetto` puts its tracks inside a larger trace (fa4trace.profiler.merge).

    The export's root becomes a child track ``name`` of the existing track ``parent_uuid``
    (instead of a process of its own); its track uuids count up from ``uuid_base``, its packet
    sequences from ``first_sequence_id`` and its flow ids from ``first_flow_id``, so several
    exports written into one file never collide (:class:`PerfettoStats` says where each ended).
    ``ts_offset_ns`` is added to every timestamp: the bundle's ns onto the host trace's clock.
    """

    parent_uuid: int
    name: str
    uuid_base: int
    first_sequence_id: int
    first_flow_id: int = 1
    ts_offset_ns: int = 0
    rank: int = 0


@dataclass
class PerfettoStats:
    """What :func:`to_perfetto` wrote."""

    slices: int  # BEGIN + INSTANT events on slice tracks (= events table rows)
    packets: int  # all TracePackets before compression
    hot_packets: int  # per-event packets (slices, ends, counters)
    tracks: int  # all tracks (tree + slice + counter)
    slice_tracks: int
    extra_lanes: int  # slice tracks created only to keep nesting strict
    sequences: int
    flows: int
    counter_points: int
    bytes: int  # bytes written
    bytes_uncompressed: int  # size the same trace has without compressed_packets
    compressed: bool
    seconds: float
    lane_rounds: int = 0
    timings: dict = field(default_factory=dict)
    next_uuid: int = 0  # first track uuid, sequence id and flow id this export left unused
    next_sequence_id: int = 0
    next_flow_id: int = 0

    @property
    def bytes_per_slice(self) -> float:
        return self.bytes / max(self.slices, 1)

    @property
    def slices_per_s(self) -> float:
        return self.slices / self.seconds if self.seconds > 0 else float("inf")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["bytes_per_slice"] = self.bytes_per_slice
        d["slices_per_s"] = self.slices_per_s
        return d


def to_perfetto(trace, path_or_file, *, compress: bool = False, flows: bool = True,
                iterations: bool = True, counters: bool = True, inflight_counters: bool = False,
                compress_level: int = 5, chunk_bytes: int = CHUNK_BYTES,
                threads: int | None = None, place: Placement | None = None) -> PerfettoStats:
    """Write ``trace`` (a bundle Trace, or anything with ``.events`` and ``.meta``) as a
    Perfetto protobuf trace to a path or a binary file object.

    compress: wrap the packets in zlib ``compressed_packets`` batches of ~chunk_bytes.
    flows: QK(i) -> SOFTMAX(i) -> PV(i) flow arrows. iterations: ``iter`` debug annotation.
    counters: a "warps active" counter per launch and, for bundles of automatically traced
    kernels (meta["instrument"]), a "<pipeline> stages held" counter per CTA and pipeline
    (fa4trace.kernel_analysis.occupancy_series). inflight_counters: an "async in flight"
    counter per CTA (two more packets per async span: off by default, it costs bytes).
    Warps of automatically traced kernels are named by their assigned role (fa4trace.roles).
    place: write the export as part of a larger trace (:class:`Placement`); None = a trace of its own.
    """
    t_all = time.perf_counter()
    tm: dict = {}
    events: pa.Table = trace.events
    meta: dict = dict(getattr(trace, "meta", {}) or {})
    vocab = _vocab_of(meta)
    occupancy = None
    if isinstance(meta.get("instrument"), dict) and events.num_rows:
        from .bundle import Trace
        from .kernel_analysis import occupancy_series
        from .roles import assign_roles

        assigned = assign_roles(Trace(events, meta))
        events = assigned.events
        occupancy = occupancy_series(assigned) if counters else None

    t = time.perf_counter()
    r = _rows(events)
    ts_shift = place.ts_offset_ns if place else 0
    if r.n and r.start.min() + ts_shift < 0:  # perfetto timestamps are unsigned: rebase
        if place:
            raise ValueError("placement would give negative timestamps: ts_offset_ns too small")
        ts_shift = -int(r.start.min())
    if ts_shift:
        r.start, r.end = r.start + ts_shift, r.end + ts_shift
    lay = layout_tracks(events, vocab, _rows_cache=r)
    tm["layout"] = time.perf_counter() - t

    t = time.perf_counter()
    s_trk, s_ts, s_typ, s_row = _slice_stream(r, lay)
    n_slice_tracks = lay.n_tracks
    names_used = r.name[s_row]
    name_iid = np.where(s_typ != TYPE_END, names_used + 1, 0)
    iters = np.where((s_typ != TYPE_END) & iterations, r.iter[s_row], -1)
    flow_out = np.zeros(s_row.size, np.int64)
    flow_in = np.zeros(s_row.size, np.int64)
    n_flows = 0
    if flows and r.n:
        src, dst = _flows(r, lay.row_warp)
        n_flows = int(src.size)
        if n_flows:
            fid_out = np.zeros(r.n, np.int64)
            fid_in = np.zeros(r.n, np.int64)
            flow0 = place.first_flow_id if place else 1
            ids = np.arange(flow0, flow0 + n_flows, dtype=np.int64)
            fid_out[src] = ids
            fid_in[dst] = ids
            is_b = s_typ == TYPE_BEGIN
            flow_out = np.where(is_b, fid_out[s_row], 0)
            flow_in = np.where(is_b, fid_in[s_row], 0)
    tm["stream"] = time.perf_counter() - t

    # ---- counters: their own tracks, after the slice tracks ----------------------------------
    t = time.perf_counter()
    launches = np.unique(lay.warp_launch) if lay.warp_launch.size else np.zeros(0, np.int64)
    multi = launches.size > 1
    ctr_specs: list[tuple[str, int, int, str]] = []  # (kind, launch, cta, track name)
    c_trk, c_ts, c_val = [], [], []
    if counters and r.n:
        wr = np.flatnonzero(r.kind == 2)
        if wr.size:
            lk = np.searchsorted(launches, r.launch[wr])
            k, tt, v = _counter_points(np.concatenate([lk, lk]), np.concatenate([r.start[wr], r.end[wr]]),
                                       np.concatenate([np.ones(wr.size, np.int64), -np.ones(wr.size, np.int64)]))
            base = len(ctr_specs)
            ctr_specs += [("warps", int(launches[i]), -1, "warps active") for i in range(launches.size)]
            c_trk.append(n_slice_tracks + base + k)
            c_ts.append(tt)
            c_val.append(v)
    if inflight_counters and r.n and lay.async_names:
        ar = np.flatnonzero((r.kind == 0) & (lay.track_class[lay.row_track] > 0))
        if ar.size:
            ck = (r.launch[ar] << 32) | r.cta[ar]
            uk, inv = np.unique(ck, return_inverse=True)
            inv = inv.reshape(-1)
            k, tt, v = _counter_points(np.concatenate([inv, inv]), np.concatenate([r.start[ar], r.end[ar]]),
                                       np.concatenate([np.ones(ar.size, np.int64), -np.ones(ar.size, np.int64)]))
            base = len(ctr_specs)
            ctr_specs += [("inflight", int(x >> 32), int(x & 0xFFFFFFFF), "async in flight") for x in uk]
            c_trk.append(n_slice_tracks + base + k)
            c_ts.append(tt)
            c_val.append(v)
    if occupancy is not None and occupancy.num_rows:
        # one track per (launch, CTA, pipeline): the analysis's own step series, on the export's time axis
        o_l = occupancy["launch"].to_numpy().astype(np.int64)
        o_c = occupancy["cta"].to_numpy().astype(np.int64)
        o_p = occupancy["pipeline"].to_pylist()
        pnames = sorted(set(o_p))
        ok = (o_l << 40) | (o_c << 8) | np.array([pnames.index(x) for x in o_p], np.int64)
        uk, inv = np.unique(ok, return_inverse=True)
        base = len(ctr_specs)
        ctr_specs += [("occupancy", int(x >> 40), int((x >> 8) & 0xFFFFFFFF), f"{pnames[int(x & 0xFF)]} stages held")
                      for x in uk]
        inv = inv.reshape(-1)
        o = np.argsort(inv, kind="stable")  # packets of a track together, in time order (the series is)
        c_trk.append(n_slice_tracks + base + inv[o])
        c_ts.append(occupancy["t_ns"].to_numpy().astype(np.int64)[o] + ts_shift)
        c_val.append(occupancy["stages_full"].to_numpy().astype(np.int64)[o])
    n_ctr_points = int(sum(x.size for x in c_ts))
    if c_trk:
        c_trk_a, c_ts_a, c_val_a = np.concatenate(c_trk), np.concatenate(c_ts), np.concatenate(c_val)
    else:
        c_trk_a = c_ts_a = c_val_a = np.zeros(0, np.int64)
    tm["counters"] = time.perf_counter() - t

    # ---- hot packets ------------------------------------------------------------------------
    t = time.perf_counter()
    trk = np.concatenate([s_trk, c_trk_a])
    ts = np.concatenate([s_ts, c_ts_a])
    n_hot_tracks = n_slice_tracks + len(ctr_specs)
    per_track = np.bincount(trk, minlength=n_hot_tracks) if trk.size else np.zeros(n_hot_tracks, np.int64)
    # sequence ids: busiest tracks get the 1-byte ids
    seq_of_track = np.empty(n_hot_tracks, np.int64)
    seq0 = place.first_sequence_id if place else 1
    seq_of_track[np.argsort(-per_track, kind="stable")] = np.arange(seq0, seq0 + n_hot_tracks)
    first_in_track = np.r_[True, trk[1:] != trk[:-1]] if trk.size else np.zeros(0, bool)
    dts = np.diff(ts, prepend=ts[:1] if ts.size else ts)
    dts[first_in_track] = 0
    t0_of_track = np.zeros(n_hot_tracks, np.int64)
    t0_of_track[trk[first_in_track]] = ts[first_in_track]
    nc = c_ts_a.size
    hot, hot_ends = encode_hot_packets(
        seq_of_track[trk], dts,
        np.concatenate([s_typ, np.full(nc, TYPE_COUNTER, np.int64)]),
        np.concatenate([name_iid, np.zeros(nc, np.int64)]),
        np.concatenate([iters, np.full(nc, -1, np.int64)]),
        np.concatenate([flow_out, np.zeros(nc, np.int64)]),
        np.concatenate([flow_in, np.zeros(nc, np.int64)]),
        np.concatenate([np.zeros(s_ts.size, np.int64), c_val_a]))
    tm["encode"] = time.perf_counter() - t

    # ---- descriptors and per-sequence setup packets (pb2: few) ------------------------------
    t = time.perf_counter()
    head = bytearray()
    n_tree = 0
    desc_seq = seq0 + n_hot_tracks
    uuid_next = [place.uuid_base if place else UUID_BASE]

    def new_uuid() -> int:
        uuid_next[0] += 1
        return uuid_next[0]

    def descriptor(uuid, parent, name, rank=None, *, process=False, counter=False):
        nonlocal n_tree
        p = pb.TracePacket()
        p.trusted_packet_sequence_id = desc_seq
        td = p.track_descriptor
        td.uuid = uuid
        if parent:
            td.parent_uuid = parent
        if process:
            td.process.pid = ROOT_PID
            td.process.process_name = name
        td.name = name
        td.sibling_merge_behavior = _NONE
        td.child_ordering = _EXPLICIT
        if rank is not None:
            td.sibling_order_rank = int(rank)
        if counter:
            td.counter.SetInParent()
        head.extend(_packet_bytes(p))
        n_tree += 1

    gpu = meta.get("gpu") or {}
    gpu_name = gpu.get("name") if isinstance(gpu, dict) else str(gpu)
    kernel = str(meta.get("kernel", "kernel"))
    root = new_uuid()
    if place:
        descriptor(root, place.parent_uuid, place.name, rank=place.rank)
    else:
        descriptor(root, 0, f"GPU {gpu_name or ''} · {kernel}".replace("GPU  ·", "GPU ·"), process=True)
    launch_meta = meta.get("launches") or []
    launch_uuid = {}
    for li in launches.tolist():
        if multi:
            u_ = new_uuid()
            lm = launch_meta[li] if 0 <= li < len(launch_meta) and isinstance(launch_meta[li], dict) else {}
            descriptor(u_, root, f"launch {li}" + (f" · {lm['kernel']}" if lm.get("kernel") else ""), rank=li)
            launch_uuid[li] = u_
        else:
            launch_uuid[li] = root
    sm_uuid, cta_uuid = {}, {}
    for w in range(lay.warp_sm.size):
        li, sm, cta = int(lay.warp_launch[w]), int(lay.warp_sm[w]), int(lay.warp_cta[w])
        if (li, sm) not in sm_uuid:
            sm_uuid[(li, sm)] = u_ = new_uuid()
            descriptor(u_, launch_uuid[li], f"SM {sm}", rank=sm)
        if (li, cta) not in cta_uuid:
            cta_uuid[(li, cta)] = u_ = new_uuid()
            descriptor(u_, sm_uuid[(li, sm)], f"CTA {cta}", rank=cta)
    track_uuid = np.zeros(n_hot_tracks, np.int64)
    warp_track_uuid = {}
    for tix in range(n_slice_tracks):
        w, c, lane = int(lay.track_warp[tix]), int(lay.track_class[tix]), int(lay.track_lane[tix])
        u_ = new_uuid()
        track_uuid[tix] = u_
        if c == 0 and lane == 0:
            warp_track_uuid[w] = u_
            parent = cta_uuid[(int(lay.warp_launch[w]), int(lay.warp_cta[w]))]
            rank = int(lay.warp_index[w])
        else:
            parent = warp_track_uuid[w]  # tracks are in (warp, class, lane) order: lane 0 of class 0 first
            rank = lay.child_rank(tix)
        descriptor(u_, parent, lay.track_label(tix), rank=rank)
    for ci, (kind, li, cta, label) in enumerate(ctr_specs):
        u_ = new_uuid()
        track_uuid[n_slice_tracks + ci] = u_
        if kind == "warps":
            descriptor(u_, launch_uuid[li], label, rank=-1, counter=True)
        else:
            descriptor(u_, cta_uuid[(li, cta)], label, rank=-2 if kind == "occupancy" else -1, counter=True)

    # interned names per sequence: only those its packets use
    pairs = np.unique(s_trk * (len(r.names) + 1) + names_used) if s_trk.size else np.zeros(0, np.int64)
    names_of_track: dict[int, list[int]] = {}
    for pkey in pairs.tolist():
        names_of_track.setdefault(pkey // (len(r.names) + 1), []).append(pkey % (len(r.names) + 1))
    setup = bytearray()
    for tix in range(n_hot_tracks):
        if per_track[tix] == 0:
            continue
        p = pb.TracePacket()
        p.trusted_packet_sequence_id = int(seq_of_track[tix])
        p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        p.first_packet_on_sequence = True
        p.trace_packet_defaults.timestamp_clock_id = CLOCK_SEQ
        p.trace_packet_defaults.track_event_defaults.track_uuid = int(track_uuid[tix])
        if tix < n_slice_tracks:
            for code in names_of_track.get(tix, []):
                en = p.interned_data.event_names.add()
                en.iid = code + 1
                en.name = r.names[code]
            if iterations:
                dn = p.interned_data.debug_annotation_names.add()
                dn.iid = ITER_IID
                dn.name = "iter"
        for cid, inc in ((CLOCK_BOOTTIME, False), (CLOCK_SEQ, True)):
            c = p.clock_snapshot.clocks.add()
            c.clock_id = cid
            c.timestamp = int(t0_of_track[tix])
            if inc:
                c.is_incremental = True
        setup.extend(_packet_bytes(p))
    n_seq = int((per_track > 0).sum())
    tm["descriptors"] = time.perf_counter() - t

    # ---- write -------------------------------------------------------------------------------
    t = time.perf_counter()
    uncompressed = len(head) + len(setup) + int(hot.size)
    parts: list = [bytes(head), bytes(setup)]
    if hot.size:
        parts.append(memoryview(hot))
    if compress:
        parts = _compress(parts, hot_ends, compress_level, chunk_bytes, threads)
    written = write_parts(path_or_file, parts)
    tm["write"] = time.perf_counter() - t

    n_hot = int(trk.size)
    return PerfettoStats(
        slices=int(r.n), packets=n_tree + n_seq + n_hot, hot_packets=n_hot,
        tracks=n_tree, slice_tracks=n_slice_tracks,
        extra_lanes=int((lay.track_lane > 0).sum()), sequences=n_seq, flows=n_flows,
        counter_points=n_ctr_points, bytes=written, bytes_uncompressed=uncompressed,
        compressed=bool(compress), seconds=time.perf_counter() - t_all, lane_rounds=lay.lane_rounds,
        timings=tm, next_uuid=uuid_next[0] + 1, next_sequence_id=desc_seq + 1,
        next_flow_id=(place.first_flow_id if place else 1) + n_flows)


def _vocab_of(meta: dict) -> Vocabulary:
    v = meta.get("vocabulary")
    if isinstance(v, dict):
        try:
            return Vocabulary.from_json(v)
        except Exception:  # a malformed vocabulary must not stop an export: fall back
            return VOCAB
    return VOCAB


def _compress(parts: list, hot_ends: np.ndarray, level: int, chunk_bytes: int, threads: int | None) -> list:
    """Cut the packet stream at packet boundaries into ~chunk_bytes batches, zlib each."""
    small = b"".join(bytes(p) for p in parts[:2])
    hot = parts[2] if len(parts) > 2 else memoryview(b"")
    chunks = [memoryview(small)[a:b] for a, b in _cuts(_packet_ends(small), chunk_bytes)]
    chunks += [hot[a:b] for a, b in _cuts(hot_ends, chunk_bytes)]
    workers = threads or min(8, os.cpu_count() or 1)
    comp = (lambda c: zlib.compress(c, level))
    if workers > 1 and len(chunks) > 1:
        with ThreadPoolExecutor(workers) as ex:
            blobs = list(ex.map(comp, chunks))
    else:
        blobs = [comp(c) for c in chunks]
    out = []
    tag = _tag(_T_COMPRESSED, _LEN)
    for b in blobs:
        body = tag + _varint_bytes(len(b))
        out.append(_T_PACKET + _varint_bytes(len(body) + len(b)) + body)
        out.append(b)
    return out


def _cuts(ends: np.ndarray, chunk_bytes: int) -> list[tuple[int, int]]:
    """(start, stop) byte ranges of about chunk_bytes that end on packet ends."""
    out, pos = [], 0
    total = int(ends[-1]) if ends.size else 0
    while pos < total:
        k = int(np.searchsorted(ends, pos + chunk_bytes, side="right")) - 1
        if k < 0 or ends[k] <= pos:  # one packet larger than a chunk
            k = int(np.searchsorted(ends, pos, side="right"))
        out.append((pos, int(ends[k])))
        pos = int(ends[k])
    return out


def _packet_ends(buf: bytes) -> np.ndarray:
    """End offsets of the Trace.packet fields in a (small) serialized Trace."""
    ends = []
    pos, n = 0, len(buf)
    while pos < n:
        pos += 1  # tag 0x0A
        ln, shift = 0, 0
        while True:
            b = buf[pos]
            pos += 1
            ln |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        pos += ln
        ends.append(pos)
    return np.array(ends, np.int64)


