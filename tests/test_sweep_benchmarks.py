"""The GPU sweep benchmarks' logic on the CPU: bench_sweep_overhead.py over a fake runner and
bench_sweep_pool.py over replay points, and their arithmetic on made-up rows (never measurements)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fa4trace.sweep import grid as G
from fa4trace.sweep.replay import ReplayGrid, ReplayJob
from fa4trace.testing.replay import make_synthetic
from tests.test_sweep import FakeRunner

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


O = _load("bench_sweep_overhead")
PL = _load("bench_sweep_pool")


def row(pid, kernel, **kw):
    return {"point_id": pid, "kernel": kernel, "error": None, "time_s": 3.0, "record_s": 1.0, "point_s": 4.5,
            "us": 10.0, "us_spread": 0.1, **kw}


def test_overhead_per_point_and_summary():
    pts = O.per_point([row("a", "base"), row("a", "cudnn", error="x"), row("b", "base", time_s=5.0, point_s=9.0)])
    assert [(p["point"], p["kernels"], p["errors"], p["overhead_s"], p["other_s"]) for p in pts] == \
        [("a", 2, 1, 1.5, 0.5), ("b", 1, 0, 4.0, 3.0)]
    s = O.summary(pts)
    assert s == {"points": 2, "time_s": 4.0, "record_s": 1.0, "other_s": 1.75, "overhead_s": 2.75,
                 "overhead_max_s": 4.0, "met": False}
    # a point whose timing failed before the harness ran (no time_s) counts all its wall as overhead
    (p,) = O.per_point([row("c", "base", time_s=None, record_s=None, point_s=0.2)])
    assert p["overhead_s"] == 0.2 and p["other_s"] == 0.2


def test_overhead_measure_runs_a_sweep_and_reads_its_costs(tmp_path):
    logs = []
    m = O.measure(G.from_flags(kernels="base,pingpong,cudnn", d="64,128", sk="1024"), tmp_path / "ds", FakeRunner,
                  log=logs.append)
    assert m["summary"]["points"] == 2 and len(m["points"]) == 2 and m["summary"]["met"]
    for p in m["points"]:
        assert p["kernels"] == 3 and p["point_s"] >= p["time_s"] + p["record_s"] - 1e-6 and p["overhead_s"] >= 0
    files = list((tmp_path / "ds" / "results").rglob("*.parquet"))
    assert files and all(f.name.startswith("compact-") for f in files)
    assert any(line.startswith("[2/2]") for line in logs)


def test_pool_compare_matches_points_and_kernels():
    base = [row("a", "base", us=10.0), row("a", "cudnn", us=20.0), row("b", "base", us=None)]
    other = [row("a", "base", us=11.0), row("a", "cudnn", us=19.0), row("b", "base", us=5.0)]
    c = PL.compare(base, other)
    assert c["pairs"] == 2 and c["diff_pct_median"] == pytest.approx(2.5) and c["diff_pct_worst"] == pytest.approx(10.0)
    assert c["spread_pct_median"] == pytest.approx(0.75)
    assert PL.compare(base, [])["pairs"] == 0


def test_pool_measure_on_cpu_workers(tmp_path):
    make_synthetic(tmp_path / "src", 4)
    m = PL.measure(ReplayGrid(tmp_path / "src"), str(tmp_path), ReplayJob(), [None, None], log=lambda m: None)
    one, two = m["rows"]
    assert one["workers"].startswith("1 on GPU") and two["workers"].startswith("2 on GPU")
    assert one["start_s"] > 0 and two["wall_s"] > 0 and one["point_s"] > 0 and one["time_s"] is None
    assert m["compare"]["pairs"] == 0 and two["us_diff"] is None  # replay rows carry no timings
    assert [len(s["workers"]) for s in m["sweeps"]] == [1, 2]


BLOCKED_RUN = '''
import sys, importlib.abc, tempfile

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("duckdb", "click", "perfetto", "google", "streamlit", "plotly", "pandas", "cutlass"):
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, Block())
sys.path.insert(0, sys.argv[1])
import importlib.util

def load(name):
    spec = importlib.util.spec_from_file_location(name, f"{sys.argv[1]}/benchmarks/{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

if __name__ == "__main__":
    from fa4trace.sweep import grid as G
    from fa4trace.sweep.replay import ReplayGrid, ReplayJob
    from fa4trace.testing.replay import make_synthetic
    from tests.test_sweep import FakeRunner
    d = tempfile.mkdtemp(dir=sys.argv[2])  # the test's tmp_path: nothing left behind in /tmp
    m = load("bench_sweep_overhead").measure(G.from_flags(kernels="base,cudnn", sk="1024"), d + "/o", FakeRunner,
                                               log=lambda m: None)
    assert m["summary"]["points"] == 1
    make_synthetic(d + "/src", 2)
    m = load("bench_sweep_pool").measure(ReplayGrid(d + "/src"), d, ReplayJob(), [None, None], log=lambda m: None)
    assert len(m["rows"]) == 2
    print("ok")
'''


def test_the_gpu_benchmarks_need_no_duckdb_click_or_dsl(tmp_path):
    """The GPU machine has torch and pyarrow, not DuckDB, click or the CuTe DSL."""
    import os
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(BLOCKED_RUN)
    root = str(BENCH.parent)
    r = subprocess.run([sys.executable, str(script), root, str(tmp_path)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": root})
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
