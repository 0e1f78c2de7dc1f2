"""fa4trace.profiler: torch.profiler traces + bundles -> one Perfetto trace (no GPU).

The profiler traces are synthetic (fa4trace.testing.profiler: Kineto's layout around
re-timed bundles, with the truth of where each traced launch ran) plus one real CPU-only
torch.profiler trace. Every merged file is parsed back with the perfetto package's protos by a
reader that replays the trace processor's view of the packets (sequence-scoped interning and
incremental clocks, compressed batches, BEGIN/END stacks per track) and checked: every Kineto
event and every bundle row is exactly one slice, on the right track, every warp slice inside
its kernel's slice, every arrow between existing slices, every id unique.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from fa4trace import Trace
from fa4trace.trace import decode
from fa4trace.format.errors import Fa4traceError, TraceFormatError
from fa4trace.profiler import load_kineto, match_launches, merge, read_report, traced_launches
from fa4trace.profiler.kineto import parse_kineto
from fa4trace.testing.profiler import profiled_run
from fa4trace.testing.bundles import attention_like, pipelined_like

TE = pb.TrackEvent


# ---- bundles -----------------------------------------------------------------------------------

def auto_bundle(n_launches=2, qualname="FlashAttentionForwardSm90.kernel", n_ctas=4, k_tiles=8) -> Trace:
    """An automatically traced kernel's bundle with several launches (fa4trace.testing.bundles.pipelined_like)."""
    ds, meta, vocab = [], None, None
    for i in range(n_launches):
        buf, meta, vocab = pipelined_like(n_ctas=n_ctas, k_tiles=k_tiles + i)
        ds.append(decode.decode_buffer(buf, launch_index=i, vocab=vocab))
    meta["instrument"]["kernels"] = [qualname]
    meta["kernel"] = qualname.split(".")[0]
    return Trace.from_launches(ds, meta, vocab=vocab)


def attention_bundle(schedule="pingpong", n_ctas=6, n_blocks=6) -> Trace:
    buf, meta = attention_like(schedule, n_ctas=n_ctas, n_blocks=n_blocks)
    return Trace.from_launches([decode.decode_buffer(buf)], meta)


@pytest.fixture(scope="module")
def bundles():
    return [auto_bundle(2), auto_bundle(3, "RMSNorm.kernel"), attention_bundle()]


# ---- a reader of the merged file ----------------------------------------------------------------

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
    args: dict
    flow_out: tuple = ()
    flow_in: tuple = ()


@dataclass
class Merged:
    tracks: dict = field(default_factory=dict)
    slices: list = field(default_factory=list)
    counters: int = 0

    def ancestors(self, uuid) -> list:
        out, seen = [], set()
        while uuid:
            assert uuid not in seen, "cycle in the track tree"
            seen.add(uuid)
            td = self.tracks[uuid]
            out.append(td)
            uuid = td.parent_uuid if td.HasField("parent_uuid") else 0
        return out

    def by_track(self) -> dict:
        d = defaultdict(list)
        for s in self.slices:
            d[s.track].append(s)
        return d


def parse(data: bytes) -> Merged:
    M = Merged()
    seqs: dict = {}
    events = []
    for p in read_packets(data):
        seq = p.trusted_packet_sequence_id
        s = seqs.setdefault(seq, {"names": {}, "dnames": {}, "defaults": None, "clock": {}})
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            s.update(names={}, dnames={}, defaults=None, clock={})
        if p.HasField("trace_packet_defaults"):
            s["defaults"] = p.trace_packet_defaults
        if p.HasField("interned_data"):
            for e in p.interned_data.event_names:
                assert s["names"].get(e.iid, e.name) == e.name
                s["names"][e.iid] = e.name
            for e in p.interned_data.debug_annotation_names:
                s["dnames"][e.iid] = e.name
        if p.HasField("clock_snapshot"):
            boot = [c.timestamp for c in p.clock_snapshot.clocks if c.clock_id == 6]
            for c in p.clock_snapshot.clocks:
                if 64 <= c.clock_id < 128:
                    s["clock"][c.clock_id] = {"value": c.timestamp, "inc": c.is_incremental, "offset": boot[0] - c.timestamp}
            continue
        if p.HasField("track_descriptor"):
            td = p.track_descriptor
            assert td.uuid not in M.tracks, f"track {td.uuid} described twice"
            M.tracks[td.uuid] = td
        if p.HasField("track_event"):
            te = p.track_event
            d = s["defaults"]
            cid = p.timestamp_clock_id or (d.timestamp_clock_id if d is not None else 0)
            if cid in s["clock"]:
                c = s["clock"][cid]
                c["value"] = c["value"] + p.timestamp if c["inc"] else p.timestamp
                ts = c["value"] + c["offset"]
            else:
                assert cid < 64, "a sequence clock without a snapshot"
                ts = p.timestamp
            track = te.track_uuid if te.HasField("track_uuid") else d.track_event_defaults.track_uuid
            name = te.name if te.HasField("name") else (s["names"][te.name_iid] if te.HasField("name_iid") else None)
            args = {}
            for da in te.debug_annotations:
                key = da.name if da.HasField("name") else s["dnames"][da.name_iid]
                args[key] = (da.string_value if da.HasField("string_value") else da.bool_value if da.HasField("bool_value")
                             else da.int_value)
            events.append((track, ts, te.type, name, args, tuple(te.flow_ids_old) + tuple(te.flow_ids),
                           tuple(te.terminating_flow_ids_old) + tuple(te.terminating_flow_ids)))
    stacks = defaultdict(list)
    last = {}
    for track, ts, typ, name, args, fo, fi in events:
        assert track in M.tracks, f"event on undescribed track {track}"
        assert ts >= last.get(track, ts), f"track {track}: time goes backwards"
        last[track] = ts
        if typ == TE.TYPE_COUNTER:
            M.counters += 1
            continue
        if typ == TE.TYPE_SLICE_BEGIN:
            stacks[track].append(Slice(track, name, ts, -1, args, fo, fi))
        elif typ == TE.TYPE_SLICE_END:
            assert stacks[track], f"track {track}: END without BEGIN"
            sl = stacks[track].pop()
            sl.end = ts
            M.slices.append(sl)
        else:
            assert typ == TE.TYPE_INSTANT
            M.slices.append(Slice(track, name, ts, ts, args, fo, fi))
    assert not any(stacks.values()), "slices left open"
    return M


def traced_roots(M: Merged) -> dict:
    """uuid of each "traced launch b.k" track -> (b, k)."""
    out = {}
    for u, td in M.tracks.items():
        m = re.search(r"traced launch (\d+)\.(\d+)$", td.name)
        if m:
            out[u] = (int(m[1]), int(m[2]))
    return out


def check_merged(M: Merged, kt, traces, report) -> None:
    """The file's promises (module docstring), against the inputs and the report."""
    # every Kineto event is one slice on a track under its process (same name, start, end)
    want = Counter((kt.names[int(kt.name[i])], int(kt.ts[i]), int(kt.ts[i] + kt.dur[i])) for i in range(kt.n))
    roots = traced_roots(M)
    under_traced = {}
    for u in M.tracks:
        anc = [a.uuid for a in M.ancestors(u)]
        hit = [a for a in anc if a in roots]
        if hit:
            under_traced[u] = roots[hit[0]]
    host = Counter((s.name, s.start, s.end) for s in M.slices
                   if s.track not in under_traced and s.name not in ("fa4trace merge",))
    assert host == want
    # every row of every drawn launch is one slice under its traced launch, inside the kernel slice
    entries = {(e["bundle"], e["launch"]): e for e in report.launches}
    got = defaultdict(Counter)
    summaries = {}
    for s in M.slices:
        if s.track in roots:
            summaries[roots[s.track]] = s
        elif s.track in under_traced:
            got[under_traced[s.track]][(s.name, s.start - entries[under_traced[s.track]]["shift_ns"],
                                        s.end - entries[under_traced[s.track]]["shift_ns"])] += 1
    for key, e in entries.items():
        summ = summaries[key]
        assert (summ.start, summ.end) == (e["kernel_start_ns"], e["kernel_start_ns"] + e["kernel_dur_ns"])
        ev = traces[key[0]].events
        ev = ev.filter(np.asarray(ev["launch"].to_numpy() == key[1]))
        if not e["warps_drawn"]:
            assert not got.get(key) and "not drawn" in summ.name
            continue
        st, en = ev["start_ns"].to_numpy(), np.maximum(ev["end_ns"].to_numpy(), ev["start_ns"].to_numpy())
        assert got[key] == Counter(zip(ev["name"].to_pylist(), st.tolist(), en.tolist()))
        assert e["outside"] == int(((st + e["shift_ns"] < summ.start) | (en + e["shift_ns"] > summ.end)).sum())
        # the traced launch hangs under the stream track of its kernel
        stream = M.tracks[[u for u, r in roots.items() if r == key][0]].parent_uuid
        assert M.tracks[stream].name.strip() == f"stream {e['stream']}"
    # flows: each id leaves one slice and ends on another
    src, dst = {}, {}
    for s in M.slices:
        for f in s.flow_out:
            assert f not in src
            src[f] = s
        for f in s.flow_in:
            assert f not in dst
            dst[f] = s
    assert set(src) == set(dst)
    for key, summ in summaries.items():  # each traced kernel points at its traced launch slice
        assert len(summ.flow_in) == 1 and src[summ.flow_in[0]].start == summ.start


def merged(tmp_path, run, **kw):
    kt = parse_kineto(run.text.encode(), "syn.json")
    out = tmp_path / "m.pftrace"
    rep = merge(kt, run.traces, out, force=True, **kw)
    return kt, rep, parse(out.read_bytes()), out


# ---- reading Kineto traces ----------------------------------------------------------------------

def test_reads_a_real_cpu_only_torch_profiler_trace(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with record_function("my block"):
            (x @ x).relu().sum()
    path = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    kt = load_kineto(path)
    xs = [e for e in doc["traceEvents"] if e.get("ph") in ("X", "i")]
    assert kt.n == len(xs) and kt.base_ns == int(doc["baseTimeNanoseconds"])
    names = {kt.names[c] for c in kt.name.tolist()}
    assert "my block" in names and any(n.startswith("aten::") for n in names)
    i = next(i for i, e in enumerate(xs) if e["name"] == "my block")
    assert abs(int(kt.ts[i]) - (kt.base_ns + round(xs[i]["ts"] * 1000))) <= 1
    assert kt.kernels().size == 0  # CPU only: merging reports that in one line
    rep_err = None
    try:
        merge(kt, [auto_bundle(1)], tmp_path / "o.pftrace")
    except Fa4traceError as exc:
        rep_err = str(exc)
    assert rep_err and "no CUDA kernel activity" in rep_err and "\n" not in rep_err


def test_kineto_columns_match_the_trace_text(bundles):
    run = profiled_run(bundles, steps=2, layers=2)
    doc = run.doc
    kt = parse_kineto(run.text.encode(), "t.json")
    evs = [e for e in doc["traceEvents"] if e.get("ph") in ("X", "i")]
    assert kt.n == len(evs)
    cats = Counter(kt.cats[c] for c in kt.cat.tolist())
    assert cats == Counter(e.get("cat", "") for e in evs)
    for i in range(0, kt.n, 37):  # exact ns from the three-decimal text
        e = evs[i]
        assert kt.ts[i] == kt.base_ns + int(round(e["ts"] * 1000))
    # kernels sit on device tracks, launch calls and ops on host threads; ac2g arrows pair them
    assert all(kt.tracks[t].device for t in kt.track[kt.cat_mask("kernel")].tolist())
    assert not any(kt.tracks[t].device for t in kt.track[kt.cat_mask("cpu_op")].tolist())
    n_launch = int(kt.cat_mask("cuda_runtime", "cuda_driver").sum())
    # Kineto's ac2g arrows pair each launch call with its kernel: the correlation ids say the same
    assert kt.flow_src.size == 0 and kt.skipped == {}
    arrows = {e["id"] for e in doc["traceEvents"] if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    calls = kt.launch_calls()
    assert arrows == {int(kt.correlation[r]) for r in np.flatnonzero(kt.cat_mask("kernel", "gpu_memcpy", "gpu_memset"))}
    for r in kt.kernels().tolist():
        assert int(kt.correlation[r]) in calls
    assert n_launch > kt.kernels().size  # synchronize calls too
    assert kt.gpu_names() == ["NVIDIA H200"]


def test_the_arrow_and_python_scans_read_the_same(bundles, monkeypatch):
    """Arrow types the common fields fast; one Python pass is the fallback: both give the same columns."""
    from fa4trace.profiler import kineto

    run = profiled_run(bundles, steps=2, layers=2)
    doc = run.doc
    doc["traceEvents"].append({"ph": "C", "name": "counter", "pid": 1, "tid": 1, "ts": 1.0})  # skipped, counted
    fast = kineto._columns(doc, kineto_base(doc), "t", False)

    def refuse(events):
        raise TypeError("forced")

    monkeypatch.setattr(kineto, "_scan_arrow", refuse)
    slow = kineto._columns(doc, kineto_base(doc), "t", False)
    for f in ("kind", "ts", "dur", "correlation", "device", "stream", "grid", "block", "flow_src", "flow_dst"):
        assert np.array_equal(getattr(fast, f), getattr(slow, f)), f
    for f in ("cat", "name", "track"):  # codes may differ; the values they stand for may not
        lf = {"cat": fast.cats, "name": fast.names, "track": [(t.pid, t.tid) for t in fast.tracks]}[f]
        ls = {"cat": slow.cats, "name": slow.names, "track": [(t.pid, t.tid) for t in slow.tracks]}[f]
        assert [lf[c] for c in getattr(fast, f).tolist()] == [ls[c] for c in getattr(slow, f).tolist()], f
    assert fast.skipped == slow.skipped == {"C": 1} and fast.flow_cat == slow.flow_cat
    assert [t.label for t in fast.tracks] == [t.label for t in slow.tracks]


def kineto_base(doc) -> int:
    return int(doc["baseTimeNanoseconds"])


def test_times_without_base_are_read_exactly():
    """torch < 2.1 wrote epoch µs (16+ digits, more than a double holds): read from the text."""
    text = ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, '
            '"ts": 1796191290772285.139, "dur": 5.676, "args": {"correlation": 4, "stream": 7}}]}')
    kt = parse_kineto(text.encode())
    assert int(kt.ts[0]) == 1796191290772285139 and int(kt.dur[0]) == 5676


@pytest.mark.parametrize("data, message", [
    (b"PAR1xxxx", "Parquet file"),
    (b"{not json", "is not JSON"),
    (b'{"events": []}', "no traceEvents list"),
    (b"[1, 2]", "no traceEvents list"),
    (b'{"traceEvents": [], "baseTimeNanoseconds": "soon"}', "baseTimeNanoseconds"),
])
def test_bad_profiler_traces_fail_in_one_line(data, message):
    with pytest.raises(TraceFormatError) as ei:
        parse_kineto(data, "p.json")
    assert message in str(ei.value) and "\n" not in str(ei.value)


def test_gzipped_traces_are_read(tmp_path, bundles):
    import gzip

    run = profiled_run(bundles[:1], steps=1, layers=2)
    p = tmp_path / "p.json.gz"
    p.write_bytes(gzip.compress(run.text.encode()))
    assert load_kineto(p).n == parse_kineto(run.text.encode()).n


# ---- matching -------------------------------------------------------------------------------------

def truth_of(run) -> dict:
    return {(t["bundle"], t["launch"]): t["correlation"] for t in run.truth}


def matched(kt, res) -> dict:
    return {(m.launch.bundle, m.launch.launch): int(kt.correlation[m.row]) for m in res.matches}


@pytest.mark.parametrize("kw, method", [
    ({}, "host-time"),
    ({"host_times": False}, "clock-offset"),
    ({"host_times": False, "symbols": False}, "clock-offset"),
    ({"plain_before": True}, "host-time"),
    ({"plain_before": True, "untraced_same_symbol": True}, "host-time"),
    ({"host_times": False, "symbols": False, "plain_before": True}, "clock-offset"),
])
def test_every_traced_launch_finds_its_kernel(bundles, kw, method):
    run = profiled_run(bundles, steps=3, layers=2, **kw)
    kt = parse_kineto(run.text.encode())
    res = match_launches(kt, traced_launches(run.traces))
    assert not res.unmatched
    assert matched(kt, res) == truth_of(run)
    assert {m.method for m in res.matches} == {method}
    if method == "host-time":
        assert not any(m.ambiguous for m in res.matches)


def test_clock_offset_is_recovered_from_launch_times(bundles):
    run = profiled_run(bundles, steps=2, layers=2, host_times=False, clock_offset_ns=-3_250_000, jitter_ns=0)
    kt = parse_kineto(run.text.encode())
    res = match_launches(kt, traced_launches(run.traces))
    assert matched(kt, res) == truth_of(run)
    # kernel start - first warp start = the generator's lead minus its clock offset, for every launch
    assert {m.delta_ns for m in res.matches} == {-3_250_000 - 700}


def test_a_bundle_from_another_time_is_refused(bundles):
    run = profiled_run(bundles[:1], steps=1, layers=2, host_times=False, clock_offset_ns=3_600 * 10**9)
    kt = parse_kineto(run.text.encode())
    res = match_launches(kt, traced_launches(run.traces))
    assert not res.matches and all("another time" in u.reason for u in res.unmatched)


def test_a_kernel_named_otherwise_is_not_matched(bundles):
    run = profiled_run(bundles[:1], steps=1, layers=2)
    kt = parse_kineto(run.text.encode())
    other = auto_bundle(1, "SomeOtherKernel.kernel")
    res = match_launches(kt, traced_launches([other]))
    assert not res.matches and "SomeOtherKernel" in res.unmatched[0].reason


# ---- the merged file -------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{}, {"host_times": False, "symbols": False}, {"plain_before": True}])
def test_merged_file_holds_host_streams_and_warps(tmp_path, bundles, kw):
    run = profiled_run(bundles, steps=3, layers=2, **kw)
    kt, rep, M, _ = merged(tmp_path, run)
    check_merged(M, kt, run.traces, rep)
    assert len(rep.launches) == sum(len(set(t.events["launch"].to_pylist())) for t in run.traces)
    for e in rep.launches:  # start alignment: first warp on the kernel start, nothing outside
        assert e["start_slack_ns"] == 0 and e["outside"] == 0 and e["end_slack_ns"] == 700 + 900  # the lead before the first warp moves to the end
        # op -> kernel: the host events around the launch call, outermost first
        ops = e["ops"]
        assert len(ops) == 3 and ops[0].startswith("ProfilerStep#") and ops[1].startswith("layer ")
        assert ops[2] == e["label"].split(" ")[0].split(".")[0] + "Function" or ops[2].endswith("Function")
    # process and thread tracks of the host, a GPU process with its stream
    names = {td.name for td in M.tracks.values()}
    assert "thread 4242 (python)" in names and any(n.startswith("GPU 0 · NVIDIA H200") for n in names)
    assert rep.clock["spread_ns"] <= 2 * 200  # the generator's +-200 ns jitter between the two clocks


def test_untraced_launches_stay_plain_kernel_slices(tmp_path, bundles):
    run = profiled_run(bundles[:1], steps=3, layers=2)  # 6 calls, 2 traced
    kt, rep, M, _ = merged(tmp_path, run)
    roots = traced_roots(M)
    assert len(roots) == 2
    traced_rows = {e["correlation"] for e in rep.launches}
    sym = rep.launches[0]["kernel"].replace("_tensorptri64gmemalign16o1", "")
    plain = [s for s in M.slices if s.name == sym]
    assert len(plain) == 4 and not any(s.args.get("correlation") in traced_rows for s in plain)
    # no traced launch track under a plain kernel: every traced launch starts where a traced kernel does
    kernel_starts = {int(kt.ts[r]) for r in kt.kernels().tolist() if int(kt.correlation[r]) in traced_rows}
    assert {s.start for s in M.slices if s.track in roots} == kernel_starts


def test_max_launches_draws_the_first_n_and_says_so(tmp_path, bundles):
    run = profiled_run(bundles[1:2], steps=2, layers=2)  # one bundle of 3 launches
    kt, rep, M, _ = merged(tmp_path, run, max_launches=1)
    check_merged(M, kt, run.traces, rep)
    drawn = [e["warps_drawn"] for e in sorted(rep.launches, key=lambda e: e["kernel_start_ns"])]
    assert drawn == [True, False, False]
    notes = [s.name for s in M.slices if s.track in traced_roots(M)]
    assert sum("warps not drawn" in n for n in notes) == 2


def test_clock_alignment_keeps_globaltimer_spacing(tmp_path, bundles):
    run = profiled_run(bundles[:2], steps=2, layers=2, jitter_ns=3000)
    kt, rep, M, _ = merged(tmp_path, run, align="clock")
    check_merged(M, kt, run.traces, rep)
    med = rep.clock["median_delta_ns"]
    for e in rep.launches:
        assert e["first_ns"] == e["kernel_start_ns"] - e["delta_ns"] + med  # one offset for all
        assert e["start_slack_ns"] == med - e["delta_ns"]
    # with 3 µs of clock noise some first warps land before their kernel: counted, not hidden
    assert any(e["outside"] > 0 for e in rep.launches) and rep.clock["spread_ns"] > 1000


def test_compressed_merge_holds_the_same_slices(tmp_path, bundles):
    run = profiled_run(bundles, steps=2, layers=2)
    kt = parse_kineto(run.text.encode())
    a, b = tmp_path / "a.pftrace", tmp_path / "b.pftrace"
    merge(kt, run.traces, a)
    merge(kt, run.traces, b, compress=True)
    key = lambda M: Counter((s.name, s.start, s.end) for s in M.slices if s.name != "fa4trace merge")  # noqa: E731
    assert key(parse(a.read_bytes())) == key(parse(b.read_bytes()))


def test_report_is_in_the_file_and_has_the_numbers(tmp_path, bundles):
    run = profiled_run(bundles, steps=2, layers=2)
    kt, rep, M, out = merged(tmp_path, run)
    back = read_report(out)
    d, want = back.to_dict(), rep.to_dict()
    want["written"] = {}
    assert d == json.loads(json.dumps(want))
    cpu = rep.written["cpu_s"]  # returned (not in the file): this process's CPU time and the launches'
    assert cpu["main"] > 0 and 0 < cpu["launches"] <= cpu["main"]  # small: drawn in this process
    auto = [e for e in back.launches if e["bundle"] < 2]
    for e in auto:
        n = e["numbers"]
        assert abs(n["busy"] + n["waiting"] + n["idle"] - 1) < 1e-9 and n["waiting"] > 0
        assert set(n["roles"]) >= {"producer", "mma", "epilogue"}
    att = [e for e in back.launches if e["bundle"] == 2][0]["numbers"]
    assert att["overlap"]["QK ∥ SOFTMAX"] > 0.5  # the ping-pong hides its softmax
    with pytest.raises(TraceFormatError, match="not a Perfetto trace written by fa4trace merge"):
        read_report(_plain_perfetto(tmp_path))


def test_a_large_merge_written_by_worker_processes_holds_the_same(tmp_path, bundles, monkeypatch):
    """Above PARALLEL_ROWS the launches are written by spawned workers with id ranges given up front."""
    import importlib

    merge_mod = importlib.import_module("fa4trace.profiler.merge")  # the module (the package's merge is the function)
    run = profiled_run(bundles, steps=2, layers=2)
    kt = parse_kineto(run.text.encode())
    serial = merge(kt, run.traces, tmp_path / "a.pftrace")
    monkeypatch.setattr(merge_mod, "PARALLEL_ROWS", 0)
    par = merge(kt, run.traces, tmp_path / "b.pftrace", workers=2)
    assert [e["numbers"] for e in par.launches] == [e["numbers"] for e in serial.launches]
    assert all(e["numbers"] for e in par.launches)
    Ma, Mb = parse((tmp_path / "a.pftrace").read_bytes()), parse((tmp_path / "b.pftrace").read_bytes())
    check_merged(Mb, kt, run.traces, par)
    key = lambda M: Counter((s.name, s.start, s.end) for s in M.slices if s.name != "fa4trace merge")  # noqa: E731
    assert key(Ma) == key(Mb)
    assert max(Mb.tracks) > merge_mod.UUID_WARPS  # the workers' own uuid ranges


def _plain_perfetto(tmp_path):
    from fa4trace.export.perfetto import to_perfetto

    p = tmp_path / "plain.pftrace"
    to_perfetto(attention_bundle(), p)
    return p


def test_merge_refuses_what_does_not_match(tmp_path, bundles):
    run = profiled_run(bundles[:1], steps=1, layers=2)
    kt = parse_kineto(run.text.encode(), "prof.json")
    with pytest.raises(Fa4traceError, match="none of its launches is in prof.json"):
        merge(kt, [auto_bundle(1, "Unrelated.kernel")], tmp_path / "x.pftrace")
    assert not (tmp_path / "x.pftrace").exists()
    rep = merge(kt, [run.traces[0], auto_bundle(1, "Unrelated.kernel")], tmp_path / "y.pftrace", allow_unmatched=True)
    assert len(rep.unmatched) == 1 and rep.bundles[1]["matched"] == 0


def test_profiler_package_imports_without_torch_or_cutlass():
    code = ("import sys, fa4trace.profiler, fa4trace.testing.profiler; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'cutlass', 'cuda', 'tvm_ffi')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_attach_exports_a_profiler_object(tmp_path, bundles):
    """attach() asks the profiler for its Chrome trace (a stand-in with export_chrome_trace here)."""
    from fa4trace.profiler import attach

    run = profiled_run(bundles[:2], steps=2, layers=2)

    class Prof:
        def export_chrome_trace(self, path):
            with open(path, "w") as f:
                f.write(run.text)

    class Kernel:
        def __init__(self, t):
            self.t = t

        def trace(self):
            if self.t is None:
                raise Fa4traceError("nothing recorded yet: call the instrumented kernel first")
            return self.t

    class Recording:
        kernels = [Kernel(run.traces[0]), Kernel(None), Kernel(run.traces[1])]

    out = tmp_path / "a.pftrace"
    rep = attach(Prof(), Recording(), out)
    assert out.is_file() and len(rep.launches) == 5 and not list(tmp_path.glob("*.kineto.json"))


def test_attach_exports_a_profile_once_and_can_keep_the_file(tmp_path, bundles):
    """torch exports a profile once (a second export_chrome_trace raises "Trace is already
    saved", torch 2.11 on): attach exports it once, keeps it where ``chrome_trace`` says so a
    second merge reads the file, and a second attach on the same profile is one clear error."""
    from fa4trace.profiler import attach

    run = profiled_run(bundles[:2], steps=2, layers=2)

    class Prof:  # torch.profiler.profile's export behaviour
        saved = False

        def export_chrome_trace(self, path):
            if self.saved:
                raise RuntimeError("Trace is already saved.")
            self.saved = True
            with open(path, "w") as f:
                f.write(run.text)

    prof, kept = Prof(), tmp_path / "keep" / "prof.json"
    rep = attach(prof, run.traces, tmp_path / "a.pftrace", chrome_trace=kept)
    assert kept.is_file() and len(rep.launches) == 5
    again = merge(kept, run.traces, tmp_path / "b.pftrace", align="clock")
    assert [(e["bundle"], e["launch"]) for e in again.launches] == [(e["bundle"], e["launch"]) for e in rep.launches]
    with pytest.raises(Fa4traceError, match="exported already"):
        attach(prof, run.traces, tmp_path / "c.pftrace")
    assert not (tmp_path / "c.pftrace").exists() and not list(tmp_path.glob("*.kineto.json"))
