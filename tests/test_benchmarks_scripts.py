"""benchmarks/: every script imports and answers --help on the CPU (so a rename in the library
breaks here, not on a GPU machine), device_run.sh parses and names scripts that exist, the
docs name no missing script, and a CPU benchmark's --json is a result file report.py renders."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(BENCH.glob("*.py"))


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_benchmark_scripts_are_there():
    names = {p.name for p in SCRIPTS}
    assert {"report.py", "bench_recorder.py", "stream_floor.py", "trace_cost.py", "fa4_sm90_device.py",
            "bench_export.py", "bench_app.py"} <= names
    assert (BENCH / "device_run.sh").is_file()


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_imports_and_has_a_docstring(path):
    mod = _load(path)
    assert (mod.__doc__ or "").strip(), f"{path.name} has no docstring"
    assert callable(getattr(mod, "main", None)), f"{path.name} has no main()"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_help(path):
    r = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.lstrip().startswith("usage:"), r.stdout[:500]


def test_device_run_parses_and_names_existing_scripts():
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    script = BENCH / "device_run.sh"
    r = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = script.read_text()
    named = set(re.findall(r"benchmarks/([\w.-]+\.(?:py|sh))", text))
    assert {"bench_recorder.py", "stream_floor.py", "trace_cost.py", "fa4_sm90_device.py"} <= named
    assert "tests/gpu" in text and "fa4trace bench" in text
    for name in named:
        assert (BENCH / name).is_file(), f"device_run.sh names benchmarks/{name}, which does not exist"


def test_docs_name_only_existing_scripts():
    docs = [ROOT / "README.md", ROOT / "traces" / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *SCRIPTS, BENCH / "device_run.sh", *sorted((ROOT / "fa4trace").rglob("*.py")),
            *sorted((ROOT / "tests").rglob("*.py"))]
    missing = []
    for doc in docs:
        for name in re.findall(r"benchmarks/([\w-]+\.(?:py|sh))", doc.read_text()):
            if not (BENCH / name).is_file():
                missing.append(f"{doc.relative_to(ROOT)}: benchmarks/{name}")
    assert not missing, missing


def test_bench_export_json_is_a_result_file(tmp_path):
    report = _load(BENCH / "report.py")
    res = tmp_path / "results"
    r = subprocess.run([sys.executable, str(BENCH / "bench_export.py"), "--events", "3000", "--repeat", "1",
                        "--schedules", "base", "--json", str(res / "host.json")],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (loaded,) = report.load_results(res)
    assert loaded["area"] == "host" and loaded["gpu"].startswith("none: ")
    assert loaded["command"].startswith("python benchmarks/bench_export.py --events 3000")
    md = report.render([loaded], res)
    assert "| base | decode |" in md


def test_the_result_envelope_has_what_report_requires():
    from fa4trace.bench.results import envelope

    report = _load(BENCH / "report.py")
    doc = envelope("floors", "t", [{"shape": "x", "read_us": 1.0}], gpu="none: test", command="python x.py",
                   columns=[("shape", "shape"), ("read_us", "read µs")], notes="n", raw={"a": 1})
    assert all(k in doc for k in report.REQUIRED)
    assert doc["columns"] == [["shape", "shape"], ["read_us", "read µs"]] and doc["raw"] == {"a": 1}
    assert list(doc)[-1] == "rows"


def test_trace_cost_buffers_select_who_records():
    from fa4trace.attention import Shape, plan_splits, variant_for

    tc = _load(BENCH / "trace_cost.py")
    shape = Shape(8, 1, 16, 1, 131072, 128, "bf16")
    v = variant_for(shape, "pingpong", events="core")
    plan = plan_splits(shape, v.tile_n, 132, None, v.block_rows)
    words = {n: tc.buffer_for(n, plan, "cpu", "core") for n in tc.VARIANTS}
    assert words.pop("plain") is None
    size = {n: b.numel() for n, b in words.items()}
    assert size["all"] > size["consumers"] > size["lead"] > size["warp0"] > size["cap32"] > size["first"]


def test_bench_recorder_reads_iket_lines(tmp_path):
    br = _load(BENCH / "bench_recorder.py")
    log = tmp_path / "iket.log"
    log.write_text("IKET_WORKLOAD variant=iket median_us=9.00 min_us=8.00 work=l2 chain=1 iters=1600\n"
                   "IKET_WORKLOAD variant=iket median_us=3300.50 min_us=3290.00 work=l2 chain=1 iters=1600\n"
                   "other output\n")
    assert br.read_iket(str(log)) == {("l2", 1): 3300.5}
