"""Sweep figures (fa4trace.sweep.figures), `fa4trace plot` and the viewer's Sweep tab, on a
synthetic dataset in the sweep layout (results/, bundles/, sweeps/) with made-up bandwidths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")
pytest.importorskip("duckdb")

from streamlit.testing.v1 import AppTest  # noqa: E402

from fa4trace.sweep import figures as F  # noqa: E402
from fa4trace.trace.bundle import Trace  # noqa: E402
from fa4trace.trace.decode import decode_buffer  # noqa: E402
from fa4trace.testing.bundles import attention_like  # noqa: E402
from fa4trace.viewer import perfetto_ui  # noqa: E402
from tests.tools import sweep_dataset as S  # noqa: E402

MAIN = str(Path(perfetto_ui.__file__).with_name("main.py"))
FAILED = dict(d=64, hkv=1, sk=8192)  # cuDNN fails there


def _bundle(root: Path, kernel: str, row: dict) -> str:
    rel = Path("bundles") / f"kernel={kernel}" / f"d={row['d']}" / f"{row['point_id']}.parquet"
    buf, meta = attention_like(kernel, n_ctas=4, n_blocks=12, seed=1)
    meta["config"] = {**meta["config"], **{k: row[k] for k in ("d", "hq", "hkv", "sk", "b", "sq")}}
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    Trace.from_launches([decode_buffer(buf)], meta).save(root / rel, overwrite=True)
    return str(rel)


PP_FAILED = dict(d=64, hkv=2, sk=8192)  # and the ping-pong there


def _at(r: dict, kernel: str, where: dict) -> bool:
    return r["kernel"] == kernel and r["sq"] == 1 and all(r[k] == v for k, v in where.items())


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    rows = S.grid_rows(kernels=("base", "pingpong", "intrawg", "cudnn"), sks=(1024, 8192, 131072), sqs=(1, 4))
    rows = [r for r in rows if not (_at(r, "cudnn", FAILED) or _at(r, "pingpong", PP_FAILED))]
    rows.append(S.row("cudnn", **FAILED, error="unsupported head dim"))
    rows.append(S.row("pingpong", **PP_FAILED, error="launch failed"))
    # an older measurement of one point, superseded by the grid's row
    rows.append(S.row("base", d=128, hkv=1, sk=131072, tbps=0.1, sweep="s0", finished_at="2026-11-01T00:00:00+00:00"))
    for r in rows:
        if r["d"] == 128 and r["hkv"] == 1 and r["sk"] == 131072 and r["sq"] == 1 and r["kernel"] in ("base", "pingpong") \
                and r["sweep_id"] == "s1":
            r["bundle"] = _bundle(root, r["kernel"], r)
    S.write_rows(root, rows)
    S.write_sweep_json(root)
    return root


@pytest.fixture(scope="module")
def df(dataset):
    return F.load(dataset)


def _ann(fig, name: str) -> list[dict]:
    return [a for a in fig.to_dict()["layout"].get("annotations", []) if a.get("name") == name]


def test_load_reads_the_layout_newest_row_per_point(df):
    assert len(df) == 4 * 2 * 2 * 3 * 2  # kernels x d x hkv x sk x sq; the older row of one point is dropped
    old = df[(df["kernel"] == "base") & (df["d"] == 128) & (df["hkv"] == 1) & (df["sk"] == 131072) & (df["sq"] == 1)]
    assert len(old) == 1 and old["sweep_id"].iloc[0] == "s1" and old["tbps"].iloc[0] == pytest.approx(3.0)
    assert set(df["gqa"]) == {"16:1", "16:2"} and int(df["failed"].sum()) == 2
    assert df.loc[df["failed"], "tbps"].isna().all()
    assert F.kernels_in(df) == ["base", "pingpong", "intrawg", "cudnn"]
    assert F.batches(df) == [1] and F.default_b(df) == 1


def test_sweep_info_reads_sweep_json(dataset):
    assert [(r["sweep"], r["gpu"]) for r in F.sweep_info(dataset)] == [("s1", "synthetic")]


def test_load_names_a_folder_without_results(tmp_path):
    with pytest.raises(F.DatasetError, match="no sweep results"):
        F.load(tmp_path)


def test_figure_9_panels_bars_gains_and_gaps(df):
    fig = F.bandwidth_vs_sk(df, ["base", "pingpong", "intrawg", "cudnn"])
    lay = fig.to_dict()["layout"]
    titles = [a["text"] for a in lay["annotations"] if not a.get("name")]
    assert titles == ["d 64 · GQA 16:1", "d 64 · GQA 16:2", "d 128 · GQA 16:1", "d 128 · GQA 16:2"]
    assert {t.meta["kernel"] for t in fig.data} == {"base", "pingpong", "intrawg", "cudnn"}
    assert len(fig.data) == 16 and sum(t.showlegend for t in fig.data) == 4  # one legend entry per kernel
    assert all(list(t.x) == ["1k", "8k", "128k"] for t in fig.data)
    # ping-pong's gain over base on each pair: synthetic TB/s 2.5 vs 2.0 -> +25%; none where ping-pong failed
    gains = _ann(fig, "gain")
    assert len(gains) == 4 * 3 - 1 and {g["text"] for g in gains} == {"+25%"}
    assert {(g["x"], g["xref"]) for g in gains if g["xref"] == "x"} == {(0, "x"), (1, "x"), (2, "x")}
    assert {g["yref"] for g in gains} == {"y", "y2", "y3", "y4"}
    # failures are gaps (None), not zeros, with an x naming the error
    cudnn = next(t for t in fig.data if t.meta == {"kernel": "cudnn", "d": 64, "gqa": "16:1"})
    assert cudnn.y[1] is None and cudnn.y[0] > 0 and "failed: unsupported head dim" in cudnn.customdata[1]
    pp = next(t for t in fig.data if t.meta == {"kernel": "pingpong", "d": 64, "gqa": "16:2"})
    assert pp.y[1] is None
    errs = _ann(fig, "error")
    assert len(errs) == 2 and any("unsupported head dim" in e["hovertext"] for e in errs)
    # each over its own bar's slot: cuDNN is the 4th of 4 bars at 8k (index 1), ping-pong the 2nd
    xs = sorted(e["x"] for e in errs)
    w = 1 - F.BARGAP
    assert xs == pytest.approx([1 - w / 2 + 1.5 * w / 4, 1 - w / 2 + 3.5 * w / 4])
    # the title in the top margin, the legend right of the panels: they never meet
    assert lay["title"]["yref"] == "container" and lay["title"]["yanchor"] == "top"
    assert lay["legend"]["x"] > 1 and lay["legend"]["xanchor"] == "left" and lay["legend"]["y"] <= 1


def test_figure_9_kernel_set_and_batch(df):
    fig = F.bandwidth_vs_sk(df, ["base", "cudnn"])
    assert {t.meta["kernel"] for t in fig.data} == {"base", "cudnn"} and not _ann(fig, "gain")
    empty = F.bandwidth_vs_sk(df, ["base"], b=8)
    assert not empty.data and _ann(empty, "empty")


def test_figure_10_is_over_query_length_at_the_longest_kv(df):
    fig = F.bandwidth_vs_sq(df, ["base", "pingpong"])
    assert "KV length 128k" in fig.layout.title.text
    assert all(list(t.x) == ["1", "4"] for t in fig.data) and len(fig.data) == 8
    base = next(t for t in fig.data if t.meta == {"kernel": "base", "d": 128, "gqa": "16:1"})
    assert list(base.y) == pytest.approx([3.0, 3.0])
    # on the pair, not at the category a numeric-looking label would name ("4" is not index 4)
    assert sorted(a["x"] for a in _ann(fig, "gain")) == [0, 0, 0, 0, 1, 1, 1, 1]


def test_overlap_lines_per_panel(df):
    fig = F.overlap_figure(df)
    names = {t.name for t in fig.data}
    assert names == {"ping-pong: QK ∥ SOFTMAX", "intra-WG: PV ∥ SOFTMAX"} and len(fig.data) == 8
    pp = next(t for t in fig.data if t.meta == {"kernel": "pingpong", "d": 64, "gqa": "16:2"})
    assert list(pp.y) == [pytest.approx(60.0), None, pytest.approx(60.0)] and pp.connectgaps is False
    iw = next(t for t in fig.data if t.meta["kernel"] == "intrawg")
    assert list(iw.y) == pytest.approx([40.0] * 3)
    assert len(_ann(fig, "error")) == 1


def test_bundle_points(df, dataset):
    pts = F.bundle_points(df, dataset)
    assert len(pts) == 1
    p = pts.iloc[0]
    assert Path(p["base"]).is_file() and Path(p["pingpong"]).is_file()
    assert F.point_label(p).startswith("d 128 · GQA 16:1 · sk 128k · b 1 · q_len 1")


def test_a_click_picks_the_point_with_bundles(df, dataset):
    pts = F.bundle_points(df, dataset)
    fig = F.bandwidth_vs_sk(df, ["base", "pingpong"])
    at = {(t.meta["kernel"], t.meta["d"], t.meta["gqa"]): i for i, t in enumerate(fig.data)}
    assert F.clicked_point(fig, [{"curve_number": at["pingpong", 128, "16:1"], "x": "128k"}], pts) == 0
    assert F.clicked_point(fig, [{"curve_number": at["pingpong", 128, "16:1"], "x": "8k"}], pts) is None
    assert F.clicked_point(fig, [{"curve_number": at["base", 64, "16:1"], "x": "128k"}], pts) is None
    f10 = F.bandwidth_vs_sq(df, ["base", "pingpong"])
    i = next(i for i, t in enumerate(f10.data) if t.meta == {"kernel": "base", "d": 128, "gqa": "16:1"})
    assert F.clicked_point(f10, [{"curve_number": i, "x": "1"}], pts) == 0
    assert F.clicked_point(f10, [{"curve_number": i, "x": "4"}], pts) is None
    assert F.clicked_point(fig, [], pts) is None and F.clicked_point(fig, [{"curve_number": 99, "x": "1k"}], pts) is None


def _plot(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fa4trace", "plot", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_cli_plot_writes_html(dataset, tmp_path):
    out = tmp_path / "fig9.html"
    r = _plot(dataset, "-o", out)
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert "Decode bandwidth over KV length" in html and "+25%" in html
    assert "<script src=\"https://cdn" not in html  # offline: plotly.js inline
    r = _plot(dataset, "-o", out, "--figure", "10")
    assert r.returncode != 0 and "exists" in r.stderr
    r = _plot(dataset, "-o", tmp_path / "f.pdf")
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "use .html, .png or .svg" in r.stderr
    r = _plot(tmp_path, "-o", tmp_path / "x.html")
    assert r.returncode != 0 and "no sweep results" in r.stderr


@pytest.mark.skipif(F.static_export_problem() is not None, reason="kaleido is not installed")
def test_cli_plot_writes_png_and_svg(dataset, tmp_path):
    r = _plot(dataset, "-o", tmp_path / "o.svg", "--figure", "overlap")
    if r.returncode != 0 and "static export failed" in r.stderr:
        pytest.skip(f"no Chrome for kaleido here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "o.svg").read_text().lstrip().startswith("<svg")
    r = _plot(dataset, "-o", tmp_path / "o.png", "--kernels", "base,pingpong", "--b", "1")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "o.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- the viewer's Sweep tab ------------------------------------------------------------------------
@pytest.fixture
def sweep_env(monkeypatch, tmp_path, dataset):
    empty = tmp_path / "no_traces"
    empty.mkdir()
    monkeypatch.setenv("FA4TRACE_TRACES_DIR", str(empty))
    monkeypatch.delenv("FA4TRACE_BUNDLES", raising=False)
    monkeypatch.setenv("FA4TRACE_SWEEP", str(dataset))
    return dataset


def _chart(at, key):
    charts = [c for c in at.get("plotly_chart") if c.proto.id and key in c.proto.id]
    assert charts, f"no {key} chart"
    return json.loads(charts[0].proto.spec)


def test_sweep_page_figures_and_opening_a_point(sweep_env):
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    fig = _chart(at, "sweep_chart")  # no bundles anywhere: the page still shows the sweep
    # 24 shapes (d x hkv x sk x sq), each measured by 4 kernels: 96 rows, 2 of them failed
    assert any(": 24 points, 96 rows (one per kernel and point), 2 failed" in c.value for c in at.caption)
    assert {a["text"] for a in fig["layout"]["annotations"] if a.get("name") == "gain"} == {"+25%"}
    at.radio(key="sweep_fig").set_value("overlap").run()
    assert not at.exception and "overlap" in _chart(at, "sweep_chart")["layout"]["title"]["text"]
    at.radio(key="sweep_fig").set_value("9").run()
    at.button(key="sweep_open").click().run()
    assert not at.exception, [e.value for e in at.exception]
    # the point's bundles are now A (base) and B (ping-pong); the Sweep tab shows their timelines
    assert at.session_state["trace_a"].split(":")[1].endswith(os.path.join("kernel=base", "d=128",
                                                                           "base-d128-hq16-hkv1-sk131072-b1-sq1.parquet"))
    assert "kernel=pingpong" in at.session_state["trace_b"]
    tl = _chart(at, "timeline")
    assert len([k for k in tl["layout"] if k.startswith("yaxis")]) == 2  # two panels side by side: A and B
    assert any(c.proto.id and "sweep_chart" in c.proto.id for c in at.get("plotly_chart"))
    dl = [b for b in at.get("download_button") if "sweep_dl" in (b.proto.id or "")]
    assert len(dl) == 3


def test_sweep_tab_on_a_compacted_dataset(monkeypatch, tmp_path, dataset, df):
    import shutil

    from fa4trace.sweep.compact import compact

    root = tmp_path / "compacted"
    shutil.copytree(dataset, root)
    assert compact(root)["written"] > 0 and not [f for f in (root / "results").rglob("*.parquet")
                                                 if not f.name.startswith("compact-")]
    got = F.load(root)
    cols = ["kernel", "d", "hkv", "sk", "sq", "tbps", "error", "bundle", "sweep_id"]
    assert got.sort_values(cols[:5])[cols].reset_index(drop=True).equals(df.sort_values(cols[:5])[cols].reset_index(drop=True))
    empty = tmp_path / "no_traces"
    empty.mkdir()
    monkeypatch.setenv("FA4TRACE_TRACES_DIR", str(empty))
    monkeypatch.delenv("FA4TRACE_BUNDLES", raising=False)
    monkeypatch.setenv("FA4TRACE_SWEEP", str(root))
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert {a["text"] for a in _chart(at, "sweep_chart")["layout"]["annotations"] if a.get("name") == "gain"} == {"+25%"}
    at.button(key="sweep_open").click().run()
    assert not at.exception and "kernel=pingpong" in at.session_state["trace_b"]


BUNDLED_SWEEP = Path(__file__).resolve().parent.parent / "traces" / "sweep-h200"


@pytest.mark.skipif(not (BUNDLED_SWEEP / "results").is_dir(), reason="traces/ lacks the H200 sweep")
def test_sweep_tab_counts_points_not_rows(monkeypatch, tmp_path):
    """The H200 sweep: each point_id names a shape, measured by each of 6 kernels; the tab says
    how many shapes (points) and how many rows."""
    df = F.load(BUNDLED_SWEEP)
    points, kernels = df["point_id"].nunique(), df["kernel"].nunique()
    assert kernels > 1 and len(df) == points * kernels
    empty = tmp_path / "no_traces"
    empty.mkdir()
    monkeypatch.setenv("FA4TRACE_TRACES_DIR", str(empty))
    monkeypatch.delenv("FA4TRACE_BUNDLES", raising=False)
    monkeypatch.setenv("FA4TRACE_SWEEP", str(BUNDLED_SWEEP))
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    said = next(c.value for c in at.caption if c.value.startswith(f"{BUNDLED_SWEEP}: "))
    assert said.startswith(f"{BUNDLED_SWEEP}: {points} points, {len(df)} rows (one per kernel and point), "
                           f"{int(df['failed'].sum())} failed")


def test_sweep_tab_without_a_dataset_and_with_a_bad_one(monkeypatch, tmp_path, dataset):
    from tests.test_app import make_bundle

    a = make_bundle(tmp_path / "a.parquet", "base")
    monkeypatch.setenv("FA4TRACE_TRACES_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("FA4TRACE_BUNDLES", str(a))
    monkeypatch.delenv("FA4TRACE_SWEEP", raising=False)
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.session_state["view"] = "Sweep"
    at.run()
    assert not at.exception and any("Name a sweep dataset" in i.value for i in at.info)
    at.text_input(key="sweep_root").set_value(str(tmp_path)).run()
    assert not at.exception and any("no sweep results" in e.value for e in at.error)
    at.text_input(key="sweep_root").set_value(str(dataset)).run()
    assert not at.exception and _chart(at, "sweep_chart")["data"]


def test_view_sweep_hands_the_dataset_to_the_page(monkeypatch, dataset, tmp_path):
    from click.testing import CliRunner

    from fa4trace import cli
    from fa4trace.cli import viewing

    seen = {}

    def fake_execv(exe, cmd):
        seen["cmd"], seen["sweep"] = cmd, os.environ.pop("FA4TRACE_SWEEP", None)  # leaves no trace for other tests
        raise SystemExit(0)

    monkeypatch.setattr(viewing.os, "execv", fake_execv)
    monkeypatch.setenv("FA4TRACE_SWEEP", "")  # restored (removed) after the test
    r = CliRunner().invoke(cli.main, ["view", "--headless", "--port", "8799", "--sweep", str(dataset)])
    assert r.exit_code == 0, r.output
    assert seen["sweep"] == str(dataset.resolve()) and "streamlit" in seen["cmd"]
    r = CliRunner().invoke(cli.main, ["view", "--sweep", str(tmp_path / "missing")])
    assert r.exit_code != 0 and "does not exist" in r.output


@pytest.mark.slow
def test_clicking_a_bar_in_the_browser_picks_its_point(tmp_path):
    pytest.importorskip("websockets")
    from tests.tools import headless

    if headless.find_chromium() is None:
        pytest.skip("chromium not installed")
    rows = S.grid_rows(kernels=("base", "pingpong"), ds=(128,), hkvs=(1,), sks=(1024, 131072))
    for r in rows:  # two points with bundles: sk 1k (picked first) and 128k
        r["bundle"] = _bundle(tmp_path, r["kernel"], r)
    S.write_rows(tmp_path, rows)
    env = {"FA4TRACE_BUNDLES": "", "FA4TRACE_SWEEP": str(tmp_path), "FA4TRACE_TRACES_DIR": str(tmp_path / "none")}
    boxes = "[...document.querySelectorAll('[data-testid=stSelectbox] input')].map(e => e.value).join(' || ')"
    idle = "!document.querySelector('[data-testid=stStatusWidget]')"
    with headless.StreamlitServer((), env=env, timeout=120) as srv, \
            headless.Chromium(width=1500, height=1500, offline=True) as br:
        br.navigate(srv.url + "/?view=Sweep")
        br.wait_for("!!document.querySelector('.js-plotly-plot .main-svg')", timeout=180)
        br.wait_for(idle, timeout=180)
        assert "sk 1k" in br.evaluate(boxes)
        # the base bar at 128k: trace 0 (base), its second point
        x, y = br.evaluate("(() => { const t = document.querySelectorAll('.js-plotly-plot g.trace.bars')[0];"
                           " const r = t.querySelectorAll('.point path')[1].getBoundingClientRect();"
                           " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            br.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "clickCount": 0 if kind == "mouseMoved" else 1,
                                                 "button": "none" if kind == "mouseMoved" else "left"})
        br.wait_for(f"({boxes}).includes('sk 128k')", timeout=120)
