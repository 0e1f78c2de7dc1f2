"""The viewer's words (streamlit.testing.v1.AppTest): what a user named is shown as named, a
count takes the noun it needs, a recording with nothing to chart says so instead of drawing an
empty chart, the per-iteration chart is drawn for any bundle whose events count iterations (or
says why not), and nothing is cut short where the viewer lays it out.

Synthetic bundles (fa4trace.testing.bundles, marked synthetic) with known names and shapes; one
test reads FA4's prefill bundle in traces/auto where it is there.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from fa4trace.analysis.fidelity import cta_lifetimes  # noqa: E402
from fa4trace.analysis.kernel import summarize_kernel  # noqa: E402
from fa4trace.analysis.overlap import per_iteration  # noqa: E402
from fa4trace.analysis.text import dropped_text, format_kernel_summary  # noqa: E402
from fa4trace.analysis.words import noun, plural  # noqa: E402
from fa4trace.trace.bundle import Trace, load  # noqa: E402
from fa4trace.trace.decode import decode_buffer  # noqa: E402
from fa4trace.testing.bundles import pipelined_like, sampled_like  # noqa: E402
from fa4trace.viewer import data, kernel_view, page, perfetto_ui  # noqa: E402
from fa4trace.viewer.literal import code, md, md_rows, plotly  # noqa: E402
from test_app import run_app, unmd  # noqa: E402  (the viewer's AppTest harness)
from test_app_kernel import figure, values  # noqa: E402

KERNEL = "quack.rmsnorm.RMSNorm.__call__"  # reads "RMSNorm.**call**" as Markdown
ROLE = "__load__"  # a role name (a word) that reads as bold "load"
FILE = "step__RMSNorm__.parquet"
# Markdown (and Streamlit) read these anywhere in a line; a backslash before one shows it as it is.
ACTIVE = set("\\`*_[]<$~|")
# Elements whose text Streamlit reads as Markdown (st.table cells, metric labels and radio options too).
MARKDOWN_KINDS = ("title", "header", "subheader", "caption", "markdown", "info", "warning", "success", "error")


def unescaped(src: str) -> list[str]:
    """The Markdown-active characters of ``src`` outside code spans that no backslash escapes."""
    out, i = [], 0
    while i < len(src):
        c = src[i]
        if c == "\\" and i + 1 < len(src):
            i += 2
            continue
        if c == "`":
            run = re.match(r"`+", src[i:]).group(0)
            end = src.find(run, i + len(run))
            if end > 0:  # a code span: shown as it is
                i = end + len(run)
                continue
        if c in ACTIVE:
            out.append(c)
        i += 1
    return out


def markdown_sources(at) -> list[str]:
    """Every text of the page that Streamlit reads as Markdown."""
    out = [e.value for kind in MARKDOWN_KINDS for e in at.get(kind)]
    out += [m.label for m in at.metric]
    out += [o for r in at.radio for o in r.options]
    for t in at.table:
        out += [str(v) for v in t.value.to_numpy().ravel()]
    return out


def save(path: Path, **kw) -> Path:
    buf, meta, vocab = pipelined_like(**kw)
    return Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab).save(path, overwrite=True)


def save_sampled(path: Path, **kw) -> Path:
    buf, meta, vocab = sampled_like(**kw)
    return Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab).save(path, overwrite=True)


# ---- names as named ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text", [KERNEL, ROLE, "_mma_", "a*b*c", "make_kernel.<locals>.kernel", "cost $5 and $6",
                                  "x:red[hi]", "~~gone~~", "a|b", "[link](http://x)", "# heading", "- item", "1. one",
                                  "> quote", "---", "title\n===", "a\n- b\n2) c", "back\\slash", "&amp;", "`tick`",
                                  "12.3%", "-3 ns (-1.0%)"])
def test_md_escapes_what_markdown_would_read(text):
    """md(text): Markdown shows the text as it is (its escapes undone give it back) and finds
    nothing of its own in it; numbers as the tables print them come back unchanged."""
    out = md(text)
    assert unmd(out) == text
    assert unescaped(out) == [], out
    assert not re.search(r"^ {0,3}([#>]|[-+*](\s|$)|\d+[.)](\s|$)|[-=]+[ \t]*$)", out, re.M), out  # no block opens
    if not (set(text) & (ACTIVE | set(":&#>")) or re.search(r"^[-+*#>=\d]", text, re.M)):
        assert out == text


def test_md_leaves_the_tables_numbers_as_they_print():
    """A table cell as fa4trace.analysis.text and the metrics panel print it passes unchanged."""
    for cell in ("12.3%", "-3 ns (-1.0%)", "+0.5 pts", "1,390.88 µs", "0-3,5", "n/a", "—", "▲ regressed", "1 stage",
                 "compare needs two bundles of the same kernel: A's numbers alone"):
        assert md(cell) == cell


def test_emoji_shortcodes_and_icons_go_into_code_spans():
    """Streamlit turns ":b:" into an emoji whatever escapes its colons; a code span keeps it."""
    for text in ("cutlass::b::kernel", "a :smile: b", "x:material/home:"):
        assert md(text) == code(text) and md(text).startswith("`")
    assert code("a`b") == "``a`b``" and code("`x") == "`` `x ``"
    assert md_rows([{"role": ROLE, "warps": 3}]) == [{"role": "\\_\\_load\\_\\_", "warps": 3}]
    assert plotly("make.<locals>.k & co") == "make.&lt;locals&gt;.k &amp; co"


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    """A GEMM-like bundle of a kernel, a role and a file whose names read as Markdown."""
    d = tmp_path_factory.mktemp("named")
    return save(d / FILE, n_ctas=3, k_tiles=8, stages=2, kernel=KERNEL, roles={ROLE: [4]})


@pytest.mark.parametrize("view", ["Timeline", "Per iteration", "Grid", "Perfetto UI", "Bundle info"])
def test_names_that_read_as_markdown_are_shown_as_named(app_env, named, view):
    """RMSNorm.__call__ is shown as "RMSNorm.__call__", never "RMSNorm.**call**": wherever the
    page writes a kernel, role or file name into Markdown (captions, messages, table cells,
    metric labels, radio options), the name is escaped; undoing Markdown's escapes gives it back."""
    app_env.setenv("FA4TRACE_BUNDLES", str(named))
    at = run_app(view=view)
    sources = markdown_sources(at)
    for name in (KERNEL, ROLE, FILE):
        bare = [s for s in sources if name in s]
        assert not bare, (name, bare)  # never handed to Markdown as it is
    shown = [unmd(s) for s in sources]
    assert any(KERNEL in s for s in shown) and any(FILE in s for s in shown)
    if view == "Timeline":  # the role as a lane label (plotly) and in the busy / waiting / idle table
        lanes = figure(at, "timeline")["layout"]["yaxis"]["ticktext"]
        assert any(lb.endswith(f" · {ROLE}") for lb in lanes)
        assert any(ROLE == unmd(str(v)) for t in at.table for v in t.value.to_numpy().ravel())
    if view == "Perfetto UI":
        radio = next(r for r in at.radio if r.label == "Trace")
        assert [unmd(o) for o in radio.options] == [f"A: {KERNEL}"]


# ---- counts and their nouns -------------------------------------------------------------------------
def test_plural():
    assert plural(1, "stage") == "1 stage" and plural(2, "stage") == "2 stages" and plural(0, "wait") == "0 waits"
    assert plural(1024, "row") == "1,024 rows" and plural(1, "launch", "launches") == "1 launch"
    assert plural(3, "launch", "launches") == "3 launches" and plural(12345, "CTA", spec="") == "12345 CTAs"
    assert plural(1.2, "count", spec=".0f") == "1 count" and plural(1.6, "count", spec=".0f") == "2 counts"
    assert noun(1, "warp") == "warp" and noun(7, "warp") == "warps"


def test_one_of_a_kind_reads_one(app_env, tmp_path):
    """A pipeline of 1 stage, one CTA of one warp's records, one wait: "1 stage", never "1 stages",
    in the viewer (occupancy legend, facts) and in `fa4trace summary`'s text."""
    one = save(tmp_path / "one.parquet", n_ctas=1, k_tiles=6, stages=1)
    app_env.setenv("FA4TRACE_BUNDLES", str(one))
    at = run_app()
    assert [t["name"] for t in figure(at, "occupancy")["data"]] == ["A: ab (1 stage)"]
    facts = next(m.value for m in at.markdown if "kernel " in m.value)
    assert unmd(facts).startswith("- 1 CTA · 8 warps · ")
    text = format_kernel_summary(summarize_kernel(load(one)))
    assert "pipeline ab:        1 stage," in text and "1 stages" not in text
    assert re.search(r"\b1 (CTAs|warps|waits|groups|records|counts|stages|launches|rows)\b", text) is None, text
    assert dropped_text({"dropped": 1, "overflowed_warps": 1}) == "1 record (1 warp overflowed)"
    assert dropped_text({"dropped": 1, "overwritten": 1, "overwritten_warps": 1, "ring": 4}) == \
        "ring of 4 records per warp: the oldest 1 record of 1 warp was overwritten"


def test_no_page_text_says_a_count_the_wrong_way(app_env, tmp_path):
    """No "(s)" plural and no "1 <plural>" on any tab of a bundle of one CTA and a one-stage pipeline."""
    one = save(tmp_path / "one.parquet", n_ctas=1, k_tiles=6, stages=1)
    app_env.setenv("FA4TRACE_BUNDLES", str(one))
    from test_app_kernel import shown_text

    for view in ("Timeline", "Per iteration", "Grid", "Perfetto UI", "Bundle info"):
        at = run_app(view=view)
        for t in shown_text(at):
            t = unmd(t)
            assert "(s)" not in t and not re.search(r"(?<![\d.,])1 (CTAs|warps|waits|stages|rows|counts|launches)\b",
                                                    t), (view, t)


# ---- a recording of lifetimes only --------------------------------------------------------------------
@pytest.fixture(scope="module")
def lifetimes(tmp_path_factory):
    """No event family: each recorded warp holds its lifetime, every CTA its timed lifetime
    (16 CTAs, 4 of them recorded), as ``instrument(families=[])`` records."""
    d = tmp_path_factory.mktemp("lifetimes")
    return save_sampled(d / "lifetimes.parquet", n_ctas=16, sms=4, n_recorded=4, events=False)


def test_a_recording_of_lifetimes_only_says_so_and_draws_no_empty_chart(app_env, lifetimes):
    app_env.setenv("FA4TRACE_BUNDLES", str(lifetimes))
    tr = load(lifetimes)
    assert set(tr.events["name"].cast(pa.string()).unique().to_pylist()) == {"WARP"}
    at = run_app()
    infos = [unmd(i.value) for i in at.info]
    assert any(i.startswith("A: this recording has warp and CTA lifetimes only") and "no events to chart" in i
               and "perturbation line and CTA durations are below" in i for i in infos), infos
    assert not [c for c in at.get("plotly_chart") if c.proto.id.endswith("timeline")]  # no empty timeline
    assert not [t for t in at.table if "idle" in t.value.columns]  # no "idle 100%" per role
    assert any("no busy / waiting / idle per role" in c.value for c in at.caption)
    # its perturbation line and its CTAs' durations: fa4trace.analysis.fidelity's
    assert any(unmd(c.value).startswith("A perturbation: ") for c in at.caption)
    life = cta_lifetimes(tr)
    shown = at.dataframe[0].value
    assert shown["CTA"].tolist() == life["cta"].to_pylist()
    assert np.allclose(shown["duration µs"].to_numpy(), life["dur_ns"].to_numpy() / 1e3, atol=1e-3)
    assert shown["recorded"].tolist() == life["recorded"].to_pylist()
    at = run_app(view="Per iteration")
    assert any("lifetimes only: no events, nothing per iteration" in unmd(i.value) for i in at.info)
    assert not at.get("plotly_chart")


def test_lifetimes_beside_a_bundle_with_events(app_env, lifetimes, tmp_path):
    """A of lifetimes only, B with pipeline counts (a window picker shows): B's CTA is drawn, A
    gets its statement; no panel titled with "0 count(s)"."""
    b = save(tmp_path / "gemm.parquet", n_ctas=2, k_tiles=8, stages=2)
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(lifetimes), str(b)]))
    at = run_app()
    titles = [a["text"] for a in figure(at, "timeline")["layout"]["annotations"]]
    assert len(titles) == 1 and titles[0].startswith("B: ")
    assert any(unmd(i.value).startswith("A: this recording has warp and CTA lifetimes only") for i in at.info)
    assert not any("count(s)" in t for t in titles)


# ---- the per-iteration chart --------------------------------------------------------------------------
def test_per_iteration_chart_of_a_kernel_is_its_waits_per_count(app_env, tmp_path):
    """A GEMM-like kernel: the median acquire (producer) and wait (consumers) per pipeline count,
    side by side: fa4trace.analysis.overlap.per_iteration of those spans."""
    k = save(tmp_path / "gemm.parquet", n_ctas=3, k_tiles=8, stages=2, load_ns=np.arange(8) * 50 + 400)
    app_env.setenv("FA4TRACE_BUNDLES", str(k))
    at = run_app(view="Per iteration")
    fig = figure(at, "iterations")
    assert fig["layout"]["barmode"] == "group"
    want = per_iteration(load(k), events=("ab.acquire", "ab.wait")).to_pandas()
    for trace in fig["data"]:
        w = want[want["name"] == trace["name"]].sort_values("iter")
        assert np.array_equal(values(trace["x"]), w["iter"].to_numpy(np.float64))
        assert np.allclose(values(trace["y"]), w["median_ns"].to_numpy())
    assert [t["name"] for t in fig["data"]] == ["ab.acquire", "ab.wait"]
    assert "count" in fig["layout"]["xaxis"]["title"]["text"]
    assert not [i for i in at.info if "attention bundles" in i.value]


FA4_PREFILL = Path(data.TRACES_DIR) / "auto" / "fa4_sm90_prefill_full.parquet"


@pytest.mark.skipif(not FA4_PREFILL.is_file(), reason="traces/auto lacks FA4's prefill bundle")
def test_fa4_prefill_gets_its_per_iteration_chart(app_env):
    """FA4 prefill (traces/auto): its K and V pipelines' waits per count, 64 counts each; the q
    pipeline (one count) is not drawn."""
    app_env.setenv("FA4TRACE_BUNDLES", str(FA4_PREFILL))
    at = run_app(view="Per iteration")
    fig = figure(at, "iterations")
    assert [t["name"] for t in fig["data"]] == ["k.acquire", "k.wait", "v.acquire", "v.wait"]
    assert all(values(t["x"]).size == 64 for t in fig["data"])
    assert not at.info


def test_a_kernel_without_iterations_says_why(app_env, tmp_path):
    """A kernel whose events carry no iteration (barrier ids only): one line that says so, no chart."""
    k = save_sampled(tmp_path / "barriers.parquet", n_ctas=8, sms=4, n_recorded=4, events=True)
    app_env.setenv("FA4TRACE_BUNDLES", str(k))
    at = run_app(view="Per iteration")
    assert not at.get("plotly_chart")
    [line] = [unmd(i.value) for i in at.info]
    assert line.startswith("A: no per-iteration chart for synthetic.sampled: it recorded no pipeline event")
    assert "attention" not in line


# ---- nothing cut short --------------------------------------------------------------------------------
def test_sidebar_shows_each_picked_trace_in_full(app_env, named, tmp_path):
    """The sidebar's pickers cut a long label short: under each, its choice in full (wrapped)."""
    other = save(tmp_path / ("a_rather_long_bundle_name_that_a_sidebar_box_cannot_hold_" * 2 + ".parquet"),
                 n_ctas=2, k_tiles=4, kernel="some.module.with.a.Long.KernelName.__call__")
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(named), str(other)]))
    at = run_app()
    labels = {s.label: s.options[s.index] for s in at.sidebar.selectbox if s.label in (page.PICKER_A, page.PICKER_B)}
    captions = [unmd(c.value) for c in at.sidebar.caption]
    assert labels[page.PICKER_A] in captions and labels[page.PICKER_B] in captions
    assert "__call__ · " in labels[page.PICKER_B]


def test_wait_chains_are_drawn_at_full_width(app_env, named, tmp_path):
    """Each shown CTA's wait chain at the page's width, one under the other (two half-width tables
    cut their right-hand columns off), every column at least as wide as kernel_view.CHAIN_WIDTHS."""
    b = save(tmp_path / "b.parquet", n_ctas=3, k_tiles=8, stages=4)
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(named), str(b)]))
    at = run_app()
    chains = [d for d in at.dataframe if "released by" in d.value.columns]
    assert len(chains) == 2
    assert not [c for c in at.columns if c.dataframe]  # no chain inside a column
    for d in chains:
        widths = {k: v.get("width") for k, v in json.loads(d.proto.columns).items() if k in d.value.columns}
        assert widths == kernel_view.CHAIN_WIDTHS
    assert sum(kernel_view.CHAIN_WIDTHS.values()) <= 1000  # the page's width on a 1280-px window, sidebar closed


def test_embedded_perfetto_status_line_keeps_the_whole_title():
    """The line above the embedded Perfetto UI is one line, cut with an ellipsis: its tooltip
    holds it whole (set with the text each time it changes)."""
    html = perfetto_ui.embed_html(b"\x00", "A: " + KERNEL * 4)
    assert "text-overflow:ellipsis" in html
    assert "status.textContent = text; status.title = text;" in html
    assert "status.textContent =" not in html.replace("status.textContent = text;", "")
