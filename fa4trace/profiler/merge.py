"""One Perfetto trace from a torch.profiler trace and fa4trace bundles: host ops, CUDA streams,
and under each traced kernel the SMs, CTAs and warps of its launch.

Track tree of the output::

    fa4trace merge                               one slice: the merge report (JSON), read back by the viewer
    python (pid P)                               a process per host pid of the profiler trace
      thread T (python)                          cpu_op, user_annotation, cuda_runtime / cuda_driver ...
        thread T (python) · overlap 1            events that would break nesting (rare)
    GPU 0 · NVIDIA H200                          a process per CUDA device
      stream 7                                   kernel, gpu_memcpy, gpu_memset slices
        stream 7 · annotations                   gpu_user_annotation (they overlap the kernels)
        <kernel> · traced launch 0.1             one per traced launch: a slice over its kernel's time,
          <bundle> · launch 1: 8 CTAs, 96 warps    with the alignment numbers as args
            SM s > CTA c > warp w · role           fa4trace.export.perfetto.to_perfetto's tracks, placed here

Arrows: every launch call -> its kernel (Kineto's ``ac2g``, by correlation id), Kineto's other
flows (``fwdbwd``), each traced kernel -> its "traced launch" slice, and fa4trace's own
QK -> SOFTMAX -> PV flows inside each launch.

**Clocks.** Host and device events keep the profiler's times (Unix-epoch ns). A traced
launch's warps were timed by %globaltimer; :mod:`fa4trace.profiler.match` pairs the launch with
its kernel activity and records ``delta`` = kernel start − first warp start. ``align="start"``
(default) places each launch's first warp start at its kernel slice's start; ``align="clock"``
places every launch with one offset, the median delta, keeping %globaltimer's spacing between
launches. Either way the report gives, per launch, the end slack (kernel end − last warp end:
negative means warps outside the slice) and the number of events outside the slice, and over
the launches the spread of delta (largest |delta − median|): how far one clock offset is from
explaining every launch, the alignment error.

The host events are encoded in bulk (:func:`fa4trace.export.perfetto.encode_hot_packets`, one packet
sequence per track, interned names, an incremental clock), nesting made strict by
:func:`fa4trace.export.tracks.layout_tracks` and ordered by :func:`fa4trace.export.perfetto.slice_events`; each traced launch is written by
:func:`fa4trace.export.perfetto.to_perfetto` with a :class:`fa4trace.export.perfetto.Placement`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ..trace.bundle import Trace, load
from ..trace.files import create_beside
from ..format.errors import Fa4traceError
from ..export.perfetto import Placement, encode_hot_packets, slice_events
from ..export.tracks import layout_tracks
from ..format.vocab import Vocabulary
from .kineto import KIND_INSTANT, KinetoTrace, load_kineto
from .match import (DEFAULT_MAX_CLOCK_OFFSET_NS, DEFAULT_TOLERANCE_NS, Match, match_launches, traced_launches)
from .render import RenderJob, all_numbers, launch_events, render_launch
from .report import REPORT_ARG, REPORT_SLICE, MergeReport

__all__ = ["merge", "attach", "ALIGN_MODES"]

ALIGN_MODES = ("start", "clock")
CLOCK_BOOTTIME = 6
CLOCK_SEQ = 64
CORR_IID = 1  # debug annotation name iid on host sequences: "correlation"
DEVICE_PID = 0x7FA40000  # pids of the GPU process tracks (never a real pid: near INT32_MAX)
LABEL_PID = 0x7FA50000  # pids of Kineto's label processes ("Spans", "Traces")
UUID_HOST = 1 << 40  # track uuids of the host part count up from here
_NONE = pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_NONE
_EXPLICIT = pb.TrackDescriptor.EXPLICIT
_TE = pb.TrackEvent


def _packet(p: pb.TracePacket) -> bytes:
    return pb.Trace(packet=[p]).SerializeToString()


class _Ids:
    """Track uuids, packet sequence ids and flow ids, each counting up across the whole file."""

    def __init__(self):
        self.uuid = UUID_HOST
        self.seq = 1
        self.flow = 1

    def new_uuid(self) -> int:
        self.uuid += 1
        return self.uuid

    def new_seq(self) -> int:
        self.seq += 1
        return self.seq - 1

    def new_flows(self, n: int) -> int:
        first = self.flow
        self.flow += n
        return first


def _descriptor(uuid: int, name: str, seq: int, *, parent: int = 0, rank: int | None = None, pid=None,
                tid=None, process_name: str | None = None) -> bytes:
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
    td.sibling_merge_behavior = _NONE
    td.child_ordering = _EXPLICIT
    if rank is not None:
        td.sibling_order_rank = int(rank)
    return _packet(p)


# ---- the host part: Kineto events as tracks --------------------------------------------------

@dataclass
class _HostPart:
    head: bytes  # descriptors
    setup: bytes  # one packet per sequence: defaults, interned names, clock snapshot
    hot: bytes  # the events
    lane0_uuid: dict  # kineto track index -> uuid of its main (lane 0) track
    slices: int
    tracks: int
    flows: int
    start_ns: int
    end_ns: int


def _host_groups(kt: KinetoTrace) -> np.ndarray:
    """Per event: its group = kineto track * 2 + (1 for gpu_user_annotation on its own child track)."""
    ann = kt.cat_mask("gpu_user_annotation")
    return kt.track.astype(np.int64) * 2 + ann.astype(np.int64)


def _layout(kt: KinetoTrace, group: np.ndarray):
    """fa4trace.export.tracks.layout_tracks on the host events: a strictly nesting lane per row."""
    n = kt.n
    kinds = pa.DictionaryArray.from_arrays(pa.array(kt.kind.astype(np.int8)), pa.array(["span", "instant"]))
    names = pa.DictionaryArray.from_arrays(pa.array(kt.name.astype(np.int32)), pa.array(kt.names, pa.string()))
    t = pa.table({
        "launch": pa.array(np.zeros(n, np.int16)), "cta": pa.array(group.astype(np.int32)),
        "sm": pa.array(np.zeros(n, np.int16)), "warp": pa.array(np.zeros(n, np.int16)),
        "role": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int16)), pa.array(["host"])),
        "name": names, "kind": kinds, "iter": pa.array(np.full(n, -1, np.int32)),
        "start_ns": pa.array(kt.ts), "end_ns": pa.array(kt.ts + kt.dur)})
    return layout_tracks(t, Vocabulary())


def _host_flows(kt: KinetoTrace) -> tuple[np.ndarray, np.ndarray]:
    """(src row, dst row): launch call -> its GPU activity by correlation id, and Kineto's other flows."""
    from .kineto import GPU_CATEGORIES, LAUNCH_CATEGORIES

    calls = np.flatnonzero(kt.cat_mask(*LAUNCH_CATEGORIES) & (kt.correlation >= 0))
    gpu = np.flatnonzero(kt.cat_mask(*[c for c in GPU_CATEGORIES if c != "gpu_user_annotation"]) & (kt.correlation >= 0))
    _, ia, ib = np.intersect1d(kt.correlation[calls], kt.correlation[gpu], assume_unique=False, return_indices=True)
    src, dst = [calls[ia]], [gpu[ib]]
    src.append(kt.flow_src)
    dst.append(kt.flow_dst)
    return np.concatenate(src), np.concatenate(dst)


def _host_tracks(kt: KinetoTrace, lay, group: np.ndarray, ids: _Ids, gpu_name: str) -> tuple:
    """Descriptors of the host part: a process per host pid and per device, a thread track per
    host thread, a track per stream (its annotations and extra lanes below it). Returns
    (descriptor bytes, uuid per layout track, {kineto track: uuid of its main track})."""
    uniq_groups = np.unique(group)
    t_group = uniq_groups[lay.track_warp]  # tracks: (group, lane); lay.track_warp indexes uniq_groups
    t_lane = lay.track_lane
    n_tr = t_group.size
    desc_seq = ids.new_seq()
    head = bytearray()
    process_uuid: dict = {}
    track_uuid = np.zeros(n_tr, np.int64)
    lane0 = {}
    label_pids: dict = {}

    def process_of(kti: int) -> int:
        t = kt.tracks[kti]
        if t.device:
            dev = _int_or(t.pid, 0)
            key = ("gpu", dev)
            name = f"GPU {dev}" + (f" · {gpu_name}" if gpu_name else "")
            pid = DEVICE_PID + dev
        elif isinstance(t.pid, int):
            key = ("host", t.pid)
            name = f"{t.process_name or 'process'} (pid {t.pid})"
            pid = t.pid
        else:
            key = ("label", str(t.pid))
            label_pids.setdefault(str(t.pid), len(label_pids))
            name = str(t.pid) or "profiler"
            pid = LABEL_PID + label_pids[str(t.pid)]
        if key not in process_uuid:
            u = process_uuid[key] = ids.new_uuid()
            rank = t.process_sort if t.process_sort is not None else (pid if key[0] == "host" else 1 << 30)
            head.extend(_descriptor(u, name, desc_seq, pid=pid, rank=min(int(rank), 2**31 - 1), process_name=name))
        return process_uuid[key]

    for ti in range(n_tr):
        g, lane = int(t_group[ti]), int(t_lane[ti])
        kti, ann = g // 2, g % 2
        t = kt.tracks[kti]
        u = ids.new_uuid()
        track_uuid[ti] = u
        label = t.label.strip() or "events"
        if lane == 0 and ann == 0:
            parent = process_of(kti)
            lane0[kti] = u
            if not t.device and isinstance(t.tid, int) and isinstance(t.pid, int):
                head.extend(_descriptor(u, label, desc_seq, pid=t.pid, tid=t.tid,
                                        rank=t.thread_sort if t.thread_sort is not None else t.tid))
            else:
                head.extend(_descriptor(u, label, desc_seq, parent=parent, rank=_int_or(t.tid, 0)))
        elif lane == 0:
            if kti not in lane0:  # a stream with annotations only: give it its main track first
                lane0[kti] = ids.new_uuid()
                head.extend(_descriptor(lane0[kti], label, desc_seq, parent=process_of(kti), rank=_int_or(t.tid, 0)))
            head.extend(_descriptor(u, f"{label} · annotations", desc_seq, parent=lane0[kti], rank=-1))
        else:  # an extra lane: below its track (lanes of a group come one after the other)
            base = lane0.get(kti) if not ann else int(track_uuid[ti - lane])
            head.extend(_descriptor(u, f"{label}{' · annotations' if ann else ''} · overlap {lane}", desc_seq,
                                    parent=base, rank=lane))
    return bytes(head), track_uuid, lane0


def _host_setup(kt: KinetoTrace, s_trk, s_row, corr, seq_of_track, track_uuid, t0) -> bytes:
    """Per host sequence its first packet: defaults (track, incremental clock), the names its
    events use, the "correlation" annotation name, the clock snapshot."""
    n_tr = track_uuid.size
    per_track = np.bincount(s_trk, minlength=n_tr)
    nn = len(kt.names) + 1
    pairs = np.unique(s_trk.astype(np.int64) * nn + kt.name[s_row]) if s_trk.size else np.zeros(0, np.int64)
    names_of: dict = {}
    for key in pairs.tolist():
        names_of.setdefault(key // nn, []).append(key % nn)
    has_corr = np.zeros(n_tr, bool)
    has_corr[s_trk[corr >= 0]] = True
    setup = bytearray()
    for ti in range(n_tr):
        if not per_track[ti]:
            continue
        p = pb.TracePacket()
        p.trusted_packet_sequence_id = int(seq_of_track[ti])
        p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        p.first_packet_on_sequence = True
        p.trace_packet_defaults.timestamp_clock_id = CLOCK_SEQ
        p.trace_packet_defaults.track_event_defaults.track_uuid = int(track_uuid[ti])
        for code in names_of.get(ti, []):
            en = p.interned_data.event_names.add()
            en.iid = code + 1
            en.name = kt.names[code]
        if has_corr[ti]:
            dn = p.interned_data.debug_annotation_names.add()
            dn.iid = CORR_IID
            dn.name = "correlation"
        for cid, inc in ((CLOCK_BOOTTIME, False), (CLOCK_SEQ, True)):
            c = p.clock_snapshot.clocks.add()
            c.clock_id = cid
            c.timestamp = int(t0[ti])
            if inc:
                c.is_incremental = True
        setup.extend(_packet(p))
    return bytes(setup)


def _host_part(kt: KinetoTrace, ids: _Ids, flow_src, flow_dst, extra_flow_out: dict, gpu_name: str) -> _HostPart:
    """Descriptors, setup packets and hot packets of every Kineto event (module docstring)."""
    group = _host_groups(kt)
    lay = _layout(kt, group)
    head, track_uuid, lane0 = _host_tracks(kt, lay, group, ids, gpu_name)
    n_tr = track_uuid.size
    start, end = kt.ts, kt.ts + kt.dur
    t_base = int(start.min()) if kt.n else 0  # relative times keep the sort keys small
    s_trk, s_ts, s_typ, s_row = slice_events(lay.row_track, start - t_base, end - t_base, kt.kind == KIND_INSTANT,
                                             lay.rank)
    s_ts = s_ts + t_base
    not_end = s_typ != _TE.TYPE_SLICE_END
    name_iid = np.where(not_end, kt.name[s_row].astype(np.int64) + 1, 0)
    corr = np.where(not_end & (kt.correlation[s_row] >= 0), kt.correlation[s_row], -1)
    fo_row = np.zeros(kt.n, np.int64)
    fi_row = np.zeros(kt.n, np.int64)
    n_flows = 0
    if flow_src.size:
        # one arrow out and one in per slice (the encoder's fields): first come, first kept
        _, first_src = np.unique(flow_src, return_index=True)
        _, first_dst = np.unique(flow_dst, return_index=True)
        keep = np.zeros(flow_src.size, bool)
        keep[np.intersect1d(first_src, first_dst)] = True
        fs, fd = flow_src[keep], flow_dst[keep]
        n_flows = int(fs.size)
        f0 = ids.new_flows(n_flows)
        fid = np.arange(f0, f0 + n_flows, dtype=np.int64)
        fo_row[fs] = fid
        fi_row[fd] = fid
    for row, fid in extra_flow_out.items():
        fo_row[row] = fid
    flow_out = np.where(not_end, fo_row[s_row], 0)
    flow_in = np.where(not_end, fi_row[s_row], 0)
    seq_of_track = np.array([ids.new_seq() for _ in range(n_tr)], np.int64)
    first = np.r_[True, s_trk[1:] != s_trk[:-1]] if s_trk.size else np.zeros(0, bool)
    dts = np.diff(s_ts, prepend=s_ts[:1]) if s_ts.size else s_ts
    dts[first] = 0
    t0 = np.zeros(n_tr, np.int64)
    t0[s_trk[first]] = s_ts[first]
    hot, _ends = encode_hot_packets(seq_of_track[s_trk], dts, s_typ, name_iid, corr, flow_out, flow_in,
                                    np.zeros(s_trk.size, np.int64))
    setup = _host_setup(kt, s_trk, s_row, corr, seq_of_track, track_uuid, t0)
    return _HostPart(head, setup, bytes(memoryview(hot)), lane0, int(kt.n), n_tr, n_flows,
                     int(start.min()) if kt.n else 0, int(end.max()) if kt.n else 0)


def _int_or(v, default: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


# ---- traced launches ------------------------------------------------------------------------

def _op_stack(kt: KinetoTrace, call_row: int, by_track: dict) -> list[str]:
    """Names of the host events enclosing a launch call on its thread, outermost first."""
    tr = int(kt.track[call_row])
    rows = by_track.get(tr)
    if rows is None:
        rows = by_track[tr] = np.flatnonzero((kt.track == tr) & (kt.kind != KIND_INSTANT))
    t, e = kt.ts[call_row], kt.ts[call_row] + kt.dur[call_row]
    enc = rows[(kt.ts[rows] <= t) & (kt.ts[rows] + kt.dur[rows] >= e) & (rows != call_row)]
    enc = enc[np.lexsort((-kt.dur[enc], kt.ts[enc]))]
    return [kt.names[int(kt.name[r])] for r in enc]


def _align(matches: list, mode: str) -> tuple[dict, dict]:
    """Per match (by id): the ns added to its bundle's start_ns; and the clock statistics."""
    deltas = np.array([m.delta_ns for m in matches], np.int64)
    med = int(np.median(deltas)) if deltas.size else 0
    clock = {"n": int(deltas.size), "median_delta_ns": med,
             "spread_ns": int(np.abs(deltas - med).max()) if deltas.size else 0,
             "min_delta_ns": int(deltas.min()) if deltas.size else 0, "max_delta_ns": int(deltas.max()) if deltas.size else 0}
    shift = {}
    for m in matches:
        ln = m.launch
        t0 = ln.first_ns - ln.first_rel_ns  # the bundle's t0_globaltimer_ns: start_ns counts from it
        # start: the first warp start lands on the kernel's start; clock: one offset for all
        shift[id(m)] = (ln.first_ns + int(m.delta_ns) - ln.first_rel_ns) if mode == "start" else t0 + med
    return shift, clock


PARALLEL_ROWS = 2_000_000  # from this many rows of traced launches on, they are written by worker processes
UUID_WARPS = 1 << 56  # parallel writing: launch k's track uuids count up from UUID_WARPS + (k << 32)


def _inputs(profiler_trace, traces, names) -> tuple:
    """The Kineto trace and the bundles, read at the same time: bundles in a thread pool (Parquet
    reads leave the GIL), the JSON in this thread. Returns (kt, bundles, labels, paths)."""
    labels, paths, todo = [], [], []
    for i, t in enumerate(traces):
        if isinstance(t, Trace):
            paths.append(None)
            labels.append((names[i] if names and i < len(names) else None) or t.name)
        else:
            paths.append(str(Path(t).resolve()) if Path(t).exists() else str(t))
            labels.append(Path(t).name)
            todo.append(i)
    if not traces:
        raise Fa4traceError("no bundle to merge: name at least one fa4trace bundle")
    bundles = list(traces)
    with ThreadPoolExecutor(max(1, min(2, len(todo)))) as ex:
        futs = {i: ex.submit(load, traces[i]) for i in todo}
        kt = profiler_trace if isinstance(profiler_trace, KinetoTrace) else load_kineto(profiler_trace)
        for i, f in futs.items():
            bundles[i] = f.result()
    return kt, bundles, labels, paths


def _entry(kt: KinetoTrace, m: Match, tr: Trace, sh: int, drawn: bool, fid: int, label: str, clock: dict,
           op_names: list) -> dict:
    """The report's row of one traced launch: its kernel, how it was matched, where its events land."""
    ln = m.launch
    st0 = tr.events["start_ns"].to_numpy()
    st = st0 + sh
    en = np.maximum(tr.events["end_ns"].to_numpy(), st0) + sh
    k0, k1 = int(kt.ts[m.row]), int(kt.ts[m.row] + kt.dur[m.row])
    return {
        "bundle": ln.bundle, "launch": ln.launch, "label": label, "kernel": kt.names[int(kt.name[m.row])],
        "method": m.method, "candidates": m.candidates, "ambiguous": bool(m.ambiguous),
        "stream": int(kt.stream[m.row]), "device": int(kt.device[m.row]), "correlation": int(kt.correlation[m.row]),
        "kernel_start_ns": k0, "kernel_dur_ns": k1 - k0, "delta_ns": int(m.delta_ns),
        "residual_ns": int(m.delta_ns) - clock["median_delta_ns"], "shift_ns": int(sh), "span_ns": int(ln.span_ns),
        "first_ns": int(st.min()) if st.size else k0, "last_ns": int(en.max()) if en.size else k0,
        "start_slack_ns": (int(st.min()) - k0) if st.size else 0, "end_slack_ns": (k1 - int(en.max())) if en.size else 0,
        "outside": int(((st < k0) | (en > k1)).sum()), "rows": int(tr.events.num_rows),
        "ctas": int(np.unique(tr.events["cta"].to_numpy()).size) if tr.events.num_rows else 0,
        "warps": int(pc.sum(pc.equal(tr.events["kind"].cast(pa.string()), "warp")).as_py() or 0),
        "ops": op_names, "warps_drawn": bool(drawn), "flow_id": int(fid)}


def _pool(traces: list, workers: int):
    """Worker processes for a large merge (>= PARALLEL_ROWS bundle rows and ``workers`` > 1), else
    None. Spawned: nothing of this process's threads (Arrow's, the bundle readers') is inherited."""
    rows = 0
    for t in traces:
        try:
            rows += t.events.num_rows if isinstance(t, Trace) else pq.ParquetFile(t).metadata.num_rows
        except (OSError, ValueError, pa.ArrowException):
            pass  # reading the bundle says what is wrong with it, in one line
    if workers < 2 or rows < PARALLEL_ROWS:
        return None
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))


def _render_all(jobs: list, ids: _Ids, pool, host_bound: int, build_host):
    """Every launch's part (fa4trace.profiler.render), and the host part.

    Without ``pool``: one after the other in this process, each launch's ids continuing where the
    last one's ended. With it: in the worker processes, each launch given id ranges of its own up
    front (its rows bound its tracks, sequences and arrows; the host part's bound is
    ``host_bound``), while this process builds the host part. Returns (host, results)."""
    rows = [int(j.rows) for j in jobs]
    seq_need = sum(2 * r + 16 for r in rows) + 2 * host_bound + 16
    if pool is None or ids.seq + seq_need >= 2**32 - 1:
        host = build_host()
        out = []
        for j in jobs:
            if j.job.place is not None:
                j.job.place = replace(j.job.place, uuid_base=ids.uuid, first_sequence_id=ids.seq,
                                      first_flow_id=ids.flow)
            r = render_launch(j.job)
            if j.job.place is not None:
                ids.uuid, ids.seq, ids.flow = r.next_uuid, r.next_sequence_id, r.next_flow_id
            out.append(r)
        return host, out
    seq = ids.seq + 2 * host_bound + 16
    flow = ids.flow + host_bound + 1
    for k, (j, r) in enumerate(zip(jobs, rows)):
        if j.job.place is not None:
            j.job.place = replace(j.job.place, uuid_base=UUID_WARPS + (k << 32), first_sequence_id=seq,
                                  first_flow_id=flow)
            seq += 2 * r + 16
            flow += r + 1
    futs = [pool.submit(render_launch, j.job) for j in jobs]
    host = build_host()
    return host, [f.result() for f in futs]


@dataclass
class _Job:
    job: RenderJob
    rows: int


def merge(profiler_trace, traces, out, *, align: str = "start", max_launches: int | None = None,
          compress: bool = False, force: bool = False, analysis: bool = True,
          tolerance_ns: int = DEFAULT_TOLERANCE_NS, max_clock_offset_ns: int | None = DEFAULT_MAX_CLOCK_OFFSET_NS,
          names: list[str] | None = None, allow_unmatched: bool = False, workers: int | None = None) -> MergeReport:
    """Write one Perfetto trace of ``profiler_trace`` (a torch.profiler Chrome JSON path or a
    :class:`KinetoTrace`) with the warps of ``traces`` (bundles: :class:`Trace` objects or
    paths) under their kernels (module docstring). Returns the report.

    ``align``: "start" or "clock" (module docstring). ``max_launches``: draw the warps of the first
    N traced launches of each bundle only (the others keep a "traced launch" slice saying so).
    ``compress``: zlib the warp packets. ``force``: replace an existing ``out``. ``analysis``:
    busy / waiting / overlap per launch in the report. ``names``: labels of in-memory bundles.
    ``workers``: processes that write a large merge's launches (default: 2, or 1 on one core).
    Raises Fa4traceError (one line) when a bundle has no launch in the trace (unless
    ``allow_unmatched``); nothing is written then."""
    t_start = time.perf_counter()
    if align not in ALIGN_MODES:
        raise Fa4traceError(f"align must be one of {', '.join(ALIGN_MODES)}, not {align!r}")
    if max_launches is not None and max_launches < 0:
        raise Fa4traceError("max_launches must be >= 0")
    out = Path(out)
    if out.exists() and not force:
        raise Fa4traceError(f"{out} exists; refusing to overwrite it (add --force)")
    if out.is_dir():
        raise Fa4traceError(f"{out} is a directory")
    stages = {}
    traces = list(traces)
    with contextlib.ExitStack() as stack:
        pool = _pool(traces, workers or min(2, os.cpu_count() or 1))
        if pool is not None:
            stack.callback(pool.shutdown, cancel_futures=True)
        # a large merge's first worker computes the numbers while this process reads (one job:
        # the other core stays with the reader; the launches' jobs queue behind it)
        numbers = pool.submit(all_numbers, traces) if pool is not None and analysis else None
        return _merge(profiler_trace, traces, out, pool, numbers, stages, t_start, align=align,
                      max_launches=max_launches, compress=compress, analysis=analysis, tolerance_ns=tolerance_ns,
                      max_clock_offset_ns=max_clock_offset_ns, names=names, allow_unmatched=allow_unmatched)


def _merge(profiler_trace, traces, out, pool, numbers, stages, t_start, *, align, max_launches, compress, analysis,
           tolerance_ns, max_clock_offset_ns, names, allow_unmatched) -> MergeReport:
    """merge()'s steps, given its worker pool (or None) and the numbers' future (or None)."""
    kt, bundles, labels, paths = _inputs(profiler_trace, traces, names)
    stages["read_s"] = time.perf_counter() - t_start
    launches = traced_launches(bundles)
    res = match_launches(kt, launches, tolerance_ns=tolerance_ns, max_clock_offset_ns=max_clock_offset_ns)
    per_bundle = np.bincount([m.launch.bundle for m in res.matches], minlength=len(bundles))
    if not allow_unmatched:
        for b in range(len(bundles)):
            if per_bundle[b] == 0:
                why = next((u.reason for u in res.unmatched if u.launch.bundle == b), "it holds no events")
                raise Fa4traceError(f"{labels[b]}: none of its launches is in {Path(kt.path).name}: {why}")
    matches = sorted(res.matches, key=lambda m: int(kt.ts[m.row]))
    shift, clock = _align(matches, align)
    gpu = kt.gpu_names()
    report = MergeReport(profiler_trace=str(kt.path), output=str(out), align=align, max_launches=max_launches,
                         clock=clock, notes=list(res.notes))
    for b, tr in enumerate(bundles):
        g = tr.meta.get("gpu")
        report.bundles.append({"index": b, "name": labels[b], "path": paths[b], "kernel": tr.name,
                               "launches": len({ln.launch for ln in launches if ln.bundle == b}),
                               "matched": int(per_bundle[b]), "gpu": g.get("name") if isinstance(g, dict) else None})
    for u in res.unmatched:
        report.unmatched.append({"bundle": u.launch.bundle, "launch": u.launch.launch, "reason": u.reason})
    bgpu = {b["gpu"] for b in report.bundles if b["gpu"]}
    if gpu and bgpu and not (bgpu & set(gpu)):
        report.notes.append(f"the bundles were recorded on {', '.join(sorted(bgpu))}, the profiler trace on "
                            f"{', '.join(gpu)}")

    # ids: each traced kernel's arrow to its "traced launch" slice first, then the host's, then the warps'
    ids = _Ids()
    calls = kt.launch_calls()
    by_track: dict = {}
    drawn_count: dict = {}
    placed = []
    for m in matches:
        b = m.launch.bundle
        drawn = max_launches is None or drawn_count.get(b, 0) < max_launches
        drawn_count[b] = drawn_count.get(b, 0) + int(drawn)
        tr = launch_events(bundles[b], m.launch.launch)
        call = calls.get(int(kt.correlation[m.row]))
        ops = _op_stack(kt, call, by_track) if call is not None else []
        placed.append((m, tr, _entry(kt, m, tr, shift[id(m)], drawn, ids.new_flows(1), labels[b], clock, ops)))
    report_seq, summary_seq, desc_seq = ids.new_seq(), ids.new_seq(), ids.new_seq()
    merge_track = ids.new_uuid()
    traced_tracks = [ids.new_uuid() for _ in placed]
    spool = tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent if out.parent.exists() else None)
    jobs = []
    for i, (m, tr, e) in enumerate(placed):
        place = None
        if e["warps_drawn"]:
            place = Placement(parent_uuid=traced_tracks[i], name=f"{_short(e['label'], 40)} · launch {e['launch']}: "
                              f"{e['ctas']} CTAs, {e['warps']} warps", uuid_base=0, first_sequence_id=0,
                              ts_offset_ns=e["shift_ns"])
        inline_numbers = analysis and numbers is None
        if place is not None or inline_numbers:
            src = paths[m.launch.bundle] or tr
            jobs.append((i, _Job(RenderJob(src, m.launch.launch, place, compress, inline_numbers, spool.name),
                                 e["rows"])))
    stages["match_s"] = time.perf_counter() - t_start - stages["read_s"]
    host_flows = _host_flows(kt)
    extra = {m.row: e["flow_id"] for m, _, e in placed}
    try:
        host, results = _render_all([j for _, j in jobs], ids, pool, kt.n + 16,
                                    lambda: _host_part(kt, ids, *host_flows, extra, gpu[0] if gpu else ""))
        stages["render_s"] = time.perf_counter() - t_start - sum(stages.values())
        report.host = {"events": int(kt.n), "slices": host.slices, "tracks": host.tracks, "flows": host.flows,
                       "skipped": dict(kt.skipped), "start_ns": host.start_ns, "end_ns": host.end_ns,
                       "gpu": gpu, "base_ns": kt.base_ns}
        head = bytearray()
        for i, ((m, tr, e), u) in enumerate(zip(placed, traced_tracks)):
            head.extend(_descriptor(u, f"{_short(e['label'])} · traced launch {e['bundle']}.{e['launch']}", desc_seq,
                                    parent=host.lane0_uuid.get(int(kt.track[m.row])), rank=1000 + i))
        for (i, _j), r in zip(jobs, results):
            if r.numbers is not None:
                placed[i][2]["numbers"] = r.numbers
        if numbers is not None:
            per_bundle_numbers = numbers.result()
            for m, _t, e in placed:
                e["numbers"] = per_bundle_numbers[m.launch.bundle].get(m.launch.launch, {})
        report.launches = [e for _m, _t, e in placed]
        slices = host.slices + sum(r.slices for r in results)
        with _atomic(out) as f:
            f.write(_descriptor(merge_track, REPORT_SLICE, desc_seq, rank=-1000))
            f.write(_report_slice(report, merge_track, report_seq, host.start_ns, max(host.end_ns, host.start_ns)))
            f.write(host.head)
            f.write(bytes(head))
            f.write(host.setup)
            f.write(host.hot)
            f.write(_summaries(placed, traced_tracks, summary_seq, max_launches))
            for r in results:
                if r.path:
                    _append(f, r.path)
    finally:
        spool.cleanup()
    stages["write_s"] = time.perf_counter() - t_start - sum(stages.values())
    report.written = {"bytes": out.stat().st_size, "slices": int(slices), "seconds": time.perf_counter() - t_start,
                      "stages": {k: round(v, 3) for k, v in stages.items()},
                      "launch_seconds": [round(r.seconds, 3) for r in results]}
    return report


def _short(s: str, n: int = 60) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _report_slice(report: MergeReport, track: int, seq: int, t0: int, t1: int) -> bytes:
    """The report as one slice on its own track (BEGIN with the JSON, then END)."""
    out = bytearray()
    p = pb.TracePacket()
    p.trusted_packet_sequence_id = seq
    p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    p.timestamp = t0
    te = p.track_event
    te.type = _TE.TYPE_SLICE_BEGIN
    te.track_uuid = track
    te.name = REPORT_SLICE
    da = te.debug_annotations.add()
    da.name = REPORT_ARG
    da.string_value = report.to_json()
    out.extend(_packet(p))
    q = pb.TracePacket()
    q.trusted_packet_sequence_id = seq
    q.sequence_flags = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
    q.timestamp = t1
    q.track_event.type = _TE.TYPE_SLICE_END
    q.track_event.track_uuid = track
    out.extend(_packet(q))
    return bytes(out)


def _summaries(placed: list, tracks: list, seq: int, max_launches: int | None) -> bytes:
    """Per traced launch a slice over its kernel's time, with the alignment numbers as args."""
    out = bytearray()
    first = True
    for (m, tr, e), u in zip(placed, tracks):
        for typ, ts in ((_TE.TYPE_SLICE_BEGIN, e["kernel_start_ns"]), (_TE.TYPE_SLICE_END, e["kernel_start_ns"] + e["kernel_dur_ns"])):
            p = pb.TracePacket()
            p.trusted_packet_sequence_id = seq
            p.sequence_flags = (pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED if first
                                else pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
            first = False
            p.timestamp = int(ts)
            te = p.track_event
            te.type = typ
            te.track_uuid = u
            if typ == _TE.TYPE_SLICE_BEGIN:
                te.name = f"traced launch {e['bundle']}.{e['launch']}" + (
                    "" if e["warps_drawn"] else f" (warps not drawn: the first {max_launches} launches of a bundle only)")
                if e["flow_id"] > 0:
                    te.terminating_flow_ids.append(int(e["flow_id"]))
                for k in ("label", "method", "delta_ns", "residual_ns", "end_slack_ns", "start_slack_ns", "outside",
                          "span_ns", "candidates", "ambiguous", "rows"):
                    da = te.debug_annotations.add()
                    da.name = k
                    v = e[k]
                    if isinstance(v, bool):
                        da.bool_value = v
                    elif isinstance(v, int):
                        da.int_value = v
                    else:
                        da.string_value = str(v)
            out.extend(_packet(p))
    return bytes(out)


def _append(f, path: str) -> None:
    """Copy a file's bytes to the end of the open file ``f`` (in the kernel where it can)."""
    f.flush()
    with open(path, "rb") as part:
        size = os.fstat(part.fileno()).st_size
        sent = 0
        try:
            while sent < size:
                n = os.sendfile(f.fileno(), part.fileno(), sent, size - sent)
                if n == 0:
                    break
                sent += n
        except (AttributeError, OSError):  # no sendfile here, or not for these files
            pass
        if sent < size:
            part.seek(sent)
            shutil.copyfileobj(part, f, 16 << 20)


class _atomic:
    """Write next to the target and rename: an interrupted merge never leaves half a file."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = create_beside(self.path)  # mode 0666 less the umask, as other outputs (mkstemp: 0600)
        self.f = open(self.tmp, "wb")
        return self.f

    def __exit__(self, exc_type, exc, tb):
        self.f.close()
        if exc_type is None:
            os.replace(self.tmp, self.path)
        elif os.path.exists(self.tmp):
            os.unlink(self.tmp)
        return False


# ---- inside a torch.profiler session ------------------------------------------------------------

def attach(prof, traces, path, *, chrome_trace=None, **kw) -> MergeReport:
    """Merge the bundles of a recording into the trace of a finished ``torch.profiler.profile``.

    ``prof``: the profiler (after its block ended), or a path to its exported Chrome trace.
    ``traces``: a bundle :class:`Trace`, a path, a list of them, or a recording
    (``fa4trace.instrument()``'s: every compiled kernel that ran gives its bundle).
    ``path``: the merged Perfetto file. ``chrome_trace``: where the profiler's Chrome trace is
    exported and kept (for another merge or for torch's own tools); default a temporary file
    next to ``path``, removed after. A profile exports once only (torch refuses a second
    ``export_chrome_trace``): to merge it again, pass the kept file as ``prof``. Keywords go to
    :func:`merge`. No torch import here."""
    bundles = _bundles_of(traces)
    if not hasattr(prof, "export_chrome_trace"):
        return merge(prof, bundles, path, **kw)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if chrome_trace is not None:
        kt = load_kineto(_export_chrome_trace(prof, Path(chrome_trace)))
        return merge(kt, bundles, path, **kw)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".kineto.json", dir=out.parent)
    os.close(fd)
    try:
        kt = load_kineto(_export_chrome_trace(prof, Path(tmp)))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    kt.path = "torch.profiler (exported in memory)"
    return merge(kt, bundles, path, **kw)


def _export_chrome_trace(prof, dest: Path) -> Path:
    """``prof.export_chrome_trace(dest)``, one clear line where torch refuses (a profile that was
    exported already: torch 2.11 on says "Trace is already saved")."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        prof.export_chrome_trace(str(dest))
    except RuntimeError as exc:
        if "already saved" in str(exc):
            raise Fa4traceError("this torch.profiler profile was exported already (torch exports a profile "
                                "once): pass the exported Chrome trace file to attach instead of the "
                                "profiler") from None
        raise
    return dest


def _bundles_of(traces) -> list:
    if isinstance(traces, (Trace, str, os.PathLike)):
        return [traces]
    kernels = getattr(traces, "kernels", None)
    if kernels is not None and not isinstance(traces, (list, tuple)):
        out = []
        for k in kernels:
            try:
                out.append(k.trace())
            except Fa4traceError:  # a kernel compiled but never launched
                continue
        return out
    return list(traces)
