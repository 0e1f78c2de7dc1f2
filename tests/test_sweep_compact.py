"""Compaction of a sweep dataset: one file per partition, and every reader (resume, read_results,
fa4trace query, the figures) sees the same rows before, after, half-way (a crash between
writing the merged file and removing what it merged) and after a --force re-run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fa4trace.sweep import Dataset, RESULT_SCHEMA, grid as G
from fa4trace.sweep import compact as C
from fa4trace.sweep.query import query
from fa4trace.sweep.run import run_sweep
from tests.test_sweep import FakeRunner

KERNELS = "base,pingpong,cudnn"
SQL = "SELECT point_id, kernel, us, sweep_id FROM results ORDER BY point_id, kernel"


def grid():
    return G.from_flags(kernels=KERNELS, d="64,128", heads="16:1,16:2", sk="1024,4096")


def quiet(m):
    pass


@pytest.fixture
def ds(tmp_path) -> Path:
    run_sweep(grid(), tmp_path, FakeRunner(), log=quiet)
    return tmp_path


def files(root) -> list[Path]:
    return sorted((Path(root) / "results").rglob("*.parquet"))


def rows(root, **kw) -> list[dict]:
    return sorted(Dataset(root).read_results(**kw).to_pylist(), key=lambda r: (r["point_id"], r["kernel"]))


def test_compaction_leaves_one_file_per_partition_and_the_same_rows(ds):
    before, q_before = rows(ds), query(ds, SQL).to_pylist()
    assert len(files(ds)) == 8 * 3
    st = C.compact(ds)
    assert st == {"partitions": 3 * 2 * 2, "merged": 24, "written": 12, "rows": 24}
    fs = files(ds)
    assert len(fs) == 12 and all(f.name.startswith("compact-") for f in fs)
    assert {f.parent.relative_to(ds / "results").as_posix() for f in fs} == \
        {f"kernel={k}/d={d}/hkv={h}" for k in KERNELS.split(",") for d in (64, 128) for h in (1, 2)}
    assert pq.ParquetFile(fs[0]).schema_arrow.equals(RESULT_SCHEMA)
    assert rows(ds) == before and query(ds, SQL).to_pylist() == q_before
    assert not [p for p in ds.rglob(".*") if p.is_file()]
    assert C.compact(ds)["merged"] == 0  # nothing left to merge


def test_resume_sees_compacted_points(ds):
    C.compact(ds)
    again = FakeRunner()
    doc = run_sweep(grid(), ds, again, log=quiet)
    assert again.timed == [] and doc["points_run"] == 0
    assert Dataset(ds).missing(grid().points()[0], ["base", "flash"]) == ["flash"]
    more = FakeRunner()
    run_sweep(G.from_flags(kernels=KERNELS, d="64,128", heads="16:1,16:2", sk="1024,4096,8192"), ds, more, log=quiet)
    assert len(more.timed) == 4 and {p for p, _ in more.timed} == {f"d{d}_h16kv{h}_sk8192_b1_sq1_bf16"
                                                                 for d in (64, 128) for h in (1, 2)}


def test_a_forced_rerun_wins_over_the_compacted_row_and_is_merged_later(ds):
    C.compact(ds)
    old = {(r["point_id"], r["kernel"]): r for r in rows(ds)}
    class Slower(FakeRunner):
        def time(self, point, kernels, *, seed):
            return [{**r, "us": r["us"] + 100} for r in super().time(point, kernels, seed=seed)]

    g = G.from_flags(kernels="base", d="64", heads="16:1", sk="1024")
    doc = run_sweep(g, ds, Slower(), force=True, log=quiet)
    key = ("d64_h16kv1_sk1024_b1_sq1_bf16", "base")
    loose = [f for f in files(ds) if not f.name.startswith("compact-")]
    assert [f.name for f in loose] == ["d64_h16kv1_sk1024_b1_sq1_bf16.parquet"]
    new = {(r["point_id"], r["kernel"]): r for r in rows(ds)}
    assert len(new) == 24 and len(rows(ds, every_row=True)) == 25  # stored twice, read once
    assert new[key]["us"] == pytest.approx(old[key]["us"] + 100) and new[key]["sweep_id"] == doc["sweep_id"]
    got = query(ds, "SELECT count(*) AS n, max(us) FILTER (WHERE point_id = 'd64_h16kv1_sk1024_b1_sq1_bf16' "
                    "AND kernel = 'base') AS us FROM results").to_pylist()[0]
    assert got["n"] == 24 and got["us"] == pytest.approx(new[key]["us"])
    assert C.compact(ds)["merged"] == 2  # the partition's compacted file and the new row
    assert len(rows(ds, every_row=True)) == 24 and rows(ds) == sorted(new.values(), key=lambda r: (r["point_id"], r["kernel"]))


def test_a_crash_between_writing_and_removing_loses_and_doubles_nothing(ds, monkeypatch):
    before = rows(ds)
    def crash(path):
        raise KeyboardInterrupt  # killed right after the merged file was renamed into place

    monkeypatch.setattr(C.os, "unlink", crash)
    with pytest.raises(KeyboardInterrupt):
        C.compact(ds)
    monkeypatch.undo()
    part = files(ds)[0].parent
    names = sorted(f.name for f in part.glob("*.parquet"))
    assert names[0].startswith("compact-") and len(names) == 3  # merged file + the two it merged
    assert len(rows(ds, every_row=True)) == 24 + 2 and rows(ds) == before  # its 2 rows stored twice, read once
    assert query(ds, "SELECT count(*) AS n FROM results").column("n")[0].as_py() == 24
    assert run_sweep(grid(), ds, FakeRunner(), log=quiet)["points_run"] == 0
    C.compact(ds)
    assert len(files(ds)) == 12 and len(rows(ds, every_row=True)) == 24 and rows(ds) == before


def test_a_file_rewritten_while_compacting_is_kept(ds, monkeypatch):
    target = files(ds)[0]
    real = C.read_table

    def read_then_rewrite(path):
        t = real(path)
        if Path(path) == target:  # a --force re-run replaces it after compaction listed and read it
            newer = t.set_column(t.schema.get_field_index("us"), "us", pa.array([123.0]))
            newer = newer.set_column(newer.schema.get_field_index("finished_at"), "finished_at",
                                     pa.array([pa.scalar(t.column("finished_at")[0].as_py().replace(year=2100),
                                                         RESULT_SCHEMA.field("finished_at").type)]))
            tmp = target.with_name(".x.tmp")
            pq.write_table(newer, tmp)
            tmp.replace(target)
        return t

    monkeypatch.setattr(C, "read_table", read_then_rewrite)
    C.compact(ds)
    assert target.is_file()  # not removed: it changed since compaction looked at it
    r = [x for x in rows(ds) if x["point_id"] == target.stem and x["kernel"] == "base"]
    assert len(r) == 1 and r[0]["us"] == 123.0


def test_files_written_before_the_cost_columns_still_read(ds):
    f = files(ds)[0]
    t = pq.read_table(f).drop_columns(["job", "point_s", "time_s", "record_s"])
    pq.write_table(t, f)
    assert len(rows(ds)) == 24 and rows(ds)[0]["job"] in (None, "cuda")
    assert query(ds, "SELECT count(*) AS n, count(job) AS j FROM results").to_pylist() == [{"n": 24, "j": 23}]
    C.compact(ds)
    assert len(rows(ds)) == 24


def test_the_figures_read_a_compacted_dataset_the_same(ds):
    pytest.importorskip("pandas")
    from fa4trace.sweep import figures as F

    a = F.load(ds).sort_values(["kernel", "point_id"]).reset_index(drop=True)
    C.compact(ds)
    b = F.load(ds).sort_values(["kernel", "point_id"]).reset_index(drop=True)
    assert a.drop(columns=["finished_at"]).equals(b.drop(columns=["finished_at"]))


def fa4trace(*args):
    return subprocess.run([sys.executable, "-m", "fa4trace", *args], capture_output=True, text=True, timeout=120)


def test_compact_command(ds, tmp_path):
    r = fa4trace("compact", str(ds))
    assert r.returncode == 0 and r.stdout.strip() == f"compacted {ds}: 24 result files into 12 (24 rows; 12 partitions)"
    r = fa4trace("compact", str(ds))
    assert r.returncode == 0 and "nothing to compact" in r.stdout
    r = fa4trace("query", str(ds), "SELECT count(*) AS n FROM results", "--csv")
    assert r.stdout.splitlines() == ["n", "24"]
    r = fa4trace("compact", str(tmp_path / "nowhere"))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "nowhere: no such directory" in r.stderr
    (tmp_path / "plain").mkdir()
    r = fa4trace("compact", str(tmp_path / "plain"))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "not a sweep dataset" in r.stderr


def test_the_committed_h200_sweep_compacts_to_the_same_rows(tmp_path):
    src = Path(__file__).resolve().parent.parent / "traces" / "sweep-h200"
    if not (src / "results").is_dir():
        pytest.skip("traces/sweep-h200 is not here")
    shutil.copytree(src / "results", tmp_path / "results")
    before = rows(tmp_path)
    C.compact(tmp_path)
    assert rows(tmp_path) == before and len(before) == 44 * 6
