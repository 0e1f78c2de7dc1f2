"""What a trace of any kernel says: the numbers behind `summary` / `compare` of automatic bundles.

Bundles of kernels traced by fa4trace.instrument carry pipeline, TMA, MMA and barrier events
(vocab.EventSpec.family); roles come from fa4trace.analysis.roles. Definitions:

* **busy / waiting / idle** of a warp, over its lifetime (its WARP row): *waiting* is the union
  of its wait spans (autoevents: acquire, wait, sync, store_wait); *idle* is the time before
  its first event and after its last one (all of it for a warp with no event); *busy* is the
  rest: between its first and last event and not waiting. A role's fractions are its warps'
  ns summed over their lifetimes summed, per CTA and over the whole trace.
* **stage occupancy** of a pipeline in a CTA: stages holding data, a step series. Count c
  fills its stage at the producer's first commit of c (the end of its acquire of c where the
  pipeline records no commits) and frees it at the last release of c by any consumer warp (the
  CTA's last event where none was recorded). For TMA pipelines a commit is the load's issue,
  so a held stage is a load in flight or data not yet consumed. Per series, over its window
  (first fill to last free): time-weighted mean, max, and the shares of the window with every
  stage held (``full_share``: the producer cannot run ahead) and none (``empty_share``: the
  consumers have nothing to start on).
* **producer -> consumer lag** of count c for a consumer warp: the end of its wait of c minus
  the fill of c (above); median and p90 per stage (c % stages) and over all stages.
* **wait chain**: fa4trace.analysis.wait_chain.

Every figure is one launch's: a bundle of several launches is summarized launch by launch and
compared one launch of A against one of B (fa4trace.analysis.launches).

Vectorized over rows (numpy sorts and bincounts); the loops are over pipelines, stages and roles.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..format.errors import Fa4traceError
from ..trace.bundle import Trace
from .autoevents import AutoCols, is_automatic
from .fills import count_key, filled_waits, fills
from .fidelity import perturbation
from .launches import compare_launches, per_launch, work_differs
from .overlap import config_diff, diff_text, json_safe, kernel_time, ring_losses, speed_text, union_length
from .roles import assign_roles, role_rank
from .wait_chain import chain_per_cta, wait_chains


def require_automatic(trace: Trace) -> None:
    """One clear line when a bundle has no automatic events to analyse."""
    if not is_automatic(trace):
        raise Fa4traceError(
            f"{trace.name}: not a bundle of an automatically traced kernel (its metadata has no 'instrument' "
            "entry); fa4trace summary / compare show the attention analysis for it")


# ---- busy / waiting / idle per role ------------------------------------------------------------
def _warp_times(c: AutoCols):
    """Per warp gid: lifetime bounds, idle ns, waiting ns, role code."""
    n = c.n_warps
    life0 = np.full(n, np.iinfo(np.int64).max)
    life1 = np.full(n, np.iinfo(np.int64).min)
    wr = c.is_warp_row if c.is_warp_row.any() else np.ones(c.n, bool)
    np.minimum.at(life0, c.warp_gid[wr], c.start[wr])
    np.maximum.at(life1, c.warp_gid[wr], c.end[wr])
    ev = ~c.is_warp_row
    first = np.full(n, np.iinfo(np.int64).max)
    last = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(first, c.warp_gid[ev], c.start[ev])
    np.maximum.at(last, c.warp_gid[ev], c.end[ev])
    has = last > np.iinfo(np.int64).min
    life = np.maximum(life1 - life0, 0)
    idle = np.where(has, np.maximum(first - life0, 0) + np.maximum(life1 - last, 0), life)
    idle = np.minimum(idle, life)
    w = c.is_wait
    g = c.warp_gid[w]
    s = np.clip(c.start[w], life0[g], life1[g])
    e = np.clip(c.end[w], life0[g], life1[g])
    waiting = np.minimum(union_length(g, s, e, n), life - idle)
    role = np.zeros(n, np.int64)
    role[c.warp_gid] = c.role_codes
    return life, idle, waiting, role


def role_fractions(trace_or_cols) -> pa.Table:
    """Per (launch, CTA, role): warps, lifetime_ns, busy_ns, waiting_ns, idle_ns and the three
    fractions of lifetime_ns (module docstring). Roles as the table's role column says:
    call it on :func:`fa4trace.analysis.roles.assign_roles`'s trace."""
    c = trace_or_cols if isinstance(trace_or_cols, AutoCols) else AutoCols.of(trace_or_cols)
    if c.n == 0:
        return pa.table({k: pa.array([], t) for k, t in (("launch", pa.int16()), ("cta", pa.int32()), ("role", pa.string()))})
    life, idle, waiting, role = _warp_times(c)
    n_roles = max(len(c.role_dict), 1)
    key = c.cta_of_warp * n_roles + role
    uk, inv = np.unique(key, return_inverse=True)
    inv = inv.reshape(-1)

    def tot(x):
        return np.bincount(inv, weights=x.astype(np.float64), minlength=uk.size)

    lt, it, wt = tot(life), tot(idle), tot(waiting)
    bt = np.maximum(lt - it - wt, 0)
    cta = uk // n_roles
    denom = np.maximum(lt, 1)
    return pa.table({
        "launch": pa.array(c.cta_keys[cta, 0].astype(np.int16)), "cta": pa.array(c.cta_keys[cta, 1].astype(np.int32)),
        "role": pa.array([c.role_dict[r] if c.role_dict else "unknown" for r in (uk % n_roles)], pa.string()),
        "warps": pa.array(np.bincount(inv, minlength=uk.size).astype(np.int64)),
        "lifetime_ns": pa.array(lt.astype(np.int64)), "busy_ns": pa.array(bt.astype(np.int64)),
        "waiting_ns": pa.array(wt.astype(np.int64)), "idle_ns": pa.array(it.astype(np.int64)),
        "busy": pa.array(bt / denom), "waiting": pa.array(wt / denom), "idle": pa.array(it / denom),
    })


def _fractions_overall(per_cta: pa.Table) -> dict:
    """{role: {busy, waiting, idle, waiting_cta_min, waiting_cta_max}} summed over CTAs."""
    if per_cta.num_rows == 0:
        return {}
    d = per_cta.to_pydict()
    out = {}
    for r in sorted(set(d["role"]), key=role_rank):
        idx = [i for i, x in enumerate(d["role"]) if x == r]
        lt = sum(d["lifetime_ns"][i] for i in idx) or 1
        out[r] = {k: sum(d[f"{k}_ns"][i] for i in idx) / lt for k in ("busy", "waiting", "idle")}
        w = [d["waiting"][i] for i in idx]
        out[r]["waiting_cta_min"], out[r]["waiting_cta_max"] = min(w), max(w)
    return out


def waiting_by_event(c: AutoCols) -> dict:
    """{role: {wait event: share of the role's lifetime spent in it}} over the whole trace."""
    if c.n == 0 or not c.is_wait.any():
        return {}
    life, _, _, role = _warp_times(c)
    w = c.is_wait
    n_names = len(c.name_dict)
    g = c.warp_gid[w] * n_names + c.name_codes[w]
    per = union_length(g, c.start[w], c.end[w], c.n_warps * n_names).reshape(c.n_warps, n_names)
    out = {}
    for r in np.unique(role).tolist():
        mine = role == r
        lt = float(life[mine].sum()) or 1.0
        tot = per[mine].sum(axis=0)
        name = c.role_dict[r] if c.role_dict else "unknown"
        shares = {c.name_dict[k]: float(tot[k] / lt) for k in np.flatnonzero(tot)}
        if shares:
            out[name] = dict(sorted(shares.items(), key=lambda kv: -kv[1]))
    return dict(sorted(out.items(), key=lambda kv: role_rank(kv[0])))


# ---- pipeline fills, frees, occupancy and lag ---------------------------------------------------
def _first_per_key(keys: np.ndarray, t: np.ndarray, latest: bool = False):
    """Distinct keys (sorted) and the earliest (or latest) time of each."""
    if keys.size == 0:
        return keys, t
    o = np.lexsort((t, keys))
    k, tt = keys[o], t[o]
    edge = np.r_[k[1:] != k[:-1], True] if latest else np.r_[True, k[1:] != k[:-1]]
    return k[edge], tt[edge]


def _cta_end(c: AutoCols) -> np.ndarray:
    ev = ~c.is_warp_row
    out = np.full(c.n_ctas, np.iinfo(np.int64).min)
    np.maximum.at(out, c.cta_gid[ev], c.end[ev])
    return out


def _lossy_ctas(c: AutoCols) -> np.ndarray:
    """Per CTA gid: whether a warp of it lost records (a full slot, or a shared-memory ring that
    overwrote its oldest: the WARP rows' ``dropped``)."""
    out = np.zeros(c.n_ctas, bool)
    w = np.flatnonzero(c.is_warp_row & (c.dropped > 0))
    out[c.cta_gid[w]] = True
    return out


def _within_kept(keys: np.ndarray, fill: np.ndarray, rk: np.ndarray, lossy: np.ndarray):
    """In CTAs that lost records, the counts both sides kept: fills between the first and last
    count released there. Warps lose different spans of time (a ring keeps each warp's newest
    records), so a fill whose release was lost would otherwise count as held to the CTA's end."""
    if not keys.size or not lossy.any():
        return keys, fill
    group = keys >> 21  # (cta gid, pipeline resource)
    lo = np.full(keys.size, np.iinfo(np.int64).max)
    hi = np.full(keys.size, -1)
    if rk.size:
        ug, first = np.unique(rk >> 21, return_index=True)
        last = np.r_[first[1:], rk.size] - 1
        pos = np.minimum(np.searchsorted(ug, group), ug.size - 1)
        has = ug[pos] == group
        lo[has], hi[has] = rk[first[pos[has]]], rk[last[pos[has]]]
    keep = ~lossy[keys >> 30] | ((keys >= lo) & (keys <= hi))
    return keys[keep], fill[keep]


def _fills_and_frees(c: AutoCols, pipeline: str):
    keys, fill, _gid = fills(c, pipeline)
    rel = np.flatnonzero(c.where("pipeline", "release", pipeline) & (c.iter >= 0))
    rk, rt = _first_per_key(count_key(c, rel), c.start[rel], latest=True)
    keys, fill = _within_kept(keys, fill, rk, _lossy_ctas(c))
    free = np.full(keys.size, -1, np.int64)
    if rk.size and keys.size:
        pos = np.minimum(np.searchsorted(rk, keys), rk.size - 1)
        hit = rk[pos] == keys
        free[hit] = rt[pos[hit]]
    cta = keys >> 30
    free = np.where(free < 0, _cta_end(c)[cta] if keys.size else free, free)
    return keys, cta, fill, np.maximum(free, fill)


def step_series(key: np.ndarray, ts: np.ndarray, delta: np.ndarray):
    """Step series from +/-1 changes: per key, the value after all changes at each time
    (sorted by key, then time). Returns (key, time, value)."""
    if key.size == 0:
        return key, ts, delta
    bits = int(max(int(ts.max()) - int(ts.min()), 0)).bit_length() + 1
    o = np.lexsort(((ts - ts.min()) * 2 + (delta > 0), key)) if bits > 61 else \
        np.argsort((key.astype(np.int64) << bits) | ((ts - ts.min()) * 2 + (delta > 0)), kind="stable")
    k, t, dl = key[o], ts[o], delta[o]
    val = np.cumsum(dl)
    seg_start = np.r_[True, k[1:] != k[:-1]]
    seg = np.cumsum(seg_start) - 1
    val = val - (val - dl)[seg_start][seg]
    last = np.r_[(k[1:] != k[:-1]) | (t[1:] != t[:-1]), True]
    return k[last], t[last], val[last]


OCC_SCHEMA = pa.schema([("launch", pa.int16()), ("cta", pa.int32()), ("pipeline", pa.string()),
                        ("t_ns", pa.int64()), ("stages_full", pa.int32())])


def occupancy_series(trace_or_cols) -> pa.Table:
    """Stage occupancy per (launch, CTA, pipeline) as step points: at t_ns the pipeline holds
    stages_full stages (module docstring); the last point of each series is 0."""
    c = trace_or_cols if isinstance(trace_or_cols, AutoCols) else AutoCols.of(trace_or_cols)
    parts = []
    for p in c.pipelines():
        keys, cta, fill, free = _fills_and_frees(c, p)
        if not keys.size:
            continue
        k, t, v = step_series(np.concatenate([cta, cta]), np.concatenate([fill, free]),
                              np.concatenate([np.ones(cta.size, np.int64), -np.ones(cta.size, np.int64)]))
        parts.append(pa.table({"launch": pa.array(c.cta_keys[k, 0].astype(np.int16)),
                               "cta": pa.array(c.cta_keys[k, 1].astype(np.int32)),
                               "pipeline": pa.array([p] * k.size, pa.string()),
                               "t_ns": pa.array(t.astype(np.int64)), "stages_full": pa.array(v.astype(np.int32))},
                              schema=OCC_SCHEMA))
    return pa.concat_tables(parts) if parts else OCC_SCHEMA.empty_table()


def export_inputs(trace: Trace) -> tuple[Trace, pa.Table | None]:
    """What the exporters draw for ``trace`` (fa4trace.export.perfetto, fa4trace.export.chrome): for a bundle
    of an automatically traced kernel, the trace with its warps' roles assigned and its stage
    occupancy series (the Perfetto export's "stages held" counters); any other bundle as it is,
    and None. The exporters do no analysis of their own."""
    if not is_automatic(trace) or trace.events.num_rows == 0:
        return trace, None
    assigned = assign_roles(trace)
    return assigned, occupancy_series(assigned)


def occupancy_stats(series: pa.Table, stages: dict[str, int]) -> pa.Table:
    """Per (launch, CTA, pipeline) of :func:`occupancy_series`: window_ns, mean, max,
    full_share, empty_share (module docstring); ``stages``: pipeline -> stage count."""
    if series.num_rows == 0:
        return pa.table({"launch": pa.array([], pa.int16()), "cta": pa.array([], pa.int32()),
                         "pipeline": pa.array([], pa.string())})
    launch = series["launch"].to_numpy().astype(np.int64)
    cta = series["cta"].to_numpy().astype(np.int64)
    pipes = series["pipeline"].to_pylist()
    names = sorted(set(pipes))
    pcode = np.array([names.index(x) for x in pipes], np.int64)
    t = series["t_ns"].to_numpy()
    v = series["stages_full"].to_numpy().astype(np.int64)
    key = (launch << 48) | (cta << 16) | pcode
    new = np.r_[True, key[1:] != key[:-1]]
    gid = np.cumsum(new) - 1
    n = int(gid[-1]) + 1
    same_next = np.r_[~new[1:], False]  # the next point belongs to the same series
    dur = np.where(same_next, np.r_[np.diff(t), 0], 0).astype(np.float64)
    cap = np.array([stages.get(p, 0) for p in names], np.int64)[pcode]
    start = t[new]
    end = np.zeros(n, np.int64)
    np.maximum.at(end, gid, t)
    window = (end - start).astype(np.float64)
    area = np.bincount(gid, weights=v * dur, minlength=n)
    full = np.bincount(gid, weights=dur * ((cap > 0) & (v >= cap)), minlength=n)
    empty = np.bincount(gid, weights=dur * (v == 0), minlength=n)
    vmax = np.zeros(n, np.int64)
    np.maximum.at(vmax, gid, v)
    w = np.maximum(window, 1.0)
    first = np.flatnonzero(new)
    return pa.table({"launch": pa.array(launch[first].astype(np.int16)), "cta": pa.array(cta[first].astype(np.int32)),
                     "pipeline": pa.array([names[i] for i in pcode[first]], pa.string()),
                     "window_ns": pa.array(window.astype(np.int64)), "area": pa.array(area),
                     "mean": pa.array(area / w), "max": pa.array(vmax),
                     "full_share": pa.array(full / w), "empty_share": pa.array(empty / w)})


LAG_SCHEMA = pa.schema([("launch", pa.int16()), ("cta", pa.int32()), ("pipeline", pa.string()), ("iter", pa.int32()),
                        ("stage", pa.int32()), ("warp", pa.int16()), ("lag_ns", pa.int64())])


def pipeline_lags(trace_or_cols) -> pa.Table:
    """One row per consumer wait of a filled count: launch, cta, pipeline, iter (the count),
    stage (count % stages, -1 if the stage count is unknown), warp, lag_ns = wait end - fill."""
    c = trace_or_cols if isinstance(trace_or_cols, AutoCols) else AutoCols.of(trace_or_cols)
    parts = []
    for p in c.pipelines():
        keys, fill, _gid = fills(c, p)
        rows, pos = filled_waits(c, p, keys)
        if not rows.size:
            continue
        f = fill[pos]
        st = c.stages_of(p)
        parts.append(pa.table({
            "launch": pa.array(c.launch[rows].astype(np.int16)), "cta": pa.array(c.cta[rows].astype(np.int32)),
            "pipeline": pa.array([p] * rows.size, pa.string()), "iter": pa.array(c.iter[rows].astype(np.int32)),
            "stage": pa.array((c.iter[rows] % st if st else np.full(rows.size, -1)).astype(np.int32)),
            "warp": pa.array(c.warp[rows].astype(np.int16)), "lag_ns": pa.array((c.end[rows] - f).astype(np.int64))},
            schema=LAG_SCHEMA))
    return pa.concat_tables(parts) if parts else LAG_SCHEMA.empty_table()


def _q(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if x.size else None


def lag_stats(lags: pa.Table) -> dict:
    """{pipeline: {median_ns, p90_ns, n, per_stage: [{stage, median_ns, p90_ns, n}]}}."""
    out = {}
    if lags.num_rows == 0:
        return out
    pipes = np.asarray(lags["pipeline"].to_pylist())
    stage = lags["stage"].to_numpy()
    lag = lags["lag_ns"].to_numpy().astype(np.float64)
    for p in sorted(set(pipes.tolist())):
        m = pipes == p
        per = [{"stage": int(s), "median_ns": _q(lag[m & (stage == s)], 50), "p90_ns": _q(lag[m & (stage == s)], 90),
                "n": int((m & (stage == s)).sum())} for s in np.unique(stage[m]).tolist()]
        out[p] = {"median_ns": _q(lag[m], 50), "p90_ns": _q(lag[m], 90), "n": int(m.sum()), "per_stage": per}
    return out


# ---- summary and comparison ---------------------------------------------------------------------
def _cta_spans(c: AutoCols) -> np.ndarray:
    wr = c.is_warp_row
    first = np.full(c.n_ctas, np.iinfo(np.int64).max)
    last = np.full(c.n_ctas, np.iinfo(np.int64).min)
    np.minimum.at(first, c.cta_gid[wr], c.start[wr])
    np.maximum.at(last, c.cta_gid[wr], c.end[wr])
    return np.maximum(last - first, 0)


def median_index(values) -> int | None:
    """The index of the median of ``values``: the lower middle one of an even count (ties: the
    first), so always a real member, where np.median may fall between two."""
    values = np.asarray(values)
    if values.size == 0:
        return None
    return int(np.argsort(values, kind="stable")[(values.size - 1) // 2])


def _stats(x) -> dict | None:
    x = np.asarray(x, np.float64)
    return {"min": float(x.min()), "median": float(np.median(x)), "max": float(x.max())} if x.size else None


def summarize_kernel(trace: Trace, roles=None, launch: int | None = None) -> dict:
    """Everything `fa4trace summary --json` prints for an automatic bundle (module docstring):
    one launch's figures (the bundle's only launch, or ``launch``), or for a bundle of several
    each launch's in ``per_launch`` (fa4trace.analysis.launches.per_launch).

    ``roles``: warp index -> role (or role -> warp indices), winning over the bundle's own."""
    require_automatic(trace)
    return per_launch(trace, lambda t: _summarize_launch(t, roles), launch)


def _summarize_launch(trace: Trace, roles=None) -> dict:
    """``summarize_kernel`` of a bundle of one launch."""
    tr = assign_roles(trace, roles)
    c = AutoCols.of(tr)
    ra = tr.info.role_assignment
    decided = {"by_warp": {int(w): r for w, r in ra["by_warp"].items()},
               "source": {int(w): s for w, s in ra["source"].items()}}
    info = trace.info
    wr = c.is_warp_row
    out: dict = {
        "name": trace.name, "kernel": info.kernel_name, "arch": info.instrument.arch if info.instrument else None,
        "config": info.config, "synthetic": bool(info.synthetic), "gpu": info.gpu.name, "rows": int(c.n),
        "launches": len(info.launches) or int(np.unique(c.launch).size),
        "ctas": int(c.n_ctas), "grid_ctas": grid_ctas(info), "warps": int(wr.sum()), "warp_subset": info.warp_subset,
        "dropped": int(c.dropped.sum()), "overflowed_warps": int(((c.dropped > 0) & wr).sum()),
        "events": {c.name_dict[k]: int(v) for k, v in enumerate(np.bincount(c.name_codes, minlength=len(c.name_dict)))
                   if c.name_dict[k] != "WARP" and v},
        **ring_losses(trace),
    }
    out["total_span_ns"] = int(c.end[wr].max() - c.start[wr].min()) if wr.any() else None
    pert = perturbation(trace)
    out.update(kernel_time(info.timing, out["total_span_ns"], pert["plain_twin"], pert["launch_span_ns"]))
    by_role: dict = {}
    for w, r in decided["by_warp"].items():
        by_role.setdefault(r, {"warps": [], "source": []})
        by_role[r]["warps"].append(w)
        by_role[r]["source"].append(decided["source"][w])
    out["roles"] = {r: {"warps": v["warps"], "source": "/".join(sorted(set(v["source"])))}
                    for r, v in sorted(by_role.items(), key=lambda kv: role_rank(kv[0]))}
    fr = role_fractions(c)
    out["role_fractions"] = _fractions_overall(fr)
    out["waiting_by_event"] = waiting_by_event(c)

    occ = occupancy_series(c)
    stages = {p: c.stages_of(p) for p in c.pipelines()}
    ost = occupancy_stats(occ, stages)
    lags = lag_stats(pipeline_lags(c))
    pipes = {}
    for p in c.pipelines():
        d: dict = {"stages": stages[p] or None,
                   "counts_per_cta": _stats(np.bincount(fills(c, p)[0] >> 30, minlength=c.n_ctas))}
        if ost.num_rows:
            m = np.asarray(ost["pipeline"].to_pylist()) == p
            if m.any():
                area, win = np.asarray(ost["area"])[m], np.asarray(ost["window_ns"])[m].astype(np.float64)
                dur_full = np.asarray(ost["full_share"])[m] * np.maximum(win, 1)
                dur_empty = np.asarray(ost["empty_share"])[m] * np.maximum(win, 1)
                tot = max(win.sum(), 1.0)
                d.update({"occupancy_mean": float(area.sum() / tot), "occupancy_max": int(np.asarray(ost["max"])[m].max()),
                          "full_share": float(dur_full.sum() / tot), "empty_share": float(dur_empty.sum() / tot)})
        if p in lags:
            d.update({"lag_median_ns": lags[p]["median_ns"], "lag_p90_ns": lags[p]["p90_ns"],
                      "lag_per_stage": lags[p]["per_stage"]})
        pipes[p] = d
    out["pipelines"] = pipes

    spans = _cta_spans(c)
    typ = median_index(spans)  # the CTA of median duration
    out["typical_cta"] = int(c.cta_keys[typ, 1]) if typ is not None else None
    out["cta_span_ns"] = _stats(spans)
    chains = wait_chains(c)
    per = chain_per_cta(chains)
    out["wait_chain_ns"] = _stats(per["wait_ns"].to_numpy()) if per.num_rows else None
    out["wait_chain_steps"] = _stats(per["steps"].to_numpy()) if per.num_rows else None
    if per.num_rows:
        waits = per["wait_ns"].to_numpy()
        longest = int(np.argmax(waits))
        out["longest_chain_cta"] = int(per["cta"][longest].as_py())
        # the chain shown is the CTA's whose wait is the median of all chains: a typical one
        i = median_index(waits)
        launch, cta = int(per["launch"][i].as_py()), int(per["cta"][i].as_py())
        row = int(np.flatnonzero((c.cta_keys[:, 0] == launch) & (c.cta_keys[:, 1] == cta))[0])
        out["wait_chain"] = dict(chain_of(chains, launch, cta, span_ns=int(spans[row])), ctas=int(per.num_rows))
    out["mma_in_flight"] = _mma_flight(c, trace.vocab)
    out["perturbation"] = pert
    return json_safe(out)


def _mma_flight(c: AutoCols, vocab) -> dict | None:
    """MMA groups in flight (fa4trace.analysis.mma_flight) and how much of each named span they overlap."""
    from .mma_flight import mma_in_flight, overlap_share

    fl = mma_in_flight(c)
    if not fl.num_rows:
        return None
    d = fl.column("end_ns").to_numpy() - fl.column("start_ns").to_numpy()
    user = [e.name for e in vocab.events if e.family == "user"]
    return {"groups": int(fl.num_rows), "median_ns": float(np.median(d)),
            "overlap": {u: overlap_share(c, u, fl) for u in user}}


def chain_of(chains: pa.Table, launch: int, cta: int, *, span_ns: int | None = None) -> dict:
    """One CTA's chain as a dict: cta, steps, wait_ns, share of the CTA's span, wait_ns per
    event name, and the steps (last wait first)."""
    import pyarrow.compute as pc

    mine = chains.filter(pc.and_(pc.equal(chains["launch"], launch), pc.equal(chains["cta"], cta)))
    d = mine.to_pydict()
    by_event: dict = {}
    for name, w in zip(d["name"], d["wait_ns"]):
        by_event[name] = by_event.get(name, 0) + w
    total = sum(d["wait_ns"])
    keys = ("step", "warp", "role", "name", "iter", "start_ns", "end_ns", "wait_ns", "released_by_warp", "release_ns")
    return {"launch": launch, "cta": cta, "steps": mine.num_rows, "wait_ns": int(total),
            "share_of_cta": (total / span_ns) if span_ns else None,
            "by_event": dict(sorted(by_event.items(), key=lambda kv: -kv[1])),
            "chain": [{k: d[k][i] for k in keys} for i in range(mine.num_rows)]}


def flat_metrics(s: dict) -> dict:
    """The comparable numbers of a summary, by flat key (what `compare` puts side by side)."""
    out = {"kernel_time_ns": s.get("kernel_time_ns"), "total_span_ns": s.get("total_span_ns")}
    for r, f in (s.get("role_fractions") or {}).items():
        if r == "idle":  # idle warps are idle by definition
            continue
        for k in ("busy", "waiting", "idle"):
            out[f"role.{r}.{k}"] = f.get(k)
    for p, d in (s.get("pipelines") or {}).items():
        for k in ("occupancy_mean", "full_share", "empty_share", "lag_median_ns", "lag_p90_ns"):
            out[f"pipeline.{p}.{k}"] = d.get(k)
    out["wait_chain_ns"] = (s.get("wait_chain_ns") or {}).get("median")
    out["wait_chain_steps"] = (s.get("wait_chain_steps") or {}).get("median")
    out["dropped"] = s.get("dropped")
    return out


def metric_pairs(sa: dict, sb: dict | None = None):
    """(metric, A, B) for every flat metric (``flat_metrics``) either summary has, A's order
    first; B is None without ``sb``. What compare, its text and the viewer's table walk."""
    fa, fb = flat_metrics(sa), flat_metrics(sb) if sb else {}
    for key in dict.fromkeys([*fa, *fb]):
        a, b = fa.get(key), fb.get(key)
        if a is not None or b is not None:
            yield key, a, b


def compare_kernels(a: Trace, b: Trace, roles=None, launch_a: int | None = None, launch_b: int | None = None) -> dict:
    """Side by side summaries of two bundles of the same kernel and what changed from a to b,
    one launch of each (fa4trace.analysis.launches.launch_pairs): one comparison, or
    {"pairs": [one per pair], "launch_pairs"}."""
    for t in (a, b):
        require_automatic(t)
    ka, kb = (t.info.kernel_name for t in (a, b))
    if ka != kb and not same_device_kernels(a, b):
        raise Fa4traceError(f"A is kernel {ka}, B is kernel {kb}: compare needs two bundles of the same kernel")
    return compare_launches(a, b, launch_a, launch_b, lambda x, y: _compare_launch(x, y, roles))


def grid_ctas(info) -> int | None:
    """The CTAs of a one-launch bundle's grid, where its metadata says (CTAs timed, the grid)."""
    n = (info.launches[0].ctas_timed or info.launches[0].grid_ctas) if info.launches else None
    return int(n) if n else None


def same_device_kernels(a: Trace, b: Trace) -> bool:
    """Whether fa4trace.instrument traced the same device kernels in both bundles (under labels
    that may differ: FA4's forward named "causal" and "full" by the script that recorded it)."""
    ia, ib = a.info.instrument, b.info.instrument
    return bool(ia is not None and ib is not None and ia.kernels and ia.kernels == ib.kernels)


def _compare_launch(a: Trace, b: Trace, roles=None) -> dict:
    """``compare_kernels`` of two bundles of one launch each."""
    sa, sb = summarize_kernel(a, roles), summarize_kernel(b, roles)
    diff = {key: {"a": va, "b": vb, "delta": vb - va, "ratio": (vb / va) if va else None}
            for key, va, vb in metric_pairs(sa, sb) if va is not None and vb is not None}
    # an automatic bundle's config is what its script named (shape, tile...): any difference
    # may change the work, so every one is named
    configs = config_diff(a.info.config or {}, b.info.config or {})
    # launches of one call site may differ in shape with no config to say so: their work does
    work = work_differs([sa, sb])
    caveats = ([f"on different configs ({diff_text(configs)})"] if configs else []) + (
        [f"on different work (A, B: {work})"] if work else [])
    caveat = ", ".join(caveats) or None
    differs: dict = {"config": configs, "work": work}
    if a.info.kernel_name != b.info.kernel_name:
        differs["kernel"] = [a.info.kernel_name, b.info.kernel_name]
        differs["device_kernels"] = list(a.info.instrument.kernels)
    return json_safe({"a": sa, "b": sb, "diff": diff, "speed": speed_text(sa, sb, caveat), "differs": differs})
