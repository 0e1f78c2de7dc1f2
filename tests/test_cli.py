"""CLI: success paths and one-line failures with non-zero exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fa4trace.trace.bundle import Trace
from fa4trace.trace.decode import decode_buffer
from fa4trace.testing.bundles import attention_like


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "fa4trace", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    out = {}
    for sched in ("base", "pingpong"):
        buf, meta = attention_like(sched, n_ctas=4, n_blocks=12)
        out[sched] = Trace.from_launches([decode_buffer(buf)], meta).save(d / f"{sched}.parquet")
    return out


def test_summary_text_and_json(bundles):
    r = run("summary", str(bundles["pingpong"]))
    assert r.returncode == 0 and "QK ∥ SOFTMAX" in r.stdout and "SYNTHETIC" in r.stdout
    r = run("summary", str(bundles["pingpong"]), "--json")
    s = json.loads(r.stdout)
    assert s["qk_softmax_overlap"] > 0.5 and s["rows"] > 0


def test_compare_json_matches_the_library(bundles):
    from fa4trace.analysis.overlap import compare
    from fa4trace.trace.bundle import load

    r = run("compare", str(bundles["base"]), str(bundles["pingpong"]), "--json")
    assert r.returncode == 0
    assert json.loads(r.stdout) == json.loads(json.dumps(compare(load(bundles["base"]), load(bundles["pingpong"]))))
    r = run("compare", str(bundles["base"]), str(bundles["pingpong"]))
    assert "hides" in r.stdout


def test_convert_refuses_to_overwrite(bundles, tmp_path):
    out = tmp_path / "x.json"
    out.write_text("precious")
    r = run("convert", str(bundles["base"]), "--to", "chrome", "-o", str(out))
    assert r.returncode != 0 and "refusing to overwrite" in r.stderr and out.read_text() == "precious"
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["summary", "missing.parquet"], "no such file"),
    (["summary"], "Missing argument"),
    (["summary", "--nope", "x"], "No such option"),
    (["convert", "x.parquet", "--to", "svg", "-o", "y"], "Invalid value"),
    (["record", "--kernel", "markers", "--ctas", "1:0", "-o", "z.parquet"], "--ctas"),
    (["record", "--warps", "0,5", "-o", "z.parquet"], "decode attention has warps 0..4"),
    (["record", "--warps", "x", "-o", "z.parquet"], "--warps must be comma warp indices"),
    (["record", "--kernel", "markers", "--warps", "lead", "-o", "z.parquet"], "--warps lead is defined"),
    (["record", "--kernel", "calibration", "--warps", "0", "-o", "z.parquet"], "calibration kernel records every warp"),
    (["record", "--sk", "0", "-o", "z.parquet"], "--sk must be >= 1"),
    (["record", "--d", "96", "-o", "z.parquet"], "--d must be one of 64, 128"),
    (["record", "--hq", "12", "--hkv", "5", "-o", "z.parquet"], "must be a multiple of --hkv"),
    (["record", "--hq", "64", "--hkv", "2", "-o", "z.parquet"], "--hq / --hkv must be <= 16"),
    (["record", "--sq", "9", "-o", "z.parquet"], "--sq must be 1..8"),
    (["record", "--schedule", "fa3", "-o", "z.parquet"], "is FA4's"),
    (["record", "--impl", "fa4", "--schedule", "intrawg", "-o", "z.parquet"], "is one of ours; FA4 has"),
    (["record", "--num-splits", "0", "-o", "z.parquet"], "--num-splits must be >= 1"),
    (["record", "--impl", "fa4", "--b", "0", "-o", "z.parquet"], "--b must be >= 1"),
    (["record", "--capacity", "0", "-o", "z.parquet"], "--capacity must be >= 1"),
    (["record", "--events", "all", "-o", "z.parquet"], "Invalid value for '--events'"),
    (["record", "--impl", "fa4", "--events", "stalls", "-o", "z.parquet"], "--events picks the event set"),
    (["record", "--families", "barrier", "-o", "z.parquet"], "--families goes with --script or --impl fa4"),
    (["record", "--impl", "fa4", "--families", "tma,warp", "-o", "z.parquet"], "--families: unknown warp"),
    (["frobnicate"], "No such command"),
])
def test_errors_are_one_line_and_nonzero(args, message, tmp_path):
    r = run(*args, cwd=tmp_path)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fa4trace: error:") and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_a_missing_choice_option_is_one_line(bundles, tmp_path):
    """click lists a missing option's choices one per line; the error stays one line."""
    r = run("convert", str(bundles["pingpong"]), "-o", str(tmp_path / "x"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "Missing option '--to'. Choose from: perfetto, chrome (see: fa4trace convert --help)" in r.stderr


def test_not_a_bundle_is_one_line(tmp_path):
    p = tmp_path / "x.parquet"
    p.write_bytes(os.urandom(100))
    r = run("summary", str(p))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "not a Parquet trace bundle" in r.stderr


@pytest.mark.parametrize("mode", [[], ["--impl", "fa4"], ["--kernel", "calibration"], ["--kernel", "markers"]],
                         ids=["ours", "fa4", "calibration", "markers"])
def test_record_without_gpu_says_so(tmp_path, mode):
    """Every mode of `record` gets past its options to the GPU (with click 8.2, an empty
    variadic argument once read as given on the command line: "script_args does not apply")."""
    r = run("record", *mode, "-o", str(tmp_path / "c.parquet"))
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        pytest.skip("this machine has a GPU")
    assert r.returncode != 0 and r.stderr.count("\n") == 1
    assert "GPU" in r.stderr or "PyTorch" in r.stderr
    assert not (tmp_path / "c.parquet").exists()


def test_help_for_every_command():
    for cmd in ("record", "convert", "summary", "compare", "view", "build", "bench", "sweep", "compact", "query"):
        r = run(cmd, "--help")
        assert r.returncode == 0 and "Usage" in r.stdout, cmd


@pytest.mark.parametrize("args", [["--rounds", "0"], ["--replays", "0"]])
def test_bench_rejects_bad_counts_before_looking_for_a_gpu(args):
    r = run("bench", *args)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and f"{args[0]}': 0 is not in the range x>=1" in r.stderr


def test_bench_options_show_in_its_help():
    r = run("bench", "--help")
    assert r.returncode == 0
    for opt in ("--quick", "--kernels", "--replays", "--rounds", "--no-trace-overhead", "--only", "--out"):
        assert opt in r.stdout, opt


def test_summary_says_what_part_of_the_launch_was_recorded():
    from fa4trace.cli.reading import _subset_note

    assert _subset_note({"cta_subset": False, "warp_subset": None}) == ""
    assert _subset_note({"cta_subset": True, "warp_subset": [0, 4]}) == \
        "; recorded: a subset of the grid's CTAs, warps 0,4 of each CTA"


def test_summary_names_the_traced_launch_time_beside_the_untraced_kernel(tmp_path):
    """The events come from the traced launch; the kernel time is the untraced one. A bundle
    that measured both says so, with the difference."""
    buf, meta = attention_like("pingpong", n_ctas=2, n_blocks=6)
    meta = dict(meta, timing={"kernel_us": 20.0, "traced_us": 21.0})
    p = Trace.from_launches([decode_buffer(buf)], meta).save(tmp_path / "t.parquet")
    r = run("summary", str(p))
    lines = r.stdout.splitlines()
    i = next(i for i, x in enumerate(lines) if "kernel time" in x)
    assert "20.00 µs" in lines[i] and "untraced kernel" in lines[i] and "recorded inputs" in lines[i]
    assert "on the recorded inputs: traced 21.00 µs (+5.0%)" in lines[i + 1]
    s = json.loads(run("summary", str(p), "--json").stdout)
    assert s["traced_time_ns"] == pytest.approx(21000.0)
    assert s["kernel_time_kind"] == "recorded_inputs" and s["recorded_kernel_time_ns"] == pytest.approx(20000.0)


def test_summary_prefers_the_cold_l2_benchmark_time(tmp_path):
    """A bundle that carries the cold-L2 benchmark time shows it as the kernel time (and its
    bandwidth); the traced launch is still compared with the untraced kernel on its own inputs."""
    buf, meta = attention_like("pingpong", n_ctas=2, n_blocks=6)
    meta = dict(meta, timing={"bench_us": 22.0, "kernel_us": 20.0, "traced_us": 21.0})
    p = Trace.from_launches([decode_buffer(buf)], meta).save(tmp_path / "t.parquet")
    lines = run("summary", str(p)).stdout.splitlines()
    i = next(i for i, x in enumerate(lines) if "kernel time" in x)
    assert "22.00 µs" in lines[i] and "cold-L2" in lines[i]
    assert "untraced 20.00 µs, traced 21.00 µs (+5.0%)" in lines[i + 1]
    s = json.loads(run("summary", str(p), "--json").stdout)
    assert s["kernel_time_kind"] == "cold_l2_bench" and s["kernel_time_ns"] == pytest.approx(22000.0)
    assert s["bench_time_ns"] == pytest.approx(22000.0)


def test_compare_names_the_kernel_time_source(tmp_path):
    buf, meta = attention_like("base", n_ctas=2, n_blocks=6)
    a = Trace.from_launches([decode_buffer(buf)], dict(meta, timing={"kernel_us": 20.0})).save(tmp_path / "a.parquet")
    buf, meta = attention_like("pingpong", n_ctas=2, n_blocks=6)
    b = Trace.from_launches([decode_buffer(buf)], dict(meta, timing={"bench_us": 19.0})).save(tmp_path / "b.parquet")
    out = run("compare", str(a), str(b)).stdout
    row = next(x for x in out.splitlines() if x.startswith("kernel time from"))
    assert "recorded inputs" in row and "cold-L2 bench" in row
    assert "not comparable" in out
    c = json.loads(run("compare", str(a), str(b), "--json").stdout)
    assert c["a"]["kernel_time_kind"] == "recorded_inputs" and c["b"]["kernel_time_kind"] == "cold_l2_bench"


def test_attention_summary_and_compare_show_the_perturbation(tmp_path):
    """Attention bundles (FA4 through its adapter records CTA lifetimes too) print the same
    line as any kernel's: here lifetimes of a synthetic sampled launch stand in."""
    from fa4trace.analysis.fidelity import perturbation, perturbation_lines
    from fa4trace.testing.bundles import sampled_like

    sbuf, smeta, svocab = sampled_like(n_ctas=128, sms=8, cta_stride=8, n_recorded=16)
    lifetimes = Trace.from_launches([decode_buffer(sbuf, vocab=svocab)], smeta, vocab=svocab).meta["cta_lifetimes"]
    buf, meta = attention_like("pingpong", n_ctas=2, n_blocks=6)
    with_life = Trace.from_launches([decode_buffer(buf)], dict(meta, cta_lifetimes=lifetimes))
    p = perturbation(with_life)
    a = with_life.save(tmp_path / "a.parquet")
    b = Trace.from_launches([decode_buffer(buf)], meta).save(tmp_path / "b.parquet")
    out = run("summary", str(a)).stdout.splitlines()
    assert perturbation_lines(p)[0] == (f"recorded CTAs ran +{100 * p['rel']:.1f}% longer than untraced ones "
                                        f"({p['recorded']['n']} recorded, {p['untraced']['n']} untraced; "
                                        f"steady-state waves; noise ±{100 * p['noise']:.1f}%)")
    assert f"  perturbation   {perturbation_lines(p)[0]}" in out
    out = run("compare", str(a), str(b)).stdout.splitlines()
    assert any(x.startswith("  A perturbation recorded CTAs ran +") for x in out)
    assert any(x.startswith("  B perturbation not measured: no CTA lifetimes") for x in out)


SWEEP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "traces", "sweep-h200")


def test_query_prints_its_rows_and_nothing_else():
    """DuckDB's result goes to Arrow in one step (a relation, not a DB-API cursor, which warns
    about an extra copy): stderr stays empty."""
    r = run("query", SWEEP, "SELECT kernel, count(*) AS n FROM results GROUP BY kernel ORDER BY kernel")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.splitlines()[0].split() == ["kernel", "n"] and r.stdout.rstrip().endswith("(6 rows)")


def test_query_raises_no_warning_in_process():
    import warnings

    from fa4trace.sweep.query import query

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = query(SWEEP, "SELECT kernel, d, sk, tbps FROM results WHERE error IS NULL AND kernel = 'pingpong'")
        empty = query(SWEEP, "CREATE VIEW v AS SELECT 1", force=True)
    assert t.num_rows == 44 and t.column_names == ["kernel", "d", "sk", "tbps"] and empty.num_rows == 0


def test_summary_leaves_out_the_attention_lines_a_bundle_cannot_fill():
    """The marker kernel's bundle (recorded on the H200) has no QK/SOFTMAX/PV events: no 'n/a'
    lines for them."""
    out = run("summary", os.path.join(os.path.dirname(SWEEP), "markers_h200.parquet")).stdout
    assert "kernel time" in out and "dropped" in out
    for label in ("bandwidth", "QK ∥ SOFTMAX", "PV ∥ SOFTMAX", "hidden softmax", "period", "tensor cores", "n/a"):
        assert label not in out, label


def test_an_unexpected_error_is_one_line_unless_debugging(bundles, monkeypatch):
    """A bug (an exception fa4trace does not raise on purpose) still prints one line, naming
    the switch that shows its traceback."""
    from click.testing import CliRunner

    from fa4trace.cli import main
    from fa4trace.cli.common import DEBUG_ENV
    from fa4trace.trace import bundle

    def broken(path):
        raise RuntimeError("boom")

    monkeypatch.setattr(bundle, "load", broken)
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    r = CliRunner().invoke(main, ["summary", str(bundles["base"])])
    assert r.exit_code == 1 and r.stderr.strip().splitlines() == [
        f"fa4trace: error: unexpected RuntimeError: boom (a bug in fa4trace: please report it; {DEBUG_ENV}=1 shows "
        "where it happened)"]
    monkeypatch.setenv(DEBUG_ENV, "1")
    r = CliRunner().invoke(main, ["summary", str(bundles["base"])])
    assert isinstance(r.exception, RuntimeError) and str(r.exception) == "boom"
