"""`fa4trace merge`: the report it prints, and one-line errors with a non-zero exit for inputs
that are not what it needs (never a traceback, never an overwritten file)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fa4trace.testing.profiler import profiled_run
from test_profiler import auto_bundle


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "fa4trace", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("merge")
    r = profiled_run([auto_bundle(2), auto_bundle(1, "RMSNorm.kernel")], steps=2, layers=2)
    prof = r.write(d / "prof.json")
    a = r.traces[0].save(d / "fa4.parquet")
    b = r.traces[1].save(d / "rms.parquet")
    other = auto_bundle(1, "Unrelated.kernel").save(d / "other.parquet")
    cpu = d / "cpu.json"
    cpu.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                                                "ts": 1.0, "dur": 2.0}], "baseTimeNanoseconds": 10**18}))
    return {"dir": d, "prof": prof, "a": a, "b": b, "other": other, "cpu": cpu}


def one_line_error(r, *fragments):
    assert r.returncode != 0, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fa4trace: error: "), r.stderr
    assert "Traceback" not in r.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def test_merge_prints_the_report_and_writes_the_file(files, tmp_path):
    out = tmp_path / "one.pftrace"
    r = run("merge", str(files["prof"]), str(files["a"]), str(files["b"]), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "bundle 0: fa4.parquet" in r.stdout and "2/2 launch(es) matched" in r.stdout
    assert "host-time" in r.stdout and "clocks: kernel start - first warp start" in r.stdout
    assert out.is_file() and f"wrote {out}" in r.stdout
    r = run("merge", str(files["prof"]), str(files["a"]), "-o", str(tmp_path / "j.pftrace"), "--json",
            "--align", "clock", "--max-launches", "1", "--compress")
    rep = json.loads(r.stdout)
    assert rep["align"] == "clock" and [e["warps_drawn"] for e in rep["launches"]] == [True, False]


def test_merge_refuses_to_overwrite(files, tmp_path):
    out = tmp_path / "keep.pftrace"
    out.write_text("precious")
    r = run("merge", str(files["prof"]), str(files["a"]), "-o", str(out))
    one_line_error(r, "refusing to overwrite")
    assert out.read_text() == "precious"
    r = run("merge", str(files["prof"]), str(files["a"]), "-o", str(out), "--force")
    assert r.returncode == 0 and out.read_bytes()[:1] == b"\n"


@pytest.mark.parametrize("case, fragments", [
    ("missing profile", ["no such file"]),
    ("bundle as profile", ["Parquet file", "not a torch.profiler JSON trace"]),
    ("not json", ["is not JSON"]),
    ("no kernels", ["none of its launches is in cpu.json", "no CUDA kernel activity"]),
    ("unrelated bundle", ["other.parquet", "none of its launches", "Unrelated"]),
    ("profile as bundle", ["not a Parquet trace bundle"]),
    ("missing bundle", ["no such file"]),
])
def test_merge_errors_are_one_line(files, tmp_path, case, fragments):
    d = files["dir"]
    bad = tmp_path / "bad.json"
    bad.write_text("{this is not json")
    args = {
        "missing profile": [str(d / "nope.json"), str(files["a"])],
        "bundle as profile": [str(files["a"]), str(files["a"])],
        "not json": [str(bad), str(files["a"])],
        "no kernels": [str(files["cpu"]), str(files["a"])],
        "unrelated bundle": [str(files["prof"]), str(files["a"]), str(files["other"])],
        "profile as bundle": [str(files["prof"]), str(files["prof"])],
        "missing bundle": [str(files["prof"]), str(d / "nope.parquet")],
    }[case]
    out = tmp_path / "o.pftrace"
    r = run("merge", *args, "-o", str(out))
    one_line_error(r, *fragments)
    assert not out.exists()


def test_merge_usage_errors(files, tmp_path):
    r = run("merge", str(files["prof"]), "-o", str(tmp_path / "o.pftrace"))
    one_line_error(r, "BUNDLES")
    r = run("merge", str(files["prof"]), str(files["a"]), "-o", str(tmp_path / "o.pftrace"), "--align", "middle")
    one_line_error(r, "--align")
    r = run("merge", str(files["prof"]), str(files["a"]), "-o", str(tmp_path))
    one_line_error(r)


def test_view_refuses_a_file_that_is_not_merged(files, tmp_path):
    r = run("view", "--merged", str(files["prof"]), "--headless")
    one_line_error(r, "not a Perfetto protobuf trace")


def test_merge_options_are_made_once_checked_and_taken_whole(files, tmp_path):
    """One MergeOptions, checked when made (one line per bad value), taken whole by merge() and
    merge_ranks(), or made of their keywords; an object and its fields together are refused."""
    from fa4trace.format.errors import BadOption
    from fa4trace.profiler import MergeOptions, RankInput, merge, merge_ranks

    for kw, words in ((dict(align="left"), "align must be one of start, clock"),
                      (dict(rank_clock="ptp"), "rank_clock must be one of nccl, epoch"),
                      (dict(max_launches=-1), "max_launches must be >= 0, got -1"),
                      (dict(tolerance_ns=None), "tolerance_ns must be an integer >= 0, got None"),
                      (dict(max_clock_offset_ns=True), "max_clock_offset_ns must be an integer >= 0 or None, got True")):
        with pytest.raises(BadOption, match=words):
            MergeOptions(**kw)
    opts = MergeOptions(align="clock", max_launches=1, compress=True)
    whole = merge(files["prof"], [files["a"]], tmp_path / "a.pftrace", options=opts)
    loose = merge(files["prof"], [files["a"]], tmp_path / "b.pftrace", align="clock", max_launches=1, compress=True)
    assert whole.to_dict()["align"] == loose.to_dict()["align"] == "clock"
    assert [e["warps_drawn"] for e in whole.launches] == [e["warps_drawn"] for e in loose.launches] == [True, False]
    with pytest.raises(BadOption, match="merge: give options= or align=, not both"):
        merge(files["prof"], [files["a"]], tmp_path / "c.pftrace", options=opts, align="start")
    with pytest.raises(BadOption, match="merge_ranks: options= takes a MergeOptions, got dict"):
        merge_ranks([RankInput(0, files["prof"], [files["a"]])], tmp_path / "d.pftrace", options={"align": "clock"})
    assert not (tmp_path / "c.pftrace").exists() and not (tmp_path / "d.pftrace").exists()
    r = run("merge", str(files["prof"]), str(files["a"]), "-o", str(tmp_path / "e.pftrace"), "--max-clock-offset", "-1")
    assert r.returncode != 0 and "Traceback" not in r.stderr  # the CLI's own range check, before any options
