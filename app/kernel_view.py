"""Tables and the occupancy chart for bundles of automatically traced kernels (any kernel).

Every number comes from fa4trace.analysis.kernel (summarize_kernel / compare_kernels, the same
dicts `fa4trace summary --json` / `compare --json` print) or its tables (occupancy_series,
wait_chains), formatted only: fa4trace.analysis.text's formatters, so the viewer and the CLI
write a number the same way.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from fa4trace.analysis.kernel import metric_pairs
from fa4trace.analysis.text import fmt_delta, fmt_value, label, ns, pct
from fa4trace.analysis.words import plural

from .literal import plotly

CARDS = [("kernel time", "kernel_time_ns"), ("wait chain (median CTA)", "wait_chain_ns")]
PALETTE = ("#3182bd", "#e6550d", "#31a354", "#756bb1")


def cards(s: dict) -> list[tuple[str, str]]:
    """(label, flat key) of the cards above the tables: kernel time, the wait chain, and per
    pipeline the mean stages held and the median lag."""
    out = list(CARDS)
    for p in (s.get("pipelines") or {}):
        out += [(f"{p}: stages held (mean)", f"pipeline.{p}.occupancy_mean"),
                (f"{p}: lag (median)", f"pipeline.{p}.lag_median_ns")]
    return out


def metric_rows(sa: dict, sb: dict | None = None) -> list[dict]:
    """One row per comparable number (kernel_analysis.flat_metrics): metric, A[, B, B − A]."""
    rows = []
    for key, a, b in metric_pairs(sa, sb):
        row = {"metric": label(key), "A": fmt_value(key, a)}
        if sb is not None:
            row.update({"B": fmt_value(key, b), "B − A": fmt_delta(key, a, b)})
        rows.append(row)
    return rows


def fraction_rows(s: dict) -> list[dict]:
    """Per role: warps, busy / waiting / idle, and the waits that take the most of its time."""
    roles = s.get("roles") or {}
    wbe = s.get("waiting_by_event") or {}
    return [{"role": r, "warps": ",".join(str(w) for w in (roles.get(r) or {}).get("warps", [])),
             "decided": (roles.get(r) or {}).get("source", ""),
             "busy": pct(f["busy"]), "waiting": pct(f["waiting"]), "idle": pct(f["idle"]),
             "waiting in": ", ".join(f"{n} {pct(v)}" for n, v in list((wbe.get(r) or {}).items())[:3])}
            for r, f in (s.get("role_fractions") or {}).items()]


def lag_rows(s: dict) -> list[dict]:
    """Per pipeline and stage: median / p90 lag from the producer's commit to the consumer's wait end."""
    out = []
    for p, d in (s.get("pipelines") or {}).items():
        for st in d.get("lag_per_stage") or []:
            out.append({"pipeline": p, "stage": st["stage"], "lag median": ns(st["median_ns"]),
                        "lag p90": ns(st["p90_ns"]), "waits": st["n"]})
    return out


def chain_rows(chain: pa.Table, origin_ns: int = 0) -> list[dict]:
    """A CTA's wait chain (fa4trace.analysis.wait_chain.wait_chains rows of one CTA), last wait first;
    times in ns from ``origin_ns`` (the timeline's origin)."""
    d = chain.to_pydict()
    return [{"step": d["step"][i], "warp": d["warp"][i], "role": d["role"][i], "wait": d["name"][i],
             "iter": d["iter"][i], "from ns": d["start_ns"][i] - origin_ns, "to ns": d["end_ns"][i] - origin_ns,
             "counts": ns(d["wait_ns"][i]),
             "released by": f"warp {d['released_by_warp'][i]} at {d['release_ns'][i] - origin_ns} ns"
             if d["released_by_warp"][i] >= 0 else "—"}
            for i in range(chain.num_rows)]


def occupancy_figure(items: list[tuple[str, pa.Table, int, float, dict]], *, uirevision: str = ""):
    """Stages held over time, one step line per (trace, pipeline). ``items``: (title, the
    occupancy_series rows of one CTA, origin ns, span ns, {pipeline: stages}) per trace; x = ns
    from the origin, the same axis as the timeline. None when no item has a series."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for k, (title, occ, origin, span, stages) in enumerate(items):
        if occ.num_rows == 0:
            continue
        pipes = occ["pipeline"].to_pylist()
        t = occ["t_ns"].to_numpy().astype(np.int64)
        v = occ["stages_full"].to_numpy()
        for j, p in enumerate(sorted(set(pipes))):
            m = np.asarray(pipes) == p
            fig.add_trace(go.Scatter(
                x=(t[m] - origin).astype(np.float64), y=v[m].astype(np.float64), mode="lines", line_shape="hv",
                name=plotly(f"{title.split(':')[0]}: {p}" + (f" ({plural(stages[p], 'stage')})" if stages.get(p) else "")),
                line={"color": PALETTE[k % len(PALETTE)], "width": 2, "dash": ("solid", "dash", "dot")[j % 3]},
                hovertemplate=f"{p} · %{{x:,.0f}} ns: %{{y}} stages held<extra></extra>"))
    if not fig.data:
        return None
    spans = [span for _, occ, _, span, _ in items if occ.num_rows]
    fig.update_layout(height=230, uirevision=uirevision, plot_bgcolor="white", margin={"l": 10, "r": 10, "t": 36, "b": 36},
                      title={"text": "pipeline stages held (committed, not yet released)", "font": {"size": 13},
                             "x": 0, "xanchor": "left", "y": 1, "yanchor": "top", "yref": "container", "pad": {"t": 10}},
                      legend={"orientation": "v", "x": 1.01, "xanchor": "left", "y": 1, "yanchor": "top"})
    fig.update_xaxes(title_text="ns from the timeline's origin", gridcolor="#eee", range=[0, max(spans)] if spans else None)
    fig.update_yaxes(title_text="stages", rangemode="tozero", dtick=1, gridcolor="#eee")
    return fig


# Widths (px) of the wait-chain table's columns: 920 px together, so a chain drawn at the page's
# width shows every column whole on a 1280-px-wide window; the words (role, event, who released
# the wait) get the room.
CHAIN_WIDTHS = {"step": 50, "warp": 50, "role": 110, "wait": 150, "iter": 50, "from ns": 100, "to ns": 100,
                "counts": 90, "released by": 220}
