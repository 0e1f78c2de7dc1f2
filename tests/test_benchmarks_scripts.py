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


# ---- bench_fidelity.py: its CPU half (the GPU half needs an H200 and the DSL) ----------------------
def _bundle(make, **kw):
    from fa4trace.trace.bundle import Trace
    from fa4trace.trace.decode import decode_buffer

    buf, meta, vocab = make(**kw)
    return Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab)


def test_bench_fidelity_reads_what_a_trace_reports():
    """trace_metrics on a synthetic pipeline with known answers (the CLI's 'tiny' bundle:
    lag median 110 ns; the producer acquires 60.5% of its life)."""
    from fa4trace.trace.synthetic import pipelined_like

    bf = _load(BENCH / "bench_fidelity.py")
    t = _bundle(pipelined_like, n_ctas=1, k_tiles=4, stages=2, consumer_warps=1, idle_warps=0, load_ns=100,
                mma_ns=50, store_ns=100)
    m = bf.trace_metrics(t, bf.dense_roles(t))
    assert m["lag.ab.median_ns"] == 110.0
    assert m["waiting.producer.ab.acquire"] == pytest.approx(260 / 430)
    assert m["span.mma.wait.median_ns"] == 50.0 and m["span.ab.acquire.median_ns"] > 0
    assert m["cta.median_ns"] > 0  # no lifetimes in this bundle: the span of its warps


def test_bench_fidelity_compares_each_metric_with_the_lightest_trace_reporting_it():
    bf = _load(BENCH / "bench_fidelity.py")
    dense = {"cta.median_ns": 125.0, "lag.ab.median_ns": 103.0, "overlap.softmax.mma": 0.5, "only.dense": 1.0}
    refs = [("lifetimes", {"cta.median_ns": 100.0}), ("pipeline", {"lag.ab.median_ns": 100.0, "cta.median_ns": 90.0}),
            ("dense, lead warps", {"overlap.softmax.mma": 0.495, "lag.ab.median_ns": 103.0})]
    rows = {r["metric"]: r for r in bf.metric_errors("k", dense, refs, {"cta.median_ns": 124.0})}
    assert set(rows) == {"cta.median_ns", "lag.ab.median_ns", "overlap.softmax.mma"}
    assert rows["cta.median_ns"]["reference"] == "lifetimes" and rows["cta.median_ns"]["rel_err_pct"] == 25.0
    assert rows["cta.median_ns"]["noise_pct"] == pytest.approx(0.81, abs=0.01)
    assert rows["lag.ab.median_ns"]["reference"] == "pipeline" and rows["lag.ab.median_ns"]["within_target"] is False
    assert rows["overlap.softmax.mma"]["within_target"] is True
    s = bf.error_summary(list(rows.values()))["k"]
    assert s == {"metrics": 3, "within_target": 1, "worst_pct": 25.0, "worst": "cta.median_ns"}
    # a reference recording fewer warps is set against the dense trace's same warps
    refs[2] = ("dense, lead warps", {"overlap.softmax.mma": 0.495}, {"overlap.softmax.mma": 0.6})
    row = {r["metric"]: r for r in bf.metric_errors("k", dense, refs)}["overlap.softmax.mma"]
    assert row["dense"] == 0.6 and row["within_target"] is False


def test_bench_fidelity_sees_the_dense_trace_on_the_lead_warps_only():
    from fa4trace.trace.synthetic import pipelined_like

    bf = _load(BENCH / "bench_fidelity.py")
    t = _bundle(pipelined_like, n_ctas=2, k_tiles=4, stages=2, consumer_warps=3, idle_warps=0, load_ns=100,
                mma_ns=50, store_ns=100)
    sub = bf.only_warps(t, [0, 1])
    assert set(sub.events["warp"].to_pylist()) == {0, 1} and sub.events.num_rows < t.events.num_rows
    assert sub.meta == t.meta


def test_bench_fidelity_sets_the_line_beside_the_launch_cost_and_writes_reportable_files(tmp_path):
    from fa4trace.trace.synthetic import sampled_like

    bf = _load(BENCH / "bench_fidelity.py")
    report = _load(BENCH / "report.py")
    t = _bundle(sampled_like, n_ctas=128, sms=8, cta_stride=8, n_recorded=16, slowdown=0.2)
    row = bf.perturbation_row("k", "dense", t, {"plain_us": 10.0, "cost_all_pct": 18.0, "cost_sample_pct": 2.0,
                                                "stamps_only_pct": None})
    assert 18 < row["line_pct"] < 22 and row["basis"] == "steady" and row["caveats"] == 0
    assert row["target_pct"] is None and row["line_within_target"] is None  # no target for kernel "k"
    gemm = bf.perturbation_row("quack GEMM", "dense", t, {"cost_all_pct": 18.0})
    assert gemm["target_pct"] == 3.0 and gemm["line_within_target"] is False
    assert row["line_minus_cost_all_pts"] == pytest.approx(row["line_pct"] - 18.0)
    errors = bf.metric_errors("k", {"cta.median_ns": 120.0}, [("lifetimes", {"cta.median_ns": 100.0})])
    out = tmp_path / "results" / "fidelity_test.json"
    bf.write_results(str(out), errors, [row], gpu="none: test")
    assert bf.cost_path(str(out)).name == "fidelity_test_cost.json"
    loaded = report.load_results(out.parent)
    assert [r["area"] for r in loaded] == ["fidelity-error", "fidelity"]
    md = report.render(loaded, out.parent)
    page = report.render_page("fidelity-error.md", loaded)  # the per-metric errors have a page of their own
    assert "| k | cta.median_ns | 120.0 | lifetimes | 100.0 | 20.0 |" in page and "| k | dense |" in md
    assert "cta.median_ns" not in md and "docs/fidelity-error.md" in md


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
    # each part is the build with the Recorder.ablation of its name; "full" is the recorder as shipped
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
