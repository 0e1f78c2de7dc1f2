"""The bundles of a training step traced on the H200 (traces/step/: rmsnorm and GEMMs through
quack's torch API, FA4's forward and backward through ``flash_attn_func``, one bundle per
kernel, recorded by tests/gpu/test_jit_gpu.py under ``fa4trace.instrument()``): ``summary``
reads every one in one process of the CLI, and the viewer opens every one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

STEP = Path(__file__).resolve().parents[1] / "traces" / "step"
BUNDLES = sorted(STEP.glob("*.parquet"))


def test_the_step_has_a_bundle_per_kernel():
    assert len(BUNDLES) >= 8, BUNDLES
    from fa4trace.trace.bundle import load

    kernels = {load(p).meta["kernel"] for p in BUNDLES}
    assert any("Backward" in k for k in kernels) and any("rmsnorm" in k.lower() for k in kernels)
    assert any("Gemm" in k for k in kernels), kernels


@pytest.mark.parametrize("path", BUNDLES, ids=[p.stem for p in BUNDLES])
def test_summary_reads_it(path):
    r = subprocess.run([sys.executable, "-m", "fa4trace", "summary", str(path)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    assert "kernel time" in r.stdout


@pytest.mark.parametrize("path", BUNDLES, ids=[p.stem for p in BUNDLES])
def test_the_viewer_opens_it(path, app_env):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from fa4trace.viewer import perfetto_ui

    app_env.setenv("FA4TRACE_BUNDLES", str(path))
    at = AppTest.from_file(str(Path(perfetto_ui.__file__).with_name("main.py")), default_timeout=180)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown = " ".join(m.value for m in at.metric)
    assert "n/a" not in shown and at.metric, shown
