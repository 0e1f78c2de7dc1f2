"""`fa4trace build` end to end on the CPU: export, link, manifest, and loading the library the
way a GPU machine without the DSL does (tvm-ffi, no cutlass import). Calling a kernel needs a
GPU (tests/gpu); finding and binding every exported function does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fa4trace.format import layout as L

pytest.importorskip("tvm_ffi")
ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, **env_extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def calibration_build(tmp_path_factory):
    pytest.importorskip("cutlass")
    out = tmp_path_factory.mktemp("aot") / "build"
    res = subprocess.run([sys.executable, "-m", "fa4trace", "build", "--only", "calibration", "-o", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    return out


def test_build_writes_a_library_and_a_manifest_that_describes_it(calibration_build):
    m = json.loads((calibration_build / "manifest.json").read_text())
    assert m["arch"] == "sm_90a"
    assert m["recorder_abi"] == L.RECORDER_ABI
    assert m["cute_dsl_runtime"] in ("cu12", "cu13")
    assert sorted(m["functions"]) == ["calibration_clock64", "calibration_globaltimer"]
    assert {f["kind"] for f in m["functions"].values()} == {"calibration"}
    assert (calibration_build / m["library"]).stat().st_size > 0
    assert not (calibration_build / "obj").exists()  # objects are removed after linking


def test_a_build_loads_without_cutlass_or_a_library_path(calibration_build):
    """The loader finds the DSL runtime of the installed nvidia-cutlass-dsl itself (no
    LD_LIBRARY_PATH) and binds every function without importing cutlass (tvm-ffi itself
    imports torch where it is installed, for DLPack)."""
    res = _run(
        "import sys\n"
        "from fa4trace.run.aot import BuildDir\n"
        f"bd = BuildDir({str(calibration_build)!r})\n"
        "fns = [bd.function(n) for n in sorted(bd.functions)]\n"
        "assert all(callable(f) for f in fns), fns\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'cutlass']\n"
        "print(len(fns))\n")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "2"


def test_a_missing_runtime_is_one_line_naming_what_to_install(calibration_build):
    res = _run(
        "import fa4trace.run.aot as aot\n"
        "from fa4trace.format.errors import DeviceUnavailable\n"
        "aot.find_runtime = lambda runtime: None  # a machine with tvm-ffi but no DSL runtime\n"
        f"bd = aot.BuildDir({str(calibration_build)!r})\n"
        "try:\n"
        "    bd.function('calibration_clock64')\n"
        "except DeviceUnavailable as e:\n"
        "    print(e)\n")
    assert res.returncode == 0, res.stderr
    msg = res.stdout.strip()
    assert "\n" not in msg
    assert "libcute_dsl_runtime.so" in msg and "nvidia-cutlass-dsl[cu" in msg and "LD_LIBRARY_PATH" in msg


def test_a_truncated_library_is_one_clear_error(calibration_build, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text((calibration_build / "manifest.json").read_text())
    (broken / "fa4trace_kernels.so").write_bytes((calibration_build / "fa4trace_kernels.so").read_bytes()[:4096])
    res = _run(
        "from fa4trace.run.aot import BuildDir\n"
        "from fa4trace.format.errors import Fa4traceError\n"
        f"bd = BuildDir({str(broken)!r})\n"
        "try:\n"
        "    bd.function('calibration_clock64')\n"
        "except Fa4traceError as e:\n"
        "    print(type(e).__name__, e)\n")
    assert res.returncode == 0, res.stderr
    # dlopen of a cut-off ELF dies of SIGBUS, so the loader checks the file's extent first.
    assert res.stdout.startswith(f"Fa4traceError {broken / 'fa4trace_kernels.so'} is truncated"), res.stdout
    assert res.stdout.count("\n") == 1


def test_a_library_that_is_not_one_is_one_clear_error(calibration_build, tmp_path):
    broken = tmp_path / "notelf"
    broken.mkdir()
    (broken / "manifest.json").write_text((calibration_build / "manifest.json").read_text())
    (broken / "fa4trace_kernels.so").write_text("not a library\n")
    from fa4trace.format.errors import Fa4traceError
    from fa4trace.run.aot import BuildDir

    with pytest.raises(Fa4traceError, match="is not a shared library"):
        BuildDir(broken).function("calibration_clock64")
