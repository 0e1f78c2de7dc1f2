"""Perfetto export: parse the file back with the perfetto protos and check it against the Arrow rows.

The reader below replays what the trace processor does with our packets (sequence-scoped
incremental clock, per-sequence interning and defaults, compressed batches) and rebuilds every
slice with a BEGIN/END stack per track. A slice is a TYPE_SLICE_BEGIN or TYPE_INSTANT track
event on a slice (non-counter) track; each Arrow row must come back as exactly one slice, with
its exact ns times, name, iteration, and a track under the right GPU > SM > CTA > warp.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from fa4trace.export.perfetto import to_perfetto
from fa4trace.export.tracks import layout_tracks
from fa4trace.format.vocab import VOCAB
from fa4trace.trace.bundle import Trace
from fa4trace.trace.decode import SCHEMA, decode_buffer
from fa4trace.testing.bundles import attention_like

from trace_strategies import random_traces

TE = pb.TrackEvent
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# ---- a reader that replays the trace processor's view of our packets -------------------------

def read_packets(data: bytes) -> list:
    out = []
    for p in pb.Trace.FromString(data).packet:
        if p.HasField("compressed_packets"):
            out.extend(read_packets(zlib.decompress(p.compressed_packets)))
        else:
            out.append(p)
    return out


@dataclass
class Slice:
    track: int
    name: str
    start: int
    end: int
    iter: int
    depth: int
    flow_out: tuple = ()
    flow_in: tuple = ()


@dataclass
class Parsed:
    tracks: dict = field(default_factory=dict)  # uuid -> TrackDescriptor
    events: list = field(default_factory=list)  # (track, ts, type, name, iter, flow_out, flow_in, counter)
    slices: list = field(default_factory=list)
    counters: dict = field(default_factory=lambda: defaultdict(list))  # track -> [(ts, value)]

    def ancestors(self, uuid):
        out, seen = [], set()
        while uuid:
            assert uuid not in seen, "cycle in the track tree"
            seen.add(uuid)
            out.append(self.tracks[uuid])
            uuid = self.tracks[uuid].parent_uuid if self.tracks[uuid].HasField("parent_uuid") else 0
        return out

    def place(self, uuid) -> dict:
        """launch/sm/cta/warp/role of a slice track, read from its ancestors' names."""
        d = {}
        for td in self.ancestors(uuid):
            nm = td.name
            if m := re.fullmatch(r"warp (\d+) · (\w+)", nm):
                d["warp"], d["role"] = int(m[1]), m[2]
            elif m := re.fullmatch(r"CTA (\d+)", nm):
                d["cta"] = int(m[1])
            elif m := re.fullmatch(r"SM (\d+)", nm):
                d["sm"] = int(m[1])
            elif m := re.fullmatch(r"launch (\d+).*", nm):
                d["launch"] = int(m[1])
        return d


def parse(data: bytes) -> Parsed:
    P = Parsed()
    seqs: dict = {}
    for p in read_packets(data):
        seq = p.trusted_packet_sequence_id
        s = seqs.setdefault(seq, {"names": {}, "dnames": {}, "defaults": None, "clock": {}})
        if p.incremental_state_cleared or p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            s.update(names={}, dnames={}, defaults=None, clock={})
        if p.HasField("trace_packet_defaults"):
            s["defaults"] = p.trace_packet_defaults
        if p.HasField("interned_data"):
            for e in p.interned_data.event_names:
                assert s["names"].get(e.iid, e.name) == e.name, "iid redefined with another name"
                s["names"][e.iid] = e.name
            for e in p.interned_data.debug_annotation_names:
                s["dnames"][e.iid] = e.name
        if p.HasField("clock_snapshot"):
            boot = [c.timestamp for c in p.clock_snapshot.clocks if c.clock_id == 6]
            for c in p.clock_snapshot.clocks:
                if 64 <= c.clock_id < 128:
                    assert boot, "a sequence clock needs a BOOTTIME reading in its snapshot"
                    s["clock"][c.clock_id] = {"value": c.timestamp, "inc": c.is_incremental,
                                              "offset": boot[0] - c.timestamp}
            continue  # the trace processor reads nothing else from a snapshot packet
        if p.HasField("track_descriptor"):
            td = p.track_descriptor
            assert td.uuid not in P.tracks, f"track {td.uuid} described twice"
            P.tracks[td.uuid] = td
        if p.HasField("track_event"):
            te = p.track_event
            d = s["defaults"]
            cid = p.timestamp_clock_id or (d.timestamp_clock_id if d is not None else 0)
            if cid in s["clock"]:
                c = s["clock"][cid]
                c["value"] = c["value"] + p.timestamp if c["inc"] else p.timestamp
                ts = c["value"] + c["offset"]
            else:
                assert 64 > cid, "packet uses a sequence clock without a snapshot"
                ts = p.timestamp
            track = te.track_uuid if te.HasField("track_uuid") else d.track_event_defaults.track_uuid
            name = None
            if te.HasField("name_iid"):
                assert te.name_iid in s["names"], f"name iid {te.name_iid} not interned on sequence {seq}"
                name = s["names"][te.name_iid]
            it = -1
            for da in te.debug_annotations:
                assert s["dnames"].get(da.name_iid) == "iter", "debug annotation name does not resolve"
                it = da.int_value
            P.events.append((track, ts, te.type, name, it, tuple(te.flow_ids_old) + tuple(te.flow_ids),
                             tuple(te.terminating_flow_ids_old) + tuple(te.terminating_flow_ids),
                             te.counter_value))
    # rebuild slices: per track, events must come in time order and close what they opened
    stacks: dict = defaultdict(list)
    last_ts: dict = {}
    for track, ts, typ, name, it, fo, fi, cv in P.events:
        assert track in P.tracks, f"event on undescribed track {track}"
        assert ts >= last_ts.get(track, ts), f"track {track}: time goes backwards"
        last_ts[track] = ts
        if typ == TE.TYPE_COUNTER:
            assert P.tracks[track].HasField("counter")
            P.counters[track].append((ts, cv))
            continue
        assert not P.tracks[track].HasField("counter"), "slice event on a counter track"
        stk = stacks[track]
        if typ == TE.TYPE_SLICE_BEGIN:
            stk.append(Slice(track, name, ts, -1, it, len(stk), fo, fi))
        elif typ == TE.TYPE_SLICE_END:
            assert stk, f"track {track}: END without an open slice"
            sl = stk.pop()
            sl.end = ts
            P.slices.append(sl)
        elif typ == TE.TYPE_INSTANT:
            P.slices.append(Slice(track, name, ts, ts, it, len(stk), fo, fi))
        else:
            raise AssertionError(f"unexpected track event type {typ}")
    assert all(not s for s in stacks.values()), "slices left open at the end of the trace"
    return P


def check_tree(P: Parsed):
    roots = [td for td in P.tracks.values() if not td.HasField("parent_uuid")]
    assert len(roots) == 1 and roots[0].HasField("process"), "one process-like GPU root"
    for td in P.tracks.values():
        if td.HasField("parent_uuid"):
            assert td.parent_uuid in P.tracks, f"track {td.name!r}: parent {td.parent_uuid} does not exist"
            assert td.HasField("sibling_order_rank")
        assert td.sibling_merge_behavior == pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_NONE
        P.ancestors(td.uuid)  # no cycles


def check_against_rows(P: Parsed, events: pa.Table, *, iterations=True):
    """Every row is exactly one slice, on a track under its own launch/SM/CTA/warp."""
    df = events.to_pandas()
    multi = df["launch"].nunique() > 1
    assert len(P.slices) == len(df), "slices (BEGIN + INSTANT on slice tracks) != Arrow rows"
    got = Counter()
    for sl in P.slices:
        pl = P.place(sl.track)
        got[(pl.get("launch", 0) if multi else 0, pl["sm"], pl["cta"], pl["warp"], pl["role"],
             sl.name, sl.start, sl.end, sl.iter)] += 1
    shift = max(0, -int(df["start_ns"].min())) if len(df) else 0
    want = Counter(
        (int(r.launch) if multi else 0, int(r.sm), int(r.cta), int(r.warp), str(r.role), str(r.name),
         int(r.start_ns) + shift, max(int(r.end_ns), int(r.start_ns)) + shift, int(r.iter) if iterations else -1)
        for r in df.itertuples())
    assert got == want
    # async spans are never on the warp's own track
    async_names = VOCAB.async_names()
    for sl in P.slices:
        if sl.name in async_names:
            assert "in flight" in P.tracks[sl.track].name


def expected_edges(events: pa.Table) -> set:
    df = events.to_pandas()
    df = df[(df["kind"] == "span") & (df["iter"] >= 0)]
    key = ["launch", "cta", "warp", "iter"]
    first = {nm: df[df["name"] == nm].groupby(key, sort=False).first() for nm in ("QK", "SOFTMAX", "PV")}
    out = set()
    for a, b in (("QK", "SOFTMAX"), ("SOFTMAX", "PV")):
        j = first[a].merge(first[b], left_index=True, right_index=True, suffixes=("_a", "_b"))
        for k, r in j.iterrows():
            if r["start_ns_a"] < r["start_ns_b"]:
                out.add((a, b) + tuple(int(x) for x in k) + (int(r["start_ns_a"]), int(r["start_ns_b"])))
    return out


def check_flows(P: Parsed, events: pa.Table):
    src, dst = {}, {}
    for sl in P.slices:
        for f in sl.flow_out:
            assert f not in src, f"flow {f} starts twice"
            src[f] = sl
        for f in sl.flow_in:
            assert f not in dst, f"flow {f} ends twice"
            dst[f] = sl
    assert set(src) == set(dst), "every flow must start and terminate on an existing slice"
    multi = len(set(events.column("launch").to_pylist())) > 1
    edges = set()
    for f, a in src.items():
        b = dst[f]
        pa_, pb_ = P.place(a.track), P.place(b.track)
        assert (pa_.get("launch"), pa_["cta"], pa_["warp"]) == (pb_.get("launch"), pb_["cta"], pb_["warp"])
        assert a.iter == b.iter and a.start < b.start
        edges.add((a.name, b.name, pa_.get("launch", 0), pa_["cta"], pa_["warp"], a.iter, a.start, b.start))
    want = {(a, b, launch if multi else 0, *rest) for (a, b, launch, *rest) in expected_edges(events)}
    assert edges == want
    return len(src)


def export(trace, **kw) -> tuple[bytes, object]:
    f = io.BytesIO()
    stats = to_perfetto(trace, f, **kw)
    data = f.getvalue()
    assert stats.bytes == len(data)
    return data, stats


# ---- traces ----------------------------------------------------------------------------------

def synthetic(schedule="pingpong", n_ctas=3, n_blocks=5, seed=0) -> Trace:
    buf, meta = attention_like(schedule, n_ctas=n_ctas, n_blocks=n_blocks, seed=seed)
    return Trace.from_launches([decode_buffer(buf)], meta)


def table(rows) -> pa.Table:
    """rows: (launch, cta, sm, warp, role, name, kind, iter, start, end)."""
    cols = list(zip(*rows))
    def dict_col(vals, idx_type):
        uniq = sorted(set(vals))
        return pa.DictionaryArray.from_arrays(pa.array([uniq.index(v) for v in vals], idx_type), pa.array(uniq))
    return pa.table({
        "launch": pa.array(cols[0], pa.int16()), "cta": pa.array(cols[1], pa.int32()),
        "sm": pa.array(cols[2], pa.int16()), "warp": pa.array(cols[3], pa.int16()),
        "role": dict_col(cols[4], pa.int16()), "name": dict_col(cols[5], pa.int16()),
        "kind": dict_col(cols[6], pa.int8()), "iter": pa.array(cols[7], pa.int32()),
        "start_ns": pa.array(cols[8], pa.int64()), "end_ns": pa.array(cols[9], pa.int64()),
        "start_cycles": pa.array(cols[8], pa.int64()), "end_cycles": pa.array(cols[9], pa.int64()),
        "dropped": pa.array([0] * len(rows), pa.int32()),
    }, schema=SCHEMA)


# ---- tests -----------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["base", "pingpong"])
def test_synthetic_attention_round_trip(schedule):
    tr = synthetic(schedule)
    data, stats = export(tr)
    P = parse(data)
    check_tree(P)
    check_against_rows(P, tr.events)
    n_flows = check_flows(P, tr.events)
    assert n_flows == stats.flows > 0
    assert stats.slices == tr.events.num_rows
    assert stats.packets == len(read_packets(data))
    # warps sort by index under their CTA, async tracks hang under their warp
    for td in P.tracks.values():
        if m := re.fullmatch(r"warp (\d+) · \w+", td.name):
            assert td.sibling_order_rank == int(m[1])
            assert re.fullmatch(r"CTA \d+", P.tracks[td.parent_uuid].name)
        if "in flight" in td.name:
            assert re.fullmatch(r"warp \d+ · \w+", P.tracks[td.parent_uuid].name)
    # the "warps active" counter counts the warps alive over time
    (ctr,) = [u for u, td in P.tracks.items() if td.name == "warps active"]
    vals = [v for _, v in P.counters[ctr]]
    assert max(vals) <= tr.events.to_pandas().query("kind == 'warp'").shape[0] and vals[-1] == 0


def test_compressed_output_holds_the_same_packets():
    tr = synthetic("pingpong", n_ctas=4, n_blocks=20)
    plain, s1 = export(tr)
    comp, s2 = export(tr, compress=True, chunk_bytes=4096)  # several batches
    outer = pb.Trace.FromString(comp).packet
    assert len(outer) > 2 and all(p.HasField("compressed_packets") for p in outer)
    assert [p.SerializeToString() for p in read_packets(comp)] == [p.SerializeToString() for p in read_packets(plain)]
    assert s2.bytes < s1.bytes and s2.bytes_uncompressed == s1.bytes and s2.compressed
    # each batch ends on a packet boundary: it parses alone
    for p in outer:
        pb.Trace.FromString(zlib.decompress(p.compressed_packets))


def test_path_and_file_outputs_are_identical(tmp_path):
    tr = synthetic("base", n_ctas=2, n_blocks=3)
    path = tmp_path / "t.pftrace"
    stats = to_perfetto(tr, path)
    data, _ = export(tr)
    assert path.read_bytes() == data and stats.bytes == path.stat().st_size


def test_options_drop_what_they_say():
    tr = synthetic("pingpong", n_ctas=2, n_blocks=4)
    full, s_full = export(tr, inflight_counters=True)
    bare, s_bare = export(tr, flows=False, iterations=False, counters=False)
    P = parse(bare)
    check_against_rows(P, tr.events, iterations=False)
    assert s_bare.flows == 0 and not P.counters and all(not s.flow_out for s in P.slices)
    assert s_bare.bytes < s_full.bytes
    Pf = parse(full)
    inflight = [u for u, td in Pf.tracks.items() if td.name == "async in flight"]
    assert len(inflight) == 2  # one per CTA
    for u in inflight:
        assert re.fullmatch(r"CTA \d+", Pf.tracks[Pf.tracks[u].parent_uuid].name)
        assert all(v >= 0 for _, v in Pf.counters[u]) and Pf.counters[u][-1][1] == 0


def test_crossing_spans_get_extra_lanes_and_everything_nests():
    rows = [
        (0, 0, 0, 1, "consumer", "WARP", "warp", -1, 0, 1000),
        (0, 0, 0, 1, "consumer", "SOFTMAX", "span", 0, 100, 300),
        (0, 0, 0, 1, "consumer", "CORRECTION", "span", 0, 290, 350),  # crosses SOFTMAX(0)
        (0, 0, 0, 1, "consumer", "QK", "span", 0, 10, 120),
        (0, 0, 0, 1, "consumer", "QK", "span", 1, 50, 400),  # in flight with QK(0): crosses it
        (0, 0, 0, 1, "consumer", "PV", "span", 0, 360, 500),
        (0, 0, 0, 1, "consumer", "MARK", "instant", 3, 300, 300),
        (0, 0, 0, 1, "consumer", "MARK", "span", -1, 300, 300),  # zero-length span
        (0, 0, 0, 1, "consumer", "SOFTMAX", "span", 1, 400, 600),
        (0, 0, 0, 1, "consumer", "CORRECTION", "span", 1, 400, 600),  # identical interval: nests
    ]
    tr = Trace(table(rows), {"kernel": "hand"})
    data, stats = export(tr)
    P = parse(data)
    check_tree(P)
    check_against_rows(P, tr.events)
    names = sorted(td.name for td in P.tracks.values())
    assert "warp 1 · consumer · overlap 1" in names and "QK in flight (2)" in names
    assert stats.extra_lanes == 2
    # the flows: QK(0) -> SOFTMAX(0) -> PV(0); QK(1) -> SOFTMAX(1)
    assert check_flows(P, tr.events) == 3


@pytest.mark.parametrize("rounds", [1, 1000])
def test_many_mutually_crossing_spans(rounds, monkeypatch):
    import fa4trace.export.tracks as ft

    monkeypatch.setattr(ft, "MAX_LANE_ROUNDS", rounds)  # 1: the exact greedy fallback takes over
    n = 40
    rows = [(0, 0, 0, 0, "consumer", "SOFTMAX", "span", i, i, i + 100) for i in range(n)]
    rows += [(0, 0, 0, 0, "consumer", "MARK", "span", 5, 1000 + 10 * i, 1000 + 10 * i + 5) for i in range(5)]
    tr = Trace(table(rows), {"kernel": "hand"})
    lay = layout_tracks(tr.events)
    assert lay.n_tracks == n  # every SOFTMAX crosses every other: n lanes are needed, no more
    assert (lay.greedy_groups > 0) == (rounds == 1)
    P = parse(export(tr)[0])
    check_against_rows(P, tr.events)


def test_a_chain_of_in_flight_spans_splits_over_two_lanes():
    # QK(i) is still in flight when QK(i+1) is issued, for every i: a chain, 2-colourable
    rows = [(0, 0, 0, 0, "consumer", "QK", "span", i, 10 * i, 10 * i + 15) for i in range(50)]
    tr = Trace(table(rows), {"kernel": "hand"})
    lay = layout_tracks(tr.events)
    assert sorted(lay.track_label(t) for t in range(lay.n_tracks)) == [
        "QK in flight", "QK in flight (2)", "warp 0 · consumer"]
    assert lay.lane_rounds <= 3 and lay.greedy_groups == 0
    check_against_rows(parse(export(tr)[0]), tr.events)


def test_multi_launch_tracks_stay_distinct():
    b0, meta = attention_like("base", n_ctas=2, n_blocks=2, seed=1)
    b1, _ = attention_like("pingpong", n_ctas=2, n_blocks=2, seed=2)
    tr = Trace.from_launches([decode_buffer(b0, launch_index=0), decode_buffer(b1, launch_index=1)], meta)
    P = parse(export(tr)[0])
    check_tree(P)
    check_against_rows(P, tr.events)
    launches = [td for td in P.tracks.values() if td.name.startswith("launch ")]
    assert sorted(td.name.split(" · ")[0] for td in launches) == ["launch 0", "launch 1"]
    check_flows(P, tr.events)


def test_empty_table_gives_a_valid_trace():
    tr = Trace(SCHEMA.empty_table(), {"kernel": "empty"})
    data, stats = export(tr)
    P = parse(data)
    check_tree(P)
    assert stats.slices == 0 and not P.slices


@SETTINGS
@given(random_traces())
def test_random_traces_round_trip(tr):
    plain, stats = export(tr)
    P = parse(plain)
    check_tree(P)
    check_against_rows(P, tr.events)
    assert check_flows(P, tr.events) == stats.flows
    comp, _ = export(tr, compress=True, chunk_bytes=512)
    assert [p.SerializeToString() for p in read_packets(comp)] == [p.SerializeToString() for p in read_packets(plain)]


@SETTINGS
@given(random_traces())
def test_layout_tracks_nest_strictly(tr):
    ev = tr.events.to_pandas()
    lay = layout_tracks(tr.events)
    ev["track"] = lay.row_track
    lanes = defaultdict(set)  # lanes of each (warp, class) are numbered densely
    for t in range(lay.n_tracks):
        lanes[(int(lay.track_warp[t]), int(lay.track_class[t]))].add(int(lay.track_lane[t]))
    assert all(v == set(range(len(v))) for v in lanes.values())
    own = [int(lay.track_warp[t]) for t in range(lay.n_tracks) if lay.track_class[t] == 0 and lay.track_lane[t] == 0]
    assert sorted(own) == list(range(lay.warp_index.size))  # every warp has its own track
    for _, g in ev.groupby("track"):
        assert g[["launch", "cta", "warp"]].drop_duplicates().shape[0] == 1
        iv = [(int(a), int(b)) for a, b, k in zip(g.start_ns, g.end_ns, g.kind) if k != "instant" and b > a]
        for i, (s1, e1) in enumerate(iv):  # laminar: any two spans are disjoint or nested
            for s2, e2 in iv[i + 1:]:
                assert e1 <= s2 or e2 <= s1 or (s1 <= s2 and e2 <= e1) or (s2 <= s1 and e1 <= e2)


def test_host_module_imports_without_gpu_stacks():
    code = ("import sys, fa4trace.export.perfetto, fa4trace.export.chrome; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'cutlass', 'cuda', 'tvm_ffi')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _trace_processor_shell():
    for cand in (os.environ.get("TRACE_PROCESSOR_SHELL"), shutil.which("trace_processor_shell"),
                 shutil.which("trace_processor")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def test_real_trace_processor_reads_it(tmp_path):
    """Runs only where a trace_processor_shell binary is already on this machine (never downloads)."""
    shell = _trace_processor_shell()
    if shell is None:
        pytest.skip("no trace_processor_shell binary here (set TRACE_PROCESSOR_SHELL); "
                    "the perfetto package would download one, which this offline machine cannot")
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    tr = synthetic("pingpong", n_ctas=2, n_blocks=4)
    path = tmp_path / "t.pftrace"
    stats = to_perfetto(tr, path, compress=True)
    tp = TraceProcessor(trace=str(path), config=TraceProcessorConfig(bin_path=shell, load_timeout=30))
    try:
        n = tp.query("select count(*) as n from slice").as_pandas_dataframe()["n"][0]
        assert n == tr.events.num_rows
        nf = tp.query("select count(*) as n from flow").as_pandas_dataframe()["n"][0]
        assert nf == stats.flows
        it = tp.query("select count(*) as n from slice join args using(arg_set_id) where key = 'debug.iter'"
                      ).as_pandas_dataframe()["n"][0]
        assert it == int((tr.events.column("iter").to_numpy() >= 0).sum())
        errs = tp.query("select name, value from stats where value > 0 and severity in ('error', 'data_loss')"
                        ).as_pandas_dataframe()
        assert errs.empty, errs
    finally:
        tp.close()
