"""Figures of a sweep dataset: bandwidth over KV length and over query length, and overlap.

A dataset is a folder ``ROOT`` holding one Parquet row per measured point, hive-partitioned::

    ROOT/results/kernel=<k>/d=<d>/hkv=<hkv>/<point_id>.parquet   (one row: shape, us, tbps, error, ...)
    ROOT/bundles/kernel=<k>/d=<d>/<point_id>.parquet             (fa4trace bundles of our schedules)
    ROOT/sweeps/sweep=<id>/sweep.json                            (GPU, commit, command, grid)

:func:`load` reads the rows in place with DuckDB into a pandas frame (the newest row per point
when a point was measured more than once). The figures, as in Colfax's decode article:

* :func:`bandwidth_vs_sk` (its Figure 9): grouped bars of TB/s over KV length, one panel per
  (head dim, GQA ratio), with the ping-pong's gain over base written on each pair;
* :func:`bandwidth_vs_sq` (its Figure 10): the same over query length at the longest KV length;
* :func:`overlap_figure`: the measured overlap per point, QK ∥ SOFTMAX of the ping-pong and
  PV ∥ SOFTMAX of the intra-warpgroup schedule.

A failed point (``error`` set) is a gap in its series, never a zero; an ✕ above the axis names
the failure on hover. One module for both places that draw them: ``fa4trace plot`` and the
viewer's Sweep tab (fa4trace.viewer.page) import it; it imports neither. It needs pandas, plotly
and DuckDB (the ``viewer`` extra), imported with it, never by ``fa4trace.sweep`` itself.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fa4trace.format.errors import Fa4traceError

KERNELS = ("base", "pingpong", "intrawg", "cudnn", "flash", "fa4")  # legend and bar order
OURS = ("base", "pingpong", "intrawg")
DEFAULT_KERNELS = ("base", "pingpong")
NAMES = {"base": "base", "pingpong": "ping-pong", "intrawg": "intra-WG", "cudnn": "cuDNN", "flash": "FLASH",
         "fa4": "FA4"}
COLORS = {"base": "#7f7f7f", "pingpong": "#d62728", "intrawg": "#ff7f0e", "cudnn": "#1f77b4", "flash": "#2ca02c",
          "fa4": "#9467bd"}
COLUMNS = {"sweep_id": "str", "point_id": "str", "kernel": "str", "d": "int", "hq": "int", "hkv": "int", "sk": "int",
           "b": "int", "sq": "int", "dtype": "str", "us": "float", "us_spread": "float", "tbps": "float",
           "rel_err": "float", "error": "str", "qk_softmax_overlap": "float", "pv_softmax_overlap": "float",
           "bundle": "str", "gpu": "str", "worker": "str", "finished_at": "str"}
POINT = ["kernel", "d", "hq", "hkv", "sk", "b", "sq", "dtype"]  # what makes two rows the same measurement
OVERLAP = {"pingpong": ("qk_softmax_overlap", "QK ∥ SOFTMAX"), "intrawg": ("pv_softmax_overlap", "PV ∥ SOFTMAX")}
FIGURES = ("9", "10", "overlap")
BARGAP = 0.18  # between the groups of bars, a fraction of a category's width


class DatasetError(Fa4traceError):
    """The folder is not a sweep dataset (no result rows, unreadable Parquet)."""


# ---- data --------------------------------------------------------------------------------------
def load(root: str | Path) -> pd.DataFrame:
    """Every result row of the dataset at ``root``, newest per point, as a pandas frame.

    Columns: those of :data:`COLUMNS` (absent ones are null), plus ``gqa`` ("16:1") and
    ``failed`` (bool). ``tbps`` and the overlaps are null on failed rows."""
    import duckdb

    root = Path(root)
    res = root / "results"
    if not res.is_dir() or not any(res.rglob("*.parquet")):
        raise DatasetError(f"{root}: no sweep results (expected {root}/results/kernel=*/d=*/hkv=*/*.parquet)")
    glob = str(res / "**" / "*.parquet")
    con = duckdb.connect()
    try:
        # the files' own columns: the hive keys (kernel, d, hkv) repeat three of them
        # a relation straight to Arrow: the DB-API cursor's .df() warns on some duckdb/pandas pairs
        df = con.sql("select * from read_parquet($glob, hive_partitioning=false, union_by_name=true)",
                     params={"glob": glob}).to_arrow_table().to_pandas()
        df = df[[c for c in COLUMNS if c in df.columns]]
    except duckdb.Error as exc:
        raise DatasetError(f"{root}: cannot read the results ({str(exc).splitlines()[0]})") from None
    finally:
        con.close()
    for c, kind in COLUMNS.items():
        if c not in df:
            df[c] = pd.NA if kind == "str" else float("nan")
    for c in ("d", "hq", "hkv", "sk", "b", "sq"):
        df[c] = pd.to_numeric(df[c]).astype("int64")
    for c in ("us", "us_spread", "tbps", "rel_err", "qk_softmax_overlap", "pv_softmax_overlap"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    for c in ("kernel", "dtype", "error", "bundle", "finished_at", "point_id", "sweep_id"):
        df[c] = df[c].astype("object").where(df[c].notna(), None)
    df["failed"] = df["error"].map(lambda e: e is not None and str(e) != "")
    df.loc[df["failed"], ["tbps", "us", "qk_softmax_overlap", "pv_softmax_overlap"]] = float("nan")
    df["gqa"] = [f"{hq}:{hkv}" for hq, hkv in zip(df["hq"], df["hkv"])]
    df = (df.sort_values("finished_at", na_position="first", kind="stable")
            .drop_duplicates(POINT, keep="last").reset_index(drop=True))
    return df


def sweep_info(root: str | Path) -> list[dict]:
    """The dataset's sweep.json files (GPU, commit, command, grid), oldest first."""
    import json

    out = []
    for p in sorted(Path(root).glob("sweeps/sweep=*/sweep.json")):
        try:
            out.append({"sweep": p.parent.name.split("=", 1)[1], **json.loads(p.read_text())})
        except (OSError, ValueError):
            continue
    return out


def kernels_in(df: pd.DataFrame) -> list[str]:
    """The dataset's kernels, ours first, then the peers (unknown names last)."""
    have = set(df["kernel"].dropna())
    return [k for k in KERNELS if k in have] + sorted(have - set(KERNELS))


def count_text(df: pd.DataFrame) -> str:
    """"44 points, 264 rows (one per kernel and point), 12 failed": a point is a shape, measured
    once per kernel."""
    points = len(df[[c for c in POINT if c != "kernel"]].drop_duplicates())
    return (f"{points:,} point{'s' if points != 1 else ''}, {len(df):,} rows (one per kernel and point), "
            f"{int(df['failed'].sum()):,} failed")


def batches(df: pd.DataFrame) -> list[int]:
    return sorted(int(b) for b in df["b"].unique())


def default_b(df: pd.DataFrame) -> int:
    bs = batches(df)
    return 1 if 1 in bs else (bs[0] if bs else 1)


def sk_label(n: int) -> str:
    """1024 -> "1k", 131072 -> "128k", 1000 -> "1000"."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _panels(df: pd.DataFrame) -> tuple[list[int], list[str]]:
    ds = sorted(int(d) for d in df["d"].unique())
    ratio = df.assign(r=df["hq"] / df["hkv"])[["gqa", "r"]].drop_duplicates().sort_values("r", ascending=False)
    return ds, list(dict.fromkeys(ratio["gqa"]))


def _gain(base: float, pp: float) -> float | None:
    if base is None or pp is None or pd.isna(base) or pd.isna(pp) or base <= 0:
        return None
    return (pp / base - 1.0) * 100.0


def _frame(df: pd.DataFrame, *, b: int | None, sq: int | None = None) -> pd.DataFrame:
    out = df[df["b"] == (default_b(df) if b is None else b)]
    if sq is not None:
        out = out[out["sq"] == sq]
    return out


# ---- figures -------------------------------------------------------------------------------------
def _grid(ds: list[int], gqas: list[str], title: str, y_title: str, x_title: str, height_per_row: int = 300):
    titles = [f"d {d} · GQA {g}" for d in ds for g in gqas]
    fig = make_subplots(rows=max(1, len(ds)), cols=max(1, len(gqas)), subplot_titles=titles or None,
                        horizontal_spacing=0.07, vertical_spacing=0.16 if len(ds) > 1 else 0.1)
    # The title sits in the top margin (container coordinates), the legend right of the plot area:
    # neither covers the other nor a panel title.
    fig.update_layout(height=90 + height_per_row * max(1, len(ds)), plot_bgcolor="white", barmode="group",
                      bargap=BARGAP, bargroupgap=0.04,
                      margin={"l": 10, "r": 10, "t": 80, "b": 50},
                      title={"text": title, "font": {"size": 15}, "x": 0, "xanchor": "left", "xref": "paper",
                             "y": 1, "yref": "container", "yanchor": "top", "pad": {"t": 12}},
                      legend={"orientation": "v", "x": 1.01, "xanchor": "left", "y": 1, "yanchor": "top",
                              "yref": "paper", "title": {"text": "kernel"}})
    fig.update_yaxes(gridcolor="#eee", rangemode="tozero")
    fig.update_yaxes(title_text=y_title, col=1)
    for c in range(1, max(1, len(gqas)) + 1):
        fig.update_xaxes(title_text=x_title, row=max(1, len(ds)), col=c)
    return fig


def _refs(fig: go.Figure, row: int, col: int) -> dict:
    sp = fig.get_subplot(row, col)
    return {"xref": sp.xaxis.plotly_name.replace("axis", ""), "yref": sp.yaxis.plotly_name.replace("axis", "")}


def _annotate(fig: go.Figure, notes: list[dict]) -> None:
    """Add annotations at once (plotly's add_annotation re-validates them all per call). Their x is
    the category's index: on a category axis plotly reads a numeric-looking string ("4") as one."""
    if notes:
        fig.update_layout(annotations=[*fig.layout.annotations, *notes])


def _bars(df: pd.DataFrame, x: str, kernels, title: str, x_title: str, *, per_panel=None) -> go.Figure:
    """Grouped bars of tbps over column ``x``; one panel per (d, gqa); gains and failures annotated."""
    kernels = [k for k in (kernels or DEFAULT_KERNELS) if k in set(df["kernel"])]
    ds, gqas = _panels(df)
    fig = _grid(ds, gqas, title, "TB/s", x_title)
    shown, notes = set(), []
    for r, d in enumerate(ds, 1):
        for c, g in enumerate(gqas, 1):
            sub = df[(df["d"] == d) & (df["gqa"] == g)]
            if per_panel is not None:
                sub = per_panel(sub)
            xs = sorted(int(v) for v in sub[x].unique())
            cats = [sk_label(v) if x == "sk" else str(v) for v in xs]
            top, slots, fails = {}, [], []
            for k in kernels:
                kk = {int(rec[x]): rec for rec in sub[sub["kernel"] == k].to_dict("records")}  # dicts: fast lookups
                if not kk:
                    continue
                ys, hover = [], []
                for v, cat in zip(xs, cats):
                    row = kk.get(v)
                    y = None if row is None or pd.isna(row["tbps"]) else float(row["tbps"])
                    ys.append(y)
                    if y is not None:
                        top[cat] = max(top.get(cat, 0.0), y)
                    hover.append("" if row is None else
                                 (f"failed: {row['error']}" if row["failed"] else
                                  f"{row['us']:.2f} µs · {y:.2f} TB/s" if y is not None else "no TB/s recorded"))
                fig.add_trace(go.Bar(x=cats, y=ys, name=NAMES.get(k, k), legendgroup=k, showlegend=k not in shown,
                                     marker_color=COLORS.get(k), customdata=hover, meta={"kernel": k, "d": d, "gqa": g},
                                     hovertemplate=f"{NAMES.get(k, k)} · %{{x}}<br>%{{customdata}}<extra></extra>"),
                              row=r, col=c)
                shown.add(k)
                slots.append(k)
                for i, (v, cat) in enumerate(zip(xs, cats)):
                    row = kk.get(v)
                    if row is not None and row["failed"]:
                        fails.append((k, i, dict(y=0, text="✕", showarrow=False, yshift=8, name="error",
                                                 font={"color": COLORS.get(k, "#000"), "size": 12},
                                                 hovertext=f"{NAMES.get(k, k)} failed at {x} {v}: {row['error']}",
                                                 **_refs(fig, r, c))))
            # each ✕ where its kernel's bar would stand: grouped bars share the category's width
            # (less the bar gap) in equal slots, in trace order
            width = 1.0 - BARGAP
            for k, i, note in fails:
                j = slots.index(k)
                notes.append({"x": i - width / 2 + (j + 0.5) * width / len(slots), **note})
            if {"base", "pingpong"} <= set(kernels):
                base = sub[sub["kernel"] == "base"].set_index(x)["tbps"]
                pp = sub[sub["kernel"] == "pingpong"].set_index(x)["tbps"]
                for i, (v, cat) in enumerate(zip(xs, cats)):
                    gain = _gain(base.get(v), pp.get(v))
                    if gain is None:
                        continue
                    notes.append(dict(x=i, y=top.get(cat, 0.0), text=f"{gain:+.0f}%", showarrow=False,
                                      yanchor="bottom", yshift=2, name="gain", font={"size": 10},
                                      hovertext=f"ping-pong vs base at {x} {v}: {gain:+.1f}%", **_refs(fig, r, c)))
            fig.update_xaxes(type="category", categoryorder="array", categoryarray=cats, row=r, col=c)
    _annotate(fig, notes)
    if not fig.data:
        fig.add_annotation(text="No points of these kernels in this selection", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper", name="empty")
    return fig


def bandwidth_vs_sk(df: pd.DataFrame, kernels=DEFAULT_KERNELS, *, b: int | None = None, sq: int = 1) -> go.Figure:
    """Figure 9: TB/s over KV length at ``sq`` query tokens and batch ``b`` (default 1)."""
    b = default_b(df) if b is None else b
    sub = _frame(df, b=b, sq=sq)
    return _bars(sub, "sk", kernels, f"Decode bandwidth over KV length (q_len {sq}, batch {b})", "KV length")


def bandwidth_vs_sq(df: pd.DataFrame, kernels=DEFAULT_KERNELS, *, b: int | None = None) -> go.Figure:
    """Figure 10: TB/s over query length at each panel's longest KV length, batch ``b``."""
    b = default_b(df) if b is None else b
    sub = _frame(df, b=b)

    def longest(panel):
        return panel[panel["sk"] == panel["sk"].max()] if len(panel) else panel

    sks = sorted({int(p["sk"].max()) for _, p in sub.groupby(["d", "gqa"])}) if len(sub) else []
    at = ", ".join(sk_label(s) for s in sks) or "—"
    return _bars(sub, "sq", kernels, f"Decode bandwidth over query length (KV length {at}, batch {b})",
                 "query length (q_len)", per_panel=longest)


def overlap_figure(df: pd.DataFrame, *, b: int | None = None, sq: int = 1) -> go.Figure:
    """Overlap % per point over KV length: QK ∥ SOFTMAX of the ping-pong, PV ∥ SOFTMAX of intrawg."""
    b = default_b(df) if b is None else b
    sub = _frame(df, b=b, sq=sq)
    ds, gqas = _panels(sub)
    fig = _grid(ds, gqas, f"Measured overlap per point (q_len {sq}, batch {b})", "overlap %", "KV length")
    shown, notes = set(), []
    for r, d in enumerate(ds, 1):
        for c, g in enumerate(gqas, 1):
            panel = sub[(sub["d"] == d) & (sub["gqa"] == g)]
            xs = sorted(int(v) for v in panel["sk"].unique())
            cats = [sk_label(v) for v in xs]
            for k, (col, label) in OVERLAP.items():
                kk = panel[panel["kernel"] == k].set_index("sk")
                if kk.empty:
                    continue
                ys = [None if v not in kk.index or pd.isna(kk.loc[v, col]) else 100.0 * float(kk.loc[v, col]) for v in xs]
                name = f"{NAMES[k]}: {label}"
                fig.add_trace(go.Scatter(x=cats, y=ys, name=name, legendgroup=k, showlegend=k not in shown,
                                         mode="lines+markers", connectgaps=False, line={"color": COLORS[k]},
                                         meta={"kernel": k, "d": d, "gqa": g},
                                         hovertemplate=f"{name} · %{{x}}: %{{y:.1f}}%<extra></extra>"), row=r, col=c)
                shown.add(k)
                for i, (v, cat) in enumerate(zip(xs, cats)):
                    if v in kk.index and kk.loc[v, "failed"]:
                        notes.append(dict(x=i, y=0, text="✕", showarrow=False, yshift=8, name="error",
                                          font={"color": COLORS[k], "size": 12},
                                          hovertext=f"{NAMES[k]} failed at sk {v}: {kk.loc[v, 'error']}",
                                          **_refs(fig, r, c)))
            fig.update_xaxes(type="category", categoryorder="array", categoryarray=cats, row=r, col=c)
    fig.update_yaxes(range=[0, 105])
    _annotate(fig, notes)
    if not fig.data:
        fig.add_annotation(text="No overlap recorded (ping-pong / intrawg rows of this batch)", showarrow=False,
                           x=0.5, y=0.5, xref="paper", yref="paper", name="empty")
    return fig


def figure(df: pd.DataFrame, which: str = "9", kernels=DEFAULT_KERNELS, *, b: int | None = None) -> go.Figure:
    """One of :data:`FIGURES` by name."""
    if which == "9":
        return bandwidth_vs_sk(df, kernels, b=b)
    if which == "10":
        return bandwidth_vs_sq(df, kernels, b=b)
    if which == "overlap":
        return overlap_figure(df, b=b)
    raise ValueError(f"unknown figure {which!r}: one of {', '.join(FIGURES)}")


# ---- points and bundles --------------------------------------------------------------------------
def bundle_points(df: pd.DataFrame, root: str | Path) -> pd.DataFrame:
    """One row per shape (d, hq, hkv, sk, b, sq, dtype) that has a bundle of base or ping-pong:
    the columns ``base`` and ``pingpong`` hold absolute bundle paths (None when absent)."""
    root = Path(root)
    have = df[df["kernel"].isin(("base", "pingpong")) & df["bundle"].notna()]
    shape = ["d", "hq", "hkv", "sk", "b", "sq", "dtype"]
    rows = {}
    for _, r in have.iterrows():
        key = tuple(r[c] for c in shape)
        p = root / str(r["bundle"])
        rows.setdefault(key, {**dict(zip(shape, key)), "base": None, "pingpong": None})[r["kernel"]] = \
            str(p) if p.is_file() else None
    out = pd.DataFrame(list(rows.values()), columns=[*shape, "base", "pingpong"])
    out = out[out["base"].notna() | out["pingpong"].notna()]
    return out.sort_values(shape, kind="stable").reset_index(drop=True)


def clicked_point(fig: go.Figure, points: list[dict], pts: pd.DataFrame) -> int | None:
    """The row of ``pts`` (:func:`bundle_points`) a click on ``fig`` picked, or None.

    ``points``: plotly's selection (``curve_number`` and ``x``, the category label). A trace's
    ``meta`` names its panel (d, GQA); the title's batch and q_len or KV length complete the point."""
    import re

    title = fig.layout.title.text or ""
    b = int(re.search(r"batch (\d+)", title).group(1)) if re.search(r"batch (\d+)", title) else None
    for pt in points or ():
        i = pt.get("curve_number")
        if i is None or not 0 <= i < len(fig.data) or not isinstance(fig.data[i].meta, dict):
            continue
        meta, label = fig.data[i].meta, str(pt.get("x"))
        hq, hkv = (int(v) for v in meta["gqa"].split(":"))
        want = (pts["d"] == meta["d"]) & (pts["hq"] == hq) & (pts["hkv"] == hkv)
        if b is not None:
            want &= pts["b"] == b
        if "over query length" in title:
            want &= pts["sq"].astype(str) == label
            sk = re.search(r"KV length ([^,)]+)", title)
            cand = pts[want]
            if sk and not cand.empty:
                want &= pts["sk"].map(sk_label).isin([t.strip() for t in sk.group(1).split(",")])
        else:
            want &= (pts["sk"].map(sk_label) == label) & (pts["sq"] == 1)
        hits = pts.index[want]
        if len(hits):
            return int(hits[0])
    return None


def point_label(p) -> str:
    both = "base + ping-pong" if p["base"] and p["pingpong"] else ("base only" if p["base"] else "ping-pong only")
    return (f"d {p['d']} · GQA {p['hq']}:{p['hkv']} · sk {sk_label(int(p['sk']))} · b {p['b']} · q_len {p['sq']}"
            f" · {p['dtype']} ({both})")


# ---- export --------------------------------------------------------------------------------------
STATIC = (".png", ".svg")


def static_export_problem() -> str | None:
    """Why PNG/SVG export cannot work here (one line), or None when kaleido is installed."""
    import importlib.util

    if importlib.util.find_spec("kaleido") is None:
        return "PNG/SVG export needs kaleido (pip install 'fa4trace[viewer]', or pip install 'kaleido>=1,<2')"
    return None


def save(fig: go.Figure, path: str | Path, *, width: int = 1400) -> Path:
    """Write ``fig`` to .html (self-contained, offline), .png or .svg (kaleido and Chrome)."""
    path = Path(path)
    ext = path.suffix.lower()
    if ext == ".html":
        fig.write_html(path, include_plotlyjs=True, full_html=True)
        return path
    if ext not in STATIC:
        raise Fa4traceError(f"{path}: unknown figure format {ext or '(none)'}: use .html, .png or .svg")
    problem = static_export_problem()
    if problem:
        raise Fa4traceError(problem)
    import logging

    quiet = logging.getLogger("choreographer")  # the browser driver logs stray pipe messages it ignores
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    # Kaleido drives a fresh browser per export; on a loaded machine its first call can run
    # before the page's own scripts are ready ("kaleido_scopes is not defined"): one more try
    # with a new browser, then one line.
    try:
        for attempt in range(2):
            try:
                fig.write_image(path, width=width, height=int(fig.layout.height or 700),
                                scale=2 if ext == ".png" else 1)
                return path
            except Exception as exc:  # kaleido's own errors (no Chrome, a crashed renderer) as one line
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                if attempt == 0 and "kaleido_scopes is not defined" in first:
                    continue
                raise Fa4traceError(f"{path}: static export failed ({first}); kaleido needs Chrome or Chromium "
                                    "(plotly_get_chrome installs one)") from None
    finally:
        quiet.setLevel(level)
    return path
