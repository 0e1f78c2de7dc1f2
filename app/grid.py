"""Grid overview: every CTA (or SM) over the whole kernel, to spot stragglers and split imbalance.

One heatmap row per CTA or SM, one column per time bin; a cell is the fraction of the bin in
which the chosen activity (tensor cores = QK ∪ PV in flight, one event, or any warp alive) ran
on that row, unioned over its warps. Cells are computed on the server from the interval
unions (:func:`union_intervals`, :func:`bin_coverage`, vectorized) so the browser gets at most
``max_cells`` numbers for any trace size. Beside it, each row's span (first warp start to
last warp end) as a bar: long bars are stragglers, uneven ends are split imbalance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from fa4trace.analysis.words import plural
from fa4trace.format.vocab import VOCAB

from .literal import plotly

MAX_CELLS = 200_000
MAX_BINS = 1200
TENSOR_CORES = "tensor cores (QK ∪ PV in flight)"
ALIVE = "any warp alive"
_BITS = 42  # ns offsets below 2**42 (~73 min) pack beside a group id in one int64


def union_intervals(group: np.ndarray, start: np.ndarray, end: np.ndarray):
    """Per group, the union of [start, end) as sorted disjoint intervals: (group, start, end)."""
    group = np.asarray(group, np.int64)
    start = np.asarray(start, np.int64)
    end = np.maximum(np.asarray(end, np.int64), start)
    if group.size == 0:
        return group, start, end
    base = int(start.min())
    o = np.lexsort((start, group))
    g, s, e = group[o], start[o] - base, end[o] - base
    ks, ke = (g << _BITS) | s, (g << _BITS) | e
    run_max = np.maximum.accumulate(ke)
    new = np.r_[True, ks[1:] > run_max[:-1]]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, g.size - 1]
    return g[first], s[first] + base, (run_max[last] & ((1 << _BITS) - 1)) + base


def bin_coverage(group: np.ndarray, start: np.ndarray, end: np.ndarray, n_groups: int,
                 t0: float, t1: float, n_bins: int) -> np.ndarray:
    """Fraction of each of ``n_bins`` equal bins of [t0, t1] covered, per group.

    ``group/start/end`` must be sorted disjoint intervals per group (:func:`union_intervals`).
    Uses the cumulative covered length at every bin edge: one searchsorted for all edges.
    """
    out = np.zeros((n_groups, n_bins), np.float64)
    if group.size == 0 or n_bins <= 0 or t1 <= t0:
        return out
    g = np.asarray(group, np.int64)
    s = np.asarray(start, np.float64)
    e = np.asarray(end, np.float64)
    length = e - s
    cum_before = np.cumsum(length) - length
    lane_base = np.zeros(n_groups, np.float64)
    firsts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    lane_base[g[firsts]] = cum_before[firsts]
    width = (t1 - t0) / n_bins
    edges = t0 + width * np.arange(n_bins + 1)
    # order key: (group, time) as float pairs -> search per group via an offset that exceeds any time
    span = max(float(e.max()), t1) - min(float(s.min()), t0) + 1.0
    off = -min(float(s.min()), t0)
    key_s = g * span + (s + off)
    qg = np.repeat(np.arange(n_groups), n_bins + 1)
    qt = np.tile(edges, n_groups)
    idx = np.searchsorted(key_s, qg * span + (qt + off), side="right") - 1
    valid = (idx >= 0) & (g[np.maximum(idx, 0)] == qg)
    ii = np.maximum(idx, 0)
    cov = np.where(valid, cum_before[ii] - lane_base[qg] + np.clip(qt - s[ii], 0, length[ii]), 0.0)
    cov = cov.reshape(n_groups, n_bins + 1)
    return np.clip(np.diff(cov, axis=1) / width, 0.0, 1.0)


def activity_options(names: list[str]) -> list[str]:
    opts = []
    if "QK" in names or "PV" in names:
        opts.append(TENSOR_CORES)
    opts += [n for n in [e.name for e in VOCAB.events] if n in names and n != "WARP"]
    opts += sorted(n for n in names if n not in opts and n != "WARP" and n not in VOCAB.colors())
    opts.append(ALIVE)
    return opts


def default_activity(options: list[str]) -> str:
    """The tensor cores where QK / PV say when they run (attention), else every warp's lifetime:
    the CTAs' extents, which show stragglers in any kernel (the waits and instants of an
    automatically traced kernel cover little of a bin)."""
    return TENSOR_CORES if TENSOR_CORES in options else ALIVE


def _activity_names(activity: str) -> list[str]:
    if activity == TENSOR_CORES:
        return ["QK", "PV"]
    if activity == ALIVE:
        return ["WARP"]
    return [activity]


@dataclass
class Grid:
    z: np.ndarray  # lanes x bins, fraction in [0, 1]
    t0_us: float
    bin_us: float
    lane_label: list[str]
    lane_span_us: np.ndarray
    lane_hover: list[str]
    by: str
    activity: str
    stragglers: list[str]


def build_grid(trace, ctas: pa.Table, *, by: str = "CTA", activity: str = TENSOR_CORES,
               max_cells: int = MAX_CELLS) -> Grid:
    ev = trace.events
    launch = ev["launch"].to_numpy().astype(np.int64)
    cta = ev["cta"].to_numpy().astype(np.int64)
    sm = ev["sm"].to_numpy().astype(np.int64)
    name = ev["name"].combine_chunks()
    codes = name.indices.to_numpy(zero_copy_only=False).astype(np.int64) if ev.num_rows else np.zeros(0, np.int64)
    dict_names = [str(x) for x in name.dictionary.to_pylist()] if ev.num_rows else []
    start = ev["start_ns"].to_numpy().astype(np.int64)
    end = ev["end_ns"].to_numpy().astype(np.int64)
    multi = ev.num_rows and int(launch.max()) != int(launch.min())

    c_launch = np.asarray(ctas["launch"]).astype(np.int64)
    c_cta = np.asarray(ctas["cta"]).astype(np.int64)
    c_sm = np.asarray(ctas["sm"]).astype(np.int64)
    c_start = np.asarray(ctas["start_ns"]).astype(np.int64)
    c_end = np.asarray(ctas["end_ns"]).astype(np.int64)
    c_blocks = np.asarray(ctas["kv_blocks"]).astype(np.int64) if "kv_blocks" in ctas.column_names else np.zeros(c_cta.size, np.int64)
    if by == "SM":
        lanes, lane_of_cta = np.unique(c_sm, return_inverse=True)
        row_lane = np.searchsorted(lanes, sm)
        labels = [f"SM {s}" for s in lanes]
        l_start = np.full(lanes.size, np.iinfo(np.int64).max)
        l_end = np.full(lanes.size, np.iinfo(np.int64).min)
        np.minimum.at(l_start, lane_of_cta, c_start)
        np.maximum.at(l_end, lane_of_cta, c_end)
        n_ctas = np.bincount(lane_of_cta, minlength=lanes.size)
        hover = [f"SM {s}: {plural(k, 'CTA')}, {((e - b) / 1e3):,.2f} µs from first start to last end"
                 for s, k, b, e in zip(lanes.tolist(), n_ctas.tolist(), l_start.tolist(), l_end.tolist())]
    else:
        key = (c_launch << 32) | c_cta
        order = np.argsort(key)
        keys_sorted = key[order]
        row_lane = order[np.searchsorted(keys_sorted, (launch << 32) | cta)]
        labels = [f"L{l}·CTA {c}" if multi else f"CTA {c}" for l, c in zip(c_launch.tolist(), c_cta.tolist())]
        l_start, l_end = c_start, c_end
        blocks = [f", {plural(k, 'KV block')}" if c_blocks.any() else "" for k in c_blocks.tolist()]
        hover = [f"{lb} on SM {s}: {((e - b) / 1e3):,.2f} µs{kb}"
                 for lb, s, b, e, kb in zip(labels, c_sm.tolist(), c_start.tolist(), c_end.tolist(), blocks)]
    n_lanes = len(labels)
    want = [dict_names.index(n) for n in _activity_names(activity) if n in dict_names]
    m = np.isin(codes, want) if want else np.zeros(ev.num_rows, bool)
    t0 = float(l_start.min()) if n_lanes else 0.0
    t1 = float(l_end.max()) if n_lanes else 1.0
    n_bins = int(max(1, min(MAX_BINS, max_cells // max(n_lanes, 1))))
    ug, us, ue = union_intervals(row_lane[m], start[m], end[m])
    z = bin_coverage(ug, us, ue, n_lanes, t0, t1, n_bins)
    span_us = (l_end - l_start) / 1e3
    stragglers = []
    if n_lanes > 2:
        med_end = float(np.median(l_end))
        worst = np.argsort(l_end)[::-1][:3]
        stragglers = [f"{labels[i]} ends {(l_end[i] - med_end) / 1e3:,.2f} µs after the median end"
                      for i in worst if l_end[i] > med_end]
    return Grid(z.astype(np.float32), t0 / 1e3, (t1 - t0) / n_bins / 1e3, labels, span_us, hover, by, activity, stragglers)


def grid_figure(grids: list[tuple[str, Grid]], *, uirevision: str = ""):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    colors = VOCAB.colors()
    fig = make_subplots(rows=len(grids), cols=2, column_widths=[0.86, 0.14], shared_yaxes=True, shared_xaxes=True,
                        horizontal_spacing=0.01, vertical_spacing=0.12,
                        subplot_titles=[plotly(s) for t, g in grids for s in (t, f"span per {g.by} (µs)")])
    heights = []
    for r, (_, g) in enumerate(grids, start=1):
        names = _activity_names(g.activity)
        color = colors.get("PV" if g.activity == TENSOR_CORES else names[0], "#636363")
        if g.activity == ALIVE:
            color = "#636363"
        n_lanes, n_bins = g.z.shape
        x = (g.t0_us + g.bin_us * (np.arange(n_bins) + 0.5)).astype(np.float32)
        fig.add_trace(go.Heatmap(z=g.z, x=x, y=g.lane_label, zmin=0, zmax=1,
                                 colorscale=[[0, "#ffffff"], [1, color]], showscale=(r == 1),
                                 colorbar={"title": {"text": "busy"}, "len": 0.5, "y": 1, "yanchor": "top"},
                                 hovertemplate="%{y} · t=%{x:,.2f} µs: %{z:.0%} busy<extra></extra>"),
                      row=r, col=1)
        fig.add_trace(go.Bar(x=g.lane_span_us, y=g.lane_label, orientation="h", marker_color="#9e9e9e",
                             hovertext=g.lane_hover, hoverinfo="text", showlegend=False), row=r, col=2)
        fig.update_yaxes(autorange="reversed", type="category", title_text=g.by, row=r, col=1)
        fig.update_yaxes(autorange="reversed", type="category", row=r, col=2)
        heights.append(min(max(n_lanes * 6, 220), 700))
    fig.update_xaxes(title_text=f"µs since the trace began · cell = share of the bin with {grids[-1][1].activity}",
                     row=len(grids), col=1)
    # top margin: the subplot titles sit below the plotly toolbar's strip (the figure's top 30 px)
    fig.update_layout(height=int(sum(heights) + 90 * len(grids) + 20), uirevision=uirevision,
                      margin={"l": 10, "r": 10, "t": 60, "b": 40}, plot_bgcolor="white")
    return fig
