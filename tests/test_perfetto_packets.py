"""fa4trace.export.packets: the one Perfetto packet writer of the bundle export and the merge.

The rare packets (track descriptors, sequence starts) are held byte for byte to what the two
writers it replaced wrote (the pb2 code below is theirs), for every combination of fields.
The hot packets (bulk-encoded slices, flows, counters, annotations) are parsed back by pb2 and
compared field by field with what was asked, varints of every length included.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from fa4trace.export import packets as P

NAMES = ["warp 3 · softmax", "", "GPU · kernel", "名前 · ∑", "x" * 300]


@pytest.mark.parametrize("name", NAMES)
def test_descriptors_parse_back_to_what_was_asked(name):
    uuids = [1, 127, 128, (0xFA4 << 48) + 5, 2**64 - 1]
    kinds = [{}, {"pid": 4242}, {"pid": 4242, "process_name": "python"}, {"pid": 0x7FA40000, "tid": 7},
             {"parent": 1 << 40}, {"parent": 5, "counter": True}]
    for uuid, kind, rank, desc, seq in itertools.product(uuids, kinds, [None, 0, 3, -1, -1000, 2**31 - 1],
                                                         ["", "SM 3, launch 0", name], [1, 300, 2**31 + 7]):
        (p,) = pb.Trace.FromString(P.descriptor(uuid, name, seq, rank=rank, description=desc, **kind)).packet
        td = p.track_descriptor
        assert p.trusted_packet_sequence_id == seq and td.uuid == uuid and td.name == name
        assert td.parent_uuid == kind.get("parent", 0) and td.description == desc
        assert td.HasField("sibling_order_rank") == (rank is not None) and td.sibling_order_rank == (rank or 0)
        assert td.sibling_merge_behavior == pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_NONE  # same names stay apart
        assert td.child_ordering == pb.TrackDescriptor.EXPLICIT
        assert td.HasField("counter") == bool(kind.get("counter"))
        if "tid" in kind:
            assert (td.thread.pid, td.thread.tid, td.thread.thread_name) == (kind["pid"], kind["tid"], name)
            assert not td.HasField("process")
        elif "pid" in kind:
            assert (td.process.pid, td.process.process_name) == (kind["pid"], kind.get("process_name") or name)
        else:
            assert not td.HasField("process") and not td.HasField("thread")


def test_a_sequence_start_parses_back_to_what_was_asked():
    names = [(), ((1, "QK"),), ((1, "QK"), (2, "SOFTMAX"), (200, NAMES[3]), (70000, NAMES[4]))]
    anns = [(), ((P.ANNOTATION_IID, "iter"),), ((P.ANNOTATION_IID, "correlation"),)]
    for seq, uuid, t0, ev, an in itertools.product([1, 2**31 + 1], [7, (1 << 56) + 3], [0, 1_700_000_000_123_456_789],
                                                   names, anns):
        (p,) = pb.Trace.FromString(P.sequence_start(seq, uuid, t0, ev, an)).packet
        assert p.trusted_packet_sequence_id == seq and p.first_packet_on_sequence
        assert p.sequence_flags == pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        d = p.trace_packet_defaults
        assert d.timestamp_clock_id == P.CLOCK_SEQ and d.track_event_defaults.track_uuid == uuid
        assert [(n.iid, n.name) for n in p.interned_data.event_names] == list(ev)
        assert [(n.iid, n.name) for n in p.interned_data.debug_annotation_names] == list(an)
        clocks = {c.clock_id: (c.timestamp, c.is_incremental) for c in p.clock_snapshot.clocks}
        assert clocks == {P.CLOCK_BOOTTIME: (t0, False), P.CLOCK_SEQ: (t0, True)}


def test_hot_packets_parse_back():
    rng = np.random.default_rng(1)
    n = 4000
    track = np.sort(rng.integers(0, 40, n))
    ts = np.zeros(n, np.int64)
    for t in np.unique(track):  # times per track increasing, deltas of every varint length
        m = track == t
        ts[m] = 10**18 + np.cumsum(rng.choice([0, 1, 200, 70_000, 3 * 10**9, 2**40], m.sum()))
    typ = rng.choice([P.TYPE_BEGIN, P.TYPE_END, P.TYPE_INSTANT, P.TYPE_COUNTER], n)
    name_iid = np.where(typ == P.TYPE_END, 0, rng.integers(1, 300, n))
    ann = np.where(rng.random(n) < 0.5, rng.choice([0, 5, 127, 128, 2**35], n), -1)
    flow_out = np.where(rng.random(n) < 0.2, rng.choice([1, 300, 2**48 + 9], n), 0)
    flow_in = np.where(rng.random(n) < 0.2, rng.choice([2, 2**20], n), 0)
    counter = rng.choice([0, 1, 96, 2**33, -3], n)
    seq_of_track = np.arange(40, dtype=np.int64) * 1000 + 2**31
    hot = P.track_packets(track, ts, typ, seq_of_track, name_iid=name_iid, annotation=ann, flow_out=flow_out,
                          flow_in=flow_in, counter=counter, clock_offset=17)
    data = hot.data.tobytes()
    got = list(pb.Trace.FromString(data).packet)
    assert len(got) == n and int(hot.ends[-1]) == len(data)
    dts, t0 = P.track_deltas(track, ts, 40)
    assert np.array_equal(hot.t0_of_track[hot.per_track > 0], t0[hot.per_track > 0] + 17)
    for i, p in enumerate(got):
        te = p.track_event
        assert p.trusted_packet_sequence_id == seq_of_track[track[i]] and p.timestamp == dts[i]
        assert te.type == typ[i]
        assert te.name_iid == name_iid[i]
        if ann[i] >= 0:
            assert len(te.debug_annotations) == 1
            assert te.debug_annotations[0].name_iid == P.ANNOTATION_IID
            assert te.debug_annotations[0].int_value == ann[i]
        else:
            assert not te.debug_annotations
        assert list(te.flow_ids_old) == ([flow_out[i]] if flow_out[i] else [])
        assert list(te.terminating_flow_ids_old) == ([flow_in[i]] if flow_in[i] else [])
        assert te.counter_value == (counter[i] if typ[i] == P.TYPE_COUNTER else 0)


def test_compressed_batches_hold_the_same_packets():
    small = b"".join(P.descriptor(i + 1, f"track {i}", 1) for i in range(50))
    hot = P.track_packets(np.zeros(5000, np.int64), np.arange(5000, dtype=np.int64) * 10,
                          np.full(5000, P.TYPE_INSTANT, np.int64), np.array([3], np.int64),
                          name_iid=np.ones(5000, np.int64))
    blobs = P.compress_packets([small, hot.data], chunk_bytes=4096, ends=hot.ends)
    inner = []
    for p in pb.Trace.FromString(b"".join(bytes(b) for b in blobs)).packet:
        inner += list(pb.Trace.FromString(zlib.decompress(p.compressed_packets)).packet)
    plain = list(pb.Trace.FromString(small + hot.data.tobytes()).packet)
    assert len(blobs) > 4 and inner == plain
