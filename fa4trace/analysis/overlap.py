"""What a trace says about overlap: the numbers behind `summary`, `compare` and the app.

Definitions (all per CTA, then aggregated over CTAs weighted by time):

* QK∥SOFTMAX overlap = |∪SOFTMAX ∩ ∪QK| / |∪SOFTMAX|, unions over the CTA's warps; the same
  for PV. 1.0 means every nanosecond of softmax ran while a QK MMA was in flight.
* hidden softmax per iteration = per warp and KV block, the ns of SOFTMAX(i) during which
  any QK or PV of that warp was in flight (median over warps and blocks).
* period = median gap between the starts of consecutive SOFTMAX blocks of one warp.
* tensor-core busy = |∪(QK ∪ PV)| / CTA lifetime.
* KV stream = blocks consumed over time against a perfect stream at the steady rate
  (``stream_profile``): what the start, the end and the work after the stream cost.
* kernel span = last warp end − first warp start of a launch (recorded warps only; a
  bundle recorded for a CTA subset says so in its metadata).
* every figure is one launch's: a bundle of several launches is summarized launch by launch
  (fa4trace.analysis.launches), and compared one launch of A against one of B.
* kernel time (``kernel_time_ns``, bandwidth uses it), from the first of these the bundle's
  ``timing`` has, named by ``kernel_time_kind`` and ``kernel_time_source``:
  ``bench_us``: the untraced kernel in the cold-L2 CUDA-graph benchmark (fresh inputs per
  launch, as `fa4trace bench` times it); ``kernel_us``: the untraced kernel replayed on the
  recorded inputs (part of the KV stays in L2, so it reads faster than the benchmark); else
  the trace span. ``traced_us`` (the recorded launch, same inputs) is compared with
  ``kernel_us``, never with the benchmark time.

Everything is vectorized over groups (sweeps over sorted boundaries), so a 1 M-event bundle
summarizes in well under a second.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from ..format.errors import Fa4traceError
from ..trace.bundle import Trace
from ..trace.meta import TimingMeta
from .fidelity import perturbation
from .launches import compare_launches, per_launch
from .words import config_value

OVERLAP_PAIRS = (("QK", "SOFTMAX"), ("PV", "SOFTMAX"))
ITER_EVENTS = ("LOAD_K", "LOAD_V", "QK", "SOFTMAX", "CORRECTION", "PV")
DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4, "fp8": 1}


# ---- columns as numpy ----------------------------------------------------------------------
class Columns:
    """The columns analysis needs, as numpy arrays (names decoded once)."""

    def __init__(self, t: pa.Table):
        self.n = t.num_rows
        self.launch = t["launch"].to_numpy().astype(np.int64)
        self.cta = t["cta"].to_numpy().astype(np.int64)
        self.warp = t["warp"].to_numpy().astype(np.int64)
        self.sm = t["sm"].to_numpy().astype(np.int64)
        self.iter = t["iter"].to_numpy().astype(np.int64)
        self.start = t["start_ns"].to_numpy()
        self.end = t["end_ns"].to_numpy()
        name = t["name"].combine_chunks() if t.num_rows else pa.array([], pa.dictionary(pa.int16(), pa.string()))
        self.name_codes = name.indices.to_numpy(zero_copy_only=False).astype(np.int64) if t.num_rows else np.zeros(0, np.int64)
        self.name_dict = name.dictionary.to_pylist() if t.num_rows else []
        role = t["role"].combine_chunks() if t.num_rows else None
        self.role_codes = role.indices.to_numpy(zero_copy_only=False).astype(np.int64) if t.num_rows else np.zeros(0, np.int64)
        self.role_dict = role.dictionary.to_pylist() if t.num_rows else []
        self.dropped = t["dropped"].to_numpy().astype(np.int64)

    def mask(self, name: str) -> np.ndarray:
        if name not in self.name_dict:
            return np.zeros(self.n, bool)
        return self.name_codes == self.name_dict.index(name)


def _columns(trace_or_table) -> Columns:
    t = trace_or_table.events if isinstance(trace_or_table, Trace) else trace_or_table
    return Columns(t)


# ---- interval algebra, vectorized over groups ---------------------------------------------
def union_length(group: np.ndarray, start: np.ndarray, end: np.ndarray, n_groups: int) -> np.ndarray:
    """|∪ intervals| per group id in [0, n_groups)."""
    return overlap_length(group, start, end, group[:0], start[:0], end[:0], n_groups)[0]


def overlap_length(ga, sa, ea, gb, sb, eb, n_groups):
    """Per group: (|∪A|, |∪B|, |∪A ∩ ∪B|) by one sweep over all boundaries.

    Boundaries are sorted by (group, time); running counts of open A and B intervals reset
    naturally at group edges because each group's +1/-1 sum to zero.
    """
    g = np.concatenate([ga, ga, gb, gb]).astype(np.int64)
    t = np.concatenate([sa, ea, sb, eb]).astype(np.int64)
    da = np.concatenate([np.ones(ga.size, np.int64), -np.ones(ga.size, np.int64),
                         np.zeros(2 * gb.size, np.int64)])
    db = np.concatenate([np.zeros(2 * ga.size, np.int64), np.ones(gb.size, np.int64),
                         -np.ones(gb.size, np.int64)])
    out = np.zeros((3, n_groups), np.float64)
    if g.size == 0:
        return out
    order = _argsort_by(g, t)
    g, t, da, db = g[order], t[order], da[order], db[order]
    ca = np.cumsum(da)
    cb = np.cumsum(db)
    seg = np.diff(t).astype(np.float64)
    same = g[1:] == g[:-1]
    seg = np.where(same, seg, 0.0)
    in_a = ca[:-1] > 0
    in_b = cb[:-1] > 0
    gg = g[:-1]
    out[0] = np.bincount(gg, weights=seg * in_a, minlength=n_groups)
    out[1] = np.bincount(gg, weights=seg * in_b, minlength=n_groups)
    out[2] = np.bincount(gg, weights=seg * (in_a & in_b), minlength=n_groups)
    return out


_TIME_BITS = 41  # ns offsets below 2**41 (~36 min) pack beside a group id in one int64


def _argsort_by(g: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Order by (group, time) with one int64 sort instead of a lexsort."""
    t = t.astype(np.int64)
    lo = int(t.min()) if t.size else 0
    if t.size and int(t.max()) - lo < (1 << _TIME_BITS) and int(g.max()) < (1 << (62 - _TIME_BITS)):
        return np.argsort((g.astype(np.int64) << _TIME_BITS) | (t - lo), kind="stable")
    return np.lexsort((t, g))


# Bits per key field when packing a tuple of small ints into one int64 sort key.
_KEY_BITS = (15, 31, 16)


def group_ids(*keys: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
    """Dense ids for rows by a tuple of int keys; returns (ids, n, unique key rows).

    Keys are packed into one int64 (launch, cta, warp... fit easily); already-sorted input
    (the decoder writes rows in (launch, cta, warp) order) takes an O(n) path.
    """
    if keys[0].size == 0:
        return np.zeros(0, np.int64), 0, np.zeros((0, len(keys)), np.int64)
    bits = _KEY_BITS[-len(keys):] if len(keys) <= len(_KEY_BITS) else None
    if bits is not None and all(int(k.min()) >= 0 and int(k.max()) < (1 << b) for k, b in zip(keys, bits)):
        packed = np.zeros(keys[0].size, np.int64)
        for k, b in zip(keys, bits):
            packed = (packed << b) | k.astype(np.int64)
        if packed.size < 2 or bool(np.all(packed[1:] >= packed[:-1])):
            change = np.r_[True, packed[1:] != packed[:-1]]
            ids = np.cumsum(change) - 1
            uniq_packed = packed[change]
        else:
            uniq_packed, ids = np.unique(packed, return_inverse=True)
        uniq = np.zeros((uniq_packed.size, len(keys)), np.int64)
        rest = uniq_packed.copy()
        for j in range(len(keys) - 1, -1, -1):
            uniq[:, j] = rest & ((1 << bits[j]) - 1)
            rest >>= bits[j]
        return ids.reshape(-1), uniq.shape[0], uniq
    stacked = np.stack(keys, axis=1)
    uniq, ids = np.unique(stacked, axis=0, return_inverse=True)
    return ids.reshape(-1), uniq.shape[0], uniq


# ---- per-CTA table ------------------------------------------------------------------------
def per_cta(trace: Trace) -> pa.Table:
    """One row per (launch, CTA): span, overlaps, tensor-core busy, blocks, dropped."""
    return _per_cta(_columns(trace))


def _per_cta(c: Columns) -> pa.Table:
    warp_rows = c.mask("WARP")
    gid_all, n, keys = group_ids(c.launch, c.cta)
    if n == 0:
        return pa.table({"launch": pa.array([], pa.int16()), "cta": pa.array([], pa.int32())})
    first = np.full(n, np.iinfo(np.int64).max)
    last = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(first, gid_all[warp_rows], c.start[warp_rows])
    np.maximum.at(last, gid_all[warp_rows], c.end[warp_rows])
    sm = np.zeros(n, np.int64)
    sm[gid_all] = c.sm
    cols = {"launch": keys[:, 0].astype(np.int16), "cta": keys[:, 1].astype(np.int32),
            "sm": sm.astype(np.int16), "span_ns": (last - first).astype(np.int64),
            "start_ns": first, "end_ns": last}
    for a, b in OVERLAP_PAIRS:
        ma, mb = c.mask(a), c.mask(b)
        la, lb, inter = overlap_length(gid_all[ma], c.start[ma], c.end[ma],
                                       gid_all[mb], c.start[mb], c.end[mb], n)
        cols[f"{b.lower()}_ns"] = lb
        cols[f"{a.lower()}_ns"] = la
        cols[f"{a.lower()}_{b.lower()}_overlap"] = np.where(lb > 0, inter / np.maximum(lb, 1), np.nan)
    mqk, mpv = c.mask("QK"), c.mask("PV")
    mtc = mqk | mpv
    tc = union_length(gid_all[mtc], c.start[mtc], c.end[mtc], n)
    has_tc = np.bincount(gid_all[mtc], minlength=n) > 0  # no MMA events: not an attention CTA
    cols["tensor_core_busy"] = np.where((cols["span_ns"] > 0) & has_tc, tc / np.maximum(cols["span_ns"], 1), np.nan)
    # The mainloop of a CTA: first MMA issue to last MMA retire (-1 where a CTA has none).
    ml_first = np.full(n, np.iinfo(np.int64).max)
    ml_last = np.full(n, -1, np.int64)
    np.minimum.at(ml_first, gid_all[mtc], c.start[mtc])
    np.maximum.at(ml_last, gid_all[mtc], c.end[mtc])
    cols["mainloop_start_ns"] = np.where(has_tc, ml_first, -1)
    cols["mainloop_end_ns"] = ml_last
    msm = c.mask("SOFTMAX")
    blocks = np.zeros(n, np.int64)
    if msm.any():
        # KV blocks a CTA processed = distinct softmax iterations.
        gk, _, uk = group_ids(gid_all[msm], c.iter[msm])
        blocks = np.bincount(uk[:, 0], minlength=n)
    cols["kv_blocks"] = blocks
    cols["dropped"] = np.bincount(gid_all, weights=c.dropped, minlength=n).astype(np.int64)
    return pa.table(cols)


# ---- per-iteration table ------------------------------------------------------------------
def per_iteration(trace: Trace, *, events=ITER_EVENTS) -> pa.Table:
    """Median duration per (KV block, event) over warps and CTAs, plus hidden softmax."""
    c = _columns(trace)
    rows = {"iter": [], "name": [], "median_ns": [], "count": []}
    for name in events:
        m = c.mask(name) & (c.iter >= 0)
        if not m.any():
            continue
        it = c.iter[m]
        dur = (c.end[m] - c.start[m]).astype(np.float64)
        order = np.lexsort((dur, it))
        it, dur = it[order], dur[order]
        uniq, first, counts = np.unique(it, return_index=True, return_counts=True)
        # median of each sorted run
        lo = first + (counts - 1) // 2
        hi = first + counts // 2
        med = (dur[lo] + dur[hi]) / 2
        rows["iter"] += uniq.tolist()
        rows["name"] += [name] * uniq.size
        rows["median_ns"] += med.tolist()
        rows["count"] += counts.tolist()
    hidden = _hidden_softmax(c)
    if hidden is not None:
        it, med, cnt = hidden
        rows["iter"] += it.tolist()
        rows["name"] += ["SOFTMAX_HIDDEN"] * it.size
        rows["median_ns"] += med.tolist()
        rows["count"] += cnt.tolist()
    return pa.table({"iter": pa.array(rows["iter"], pa.int32()), "name": pa.array(rows["name"]),
                     "median_ns": pa.array(rows["median_ns"], pa.float64()),
                     "count": pa.array(rows["count"], pa.int64())})


def _hidden_softmax(c: Columns):
    """Per (warp, SOFTMAX block): ns of it covered by that warp's own QK/PV in flight."""
    msm = c.mask("SOFTMAX") & (c.iter >= 0)
    mtc = c.mask("QK") | c.mask("PV")
    if not msm.any() or not mtc.any():
        return None
    # One group per softmax row, intersected with the union of its warp's MMA spans.
    sm_idx = np.flatnonzero(msm)
    wid, nw, _ = group_ids(c.launch, c.cta, c.warp)
    # Expand each MMA span to the softmax rows of its warp it touches: do it by sweeping
    # per warp with softmax rows as group A and the warp's MMA spans as group B.
    ga = wid[sm_idx]
    tc_idx = np.flatnonzero(mtc)
    gb = wid[tc_idx]
    # Softmax spans of one warp are disjoint, so per-warp intersection can be split per
    # softmax row by sweeping once with the row id carried on A boundaries.
    g = np.concatenate([ga, ga, gb, gb])
    t = np.concatenate([c.start[sm_idx], c.end[sm_idx], c.start[tc_idx], c.end[tc_idx]])
    da = np.concatenate([np.ones(ga.size, np.int64), -np.ones(ga.size, np.int64), np.zeros(2 * gb.size, np.int64)])
    db = np.concatenate([np.zeros(2 * ga.size, np.int64), np.ones(gb.size, np.int64), -np.ones(gb.size, np.int64)])
    rid = np.concatenate([np.arange(ga.size), np.arange(ga.size), np.full(2 * gb.size, -1)])
    order = _argsort_by(g, t)
    g, t, da, db, rid = g[order], t[order], da[order], db[order], rid[order]
    ca, cb = np.cumsum(da), np.cumsum(db)
    # The softmax row open in each segment: forward-fill row ids from A starts.
    open_row = np.where(da == 1, rid, -1)
    idx = np.where(open_row >= 0, np.arange(open_row.size), 0)
    np.maximum.accumulate(idx, out=idx)
    cur = open_row[idx]
    seg = np.diff(t).astype(np.float64)
    active = (g[1:] == g[:-1]) & (ca[:-1] > 0) & (cb[:-1] > 0) & (cur[:-1] >= 0)
    hidden = np.bincount(cur[:-1][active], weights=seg[active], minlength=ga.size)
    it = c.iter[sm_idx]
    order = np.lexsort((hidden, it))
    it, hidden = it[order], hidden[order]
    uniq, first, counts = np.unique(it, return_index=True, return_counts=True)
    med = (hidden[first + (counts - 1) // 2] + hidden[first + counts // 2]) / 2
    return uniq, med, counts


def _median_period(c: Columns) -> float | None:
    m = c.mask("SOFTMAX") & (c.iter >= 0)
    if m.sum() < 2:
        return None
    wid, _, _ = group_ids(c.launch[m], c.cta[m], c.warp[m])
    st = c.start[m]
    order = _argsort_by(wid, st)
    wid, st = wid[order], st[order]
    d = np.diff(st)
    same = wid[1:] == wid[:-1]
    return float(np.median(d[same])) if same.any() else None


def _median_dur(c: Columns, name: str) -> float | None:
    m = c.mask(name)
    return float(np.median(c.end[m] - c.start[m])) if m.any() else None


# ---- summary and comparison ---------------------------------------------------------------
def attention_bytes(config: dict) -> int | None:
    """Bytes a decode-attention call must move: Q + K + V + O, from the bundle's config."""
    try:
        b, sq, sk = int(config["b"]), int(config.get("sq", 1)), int(config["sk"])
        hq, hkv, d = int(config["hq"]), int(config["hkv"]), int(config["d"])
        eb = DTYPE_BYTES[str(config.get("dtype", "bf16"))]
    except (KeyError, TypeError, ValueError):
        return None
    return eb * (2 * b * sq * hq * d + 2 * b * sk * hkv * d)


def _launch_bounds(c: Columns) -> dict[int, tuple[int, int]]:
    """Per launch: (first warp's start, last warp's end), from the WARP rows."""
    warp_rows = c.mask("WARP")
    out = {}
    for L in np.unique(c.launch[warp_rows]):
        m = warp_rows & (c.launch == L)
        out[int(L)] = (int(c.start[m].min()), int(c.end[m].max()))
    return out


def kv_block_bytes(config: dict) -> int | None:
    """Bytes of one KV block as a CTA consumes it (a K tile + a V tile of one KV head), from the
    bundle's config (``tile_n``, or the N of ``tile`` = [M, N] as the FA4 adapter writes it,
    and ``d``/``head_dim``)."""
    try:
        tile_n = config["tile_n"] if "tile_n" in config else config["tile"][1]
        tile_n, d = int(tile_n), int(config.get("d", config.get("head_dim")))
        eb = DTYPE_BYTES[str(config.get("dtype", "bf16"))]
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return 2 * tile_n * d * eb


STREAM_BINS = 40


def stream_profile(c: Columns, block_bytes: int | None, bounds: dict[int, tuple[int, int]]) -> dict:
    """The KV stream over time, against a perfect stream at its own steady rate.

    A KV block counts as consumed when the PV span of the block starts in the lowest recorded
    consumer warp of its CTA (its V tile has landed; in a memory-bound kernel the consumer
    keeps up, so this follows the bytes' arrival). Per launch, from the first warp's start:

    * ``stream_tbps``: the steady rate, blocks consumed between the 25% and 75% marks over the
      time between them;
    * ``stream_start_loss_ns`` / ``stream_end_loss_ns``: how much longer the first / last
      quarter of the blocks took than at the steady rate (launch, first loads, ramp-up /
      the last CTAs draining);
    * ``after_stream_ns``: from the last block consumed to the last warp's end (the last
      block's MMAs, epilogue, split combine);
    * ``stream_series``: [start ns, TB/s] per time bin of the first launch, for plots.

    Why this and not per-SM balance alone: on the H200 the SMs share the DRAM bandwidth, so
    when the fast SMs finish early the others speed up (traces/README.md); only a dip of the
    *total* rate costs time. Medians over launches; {} without PV spans or a block size.
    ``bounds``: ``_launch_bounds(c)``.
    """
    if not block_bytes:
        return {}
    pv = c.mask("PV")
    if not pv.any():
        return {}
    # lowest recorded consumer warp per (launch, cta): one event per KV block per CTA
    gid, n, keys = group_ids(c.launch[pv], c.cta[pv])
    low = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(low, gid, c.warp[pv])
    sel = c.warp[pv] == low[gid]
    launch, t = c.launch[pv][sel], c.start[pv][sel]
    rows = []
    series = None
    for L in np.unique(launch):
        if int(L) not in bounds:
            continue
        t0, t_end = bounds[int(L)]
        times = np.sort(t[launch == L] - t0).astype(np.float64)
        nb = times.size
        if nb < 8:
            continue
        q1, q3 = times[nb // 4], times[(3 * nb) // 4]
        if q3 <= q1:
            continue
        rate = ((3 * nb) // 4 - nb // 4) * block_bytes / (q3 - q1)  # bytes per ns
        quarter = 0.25 * nb * block_bytes / rate
        rows.append((rate / 1e3, q1 - quarter, (times[-1] - q3) - quarter, (t_end - t0) - times[-1]))
        if series is None:
            edges = np.linspace(0.0, times[-1] + 1.0, STREAM_BINS + 1)
            h, _ = np.histogram(times, edges)
            width = edges[1] - edges[0]
            series = [[float(edges[i]), float(h[i] * block_bytes / width / 1e3)] for i in range(STREAM_BINS)]
    if not rows:
        return {}
    r = np.median(np.array(rows), axis=0)
    return {"stream_tbps": float(r[0]), "stream_start_loss_ns": float(r[1]), "stream_end_loss_ns": float(r[2]),
            "after_stream_ns": float(r[3]), "stream_series": series}


# (key, event, edge, which of the CTA's records: the first, or the last, e.g. the last warp
# to have stored its part of Q)
STARTUP_MARKS = (("startup_first_load_ns", "LOAD_K", "end", "first"),
                 ("startup_q_ready_ns", "LOAD_Q", "end", "last"),
                 ("startup_first_qk_ns", "QK", "start", "first"),
                 ("startup_first_pv_ns", "PV", "start", "first"))


def startup_profile(c: Columns, bounds: dict[int, tuple[int, int]]) -> dict:
    """How long a CTA takes to get going: median over CTAs of the first LOAD_K issued (its
    span's end), Q in shared memory (the last warp's LOAD_Q end), the first QK issued and the
    first PV issued, from the start of the launch (its first warp). {} without those events.
    The first QK waits for K0 to land, so the gap between the first load and it is the first
    block's latency under the launch's burst of requests, unless Q comes later: in our decode
    kernel the consumers' launch-time KV prefetch stalls them before they store Q.
    ``bounds``: ``_launch_bounds(c)``."""
    if not bounds:
        return {}
    t0 = {L: start for L, (start, _end) in bounds.items()}
    out = {}
    for key, name, edge, which in STARTUP_MARKS:
        m = c.mask(name)
        if not m.any():
            continue
        gid, n, keys = group_ids(c.launch[m], c.cta[m])
        t = (c.end if edge == "end" else c.start)[m]
        if which == "first":
            mark = np.full(n, np.iinfo(np.int64).max)
            np.minimum.at(mark, gid, t)
        else:
            mark = np.full(n, np.iinfo(np.int64).min)
            np.maximum.at(mark, gid, t)
        rel = mark - np.array([t0.get(int(L), 0) for L in keys[:, 0]])
        out[key] = float(np.median(rel))
    return out


def ring_losses(trace: Trace) -> dict:
    """Where warps recorded into shared-memory rings (the launches' decode summaries say so):
    ``ring`` (records per warp), ``overwritten`` (the oldest records lost) and
    ``overwritten_warps``; {} for a bundle without rings."""
    launches = [m for m in trace.info.launches if m.ring]
    if not launches:
        return {}
    return {"ring": max(int(m.ring) for m in launches),
            "overwritten": sum(int(m.overwritten or 0) for m in launches),
            "overwritten_warps": sum(int(m.overwritten_warps or 0) for m in launches)}


def summarize(trace: Trace, launch: int | None = None) -> dict:
    """Everything `fa4trace summary --json` prints; the app shows the same numbers. One launch's
    figures (the bundle's only launch, or ``launch``), or for a bundle of several each launch's
    in ``per_launch`` (fa4trace.analysis.launches.per_launch): no figure mixes launches."""
    return per_launch(trace, _summarize_launch, launch)


def _summarize_launch(trace: Trace) -> dict:
    """``summarize`` of a bundle of one launch."""
    c = _columns(trace)
    ctas = _per_cta(c)  # the columns are decoded once per summary
    info = trace.info
    out: dict = {
        "name": trace.name,
        "kernel": info.kernel,
        "config": info.config,
        "synthetic": bool(info.synthetic),
        "gpu": info.gpu.name,
        "rows": int(c.n),
        "launches": len(info.launches) or int(np.unique(c.launch).size),
        "ctas": int(ctas.num_rows),
        "warps": int(c.mask("WARP").sum()),
        "cta_subset": bool(info.cta_subset),
        "warp_subset": info.warp_subset,
        "dropped": int(c.dropped.sum()),
        "overflowed_warps": int(((c.dropped > 0) & c.mask("WARP")).sum()),
        "events": {c.name_dict[k]: int(v) for k, v in enumerate(np.bincount(c.name_codes, minlength=len(c.name_dict)))
                   if c.name_dict[k] != "WARP" and v},
        **ring_losses(trace),
    }
    warp_rows = c.mask("WARP")
    bounds = _launch_bounds(c)
    span = {L: end - start for L, (start, end) in bounds.items()}
    out["kernel_span_ns"] = next(iter(span.values())) if len(span) == 1 else span
    out["total_span_ns"] = int(c.end[warp_rows].max() - c.start[warp_rows].min()) if warp_rows.any() else None
    pert = perturbation(trace)
    out.update(kernel_time(info.timing, out["total_span_ns"], pert["plain_twin"], pert["launch_span_ns"]))
    kernel_ns = out["kernel_time_ns"]
    nbytes = attention_bytes(out["config"])
    out["bytes"] = nbytes
    out["bandwidth_tbps"] = (nbytes / kernel_ns / 1e3) if nbytes and kernel_ns else None

    for a, b in OVERLAP_PAIRS:
        key = f"{a.lower()}_{b.lower()}"
        frac = np.asarray(ctas[f"{key}_overlap"]) if f"{key}_overlap" in ctas.column_names else np.zeros(0)
        lb = np.asarray(ctas[f"{b.lower()}_ns"]) if f"{b.lower()}_ns" in ctas.column_names else np.zeros(0)
        valid = ~np.isnan(frac)
        out[f"{key}_overlap"] = float(np.sum(frac[valid] * lb[valid]) / np.sum(lb[valid])) if valid.any() and lb[valid].sum() > 0 else None
        out[f"{key}_overlap_cta_median"] = float(np.median(frac[valid])) if valid.any() else None
    tc = np.asarray(ctas["tensor_core_busy"]) if "tensor_core_busy" in ctas.column_names else np.zeros(0)
    out["tensor_core_busy"] = float(np.nanmean(tc)) if tc.size and not np.isnan(tc).all() else None
    med = {n.lower(): _median_dur(c, n) for n in ("QK", "SOFTMAX", "CORRECTION", "PV", "LOAD_K", "LOAD_V")}
    out["median_ns"] = {k: v for k, v in med.items() if v is not None}
    out["period_ns"] = _median_period(c)
    hid = _hidden_softmax(c)
    out["hidden_softmax_ns"] = float(np.median(hid[1])) if hid is not None else None
    blocks = np.asarray(ctas["kv_blocks"]) if "kv_blocks" in ctas.column_names else np.zeros(0)
    out["kv_blocks_per_cta"] = {"min": int(blocks.min()), "median": float(np.median(blocks)), "max": int(blocks.max())} if blocks.size and blocks.max() > 0 else None
    spans = np.asarray(ctas["span_ns"]) if ctas.num_rows else np.zeros(0)
    out["cta_span_ns"] = ({"min": int(spans.min()), "median": float(np.median(spans)), "max": int(spans.max())}
                          if spans.size else None)
    out.update(mainloop_balance(ctas))
    out.update(stream_profile(c, kv_block_bytes(out["config"]), bounds))
    out.update(startup_profile(c, bounds))
    out["typical_cta"] = typical_cta(trace, ctas)
    out["perturbation"] = pert
    return json_safe(out)


FAST_SM_RATIO = 1.15  # an SM counts as fast when its mainloop rate is this far above the median


def mainloop_balance(ctas: pa.Table) -> dict:
    """How evenly the CTAs' mainloops end, and which SMs run theirs faster.

    ``mainloop_end_ns``: min / median / max over CTAs of the last MMA retire, from the start
    of the CTA's launch. ``mainloop_idle_share``: the share of (CTA x time up to the last
    mainloop end) that CTAs spend finished while others still stream. That is time an even
    split would win back only where each SM's rate is its own; where the SMs share one limit
    (DRAM bandwidth in a memory-bound decode) the others speed up when some finish, and
    ``stream_profile`` says whether the total rate dipped. ``fast_sms``: SMs whose KV blocks
    per ns exceed FAST_SM_RATIO x the median (on the H200 some SMs stream that much faster
    while all stream: traces/README.md), with their rate relative to the median in ``fast_sm_rate_ratio``.
    """
    names = set(ctas.column_names)
    if not {"mainloop_end_ns", "kv_blocks"} <= names:
        return {}
    end = np.asarray(ctas["mainloop_end_ns"])
    begin = np.asarray(ctas["mainloop_start_ns"])
    ok = end >= 0
    if ok.sum() < 2:
        return {}
    launch = np.asarray(ctas["launch"])[ok]
    start = np.asarray(ctas["start_ns"])[ok]
    end, begin = end[ok], begin[ok]
    blocks = np.asarray(ctas["kv_blocks"])[ok].astype(np.float64)
    sm = np.asarray(ctas["sm"])[ok]
    rel = np.empty(end.size, np.float64)
    idle = np.empty(end.size, np.float64)
    for L in np.unique(launch):  # times from the start of each launch
        m = launch == L
        t0 = start[m].min()
        rel[m] = end[m] - t0
        last = rel[m].max()
        idle[m] = (last - rel[m]) / last if last > 0 else 0.0
    out = {"mainloop_end_ns": {"min": int(rel.min()), "median": float(np.median(rel)), "max": int(rel.max())},
           "mainloop_idle_share": float(idle.mean())}
    dur = (end - begin).astype(np.float64)
    good = (dur > 0) & (blocks > 0)
    if good.sum() >= 2:
        rate = blocks[good] / dur[good]
        med = float(np.median(rate))
        fast = rate > FAST_SM_RATIO * med
        out["fast_sms"] = sorted({int(x) for x in sm[good][fast]})
        out["fast_sm_rate_ratio"] = float(np.median(rate[fast]) / med) if fast.any() else None
    return out


def typical_cta(trace: Trace, ctas: pa.Table | None = None) -> int | None:
    """The CTA whose span is closest to the median span (ties: lowest id) — a fair example."""
    ctas = per_cta(trace) if ctas is None else ctas
    if ctas.num_rows == 0:
        return None
    spans = np.asarray(ctas["span_ns"], dtype=np.float64)
    i = int(np.argmin(np.abs(spans - np.median(spans))))
    return int(ctas["cta"][i].as_py())


KERNEL_TIME_SOURCES = {
    "cold_l2_bench": "untraced kernel, cold-L2 CUDA-graph benchmark",
    "recorded_inputs": "untraced kernel, CUDA-graph replay on the recorded inputs (part of the KV in L2)",
    "plain_twin": "untraced kernel, its plain twin timed on the device beside the traced launch (L2 warm)",
    "launch_span": "traced launch, first CTA start to last CTA end (every CTA's lifetime)",
    "trace_span": "trace span of the recorded warps",
}


def kernel_time(timing: TimingMeta | None, span_ns, twin: dict | None = None, launch_span_ns=None) -> dict:
    """The kernel time a summary shows and where it comes from (see the module docstring):
    kernel_time_ns / _kind / _source, plus every measured time the bundle has (ns or None):
    bench_time_ns (cold L2), recorded_kernel_time_ns and traced_time_ns (recorded inputs), from
    the bundle's ``timing`` (None: it has none). Without those: the plain twin's untraced time
    (``twin``: fa4trace.analysis.fidelity.plain_twin, where timed on the device for this launch
    alone), else the launch's span over every CTA's lifetime (``launch_span_ns``: perturbation's),
    else the recorded warps' span
    (the recorded CTAs only: a sample's span is not the launch's)."""
    def ns(v):
        return float(v) * 1e3 if v else None

    t = timing or TimingMeta()
    bench, plain, traced = ns(t.bench_us), ns(t.kernel_us), ns(t.traced_us)
    twin_ns = twin["plain_ns"] if twin and twin.get("method") and not twin.get("over_launches") else None
    kind, value = next(((k, v) for k, v in (("cold_l2_bench", bench), ("recorded_inputs", plain),
                                            ("plain_twin", twin_ns), ("launch_span", launch_span_ns)) if v),
                       ("trace_span", span_ns))
    return {"kernel_time_ns": value, "kernel_time_kind": kind, "kernel_time_source": KERNEL_TIME_SOURCES[kind],
            "bench_time_ns": bench, "recorded_kernel_time_ns": plain,
            # The recorded launch is the traced kernel: its events run up to its own time, above the
            # untraced kernel's on the same inputs by the tracing cost.
            "traced_time_ns": traced}


# The config keys of our decode attention that make its work: two bundles that differ in one
# of these ran different problems (the schedule, splits, tiles only change how).
SHAPE_KEYS = ("b", "sq", "hq", "hkv", "sk", "d", "dtype")


def config_diff(a: dict, b: dict, keys=None) -> dict:
    """{key: [A's value, B's value]} for the config keys (``keys``: only these) whose values differ."""
    names = keys if keys is not None else list(dict.fromkeys([*a, *b]))
    return {k: [a.get(k), b.get(k)] for k in names if a.get(k) != b.get(k)}


def diff_text(diff: dict) -> str:
    """'m 8192 → 64, n 8192 → 4096' for ``config_diff``'s answer (values as ``config_value``)."""
    return ", ".join(f"{k} {config_value(va)} → {config_value(vb)}" for k, (va, vb) in diff.items())


def speed_text(sa: dict, sb: dict, caveat: str | None = None) -> str | None:
    """The kernel-time line of a comparison: A's time → B's, how much less (or more) time B
    takes, ``caveat`` (e.g. that A and B ran different shapes; then no speed ratio is given),
    where the times come from."""
    ta, tb = sa.get("kernel_time_ns"), sb.get("kernel_time_ns")
    if not ta or not tb:
        return None
    line = f"kernel time {ta / 1e3:.2f} µs → {tb / 1e3:.2f} µs: B takes "
    if tb < ta:
        line += f"{100 * (ta - tb) / ta:.1f}% less time" + ("" if caveat else f" ({ta / tb:.2f}x faster)")
    elif tb > ta:
        line += f"{100 * (tb - ta) / ta:.1f}% more time" + ("" if caveat else f" ({tb / ta:.2f}x slower)")
    else:
        line += "the same time"
    if caveat:
        line += f", {caveat}"
    if sa.get("kernel_time_kind") == sb.get("kernel_time_kind"):
        return line + f" [{sa.get('kernel_time_source')}]"
    return line + (f" [A: {sa.get('kernel_time_source')}; B: {sb.get('kernel_time_source')}: "
                   "different sources, not comparable]")


def compare(a: Trace, b: Trace, launch_a: int | None = None, launch_b: int | None = None) -> dict:
    """Side by side summaries and what changed from a to b (b is usually the ping-pong), one
    launch of each (fa4trace.analysis.launches.launch_pairs: the ones named, a bundle's only
    one, or launch by launch): one comparison, or {"pairs": [one per pair], "launch_pairs"}.
    ``differs``: the kernels (when not the same one) and the shape keys (``SHAPE_KEYS``) whose
    values differ; the ``speed`` line says when A and B ran different shapes. Two different
    kernels compare only where both record QK and SOFTMAX (our decode against FA4's)."""
    ka, kb = a.info.kernel, b.info.kernel
    if ka != kb and not (has_attention_events(a) and has_attention_events(b)):
        raise Fa4traceError(f"A is kernel {ka}, B is kernel {kb}: compare needs two bundles of one kernel, or "
                            "two attention kernels (QK and SOFTMAX events)")
    return compare_launches(a, b, launch_a, launch_b, _compare_launch)


def has_attention_events(trace: Trace) -> bool:
    """Whether the bundle records an attention kernel's QK and SOFTMAX (what compare reads)."""
    return {"QK", "SOFTMAX"} <= trace.event_names()


def _compare_launch(a: Trace, b: Trace) -> dict:
    """``compare`` of two bundles of one launch each."""
    sa, sb = summarize(a), summarize(b)
    diff: dict = {}
    for key in ("kernel_time_ns", "bandwidth_tbps", "period_ns", "hidden_softmax_ns", "qk_softmax_overlap",
                "pv_softmax_overlap", "tensor_core_busy", "dropped"):
        va, vb = sa.get(key), sb.get(key)
        if va is None or vb is None:
            continue
        diff[key] = {"a": va, "b": vb, "delta": vb - va,
                     "ratio": (vb / va) if isinstance(va, (int, float)) and va else None}
    hid_a, hid_b = sa.get("hidden_softmax_ns"), sb.get("hidden_softmax_ns")
    per_b = sb.get("period_ns")
    headline = None
    if hid_a is not None and hid_b is not None and per_b:
        extra = hid_b - hid_a
        headline = (f"{b.name} hides {abs(extra):.0f} ns {'more' if extra >= 0 else 'less'} softmax per "
                    f"iteration than {a.name} ({100 * abs(extra) / per_b:.1f}% of its {per_b:.0f} ns period)")
    ia, ib = a.info, b.info
    shapes = config_diff(ia.config or {}, ib.config or {}, SHAPE_KEYS)
    differs = {"config": shapes}
    if ia.kernel != ib.kernel:
        differs["kernel"] = [ia.kernel, ib.kernel]
    caveat = f"but A and B ran different shapes ({diff_text(shapes)}): not a speed-up" if shapes else None
    return json_safe({"a": sa, "b": sb, "diff": diff, "headline": headline, "speed": speed_text(sa, sb, caveat),
                      "differs": differs})


def json_safe(o):
    """JSON-safe: numpy scalars to Python, NaN to None."""
    if isinstance(o, dict):
        return {str(k): json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_safe(v) for v in o]
    if isinstance(o, np.generic):
        o = o.item()
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    return o
