"""One launch at a time: a bundle may hold several launches of one kernel, and no figure mixes them.

A bundle of ``fa4trace.instrument`` holds every launch of its kernel in the block (the events'
``launch`` column, the metadata's ``launches``, one entry per launch, ``cta_lifetimes`` per launch); two
launches may run other shapes, seconds apart. Every figure of ``summary``, ``compare``, the
viewer and ``check`` is computed on one launch: ``launch_of(trace, n)`` is the bundle cut down
to launch ``n`` (its events, its metadata entry, its CTA lifetimes, its share of the timings),
and ``per_launch`` runs a summary on each launch in turn. The only figures across launches are
``across_launches``: the median, min and max of one launch figure, labelled as such.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..format.errors import Fa4traceError
from ..trace.bundle import Trace
from ..trace.meta import BundleMeta, CtaLifetimes, LaunchMeta


def launch_ids(trace: Trace) -> list[int]:
    """The launches a bundle holds, in order: those of its events and of its metadata."""
    ids = set()
    if trace.events.num_rows:
        ids |= {int(x) for x in pc.unique(trace.events["launch"]).to_pylist()}
    info = trace.info
    for i, m in enumerate(info.launches):
        ids.add(int(m.launch if m.launch is not None else i))
    life = info.cta_lifetimes
    if life is not None and isinstance(life.launch, list):
        ids |= {int(x) for x in set(life.launch)}
    return sorted(ids)


def _launch_entry(info: BundleMeta, launch: int) -> LaunchMeta | None:
    """The metadata of ``launch`` (its ``launch``, else its position)."""
    for i, m in enumerate(info.launches):
        if int(m.launch if m.launch is not None else i) == launch:
            return m
    return None


def _pick(value, launch: int, position: int, n: int):
    """A per-launch share of a metadata value: a list with one item per launch (by its
    "launch" key, else its position) gives this launch's item; a single value of a bundle of
    one launch is the launch's own. Otherwise (one value for several launches) None."""
    if isinstance(value, list):
        keyed = [v for v in value if isinstance(v, dict) and "launch" in v]
        if keyed:
            mine = [v for v in keyed if int(v["launch"]) == launch]
            return mine[0] if mine else None
        return value[position] if len(value) == n else None
    return value if n == 1 else None


def _bundle_twin(twin, n: int):
    """A plain twin that cannot be attributed to one launch, kept with how many it covers."""
    items = twin if isinstance(twin, list) else [twin]
    items = [dict(t) for t in items if isinstance(t, dict)]
    if not items:
        return None
    covered = max([int(t.get("launches") or 0) for t in items] + [len(items), n])
    return [dict(t, over_launches=covered) for t in items] if isinstance(twin, list) else dict(items[0], over_launches=covered)


def launch_of(trace: Trace, launch: int) -> Trace:
    """The bundle cut down to one launch: its events, its metadata entry, its CTA lifetimes,
    its plain-twin timing and ``timing`` where they are per launch (a timing of several
    launches is kept, marked ``over_launches``; a ``timing`` block of a bundle of several
    launches, which no launch can claim, is dropped). Its metadata's ``launch_of``: {launch, of,
    others (the launch table's other rows)}."""
    ids = launch_ids(trace)
    if launch not in ids:
        have = ", ".join(map(str, ids)) or "none"
        raise Fa4traceError(f"{trace.name}: no launch {launch} in this bundle (its launches: {have})")
    n, position = len(ids), ids.index(launch)
    ev = trace.events
    if n > 1 and ev.num_rows:
        ev = ev.filter(pc.equal(ev["launch"], pa.scalar(launch, ev.schema.field("launch").type)))
    info = trace.info
    cut: dict = {}
    entry = _launch_entry(info, launch)
    cut["launches"] = (entry,) if entry is not None else ()
    if entry is not None:
        cut["total_dropped"] = int(entry.dropped or 0)
        if entry.has("overwritten"):
            cut["total_overwritten"] = int(entry.overwritten or 0)
        if entry.has("warp_subset"):
            cut["warp_subset"] = entry.warp_subset
    life = info.cta_lifetimes
    if life is not None and isinstance(life.launch, list):
        keep = [i for i, x in enumerate(life.launch) if int(x) == launch]
        cut["cta_lifetimes"] = CtaLifetimes.from_meta(
            {k: [v[i] for i in keep] if isinstance(v, list) and len(v) == len(life.launch) else v
             for k, v in life.to_meta().items()})
    inst = info.instrument
    if inst is not None and inst.plain_twin is not None:
        twin = inst.plain_twin
        mine = _pick(twin, launch, position, n)
        if isinstance(mine, dict) and int(mine.get("launches") or 1) > 1:
            mine = None  # one timing of several launches: not this launch's own
        cut["instrument"] = inst.updated(plain_twin=mine if mine is not None else _bundle_twin(twin, n))
    cut["launch_of"] = {"launch": launch, "of": n,
                        "others": [r for r in launch_table(trace) if r["launch"] != launch] if n > 1 else []}
    meta = info.updated(**cut).to_meta()
    if "timing" in trace.meta:  # one block, or a list of one per launch (no TimingMeta): this launch's share
        timing = _pick(trace.meta["timing"], launch, position, n)
        if timing is None:
            meta.pop("timing")
        else:
            meta["timing"] = timing
    return Trace(ev, meta)


def launch_table(trace: Trace) -> list[dict]:
    """One row per launch: launch, ctas and warps recorded, rows, span_ns (its first warp's
    start to its last warp's end), start_ns (its first warp on the bundle's time axis)."""
    ev = trace.events
    rows = []
    launch = ev["launch"].to_numpy().astype(np.int64) if ev.num_rows else np.zeros(0, np.int64)
    is_warp = pc.equal(ev["name"].cast(pa.string()), "WARP").to_numpy(zero_copy_only=False) if ev.num_rows else \
        np.zeros(0, bool)
    start, end = (ev[c].to_numpy() if ev.num_rows else np.zeros(0, np.int64) for c in ("start_ns", "end_ns"))
    cta = ev["cta"].to_numpy().astype(np.int64) if ev.num_rows else np.zeros(0, np.int64)
    for L in launch_ids(trace):
        m = (launch == L) & is_warp
        rows.append({"launch": L, "rows": int((launch == L).sum()), "ctas": int(np.unique(cta[m]).size),
                     "warps": int(m.sum()),
                     "span_ns": int(end[m].max() - start[m].min()) if m.any() else None,
                     "start_ns": int(start[m].min()) if m.any() else None})
    return rows


def across_launches(values, key: str) -> dict | None:
    """{"median", "min", "max", "n", "of"} of one figure over launches (None values left out);
    what a multi-launch summary shows as "median of N launches"."""
    v = np.asarray([x for x in values if x is not None], np.float64)
    if not v.size:
        return None
    return {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()), "n": int(v.size),
            "of": key}


# what a summary of several launches keeps at its top: names the bundle, not a launch
HEAD_KEYS = ("name", "kernel", "arch", "config", "synthetic", "gpu")


def per_launch(trace: Trace, summarize_one: Callable[[Trace], dict], launch: int | None = None) -> dict:
    """``summarize_one`` on one launch, or on each (module doc).

    ``launch`` given, or a bundle of one launch: that launch's summary, with ``launch`` (its
    index), ``launch_count`` (the bundle's) and ``other_launches`` (the launch table's other
    rows). Otherwise {``launch``: None, ``launch_count``, ``launches``, ``launch_table``,
    ``per_launch`` (one summary per launch, as above), ``across_launches`` ({figure: median,
    min, max over launches} of kernel time; None where ``launches_differ`` says how the launches
    did different work)} and the bundle's name, kernel, config, gpu."""
    ids = launch_ids(trace)
    table = launch_table(trace)
    if launch is not None or len(ids) <= 1:
        which = launch if launch is not None else (ids[0] if ids else 0)
        one = summarize_one(launch_of(trace, which) if len(ids) > 1 or launch is not None else trace)
        # a bundle already cut to one launch (launch_of) counts the launches of the one it came from
        cut = trace.info.launch_of or {}
        one.update(launch=which, launch_count=int(cut.get("of") or len(ids)))
        others = [r for r in table if r["launch"] != which] if len(ids) > 1 else list(cut.get("others") or [])
        if others:
            one["other_launches"] = others
        return one
    each = []
    for L in ids:
        s = summarize_one(launch_of(trace, L))
        s.update(launch=L, launch_count=len(ids))
        each.append(s)
    for row, s in zip(table, each):
        row["kernel_time_ns"] = s.get("kernel_time_ns")
        row["kernel_time_source"] = s.get("kernel_time_source")
    head = {k: each[0].get(k) for k in HEAD_KEYS if k in each[0]}
    differ = work_differs(each)
    across = None if differ else across_launches([s.get("kernel_time_ns") for s in each], "kernel_time_ns")
    return dict(head, launch=None, launch_count=len(ids), launches=len(ids), launch_table=table, per_launch=each,
                across_launches={"kernel_time_ns": across}, launches_differ=differ)


def work_differs(each: list[dict]) -> str | None:
    """How the launches' summaries say they did different work (their grids' CTAs, else the CTAs
    recorded; a pipeline's counts per CTA), e.g. "CTAs 132, 96; ab counts per CTA 32, 16"; None where nothing differs.
    A figure pooled over such launches (one GEMM shape and another) would mean nothing."""
    out = []
    grids = [s.get("grid_ctas") for s in each]
    ctas = grids if all(grids) else [s.get("ctas") for s in each]  # the grid, else the CTAs recorded
    if len(set(ctas)) > 1:
        out.append("CTAs " + ", ".join(str(c) for c in ctas))
    names = dict.fromkeys(p for s in each for p in (s.get("pipelines") or {}))
    for p in names:
        counts = [((s.get("pipelines") or {}).get(p) or {}).get("counts_per_cta", {}).get("median") for s in each]
        if len(set(counts)) > 1:
            out.append(f"{p} counts per CTA " + ", ".join("none" if c is None else f"{c:g}" for c in counts))
    return "; ".join(out) or None


def launch_pairs(a: Trace, b: Trace, launch_a: int | None = None, launch_b: int | None = None) -> list[tuple[int, int]]:
    """Which launch of A is compared with which of B: the ones named; a bundle of one launch
    its only one; two bundles of as many launches each, launch by launch in order. Anything
    else is ambiguous: a one-line error that says how to choose."""
    ia, ib = launch_ids(a), launch_ids(b)
    for ids, given, side in ((ia, launch_a, "A"), (ib, launch_b, "B")):
        if given is not None and given not in ids:
            raise Fa4traceError(f"{side} has no launch {given} (its launches: {', '.join(map(str, ids)) or 'none'})")
    if launch_a is None and launch_b is None and len(ia) == len(ib):
        return list(zip(ia, ib)) or [(0, 0)]
    pa_ = [launch_a] if launch_a is not None else ia if len(ia) == 1 else None
    pb_ = [launch_b] if launch_b is not None else ib if len(ib) == 1 else None
    if pa_ is None or pb_ is None:
        raise Fa4traceError(f"A holds {len(ia)} launch(es), B {len(ib)}: choose one of each to compare "
                            "(--launch-a N --launch-b M, or --launch N for both)")
    return [(pa_[0], pb_[0])]


def compare_launches(a: Trace, b: Trace, launch_a: int | None, launch_b: int | None,
                     compare_one: Callable[[Trace, Trace], dict]) -> dict:
    """``compare_one`` on each pair of ``launch_pairs``: the comparison of the one pair (with
    ``launch_a`` / ``launch_b`` added), or {"pairs": [each pair's], "launch_pairs"}."""
    pairs = launch_pairs(a, b, launch_a, launch_b)
    out = []
    for la, lb in pairs:
        c = compare_one(launch_of(a, la), launch_of(b, lb))
        c.update(launch_a=la, launch_b=lb)
        out.append(c)
    if len(out) == 1:
        return out[0]
    return {"pairs": out, "launch_pairs": [list(p) for p in pairs]}
