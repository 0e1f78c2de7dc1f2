"""The host part of a merged trace: every event of a torch.profiler trace as Perfetto tracks.

Host threads (``cpu_op``, ``user_annotation``, CUDA runtime / driver calls), CUDA streams
(kernels, copies, memsets; ``gpu_user_annotation`` on a child track of its stream) and Kineto's
label processes, each event one slice. Nesting is made strict by
:func:`fa4trace.export.tracks.layout_tracks` (an event that would break it goes to an "overlap"
lane below its track), and the packets are written by :mod:`fa4trace.export.packets`, as the
bundle export writes its own: events ordered by :func:`~fa4trace.export.packets.slice_events` and
encoded in bulk (:func:`~fa4trace.export.packets.track_packets`), one packet sequence per track,
interned names, an incremental clock.

One process (:mod:`fa4trace.profiler.merge`): a Perfetto process per host pid and per CUDA
device, thread tracks bound to their pid. One rank of several (:mod:`fa4trace.profiler.ranks`,
``root``): everything of the rank under its own process track — host threads, a "GPU n" track
holding its streams, the label tracks — so that ranks whose pids or device indices are the
same (two hosts; two processes on one GPU) stay apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..export.packets import (ANNOTATION_IID, TYPE_END, descriptor, flow_fields, sequence_start, slice_events,
                              track_names, track_packets)
from ..export.tracks import layout_tracks
from ..format.vocab import Vocabulary
from .kineto import GPU_CATEGORIES, KIND_INSTANT, LAUNCH_CATEGORIES, KinetoTrace
from .packets import Ids

__all__ = ["HostPart", "host_part", "host_flows", "op_stack", "int_or", "DEVICE_PID", "LABEL_PID"]

DEVICE_PID = 0x7FA40000  # pids of the GPU process tracks (never a real pid: near INT32_MAX)
LABEL_PID = 0x7FA50000  # pids of Kineto's label processes ("Spans", "Traces")


@dataclass
class HostPart:
    """One profiler trace's events, encoded: what the merge writes, and where the traced
    launches' tracks hang (``lane0_uuid``: the main track of each Kineto track)."""

    head: bytes  # descriptors
    setup: bytes  # one packet per sequence: defaults, interned names, clock snapshot
    hot: bytes  # the events
    lane0_uuid: dict  # kineto track index -> uuid of its main (lane 0) track
    slices: int
    tracks: int
    flows: int
    start_ns: int
    end_ns: int


def host_groups(kt: KinetoTrace) -> np.ndarray:
    """Per event: its group = kineto track * 2 + (1 for gpu_user_annotation on its own child track)."""
    ann = kt.cat_mask("gpu_user_annotation")
    return kt.track.astype(np.int64) * 2 + ann.astype(np.int64)


def host_layout(kt: KinetoTrace, group: np.ndarray):
    """fa4trace.export.tracks.layout_tracks on the host events: a strictly nesting lane per row.
    Times are taken from the first event's (the layout reads their order only): small sort keys."""
    n = kt.n
    t0 = int(kt.ts.min()) if n else 0
    kinds = pa.DictionaryArray.from_arrays(pa.array(kt.kind.astype(np.int8)), pa.array(["span", "instant"]))
    names = pa.DictionaryArray.from_arrays(pa.array(kt.name.astype(np.int32)), pa.array(kt.names, pa.string()))
    t = pa.table({
        "launch": pa.array(np.zeros(n, np.int16)), "cta": pa.array(group.astype(np.int32)),
        "sm": pa.array(np.zeros(n, np.int16)), "warp": pa.array(np.zeros(n, np.int16)),
        "role": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int16)), pa.array(["host"])),
        "name": names, "kind": kinds, "iter": pa.array(np.full(n, -1, np.int32)),
        "start_ns": pa.array(kt.ts - t0), "end_ns": pa.array(kt.ts - t0 + kt.dur)})
    return layout_tracks(t, Vocabulary())


def host_flows(kt: KinetoTrace) -> tuple[np.ndarray, np.ndarray]:
    """(src row, dst row): launch call -> its GPU activity by correlation id, and Kineto's other flows."""
    calls = np.flatnonzero(kt.cat_mask(*LAUNCH_CATEGORIES) & (kt.correlation >= 0))
    gpu = np.flatnonzero(kt.cat_mask(*[c for c in GPU_CATEGORIES if c != "gpu_user_annotation"]) & (kt.correlation >= 0))
    _, ia, ib = np.intersect1d(kt.correlation[calls], kt.correlation[gpu], assume_unique=False, return_indices=True)
    src, dst = [calls[ia]], [gpu[ib]]
    src.append(kt.flow_src)
    dst.append(kt.flow_dst)
    return np.concatenate(src), np.concatenate(dst)


def host_tracks(kt: KinetoTrace, lay, group: np.ndarray, ids: Ids, gpu_name: str, root: int = 0,
                main_pid=None) -> tuple:
    """Descriptors of the host part: a process per host pid and per device, a thread track per
    host thread, a track per stream (its annotations and extra lanes below it). With ``root``
    (a rank's process track) those processes are tracks below it and ``main_pid``'s threads
    hang on ``root`` itself (module docstring). Returns (descriptor bytes, uuid per layout
    track, {kineto track: uuid of its main track})."""
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
            dev = int_or(t.pid, 0)
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
        if root and key == ("host", main_pid):
            return root
        if key not in process_uuid:
            u = process_uuid[key] = ids.new_uuid()
            rank = t.process_sort if t.process_sort is not None else (pid if key[0] == "host" else 1 << 30)
            if root:  # a track of the rank: its host threads first, then its GPUs, then the labels
                rank = {"host": 1 << 20, "gpu": (1 << 21) + int_or(t.pid, 0), "label": 1 << 30}[key[0]]
                head.extend(descriptor(u, name, desc_seq, parent=root, rank=rank))
            else:
                head.extend(descriptor(u, name, desc_seq, pid=pid, rank=min(int(rank), 2**31 - 1), process_name=name))
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
            if not root and not t.device and isinstance(t.tid, int) and isinstance(t.pid, int):
                head.extend(descriptor(u, label, desc_seq, pid=t.pid, tid=t.tid,
                                       rank=t.thread_sort if t.thread_sort is not None else t.tid))
            else:
                head.extend(descriptor(u, label, desc_seq, parent=parent, rank=int_or(t.tid, 0)))
        elif lane == 0:
            if kti not in lane0:  # a stream with annotations only: give it its main track first
                lane0[kti] = ids.new_uuid()
                head.extend(descriptor(lane0[kti], label, desc_seq, parent=process_of(kti), rank=int_or(t.tid, 0)))
            head.extend(descriptor(u, f"{label} · annotations", desc_seq, parent=lane0[kti], rank=-1))
        else:  # an extra lane: below its track (lanes of a group come one after the other)
            base = lane0.get(kti) if not ann else int(track_uuid[ti - lane])
            head.extend(descriptor(u, f"{label}{' · annotations' if ann else ''} · overlap {lane}", desc_seq,
                                   parent=base, rank=lane))
    return bytes(head), track_uuid, lane0


def host_setup(kt: KinetoTrace, s_trk, s_row, corr, seq_of_track, track_uuid, t0) -> bytes:
    """Per host sequence its first packet (fa4trace.export.packets.sequence_start): its track, the
    names its events use, the "correlation" annotation name where its events carry one, its
    clock's start."""
    n_tr = track_uuid.size
    per_track = np.bincount(s_trk, minlength=n_tr)
    nn = len(kt.names) + 1
    pairs = track_names(s_trk, kt.name[s_row], n_tr, nn)
    names_of: dict = {}
    for key in pairs.tolist():
        code = key % nn
        names_of.setdefault(key // nn, []).append((code + 1, kt.names[code]))
    has_corr = np.zeros(n_tr, bool)
    has_corr[s_trk[corr >= 0]] = True
    corr_name = ((ANNOTATION_IID, "correlation"),)
    setup = bytearray()
    for ti in np.flatnonzero(per_track).tolist():
        setup += sequence_start(int(seq_of_track[ti]), int(track_uuid[ti]), int(t0[ti]), names_of.get(ti, ()),
                                corr_name if has_corr[ti] else ())
    return bytes(setup)


def host_part(kt: KinetoTrace, ids: Ids, flow_src, flow_dst, extra_flow_out: dict, gpu_name: str, *,
              root: int = 0, main_pid=None) -> HostPart:
    """Descriptors, setup packets and hot packets of every Kineto event (module docstring);
    ``root`` / ``main_pid``: one rank's part, under its process track (:func:`host_tracks`)."""
    group = host_groups(kt)
    lay = host_layout(kt, group)
    head, track_uuid, lane0 = host_tracks(kt, lay, group, ids, gpu_name, root, main_pid)
    n_tr = track_uuid.size
    start, end = kt.ts, kt.ts + kt.dur
    t_base = int(start.min()) if kt.n else 0  # relative times keep the sort keys small
    s_trk, s_ts, s_typ, s_row = slice_events(lay.row_track, start - t_base, end - t_base, kt.kind == KIND_INSTANT,
                                             lay.rank)
    s_ts = s_ts + t_base
    not_end = s_typ != TYPE_END
    name_iid = np.where(not_end, kt.name[s_row].astype(np.int64) + 1, 0)
    corr = np.where(not_end & (kt.correlation[s_row] >= 0), kt.correlation[s_row], -1)
    fs = fd = np.zeros(0, np.int64)
    if flow_src.size:
        # one arrow out and one in per slice (the encoder's fields): first come, first kept
        _, first_src = np.unique(flow_src, return_index=True)
        _, first_dst = np.unique(flow_dst, return_index=True)
        keep = np.zeros(flow_src.size, bool)
        keep[np.intersect1d(first_src, first_dst)] = True
        fs, fd = flow_src[keep], flow_dst[keep]
    n_flows = int(fs.size)
    flow_out, flow_in = flow_fields(s_typ, s_row, kt.n, fs, fd, ids.new_flows(n_flows), extra_flow_out)
    seq_of_track = np.array([ids.new_seq() for _ in range(n_tr)], np.int64)
    hot = track_packets(s_trk, s_ts, s_typ, seq_of_track, name_iid=name_iid, annotation=corr, flow_out=flow_out,
                        flow_in=flow_in)
    setup = host_setup(kt, s_trk, s_row, corr, seq_of_track, track_uuid, hot.t0_of_track)
    return HostPart(head, setup, bytes(memoryview(hot.data)), lane0, int(kt.n), n_tr, n_flows,
                    int(start.min()) if kt.n else 0, int(end.max()) if kt.n else 0)


def int_or(v, default: int) -> int:
    """``int(v)``, or ``default`` where it is not a number."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def op_stack(kt: KinetoTrace, call_row: int, by_track: dict) -> list[str]:
    """Names of the host events enclosing a launch call on its thread, outermost first."""
    tr = int(kt.track[call_row])
    rows = by_track.get(tr)
    if rows is None:
        rows = by_track[tr] = np.flatnonzero((kt.track == tr) & (kt.kind != KIND_INSTANT))
    t, e = kt.ts[call_row], kt.ts[call_row] + kt.dur[call_row]
    enc = rows[(kt.ts[rows] <= t) & (kt.ts[rows] + kt.dur[rows] >= e) & (rows != call_row)]
    enc = enc[np.lexsort((-kt.dur[enc], kt.ts[enc]))]
    return [kt.names[int(kt.name[r])] for r in enc]
