"""The viewer's page (the script Streamlit runs per browser session); `fa4trace view [BUNDLES...]`
serves it through server.py, which also serves the Perfetto UI.

Base vs ping-pong side by side (timelines, metrics, per-iteration chart, grid overview), the
real Perfetto UI, offline, a sweep dataset's figures (`fa4trace view --sweep DATASET`) whose
points open as A and B, and a merged torch.profiler trace's traced kernels (`fa4trace view --merged
FILE`: op -> kernel -> warps). The logic lives in the modules next to this file (fa4trace.viewer);
Streamlit runs this file as a script, hence the absolute imports.
"""

from __future__ import annotations

import os

import streamlit as st

from fa4trace.viewer import data, page, perfetto_ui
from fa4trace.viewer.literal import md
from fa4trace.viewer.timeline import MAX_SEGMENTS

st.set_page_config(page_title="fa4trace viewer", layout="wide")

static_error = perfetto_ui.unavailable_reason()

start = data.startup(page.arg_bundles(__file__), page.traces_dir())
side = st.sidebar
side.header("Traces")
up_sources, blobs, up_errors = page.uploads_section(side)
for e in up_errors:
    side.error(md(e))
page.auto_select_uploads(up_sources, blobs)
side.header("Sweep")
sweep_root = page.sweep_dataset(side)
side.header("Profiler")
merged_path = page.merged_input(side)
sources = start.sources + up_sources + page.sweep_sources()
if not sources:
    st.title("fa4trace viewer")
    for n in start.notes:  # Markdown, its names escaped
        st.info(n)
    for e in start.errors:
        st.info(md(e))
    if sweep_root:
        page.sweep_section(sweep_root, None, None, MAX_SEGMENTS)
    if merged_path:
        page.merged_section(merged_path, static_error)
    st.stop()

ka, kb = page.pickers(side, sources, start.default_a, start.default_b)
by_key = {s.key: s for s in sources}


def _trace(src):
    try:
        tr = data.get_trace(src, blobs)
    except data.Fa4traceError as exc:
        st.error(md(str(exc).splitlines()[0]))
        st.stop()
    if len(tr) == 0:
        st.error(f"{md(src.label.split(' — ')[0])} holds no events: choose another trace.")
        st.stop()
    return tr


picked = page.Picked(by_key[ka], by_key.get(kb), _trace(by_key[ka]), _trace(by_key[kb]) if kb else None)

side.header("View")
picked = page.pick_launches(side, picked)  # a bundle of several launches: one launch from here on
sel = {"A": page.cta_picker(side, "A", picked.a, picked.trace_a)}
if picked.trace_b is not None:
    sel["B"] = page.cta_picker(side, "B", picked.b, picked.trace_b)
counts = [data.iteration_values(data.cta_rows_cached(s.key, *sel[w], t), data.iter_events(s.key, t)).size
          for w, s, t in (("A", picked.a, picked.trace_a), ("B", picked.b, picked.trace_b)) if t is not None]
any_kernel = data.is_kernel(picked.trace_a) or data.is_kernel(picked.trace_b)
sel["window"] = page.window_picker(side, counts, f"{ka}|{kb}", unit="pipeline counts" if any_kernel else "KV blocks")
with side.expander("Display"):
    budget = int(st.number_input("Max segments sent to the browser", 2_000, 1_000_000, MAX_SEGMENTS, step=10_000,
                                 key="budget", help="Above this the timeline merges segments into time bins on the server."))
side.header("Export")
page.export_buttons(side, "A", picked.a, picked.trace_a)
if picked.trace_b is not None:
    page.export_buttons(side, "B", picked.b, picked.trace_b)

page.header(picked, start.notes, start.errors)
page.metrics_section(picked)
page.diff_section(picked)  # B against A beyond noise: fa4trace diff
tabs = st.tabs(["Timeline", "Per iteration", "Grid", "Perfetto UI", "Bundle info", "Sweep", "Profiler"], key="view",
               bind="query-params", default="Profiler" if os.environ.get(page.MERGED_ENV) else
               "Sweep" if os.environ.get(page.SWEEP_ENV) else None)
sections = (lambda: page.timeline_section(picked, sel, budget), lambda: page.iterations_section(picked),
            lambda: page.grid_section(picked), lambda: page.perfetto_section(picked, sel, static_error),
            lambda: page.info_section(picked), lambda: page.sweep_section(sweep_root, picked, sel, budget),
            lambda: page.merged_section(merged_path, static_error, budget))
for tab, draw in zip(tabs, sections):
    if tab.open:  # only the open tab renders: the others cost nothing until picked
        with tab:
            draw()
