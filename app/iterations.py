"""Per-iteration chart: median duration of each event per iteration, one row per trace.

The numbers are :func:`fa4trace.analysis.overlap.per_iteration` (median over warps and CTAs).
Attention bundles: their hand-placed events per KV block, stacked; the black line is
SOFTMAX_HIDDEN, the ns of each block's softmax during which the warp's own QK or PV was in
flight. QK and PV are in-flight spans that may overlap SOFTMAX in time, so a stack is the work
per block, not its wall time. Automatically traced kernels: the spans whose payload counts
iterations (a pipeline's acquire and wait per count: fa4trace.viewer.data.iteration_spans),
side by side, since different warps wait them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from fa4trace.analysis.overlap import ITER_EVENTS
from fa4trace.format.vocab import VOCAB

from .literal import plotly

HIDDEN = "SOFTMAX_HIDDEN"


def iteration_frame(table: pa.Table, events=ITER_EVENTS) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (iter, median_ns) from a per_iteration table, for ``events`` and SOFTMAX_HIDDEN."""
    out = {}
    if table.num_rows == 0:
        return out
    names = np.asarray(table["name"].to_pylist(), dtype=object)
    it = table["iter"].to_numpy()
    med = table["median_ns"].to_numpy()
    for nm in [*events, HIDDEN]:
        m = names == nm
        if m.any():
            o = np.argsort(it[m], kind="stable")
            out[nm] = (it[m][o], med[m][o])
    return out


def iteration_figure(tables: list[tuple[str, pa.Table]], *, uirevision: str = "", x_title: str = "KV block (iteration)",
                     events=ITER_EVENTS, colors: dict | None = None, stacked: bool = True, unit: str = "block"):
    """One subplot per (title, per_iteration table): a bar per event and iteration (stacked, or
    side by side), in ``events`` order and ``colors`` (default the shared vocabulary's)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    colors = colors or VOCAB.colors()
    fig = make_subplots(rows=len(tables), cols=1, shared_xaxes=True, shared_yaxes=True,
                        vertical_spacing=0.12, subplot_titles=[plotly(t) for t, _ in tables])
    shown = set()
    for r, (_, table) in enumerate(tables, start=1):
        frame = iteration_frame(table, events)
        for nm in events:
            if nm not in frame:
                continue
            x, y = frame[nm]
            label = plotly(nm)
            fig.add_trace(go.Bar(x=x, y=y, name=label, marker_color=colors.get(nm, "#999"), legendgroup=nm,
                                 showlegend=nm not in shown,
                                 hovertemplate=f"{label} · {unit} %{{x}}: median %{{y:,.0f}} ns<extra></extra>"),
                          row=r, col=1)
            shown.add(nm)
        if HIDDEN in frame:
            x, y = frame[HIDDEN]
            fig.add_trace(go.Scatter(x=x, y=y, name="softmax hidden under QK/PV", mode="lines",
                                     line={"color": "black", "width": 2}, legendgroup=HIDDEN,
                                     showlegend=HIDDEN not in shown,
                                     hovertemplate="hidden softmax · block %{x}: %{y:,.0f} ns<extra></extra>"),
                          row=r, col=1)
            shown.add(HIDDEN)
        fig.update_yaxes(title_text="median ns", row=r, col=1)
    fig.update_xaxes(title_text=x_title, row=len(tables), col=1)
    height = 300 * len(tables) + 100
    fig.update_layout(barmode="stack" if stacked else "group", bargap=0.1, height=height, uirevision=uirevision,
                      margin={"l": 10, "r": 10, "t": 70, "b": 40}, plot_bgcolor="white",
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1 + 30 / height, "x": 0})
    return fig
