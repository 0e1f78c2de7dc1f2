"""What a newcomer meets first: bundles checked whole before the viewer starts, bundles of no
events refused, `query` read-only unless --force, missing folders and files named as such,
the unknown command a user tries pointed at the right one, outputs with the user's file mode,
a help text that says what fa4trace traces, and the example bundle the wheel ships.

The one-line form of each failure is in tests/test_cli_inputs.py; here is what it guards
(nothing started, nothing written, the file mode, the Python API's side).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import fa4trace
from fa4trace.cli import main
from fa4trace.format.errors import Fa4traceError, TraceFormatError
from fa4trace.trace.bundle import Trace, load, read_meta
from fa4trace.trace.decode import SCHEMA, decode_buffer
from fa4trace.testing.bundles import attention_like

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "tools"))
from bad_bundles import damage_page, no_event_bundle  # noqa: E402

SWEEP = ROOT / "traces" / "sweep-h200"  # a real sweep dataset, read only
AUTO = ROOT / "traces" / "step" / "step_RMSNorm.parquet"  # instrument(): 4 warps a CTA


def synthetic_trace() -> Trace:
    buf, meta = attention_like("pingpong", n_ctas=2, n_blocks=4)
    return Trace.from_launches([decode_buffer(buf)], meta)


def invoke(args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line(r, message: str):
    lines = r.stderr.strip().splitlines()
    assert r.exit_code != 0 and len(lines) == 1 and lines[0].startswith("fa4trace: error: "), r.stderr
    assert message in lines[0], r.stderr


@pytest.fixture
def no_server(monkeypatch):
    """``fa4trace view`` up to the point where it would become the server: the call is recorded."""
    started = []
    monkeypatch.setattr(os, "execv", lambda *a: started.append(a))
    monkeypatch.setattr(subprocess, "call", lambda *a, **k: started.append(a) or 0)
    return started


# ---- 1. a damaged bundle is refused before the viewer starts ----------------------------------

def test_load_finds_a_damaged_data_page_under_an_intact_footer(tmp_path):
    good = synthetic_trace().save(tmp_path / "t.parquet")
    bad = damage_page(good, tmp_path / "bad.parquet")
    read_meta(bad)  # the footer is whole: the cheap check passes
    # the page's CRC (bundles are written with page checksums) fails where the bytes would decode
    with pytest.raises(TraceFormatError, match=r"bad.parquet: bundle data is unreadable \(.*checksum"):
        load(bad)


def test_view_refuses_a_damaged_bundle_before_starting(tmp_path, no_server):
    pytest.importorskip("streamlit")
    bad = damage_page(synthetic_trace().save(tmp_path / "t.parquet"), tmp_path / "bad.parquet")
    r = invoke(["view", bad, "--headless", "--port", "8599"])
    one_line(r, "bundle data is unreadable")
    assert no_server == []


def test_view_refuses_a_bundle_written_before_page_checksums_whose_page_is_damaged(tmp_path, no_server):
    """A bundle written before page checksums (by an older fa4trace): a damaged page header is
    found by reading the column."""
    pytest.importorskip("streamlit")
    src = tmp_path / "unchecked.parquet"
    pq.write_table(pq.read_table(ROOT / "traces" / "fa4_sm90_d128_h16kv1_sk32768_b1.parquet"), src,
                   compression="zstd", write_page_checksum=False)
    data = bytearray(src.read_bytes())
    chunk = pq.ParquetFile(src).metadata.row_group(0).column(SCHEMA.get_field_index("start_ns"))
    data[chunk.data_page_offset:chunk.data_page_offset + 8] = b"\xff" * 8  # the page header
    bad = tmp_path / "old.parquet"
    bad.write_bytes(bytes(data))
    r = invoke(["view", bad, "--headless", "--port", "8599"])
    one_line(r, "old.parquet: bundle data is unreadable")
    assert no_server == []


def committed_bundles() -> list[Path]:
    """Every bundle the repository ships (traces/, the wheel's example)."""
    out = subprocess.run(["git", "ls-files", "traces", "fa4trace/examples"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    return [ROOT / f for f in out if f.endswith(".parquet") and b"fa4trace" in (pq.read_metadata(ROOT / f).metadata or {})]


def test_every_committed_bundle_has_page_checksums(tmp_path):
    """One byte changed inside a data page of each shipped bundle is refused (a bundle without
    checksums reads it back as other numbers wherever the damage still decompresses)."""
    bundles = committed_bundles()
    assert len(bundles) > 100
    col = SCHEMA.get_field_index("end_ns")
    silent = []
    for src in bundles:
        chunk = pq.ParquetFile(src).metadata.row_group(0).column(col)
        data = bytearray(src.read_bytes())
        # one bit mid-chunk: without checksums 141 of the 166 bundles shipped before them read back
        # other numbers silently
        data[chunk.data_page_offset + chunk.total_compressed_size // 2] ^= 0x01
        bad = tmp_path / "bad.parquet"
        bad.write_bytes(bytes(data))
        try:
            pq.read_table(bad, page_checksum_verification=True)
            silent.append(src.relative_to(ROOT).as_posix())
        except OSError:
            pass
    assert silent == []


# ---- 2. a bundle of no events ---------------------------------------------------------------

@pytest.mark.parametrize("args", [["summary", "{e}"], ["compare", "{e}", "{e}"],
                                  ["convert", "{e}", "--to", "perfetto", "-o", "{out}"]],
                         ids=["summary", "compare", "convert"])
def test_a_bundle_of_no_events_is_refused(args, tmp_path):
    e = no_event_bundle(tmp_path / "empty.parquet")
    out = tmp_path / "x.pftrace"
    r = invoke([a.format(e=e, out=out) for a in args])
    one_line(r, "empty.parquet: the bundle holds no events (0 rows)")
    assert not out.exists()


def test_view_refuses_a_bundle_of_no_events(tmp_path, no_server):
    pytest.importorskip("streamlit")
    r = invoke(["view", no_event_bundle(tmp_path / "empty.parquet"), "--headless", "--port", "8599"])
    one_line(r, "holds no events")
    assert no_server == []


def test_the_library_refuses_to_save_or_load_a_trace_of_no_events(tmp_path):
    with pytest.raises(TraceFormatError, match="holds no events"):
        fa4trace.load(no_event_bundle(tmp_path / "empty.parquet"))
    with pytest.raises(TraceFormatError, match="holds no events"):
        read_meta(tmp_path / "empty.parquet")
    with pytest.raises(Fa4traceError, match="no events is not saved"):
        Trace(SCHEMA.empty_table(), {"kernel": "k"}).save(tmp_path / "new.parquet")
    assert not (tmp_path / "new.parquet").exists()


# ---- 3. query: read-only unless --force, one statement ----------------------------------------

def test_query_copy_over_an_existing_file_needs_force(tmp_path):
    target = tmp_path / "out.csv"
    target.write_text("precious")
    sql = f"COPY (SELECT kernel, count(*) AS n FROM results GROUP BY kernel ORDER BY kernel) TO '{target}'"
    one_line(invoke(["query", SWEEP, sql]), "query is read-only: a COPY statement may write")
    assert target.read_text() == "precious"
    r = invoke(["query", SWEEP, sql, "--force"])
    assert r.exit_code == 0, r.stderr
    assert target.read_text().splitlines()[0] == "kernel,n" and len(target.read_text().splitlines()) == 7


@pytest.mark.parametrize("sql, kind", [
    ("CREATE VIEW v AS SELECT 1", "a CREATE statement"),
    ("DROP VIEW results", "a DROP statement"),
    ("ATTACH '{d}/new.db' AS n", "an ATTACH statement"),
    ("EXPORT DATABASE '{d}/exported'", "an EXPORT statement"),
    ("EXPLAIN ANALYZE COPY (SELECT 1) TO '{d}/e.csv'", "an EXPLAIN statement"),
    ("SET threads = 1", "a SET statement"),
    ("INSTALL httpfs", "an INSTALL statement"),
    ("/* a comment first */ LOAD httpfs", "a LOAD statement"),
    ("COPY (PIVOT results ON kernel USING count(*)) TO '{d}/p.csv'", "this statement"),
    ("CREATE TABLE t AS PIVOT results ON kernel USING count(*)", "this statement"),
], ids=["create", "drop", "attach", "export", "explain-analyze", "set", "install", "load", "copy-pivot",
        "create-pivot"])
def test_query_refuses_what_may_write_without_force(sql, kind, tmp_path):
    r = invoke(["query", SWEEP, sql.format(d=tmp_path)])
    one_line(r, f"query is read-only: {kind} may write files or change the database; add --force")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("sql", [
    "SELECT kernel, count(*) AS n FROM results GROUP BY kernel",
    "WITH k AS (SELECT DISTINCT kernel FROM results) SELECT count(*) AS n FROM k",
    "FROM sweeps SELECT status",
    "DESCRIBE results",
    "SUMMARIZE results",
    "PIVOT (SELECT kernel, sk, tbps FROM results WHERE d = 128 AND hkv = 1 AND sq = 1) ON kernel "
    "USING median(tbps) GROUP BY sk ORDER BY sk",
    "SELECT 1 AS one; -- a trailing comment",
], ids=["select", "with", "from-first", "describe", "summarize", "pivot", "comment"])
def test_queries_run_without_force(sql):
    r = invoke(["query", SWEEP, sql])
    assert r.exit_code == 0 and r.stderr == "", r.stderr
    assert r.stdout.rstrip().endswith("row)") or r.stdout.rstrip().endswith("rows)")


def test_query_refuses_several_statements_and_runs_none():
    r = invoke(["query", SWEEP, "SELECT 1; SELECT 2"])
    one_line(r, "query runs one SQL statement, got 2")
    assert r.stdout == ""


def test_query_api_is_read_only_unless_forced():
    from fa4trace.sweep.query import query

    with pytest.raises(Fa4traceError, match="query is read-only: a CREATE statement"):
        query(SWEEP, "CREATE VIEW v AS SELECT 1")
    assert query(SWEEP, "CREATE VIEW v AS SELECT 1", force=True).num_rows == 0
    with pytest.raises(Fa4traceError, match="query failed: Parser Error"):
        query(SWEEP, "SELEC 1")
    with pytest.raises(Fa4traceError, match="the SQL is empty"):
        query(SWEEP, " ; -- nothing")


# ---- 4. names of missing things, and the command users look for ------------------------------

@pytest.mark.parametrize("args", [["query", "{m}", "SELECT 1"], ["compact", "{m}"], ["plot", "{m}", "-o", "{o}"]],
                         ids=["query", "compact", "plot"])
def test_a_missing_dataset_folder_is_named_as_such(args, tmp_path):
    m, o = tmp_path / "nosuch", tmp_path / "f.html"
    r = invoke([a.format(m=m, o=o) for a in args])
    one_line(r, f"{m}: no such directory")
    assert not m.exists() and not o.exists()


def test_a_missing_grid_file_is_named(tmp_path):
    r = invoke(["sweep", "--grid", tmp_path / "missing.toml", "-o", tmp_path / "ds"])
    one_line(r, "missing.toml' does not exist")
    assert "Errno" not in r.stderr and not (tmp_path / "ds").exists()


def test_an_os_error_names_its_file_without_errno():
    from fa4trace.cli.common import first_line

    assert first_line(FileNotFoundError(2, "No such file or directory", "g.toml")) == \
        "g.toml: No such file or directory"


@pytest.mark.parametrize("args", [["convert", "{b}", "--to", "chrome", "-o", ""],
                                  ["sweep", "--d", "128", "-o", ""], ["query", "", "SELECT 1"]],
                         ids=["convert", "sweep", "query"])
def test_an_empty_path_is_called_empty(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    b = synthetic_trace().save(tmp_path / "t.parquet")
    r = invoke([a.format(b=b) for a in args])
    one_line(r, "path" if args[0] != "convert" else "the output path is empty")
    assert "is empty" in r.stderr and "is a directory" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"]


def test_export_points_at_convert():
    r = invoke(["export", "t.parquet"])
    one_line(r, "No such command 'export'. Did you mean 'convert'?")
    assert r.exit_code == 2


# ---- 5. every output gets the user's file mode -------------------------------------------------

@pytest.fixture
def umask027():
    old = os.umask(0o027)
    try:
        yield 0o640  # 0666 less 027: neither mkstemp's 0600 nor the common 0644
    finally:
        os.umask(old)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_saved_bundles_respect_the_umask(tmp_path, umask027):
    tr = synthetic_trace()
    assert mode(tr.save(tmp_path / "t.parquet")) == umask027
    assert mode(tr.save(tmp_path / "t.parquet", overwrite=True)) == umask027
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]  # no temporary file left


def test_merged_traces_and_exports_respect_the_umask(tmp_path, umask027):
    from fa4trace.export.chrome import to_chrome
    from fa4trace.profiler.merge import merge
    from fa4trace.testing.profiler import profiled_run

    run = profiled_run([synthetic_trace()], steps=1, layers=1)
    prof, bundle = run.write(tmp_path / "prof.json"), run.traces[0].save(tmp_path / "b.parquet")
    merge(str(prof), [bundle], tmp_path / "m.pftrace", analysis=False, workers=1)
    to_chrome(load(bundle), tmp_path / "c.json")
    assert mode(tmp_path / "m.pftrace") == umask027 and mode(tmp_path / "c.json") == umask027
    assert mode(bundle) == umask027


def test_sweep_files_respect_the_umask(tmp_path, umask027):
    from fa4trace.sweep.dataset import atomic_write

    p = atomic_write(tmp_path / "a" / "r.parquet", lambda tmp: Path(tmp).write_bytes(b"x"))
    assert mode(p) == umask027 and p.read_bytes() == b"x"


def test_a_failed_write_leaves_the_target_and_no_temporary_file(tmp_path):
    from fa4trace.trace.files import replacing

    target = tmp_path / "keep.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with replacing(target) as tmp:
            Path(tmp).write_text("half")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


# ---- 6. what fa4trace says it is ---------------------------------------------------------------

def test_the_package_says_it_traces_cute_dsl_kernels():
    import tomllib

    help_text = " ".join(invoke(["--help"]).stdout.split())
    description = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    for text in (help_text, description, " ".join(fa4trace.__doc__.split())):
        assert "CuTe DSL" in text and "attention kernels" not in text, text


# ---- 7. a role given to a warp the trace does not hold -----------------------------------------

def test_roles_of_a_warp_not_in_the_trace_are_refused():
    one_line(invoke(["summary", AUTO, "--roles", "producer=999"]),
             "role 'producer': warp 999 is not in this trace (its warps: 0-3)")
    r = invoke(["summary", AUTO, "--roles", "producer=1", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["roles"]["producer"]["warps"] == [1]


def test_decide_roles_refuses_an_absent_warp_from_python():
    from fa4trace.analysis.roles import decide_roles

    with pytest.raises(Fa4traceError, match="warp 7 is not in this trace"):
        decide_roles(load(AUTO), {7: "producer"})


def test_a_reversed_warp_range_is_refused():
    one_line(invoke(["summary", AUTO, "--roles", "producer=3-1"]),
             "--roles 'producer=3-1': the range 3-1 runs backwards (write 1-3)")


# ---- 8. compare: two bundles of one kernel, or two attention kernels -----------------------------

T = ROOT / "traces"


@pytest.mark.parametrize("a, b", [("calibration_h200", "decode_d128_16to2_sk32768_b8_base"),
                                  ("decode_d128_16to2_sk32768_b8_base", "markers_h200"),
                                  ("markers_h200", "calibration_h200")])
def test_compare_refuses_unrelated_kernels(a, b):
    ka, kb = (load(T / f"{x}.parquet").info.kernel for x in (a, b))
    one_line(invoke(["compare", T / f"{a}.parquet", T / f"{b}.parquet"]),
             f"A is kernel {ka}, B is kernel {kb}: compare needs two bundles of one kernel, or two attention "
             "kernels (QK and SOFTMAX events)")


def test_compare_of_two_attention_kernels_names_what_differs_in_words():
    r = invoke(["compare", T / "fa4_sm90_d128_h16kv1_sk32768_b1.parquet",
                T / "decode_d128_16to1_sk131072_b1_base.parquet"])
    assert r.exit_code == 0, r.stderr
    assert "None" not in r.stdout and "-715 ns" not in r.stdout
    assert "hides 715 ns less softmax per iteration than fa4_sm90_fa3" in r.stdout
    assert "different shapes (sk 32768 → 131072)" in r.stdout


def test_compare_of_one_device_kernel_under_two_labels():
    """FA4's forward recorded as "causal" and as "full": the same device kernel, compared, with
    the labels and the config that differ named."""
    r = invoke(["compare", T / "auto" / "fa4_sm90_prefill_causal.parquet", T / "auto" / "fa4_sm90_prefill_full.parquet"])
    assert r.exit_code == 0, r.stderr
    assert ("note: A is FA4 FlashAttentionForwardSm90 prefill causal, B is FA4 FlashAttentionForwardSm90 prefill: "
            "one device kernel (FlashAttentionForwardSm90.kernel) recorded under two labels") in r.stdout
    assert "on different configs (causal true → false)" in r.stdout
    r = invoke(["compare", T / "auto" / "fa4_sm90_prefill_causal.parquet", AUTO])
    one_line(r, "compare needs two bundles of the same kernel")


def test_a_key_one_side_lacks_reads_unset():
    from fa4trace.analysis.overlap import diff_text

    assert diff_text({"b": [None, 8], "d": [64, 128]}) == "b unset → 8, d 64 → 128"


# ---- 9. the example bundle the wheel ships ----------------------------------------------------

def test_example_bundle_is_package_data_and_loads():
    import tomllib

    p = fa4trace.example_bundle()
    assert p.parent == Path(fa4trace.__file__).parent / "examples"
    assert p.read_bytes() == (ROOT / "traces" / p.name).read_bytes()  # the same recording as traces/
    assert len(load(p)) > 0 and p.stat().st_size < 200_000  # small: it rides in every wheel
    pkg_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert any(Path(p.name).match(g) for g in pkg_data["fa4trace.examples"])


def test_example_bundle_from_the_command_line(tmp_path):
    code = "import fa4trace; print(fa4trace.example_bundle())"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    path = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120, check=True).stdout.strip()
    r = subprocess.run([sys.executable, "-m", "fa4trace", "summary", path], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0 and r.stderr == "" and "QK ∥ SOFTMAX" in r.stdout, r.stderr
