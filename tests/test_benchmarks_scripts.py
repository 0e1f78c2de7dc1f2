"""benchmarks/: every script imports and answers --help on the CPU (so a rename in the library
breaks here, not on a GPU machine), device_run.sh parses and names scripts that exist, the
docs name no missing script, and a CPU benchmark's --json is a result file report.py renders."""

from __future__ import annotations

import importlib.util
import json
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


def test_bench_merge_json_is_a_result_file(tmp_path):
    """bench_merge.py on small inputs: both cases timed, every bundle's launch merged, a result
    file report.py renders in the "merge" area."""
    report = _load(BENCH / "report.py")
    res = tmp_path / "results"
    r = subprocess.run([sys.executable, str(BENCH / "bench_merge.py"), "--trace-mb", "0.2", "--bundles", "2",
                        "--rows", "3000", "--repeat", "1", "--json", str(res / "merge.json")],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (loaded,) = report.load_results(res)
    assert loaded["area"] == "merge" and loaded["gpu"].startswith("none: ")
    assert loaded["command"].startswith("python benchmarks/bench_merge.py --trace-mb 0.2")
    assert [row["case"] for row in loaded["rows"]] == ["merge (with numbers)", "merge --no-numbers"]
    assert all(row["median_s"] > 0 and row["slices"] > 3000 for row in loaded["rows"])
    assert all(row["launches"] == 2 for row in loaded["results"])
    assert "| merge --no-numbers |" in report.render_page("profiler-merge-speed.md", [loaded])  # a docs page of its own


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


# ---- bench_fidelity.py: its CPU half is tested in tests/test_bench_fidelity.py -------------------------


# ---- auto_kernels.py: the ring builds beside their smem-cursor twins (the GPU half needs an H200) ----
def test_auto_kernels_pairs_each_ring_build_with_its_smem_twin(capsys):
    ak = _load(BENCH / "auto_kernels.py")
    made = ({"quack_gemm_sm90" + v[0] for v in ak.VARIANTS} | {"fa4_sm90_prefill_full", "fa4_sm90_prefill_causal"}
            | {"fa4_sm90_prefill_full" + v[0] for v in ak.FA4_VARIANTS} | {"decode_sm90_generic" + v[0] for v in ak.DECODE_VARIANTS})
    assert set(ak.RING_BUILDS) <= made  # build --ring-only names builds that build makes
    rings = [n for n in made if n.endswith("_ring")]
    assert len(rings) == 4 and all(n[:-len("_ring")] in ak.RING_BUILDS for n in rings)
    assert ak._cursor_text({"cursor": "ring", "ring": 8}) == "ring (8 records/warp)"
    assert ak._cursor_text({"cursor": "smem", "l2": "last"}) == "smem, L2 evict_last"
    row = {"kernel": "k", "shape": "s", "families": "f"}
    rows = [dict(row, build="a", cursor="smem", families="f; lead warps 0, 4, 8 record", cost_pct=1.0),
            dict(row, build="a", cursor="smem", cost_pct=20.0),
            dict(row, build="a_ring", cursor="ring (128 records/warp)", cost_pct=12.5),
            dict(row, build="b_ring", cursor="ring (8 records/warp)", cost_pct=None, refused="too much")]
    ak._pair_rings(rows)
    assert rows[2]["smem_cost_pct"] == 20.0 and "smem_cost_pct" not in rows[3]
    assert "ring vs smem cursor: k s, f: ring +12.50% (ring (128 records/warp)), smem +20.00%" in capsys.readouterr().out


def test_auto_kernels_names_a_refused_launch_in_one_line():
    pytest.importorskip("torch")
    ak = _load(BENCH / "auto_kernels.py")

    def refused():
        raise RuntimeError("CUDA_ERROR_INVALID_VALUE: too much shared memory\nsecond line")

    assert ak._refused(refused) == "CUDA_ERROR_INVALID_VALUE: too much shared memory"


def test_decode_recorder_parts_reads_overheads_per_traced_kernel(tmp_path):
    """Each traced kernel against its own "+ref" twin, @options kept apart."""
    import json

    parts = _load(BENCH / "decode_recorder_parts.py")
    rows = [{"kernel": k, "us": us} for k, us in (("pingpong@s8", 32.0), ("pingpong+ref@s8", 32.0),
                                                   ("pingpong+trace@s8", 40.0), ("pingpong+ref", 10.0),
                                                   ("pingpong+trace", 10.5), ("base+trace", float("nan")),
                                                   ("base+ref", 9.0))]
    p = tmp_path / "bench.json"
    p.write_text(json.dumps({"rows": rows}))
    got = parts.overheads(str(p))
    assert got == pytest.approx({"pingpong@s8": 25.0, "pingpong": 5.0})
    # --sass: each part's counts against the untraced kernel's, in a result file
    fp = {"instructions": 100, "timer_reads": 2, "timer_reads_per_lane": 2, "shared_stores": 1, "shared_loads": 0,
          "global_stores": 1, "branches": 3}
    parts.write_sass(str(tmp_path / "s.json"), {"plain": ("the kernel, untraced", "k", dict(fp, timer_reads=0)),
                                                  "full": ("as shipped", "k_traced", dict(fp, instructions=130))})
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["area"] == "decode-recorder-parts-sass" and [r["added"] for r in doc["rows"]] == [0, 30]
    # each part is the build inside ablated(<its name>); "full" is the recorder as shipped
    assert parts.PARTS["full"][0] is None and {"no-timer", "no-store", "no-events"} <= set(parts.PARTS)
    assert all(name == ablation for name, (ablation, _what) in parts.PARTS.items() if name != "full")


def test_decode_recorder_parts_times_a_before_build_in_the_same_rounds(tmp_path, monkeypatch):
    """run --before: the earlier build's parts take turns with the current ones, rows say "(before)"."""
    parts = _load(BENCH / "decode_recorder_parts.py")
    for folder in ("now", "then"):
        (tmp_path / folder / "full").mkdir(parents=True)
    order = []

    def timed(build, only, kernels, out):
        order.append(build.split("/")[-2])
        return {"pingpong": 10.0 if "now" in build else 20.0}

    monkeypatch.setattr(parts, "_time_part", timed)
    rows = parts.run(str(tmp_path / "now"), None, 2, parts.SHAPES[:1], before=str(tmp_path / "then"))
    assert order == ["then", "now", "now", "then"]  # the earlier build first in odd rounds, second in even
    got = {r["part"]: r["cost_pct"] for r in rows}
    assert got == {"the recorder as shipped": 10.0, "the recorder as shipped (before)": 20.0}


def test_bench_after_block_rows_name_each_kind_with_its_interval(tmp_path):
    ab = _load(BENCH / "bench_after_block.py")
    median_ci = _load(BENCH / "bench_instrument_program.py").median_ci  # the interval its rows carry
    xs = [float(i) for i in range(1, 11)] + [50.0]
    lo, hi = median_ci(xs)
    assert lo <= 6.0 <= hi < 10.0  # an outlier round does not carry the median's interval
    kind = {"first5_pct_median": 20.0, "first5_pct": [10.0, 30.0], "steady_pct_median": 1.0,
            "steady_pct_ci95": [-0.5, 2.5], "each_of_first5_pct_median": [200.0, 40.0, 20.0, 10.0, 5.0]}
    fwd = {"case": "fwd", "block_s": 0.02, **{k: kind for k in ab.KINDS}}
    bwd = {"case": "fwd+bwd", "block_s": 0.03, **{k: kind for k in ab.KINDS if k != "graph"}}
    rows = ab.rows_of([fwd, bwd])
    assert [r["case"] for r in rows].count("fwd") == len(ab.KINDS) and [r["case"] for r in rows].count("fwd+bwd") == 4
    r = rows[0]
    assert r["steady_ci"] == "-0.5..+2.5" and r["each_pct"] == "+200 +40 +20 +10 +5" and r["first5_spread"] == "+10.0..+30.0"
    out = tmp_path / "ab.json"
    ab.write([fwd, bwd], str(out), gpu="none: test", commit="abc", command="python x.py")
    doc = json.loads(out.read_text())
    assert doc["area"] == "instrument-program" and doc["commit"] == "abc" and len(doc["rows"]) == 9
    assert {c[0] for c in doc["columns"]} >= {"steady_pct", "steady_ci", "each_pct"}
