"""The viewer's Profiler tab on a merged torch.profiler + fa4trace trace (AppTest, headless):
the traced kernels' table with fa4trace's numbers, one launch's op -> kernel -> warps, and the
whole merged file handed to the Perfetto UI."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.testing.v1 import AppTest  # noqa: E402

from fa4trace.profiler import merge, read_report  # noqa: E402
from fa4trace.testing.profiler import profiled_run  # noqa: E402
from fa4trace.viewer import merged, perfetto_ui  # noqa: E402
from test_profiler import attention_bundle, auto_bundle  # noqa: E402

MAIN = str(Path(perfetto_ui.__file__).with_name("main.py"))


@pytest.fixture(scope="module")
def merged_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("merged")
    run = profiled_run([auto_bundle(2), attention_bundle()], steps=2, layers=2)
    prof = run.write(d / "prof.json")
    paths = [run.traces[0].save(d / "fa4.parquet"), run.traces[1].save(d / "att.parquet")]
    out = d / "one.pftrace"
    merge(prof, paths, out)
    return out


def run_app(**session) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120)
    for k, v in session.items():
        at.session_state[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_kernel_rows_carry_the_numbers(merged_file):
    rep = read_report(merged_file)
    rows = merged.kernel_rows(rep)
    assert [r["launch"] for r in rows] == ["0.0", "1.0", "0.1"]  # time order
    auto = rows[0]
    e = merged.entry_of(rep, "0.0")
    assert auto["busy"] == merged.pct(e["numbers"]["busy"]) and auto["op"] == e["ops"][-1]
    assert "QK ∥ SOFTMAX" in rows[1]["overlap"] and rows[1]["busy"] == "-"
    assert merged.op_path(e)[:2] == e["ops"][:2] and merged.op_path(e)[-1].endswith("warps")
    assert {r["role"] for r in merged.role_rows(e)} >= {"producer", "mma"}
    assert merged.bundle_path(rep, e).name == "fa4.parquet"


def test_profiler_tab_shows_table_drilldown_and_perfetto(app_env, merged_file):
    app_env.setenv("FA4TRACE_MERGED", str(merged_file))
    at = run_app()  # no bundles: the merged trace alone
    table = next(f for f in at.dataframe if "launch" in f.value.columns)
    assert list(table.value["launch"]) == ["0.0", "1.0", "0.1"]
    md = " ".join(m.value for m in at.markdown)
    assert "ProfilerStep#0" in md and "→" in md and "warps" in md
    charts = [c for c in at.get("plotly_chart") if "merged_timeline" in (c.proto.id or "")]
    assert charts and "launch 0 · CTA 0" in json.loads(charts[0].proto.spec)["layout"]["annotations"][0]["text"]
    doc = at.get("iframe")[0].proto.srcdoc
    b64 = doc.split('const B64 = "')[1].split('"')[0]
    assert base64.b64decode(b64) == merged_file.read_bytes()
    # another CTA of the launch
    sb = next(s for s in at.selectbox if s.label == "CTA")
    sb.set_value(2).run()
    assert not at.exception
    charts = [c for c in at.get("plotly_chart") if "merged_timeline" in (c.proto.id or "")]
    assert "CTA 2" in json.loads(charts[0].proto.spec)["layout"]["annotations"][0]["text"]


def test_profiler_tab_next_to_bundles(app_env, merged_file):
    app_env.setenv("FA4TRACE_BUNDLES", str(merged_file.with_name("fa4.parquet")))
    at = run_app(view="Profiler", merged_path=str(merged_file))
    assert any("Traced kernels" in h.value for h in at.subheader)


def test_profiler_tab_says_what_is_wrong(app_env, tmp_path):
    bad = tmp_path / "x.pftrace"
    bad.write_bytes(b"not a trace")
    at = run_app(merged_path=str(bad))
    assert any("not a Perfetto protobuf trace" in e.value for e in at.error)
