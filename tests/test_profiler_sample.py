"""The synthetic torch.profiler samples in traces/profiler/ (fa4trace.testing.samples): the commands
traces/README.md and docs/profiler.md show run on them, every bundle's launches are found in its
profiler trace, the injected clock offset of rank 1 comes back, every file is marked synthetic, and
``python -m fa4trace.testing.samples`` writes the committed files again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from fa4trace.format.errors import Fa4traceError
from fa4trace.profiler import read_report
from fa4trace.testing import samples
from fa4trace.trace.bundle import load, read_meta

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "traces" / "profiler"
SINGLE = [SAMPLES / "single" / n for n in ("synthetic_prof.json", "synthetic_gemm.parquet", "synthetic_attention.parquet")]


def fa4trace(*args):
    """The command as a user runs it, from the repository's root."""
    return subprocess.run([sys.executable, "-m", "fa4trace", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def launches_in(path: Path) -> int:
    return int(np.unique(load(path).events["launch"].to_numpy()).size)


def test_the_samples_are_there_and_marked_synthetic():
    files = sorted(p for p in SAMPLES.rglob("*") if p.is_file())
    assert [p.relative_to(SAMPLES).as_posix() for p in files] == sorted(samples.sample_files())
    assert sum(p.stat().st_size for p in files) < 400_000  # small enough to keep in the repository
    for p in files:
        assert p.name.startswith("synthetic_"), p
        if p.suffix == ".parquet":
            meta = read_meta(p)
            assert meta["synthetic"] is True and meta["recorded_at"] is None, p
        else:
            assert json.loads(p.read_text())["synthetic"] is True, p


def test_merge_of_one_process_finds_every_launch(tmp_path):
    out = tmp_path / "single.pftrace"
    r = fa4trace("merge", *[str(p.relative_to(ROOT)) for p in SINGLE], "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert [b["name"] for b in rep["bundles"]] == [p.name for p in SINGLE[1:]]
    for b, path in zip(rep["bundles"], SINGLE[1:]):
        assert b["matched"] == b["launches"] == launches_in(path), b
    assert not rep["unmatched"] and len(rep["launches"]) == sum(launches_in(p) for p in SINGLE[1:])
    assert all(e["outside"] == 0 for e in rep["launches"])
    assert read_report(out).launches == rep["launches"]  # what `fa4trace view --merged` reads first


def test_merge_of_the_ranks_finds_every_launch_and_the_clock_offset(tmp_path):
    out = tmp_path / "ranks.pftrace"
    r = fa4trace("merge", "--ranks", "traces/profiler/ranks/", "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert sorted(x["rank"] for x in rep["ranks"]) == [0, 1]
    for b in rep["bundles"]:
        assert b["matched"] == b["launches"] == launches_in(Path(b["path"])), b
        assert f"rank{b['rank']}" in b["name"]
    assert not rep["unmatched"] and len(rep["launches"]) == 4
    rank1 = next(x for x in rep["ranks"] if x["rank"] == 1)
    assert rep["rank_clock"]["collectives"] == 8 and rank1["significant"]
    assert abs(rank1["offset_ns"] - samples.RANK1_CLOCK_OFFSET_NS) <= rep["rank_clock"]["worst_ns"], rank1
    assert read_report(out).ranks == rep["ranks"]


def test_the_samples_are_written_again_the_same(tmp_path):
    """The generator is seeded: the profiler traces come back byte for byte and the bundles with
    the same rows and metadata (and the same bytes where this fa4trace and pyarrow wrote them)."""
    samples.write_samples(tmp_path)
    for rel in samples.sample_files():
        new, old = tmp_path / rel, SAMPLES / rel
        if new.suffix == ".json":
            assert new.read_bytes() == old.read_bytes(), rel
            continue
        assert load(new).events.equals(load(old).events), rel
        m_new, m_old = read_meta(new), read_meta(old)
        same_writer = (m_new.pop("fa4trace_version") == m_old.pop("fa4trace_version")
                       and pq.ParquetFile(new).metadata.created_by == pq.ParquetFile(old).metadata.created_by)
        assert m_new == m_old, rel
        if same_writer:
            assert new.read_bytes() == old.read_bytes(), rel


def test_samples_are_not_overwritten_without_force(tmp_path):
    (tmp_path / "single").mkdir()
    keep = tmp_path / "single" / "synthetic_prof.json"
    keep.write_text("mine")
    with pytest.raises(Fa4traceError, match="refusing to overwrite"):
        samples.write_samples(tmp_path)
    assert keep.read_text() == "mine" and not (tmp_path / "ranks").exists()
    samples.write_samples(tmp_path, force=True)
    assert keep.read_text() == (SAMPLES / "single" / "synthetic_prof.json").read_text()
