"""fa4trace merge of several ranks (fa4trace.profiler.ranks, .collectives, .groups): synthetic
tensor-parallel runs (fa4trace.testing.profiler.profiled_ranks: one shared timeline, an NCCL
all-reduce per layer, each rank's clock off the true one by an injected offset), merged and
read back with the protos (tests/test_profiler.py's reader).

Checked: the ranks' offsets are recovered within the alignment error the merge states; every
rank's profiler events, NCCL kernels and traced launches' warps are under that rank's process
track, at its profiler's times less the offset taken out; the collectives' kernel ends agree
within the stated error once placed; ids are unique and every arrow joins two slices. Also:
which files are which rank's, the one-line errors, and the rank a process reports.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter, defaultdict

import numpy as np
import pytest

from fa4trace.format.errors import Fa4traceError
from fa4trace.profiler import RankInput, load_kineto, merge_ranks, rank_inputs, read_report
from fa4trace.profiler import ranks as ranks_mod
from fa4trace.profiler.collectives import anchors_of, pair_anchors, rank_clock
from fa4trace.profiler.kineto import parse_kineto
from fa4trace.testing.profiler import NCCL, profiled_ranks
from fa4trace.trace import ranks as trace_ranks
from test_profiler import attention_bundle, auto_bundle, parse, traced_roots


def write_ranks(tmp_path, runs, *, rank_names=True):
    """Each rank's profiler trace and bundles as files; returns [(trace path, [bundle paths])]."""
    out = []
    for run in runs:
        r = run.rank
        prof = run.write(tmp_path / (f"prof_rank{r}.json" if rank_names else f"prof{r}.json"))
        bundles = [str(t.save(tmp_path / (f"b{i}_rank{r}.parquet" if rank_names else f"b{i}_{r}.parquet")))
                   for i, t in enumerate(run.traces)]
        out.append((str(prof), bundles))
    return out


def rank_of_track(M, uuid) -> int | None:
    for td in M.ancestors(uuid):
        m = re.match(r"rank (\d+) · ", td.name)
        if m and td.HasField("process"):
            return int(m[1])
    return None


def check_ranks(M, runs, files, report) -> None:
    """The file's promises for several ranks (module docstring)."""
    info = {r["rank"]: r for r in report.ranks}
    assert sorted(info) == sorted(run.rank for run in runs)
    roots = traced_roots(M)
    under_traced = {}
    for u in M.tracks:
        hit = [a.uuid for a in M.ancestors(u) if a.uuid in roots]
        if hit:
            under_traced[u] = roots[hit[0]]
    # one process track per rank, holding everything of the rank
    procs = {rank_of_track(M, u) for u, td in M.tracks.items() if td.HasField("process")}
    assert procs == set(info)
    host = defaultdict(Counter)
    for s in M.slices:
        if s.track not in under_traced and s.name != "fa4trace merge":
            r = rank_of_track(M, s.track)
            assert r is not None, f"slice {s.name} is under no rank"
            host[r][(s.name, s.start, s.end)] += 1
    for run, (prof, _b) in zip(runs, files):
        kt = load_kineto(prof)
        sh = info[run.rank]["shift_ns"]
        want = Counter((kt.names[int(kt.name[i])], int(kt.ts[i]) - sh, int(kt.ts[i] + kt.dur[i]) - sh)
                       for i in range(kt.n))
        assert host[run.rank] == want, f"rank {run.rank}: its profiler events are not all under its track"
        if info[run.rank]["anchors"]:
            assert any(n == NCCL for n, _s, _e in want), "the NCCL kernels are part of each rank's events"
    # each traced launch: under its rank, every bundle row one slice inside its kernel's slice
    entries = {(e["bundle"], e["launch"]): e for e in report.launches}
    bundle_rank = {b["index"]: b["rank"] for b in report.bundles}
    paths = {b["index"]: b["path"] for b in report.bundles}
    got = defaultdict(Counter)
    summaries = {}
    for s in M.slices:
        if s.track in roots:
            summaries[roots[s.track]] = s
        elif s.track in under_traced:
            key = under_traced[s.track]
            got[key][(s.name, s.start - entries[key]["shift_ns"], s.end - entries[key]["shift_ns"])] += 1
            assert rank_of_track(M, s.track) == bundle_rank[key[0]]
            assert summaries.get(key) is None or summaries[key].start <= s.start
    assert set(summaries) == set(entries)
    from fa4trace.trace.bundle import load

    for key, e in entries.items():
        summ = summaries[key]
        assert e["rank"] == bundle_rank[key[0]] and rank_of_track(M, summ.track) == e["rank"]
        assert (summ.start, summ.end) == (e["kernel_start_ns"], e["kernel_start_ns"] + e["kernel_dur_ns"])
        ev = load(paths[key[0]]).events
        ev = ev.filter(np.asarray(ev["launch"].to_numpy() == key[1]))
        st, en = ev["start_ns"].to_numpy(), np.maximum(ev["end_ns"].to_numpy(), ev["start_ns"].to_numpy())
        assert got[key] == Counter(zip(ev["name"].to_pylist(), st.tolist(), en.tolist()))
        assert e["outside"] == 0 and (st + e["shift_ns"]).min() >= summ.start and (en + e["shift_ns"]).max() <= summ.end
    # arrows: each id leaves one slice and ends on another
    src, dst = {}, {}
    for s in M.slices:
        for f in s.flow_out:
            assert f not in src
            src[f] = s
        for f in s.flow_in:
            assert f not in dst
            dst[f] = s
    assert set(src) == set(dst)


def nccl_ends(M, ranks) -> dict:
    """rank -> its NCCL kernels' ends in the merged file, in time order."""
    out = defaultdict(list)
    for s in M.slices:
        if s.name == NCCL:
            out[rank_of_track(M, s.track)].append(s.end)
    return {r: np.sort(np.array(out[r])) for r in ranks}


def merged_ranks(tmp_path, runs, **kw):
    files = write_ranks(tmp_path, runs)
    out = tmp_path / "all.pftrace"
    rep = merge_ranks([RankInput(run.rank, p, b) for run, (p, b) in zip(runs, files)], out, force=True, **kw)
    return rep, parse(out.read_bytes()), files, out


@pytest.mark.parametrize("n_ranks, offsets", [
    (2, [0, 37_000]),
    (8, [250_000, 37_000, -123_000, 5_000, 900_000, -2_000_000, 12, 77_777]),
])
def test_offsets_between_ranks_are_recovered_and_every_rank_lands_in_its_group(tmp_path, n_ranks, offsets):
    runs = profiled_ranks([auto_bundle(2), attention_bundle()], n_ranks, host_clock_offsets_ns=offsets,
                          steps=2, layers=3)
    rep, M, files, out = merged_ranks(tmp_path, runs)
    rc = rep.rank_clock
    assert rc["mode"] == "nccl" and rc["anchor_kind"] == "nccl kernels" and rc["collectives"] == 6
    assert rc["ranks_measured"] == n_ranks and rc["error_ns"] <= rc["worst_ns"]
    # the synthetic ranks' kernel ends are at most 2 x 300 ns apart: the stated error is about that
    assert 0 < rc["worst_ns"] <= 2000, rc
    for r in rep.ranks:
        injected = offsets[r["rank"]] - offsets[0]
        assert abs(r["offset_ns"] - injected) <= rc["worst_ns"], (r["rank"], r["offset_ns"], injected, rc)
        assert r["shift_ns"] == r["offset_ns"] and r["pairs"] == (0 if r["rank"] == 0 else 6)
    # without the offsets taken out, the profilers' clocks disagree by the injected offsets
    assert rc["epoch_worst_ns"] >= max(offsets) - min(offsets) - 2000
    check_ranks(M, runs, files, rep)
    # NCCL kernels of one collective end together once placed, within the stated error
    ends = nccl_ends(M, range(n_ranks))
    stack = np.stack([ends[r] for r in range(n_ranks)])
    assert (stack.max(axis=0) - stack.min(axis=0)).max() <= rc["worst_ns"]
    # the report is in the file, where the viewer reads it
    back = read_report(out)
    assert back.rank_clock == rc and [r["rank"] for r in back.ranks] == list(range(n_ranks))
    assert len(back.launches) == 3 * n_ranks and {e["rank"] for e in back.launches} == set(range(n_ranks))
    text = "\n".join(rep.lines())
    assert "clocks across ranks: nccl" in text and "the cross-rank alignment error" in text
    assert all(f"clocks, rank {r}:" in text for r in range(n_ranks))


def test_two_processes_on_one_gpu_with_one_pid_stay_apart(tmp_path):
    """Two ranks on GPU 0 whose pids are the same (two hosts): each keeps its own process track."""
    runs = profiled_ranks([auto_bundle(1)], 2, host_clock_offsets_ns=[0, -5_000_000], devices=[0, 0], pids=[77, 77],
                          steps=1, layers=8)
    rep, M, files, _ = merged_ranks(tmp_path, runs)
    pids = [r["track_pid"] for r in rep.ranks]
    assert len(set(pids)) == 2 and pids[0] == 77 and pids[1] == ranks_mod.RANK_PID + 1
    assert [r["devices"] for r in rep.ranks] == [[0], [0]]
    check_ranks(M, runs, files, rep)
    assert abs(rep.ranks[1]["offset_ns"] + 5_000_000) <= rep.rank_clock["worst_ns"]


def test_epoch_clock_measures_the_offsets_and_keeps_the_profilers_times(tmp_path):
    offsets = [0, 40_000, -70_000]
    runs = profiled_ranks([auto_bundle(1)], 3, host_clock_offsets_ns=offsets, steps=1, layers=3)
    rep, M, files, _ = merged_ranks(tmp_path, runs, rank_clock="epoch")
    rc = rep.rank_clock
    assert rc["mode"] == "epoch" and all(r["shift_ns"] == 0 for r in rep.ranks)
    for r in rep.ranks:
        assert abs(r["offset_ns"] - offsets[r["rank"]]) <= 2000
    assert rc["worst_ns"] == rc["epoch_worst_ns"] >= 110_000 - 2000
    check_ranks(M, runs, files, rep)
    assert "(measured, not taken out)" in "\n".join(rep.lines())


def test_profiler_windows_that_start_on_different_collectives(tmp_path):
    """Rank 1's profiler caught its first two all-reduces late: pairing finds the lag."""
    runs = profiled_ranks([auto_bundle(1)], 2, host_clock_offsets_ns=[0, 30_000], steps=2, layers=4)
    doc = json.loads(runs[1].text)
    nccl = sorted((e for e in doc["traceEvents"] if e.get("name") == NCCL), key=lambda e: e["ts"])
    drop = {id(e) for e in nccl[:2]}
    doc["traceEvents"] = [e for e in doc["traceEvents"] if id(e) not in drop]
    runs[1].text = json.dumps(doc)
    rep, M, files, _ = merged_ranks(tmp_path, runs)
    r1 = rep.ranks[1]
    assert r1["pairs"] == 6 and abs(r1["offset_ns"] - 30_000) <= rep.rank_clock["worst_ns"] <= 2000
    check_ranks(M, runs, files, rep)


def test_a_rank_without_collectives_keeps_its_epoch_clock_and_says_so(tmp_path):
    runs = profiled_ranks([auto_bundle(1)], 2, steps=1, layers=2)
    doc = json.loads(runs[1].text)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != NCCL]
    runs[1].text = json.dumps(doc)
    rep, M, files, _ = merged_ranks(tmp_path, runs)
    assert rep.ranks[1]["offset_ns"] is None and rep.ranks[1]["shift_ns"] == 0
    assert "why" in rep.rank_clock and "error_ns" not in rep.rank_clock
    assert any("rank 1: no collective (NCCL kernel, gloo call) in its profiler trace" in n for n in rep.notes)
    assert "alignment error not measured" in "\n".join(rep.lines())


def test_a_report_that_outgrows_its_slot_is_still_first(tmp_path, monkeypatch):
    monkeypatch.setattr(ranks_mod, "REPORT_RESERVE", 16)
    for k in ("REPORT_PER_LAUNCH", "REPORT_PER_BUNDLE", "REPORT_PER_RANK"):
        monkeypatch.setattr(ranks_mod, k, 0)
    runs = profiled_ranks([auto_bundle(1)], 2, host_clock_offsets_ns=[0, 9_000], steps=1, layers=2)
    rep, M, files, out = merged_ranks(tmp_path, runs)
    assert read_report(out).rank_clock == rep.rank_clock
    check_ranks(M, runs, files, rep)


def test_merges_big_enough_for_worker_processes(tmp_path, monkeypatch):
    """The traced launches drawn by worker processes: the same file as drawn in this process."""
    runs = profiled_ranks([auto_bundle(2), attention_bundle()], 2, host_clock_offsets_ns=[0, 12_000], steps=2,
                          layers=2)
    files = write_ranks(tmp_path, runs)
    inputs = [RankInput(run.rank, p, b) for run, (p, b) in zip(runs, files)]
    monkeypatch.setattr(ranks_mod, "PARALLEL_ROWS", 1)
    merge_ranks(inputs, tmp_path / "w2.pftrace", workers=2)
    merge_ranks(inputs, tmp_path / "w1.pftrace", workers=1)
    a, b = (tmp_path / "w2.pftrace").read_bytes(), (tmp_path / "w1.pftrace").read_bytes()
    assert parse(a).slices and a.replace(b"w2.pftrace", b"w1.pftrace") == b


# ---- the clocks: collectives -------------------------------------------------------------------

def _kt(events) -> object:
    doc = {"traceEvents": events, "baseTimeNanoseconds": 10**18}
    return parse_kineto(json.dumps(doc).encode(), "t.json")


def _x(name, cat, ts_us, dur_us, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0 if cat == "kernel" else 1, "tid": 7, "ts": ts_us,
            "dur": dur_us, "args": dict(args, device=0, stream=7, correlation=1)}


def test_anchors_are_collective_kernels_not_point_to_point_else_host_collectives():
    kt = _kt([_x("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", "kernel", 1.0, 5.0),
              _x("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel", 10.0, 5.0),
              _x("gloo:all_reduce", "user_annotation", 3.0, 2.0)])
    a = anchors_of(kt)
    assert a.kind == "nccl kernels" and a.n == 1 and "AllGather" in a.names[0] and a.end_ns[0] == 10**18 + 15_000
    g = anchors_of(_kt([_x("gloo:all_reduce", "user_annotation", 3.0, 2.0), _x("aten::mm", "cpu_op", 1.0, 9.0)]))
    assert g.kind == "host collectives" and g.n == 1
    assert anchors_of(_kt([_x("aten::mm", "cpu_op", 1.0, 9.0)])).kind == "none"


def test_pairing_finds_the_lag_and_flags_a_periodic_schedule():
    rng = np.random.default_rng(3)
    starts = np.cumsum(rng.uniform(50_000, 150_000, 40)).astype(np.int64)
    a = [_x("ncclDevKernel_AllReduce", "kernel", s / 1e3, 20.0) for s in starts]
    b = [_x("ncclDevKernel_AllReduce", "kernel", (s + 7_000) / 1e3, 20.0) for s in starts[5:]]
    anc = {0: anchors_of(_kt(a)), 1: anchors_of(_kt(b))}
    p = pair_anchors(anc[0], anc[1])
    assert p.lags == {"ncclDevKernel_AllReduce": -5}  # a[i] is b[i - 5]: b's window started 5 later
    assert p.n == 35 and p.offset_ns == 7_000 and not p.ambiguous
    assert rank_clock(anc)[1]["offset_ns"] == 7_000
    # strictly periodic collectives and windows that start differently: more than one offset fits
    per = [_x("ncclDevKernel_AllReduce", "kernel", 100.0 * i, 20.0) for i in range(20)]
    shifted = [_x("ncclDevKernel_AllReduce", "kernel", 100.0 * i + 3.0, 20.0) for i in range(2, 20)]
    q = pair_anchors(anchors_of(_kt(per)), anchors_of(_kt(shifted)))
    assert q.ambiguous and q.offset_ns == 3_000  # the offset nearest the profilers' own clocks


# ---- which files are which rank's --------------------------------------------------------------

@pytest.fixture(scope="module")
def rank_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ranks")
    runs = profiled_ranks([auto_bundle(1)], 2, host_clock_offsets_ns=[0, 8_000], steps=1, layers=2)
    return d, runs, write_ranks(d, runs)


def test_groups_from_a_folder_and_from_files_in_any_order(rank_files):
    d, runs, files = rank_files
    g = rank_inputs([d])
    assert [(x.rank, x.profile) for x in g] == [(0, files[0][0]), (1, files[1][0])]
    assert [x.bundles for x in g] == [files[0][1], files[1][1]]
    # metadata says the rank: the order on the command line does not matter
    g2 = rank_inputs([files[1][1][0], files[0][0], files[1][0], files[0][1][0]])
    assert [(x.rank, x.bundles) for x in g2] == [(0, files[0][1]), (1, files[1][1])]


def test_groups_without_rank_metadata_follow_names_then_positions(tmp_path):
    runs = profiled_ranks([auto_bundle(1)], 2, steps=1, layers=2)
    for run in runs:
        for t in run.traces:
            del t.meta["distributed"]
        doc = json.loads(run.text)
        del doc["distributedInfo"]
        run.text = json.dumps(doc)
    files = write_ranks(tmp_path, runs, rank_names=False)  # prof0.json, b0_0.parquet: no rank in a name
    g = rank_inputs([files[0][0], *files[0][1], files[1][0], *files[1][1]])
    assert [(x.rank, x.bundles) for x in g] == [(0, files[0][1]), (1, files[1][1])]
    with pytest.raises(Fa4traceError, match="which rank recorded it"):
        rank_inputs([tmp_path])  # found in a folder, nothing says whose they are


def test_group_errors_are_one_line(rank_files, tmp_path):
    d, runs, files = rank_files
    cases = [
        ([tmp_path / "nope"], "no such file or folder"),
        ([files[0][1][0]], "no torch.profiler trace among the inputs"),
        ([files[0][0], files[0][0]], "are both rank 0's profiler trace"),
        ([files[0][0], files[1][1][0]], "was recorded by rank 1, and no profiler trace among the inputs is rank 1's"),
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    cases.append(([empty], "no torch.profiler trace (.json, .json.gz) or bundle (.parquet) in it"))
    for args, msg in cases:
        with pytest.raises(Fa4traceError) as ei:
            rank_inputs([str(a) for a in args])
        assert msg in str(ei.value) and "\n" not in str(ei.value), str(ei.value)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "fa4trace", *args], capture_output=True, text=True, timeout=300)


def test_cli_merges_ranks_and_fails_in_one_line(rank_files, tmp_path):
    d, runs, files = rank_files
    out = tmp_path / "all.pftrace"
    r = run_cli("merge", "--ranks", str(d), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "rank 0: prof_rank0.json" in r.stdout and "rank 1: prof_rank1.json" in r.stdout
    assert "clocks across ranks: nccl" in r.stdout and f"wrote {out}" in r.stdout
    assert read_report(out).ranks[1]["rank"] == 1
    r = run_cli("merge", "--ranks", str(d), "-o", str(out), "--rank-clock", "epoch", "--json", "--force")
    assert json.loads(r.stdout)["rank_clock"]["mode"] == "epoch"
    fresh = tmp_path / "x.pftrace"
    for args, msg, o in ((["--ranks", files[0][1][0]], "no torch.profiler trace among the inputs", fresh),
                         (["--ranks", str(d)], "exists; refusing to overwrite it", out),
                         (["--ranks", str(d), "--rank-clock", "ntp"], "--rank-clock", fresh),
                         ([files[0][0]], "Missing argument 'BUNDLES...'", fresh)):
        r = run_cli("merge", *args, "-o", str(o))
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1 and lines[0].startswith("fa4trace: error: ") and msg in lines[0], r.stderr
        assert not fresh.exists()


def test_merge_ranks_refuses_bad_input_in_one_line(rank_files, tmp_path):
    d, runs, files = rank_files
    ok = [RankInput(0, files[0][0], files[0][1]), RankInput(1, files[1][0], files[1][1])]
    other = str(auto_bundle(1, "Unrelated.kernel").save(tmp_path / "other.parquet"))
    for kw, inputs, msg in (
            ({}, [ok[0], RankInput(0, files[1][0], files[1][1])], "rank 0 is given twice"),
            ({}, [RankInput(0, files[0][0], [])], "rank 0 has no bundle"),
            ({"rank_clock": "ntp"}, ok, "rank_clock must be one of nccl, epoch"),
            ({}, [ok[0], RankInput(1, files[1][0], [*files[1][1], other])],
             "rank 1: other.parquet: none of its launches is in prof_rank1.json")):
        with pytest.raises(Fa4traceError) as ei:
            merge_ranks(inputs, tmp_path / "x.pftrace", **kw)
        assert msg in str(ei.value) and "\n" not in str(ei.value), str(ei.value)
        assert not (tmp_path / "x.pftrace").exists() and not list(tmp_path.glob(".x.pftrace*"))


# ---- the rank a process reports ------------------------------------------------------------------

def test_process_rank_from_the_launcher_environment(monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert trace_ranks.process_rank() is None and trace_ranks.rank_meta() == {}
    assert trace_ranks.rank_path(tmp_path / "step.parquet") == tmp_path / "step.parquet"
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    info = trace_ranks.process_rank()
    assert (info["rank"], info["world_size"], info["local_rank"], info["source"]) == (3, 4, 1, "environment")
    assert trace_ranks.rank_meta()["distributed"]["rank"] == 3
    assert trace_ranks.rank_path(tmp_path / "step.parquet").name == "step_rank3.parquet"
    assert trace_ranks.rank_path(tmp_path / "step_rank3.parquet").name == "step_rank3.parquet"
    assert trace_ranks.rank_path(tmp_path / "step_rank30.parquet").name == "step_rank30_rank3.parquet"
    assert trace_ranks.bundle_rank(trace_ranks.rank_meta()) == 3 and trace_ranks.bundle_rank({}) is None
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: not distributed
    assert trace_ranks.process_rank() is None


def test_process_rank_from_torch_distributed(monkeypatch):
    class Dist:
        def is_available(self):
            return True

        def is_initialized(self):
            return True

        def get_rank(self):
            return 1

        def get_world_size(self):
            return 2

        def get_backend(self):
            return "nccl"

    monkeypatch.setitem(sys.modules, "torch.distributed", Dist())
    monkeypatch.delenv("RANK", raising=False)
    info = trace_ranks.process_rank()
    assert (info["rank"], info["world_size"], info["backend"], info["source"]) == (1, 2, "nccl", "torch.distributed")


def test_msgspec_and_the_general_reader_read_the_same_columns(monkeypatch):
    """kineto reads with msgspec where it is installed: the same columns as the general way."""
    from fa4trace.profiler import kineto

    if kineto._msgspec is None:
        pytest.skip("msgspec is not installed: only the general way runs here")
    run = profiled_ranks([auto_bundle(2), attention_bundle()], 2, steps=2, layers=2)[1]
    raw = run.text.encode()
    assert kineto._decode_typed(raw) is not None
    fast = parse_kineto(raw, "t")
    monkeypatch.setattr(kineto, "_msgspec", None)
    slow = parse_kineto(raw, "t")
    for f in ("kind", "ts", "dur", "correlation", "device", "stream", "grid", "block", "flow_src", "flow_dst"):
        assert np.array_equal(getattr(fast, f), getattr(slow, f)), f
    for f, lf in (("cat", "cats"), ("name", "names")):
        assert [getattr(fast, lf)[c] for c in getattr(fast, f).tolist()] == \
            [getattr(slow, lf)[c] for c in getattr(slow, f).tolist()]
    assert [(t.pid, t.tid, t.label, t.device) for t in fast.tracks] == [(t.pid, t.tid, t.label, t.device)
                                                                         for t in slow.tracks]
    assert fast.metadata == slow.metadata and fast.metadata["distributedInfo"]["rank"] == 1
    assert fast.skipped == slow.skipped and fast.device_properties == slow.device_properties


def test_the_first_rank_with_collectives_is_the_reference(tmp_path):
    """Rank 0's trace holds no collective: rank 1 is the reference, rank 2 aligns to it."""
    runs = profiled_ranks([auto_bundle(1)], 3, host_clock_offsets_ns=[0, 10_000, 55_000], steps=1, layers=8)
    doc = json.loads(runs[0].text)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != NCCL]
    runs[0].text = json.dumps(doc)
    rep, M, files, _ = merged_ranks(tmp_path, runs)
    r0, r1, r2 = rep.ranks
    assert r0["offset_ns"] is None and r0["shift_ns"] == 0 and not r0["reference"]
    assert r1["reference"] and r1["offset_ns"] == 0 and rep.rank_clock["reference"] == 1
    assert abs(r2["offset_ns"] - 45_000) <= rep.rank_clock["worst_ns"] and r2["partner"] == 1
    assert any("rank 0: no collective (NCCL kernel, gloo call) in its profiler trace" in n for n in rep.notes)
    check_ranks(M, runs, files, rep)


def test_merge_options_apply_to_every_rank(tmp_path):
    """--align clock, --max-launches, --compress and --no-numbers, as in a merge of one process."""
    runs = profiled_ranks([auto_bundle(2)], 2, host_clock_offsets_ns=[0, 20_000], steps=2, layers=4)
    rep, M, files, out = merged_ranks(tmp_path, runs, align="clock", max_launches=1, compress=True, analysis=False)
    assert rep.align == "clock" and len(rep.launches) == 4
    assert sorted(e["warps_drawn"] for e in rep.launches) == [False, False, True, True]
    assert all("numbers" not in e for e in rep.launches)
    for r in rep.ranks:  # clock alignment: one shift for a rank's bundle (its launches keep their spacing)
        assert len({e["shift_ns"] for e in rep.launches if e["rank"] == r["rank"]}) == 1
    roots = traced_roots(M)
    drawn = {roots[u] for u in roots if any(M.tracks[t].parent_uuid == u for t in M.tracks)}
    assert drawn == {(e["bundle"], e["launch"]) for e in rep.launches if e["warps_drawn"]}


def test_an_offset_within_the_collectives_scatter_is_not_taken_out(tmp_path):
    """Collectives whose ends scatter by +-15 µs cannot move a rank by 1 µs: it keeps its clock, and
    the report says why; a 300 µs offset under the same scatter is taken out."""
    runs = profiled_ranks([auto_bundle(1)], 3, host_clock_offsets_ns=[0, 1_000, 300_000], steps=1, layers=12,
                          end_skew_ns=15_000, arrival_ns=50_000)
    rep, M, files, _ = merged_ranks(tmp_path, runs)
    r1, r2 = rep.ranks[1], rep.ranks[2]
    assert not r1["significant"] and r1["shift_ns"] == 0 and abs(r1["offset_ns"]) <= 3 * r1["se_ns"]
    assert r2["significant"] and r2["shift_ns"] == r2["offset_ns"] and abs(r2["offset_ns"] - 300_000) <= 3 * r2["se_ns"]
    assert any("rank 1: its collectives put its clock" in n and "kept on its profiler's clock" in n for n in rep.notes)
    assert "(within its collectives' scatter: not taken out)" in "\n".join(rep.lines())
    check_ranks(M, runs, files, rep)


def test_a_bundle_of_one_launch_is_matched_from_its_footer(tmp_path):
    """What matching reads of a bundle of one launch comes from its Parquet statistics (its
    rows are read once, by the worker that draws them): the same first start, last end and
    grid; a bundle of several launches is read from its rows."""
    from pathlib import Path

    from fa4trace.profiler.match import traced_launches
    from fa4trace.trace.bundle import Trace, load

    path = Path(attention_bundle().save(tmp_path / "one.parquet"))
    head, rows = ranks_mod.head_from_footer(path)
    full = load(path)
    assert head is not None and head.num_rows == 2 and rows == {0: full.events.num_rows}
    a, b = traced_launches([Trace(head, full.meta)])[0], traced_launches([full])[0]
    assert (a.first_ns, a.last_ns, a.first_rel_ns, a.min_grid_ctas) == (b.first_ns, b.last_ns, b.first_rel_ns,
                                                                          b.min_grid_ctas)
    several = Path(auto_bundle(2).save(tmp_path / "two.parquet"))
    assert ranks_mod.head_from_footer(several) == (None, None)
