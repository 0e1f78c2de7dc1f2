"""The packets every merged trace is made of: ids, track descriptors, the report slice, each
traced launch's summary slice, and appending a part written elsewhere.

Shared by the merge of one process (:mod:`fa4trace.profiler.merge`) and of several ranks
(:mod:`fa4trace.profiler.ranks`): track uuids, packet sequence ids and flow ids count up across
the whole output file (:class:`Ids`), so parts written one after the other never collide.
"""

from __future__ import annotations

import os
import shutil

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from .report import REPORT_ARG, REPORT_SLICE, MergeReport

__all__ = ["Ids", "packet", "descriptor", "report_slice", "report_begin", "report_end", "summary_slices", "append_file", "short", "CLOCK_BOOTTIME",
           "CLOCK_SEQ", "UUID_HOST"]

CLOCK_BOOTTIME = 6
CLOCK_SEQ = 64
UUID_HOST = 1 << 40  # track uuids of the host part count up from here
_NONE = pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_NONE
_EXPLICIT = pb.TrackDescriptor.EXPLICIT
_TE = pb.TrackEvent


def packet(p: pb.TracePacket) -> bytes:
    """One packet as the bytes of a Trace holding it (a file is their concatenation)."""
    return pb.Trace(packet=[p]).SerializeToString()


class Ids:
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


def descriptor(uuid: int, name: str, seq: int, *, parent: int = 0, rank: int | None = None, pid=None,
               tid=None, process_name: str | None = None) -> bytes:
    """A track's descriptor packet: a process (``pid``), a thread (``pid`` and ``tid``) or a
    track below ``parent``; children in explicit order (``rank``), never merged with siblings."""
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
    return packet(p)


def short(s: str, n: int = 60) -> str:
    """``s`` cut to ``n`` characters (an ellipsis marks the cut)."""
    return s if len(s) <= n else s[: n - 1] + "…"


def report_slice(report: MergeReport, track: int, seq: int, t0: int, t1: int) -> bytes:
    """The report as one slice on its own track (BEGIN with the JSON, then END)."""
    return report_begin(report.to_json(), track, seq, t0) + report_end(track, seq, t1)


def report_begin(text: str, track: int, seq: int, t0: int) -> bytes:
    """The BEGIN of the report slice, the report's JSON ``text`` as its argument: the first
    packet of its sequence."""
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
    da.string_value = text
    return packet(p)


def report_end(track: int, seq: int, t1: int) -> bytes:
    """The END of the report slice."""
    q = pb.TracePacket()
    q.trusted_packet_sequence_id = seq
    q.sequence_flags = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
    q.timestamp = t1
    q.track_event.type = _TE.TYPE_SLICE_END
    q.track_event.track_uuid = track
    return packet(q)


def summary_slices(placed: list, tracks: list, seq: int, max_launches: int | None) -> bytes:
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
            out.extend(packet(p))
    return bytes(out)


def append_file(f, path: str) -> None:
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
