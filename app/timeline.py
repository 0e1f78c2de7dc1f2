"""Per-warp timelines of one CTA per trace, two traces on one synchronized time axis.

Lanes come from :func:`fa4trace.export.tracks.layout_tracks`, the layout the Perfetto and Chrome
exports use: per warp its own lane ("w1 · consumer": SOFTMAX, CORRECTION, ...) and, right
under it, one lane per async event ("QK in flight", "PV in flight"), so a green SOFTMAX bar
over an orange QK bar *is* the overlap. Spans that would cross on one lane get extra lanes.

Drawing: one plotly ``Scattergl(mode="lines")`` trace per event name per panel (SVG ``Scatter``
below ``SVG_LIMIT`` segments, where it draws faster than a WebGL context starts), each segment
``[start, (mid,) end, NaN]`` in float32 ns; the panels sit in one
``make_subplots(shared_xaxes=True)`` figure, so zoom and pan act on both, and ``uirevision``
keeps the zoom across reruns until the selection changes. Above ``budget`` segments the
server merges segments per (lane, event) into time bins (:func:`decimate`), so the browser
never receives more than ``budget`` segments whatever the trace size.

Bundles of automatically traced kernels: ``build_panel(group_by_role=True)`` orders the lanes
by role (producer, mma, consumer, epilogue, ..., idle), and wait spans (pipeline acquire/wait,
mma.wait, barrier.sync, tma.store_wait: fa4trace.analysis.autoevents) are drawn hollow: a faint wide bar
with a thin line of the same colour through it, so waiting reads apart from work at a glance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fa4trace.analysis.autoevents import is_wait_op
from fa4trace.analysis.roles import role_rank
from fa4trace.export.tracks import layout_tracks
from fa4trace.format.vocab import VOCAB, Vocabulary

from .literal import plotly

MAX_SEGMENTS = 200_000  # per figure, all panels together
HOVER_LIMIT = 20_000
SVG_LIMIT = 5_000  # segments: above this the timeline draws with WebGL (Scattergl)  # per panel: above this, segments carry no hover text (payload size)
LANE_PX = 26
EVENT_PX = 16
WARP_PX = 5
WAIT_OPACITY = 0.3  # the wide bar of a wait span; a WAIT_PX line of full colour runs through it
WAIT_PX = 3
TOOLBAR_PX = 36  # right margin that holds the upright plotly toolbar


# ---- decimation ------------------------------------------------------------------------------
def decimate(group: np.ndarray, start: np.ndarray, end: np.ndarray, n_groups: int, budget: int,
             t0: float | None = None, t1: float | None = None):
    """At most ``budget`` segments: above it, segments of each group become runs of time bins.

    The range [t0, t1] is cut into ``budget // n_groups`` bins; a bin is on for a group when any
    of its segments touches it; each run of on-bins is one output segment. A group gets at
    most half its bins as runs, so the output never exceeds ``budget``. Below the budget the
    input comes back unchanged. Returns (group, start, end, decimated: bool).
    """
    group = np.asarray(group, np.int64)
    start = np.asarray(start, np.float64)
    end = np.asarray(end, np.float64)
    n = group.size
    if n <= budget or n == 0:
        return group, start, end, False
    t0 = float(start.min()) if t0 is None else float(t0)
    t1 = float(end.max()) if t1 is None else float(t1)
    n_groups = max(int(n_groups), 1)
    n_bins = max(1, budget // n_groups)
    width = max((t1 - t0) / n_bins, 1e-9)
    b0 = np.clip(np.floor((start - t0) / width), 0, n_bins - 1).astype(np.int64)
    b1 = np.clip(np.ceil((end - t0) / width) - 1, 0, n_bins - 1).astype(np.int64)
    b1 = np.maximum(b1, b0)
    stride = n_bins + 1
    diff = (np.bincount(group * stride + b0, minlength=n_groups * stride)
            - np.bincount(group * stride + b1 + 1, minlength=n_groups * stride))
    on = (np.cumsum(diff).reshape(n_groups, stride)[:, :n_bins] > 0).astype(np.int8)
    edges = np.diff(np.pad(on, ((0, 0), (1, 1))), axis=1)
    gs, bs = np.nonzero(edges == 1)
    _, be = np.nonzero(edges == -1)  # row-major order pairs each run start with its end
    return gs.astype(np.int64), t0 + bs * width, t0 + be * width, True


# ---- one panel -------------------------------------------------------------------------------
@dataclass
class Panel:
    title: str
    lanes: list[str]
    lane_is_async: list[bool]
    names: list[str]  # event name per name code
    seg_lane: np.ndarray
    seg_start: np.ndarray  # ns relative to the panel origin
    seg_end: np.ndarray
    seg_name: np.ndarray
    seg_text: list[str] | None
    inst_lane: np.ndarray
    inst_t: np.ndarray
    inst_name: np.ndarray
    inst_text: list[str] | None
    rows: int
    decimated_from: int = 0  # segments before decimation (0 = not decimated)
    origin_ns: int = 0
    span_ns: float = 0.0
    meta: dict = field(default_factory=dict)

    @property
    def n_segments(self) -> int:
        return int(self.seg_lane.size)


def window_bounds(rows: pa.Table, i0: int, i1: int, events=None) -> tuple[int, int] | None:
    """[first start, last end] of the per-iteration events of blocks i0..i1 in ``rows`` (one CTA).

    ``events``: the event names that define a block's extent (default: overlap.ITER_EVENTS;
    every event if the rows have none of them)."""
    from fa4trace.analysis.overlap import ITER_EVENTS

    it = rows["iter"]
    m = pc.and_(pc.greater_equal(it, i0), pc.less_equal(it, i1))
    names = rows["name"].cast(pa.string())
    ev = pc.is_in(names, pa.array(list(events or ITER_EVENTS)))
    sel = rows.filter(pc.and_(m, ev))
    if sel.num_rows == 0:
        sel = rows.filter(m)
    if sel.num_rows == 0:
        return None
    return int(pc.min(sel["start_ns"]).as_py()), int(pc.max(sel["end_ns"]).as_py())


def _lane_label(lay, t: int) -> tuple[str, bool]:
    w, c, lane = int(lay.track_warp[t]), int(lay.track_class[t]), int(lay.track_lane[t])
    base = f"w{int(lay.warp_index[w])} · {lay.warp_role[w]}"
    if c == 0:
        return (base if lane == 0 else f"{base} · lane {lane + 1}"), False
    name = f"↳ {lay.async_names[c - 1]} in flight"
    return (name if lane == 0 else f"{name} ({lane + 1})"), True


def build_panel(rows: pa.Table, title: str, *, window: tuple[int, int] | None = None,
                vocab: Vocabulary | None = None, budget: int = MAX_SEGMENTS, group_by_role: bool = False) -> Panel:
    """Lanes and segments for the rows of one CTA, clipped to ``window`` (absolute ns).
    ``group_by_role``: lanes ordered by the warps' roles (roles.ROLE_ORDER), then warp index."""
    vocab = vocab or VOCAB
    if window is not None:
        lo, hi = window
        keep = pc.and_(pc.less_equal(rows["start_ns"], hi), pc.greater_equal(rows["end_ns"], lo))
        rows = rows.filter(keep)
    n = rows.num_rows
    if n == 0:
        return Panel(title, [], [], [], *(np.zeros(0),) * 4, None, *(np.zeros(0),) * 3, None, 0)
    lay = layout_tracks(rows, vocab)
    name_col = rows["name"].combine_chunks()
    if not pa.types.is_dictionary(name_col.type):
        name_col = name_col.dictionary_encode()
    names = [str(x) for x in name_col.dictionary.to_pylist()]
    code = name_col.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    kind = np.asarray(rows["kind"].cast(pa.string()).to_numpy(zero_copy_only=False))
    start = rows["start_ns"].to_numpy().astype(np.int64)
    end = np.maximum(rows["end_ns"].to_numpy().astype(np.int64), start)
    lo, hi = window if window is not None else (int(start.min()), int(end.max()))
    xs = (np.clip(start, lo, hi) - lo).astype(np.float64)
    xe = (np.clip(end, lo, hi) - lo).astype(np.float64)
    lane = lay.row_track.astype(np.int64)
    labels = [_lane_label(lay, t) for t in range(lay.n_tracks)]
    if group_by_role and lay.n_tracks:
        # tracks come in (warp, class, lane) order: a stable sort by role keeps each warp's tracks together
        by = sorted(range(lay.n_tracks), key=lambda t: role_rank(lay.warp_role[int(lay.track_warp[t])]))
        pos = np.empty(lay.n_tracks, np.int64)
        pos[np.asarray(by)] = np.arange(lay.n_tracks)
        lane = pos[lane]
        labels = [labels[t] for t in by]
    is_inst = kind == "instant"
    seg = ~is_inst

    seg_lane, seg_name = lane[seg], code[seg]
    seg_s, seg_e = xs[seg], xe[seg]
    decimated_from = 0
    wait_codes = [i for i, nm in enumerate(names) if _is_wait(vocab, nm)]
    n_wait = int(np.isin(seg_name, wait_codes).sum()) if wait_codes else 0  # drawn twice (hollow bars)
    if seg_lane.size + n_wait > budget:
        # decimate per (lane, event) so each event keeps its own color
        n_names = max(len(names), 1)
        g = seg_lane * n_names + seg_name
        ug, inv = np.unique(g, return_inverse=True)
        dg, ds, de, _ = decimate(inv.reshape(-1), seg_s, seg_e, ug.size, budget // 2 if n_wait else budget,
                                 0.0, float(hi - lo))
        decimated_from = int(seg_lane.size)
        seg_lane, seg_name, seg_s, seg_e = ug[dg] // n_names, ug[dg] % n_names, ds, de
    seg_text = None
    if decimated_from == 0 and seg_lane.size <= HOVER_LIMIT:
        seg_text = _hover(rows, seg, names, code, start, end, lay)
    inst_text = _hover(rows, is_inst, names, code, start, end, lay) if is_inst.sum() <= HOVER_LIMIT else None
    return Panel(title, [lb for lb, _ in labels], [a for _, a in labels], names,
                 seg_lane, seg_s, seg_e, seg_name, seg_text,
                 lane[is_inst], xs[is_inst], code[is_inst], inst_text,
                 rows=n, decimated_from=decimated_from, origin_ns=int(lo), span_ns=float(hi - lo))


def _is_wait(vocab: Vocabulary, name: str) -> bool:
    try:
        e = vocab.event(name)
    except KeyError:
        return False
    return bool(e.family) and is_wait_op(e.op)


def _hover(rows: pa.Table, mask: np.ndarray, names, code, start, end, lay) -> list[str]:
    idx = np.flatnonzero(mask)
    it = rows["iter"].to_numpy()[idx]
    warp = rows["warp"].to_numpy()[idx]
    roles = [plotly(r) for r in lay.warp_role]
    role = [roles[w] for w in lay.row_warp[idx]]
    names = [plotly(n) for n in names]
    dur = (end - start)[idx]
    return [f"<b>{names[c]}</b>{f' · iter {i}' if i >= 0 else ''} · {d:,} ns<br>warp {w} · {r}"
            for c, i, d, w, r in zip(code[idx].tolist(), it.tolist(), dur.tolist(), warp.tolist(), role)]


# ---- the figure ------------------------------------------------------------------------------
def _y(p: Panel, lane: np.ndarray) -> np.ndarray:
    """Lane 0 at the top. Flipped in the data, not by a reversed axis: the plotly.js that
    Streamlit 1.67 bundles (4.2.0) draws every Scattergl line at the axis end when the y
    range is reversed (checked in headless Chromium; SVG traces and plotly.js 4.1.1 are fine)."""
    return (len(p.lanes) - 1 - lane).astype(np.float32)


def _interleave(a: np.ndarray, b: np.ndarray, mid: bool) -> np.ndarray:
    """[a0, (m0,) b0, NaN, a1, ...] as float32 (NaN breaks the line between segments)."""
    k = 4 if mid else 3
    out = np.full(a.size * k, np.nan, np.float32)
    out[0::k] = a
    if mid:
        out[1::k] = (a + b) / 2
        out[2::k] = b
    else:
        out[1::k] = b
    return out


def comparison_figure(panels: list[Panel], *, uirevision: str, vocab: Vocabulary | list[Vocabulary] | None = None,
                      x_title: str = "ns since the window began (each trace)", webgl: bool | None = None):
    """One subplot per panel, shared x. ``vocab``: the bundles' own vocabularies (colors of their
    own events, async events, legend order); the first one wins where two bundles define a name."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    vocabs = [v for v in (vocab if isinstance(vocab, list) else [vocab]) if v is not None] or [VOCAB]
    if webgl is None:  # SVG draws a few thousand bars faster than a WebGL context starts
        webgl = sum(p.n_segments + p.inst_t.size for p in panels) > SVG_LIMIT
    Scatter = go.Scattergl if webgl else go.Scatter
    colors, async_names, order = {}, set(), ["WARP"]
    for v in reversed(vocabs):
        colors.update(v.colors())
        async_names |= v.async_names()
    # colors are presentation: events of the shared vocabulary get today's (a bundle stores those
    # of the day it was decoded); kernel-registered events keep the bundle's
    colors.update({n: c for n, c in VOCAB.colors().items() if n in colors})
    for v in vocabs:
        order += [e.name for e in v.events if e.name not in order]
    wait_names = {e.name for v in vocabs for e in v.events if e.family and is_wait_op(e.op)}
    n_lanes = [max(len(p.lanes), 1) for p in panels]
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.08 if len(panels) > 1 else 0.02,
                        row_heights=[k / sum(n_lanes) for k in n_lanes],
                        subplot_titles=[plotly(p.title) for p in panels])
    shown: set[str] = set()
    for r, p in enumerate(panels, start=1):
        present = sorted(set(p.seg_name.tolist()) | set(p.inst_name.tolist()),
                         key=lambda c: (order.index(p.names[c]) if p.names[c] in order else 999, p.names[c]))
        for c in present:
            name = p.names[c]
            color = colors.get(name, "#969696")
            m = p.seg_name == c
            if m.any():
                mid = p.seg_text is not None
                x = _interleave(p.seg_start[m], p.seg_end[m], mid)
                yl = _y(p, p.seg_lane[m])
                y = _interleave(yl, yl, mid)
                kw = {}
                if mid:
                    t = [p.seg_text[i] for i in np.flatnonzero(m)]
                    kw = {"text": [s for tt in t for s in (tt, tt, tt, None)],
                          "hovertemplate": "%{text}<br>t = %{x:,.0f} ns<extra></extra>"}
                else:
                    kw = {"hoverinfo": "skip"}
                wait = name in wait_names
                fig.add_trace(Scatter(
                    x=x, y=y, mode="lines", name=plotly("warp lifetime" if name == "WARP" else f"{name} (wait)" if wait else
                                                         f"{name} (in flight)" if name in async_names else name),
                    legendgroup=name, showlegend=name not in shown, connectgaps=False,
                    opacity=WAIT_OPACITY if wait else None,
                    line={"color": color, "width": WARP_PX if name == "WARP" else EVENT_PX}, **kw), row=r, col=1)
                if wait:  # the thin line through the faint bar: a hollow bar
                    fig.add_trace(Scatter(x=x, y=y, mode="lines", name=plotly(f"{name} (wait)"), legendgroup=name,
                                          showlegend=False, connectgaps=False, hoverinfo="skip",
                                          line={"color": color, "width": WAIT_PX}), row=r, col=1)
                shown.add(name)
            mi = p.inst_name == c
            if mi.any():
                kw = ({"text": [p.inst_text[i] for i in np.flatnonzero(mi)],
                       "hovertemplate": "%{text}<br>t = %{x:,.0f} ns<extra></extra>"}
                      if p.inst_text is not None else {"hoverinfo": "skip"})
                fig.add_trace(Scatter(
                    x=p.inst_t[mi].astype(np.float32), y=_y(p, p.inst_lane[mi]), mode="markers",
                    name=plotly(f"{name} (instant)"), legendgroup=name, showlegend=name not in shown,
                    marker={"color": color, "symbol": "diamond", "size": 10, "line": {"width": 1, "color": "#333"}},
                    **kw), row=r, col=1)
                shown.add(name)
        n = len(p.lanes)
        fig.update_yaxes(tickmode="array", tickvals=[n - 1 - i for i in range(n)], ticktext=[plotly(x) for x in p.lanes],
                         range=[-0.5, n - 0.5], fixedrange=True, showgrid=False, zeroline=False, automargin=True,
                         row=r, col=1)
    fig.update_xaxes(showgrid=True, gridcolor="#eee", zeroline=False)
    fig.update_xaxes(title_text=x_title, row=len(panels), col=1)
    # The legend runs above the plot over the plot's width; the plotly toolbar stands upright in
    # the right margin (TOOLBAR_PX), so it never covers a legend entry.
    fig.update_layout(height=int(sum(n_lanes) * LANE_PX + 110 * len(panels) + 40), uirevision=uirevision,
                      margin={"l": 10, "r": TOOLBAR_PX, "t": 40, "b": 40}, hovermode="closest", dragmode="zoom",
                      modebar={"orientation": "v"},
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.0 + 40 / max(sum(n_lanes) * LANE_PX, 200),
                              "xanchor": "left", "x": 0},
                      plot_bgcolor="white")
    return fig


def figure_segments(fig) -> int:
    """Segments a figure carries (NaN-separated runs of its line traces + markers)."""
    total = 0
    for tr in fig.data:
        x = np.asarray(tr.x, dtype=np.float64) if tr.x is not None else np.zeros(0)
        if tr.mode == "lines":
            total += int(np.isnan(x).sum())
        else:
            total += int(x.size)
    return total
