"""What every merged trace holds besides its tracks' events: ids, the report slice, each traced
launch's summary slice, and appending a part written elsewhere.

Shared by the merge of one process (:mod:`fa4trace.profiler.merge`) and of several ranks
(:mod:`fa4trace.profiler.ranks`): track uuids, packet sequence ids and flow ids count up across
the whole output file (:class:`Ids`), so parts written one after the other never collide. The
packets themselves (track descriptors included) are written by :mod:`fa4trace.export.packets`,
as the bundle export writes its own.
"""

from __future__ import annotations

import os
import shutil

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ..export.packets import packet
from .report import REPORT_ARG, REPORT_SLICE, MergeReport

__all__ = ["Ids", "report_slice", "report_begin", "report_end", "summary_slices", "append_file", "short",
           "UUID_HOST"]

UUID_HOST = 1 << 40  # track uuids of the host part count up from here
_TE = pb.TrackEvent


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
