"""Perfetto TracePackets, written one way for every fa4trace trace: the bundle export
(:mod:`fa4trace.export.perfetto`) and the merge with torch.profiler traces
(:mod:`fa4trace.profiler`) both write their packets here.

A trace file is the concatenation of ``Trace.packet`` fields (tag, length, TracePacket), so
packets made apart are joined by concatenating their bytes. What is here:

* **Track descriptors** (:func:`descriptor`): a process, a thread or a track below a parent, a
  counter track; never merged with same-named siblings, children in explicit order, and the
  track's name in full with what it holds as its ``description`` (the Perfetto UI cuts a long
  name short and shows the description in the track's help popup).
* **Sequences and clocks**: one packet sequence per track, so a hot packet needs no track uuid.
  A sequence's first packet (:func:`sequence_start`) carries ``trace_packet_defaults`` (the
  track uuid, a sequence-scoped incremental clock), the names its events use (interned: a hot
  packet carries a small iid) and a clock snapshot that starts that clock at the track's first
  timestamp; each hot packet then carries only its time since the previous one on its track
  (:func:`track_deltas`).
* **Slices, flows and counters**: :func:`slice_events` orders BEGIN / END / INSTANT events with
  valid nesting tie-breaks, :func:`flow_fields` puts flow ids on the slices an arrow leaves and
  reaches, :func:`counter_points` turns +1 / -1 changes into a step counter's points, and
  :func:`encode_hot_packets` encodes all of them in bulk (numpy-vectorized varints: a pb2
  object per packet is far slower).
* **Compression**: :func:`compress_packets` wraps ~1 MiB batches of packets in
  ``compressed_packets`` (zlib, as Perfetto's own service does), on a thread pool (zlib drops
  the GIL).

The rare packets (descriptors, sequence starts: thousands per launch of a million rows) are
built with the ``perfetto`` package's pb2 classes; the hot ones are encoded here, with field
numbers read from the pb2 descriptors (a renumbering would be caught).

Wire details of the hot packets: ``flow_ids_old`` / ``terminating_flow_ids_old`` are the varint
twins of ``flow_ids`` / ``terminating_flow_ids`` (fixed64: 8 bytes per id); the trace processor
reads both, the varint form costs 3 bytes per id instead of 8. Hot packets do not set
``SEQ_NEEDS_INCREMENTAL_STATE`` (2 bytes each): that flag only lets a reader skip packets after
data loss, which a file written in one go has none of.
"""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from .tracks import key_order, sorted_runs_order, stable_order

__all__ = ["TYPE_BEGIN", "TYPE_END", "TYPE_INSTANT", "TYPE_COUNTER", "CLOCK_BOOTTIME", "CLOCK_SEQ", "ANNOTATION_IID",
           "CHUNK_BYTES", "varint", "framed", "packet", "descriptor", "sequence_start", "slice_events", "flow_fields",
           "counter_points", "track_names", "track_deltas", "HotPackets", "track_packets", "join_hot_packets",
           "encode_hot_packets", "compress_packets"]

TYPE_BEGIN = pb.TrackEvent.TYPE_SLICE_BEGIN
TYPE_END = pb.TrackEvent.TYPE_SLICE_END
TYPE_INSTANT = pb.TrackEvent.TYPE_INSTANT
TYPE_COUNTER = pb.TrackEvent.TYPE_COUNTER

CLOCK_BOOTTIME = 6  # BuiltinClocks.BOOTTIME: the trace clock when no other is named
CLOCK_SEQ = 64  # first sequence-scoped user clock id; ours is incremental
ANNOTATION_IID = 1  # iid of the one debug annotation name a sequence interns ("iter", "correlation")
CHUNK_BYTES = 1 << 20  # uncompressed bytes per compressed_packets batch


# ---- varints and tags ------------------------------------------------------------------------

def varint(v: int) -> bytes:
    """A protobuf varint; a negative int as its 64-bit two's complement (as int32/int64 fields are)."""
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fnum(msg, name: str) -> int:
    return msg.DESCRIPTOR.fields_by_name[name].number


_VARINT, _LEN = 0, 2


def _tag(msg, name: str, wire: int) -> bytes:
    return varint((_fnum(msg, name) << 3) | wire)


_T_PACKET = _tag(pb.Trace, "packet", _LEN)
# hot packets
_T_TS = _tag(pb.TracePacket, "timestamp", _VARINT)
_T_SEQ = _tag(pb.TracePacket, "trusted_packet_sequence_id", _VARINT)
_T_TE = _tag(pb.TracePacket, "track_event", _LEN)
_T_TYPE = _tag(pb.TrackEvent, "type", _VARINT)
_T_NAME_IID = _tag(pb.TrackEvent, "name_iid", _VARINT)
_T_DEBUG = _tag(pb.TrackEvent, "debug_annotations", _LEN)
_T_DA_NAME_IID = _tag(pb.DebugAnnotation, "name_iid", _VARINT)
_T_DA_INT = _tag(pb.DebugAnnotation, "int_value", _VARINT)
_T_FLOW = _tag(pb.TrackEvent, "flow_ids_old", _VARINT)
_T_TERM_FLOW = _tag(pb.TrackEvent, "terminating_flow_ids_old", _VARINT)
_T_COUNTER = _tag(pb.TrackEvent, "counter_value", _VARINT)
_T_COMPRESSED = _tag(pb.TracePacket, "compressed_packets", _LEN)


def framed(body: bytes) -> bytes:
    """A serialized TracePacket as a ``Trace.packet`` field: what a trace file is made of."""
    return _T_PACKET + varint(len(body)) + body


def packet(p: pb.TracePacket) -> bytes:
    """A pb2 TracePacket as a ``Trace.packet`` field (for the few packets written as objects)."""
    return framed(p.SerializeToString())


# ---- track descriptors -----------------------------------------------------------------------

_NO_MERGE = pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_NONE
_EXPLICIT = pb.TrackDescriptor.EXPLICIT


def descriptor(uuid: int, name: str, seq: int, *, parent: int = 0, rank: int | None = None, pid=None, tid=None,
               process_name: str | None = None, description: str = "", counter: bool = False) -> bytes:
    """A track's descriptor packet on sequence ``seq``: a process (``pid``), a thread (``pid``
    and ``tid``) or a track below ``parent`` (0: a root), a counter track with ``counter``.
    Children in explicit order (``rank``), never merged with same-named siblings;
    ``description``: the name in full and what the track holds (empty: none)."""
    p = pb.TracePacket()
    p.trusted_packet_sequence_id = seq
    td = p.track_descriptor
    td.uuid = uuid
    if parent:
        td.parent_uuid = parent
    if pid is not None and tid is None:
        td.process.pid = int(pid)
        td.process.process_name = process_name or name
    if tid is not None:
        td.thread.pid = int(pid)
        td.thread.tid = int(tid)
        td.thread.thread_name = name
    td.name = name
    if description:
        td.description = description
    td.sibling_merge_behavior = _NO_MERGE
    td.child_ordering = _EXPLICIT
    if rank is not None:
        td.sibling_order_rank = int(rank)
    if counter:
        td.counter.SetInParent()
    return packet(p)


# ---- sequence starts -------------------------------------------------------------------------

def sequence_start(seq: int, track_uuid: int, t0: int, event_names=(), annotation_names=()) -> bytes:
    """The first packet of a track's sequence: it clears the sequence's state, makes the track
    and the sequence's incremental clock the defaults of the packets after it, interns the
    names they use (``event_names`` / ``annotation_names``: (iid, name) pairs) and starts the
    clock at ``t0`` (ns, the trace clock)."""
    p = pb.TracePacket()
    p.trusted_packet_sequence_id = seq
    p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    p.first_packet_on_sequence = True
    p.trace_packet_defaults.timestamp_clock_id = CLOCK_SEQ
    p.trace_packet_defaults.track_event_defaults.track_uuid = track_uuid
    if event_names:
        names = p.interned_data.event_names
        for iid, nm in event_names:
            en = names.add()
            en.iid = iid
            en.name = nm
    if annotation_names:
        names = p.interned_data.debug_annotation_names
        for iid, nm in annotation_names:
            dn = names.add()
            dn.iid = iid
            dn.name = nm
    clocks = p.clock_snapshot.clocks
    c = clocks.add()
    c.clock_id = CLOCK_BOOTTIME
    c.timestamp = t0
    c = clocks.add()
    c.clock_id = CLOCK_SEQ
    c.timestamp = t0
    c.is_incremental = True
    return packet(p)


# ---- event streams ---------------------------------------------------------------------------

def slice_events(row_track: np.ndarray, start: np.ndarray, end: np.ndarray, instant: np.ndarray,
                 rank: np.ndarray):
    """All BEGIN/END/INSTANT events of a table's rows, ordered by (track, time) with valid
    nesting tie-breaks.

    Per row: its track (``TrackLayout.row_track`` of :func:`fa4trace.export.tracks.layout_tracks`),
    start and end ns (non-negative), whether it is an instant, and its rank (``TrackLayout.rank``:
    (track group, start, -end) order). A span becomes BEGIN + END (a zero-length one too,
    adjacent), an instant INSTANT; at equal times ENDs come first, inner spans end first and
    outer ones begin first. Returns (track, ts, type, row).
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
    trk = row_track[rows]
    o = _event_order(trk, ts, e_rows.size, rep.size)
    return trk[o], ts[o], typ[o], rows[o]


def _event_order(trk: np.ndarray, ts: np.ndarray, n_end: int, n_zero: int) -> np.ndarray:
    """The stable order by (track, time, phase) of [ENDs in reverse rank order, zero-length
    spans and instants in rank order, BEGINs in rank order] (phases 0, 1, 2): the ENDs sorted
    alone, the other two parts radix-sorted by track (in rank order their times ascend within a
    track), then the three sorted runs merged."""
    n = trk.size
    if n == 0:
        return np.zeros(0, np.int64)
    bn = (int(ts.max()) * 4 + 3).bit_length()
    phase = np.repeat(np.array([0, 1, 2], np.int64), [n_end, n_zero, n - n_end - n_zero])
    if int(trk.max()).bit_length() + bn > 63:
        return stable_order(trk, ts * 4 + phase)
    key = (trk << bn) | (ts * 4 + phase)
    parts, keys = [], []
    for a, b, sort in ((0, n_end, True), (n_end, n_end + n_zero, False), (n_end + n_zero, n, False)):
        o = (np.argsort(key[a:b], kind="stable") if sort else key_order(trk[a:b])) + a
        parts.append(o)
        keys.append(key[o])
    return np.concatenate(parts)[sorted_runs_order(*keys)]


def flow_fields(typ: np.ndarray, row: np.ndarray, n_rows: int, src: np.ndarray, dst: np.ndarray, first_id: int,
                extra_out: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per event of a stream (``typ``, ``row`` as :func:`slice_events` gives them) the flow id
    that leaves it and the one that ends on it (0: none): the arrow ``src[k]`` -> ``dst[k]``
    (rows) gets id ``first_id + k``, on the BEGIN (or INSTANT) of each row; ``extra_out``:
    {row: id} of arrows leaving a row whose id was handed out elsewhere."""
    fo_row = np.zeros(n_rows, np.int64)
    fi_row = np.zeros(n_rows, np.int64)
    ids = np.arange(first_id, first_id + src.size, dtype=np.int64)
    fo_row[src] = ids
    fi_row[dst] = ids
    for r, fid in (extra_out or {}).items():
        fo_row[r] = fid
    carries = typ != TYPE_END
    return np.where(carries, fo_row[row], 0), np.where(carries, fi_row[row], 0)


def counter_points(key: np.ndarray, ts: np.ndarray, delta: np.ndarray):
    """A step counter per key from +1 / -1 changes: per key, the value after all changes at
    each time. Returns (key, ts, value), key by key in time order."""
    o = stable_order(key, ts * 2 + (delta > 0))
    k, t, dl = key[o], ts[o], delta[o]
    val = np.cumsum(dl)
    seg_start = np.r_[True, k[1:] != k[:-1]] if k.size else np.zeros(0, bool)
    seg = np.cumsum(seg_start) - 1
    val = val - (val - dl)[seg_start][seg]
    last = np.r_[(k[1:] != k[:-1]) | (t[1:] != t[:-1]), True] if k.size else np.zeros(0, bool)
    return k[last], t[last], val[last]


def track_names(track: np.ndarray, name: np.ndarray, n_tracks: int, n_names: int) -> np.ndarray:
    """The (track, name) pairs that occur, as ``track * n_names + name``, ascending: the names
    each track's sequence interns."""
    if track.size == 0:
        return np.zeros(0, np.int64)
    key = track.astype(np.int64) * n_names + name
    if n_tracks * n_names <= 8 * track.size:  # a table of every pair is small: count, no sort
        return np.flatnonzero(np.bincount(key, minlength=n_tracks * n_names))
    return np.unique(key)


def track_deltas(track: np.ndarray, ts: np.ndarray, n_tracks: int) -> tuple[np.ndarray, np.ndarray]:
    """Each event's time since the previous one on its track (0 for a track's first: its
    sequence's clock starts there), and each track's first time (0 where it has no event).
    ``track`` groups the events (each track's events together, in time order)."""
    first = np.r_[True, track[1:] != track[:-1]] if track.size else np.zeros(0, bool)
    dts = np.diff(ts, prepend=ts[:1]) if ts.size else ts.copy()
    dts[first] = 0
    t0 = np.zeros(n_tracks, np.int64)
    t0[track[first]] = ts[first]
    return dts, t0


# ---- hot packets -----------------------------------------------------------------------------

@dataclass
class HotPackets:
    """Per-event packets, encoded, with what the sequence starts need to know of them."""

    data: np.ndarray  # the bytes (uint8)
    ends: np.ndarray  # end offset of each packet
    per_track: np.ndarray  # packets per track
    t0_of_track: np.ndarray  # first timestamp of each track (its clock's start), clock offset included


def track_packets(track: np.ndarray, ts: np.ndarray, typ: np.ndarray, seq_of_track: np.ndarray, *,
                  name_iid: np.ndarray | None = None, annotation: np.ndarray | None = None,
                  flow_out: np.ndarray | None = None, flow_in: np.ndarray | None = None,
                  counter: np.ndarray | None = None, clock_offset: int = 0) -> HotPackets:
    """The hot packets of events grouped by track (each track's events together, in time
    order), one sequence per track (``seq_of_track``): times as deltas on the track's
    sequence clock, which starts at its first event's time + ``clock_offset``. Per event,
    optional: the interned name's iid (0: none), the annotation's value (< 0: none), the flow
    ids leaving and ending on it (0: none), the counter value (read where typ is COUNTER)."""
    n = track.size
    n_tracks = seq_of_track.size
    per_track = np.bincount(track, minlength=n_tracks) if n else np.zeros(n_tracks, np.int64)
    dts, t0 = track_deltas(track, ts, n_tracks)
    t0[per_track > 0] += clock_offset
    zeros = np.zeros(n, np.int64)
    data, ends = encode_hot_packets(
        seq_of_track[track], dts, typ, zeros if name_iid is None else name_iid,
        np.full(n, -1, np.int64) if annotation is None else annotation, zeros if flow_out is None else flow_out,
        zeros if flow_in is None else flow_in, zeros if counter is None else counter)
    return HotPackets(data, ends, per_track, t0)


def join_hot_packets(parts: list, n_tracks: int) -> HotPackets:
    """The hot packets of several :func:`track_packets` calls (on disjoint tracks), one after
    the other."""
    if len(parts) == 1:
        return parts[0]
    data = np.concatenate([p.data for p in parts]) if parts else np.zeros(0, np.uint8)
    offsets = np.cumsum([0] + [p.data.size for p in parts[:-1]])
    ends = np.concatenate([p.ends + o for p, o in zip(parts, offsets)]) if parts else np.zeros(0, np.int64)
    per_track = np.zeros(n_tracks, np.int64)
    t0 = np.zeros(n_tracks, np.int64)
    for p in parts:
        per_track += p.per_track
        t0 += p.t0_of_track
    return HotPackets(data, ends, per_track, t0)


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
        self.end = np.cumsum(lengths, dtype=np.intp)  # the index type: a scatter of int32 positions converts them
        self.off = self.end - lengths.astype(np.intp)
        self.buf = np.empty(total, np.uint8)
        self.cur = self.off.copy()

    def fields(self, items, sel: np.ndarray | None = None):
        buf = self.buf
        pos = self.cur.copy() if sel is None else self.cur[sel]
        for tag, v, vl in items:
            for j, b in enumerate(tag):
                if j:
                    buf[pos + j] = b
                else:
                    buf[pos] = b
            pos += len(tag)
            if v is None or v.size == 0:
                continue
            if int(v.max()) < 0x80:
                buf[pos] = v
                pos += 1
                continue
            # byte j of every varint at once; those all varints have are stored without a selection
            lmin, lmax = int(vl.min()), int(vl.max())
            x = v
            for j in range(lmax):
                byte = (x & 0x7F).astype(np.uint8)
                if j + 1 < lmax:
                    x = x >> 7
                    if j + 1 < lmin:
                        byte |= 0x80
                    else:
                        byte |= (x != 0).view(np.uint8) << 7
                if j < lmin:
                    buf[pos + j if j else pos] = byte
                else:
                    m = np.flatnonzero(vl > j)
                    buf[pos[m] + j] = byte[m]
            pos += lmin if lmin == lmax else vl
        if sel is None:
            self.cur = pos
        else:
            self.cur[sel] = pos


def _uarr(x: np.ndarray) -> np.ndarray:
    """int64 -> the narrowest of uint32/uint64 that holds it (negatives as 64-bit two's complement)."""
    if x.size and (x.min() < 0 or x.max() >= 2**32):
        return x.astype(np.int64).view(np.uint64)
    return x.astype(np.uint32)


def encode_hot_packets(seq, dts, typ, name_iid, annotation, flow_out, flow_in, cval) -> tuple[np.ndarray, np.ndarray]:
    """Encode hot TracePackets as ``Trace.packet`` fields. Returns (bytes, packet end offsets).

    All inputs are per packet (int64): the sequence id, the delta timestamp on the sequence's
    incremental clock, the TrackEvent type, the interned name's iid (0: none), the value of the
    sequence's interned debug annotation (iid :data:`ANNOTATION_IID`; < 0: none), the flow ids
    leaving and ending on the event (0: none), the counter value (read where typ is COUNTER).
    """
    has_name = np.flatnonzero(name_iid > 0)
    has_ann = np.flatnonzero(annotation >= 0)
    has_fo = np.flatnonzero(flow_out > 0)
    has_fi = np.flatnonzero(flow_in > 0)
    has_cv = np.flatnonzero(typ == TYPE_COUNTER)
    seq_u, dts_u, typ_u = _uarr(seq), _uarr(dts), _uarr(typ)
    name_u, ann_u = _uarr(name_iid[has_name]), _uarr(annotation[has_ann])
    fo_u, fi_u, cv_u = _uarr(flow_out[has_fo]), _uarr(flow_in[has_fi]), _uarr(cval[has_cv])
    l_seq, l_dts, l_typ = _vlen(seq_u), _vlen(dts_u), _vlen(typ_u)
    l_name, l_ann, l_fo, l_fi, l_cv = _vlen(name_u), _vlen(ann_u), _vlen(fo_u), _vlen(fi_u), _vlen(cv_u)
    iid_u = np.full(has_ann.size, ANNOTATION_IID, np.uint32)
    l_iid = _vlen(iid_u)
    da_u = (len(_T_DA_NAME_IID) + l_iid + len(_T_DA_INT) + l_ann).astype(np.uint32)
    l_da = _vlen(da_u)

    te = (len(_T_TYPE) + l_typ).astype(np.int32)
    te[has_name] += len(_T_NAME_IID) + l_name
    te[has_ann] += len(_T_DEBUG) + l_da + da_u.astype(np.int32)
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
    if has_ann.size:
        enc.fields([(_T_DEBUG, da_u, l_da), (_T_DA_NAME_IID, iid_u, l_iid), (_T_DA_INT, ann_u, l_ann)], has_ann)
    if has_fo.size:
        enc.fields([(_T_FLOW, fo_u, l_fo)], has_fo)
    if has_fi.size:
        enc.fields([(_T_TERM_FLOW, fi_u, l_fi)], has_fi)
    if has_cv.size:
        enc.fields([(_T_COUNTER, cv_u, l_cv)], has_cv)
    if not np.array_equal(enc.cur, enc.end):
        raise AssertionError("perfetto packet encoder: field lengths and bytes written disagree")
    return enc.buf, enc.end.astype(np.int64)


# ---- compression -----------------------------------------------------------------------------

def compress_packets(parts: list, level: int = 5, chunk_bytes: int = CHUNK_BYTES, threads: int | None = None,
                     ends: np.ndarray | None = None) -> list:
    """The packets of ``parts`` (bytes-like, each whole packets) in ``compressed_packets``
    batches of about ``chunk_bytes`` cut at packet ends; ``ends``: the packet end offsets of the
    last part where known (its packets are not walked then). Returns the batches' bytes."""
    chunks = []
    for i, part in enumerate(parts):
        mv = memoryview(part).cast("B")
        pe = ends if (ends is not None and i == len(parts) - 1) else _packet_ends(mv)
        chunks += [mv[a:b] for a, b in _cuts(pe, chunk_bytes)]
    workers = threads or min(8, os.cpu_count() or 1)

    def comp(c):
        return zlib.compress(c, level)

    if workers > 1 and len(chunks) > 1:
        with ThreadPoolExecutor(workers) as ex:
            blobs = list(ex.map(comp, chunks))
    else:
        blobs = [comp(c) for c in chunks]
    out = []
    for b in blobs:
        body = _T_COMPRESSED + varint(len(b))
        out.append(_T_PACKET + varint(len(body) + len(b)) + body)
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


def _packet_ends(buf) -> np.ndarray:
    """End offsets of the Trace.packet fields in a (small) serialized Trace."""
    ends = []
    pos, n = 0, len(buf)
    while pos < n:
        pos += len(_T_PACKET)
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
