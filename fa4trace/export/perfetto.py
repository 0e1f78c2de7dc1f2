"""Events table -> Perfetto TrackEvent protobuf trace (open it in ui.perfetto.dev or the app).

Track tree (every track has ``sibling_merge_behavior = NONE`` so the UI never merges siblings
with equal names, and ``child_ordering = EXPLICIT`` so SMs, CTAs and warps sort by index)::

    GPU <gpu> · <kernel>                      process-like root (a ProcessDescriptor)
      [launch k · <kernel>]                   only when the bundle holds several launches
        warps active                          counter: warps alive over time
        SM s
          CTA c
            [<pipeline> stages held]          counter per pipeline, from ``occupancy=``
            [async in flight]                 counter, only with inflight_counters=True
            warp w · <role>                   the warp's own (sync) spans, instants and WARP row
              QK in flight                    one child track per async event (vocab is_async)
              PV in flight
              QK in flight (2)                extra lanes: spans that would break nesting
              warp w · <role> · overlap 1

Perfetto's UI (v52 and the viewer's offline copy) opens every track group collapsed: no
TrackDescriptor field asks for a group to open. The viewer's Perfetto page expands this tree
with a startup command (fa4trace.viewer.perfetto_ui); elsewhere, Perfetto's command "Expand all
track groups" does it.

Slices on one track must nest strictly (BEGIN/END): async spans (MMA in flight) and spans that
would cross another live on tracks of their own, placed by :func:`fa4trace.export.tracks.layout_tracks`
(the layout the Chrome export and the viewer's timeline use too).

The exporter draws what it is given: the ``role`` column names the warp tracks, and stage
occupancy comes in as a table (``occupancy=``). For bundles of automatically traced kernels,
:func:`fa4trace.analysis.kernel.export_inputs` assigns the roles and computes the series first.
The export runs in phases, one function each: columns and layout (:func:`_columns`), the slice
packets (:func:`_slices`), the counter tracks (:func:`_counters`), their encoding
(:func:`_encode`), the track tree (:func:`_track_tree`) and each sequence's first packet
(:func:`_sequence_setup`), then the write (:func:`_write`).

Placed inside a larger trace (``place=``, a :class:`Placement`: fa4trace.profiler.merge puts
each traced launch under its kernel's slice in a torch.profiler trace), the root is a child
track of a given parent instead of a process, track uuids, sequence ids and flow ids start where
the placement says, and every timestamp is moved by its offset; :class:`PerfettoStats` says
which ids the export left unused. :func:`slice_events` and :func:`encode_hot_packets` are the
exporter's event ordering and packet encoder, public for such writers' own events.

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
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ..format.vocab import Vocabulary
from ._io import write_parts
from .tracks import EventColumns, TrackLayout, event_columns, layout_tracks, stable_order, vocab_of

__all__ = ["to_perfetto", "PerfettoStats", "Placement", "slice_events", "encode_hot_packets"]

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


# ---- event stream ----------------------------------------------------------------------------

def _slice_stream(r: EventColumns, lay: TrackLayout):
    """All BEGIN/END/INSTANT events of a bundle's rows (:func:`slice_events`)."""
    return slice_events(lay.row_track, r.start, r.end, r.kind == 1, lay.rank)


def slice_events(row_track: np.ndarray, start: np.ndarray, end: np.ndarray, instant: np.ndarray,
                 rank: np.ndarray):
    """All BEGIN/END/INSTANT events ordered by (track, time) with valid nesting tie-breaks.

    Per row: its track (``TrackLayout.row_track``), start and end ns, whether it is an instant,
    and its rank (``TrackLayout.rank``: (track group, start, -end) order). A span becomes BEGIN +
    END (a zero-length one too, adjacent), an instant INSTANT; at equal times ENDs come first,
    inner spans end first and outer ones begin first. Public for writers that lay out rows of
    their own with :func:`fa4trace.export.tracks.layout_tracks` (fa4trace.profiler.merge).
    Returns (track, ts, type, row).
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
    o = stable_order(trk, ts * 4 + phase)
    return trk[o], ts[o], typ[o], rows[o]


def _flows(r: EventColumns, row_warp: np.ndarray):
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
    o = stable_order(key, ts * 2 + (delta > 0))
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


# ---- where the export goes, and what it wrote ------------------------------------------------

@dataclass(frozen=True)
class Placement:
    """Where :func:`to_perfetto` puts its tracks inside a larger trace (fa4trace.profiler.merge).

    The export's root becomes a child track ``name`` (at ``rank``) of the existing track
    ``parent_uuid`` instead of a process of its own; its track uuids count up from ``uuid_base``
    (the first is ``uuid_base + 1``), its packet sequences from ``first_sequence_id`` and its flow
    ids from ``first_flow_id``, so several exports written into one file never collide
    (:class:`PerfettoStats` says where each ended). ``ts_offset_ns`` is added to every
    timestamp: the bundle's ns onto the host trace's clock; a time that would then be negative
    is an error (no rebasing inside a larger trace).
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



# ---- phases of the exporter ------------------------------------------------------------------

@dataclass
class _Slices:
    """Every BEGIN/END/INSTANT packet of the slice tracks, in (track, time) order."""

    track: np.ndarray
    ts: np.ndarray
    type: np.ndarray
    row: np.ndarray
    name_iid: np.ndarray  # 0 on ENDs
    iters: np.ndarray  # -1 where none
    flow_out: np.ndarray  # 0 where none
    flow_in: np.ndarray
    n_flows: int


@dataclass
class _Counters:
    """Counter tracks (numbered after the slice tracks) and their points, track by track."""

    specs: list  # (kind, launch, cta, track name) per counter track
    track: np.ndarray
    ts: np.ndarray
    value: np.ndarray


@dataclass
class _Hot:
    """The per-event packets, encoded, and what the setup packets need to know of them."""

    data: np.ndarray  # bytes
    ends: np.ndarray  # end offset of each packet
    per_track: np.ndarray  # packets per hot track (slice tracks, then counter tracks)
    seq_of_track: np.ndarray
    t0_of_track: np.ndarray  # first timestamp of each hot track (its clock snapshot)


def _columns(events: pa.Table, vocab: Vocabulary, place: Placement | None = None
             ) -> tuple[EventColumns, TrackLayout, int, int]:
    """The rows as columns, their track layout, and two shifts: ``data_shift``, added to the
    rows' times so none is negative (sort keys stay small: bundle-relative ns), and
    ``clock_offset``, added only where a clock snapshot is written (every packet time is a
    delta from it), so the placement's offset (Unix-epoch ns, 61 bits) never enters a sort.
    Output time = row time + data_shift + clock_offset; on a trace of its own the rows start at
    >= 0 (Perfetto timestamps are unsigned), placed they land at row time + ``ts_offset_ns``."""
    r = event_columns(events)
    t_min = int(r.start.min()) if r.n else 0
    offset = place.ts_offset_ns if place else 0
    if place and t_min + offset < 0:
        raise ValueError(f"placement {place.name!r}: ts_offset_ns {place.ts_offset_ns} would give "
                         f"negative timestamps (earliest event at {t_min} ns)")
    data_shift = -t_min if t_min < 0 else 0
    if data_shift:
        r.start, r.end = r.start + data_shift, r.end + data_shift
    clock_offset = offset - data_shift if place else 0
    return r, layout_tracks(events, vocab, columns=r), data_shift, clock_offset


def _slices(r: EventColumns, lay: TrackLayout, *, flows: bool, iterations: bool, first_flow_id: int = 1) -> _Slices:
    """The slice packets: names on BEGIN/INSTANT, ``iter`` annotations, flow ids (counting up
    from ``first_flow_id``) on BEGINs."""
    trk, ts, typ, row = _slice_stream(r, lay)
    name_iid = np.where(typ != TYPE_END, r.name[row] + 1, 0)
    iters = np.where((typ != TYPE_END) & iterations, r.iter[row], -1)
    flow_out = np.zeros(row.size, np.int64)
    flow_in = np.zeros(row.size, np.int64)
    n_flows = 0
    if flows and r.n:
        src, dst = _flows(r, lay.row_warp)
        n_flows = int(src.size)
        if n_flows:
            fid_out = np.zeros(r.n, np.int64)
            fid_in = np.zeros(r.n, np.int64)
            ids = np.arange(first_flow_id, first_flow_id + n_flows, dtype=np.int64)
            fid_out[src] = ids
            fid_in[dst] = ids
            is_b = typ == TYPE_BEGIN
            flow_out = np.where(is_b, fid_out[row], 0)
            flow_in = np.where(is_b, fid_in[row], 0)
    return _Slices(trk, ts, typ, row, name_iid, iters, flow_out, flow_in, n_flows)


def _counters(r: EventColumns, lay: TrackLayout, occupancy: pa.Table | None, ts_shift: int, *,
              warps: bool, inflight: bool) -> _Counters:
    """Counter tracks, numbered after the slice tracks: warps alive per launch, async spans in
    flight per CTA, and the given stage-occupancy series per (launch, CTA, pipeline)."""
    specs: list[tuple[str, int, int, str]] = []
    trk, ts, val = [], [], []
    parts = [_warp_counter(r, lay) if warps and r.n else None,
             _inflight_counter(r, lay) if inflight and r.n and lay.async_names else None,
             _occupancy_counter(occupancy, ts_shift) if occupancy is not None and occupancy.num_rows else None]
    for part in parts:
        if part is None:
            continue
        p_specs, k, t, v = part
        trk.append(lay.n_tracks + len(specs) + k)
        specs += p_specs
        ts.append(t)
        val.append(v)
    if not trk:
        return _Counters(specs, *(np.zeros(0, np.int64),) * 3)
    return _Counters(specs, np.concatenate(trk), np.concatenate(ts), np.concatenate(val))


def _warp_counter(r: EventColumns, lay: TrackLayout):
    """"warps active" per launch, from the WARP rows: (specs, track, ts, value) or None."""
    wr = np.flatnonzero(r.kind == 2)
    if not wr.size:
        return None
    launches = np.unique(lay.warp_launch)
    lk = np.searchsorted(launches, r.launch[wr])
    k, t, v = _counter_points(np.concatenate([lk, lk]), np.concatenate([r.start[wr], r.end[wr]]),
                              np.concatenate([np.ones(wr.size, np.int64), -np.ones(wr.size, np.int64)]))
    return [("warps", int(x), -1, "warps active") for x in launches.tolist()], k, t, v


def _inflight_counter(r: EventColumns, lay: TrackLayout):
    """"async in flight" per CTA, from the spans on async tracks: (specs, track, ts, value) or None."""
    ar = np.flatnonzero((r.kind == 0) & (lay.track_class[lay.row_track] > 0))
    if not ar.size:
        return None
    uk, inv = np.unique((r.launch[ar] << 32) | r.cta[ar], return_inverse=True)
    inv = inv.reshape(-1)
    k, t, v = _counter_points(np.concatenate([inv, inv]), np.concatenate([r.start[ar], r.end[ar]]),
                              np.concatenate([np.ones(ar.size, np.int64), -np.ones(ar.size, np.int64)]))
    return [("inflight", int(x >> 32), int(x & 0xFFFFFFFF), "async in flight") for x in uk.tolist()], k, t, v


def _occupancy_counter(occupancy: pa.Table, ts_shift: int):
    """"<pipeline> stages held" per (launch, CTA, pipeline): the analysis's own step series, on
    the export's time axis. Returns (specs, track, ts, value)."""
    o_l = occupancy["launch"].to_numpy().astype(np.int64)
    o_c = occupancy["cta"].to_numpy().astype(np.int64)
    o_p = occupancy["pipeline"].to_pylist()
    pnames = sorted(set(o_p))
    uk, inv = np.unique((o_l << 40) | (o_c << 8) | np.array([pnames.index(x) for x in o_p], np.int64),
                        return_inverse=True)
    specs = [("occupancy", int(x >> 40), int((x >> 8) & 0xFFFFFFFF), f"{pnames[int(x & 0xFF)]} stages held")
             for x in uk.tolist()]
    inv = inv.reshape(-1)
    o = np.argsort(inv, kind="stable")  # packets of a track together, in time order (the series is)
    return (specs, inv[o], occupancy["t_ns"].to_numpy().astype(np.int64)[o] + ts_shift,
            occupancy["stages_full"].to_numpy().astype(np.int64)[o])


def _encode(sl: _Slices, ct: _Counters, n_slice_tracks: int, first_sequence_id: int = 1,
            clock_offset: int = 0) -> _Hot:
    """Encode the slice and counter packets; one sequence per track (ids counting up from
    ``first_sequence_id``), the busiest tracks getting the smallest ids; timestamps as deltas
    within a track, from a first timestamp per track that ``clock_offset`` moves (_columns)."""
    trk = np.concatenate([sl.track, ct.track])
    ts = np.concatenate([sl.ts, ct.ts])
    n_hot_tracks = n_slice_tracks + len(ct.specs)
    per_track = np.bincount(trk, minlength=n_hot_tracks) if trk.size else np.zeros(n_hot_tracks, np.int64)
    seq_of_track = np.empty(n_hot_tracks, np.int64)
    seq_of_track[np.argsort(-per_track, kind="stable")] = np.arange(first_sequence_id, first_sequence_id + n_hot_tracks)
    first_in_track = np.r_[True, trk[1:] != trk[:-1]] if trk.size else np.zeros(0, bool)
    dts = np.diff(ts, prepend=ts[:1] if ts.size else ts)
    dts[first_in_track] = 0
    t0_of_track = np.zeros(n_hot_tracks, np.int64)
    t0_of_track[trk[first_in_track]] = ts[first_in_track] + clock_offset
    nc = ct.ts.size
    data, ends = encode_hot_packets(
        seq_of_track[trk], dts,
        np.concatenate([sl.type, np.full(nc, TYPE_COUNTER, np.int64)]),
        np.concatenate([sl.name_iid, np.zeros(nc, np.int64)]),
        np.concatenate([sl.iters, np.full(nc, -1, np.int64)]),
        np.concatenate([sl.flow_out, np.zeros(nc, np.int64)]),
        np.concatenate([sl.flow_in, np.zeros(nc, np.int64)]),
        np.concatenate([np.zeros(sl.ts.size, np.int64), ct.value]))
    return _Hot(data, ends, per_track, seq_of_track, t0_of_track)


class _TrackTree:
    """The TrackDescriptor packets of the GPU > [launch] > SM > CTA > warp tree, written in
    order on one sequence; uuids are handed out in the same order."""

    def __init__(self, seq: int, uuid_base: int = UUID_BASE):
        self.seq = seq
        self.packets = bytearray()
        self.count = 0
        self.last_uuid = uuid_base  # the uuid handed out last (uuid_base before the first)

    def add(self, parent: int, name: str, rank: int | None = None, *, process: bool = False,
            counter: bool = False, description: str = "") -> int:
        """One more track under ``parent`` (0: a root); returns its uuid. ``description``: the
        name in full and what the track holds (the Perfetto UI shows it in the track's help
        popup: a long name is cut short on screen)."""
        self.last_uuid += 1
        p = pb.TracePacket()
        p.trusted_packet_sequence_id = self.seq
        td = p.track_descriptor
        td.uuid = self.last_uuid
        if parent:
            td.parent_uuid = parent
        if process:
            td.process.pid = ROOT_PID
            td.process.process_name = name
        td.name = name
        if description:
            td.description = description
        td.sibling_merge_behavior = _NONE
        td.child_ordering = _EXPLICIT
        if rank is not None:
            td.sibling_order_rank = int(rank)
        if counter:
            td.counter.SetInParent()
        self.packets.extend(_packet_bytes(p))
        self.count += 1
        return self.last_uuid


def _track_tree(meta: dict, lay: TrackLayout, specs: list, seq: int,
                place: Placement | None = None) -> tuple[_TrackTree, np.ndarray]:
    """Descriptors of every track; returns the tree and the uuid of each hot track (slice
    tracks in layout order, then the counter tracks of ``specs``). The root is a process of its
    own, or with ``place`` a child of the placement's parent track."""
    tree = _TrackTree(seq, place.uuid_base if place else UUID_BASE)
    if place:
        root = tree.add(place.parent_uuid, place.name, rank=place.rank)
    else:
        gpu = meta.get("gpu") or {}
        gpu_name = gpu.get("name") if isinstance(gpu, dict) else str(gpu)
        kernel = str(meta.get("kernel", "kernel"))
        root = tree.add(0, f"GPU {gpu_name or ''} · {kernel}".replace("GPU  ·", "GPU ·"), process=True,
                        description=f"kernel {kernel}" + (f" on {gpu_name}" if gpu_name else ""))
    launches = np.unique(lay.warp_launch) if lay.warp_launch.size else np.zeros(0, np.int64)
    launch_meta = meta.get("launches") or []
    launch_uuid = {}
    for li in launches.tolist():
        if launches.size > 1:
            lm = launch_meta[li] if 0 <= li < len(launch_meta) and isinstance(launch_meta[li], dict) else {}
            name = f"launch {li}" + (f" · {lm['kernel']}" if lm.get("kernel") else "")
            launch_uuid[li] = tree.add(root, name, rank=li, description=name)
        else:
            launch_uuid[li] = root
    sm_uuid, cta_uuid = {}, {}
    for w in range(lay.warp_sm.size):
        li, sm, cta = int(lay.warp_launch[w]), int(lay.warp_sm[w]), int(lay.warp_cta[w])
        if (li, sm) not in sm_uuid:
            sm_uuid[(li, sm)] = tree.add(launch_uuid[li], f"SM {sm}", rank=sm, description=f"SM {sm}, launch {li}")
        if (li, cta) not in cta_uuid:
            cta_uuid[(li, cta)] = tree.add(sm_uuid[(li, sm)], f"CTA {cta}", rank=cta,
                                           description=f"CTA {cta} on SM {sm}, launch {li}")
    track_uuid = np.zeros(lay.n_tracks + len(specs), np.int64)
    warp_track_uuid = {}
    for tix in range(lay.n_tracks):
        w, c, lane = int(lay.track_warp[tix]), int(lay.track_class[tix]), int(lay.track_lane[tix])
        if c == 0 and lane == 0:
            parent = cta_uuid[(int(lay.warp_launch[w]), int(lay.warp_cta[w]))]
            rank = int(lay.warp_index[w])
        else:
            parent = warp_track_uuid[w]  # tracks are in (warp, class, lane) order: lane 0 of class 0 first
            rank = lay.child_rank(tix)
        track_uuid[tix] = tree.add(parent, lay.track_label(tix), rank=rank, description=lay.track_description(tix))
        if c == 0 and lane == 0:
            warp_track_uuid[w] = int(track_uuid[tix])
    for ci, (kind, li, cta, label) in enumerate(specs):
        parent = launch_uuid[li] if kind == "warps" else cta_uuid[(li, cta)]
        rank = -2 if kind == "occupancy" else -1
        where = f"launch {li}" if kind == "warps" else f"CTA {cta}, launch {li}"
        track_uuid[lay.n_tracks + ci] = tree.add(parent, label, rank=rank, counter=True, description=f"{label} in {where}")
    return tree, track_uuid


def _sequence_setup(r: EventColumns, sl: _Slices, hot: _Hot, track_uuid: np.ndarray, n_slice_tracks: int, *,
                    iterations: bool) -> tuple[bytes, int]:
    """The first packet of every sequence that has packets: its defaults (track uuid, the
    sequence's incremental clock), the names its slices use, and its clock snapshot.
    Returns (bytes, sequences)."""
    n_names = len(r.names) + 1
    pairs = np.unique(sl.track * n_names + r.name[sl.row]) if sl.track.size else np.zeros(0, np.int64)
    names_of_track: dict[int, list[int]] = {}
    for pkey in pairs.tolist():
        names_of_track.setdefault(pkey // n_names, []).append(pkey % n_names)
    setup = bytearray()
    for tix in np.flatnonzero(hot.per_track > 0).tolist():
        p = pb.TracePacket()
        p.trusted_packet_sequence_id = int(hot.seq_of_track[tix])
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
            c.timestamp = int(hot.t0_of_track[tix])
            if inc:
                c.is_incremental = True
        setup.extend(_packet_bytes(p))
    return bytes(setup), int((hot.per_track > 0).sum())


def _write(path_or_file, head: bytes, setup: bytes, hot: _Hot, *, compress: bool, level: int, chunk_bytes: int,
           threads: int | None) -> tuple[int, int]:
    """Descriptors, setup packets, then the hot packets (zlib batches with ``compress``).
    Returns (bytes written, bytes uncompressed)."""
    parts: list = [head, setup]
    if hot.data.size:
        parts.append(memoryview(hot.data))
    if compress:
        parts = _compress(parts, hot.ends, level, chunk_bytes, threads)
    return write_parts(path_or_file, parts), len(head) + len(setup) + int(hot.data.size)


@contextmanager
def _timed(timings: dict, phase: str):
    t = time.perf_counter()
    try:
        yield
    finally:
        timings[phase] = time.perf_counter() - t


# ---- the exporter ----------------------------------------------------------------------------

def to_perfetto(trace, path_or_file, *, occupancy: pa.Table | None = None, compress: bool = False,
                flows: bool = True, iterations: bool = True, counters: bool = True,
                inflight_counters: bool = False, compress_level: int = 5, chunk_bytes: int = CHUNK_BYTES,
                threads: int | None = None, place: Placement | None = None) -> PerfettoStats:
    """Write ``trace`` (a bundle Trace, or anything with ``.events`` and ``.meta``) as a
    Perfetto protobuf trace to a path or a binary file object.

    Tracks are named by the ``role`` column as given: for bundles of automatically traced
    kernels, :func:`fa4trace.analysis.kernel.export_inputs` assigns the roles (and gives the
    ``occupancy`` series) first. occupancy: stage-occupancy step series (rows of
    :func:`fa4trace.analysis.kernel.occupancy_series`: launch, cta, pipeline, t_ns, stages_full),
    drawn as a "<pipeline> stages held" counter per CTA and pipeline; None: none.
    compress: wrap the packets in zlib ``compressed_packets`` batches of ~chunk_bytes.
    flows: QK(i) -> SOFTMAX(i) -> PV(i) flow arrows. iterations: ``iter`` debug annotation.
    counters: a "warps active" counter per launch, and the occupancy counters (False: no
    counter at all). inflight_counters: an "async in flight" counter per CTA (two more packets
    per async span: off by default, it costs bytes). place: write the export as part of a
    larger trace (:class:`Placement`); None: a trace of its own.
    """
    t_all = time.perf_counter()
    tm: dict = {}
    meta: dict = dict(getattr(trace, "meta", {}) or {})
    with _timed(tm, "layout"):
        r, lay, data_shift, clock_offset = _columns(trace.events, vocab_of(meta), place)
    with _timed(tm, "stream"):
        first_flow = place.first_flow_id if place else 1
        sl = _slices(r, lay, flows=flows, iterations=iterations, first_flow_id=first_flow)
    with _timed(tm, "counters"):
        ct = _counters(r, lay, occupancy if counters else None, data_shift, warps=counters, inflight=inflight_counters)
    with _timed(tm, "encode"):
        first_seq = place.first_sequence_id if place else 1
        hot = _encode(sl, ct, lay.n_tracks, first_seq, clock_offset)
    with _timed(tm, "descriptors"):
        tree, track_uuid = _track_tree(meta, lay, ct.specs, seq=first_seq + hot.per_track.size, place=place)
        setup, n_seq = _sequence_setup(r, sl, hot, track_uuid, lay.n_tracks, iterations=iterations)
    with _timed(tm, "write"):
        written, uncompressed = _write(path_or_file, bytes(tree.packets), setup, hot, compress=compress,
                                       level=compress_level, chunk_bytes=chunk_bytes, threads=threads)
    n_hot = int(hot.ends.size)
    return PerfettoStats(
        slices=int(r.n), packets=tree.count + n_seq + n_hot, hot_packets=n_hot,
        tracks=tree.count, slice_tracks=lay.n_tracks,
        extra_lanes=int((lay.track_lane > 0).sum()), sequences=n_seq, flows=sl.n_flows,
        counter_points=int(ct.ts.size), bytes=written, bytes_uncompressed=uncompressed,
        compressed=bool(compress), seconds=time.perf_counter() - t_all, lane_rounds=lay.lane_rounds,
        timings=tm, next_uuid=tree.last_uuid + 1, next_sequence_id=tree.seq + 1,
        next_flow_id=first_flow + sl.n_flows)


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


