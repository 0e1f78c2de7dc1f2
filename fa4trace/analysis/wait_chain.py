"""The chain of waits that ends a CTA: which warp waited for which, back from the CTA's end.

Who released a wait (its *releaser*, an event of another warp of the same CTA):

* a pipeline ``wait`` of count c (a consumer waiting for a full stage): the producer's
  ``commit`` of c (the last one at or before the wait's end), or, for a pipeline that records
  no commits, the end of its ``acquire`` of c;
* a pipeline ``acquire`` of count c (the producer waiting for an empty stage): the last
  ``release`` of count c - stages by any consumer warp, at or before the acquire's end
  (counts below ``stages`` find their stage empty and have none);
* a ``barrier.sync`` of barrier id b: the last arrival at b (a ``barrier.arrive``, or the
  start of a ``barrier.sync``) at or before the sync's end;
* ``mma.wait``, ``tma.store_wait`` (the warp's own tensor-core or TMA work) and anything
  unmatched: none.

The chain starts at the warp whose last event ends last in the CTA, with the cursor at that
end, and repeats: take the warp's wait (a span of positive length) with the latest end at or
before the cursor; if its releaser fired *while it waited* (release time in (start, end]),
the chain moves to the releasing warp with the cursor at the release time, and the wait counts
``end - release`` (only that part is not covered by the releaser's own history); otherwise the
warp was not held up by another warp (its stage was already committed, or it waited for its
own MMA or store) and the chain stays on it with the cursor at the wait's start, the whole
wait counting. It stops when the warp has no earlier wait. The counted parts are disjoint and
lie on one causal path, so the chain's ``wait_ns`` (their sum) is at most the CTA's time: the
waiting that the CTA's end could not avoid, and which warps and events it went through.
A wait enters a chain at most once (only ties to the ns could bring it back).

Vectorized over CTAs: every CTA's chain advances one step per iteration.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .autoevents import AutoCols
from .warptimes import T_BITS


def _composite(cta_gid, resource, it) -> np.ndarray:
    """One int64 per (CTA, resource code, iter >= -1)."""
    return (cta_gid.astype(np.int64) << 30) | (resource.astype(np.int64) << 21) | (it.astype(np.int64) + 1)


def latest_at_or_before(src_key, src_t, src_gid, q_key, q_t):
    """For each query, the latest source event with the same key and time <= the query's time:
    (time, warp gid), -1 where there is none."""
    out_t = np.full(q_key.size, -1, np.int64)
    out_g = np.full(q_key.size, -1, np.int64)
    if src_key.size == 0 or q_key.size == 0:
        return out_t, out_g
    _, inv = np.unique(np.concatenate([src_key, q_key]), return_inverse=True)
    inv = inv.reshape(-1)
    sk, qk = inv[:src_key.size], inv[src_key.size:]
    base = int(min(src_t.min(), q_t.min()))
    order = np.lexsort((src_t, sk))
    packed = (sk[order] << T_BITS) | (src_t[order] - base)
    pos = np.searchsorted(packed, (qk << T_BITS) | (q_t - base), side="right") - 1
    ok = pos >= 0
    ok[ok] = sk[order][pos[ok]] == qk[ok]
    out_t[ok] = src_t[order][pos[ok]]
    out_g[ok] = src_gid[order][pos[ok]]
    return out_t, out_g


def releasers(c: AutoCols) -> tuple[np.ndarray, np.ndarray]:
    """Per row: (release time, releasing warp gid) of each wait, -1 where it has none or the
    release did not come while it waited (see the module docstring)."""
    rel_t = np.full(c.n, -1, np.int64)
    rel_g = np.full(c.n, -1, np.int64)
    if c.n == 0:
        return rel_t, rel_g
    # pipeline wait <- commit (or acquire end where the pipeline records no commits)
    waits = np.flatnonzero(c.where("pipeline", "wait") & (c.kind == 0))
    commits = c.where("pipeline", "commit")
    no_commit = np.setdiff1d(np.unique(c.resource[c.where("pipeline")]), np.unique(c.resource[commits]))
    acq = c.where("pipeline", "acquire") & (c.kind == 0)
    src = np.flatnonzero(commits | (acq & np.isin(c.resource, no_commit)))
    src_t = np.where(c.kind[src] == 0, c.end[src], c.start[src])
    t, g = latest_at_or_before(_composite(c.cta_gid[src], c.resource[src], c.iter[src]), src_t, c.warp_gid[src],
                               _composite(c.cta_gid[waits], c.resource[waits], c.iter[waits]), c.end[waits])
    rel_t[waits], rel_g[waits] = t, g
    # pipeline acquire of c <- last release of c - stages
    acqs = np.flatnonzero(acq & (c.stages > 0) & (c.iter >= c.stages))
    rel = np.flatnonzero(c.where("pipeline", "release"))
    t, g = latest_at_or_before(_composite(c.cta_gid[rel], c.resource[rel], c.iter[rel]), c.start[rel], c.warp_gid[rel],
                               _composite(c.cta_gid[acqs], c.resource[acqs], c.iter[acqs] - c.stages[acqs]), c.end[acqs])
    rel_t[acqs], rel_g[acqs] = t, g
    # barrier sync <- last arrival (arrive instant or sync start) at the same barrier id
    bar = c.where("barrier") & (c.iter >= 0)
    syncs = np.flatnonzero(bar & c.where("barrier", "sync") & (c.kind == 0))
    arrivals = np.flatnonzero(bar & (c.where("barrier", "arrive") | c.where("barrier", "sync")))
    zero_a, zero_s = np.zeros(arrivals.size, np.int64), np.zeros(syncs.size, np.int64)
    t, g = latest_at_or_before(_composite(c.cta_gid[arrivals], zero_a, c.iter[arrivals]), c.start[arrivals],
                               c.warp_gid[arrivals], _composite(c.cta_gid[syncs], zero_s, c.iter[syncs]), c.end[syncs])
    rel_t[syncs], rel_g[syncs] = t, g
    # only a release by another warp that came while the warp waited hands the chain over
    held = (rel_t > c.start) & (rel_t <= c.end) & (rel_g >= 0) & (rel_g != c.warp_gid)
    rel_t[~held], rel_g[~held] = -1, -1
    return rel_t, rel_g


CHAIN_SCHEMA = pa.schema([
    ("launch", pa.int16()), ("cta", pa.int32()), ("step", pa.int32()), ("warp", pa.int16()),
    ("role", pa.string()), ("name", pa.string()), ("iter", pa.int32()), ("start_ns", pa.int64()),
    ("end_ns", pa.int64()), ("wait_ns", pa.int64()), ("released_by_warp", pa.int16()), ("release_ns", pa.int64()),
])


def wait_chains(trace_or_cols) -> pa.Table:
    """Every CTA's chain (see the module docstring), one row per wait, step 0 = the last:
    launch, cta, step, warp, role, name, iter, start_ns, end_ns, wait_ns (the part that
    counts), released_by_warp and release_ns (-1 where the chain stayed on the warp)."""
    c = trace_or_cols if isinstance(trace_or_cols, AutoCols) else AutoCols.of(trace_or_cols)
    if c.n == 0:
        return CHAIN_SCHEMA.empty_table()
    rel_t, rel_g = releasers(c)
    w = np.flatnonzero(c.is_wait & (c.end > c.start))
    ev = np.flatnonzero(~c.is_warp_row)
    if w.size == 0 or ev.size == 0:
        return CHAIN_SCHEMA.empty_table()
    # start: per CTA, the warp whose last event ends last
    last = np.full(c.n_warps, -1, np.int64)
    np.maximum.at(last, c.warp_gid[ev], c.end[ev])
    has = last >= 0
    gids = np.flatnonzero(has)
    order = np.lexsort((gids, last[gids], c.cta_of_warp[gids]))  # per CTA the latest end last (ties: highest warp)
    g_sorted = gids[order]
    cta_s = c.cta_of_warp[g_sorted]
    is_last = np.r_[cta_s[1:] != cta_s[:-1], True]
    cur = g_sorted[is_last]
    cursor = last[cur]
    # waits sorted by (warp gid, end, start): the latest end <= cursor is one searchsorted away
    base = int(min(c.start[w].min(), cursor.min()))
    wo = w[np.lexsort((c.start[w], c.end[w], c.warp_gid[w]))]
    packed = (c.warp_gid[wo] << T_BITS) | (c.end[wo] - base)
    visited = np.zeros(wo.size, bool)
    steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    step = 0
    while cur.size:
        pos = np.searchsorted(packed, (cur << T_BITS) | (cursor - base), side="right") - 1
        ok = pos >= 0
        ok[ok] = c.warp_gid[wo[pos[ok]]] == cur[ok]
        ok[ok] = ~visited[pos[ok]]
        pos, cur = pos[ok], cur[ok]
        if not pos.size:
            break
        visited[pos] = True
        row = wo[pos]
        jump = rel_g[row] >= 0
        counted = np.where(jump, c.end[row] - rel_t[row], c.end[row] - c.start[row])
        steps.append((row, np.full(row.size, step, np.int64), counted, jump))
        cursor = np.where(jump, rel_t[row], c.start[row])
        cur = np.where(jump, rel_g[row], cur)
        step += 1
    if not steps:
        return CHAIN_SCHEMA.empty_table()
    row = np.concatenate([s[0] for s in steps])
    stp = np.concatenate([s[1] for s in steps])
    counted = np.concatenate([s[2] for s in steps])
    jump = np.concatenate([s[3] for s in steps])
    o = np.lexsort((stp, c.cta_gid[row]))
    row, stp, counted, jump = row[o], stp[o], counted[o], jump[o]
    rel_warp = np.where(jump, c.warp_keys[np.maximum(rel_g[row], 0), 2], -1)
    return pa.table({
        "launch": pa.array(c.launch[row].astype(np.int16)), "cta": pa.array(c.cta[row].astype(np.int32)),
        "step": pa.array(stp.astype(np.int32)), "warp": pa.array(c.warp[row].astype(np.int16)),
        "role": pa.array([c.role_dict[k] for k in c.role_codes[row]] if c.role_dict else [""] * row.size, pa.string()),
        "name": pa.array([c.name_dict[k] for k in c.name_codes[row]], pa.string()),
        "iter": pa.array(c.iter[row].astype(np.int32)),
        "start_ns": pa.array(c.start[row]), "end_ns": pa.array(c.end[row]),
        "wait_ns": pa.array(counted.astype(np.int64)),
        "released_by_warp": pa.array(rel_warp.astype(np.int16)),
        "release_ns": pa.array(np.where(jump, rel_t[row], -1).astype(np.int64)),
    }, schema=CHAIN_SCHEMA)


def chain_per_cta(chains: pa.Table) -> pa.Table:
    """Per (launch, CTA): steps, wait_ns (sum of the counted parts), warps the chain visits."""
    if chains.num_rows == 0:
        return pa.table({"launch": pa.array([], pa.int16()), "cta": pa.array([], pa.int32()),
                         "steps": pa.array([], pa.int64()), "wait_ns": pa.array([], pa.int64()),
                         "warps": pa.array([], pa.int64())})
    return (chains.group_by(["launch", "cta"], use_threads=False)
            .aggregate([("step", "count"), ("wait_ns", "sum"), ("warp", "count_distinct")])
            .rename_columns(["launch", "cta", "steps", "wait_ns", "warps"])
            .sort_by([("launch", "ascending"), ("cta", "ascending")]))
