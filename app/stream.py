"""KV-stream chart: how fast the CTAs consumed KV blocks over time, one line per trace.

The series and the dashed steady rate are :func:`fa4trace.analysis.overlap.stream_profile`'s
(``stream_series``, ``stream_tbps``), unmodified. A kernel that streams at its steady rate
from launch to end draws a flat line; the dips at both ends are the ``start`` / ``end`` losses
the metrics table lists (time from each launch's first warp; first launch only).
"""

from __future__ import annotations

from .literal import plotly

PALETTE = ("#3182bd", "#e6550d")


def legend_name(title: str) -> str:
    """A legend entry: the trace's name without its description (``label`` is ``name — details``)."""
    return title.split(" — ")[0]


def stream_figure(summaries: list[tuple[str, dict]], *, uirevision: str = ""):
    """One line per (title, summary) that has a stream profile; None if none has.

    Layout: the title sits in the top margin, the legend to the right of the plot area (one
    entry a line, its top level with the plot's), so neither can cover the other however long
    the trace names are or however many lines there are."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for k, (title, s) in enumerate(summaries):
        series = s.get("stream_series")
        if not series:
            continue
        color = PALETTE[k % len(PALETTE)]
        name = plotly(legend_name(title))
        x = [t / 1e3 for t, _ in series]
        fig.add_trace(go.Scatter(x=x, y=[v for _, v in series], mode="lines+markers", name=name,
                                 line={"color": color, "width": 2}, marker={"size": 4},
                                 hovertemplate=f"{name} · %{{x:.2f}} µs: %{{y:.2f}} TB/s<extra></extra>"))
        fig.add_trace(go.Scatter(x=[x[0], x[-1]], y=[s["stream_tbps"]] * 2, mode="lines",
                                 name=f"{name.split(':')[0]}: steady {s['stream_tbps']:.2f} TB/s",
                                 line={"color": color, "width": 1, "dash": "dash"}, hoverinfo="skip"))
    if not fig.data:
        return None
    fig.update_layout(height=320, uirevision=uirevision, plot_bgcolor="white",
                      margin={"l": 10, "r": 10, "t": 44, "b": 40},
                      title={"text": "KV blocks consumed per time bin (TB/s)", "font": {"size": 14},
                             "x": 0, "xanchor": "left", "xref": "paper",
                             "y": 1, "yanchor": "top", "yref": "container", "pad": {"t": 12}},
                      legend={"orientation": "v", "x": 1.01, "xanchor": "left", "y": 1, "yanchor": "top",
                              "font": {"size": 11}})
    fig.update_xaxes(title_text="µs from the first warp's start", gridcolor="#eee")
    fig.update_yaxes(title_text="TB/s", rangemode="tozero", gridcolor="#eee")
    return fig
