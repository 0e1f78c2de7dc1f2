"""Each figure from the lightest recording that reports it: bundles of ``instrument(passes=...)``.

Recording perturbs what it records: a dense trace's waits and durations stretch with every
event its warps store. A bundle recorded with passes holds, for every call, the main launch
(pass "dense": the families and spans asked for) and the same launch replayed from the same
memory with lighter recordings, one each: "lifetimes" (no family: warp and CTA lifetimes),
one family at a time ("pipeline", "tma", "mma", "barrier") and "spans" (the named spans
alone). Each launch says its pass and the call it replays (``LaunchMeta.pass_name`` and
``call``: fa4trace.auto.run).

**Lightest** is measured, not assumed: a pass is lighter than another when its warps recorded
fewer events per recorded CTA (rows other than warp lifetimes, over the CTAs that have warps in
its launches). By construction that orders lifetimes (none) < one family < dense; between two
families the bundle decides. Ties keep the order the passes ran in.

A pass may replay a call several times (``instrument(pass_launches=N)``): its figures are taken
over all its launches of the call together (every CTA of each, each launch's CTAs apart): more
samples per figure for a short kernel.

``sourced_figures`` takes every figure of fa4trace.analysis.figures (CTA duration, per-stage
durations, waits by event, lags, overlaps) from the lightest pass that reports it, and says
which pass that was and what the dense recording read. It works on one call at a time (the
launches that replay it): no figure mixes launches of different calls. Roles are decided once,
on the dense pass (with the roles given), and given to every pass, so a warp plays one role in
all of them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..format.errors import Fa4traceError
from ..trace.bundle import Trace
from ..trace.meta import CtaLifetimes
from .figures import is_duration, trace_metrics

DENSE = "dense"  # the main recording's pass name (fa4trace.auto.run.DENSE)


def launch_passes(trace: Trace) -> list | None:
    """The pass of each launch (in the bundle's launch order), or None for a bundle without passes."""
    names = [ln.pass_name for ln in trace.info.launches]
    return names if any(names) else None


def has_passes(trace: Trace) -> bool:
    """Whether the bundle holds launches of more than one pass."""
    names = launch_passes(trace)
    return bool(names) and len(set(names)) > 1


def select_launches(trace: Trace, launches) -> Trace:
    """The bundle with only ``launches`` (indices), renumbered 0.. in order: events, the
    per-launch metadata, CTA lifetimes and plain-twin entries alike."""
    keep = sorted({int(i) for i in launches})
    ev = trace.events
    col = ev["launch"]
    ev = ev.filter(pc.is_in(col, value_set=pa.array(keep, col.type)))
    renum = np.searchsorted(np.asarray(keep, np.int64), ev["launch"].to_numpy().astype(np.int64))
    ev = ev.set_column(ev.schema.get_field_index("launch"), ev.schema.field("launch"),
                       pa.array(renum.astype(np.int16), col.type))
    info = trace.info
    kept = tuple(info.launches[i] for i in keep if i < len(info.launches))
    cut: dict = {"launches": kept, "total_dropped": int(sum(int(ln.dropped or 0) for ln in kept))}
    life = info.cta_lifetimes
    if life is not None and life.launch is not None:
        ln = np.asarray(life.launch, np.int64)
        m = np.isin(ln, keep)
        cut["cta_lifetimes"] = CtaLifetimes.from_meta(
            {k: (np.searchsorted(keep, ln[m]) if k == "launch" else np.asarray(v)[m]).tolist()
             for k, v in life.to_meta().items()})
    inst = info.instrument
    if inst is not None and isinstance(inst.plain_twin, list):
        where = {old_i: new_i for new_i, old_i in enumerate(keep)}
        cut["instrument"] = inst.updated(plain_twin=[dict(t, launch=where[t["launch"]]) for t in inst.plain_twin
                                                     if isinstance(t, dict) and t.get("launch") in where])
    return Trace(ev, info.updated(**cut).to_meta())


def pass_traces(trace: Trace) -> dict[str, Trace]:
    """{pass: the bundle's launches of that pass}, in the order the passes first appear."""
    names = launch_passes(trace)
    if not names:
        raise Fa4traceError(f"{trace.name}: no launch of this bundle says its pass: it was not recorded with passes")
    out = {}
    for p in dict.fromkeys(n for n in names if n):
        out[p] = select_launches(trace, [i for i, n in enumerate(names) if n == p])
    return out


def calls(trace: Trace) -> list[int]:
    """The calls the bundle's launches replay (each launch's ``call``; 0 where absent), in order."""
    return list(dict.fromkeys(int(ln.call or 0) for ln in trace.info.launches))


def events_per_cta(trace: Trace) -> float:
    """Events recorded per recorded CTA: rows other than warp lifetimes, over the (launch, CTA)
    pairs with warps in the table (0 for an empty trace)."""
    ev = trace.events
    if not ev.num_rows:
        return 0.0
    kind = np.asarray(ev["kind"].cast(pa.string()).to_pylist())
    ctas = np.unique(np.stack([ev["launch"].to_numpy().astype(np.int64), ev["cta"].to_numpy().astype(np.int64)]),
                     axis=1).shape[1]
    return float((kind != "warp").sum() / max(ctas, 1))


def sourced_figures(trace: Trace, roles=None, call: int | None = None) -> dict:
    """Every figure of one call (``call``; default the bundle's first) from the lightest pass
    that reports it (module doc):

    {"call", "calls" (how many the bundle holds),
     "passes": [{"pass", "launches", "events_per_cta"}, ...] lightest first,
     "figures": {metric: {"value", "pass", "dense", "dense_rel"}}} where "dense" is what the
    main recording read (None where it does not report the figure) and "dense_rel" its
    relative difference from the sourced value (dense / value - 1; None where not defined)."""
    from .roles import decide_roles

    if not launch_passes(trace):
        pass_traces(trace)  # the one-line error of a bundle without passes
    every = calls(trace)
    c = every[0] if call is None else int(call)
    if c not in every:
        raise Fa4traceError(f"{trace.name}: no call {c} in this bundle (calls {', '.join(map(str, every))})")
    mine = [i for i, ln in enumerate(trace.info.launches) if int(ln.call or 0) == c]
    by_pass = pass_traces(select_launches(trace, mine))
    main = by_pass[DENSE] if DENSE in by_pass else max(by_pass.values(), key=events_per_cta)
    warp_roles = decide_roles(main, roles)["by_warp"]
    order = list(by_pass)
    weight = {p: events_per_cta(t) for p, t in by_pass.items()}
    lightest = sorted(order, key=lambda p: (weight[p], order.index(p)))
    metrics = {p: trace_metrics(by_pass[p], warp_roles) for p in lightest}
    dense = metrics.get(DENSE, {})
    figures = {}
    for key in sorted({k for m in metrics.values() for k in m}):
        src = next(p for p in lightest if key in metrics[p])
        v, d = metrics[src][key], dense.get(key)
        figures[key] = {"value": v, "pass": src, "dense": d,
                        "dense_rel": (d / v - 1) if d is not None and v else None}
    n_launches = {p: len(t.info.launches) for p, t in by_pass.items()}
    return {"call": c, "calls": len(every),
            "passes": [{"pass": p, "launches": n_launches[p], "events_per_cta": weight[p]} for p in lightest],
            "figures": figures}


def _value(metric: str, v) -> str:
    if v is None:
        return "n/a"
    if is_duration(metric):
        return f"{v / 1e3:.2f} µs" if v >= 1e4 else f"{v:.0f} ns"
    return f"{100 * v:.1f}%"


def passes_text(sourced: dict) -> str:
    """The passes of ``sourced_figures`` by weight, as the CLI and the viewer name them:
    "lifetimes 0 (3 launches), mma 24, dense 73" (events per recorded CTA)."""
    return ", ".join(f"{p['pass']} {p['events_per_cta']:.0f}"
                     + (f" ({p['launches']} launches)" if p.get("launches", 1) > 1 else "") for p in sourced["passes"])


def figure_rows(sourced: dict) -> list[dict]:
    """One row per figure of ``sourced_figures`` as the CLI and the viewer show it: the figure,
    its value, the pass it came from, and the dense recording's reading with its difference
    (empty where the figure is the dense recording's own)."""
    rows = []
    for key, f in sourced["figures"].items():
        dense = ""
        if f["pass"] != DENSE and f["dense"] is not None:
            rel = f" ({100 * f['dense_rel']:+.1f}%)" if f["dense_rel"] is not None else ""
            dense = f"{_value(key, f['dense'])}{rel}"
        rows.append({"figure": key, "value": _value(key, f["value"]), "pass": f["pass"], "dense": dense})
    return rows


def figures_lines(sourced: dict) -> list[str]:
    """What ``fa4trace summary`` prints of ``sourced_figures``: the passes by weight, then one
    line per figure: its value, the pass it came from, and the dense recording's reading."""
    if not sourced:
        return []
    which = f"call {sourced['call']} of {sourced['calls']}: " if sourced.get("calls", 1) > 1 else ""
    lines = [f"  by pass        {which}each figure from the lightest pass that reports it (events per recorded CTA: "
             f"{passes_text(sourced)})"]
    rows = figure_rows(sourced)
    width = max((len(r["figure"]) for r in rows), default=0)
    for r in rows:
        tail = f"   dense {r['dense']}" if r["dense"] else ""
        lines.append(f"    {r['figure']:<{width}}  {r['value']:>10}  {r['pass']:<9}{tail}".rstrip())
    return lines
