"""``fa4trace record --script``: a user's script under fa4trace.instrument (CPU side: what it
compiles is instrumented; without a launch there is nothing to write, said in one line)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COMPILES_ONLY = """
import os, sys
sys.path.insert(0, {tools!r})
import auto_probe, cutlass, cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor
entry, kern = auto_probe.copy_kernel()
t = make_fake_compact_tensor(cutlass.Float32, (cute.sym_int(),), assumed_align=16)
cute.compile(entry, t, t)
print("compiled", sys.argv[1:])
"""


def run(args, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), CUTE_DSL_ARCH="sm_90a")
    return subprocess.run([sys.executable, "-m", "fa4trace", "record", *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=600)


def test_script_that_compiles_but_launches_nothing(tmp_path):
    pytest.importorskip("cutlass")
    script = tmp_path / "user.py"
    script.write_text(COMPILES_ONLY.format(tools=os.path.join(ROOT, "tests", "tools")))
    r = run(["--script", str(script), "-o", "out.parquet", "--", "--m", "8"], tmp_path)
    assert r.returncode == 1
    assert "compiled ['--m', '8']" in r.stdout  # the script ran, with its own arguments
    assert r.stderr.strip().splitlines()[-1].endswith("compiled 1 kernel(s) but launched none of them")
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out.parquet").exists()


def test_script_that_compiles_nothing(tmp_path):
    script = tmp_path / "noop.py"
    script.write_text("print('hello')\n")
    r = run(["--script", str(script), "-o", "out.parquet"], tmp_path)
    if "nvidia-cutlass-dsl" in r.stderr and "supports" in r.stderr:
        pytest.skip("no CuTe DSL here")
    assert r.returncode == 1
    assert "compiled no CuTe DSL kernel" in r.stderr and "Traceback" not in r.stderr


def test_unknown_family_and_stray_arguments_are_one_line(tmp_path):
    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    r = run(["--script", str(script), "--families", "pipeline,dma", "-o", "o.parquet"], tmp_path)
    assert r.returncode == 2 and "unknown dma" in r.stderr and "Traceback" not in r.stderr
    r = run(["--kernel", "calibration", "-o", "o.parquet", "extra"], tmp_path)
    assert r.returncode == 2 and "they go to --script" in r.stderr


def test_passes_go_with_script_only(tmp_path):
    r = run(["--kernel", "calibration", "--passes", "-o", "o.parquet"], tmp_path)
    assert r.returncode == 2 and "--passes goes with --script" in r.stderr and "Traceback" not in r.stderr


def test_passes_reach_instrument(tmp_path, monkeypatch):
    """``record --script --passes`` runs the script under instrument(passes=True) (and without the
    flag, passes=False); a script that compiles nothing then fails in one line as before."""
    pytest.importorskip("torch")
    pytest.importorskip("cutlass")
    import contextlib
    from types import SimpleNamespace

    from click.testing import CliRunner

    import fa4trace.auto.api as api
    from fa4trace.cli import main

    seen = []

    @contextlib.contextmanager
    def fake_instrument(**kw):
        seen.append(kw)
        yield SimpleNamespace(kernels=[], launched=[])

    monkeypatch.setattr(api, "instrument", fake_instrument)
    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    for flag, want, launches in ((["--passes"], True, 1), ([], False, 1), (["--passes", "--pass-launches", "3"], True, 3)):
        r = CliRunner().invoke(main, ["record", "--script", str(script), *flag, "-o", str(tmp_path / "o.parquet")])
        assert r.exit_code == 1 and "compiled no CuTe DSL kernel" in r.output, r.output
        assert seen[-1]["passes"] is want and seen[-1]["pass_launches"] == launches
    n = len(seen)
    for flag, said in ((["--pass-launches", "2"], "--pass-launches goes with --passes"),
                       (["--passes", "--pass-launches", "0"], "0 is not in the range 1<=x<=64")):
        r = CliRunner().invoke(main, ["record", "--script", str(script), *flag, "-o", str(tmp_path / "o.parquet")])
        assert r.exit_code == 2 and said in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert len(seen) == n  # refused before the script ran


def test_pass_launches_go_with_script_only(tmp_path):
    r = run(["--kernel", "calibration", "--pass-launches", "2", "-o", "o.parquet"], tmp_path)
    assert r.returncode == 2 and "--pass-launches goes with --script --passes" in r.stderr
    assert "Traceback" not in r.stderr
