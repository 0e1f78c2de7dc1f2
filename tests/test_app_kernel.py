"""The viewer on bundles of automatically traced kernels (streamlit.testing.v1.AppTest).

Synthetic GEMM-like bundles (fa4trace.testing.bundles.pipelined_like, marked synthetic) with known
shapes: A with 2 pipeline stages, B with 6, loads of 2000 ns.
"""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.testing.v1 import AppTest  # noqa: E402

from fa4trace.analysis.kernel import compare_kernels, occupancy_series  # noqa: E402
from fa4trace.analysis.overlap import per_cta, typical_cta  # noqa: E402
from fa4trace.analysis.roles import assign_roles, role_rank  # noqa: E402
from fa4trace.analysis.wait_chain import wait_chains  # noqa: E402
from fa4trace.trace.bundle import Trace, load  # noqa: E402
from fa4trace.trace.decode import decode_buffer  # noqa: E402
from fa4trace.testing.bundles import attention_like, pipelined_like  # noqa: E402
from fa4trace.viewer import data, grid, kernel_view, page, perfetto_ui  # noqa: E402

MAIN = str(Path(perfetto_ui.__file__).with_name("main.py"))


def save(path: Path, **kw) -> Path:
    buf, meta, vocab = pipelined_like(**kw)
    return Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab).save(path, overwrite=True)


@pytest.fixture(scope="module")
def kpair(tmp_path_factory):
    d = tmp_path_factory.mktemp("app_kernel")
    return (save(d / "gemm_s2.parquet", n_ctas=3, k_tiles=16, stages=2, load_ns=2000),
            save(d / "gemm_s6.parquet", n_ctas=3, k_tiles=16, stages=6, load_ns=2000))


from test_app import run_app  # noqa: E402  (the viewer's AppTest harness)


def figure(at: AppTest, key: str) -> dict:
    charts = [c for c in at.get("plotly_chart") if c.proto.id and c.proto.id.endswith(key)]
    assert charts, f"no {key} chart"
    return json.loads(charts[0].proto.spec)


def values(v) -> np.ndarray:
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
    return np.asarray(v, dtype=np.float64)


def test_two_bundles_of_one_kernel_side_by_side(app_env, kpair):
    a, b = kpair
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(a), str(b)]))
    at = run_app()
    assert at.title[0].value == "fa4trace · A vs B"
    want = json.loads(json.dumps(compare_kernels(load(a), load(b))))
    assert json.loads(at.json[0].proto.body) == want  # = fa4trace compare --json A B
    metric_table = next(t.value for t in at.table if "metric" in t.value.columns)
    assert metric_table.to_dict("records") == kernel_view.metric_rows(want["a"], want["b"])
    cards = {m.label: m.value for m in at.metric}
    assert cards["ab: stages held (mean) (B)"] == f"{want['b']['pipelines']['ab']['occupancy_mean']:.2f}"

    # role lanes, grouped by role; waits drawn hollow (a faint wide bar and a thin line)
    fig = figure(at, "timeline")
    titles = [x["text"] for x in fig["layout"]["annotations"]]
    assert titles[0].startswith("A: ") and titles[1].startswith("B: ") and "counts" in titles[0]
    lanes = fig["layout"]["yaxis"]["ticktext"]
    roles = [lb.split(" · ")[1] for lb in lanes]
    assert roles[0] == "producer" and "mma" in roles and "epilogue" in roles
    assert [role_rank(r) for r in roles] == sorted(role_rank(r) for r in roles)
    waits = [t for t in fig["data"] if t["name"] == "ab.wait (wait)" and t.get("yaxis", "y") == "y"]
    assert len(waits) == 2 and waits[0]["opacity"] == 0.3 and waits[1]["line"]["width"] == 3
    assert any(t["name"] == "ab.commit (instant)" for t in fig["data"])

    # the occupancy chart draws analysis.occupancy_series of the shown CTAs, on the timeline's axis
    occ_fig = figure(at, "occupancy")
    assert [t["name"] for t in occ_fig["data"]] == ["A: ab (2 stages)", "B: ab (6 stages)"]
    for tr_path, tr_fig in zip((a, b), occ_fig["data"]):
        tr = load(tr_path)
        cta = typical_cta(tr, per_cta(tr))
        s = occupancy_series(assign_roles(tr)).to_pandas().query("cta == @cta")
        assert np.array_equal(values(tr_fig["y"]), s["stages_full"].to_numpy(np.float64))
        x = values(tr_fig["x"])
        assert np.allclose(np.diff(x), np.diff(s["t_ns"].to_numpy(np.float64)))
    # each shown CTA's wait chain, as wait_chains computes it
    assert len(at.dataframe) == 2
    for df, tr_path in zip(at.dataframe, (a, b)):
        tr = load(tr_path)
        cta = typical_cta(tr, per_cta(tr))
        ch = wait_chains(assign_roles(tr)).to_pandas().query("cta == @cta")
        assert df.value["wait"].tolist() == ch["name"].tolist() and df.value["warp"].tolist() == ch["warp"].tolist()


def test_window_by_pipeline_counts(app_env, kpair):
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join(str(p) for p in kpair))
    at = run_app()
    sl = at.slider[0]
    assert sl.label == "Pipeline counts of each CTA (0 = its first)" and sl.max == 15
    sl.set_value((0, 3)).run()
    assert not at.exception
    titles = [x["text"] for x in figure(at, "timeline")["layout"]["annotations"]]
    assert "counts 0–3 (of 0–15)" in titles[0] and "counts 0–3 (of 0–15)" in titles[1]


def test_one_bundle_and_every_tab(app_env, kpair):
    app_env.setenv("FA4TRACE_BUNDLES", str(kpair[0]))
    at = run_app()
    assert at.title[0].value == "fa4trace viewer"
    assert any(m.label == "kernel time (A)" for m in at.metric)
    assert any(w.value.startswith("Synthetic bundle") for w in at.warning)
    at = run_app(view="Per iteration")  # the pipeline's waits per count: ab.acquire (producer), ab.wait (consumers)
    assert [t["name"] for t in figure(at, "iterations")["data"]] == ["ab.acquire", "ab.wait"]
    for view in ("Grid", "Bundle info"):
        run_app(view=view)
    at = run_app(view="Perfetto UI")
    doc = at.get("iframe")[0].proto.srcdoc
    b64 = doc.split('const B64 = "')[1].split('"')[0]
    assert base64.b64decode(b64) == perfetto_ui.export_pftrace(load(kpair[0]))  # with its occupancy counters


def test_mixed_or_different_kernels_are_shown_not_compared(app_env, kpair, tmp_path):
    buf, meta = attention_like("base", n_ctas=2, n_blocks=4)
    att = Trace.from_launches([decode_buffer(buf)], meta).save(tmp_path / "att.parquet")
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(kpair[0]), str(att)]))
    at = run_app()
    assert any("different kinds of bundle" in w.value for w in at.warning)
    assert len(figure(at, "timeline")["layout"]["annotations"]) == 2
    other = save(tmp_path / "other.parquet", n_ctas=2, k_tiles=8, kernel="other.kernel")
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(kpair[0]), str(other)]))
    at = run_app()
    assert any("compare needs two bundles of the same kernel: A's numbers alone" in w.value for w in at.warning)


# ---- a real bundle of a kernel that is not attention -----------------------------------------------
GEMM = Path(data.TRACES_DIR) / "auto" / "quack_gemm_sm90_skinny_64x8192x8192.parquet"
# what only an attention bundle may say: its events, its schedules, the pickers' old hints
ATTENTION_WORDS = re.compile(r"\bQK\b|\bPV\b|softmax|ping-?pong|usually base|KV block", re.IGNORECASE)
VIEWS = ("Timeline", "Per iteration", "Grid", "Perfetto UI", "Bundle info", "Sweep")


def _chart_text(spec: dict) -> list[str]:
    """What a plotly figure shows as text: titles, annotations, axis titles and ticks, legend."""
    lay = spec.get("layout", {})
    out = [(lay.get("title") or {}).get("text", "")] + [a.get("text", "") for a in lay.get("annotations", [])]
    for k, ax in lay.items():
        if re.fullmatch(r"[xy]axis\d*", k):
            out += [(ax.get("title") or {}).get("text", ""), *map(str, ax.get("ticktext") or [])]
    return out + [t.get("name", "") for t in spec.get("data", []) if t.get("showlegend", True)]


def shown_text(at: AppTest) -> list[str]:
    """The text a user reads on the page: headings, captions, messages, cards, widget labels and
    the options they show, tables, charts (not tooltips, nor a closed dropdown's other options)."""
    out = [e.value for kind in ("title", "header", "subheader", "caption", "markdown", "info", "warning",
                                "success", "error") for e in at.get(kind)]
    out += [f"{m.label} {m.value}" for m in at.metric]
    out += [f"{s.label} {s.options[s.index] if s.index is not None else ''}" for s in at.selectbox]
    out += [f"{r.label} {' '.join(r.options)}" for r in at.radio]
    out += [w.label for kind in ("slider", "button", "text_input", "number_input", "expander") for w in at.get(kind)]
    for t in at.table:
        out += [str(c) for c in t.value.columns] + [str(v) for v in t.value.to_numpy().ravel()]
    for d in at.dataframe:
        out += [str(c) for c in d.value.columns]
    for c in at.get("plotly_chart"):
        out += _chart_text(json.loads(c.proto.spec))
    return [x for x in out if x]


@pytest.mark.skipif(not GEMM.is_file(), reason="traces/auto lacks quack's GEMM bundle")
def test_a_gemm_bundle_speaks_of_its_kernel_not_of_attention(app_env):
    """quack's GEMM (traces/auto): no attention word on any tab, the pickers say A and B, the
    cards hold values (no n/a), Bundle info keeps only the per-CTA columns any kernel has, the
    grid opens on the warps' lifetimes and the Perfetto caption names no attention event."""
    app_env.setenv("FA4TRACE_BUNDLES", str(GEMM))
    for view in VIEWS:
        at = run_app(view=view)
        said = [t for t in shown_text(at) if ATTENTION_WORDS.search(t)]
        assert not said, (view, said)
        assert [s.label for s in at.sidebar.selectbox][:2] == [page.PICKER_A, page.PICKER_B]
        assert at.metric and all(m.value != "n/a" for m in at.metric)
        if view == "Bundle info":
            assert list(at.dataframe[0].value.columns) == list(data.CTA_COLUMNS)
        if view == "Grid":
            assert next(s for s in at.selectbox if s.label == "Activity").value == grid.ALIVE
        if view == "Perfetto UI":
            assert any("opened expanded" in c.value for c in at.caption)


def test_the_attention_words_check_sees_an_attention_bundle(app_env, tmp_path):
    """The check above is not blind: on an attention bundle the same text does name QK / SOFTMAX."""
    buf, meta = attention_like("pingpong", n_ctas=2, n_blocks=4)
    att = Trace.from_launches([decode_buffer(buf)], meta).save(tmp_path / "att.parquet")
    app_env.setenv("FA4TRACE_BUNDLES", str(att))
    for view in ("Timeline", "Perfetto UI", "Bundle info"):
        assert any(ATTENTION_WORDS.search(t) for t in shown_text(run_app(view=view))), view


def test_a_bundle_of_two_launches_shows_one_launch_at_a_time(app_env, tmp_path):
    """Two launches of one kernel, other shapes, 19 s apart (as instrument() keeps a step's
    launches): the viewer shows one launch, picked in the sidebar; its numbers are that launch's
    own (= fa4trace summary --launch N --json), never a span across both."""
    from fa4trace.analysis.kernel import summarize_kernel
    from fa4trace.analysis.text import fmt_value
    from fa4trace.testing.bundles import T0_NS

    parts = [pipelined_like(n_ctas=n, k_tiles=k, stages=4, load_ns=900, t0_ns=T0_NS + i * 19_000_000_000)
             for i, (n, k) in enumerate(((3, 8), (5, 32)))]
    meta, vocab = parts[0][1], parts[0][2]
    path = Trace.from_launches([decode_buffer(b, vocab=vocab, launch_index=i) for i, (b, _m, _v) in enumerate(parts)],
                               meta, vocab=vocab).save(tmp_path / "two.parquet")
    app_env.setenv("FA4TRACE_BUNDLES", str(path))
    at = run_app()
    picker = next(s for s in at.selectbox if s.label == "Launch of A")
    assert [o.split(" (")[0] for o in picker.options] == ["launch 0", "launch 1"]
    for launch in (0, 1):
        picker = next(s for s in at.selectbox if s.label == "Launch of A")
        picker.set_value(launch).run()
        assert not at.exception
        want = json.loads(json.dumps(summarize_kernel(load(path), launch=launch)))
        assert json.loads(at.json[0].proto.body) == want  # the raw numbers: this launch's summary
        assert want["kernel_time_ns"] < 1e6  # µs: the launch's own span, not the 19 s between the two
        card = next(m for m in at.metric if m.label.startswith("kernel time"))
        assert card.value == fmt_value("kernel_time_ns", want["kernel_time_ns"])
        cta = next(s for s in at.selectbox if s.label == "CTA of A")
        assert len(cta.options) == (3, 5)[launch]  # that launch's CTAs only


def test_a_bundle_with_passes_shows_each_figure_from_its_lightest_pass(app_env, tmp_path):
    """A bundle of instrument(passes=...) (one call: the dense launch, the lifetimes pass
    replayed twice, the mma pass): under its metrics, each figure from the lightest pass that
    reports it, the dense reading beside it, the same table whichever launch is picked."""
    from test_analysis_passes import _launch

    from fa4trace.analysis.passes import figure_rows, sourced_figures
    from test_app import unmd

    parts = [("dense", _launch(0, mma_ns=330, load_ns=420)),
             ("lifetimes", _launch(1, lambda n: False, mma_ns=300, load_ns=400)),
             ("lifetimes", _launch(2, lambda n: False, mma_ns=300, load_ns=400)),
             ("mma", _launch(3, lambda n: n.startswith("mma."), mma_ns=300, load_ns=400))]
    meta = dict(parts[0][1][1], launches=[{"pass": p, "call": 0} for p, _ in parts])
    path = Trace.from_launches([d for _, (d, _m, _v) in parts], meta, vocab=parts[0][1][2]).save(tmp_path / "p.parquet")
    want = [{k: str(v) for k, v in r.items()} for r in figure_rows(sourced_figures(load(path)))]
    assert any(r["pass"] == "mma" and r["dense"] for r in want) and any(r["pass"] == "lifetimes" for r in want)
    app_env.setenv("FA4TRACE_BUNDLES", str(path))
    at = run_app()
    lb = next(s for s in at.selectbox if s.label == "Launch of A")
    for launch in (0, 3):  # the dense launch, then a pass: the figures are the call's either way
        if launch:
            lb.set_value(launch).run()
            assert not at.exception
        (cap,) = [unmd(c.value) for c in at.caption if "lightest pass" in c.value]
        assert "events per recorded CTA: lifetimes 0 (2 launches), mma" in cap and cap.rstrip().endswith("read")
        (table,) = [t.value for t in at.table if list(t.value.columns) == ["figure", "value", "pass", "dense"]]
        got = [{c: unmd(str(v)) for c, v in row.items()} for row in table.to_dict("records")]
        assert got == want
