"""Shared test setup: GPU tests skip cleanly where no CUDA GPU (or no built kernel) exists."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# Compiles with --keep-ptx write their PTX into the working directory unless the DSL is told
# where: keep it out of the checkout, in one folder per test process (subprocesses inherit it).
if "CUTE_DSL_DUMP_DIR" not in os.environ:
    _dump = tempfile.mkdtemp(prefix="fa4trace-tests-ptx-")
    os.environ["CUTE_DSL_DUMP_DIR"] = _dump
    atexit.register(shutil.rmtree, _dump, True)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_CUDA = _cuda_available()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run tests/gpu on a machine with one: benchmarks/device_run.sh)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def kernels_available():
    """Skip unless kernels can run here: JIT (cutlass + GPU) or an AOT build folder."""
    from fa4trace.run.loader import build_dir, can_jit

    if can_jit("attention"):
        return "jit"
    bd = build_dir(None, "attention")
    if (bd / "manifest.json").is_file():
        return str(bd)
    pytest.skip(f"no kernels to run: build them with `fa4trace build -o {bd}` (or set FA4TRACE_BUILD)")


@pytest.fixture
def tmp_bundle(tmp_path):
    return tmp_path / "t.parquet"


os.environ.setdefault("HYPOTHESIS_PROFILE", "ci")


# The PDL twin the PTX tests read (every untraced variant has one; their names are checked).
PDL_VARIANT = "decode_attn_sm90_d64_pingpong_bf16_r32_pdl"
# Compiled kernels are kept here between runs, keyed by the bytes of their sources
# (tests/tools/compile_pool.py): a run after an unchanged kernel reads them instead of compiling.
PTX_CACHE = os.environ.get("FA4TRACE_PTX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "fa4trace", "ptx"))


@pytest.fixture(scope="session")
def attention_ptx():
    """{variant name: {"ptx", "config", "compile_s"}} for the sm_90a decode-attention variants the
    PTX tests read - every one ``fa4trace build`` exports but the PDL twins, and one of those -
    compiled once per run in two worker processes, or read from PTX_CACHE for this exact source.
    Skips without the CuTe DSL."""
    pytest.importorskip("cutlass")
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
    from compile_pool import compile_all, variant_names

    names = [n for n in variant_names("sm_90a", kinds=("attention",)) if not n.endswith("_pdl") or n == PDL_VARIANT]
    return compile_all("sm_90a", names, jobs=2, cache=PTX_CACHE)


@pytest.fixture
def app_env(monkeypatch, tmp_path):
    """Run the viewer with no bundled traces (an empty traces dir) unless a test passes some."""
    empty = tmp_path / "no_traces"
    empty.mkdir()
    monkeypatch.setenv("FA4TRACE_TRACES_DIR", str(empty))
    monkeypatch.delenv("FA4TRACE_BUNDLES", raising=False)
    return monkeypatch
