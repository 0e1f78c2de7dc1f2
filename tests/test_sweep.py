"""Sweeps on the CPU: grids, the dataset layout, resume, interrupts, error rows, fa4trace query.

The GPU work goes through a fake Runner defined here (timings made up from the shape, bundles
from fa4trace.testing.bundles): it exercises the sweep loop and the files, never stands for a GPU."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fa4trace.format.errors import Fa4traceError
from fa4trace.sweep import Dataset, RESULT_SCHEMA, grid as G
from fa4trace.format.options import Sampling
from fa4trace.sweep.cuda import Runner, bundle_subset
from fa4trace.sweep.query import query
from fa4trace.sweep.run import run_sweep


class FakeRunner(Runner):
    """Rows from the shape (us = KV bytes / 3 TB/s per kernel, a fixed offset per kernel); bundles
    from fa4trace.testing.bundles. ``oom``: point ids whose timing raises like a CUDA OOM;
    ``interrupt_at``: the n-th timing call (1-based) raises KeyboardInterrupt."""

    gpu = "fake GPU (tests)"
    worker = "test/fake:0"

    def __init__(self, *, oom=(), interrupt_at=None, refuse=()):
        self.oom, self.interrupt_at, self.refuse = set(oom), interrupt_at, set(refuse)
        self.timed, self.recorded = [], []

    def time(self, point, kernels, *, seed):
        self.timed.append((point.id, tuple(kernels)))
        if self.interrupt_at is not None and len(self.timed) == self.interrupt_at:
            raise KeyboardInterrupt
        if point.id in self.oom:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
        rows = []
        for i, k in enumerate(kernels):
            if k in self.refuse:
                rows.append({"kernel": k, "us": math.nan, "us_spread": math.nan, "tbps": None,
                             "rel_err": math.nan, "error": f"{k} refuses this shape"})
                continue
            us = point.shape.io_bytes() / 3e12 * 1e6 + i
            rows.append({"kernel": k, "us": us, "us_spread": 0.1, "tbps": point.shape.io_bytes() / us / 1e6,
                         "rel_err": 1e-3, "error": None})
        return rows

    def record(self, point, schedule, *, seed, budget):
        from fa4trace.trace.bundle import Trace
        from fa4trace.trace.decode import decode_buffer
        from fa4trace.testing.bundles import attention_like

        self.recorded.append((point.id, schedule, budget))
        buf, meta = attention_like("base" if schedule == "base" else "pingpong", n_ctas=2, n_blocks=4, seed=seed % 100)
        return Trace.from_launches([decode_buffer(buf)], meta)

    def clocks(self):
        return {"samples": 3, "sm_mhz_min": 1980}


def small_grid(kernels="base,pingpong,cudnn"):
    return G.from_flags(kernels=kernels, d="64,128", heads="16:1", sk="1024,2048", b="1", sq="1")


# ---- grids -----------------------------------------------------------------------------------
def test_flags_grid_is_the_product_with_defaults():
    g = G.from_flags(kernels="pingpong,flash", d="64,128", heads="16:1,16:2", sk="1024")
    pts = g.points()
    assert len(pts) == 4 and g.kernels == ["pingpong", "flash"]
    assert {(p.d, p.hq, p.hkv, p.sk, p.b, p.sq, p.dtype) for p in pts} == \
        {(d, 16, h, 1024, 1, 1, "bf16") for d in (64, 128) for h in (1, 2)}
    assert pts[0].id == "d64_h16kv1_sk1024_b1_sq1_bf16"


def test_seed_grid_is_colfax_grid_44_points():
    pts = G.seed_grid().points()
    # 2 d x 2 heads x 8 sk at q_len 1 = 32; q_len {1,2,4,8} at sk 131072 = 16, of which the
    # 4 q_len 1 points are already among the 32
    assert len(pts) == 32 + 16 - 4 == 44 and len(set(pts)) == 44
    assert sorted({p.sk for p in pts}) == [1024 << i for i in range(8)]
    assert {p.sq for p in pts if p.sk != 131072} == {1} and {p.sq for p in pts if p.sk == 131072} == {1, 2, 4, 8}
    assert {(p.hq, p.hkv) for p in pts} == {(16, 1), (16, 2)} and {p.b for p in pts} == {1}
    assert G.seed_grid().kernels == list(G.KERNELS)


def test_toml_grid_with_products_and_q_len(tmp_path):
    f = tmp_path / "g.toml"
    f.write_text('kernels = ["base", "cudnn"]\nd = [128]\nheads = ["16:1", "16:2"]\n'
                 '[[product]]\nsk = [1024, 2048]\n[[product]]\nsk = [131072]\nq_len = [2, 4]\n')
    g = G.from_toml(f)
    assert g.kernels == ["base", "cudnn"] and len(g.points()) == 2 * 2 + 2 * 2
    f.write_text("d = [64]\nsk = 4096\n")  # no products: the top level is the product; scalars allowed
    assert [p.id for p in G.from_toml(f).points()] == ["d64_h16kv1_sk4096_b1_sq1_bf16"]


@pytest.mark.parametrize("text, message", [
    ("d = [64\n", "not valid TOML"),
    ("kernels = ['nope']\n", "unknown kernel 'nope'"),
    ("heads = ['16']\n", "hq:hkv pairs"),
    ("dtype = ['fp8']\n", "want bf16 or fp16"),
    ("frobs = [1]\n", "unknown grid key 'frobs'"),
    ("heads = ['16:3']\n", "must be a multiple of hkv"),
    ("sk = [0]\n", "sk must be >= 1"),
    ("sq = [1]\nq_len = [2]\n", "sq or q_len"),
])
def test_bad_toml_grids_are_one_line(tmp_path, text, message):
    f = tmp_path / "g.toml"
    f.write_text(text)
    with pytest.raises(Fa4traceError, match=message.replace("(", r"\(")) as e:
        G.from_toml(f)
    assert "\n" not in str(e.value)


def test_a_shape_only_our_kernels_refuse_is_still_a_point():
    g = G.from_flags(kernels="pingpong,flash", d="256", sq="16")
    (p,) = g.points()
    assert p.ours_problem() is not None


# ---- the sweep and its files -----------------------------------------------------------------
def test_layout_rows_and_bundles(tmp_path):
    runner = FakeRunner()
    doc = run_sweep(small_grid(), tmp_path / "ds", runner, command="fa4trace sweep ...", log=lambda m: None)
    root = tmp_path / "ds"
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    results = [f for f in files if f.startswith("results/")]
    bundles = [f for f in files if f.startswith("bundles/")]
    assert len(results) == 4 * 3 and len(bundles) == 4 * 2
    assert "results/kernel=pingpong/d=128/hkv=1/d128_h16kv1_sk2048_b1_sq1_bf16.parquet" in results
    assert "bundles/kernel=base/d=64/d64_h16kv1_sk1024_b1_sq1_bf16.parquet" in bundles
    assert f"sweeps/sweep={doc['sweep_id']}/sweep.json" in files
    assert not any(Path(f).name.startswith(".") for f in files)  # no temp file left behind
    t = pq.ParquetFile(root / results[0]).read()
    assert t.schema.equals(RESULT_SCHEMA) and t.num_rows == 1
    rows = Dataset(root).read_results().to_pylist()
    for r in rows:
        assert r["error"] is None and r["us"] > 0 and r["gpu"] == FakeRunner.gpu and r["sweep_id"] == doc["sweep_id"]
        if r["kernel"] == "cudnn":
            assert r["bundle"] is None and r["qk_softmax_overlap"] is None
        else:
            assert (root / r["bundle"]).is_file() and r["bundle"].startswith(f"bundles/kernel={r['kernel']}/")
            assert 0 <= r["qk_softmax_overlap"] <= 1 and r["pv_softmax_overlap"] is not None
            assert (root / r["bundle"]).stat().st_size <= 1 << 20
    sweep = json.loads((root / f"sweeps/sweep={doc['sweep_id']}/sweep.json").read_text())
    assert sweep["status"] == "finished" and sweep["points"] == 4 and sweep["points_run"] == 4
    assert sweep["clocks"] == {"samples": 3, "sm_mhz_min": 1980} and sweep["grid"]["kernels"] == ["base", "pingpong", "cudnn"]
    assert sweep["commit"] and sweep["command"] == "fa4trace sweep ..." and sweep["finished_at"]


def test_no_bundles(tmp_path):
    runner = FakeRunner()
    run_sweep(small_grid(), tmp_path, runner, bundles=False, log=lambda m: None)
    assert not runner.recorded and not (tmp_path / "bundles").exists()
    assert all(r["bundle"] is None for r in Dataset(tmp_path).read_results().to_pylist())


def test_resume_skips_done_points_and_force_reruns(tmp_path):
    g = small_grid()
    run_sweep(g, tmp_path, FakeRunner(), log=lambda m: None)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "results").rglob("*.parquet")}
    again = FakeRunner()
    logs = []
    doc = run_sweep(g, tmp_path, again, log=logs.append)
    assert again.timed == [] and again.recorded == [] and doc["points_run"] == 0
    assert "4 done already, 0 to run" in logs[0]
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "results").rglob("*.parquet")} == before
    # a kernel added to the grid runs alone on the points that lack it
    more = FakeRunner()
    run_sweep(small_grid("base,pingpong,cudnn,flash"), tmp_path, more, log=lambda m: None)
    assert [ks for _, ks in more.timed] == [("flash",)] * 4 and more.recorded == []
    forced = FakeRunner()
    run_sweep(g, tmp_path, forced, force=True, log=lambda m: None)
    assert len(forced.timed) == 4 and len(forced.recorded) == 8
    assert len(Dataset(tmp_path).read_results()) == 4 * 4  # force replaces files, adds none
    assert len(Dataset(tmp_path).sweeps()) == 4


def test_an_interrupt_loses_only_the_point_in_flight(tmp_path):
    g = small_grid()
    runner = FakeRunner(interrupt_at=3)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(g, tmp_path, runner, log=lambda m: None)
    ds = Dataset(tmp_path)
    done = {r["point_id"] for r in ds.read_results().to_pylist()}
    pts = g.points()
    assert done == {pts[0].id, pts[1].id}  # the third point was in flight: nothing of it written
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()]
    (sweep,) = ds.sweeps()
    assert sweep["status"] == "interrupted" and sweep["points_run"] == 2
    resumed = FakeRunner()
    run_sweep(g, tmp_path, resumed, log=lambda m: None)
    assert [pid for pid, _ in resumed.timed] == [pts[2].id, pts[3].id]
    assert len(ds.read_results()) == 12


def test_failing_points_are_error_rows_and_the_sweep_goes_on(tmp_path):
    g = G.from_flags(kernels="pingpong,flash", d="128,256", sk="1024,2048")
    oom = "d128_h16kv1_sk2048_b1_sq1_bf16"
    runner = FakeRunner(oom={oom}, refuse={"flash"})
    doc = run_sweep(g, tmp_path, runner, log=lambda m: None)
    rows = {(r["point_id"], r["kernel"]): r for r in Dataset(tmp_path).read_results().to_pylist()}
    assert len(rows) == 8 and doc["status"] == "finished"
    r = rows[(oom, "pingpong")]
    assert r["us"] is None and r["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert r["bundle"] is None
    # d 256: our kernels refuse it before any GPU work; the peer still runs
    r = rows[("d256_h16kv1_sk1024_b1_sq1_bf16", "pingpong")]
    assert r["error"].startswith("our kernels refuse this shape:") and "head dim" in r["error"]
    assert ("d256_h16kv1_sk1024_b1_sq1_bf16", ("flash",)) in runner.timed
    assert rows[("d128_h16kv1_sk1024_b1_sq1_bf16", "flash")]["error"] == "flash refuses this shape"
    assert rows[("d128_h16kv1_sk1024_b1_sq1_bf16", "flash")]["us"] is None  # NaN is stored as null
    ok = rows[("d128_h16kv1_sk1024_b1_sq1_bf16", "pingpong")]
    assert ok["error"] is None and ok["bundle"] is not None
    assert doc["error_rows"] == 8 - 1


def test_a_failed_recording_keeps_the_timing(tmp_path):
    class NoRecord(FakeRunner):
        def record(self, point, schedule, *, seed, budget):
            raise ValueError("no traced variant")

    run_sweep(G.from_flags(kernels="base", sk="1024"), tmp_path, NoRecord(), log=lambda m: None)
    (r,) = Dataset(tmp_path).read_results().to_pylist()
    assert r["us"] > 0 and r["bundle"] is None and r["error"] == "recording failed: ValueError: no traced variant"


def test_result_writes_are_atomic(tmp_path, monkeypatch):
    import fa4trace.sweep.dataset as D

    ds = Dataset(tmp_path)
    row = {"sweep_id": "s", "point_id": "p", "kernel": "base", "d": 128, "hq": 16, "hkv": 1, "sk": 1024,
           "b": 1, "sq": 1, "dtype": "bf16", "us": 1.0}
    ds.write_result(row)
    (path,) = (tmp_path / "results").rglob("*.parquet")

    def dies(table, where, **kw):
        Path(where).write_bytes(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(D.pq, "write_table", dies)
    with pytest.raises(OSError):
        ds.write_result({**row, "us": 2.0})
    assert pq.ParquetFile(path).read().column("us").to_pylist() == [1.0]  # the old file, whole
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # the temp file is gone


def test_bundle_subset_stays_within_the_budget():
    s = bundle_subset(n_ctas=132, capacity=416, warps=(0, 4), budget=60_000)
    assert s.ctas * 2 * 416 <= 60_000 and s.ctas == 72 and s.cta_stride == 1
    s = bundle_subset(n_ctas=1000, capacity=4000, warps=(0, 4), budget=60_000)
    assert s == Sampling(ctas=7, cta_first=0, cta_stride=142, warps=(0, 4), capacity=4000)
    assert s.spec(5, grid_ctas=1000).n_slots * s.spec(5, grid_ctas=1000).capacity <= 60_000
    assert bundle_subset(n_ctas=4, capacity=10**6, warps=(0, 4)).ctas == 1


# ---- query -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    run_sweep(G.from_flags(kernels="base,pingpong,cudnn", d="64,128", heads="16:1,16:2", sk="1024,4096"),
              root, FakeRunner(oom={"d64_h16kv2_sk4096_b1_sq1_bf16"}), log=lambda m: None)
    return root


def test_query_views_and_hive_columns(dataset):
    t = query(dataset, "SELECT kernel, d, hkv, count(*) AS n, count(us) AS timed FROM results "
                       "GROUP BY ALL ORDER BY kernel, d, hkv")
    rows = t.to_pylist()
    assert len(rows) == 3 * 2 * 2 and all(r["n"] == 2 for r in rows)
    assert [r["timed"] for r in rows if r["d"] == 64 and r["hkv"] == 2] == [1, 1, 1]
    assert isinstance(rows[0]["d"], int) and isinstance(rows[0]["kernel"], str)
    s = query(dataset, "SELECT status, points, json_extract(grid, '$.kernels') AS k FROM sweeps").to_pylist()
    assert s[0]["status"] == "finished" and s[0]["points"] == 8 and json.loads(s[0]["k"]) == ["base", "pingpong", "cudnn"]
    # the views join: the rows of a sweep
    n = query(dataset, "SELECT count(*) AS n FROM results JOIN sweeps USING (sweep_id)").column("n")[0].as_py()
    assert n == 24


def test_query_an_empty_dataset_has_the_schema(tmp_path):
    (tmp_path / "results").mkdir()
    t = query(tmp_path, "SELECT * FROM results")
    assert t.num_rows == 0 and t.column_names == RESULT_SCHEMA.names


def fa4trace(*args):
    return subprocess.run([sys.executable, "-m", "fa4trace", *args], capture_output=True, text=True, timeout=120)


def test_query_command_table_json_csv(dataset):
    sql = "SELECT kernel, count(*) AS n, max(us) AS worst FROM results GROUP BY kernel ORDER BY kernel"
    r = fa4trace("query", str(dataset), sql)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["kernel", "n", "worst"] and lines[2].split()[:2] == ["base", "8"]
    assert lines[-1] == "(3 rows)"
    r = fa4trace("query", str(dataset), sql, "--json")
    rows = json.loads(r.stdout)
    assert [x["kernel"] for x in rows] == ["base", "cudnn", "pingpong"] and rows[0]["n"] == 8
    r = fa4trace("query", str(dataset), sql, "--csv")
    assert r.stdout.splitlines()[0] == "kernel,n,worst" and r.stdout.splitlines()[1].startswith("base,8,")


@pytest.mark.parametrize("args, message", [
    (["SELEKT 1"], "query failed: Parser Error"),
    (["SELECT nope FROM results"], "query failed: Binder Error"),
    (["SELECT 1", "--json", "--csv"], "--json or --csv"),
])
def test_query_errors_are_one_line(dataset, args, message):
    r = fa4trace("query", str(dataset), *args)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr


def test_query_a_missing_dataset_is_one_line(tmp_path):
    r = fa4trace("query", str(tmp_path / "nowhere"), "SELECT 1")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and f"{tmp_path / 'nowhere'}: no such directory" in r.stderr
    r = fa4trace("query", str(tmp_path), "SELECT 1")  # a folder, but no dataset in it
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "not a sweep dataset" in r.stderr


# ---- the sweep command -----------------------------------------------------------------------
def test_sweep_command_checks_the_grid_then_needs_a_gpu(tmp_path):
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    except ImportError:
        pass
    r = fa4trace("sweep", "--seed-grid", "-o", str(tmp_path / "ds"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no CUDA GPU here" in r.stderr
    assert not (tmp_path / "ds").exists()
    r = fa4trace("sweep", "--heads", "16:3", "-o", str(tmp_path / "ds"))
    assert r.returncode == 1 and "must be a multiple of hkv" in r.stderr and r.stderr.count("\n") == 1
    r = fa4trace("sweep", "--seed-grid", "--d", "64", "-o", str(tmp_path / "ds"))
    assert r.returncode == 2 and "go without --grid" in r.stderr
    r = fa4trace("sweep", "--kernels", "pingpong,xyz", "-o", str(tmp_path / "ds"))
    assert r.returncode == 1 and "unknown kernel 'xyz'" in r.stderr


def test_sweep_help_lists_its_options():
    r = fa4trace("sweep", "--help")
    for opt in ("--grid", "--seed-grid", "--kernels", "--heads", "--sk", "--sq", "--out", "--force", "--no-bundles",
                "--rounds", "--replays"):
        assert opt in r.stdout, opt
