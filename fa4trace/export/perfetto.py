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
The export runs in phases, one function each: columns and layout (:func:`_columns`), the flows
(:func:`_flow_rows`), the counter tracks (:func:`_counters`), the slice and counter packets
(:func:`_encode`: ordered and encoded a chunk of whole warps at a time, so that the arrays stay
in cache), the track tree (:func:`_track_tree`) and each sequence's first packet
(:func:`_sequence_setup`), then the write (:func:`_write`).

Placed inside a larger trace (``place=``, a :class:`Placement`: fa4trace.profiler.merge puts
each traced launch under its kernel's slice in a torch.profiler trace), the root is a child
track of a given parent instead of a process, track uuids, sequence ids and flow ids start where
the placement says, and every timestamp is moved by its offset; :class:`PerfettoStats` says
which ids the export left unused.

Each row of the events table becomes exactly one slice: a span or WARP row -> BEGIN + END
(zero-length spans too), an instant -> INSTANT. So "BEGIN + INSTANT events on slice tracks"
equals the Arrow row count; counter tracks carry COUNTER events only.

Iteration: a debug annotation ``iter`` (interned name, int value) on the BEGIN/INSTANT of every
row with ``iter >= 0``; it shows in the slice details and as ``args.iter`` in SQL.

Flows: QK(i) -> SOFTMAX(i) and SOFTMAX(i) -> PV(i) within one warp (same launch, CTA, warp and
iteration), one flow id per edge: ``flow_ids`` on the source's BEGIN, ``terminating_flow_ids``
on the destination's BEGIN. An edge is drawn only where the source begins strictly before the
destination (the trace processor reads events in time order).

Packets. Every packet is written by :mod:`fa4trace.export.packets`, the one packet writer of
this export and of the merge with torch.profiler traces (fa4trace.profiler): track
descriptors, one packet sequence per track whose first packet carries
``trace_packet_defaults`` (track_uuid, a sequence-scoped incremental clock) plus the interned
names and a clock snapshot, and the per-event packets encoded in bulk with numpy-vectorized
varints (a pb2 object per packet is far slower); they then hold only a delta timestamp, the
sequence id, the type, the name iid and the optional iter/flow fields. ``compress=True`` wraps
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
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa

from ..format.vocab import Vocabulary
from ..trace.meta import BundleMeta, LaunchMeta
from ._io import write_parts
from .packets import (ANNOTATION_IID, CHUNK_BYTES, TYPE_COUNTER, TYPE_END, HotPackets, compress_packets,
                      counter_points, descriptor, join_hot_packets, sequence_start, slice_events, track_names,
                      track_packets)
from .tracks import EventColumns, TrackLayout, event_columns, layout_tracks, vocab_of

__all__ = ["to_perfetto", "PerfettoStats", "Placement"]

UUID_BASE = 0xFA4 << 48  # track uuids: UUID_BASE + n (only descriptors carry them)
ROOT_PID = 0xFA4  # pid of the process-like GPU root track


# ---- event stream ----------------------------------------------------------------------------

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
class _FlowRows:
    """The flow ids of the rows: per row the id of the arrow that leaves it and of the one that
    ends on it (0: none); None where the export draws no flow."""

    out: np.ndarray | None
    into: np.ndarray | None
    n: int


@dataclass
class _Counters:
    """Counter tracks (numbered after the slice tracks) and their points, track by track."""

    specs: list  # (kind, launch, cta, track name) per counter track
    track: np.ndarray
    ts: np.ndarray
    value: np.ndarray


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


def _flow_rows(r: EventColumns, lay: TrackLayout, *, flows: bool, first_flow_id: int = 1) -> _FlowRows:
    """Flow ids (counting up from ``first_flow_id``) on the rows the arrows leave and reach."""
    if not (flows and r.n):
        return _FlowRows(None, None, 0)
    src, dst = _flows(r, lay.row_warp)
    if not src.size:
        return _FlowRows(None, None, 0)
    fo, fi = np.zeros(r.n, np.int64), np.zeros(r.n, np.int64)
    ids = np.arange(first_flow_id, first_flow_id + src.size, dtype=np.int64)
    fo[src] = ids
    fi[dst] = ids
    return _FlowRows(fo, fi, int(src.size))


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
    k, t, v = counter_points(np.concatenate([lk, lk]), np.concatenate([r.start[wr], r.end[wr]]),
                              np.concatenate([np.ones(wr.size, np.int64), -np.ones(wr.size, np.int64)]))
    return [("warps", int(x), -1, "warps active") for x in launches.tolist()], k, t, v


def _inflight_counter(r: EventColumns, lay: TrackLayout):
    """"async in flight" per CTA, from the spans on async tracks: (specs, track, ts, value) or None."""
    ar = np.flatnonzero((r.kind == 0) & (lay.track_class[lay.row_track] > 0))
    if not ar.size:
        return None
    uk, inv = np.unique((r.launch[ar] << 32) | r.cta[ar], return_inverse=True)
    inv = inv.reshape(-1)
    k, t, v = counter_points(np.concatenate([inv, inv]), np.concatenate([r.start[ar], r.end[ar]]),
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


ENCODE_CHUNK_ROWS = 1 << 17  # rows encoded at a time (whole warps): arrays of a few MB stay in cache


def _chunks(lay: TrackLayout) -> list[tuple[int, int]]:
    """Row ranges [a, b) of whole warps, ~ENCODE_CHUNK_ROWS rows each, whose tracks hold no row
    outside them: where the rows come warp by warp (the decoder writes them so), else one."""
    n = lay.row_warp.size
    if n <= ENCODE_CHUNK_ROWS or not bool((lay.row_warp[1:] >= lay.row_warp[:-1]).all()):
        return [(0, n)]
    starts = np.flatnonzero(np.r_[True, lay.row_warp[1:] != lay.row_warp[:-1]])
    cut = np.unique(starts[np.searchsorted(starts, np.arange(ENCODE_CHUNK_ROWS, n, ENCODE_CHUNK_ROWS))
                           .clip(0, starts.size - 1)])
    bounds = np.r_[0, cut[(cut > 0) & (cut < n)], n]
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def _encode(r: EventColumns, lay: TrackLayout, fl: _FlowRows, ct: _Counters, *, iterations: bool,
            first_sequence_id: int = 1, clock_offset: int = 0) -> tuple[HotPackets, np.ndarray]:
    """The slice and counter packets, encoded; one sequence per hot track (slice tracks, then
    counter tracks; ids counting up from ``first_sequence_id``), the busiest tracks getting the
    smallest ids; timestamps as deltas within a track, from a first timestamp per track that
    ``clock_offset`` moves (_columns). Slices carry their name, the ``iter`` annotation and
    their flow ids on BEGIN / INSTANT. The rows are ordered into events and encoded a chunk of
    whole warps at a time (:func:`_chunks`). Returns the packets and each hot track's sequence id."""
    n_hot_tracks = lay.n_tracks + len(ct.specs)
    per_track = np.zeros(n_hot_tracks, np.int64)  # a row is BEGIN + END, an instant one INSTANT
    if r.n:
        per_track[:lay.n_tracks] = np.bincount(lay.row_track, weights=np.where(r.kind == 1, 1, 2),
                                               minlength=lay.n_tracks).astype(np.int64)
    if ct.track.size:
        per_track += np.bincount(ct.track, minlength=n_hot_tracks)
    seq_of_track = np.empty(n_hot_tracks, np.int64)
    seq_of_track[np.argsort(-per_track, kind="stable")] = np.arange(first_sequence_id, first_sequence_id + n_hot_tracks)
    parts = []
    for a, b in (_chunks(lay) if r.n else []):
        trk, ts, typ, row = slice_events(lay.row_track[a:b], r.start[a:b], r.end[a:b], r.kind[a:b] == 1,
                                         lay.rank[a:b] - a)
        row += a
        carries = typ != TYPE_END
        parts.append(track_packets(
            trk, ts, typ, seq_of_track, name_iid=np.where(carries, r.name[row] + 1, 0),
            annotation=np.where(carries, r.iter[row], -1) if iterations else None,
            flow_out=None if fl.out is None else np.where(carries, fl.out[row], 0),
            flow_in=None if fl.into is None else np.where(carries, fl.into[row], 0), clock_offset=clock_offset))
    if ct.ts.size:
        parts.append(track_packets(ct.track, ct.ts, np.full(ct.ts.size, TYPE_COUNTER, np.int64), seq_of_track,
                                   counter=ct.value, clock_offset=clock_offset))
    return join_hot_packets(parts, n_hot_tracks), seq_of_track


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
        self.packets += descriptor(self.last_uuid, name, self.seq, parent=parent, rank=rank,
                                   pid=ROOT_PID if process else None, description=description, counter=counter)
        self.count += 1
        return self.last_uuid


def _track_tree(meta: dict, lay: TrackLayout, specs: list, seq: int,
                place: Placement | None = None) -> tuple[_TrackTree, np.ndarray]:
    """Descriptors of every track; returns the tree and the uuid of each hot track (slice
    tracks in layout order, then the counter tracks of ``specs``). The root is a process of its
    own, or with ``place`` a child of the placement's parent track."""
    tree = _TrackTree(seq, place.uuid_base if place else UUID_BASE)
    info = BundleMeta.from_meta(meta)
    if place:
        root = tree.add(place.parent_uuid, place.name, rank=place.rank)
    else:
        gpu_name = info.gpu.name
        kernel = str(info.kernel if info.has("kernel") else "kernel")
        root = tree.add(0, f"GPU {gpu_name or ''} · {kernel}".replace("GPU  ·", "GPU ·"), process=True,
                        description=f"kernel {kernel}" + (f" on {gpu_name}" if gpu_name else ""))
    launches = np.unique(lay.warp_launch) if lay.warp_launch.size else np.zeros(0, np.int64)
    launch_meta = info.launches
    launch_uuid = {}
    for li in launches.tolist():
        if launches.size > 1:
            lm = launch_meta[li] if 0 <= li < len(launch_meta) else LaunchMeta()
            name = f"launch {li}" + (f" · {lm.kernel}" if lm.kernel else "")
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


def _sequence_setup(r: EventColumns, lay: TrackLayout, hot: HotPackets, seq_of_track: np.ndarray,
                    track_uuid: np.ndarray, *, iterations: bool) -> tuple[bytes, int]:
    """The first packet of every sequence that has packets (fa4trace.export.packets.sequence_start):
    its track, the names its slices use (and "iter"), its clock's start. Returns (bytes, sequences)."""
    n_names = len(r.names) + 1
    pairs = track_names(lay.row_track, r.name, lay.n_tracks, n_names)
    names_of_track: dict[int, list] = {}
    for pkey in pairs.tolist():
        code = pkey % n_names
        names_of_track.setdefault(pkey // n_names, []).append((code + 1, r.names[code]))
    ann = ((ANNOTATION_IID, "iter"),) if iterations else ()
    setup = bytearray()
    used = np.flatnonzero(hot.per_track > 0)
    for tix, seq, uuid, t0 in zip(used.tolist(), seq_of_track[used].tolist(), track_uuid[used].tolist(),
                                  hot.t0_of_track[used].tolist()):
        if tix < lay.n_tracks:
            setup += sequence_start(seq, uuid, t0, names_of_track.get(tix, ()), ann)
        else:
            setup += sequence_start(seq, uuid, t0)
    return bytes(setup), int(used.size)


def _write(path_or_file, head: bytes, setup: bytes, hot: HotPackets, *, compress: bool, level: int,
           chunk_bytes: int, threads: int | None) -> tuple[int, int]:
    """Descriptors, setup packets, then the hot packets (zlib batches with ``compress``).
    Returns (bytes written, bytes uncompressed)."""
    parts: list = [head, setup]
    if hot.data.size:
        parts.append(memoryview(hot.data))
    if compress:
        parts = compress_packets([head + setup, parts[2] if len(parts) > 2 else b""], level, chunk_bytes, threads,
                                 ends=hot.ends)
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
    with _timed(tm, "flows"):
        first_flow = place.first_flow_id if place else 1
        fl = _flow_rows(r, lay, flows=flows, first_flow_id=first_flow)
    with _timed(tm, "counters"):
        ct = _counters(r, lay, occupancy if counters else None, data_shift, warps=counters, inflight=inflight_counters)
    with _timed(tm, "encode"):
        first_seq = place.first_sequence_id if place else 1
        hot, seq_of_track = _encode(r, lay, fl, ct, iterations=iterations, first_sequence_id=first_seq,
                                    clock_offset=clock_offset)
    with _timed(tm, "descriptors"):
        tree, track_uuid = _track_tree(meta, lay, ct.specs, seq=first_seq + hot.per_track.size, place=place)
        setup, n_seq = _sequence_setup(r, lay, hot, seq_of_track, track_uuid, iterations=iterations)
    with _timed(tm, "write"):
        written, uncompressed = _write(path_or_file, bytes(tree.packets), setup, hot, compress=compress,
                                       level=compress_level, chunk_bytes=chunk_bytes, threads=threads)
    n_hot = int(hot.ends.size)
    return PerfettoStats(
        slices=int(r.n), packets=tree.count + n_seq + n_hot, hot_packets=n_hot,
        tracks=tree.count, slice_tracks=lay.n_tracks,
        extra_lanes=int((lay.track_lane > 0).sum()), sequences=n_seq, flows=fl.n,
        counter_points=int(ct.ts.size), bytes=written, bytes_uncompressed=uncompressed,
        compressed=bool(compress), seconds=time.perf_counter() - t_all, lane_rounds=lay.lane_rounds,
        timings=tm, next_uuid=tree.last_uuid + 1, next_sequence_id=tree.seq + 1,
        next_flow_id=first_flow + fl.n)
