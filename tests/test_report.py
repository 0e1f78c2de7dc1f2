"""benchmarks/report.py: BENCHMARKS.md and the docs pages (docs/not-kept.md, docs/tracing-cost.md, ...)
are what the result files render to, and the renderer's rules."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _report():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


report = _report()


def _meta(area, **kw):
    return {"area": area, "title": f"{area} title", "date": "2026-12-01", "commit": "abc1234",
            "gpu": "NVIDIA H200", "command": "fa4trace bench", **kw}


def _row(kernel, us, **kw):
    return {"d": 128, "hq": 16, "hkv": 1, "sk": 131072, "b": 1, "sq": 1, "dtype": "bf16", "kernel": kernel,
            "us": us, "us_spread": 0.1, "tbps": None if us is None else round(67.1e6 / us / 1e6, 2),
            "rel_err": 2e-3, **kw}


def _write(folder: Path, name: str, obj) -> None:
    (folder / name).write_text(json.dumps(obj))


def test_benchmarks_md_is_up_to_date(capsys):
    assert report.main(["--check"]) == 0, "BENCHMARKS.md or docs/not-kept.md is stale: run python benchmarks/report.py"
    assert (ROOT / "BENCHMARKS.md").stat().st_size <= 25 * 1024  # current numbers only: a page, not a diary


def test_check_fails_on_a_stale_file(tmp_path, capsys):
    res = tmp_path / "results"
    res.mkdir()
    _write(res, "a.json", _meta("floors", rows=[{"shape": "x", "read_us": 1.5}]))
    out = tmp_path / "B.md"
    assert report.main(["--results", str(res), "--out", str(out)]) == 0
    assert report.main(["--check", "--results", str(res), "--out", str(out)]) == 0
    out.write_text(out.read_text() + "edited by hand\n")
    assert report.main(["--check", "--results", str(res), "--out", str(out)]) == 1
    assert "out of date" in capsys.readouterr().err


def test_decode_area_renders_bench_rows(tmp_path):
    rows = [_row("base", 21.0), _row("pingpong", 20.0, gpu_state={"power_cap_share": 0.5, "thermal_share": 0.0,
                                                                  "sm_mhz_min": 1500, "sm_mhz_max": 1980}),
            _row("cudnn", 28.0), _row("pingpong+ref", 20.0), _row("pingpong+trace", 21.0),
            _row("pingpong+tracelead", 20.5), _row("base+trace", 22.05)]
    _write(tmp_path, "decode.json", _meta("decode", rows=rows, notes="a note"))
    md = report.render(report.load_results(tmp_path), tmp_path)
    assert "2026-12-01 · commit `abc1234` · NVIDIA H200" in md and "`fa4trace bench`" in md and "a note" in md
    line = next(x for x in md.splitlines() if x.startswith("| d128 16:1 sk 131072 b 1 | 21.0"))
    # base / pingpong = +5.0%, cuDNN / pingpong = 1.40x, half the samples power-capped
    assert "| +5.0% | 1.40x | 50% / 1500 |" in line
    trace = next(x for x in md.splitlines() if x.startswith("| d128 16:1 sk 131072 b 1 | +"))
    # overhead against +ref where there is one (pingpong), else the untraced kernel (base)
    assert trace.split(" | ")[1] == "+5.0% / +5.0%" and trace.split(" | ")[2] == "- / +2.5%"
    assert "Max relative error vs float32: 2.0e-03" in md


def test_decode_area_prefers_transcribed_cells(tmp_path):
    rows = [_row("base", 7.0), _row("pingpong", 5.7, vs_base_pct=21.4, vs_cudnn_x=1.41), _row("cudnn", 8.1),
            _row("pingpong+trace", None, overhead_pct=4.9)]
    _write(tmp_path, "decode.json", _meta("decode", rows=rows))
    md = report.render(report.load_results(tmp_path), tmp_path)
    assert "| +21.4% | 1.41x |" in md
    assert "| +4.9% |" in md


def test_generic_areas_and_the_not_kept_page(tmp_path):
    _write(tmp_path, "f.json", _meta("floors", columns=[["shape", "shape"], ["read_us", "read µs"]],
                                     rows=[{"d": 64, "hq": 16, "hkv": 2, "sk": 4096, "b": 8, "sq": 4,
                                            "read_us": 37.0}, {"shape": "other", "read_us": None}]))
    _write(tmp_path, "n.json", _meta("not-kept", notes="One line per idea.",
                                     rows=[{"idea": "Work stealing", "result": "slower", "commit": "ca34783"}]))
    _write(tmp_path, "fa4.json", _meta("fa4-sm90", columns=[["shape", "shape"], ["default_pct", "default %"]],
                                        rows=[{"d": 128, "hq": 16, "hkv": 1, "sk": 4096, "b": 4, "sq": 1,
                                               "default_pct": 19.7}]))
    results = report.load_results(tmp_path)
    md = report.render(results, tmp_path)
    assert "| d64 16:2 sk 4096 b 8 sq 4 | 37.0 |" in md and "| other | - |" in md
    assert "| d128 16:1 sk 4096 b 4 | 19.7 |" in md  # sq 1 goes unsaid
    assert md.index("## Bandwidth floors") < md.index("## FlashAttention-4 SM90")
    # what was tried and not kept is no current result: its own page, linked from BENCHMARKS.md
    assert "Work stealing" not in md and "[docs/not-kept.md](docs/not-kept.md)" in md
    page = report.render_page("not-kept.md", results)
    assert page.startswith("# Tried and not kept\n") and "One line per idea.\n\n- Work stealing: slower (`ca34783`)\n" in page


def test_main_writes_and_checks_the_not_kept_page(tmp_path, capsys):
    res, docs = tmp_path / "results", tmp_path / "docs"
    res.mkdir()
    docs.mkdir()
    _write(res, "n.json", _meta("not-kept", rows=[{"idea": "Two S tiles", "result": "no gain", "commit": "abc1234"}]))
    out = tmp_path / "B.md"
    args = ["--results", str(res), "--out", str(out), "--docs", str(docs)]
    assert report.main(args) == 0
    assert "- Two S tiles: no gain (`abc1234`)" in (docs / "not-kept.md").read_text()
    assert report.main(["--check", *args]) == 0
    (docs / "not-kept.md").write_text("edited by hand\n")
    assert report.main(["--check", *args]) == 1
    assert "not-kept.md is out of date" in capsys.readouterr().err


def test_a_page_holds_several_areas(tmp_path):
    """docs/tracing-cost.md: the tracing-cost tables in its areas' order, under their headings, each
    area's files in name order; none of them in BENCHMARKS.md, which keeps the targets and links the page."""
    res, docs = tmp_path / "results", tmp_path / "docs"
    res.mkdir()
    _write(res, "auto_kernels_ring_h200.json", _meta("auto-kernels", title="ring builds", rows=[{"cost_pct": 3.1}]))
    _write(res, "auto_kernels_h200.json", _meta("auto-kernels", title="first builds", rows=[{"cost_pct": 6.3}]))
    _write(res, "cta_sample_h200.json", _meta("auto-sample", title="a sample", rows=[{"cost_split_pct": 5.2}]))
    _write(res, "trace_cost_parts_h200.json", _meta("trace-cost-parts", title="parts", rows=[{"full": 7.0}]))
    _write(res, "cost_targets.json", _meta("cost-targets", title="targets", rows=[{"target": "GEMM", "best": "+3.10%"}]))
    _write(res, "floors.json", _meta("floors", rows=[{"shape": "x", "read_us": 1.5}]))
    _write(res, "n.json", _meta("not-kept", rows=[{"idea": "Two S tiles", "result": "no gain", "commit": "abc1234"}]))
    out = tmp_path / "B.md"
    assert report.main(["--results", str(res), "--out", str(out), "--docs", str(docs)]) == 0
    md, page = out.read_text(), (docs / "tracing-cost.md").read_text()
    assert page.startswith("# Tracing cost in detail\n")
    order = [page.index(s) for s in ("## Our decode kernel's recorder", "### parts",
                                     "## Automatic events on any CuTe DSL kernel", "### first builds",
                                     "### ring builds", "### a sample")]
    assert order == sorted(order)
    for title in ("parts", "first builds", "ring builds", "a sample"):
        assert f"### {title}" not in md
    assert "## Automatic events" not in md and "| GEMM | +3.10% |" not in page
    # the targets open the "Tracing cost" section; the header links every page with something on it
    assert md.index("## Tracing cost\n\n### targets") < md.index("## Bandwidth floors")
    assert "Tracing cost in detail: [docs/tracing-cost.md](docs/tracing-cost.md)." in md
    assert "[docs/not-kept.md](docs/not-kept.md)" in md and "docs/fidelity-error.md" not in md
    assert sorted(p.name for p in docs.iterdir()) == ["not-kept.md", "tracing-cost.md"]
    assert report.main(["--check", "--results", str(res), "--out", str(out), "--docs", str(docs)]) == 0


def test_every_paged_area_is_on_one_page_and_not_in_the_sections():
    paged = [area for _, _, areas in report.PAGES.values() for area, _ in areas]
    assert len(paged) == len(set(paged)) == len(report.PAGE_OF)
    assert not set(paged) & {a for a, _ in report.AREAS}
    assert ("cost-targets", "Tracing cost") in report.AREAS


def test_a_results_folder_without_not_kept_rows_writes_no_page(tmp_path):
    res, docs = tmp_path / "results", tmp_path / "docs"
    res.mkdir()
    _write(res, "a.json", _meta("floors", rows=[{"shape": "x", "read_us": 1.5}]))
    assert report.main(["--results", str(res), "--out", str(tmp_path / "B.md"), "--docs", str(docs)]) == 0
    assert not docs.exists()


def test_schema_errors_name_the_file(tmp_path):
    _write(tmp_path, "bad.json", {"area": "x", "rows": []})
    with pytest.raises(ValueError, match="bad.json: missing title"):
        report.load_results(tmp_path)
    (tmp_path / "bad.json").unlink()
    _write(tmp_path, "anon.json", {"rows": []})
    with pytest.raises(ValueError, match="anon.json: no 'area'"):
        report.load_results(tmp_path)


def test_every_results_file_has_the_schema():
    for res in report.load_results():
        assert res["date"] and res["commit"] and res["gpu"] and res["command"], res["_file"]


def test_pivot_renders_a_grid_with_a_base_line():
    res = {"pivot": {"rows": ["what"], "columns": ["b {b}"], "value": "pct", "base": "us"},
           "rows": [{"what": "x", "b": 1, "pct": 1.5, "us": 10.0}, {"what": "x", "b": 8, "pct": -2.0, "us": 20.0},
                    {"what": "y", "b": 8, "pct": 3.0, "us": 20.0}]}
    assert report.render_pivot(res) == ["| pct | b 1 | b 8 |", "|---|---|---|", "| *us* | 10.0 | 20.0 |",
                                        "| x | 1.5 | -2.0 |", "| y | - | 3.0 |"]
