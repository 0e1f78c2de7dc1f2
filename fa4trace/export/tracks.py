"""Where every row of an events table goes: one track per (warp, class, lane), shared by the
Perfetto and Chrome exporters and the viewer's timeline.

Slices on one track must nest strictly (BEGIN/END, or Chrome's X events on one tid). Async
spans (an MMA in flight) overlap the warp's own spans, so each async event of the vocabulary
(``is_async``) gets a child track of its own under the warp; any other span that would break the
nesting of its track (two records that cross, e.g. SOFTMAX(i) ending a few cycles after
CORRECTION(i) begins) moves to an extra lane. :func:`layout_tracks` does that, vectorized.

:func:`event_columns` reads the columns every consumer of the layout needs once (dictionary
codes, int64 times), and :func:`vocab_of` the vocabulary a bundle was decoded with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..format.vocab import VOCAB, Vocabulary
from ..trace.meta import BundleMeta

__all__ = ["EventColumns", "event_columns", "TrackLayout", "layout_tracks", "stable_order", "key_order",
           "sorted_runs_order", "vocab_of"]


# ---- columns -------------------------------------------------------------------------------

@dataclass
class EventColumns:
    """The columns of an events table as numpy arrays (names, roles and kinds as codes)."""

    n: int
    launch: np.ndarray
    cta: np.ndarray
    sm: np.ndarray
    warp: np.ndarray
    role: np.ndarray  # codes into role_names
    role_names: list
    name: np.ndarray  # codes into names
    names: list
    kind: np.ndarray  # 0 span, 1 instant, 2 warp
    iter: np.ndarray
    start: np.ndarray
    end: np.ndarray


def _dict_codes(col) -> tuple[np.ndarray, list]:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if not pa.types.is_dictionary(col.type):
        col = col.dictionary_encode()
    codes = col.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, [str(x) for x in col.dictionary.to_pylist()]


def _int_col(t: pa.Table, name: str) -> np.ndarray:
    return t.column(name).fill_null(0).to_numpy().astype(np.int64, copy=False)


def event_columns(events: pa.Table) -> EventColumns:
    """Read an events table (decode.SCHEMA) once: int64 ids and times (end >= start), codes."""
    if any(events.column(c).num_chunks > 1 for c in ("role", "name", "kind")):
        events = events.unify_dictionaries().combine_chunks()
    role, role_names = _dict_codes(events.column("role"))
    name, names = _dict_codes(events.column("name"))
    kcodes, kdict = _dict_codes(events.column("kind"))
    kmap = np.array([{"span": 0, "instant": 1, "warp": 2}.get(k, 0) for k in kdict] or [0], np.int8)
    start = _int_col(events, "start_ns")
    end = np.maximum(_int_col(events, "end_ns"), start)
    it = events.column("iter").fill_null(-1).to_numpy().astype(np.int64, copy=False)
    return EventColumns(events.num_rows, _int_col(events, "launch"), _int_col(events, "cta"), _int_col(events, "sm"),
                        _int_col(events, "warp"), role, role_names, name, names, kmap[kcodes], it, start, end)


# ---- sorting helpers -------------------------------------------------------------------------

def _bits(x: int) -> int:
    return max(int(x), 0).bit_length()


def stable_order(major: np.ndarray, minor: np.ndarray) -> np.ndarray:
    """Stable order by (major, minor), both non-negative int64; ties keep input order."""
    if major.size == 0:
        return np.zeros(0, np.int64)
    bm, bn = _bits(major.max()), _bits(minor.max())
    if bm + bn <= 63:
        return np.argsort((major << bn) | minor, kind="stable")
    o = np.argsort(minor, kind="stable")
    return o[np.argsort(major[o], kind="stable")]


def key_order(key: np.ndarray) -> np.ndarray:
    """Stable order by a non-negative integer key, in its narrowest type: numpy sorts 16-bit
    keys by radix (linear time; a million track or level numbers in a few ms)."""
    if key.size == 0:
        return np.zeros(0, np.int64)
    top = int(key.max())
    dt = np.int16 if top < 2**15 else np.int32 if top < 2**31 else np.int64
    return np.argsort(key.astype(dt, copy=False), kind="stable")


def sorted_runs_order(*runs: np.ndarray) -> np.ndarray:
    """Stable order of the concatenated ``runs``, each already ascending: a merge of the runs
    (numpy's stable sort of int64 is a timsort, which finds them: linear time)."""
    return np.argsort(np.concatenate(runs), kind="stable")


# ---- track layout ----------------------------------------------------------------------------

@dataclass
class TrackLayout:
    """Where every row of an events table goes: one slice track per (warp, class, lane).

    class 0 is the warp's own track (sync spans, instants, the WARP row); class k > 0 is the
    in-flight track of async event ``async_names[k-1]``. Lane 0 is the class's main track,
    lanes > 0 hold spans that would otherwise break strict nesting. Tracks are numbered in
    (warp, class, lane) order; warps in (launch, cta, warp) order.
    """

    row_track: np.ndarray  # per row
    row_warp: np.ndarray  # per row
    rank: np.ndarray  # per row: position in (warp, class, start, -end) order
    track_warp: np.ndarray  # per track
    track_class: np.ndarray
    track_lane: np.ndarray
    warp_launch: np.ndarray  # per warp
    warp_cta: np.ndarray
    warp_sm: np.ndarray
    warp_index: np.ndarray
    warp_role: list
    async_names: list
    lane_rounds: int = 0
    greedy_groups: int = 0

    @property
    def n_tracks(self) -> int:
        return int(self.track_warp.size)

    def child_rank(self, t: int) -> int:
        """Order of a track under its warp: 0 = the warp's own track, then the async tracks
        in vocabulary order, then the extra lanes of the warp's own spans."""
        c, lane = int(self.track_class[t]), int(self.track_lane[t])
        if c == 0 and lane == 0:
            return 0
        return (c if c else len(self.async_names) + 1) * 1024 + lane

    def track_label(self, t: int) -> str:
        w, c, lane = int(self.track_warp[t]), int(self.track_class[t]), int(self.track_lane[t])
        base = f"warp {int(self.warp_index[w])} · {self.warp_role[w]}"
        if c == 0:
            return base if lane == 0 else f"{base} · overlap {lane}"
        name = f"{self.async_names[c - 1]} in flight"
        return name if lane == 0 else f"{name} ({lane + 1})"

    def track_description(self, t: int) -> str:
        """The track's name in full, with where its warp ran: the Perfetto UI cuts a long or
        deeply nested track name short and shows the description in the track's help popup."""
        w, c, lane = int(self.track_warp[t]), int(self.track_class[t]), int(self.track_lane[t])
        where = (f"warp {int(self.warp_index[w])} of CTA {int(self.warp_cta[w])} on SM {int(self.warp_sm[w])}, "
                 f"launch {int(self.warp_launch[w])}; role {self.warp_role[w]}")
        if c == 0:
            return where if lane == 0 else f"{where}; overlap lane {lane}: its spans that overlap the warp's other spans"
        what = f"{self.async_names[c - 1]} in flight (issue to retire)"
        return f"{what}{f', lane {lane + 1}' if lane else ''} of {where}"


MAX_LANE_ROUNDS = 12
LAYOUT_CHUNK_ROWS = 1 << 17  # rows laid out at a time (whole warps): arrays of a few MB stay in cache


def layout_tracks(events: pa.Table, vocab: Vocabulary | None = None, *,
                  columns: EventColumns | None = None) -> TrackLayout:
    """Assign every row to a track such that slices on each track nest strictly.
    ``columns``: :func:`event_columns` of ``events`` when the caller has them already."""
    r = columns or event_columns(events)
    vocab = vocab or VOCAB
    n = r.n
    # warps = (launch, cta, warp); the decoder writes them contiguously, use that when true
    wk = (r.launch << 48) | (r.cta << 16) | r.warp
    contiguous = bool(n and (wk[1:] >= wk[:-1]).all())
    if contiguous:
        first = np.flatnonzero(np.r_[True, wk[1:] != wk[:-1]]) if n else np.zeros(0, np.int64)
        row_warp = np.cumsum(np.r_[False, wk[1:] != wk[:-1]]).astype(np.int64)
    else:
        _, first, row_warp = np.unique(wk, return_index=True, return_inverse=True)
        row_warp = row_warp.astype(np.int64).reshape(-1)
    n_warps = first.size

    async_set = vocab.async_names()
    ids = {e.name: e.id for e in vocab.events}
    async_names = sorted({nm for nm in r.names if nm in async_set}, key=lambda s: (ids.get(s, 999), s))
    cls_of_code = np.array([async_names.index(nm) + 1 if nm in async_set else 0 for nm in r.names] or [0], np.int64)
    row_cls = np.where(r.kind == 2, 0, cls_of_code[r.name]) if n else np.zeros(0, np.int64)
    n_cls = len(async_names) + 1
    group = row_warp * n_cls + row_cls

    # warps whose rows are contiguous are laid out a chunk of whole warps at a time (a group's
    # lanes depend on its own rows only): the same layout, with arrays that stay in cache
    if contiguous and n > LAYOUT_CHUNK_ROWS:
        cut_warps = np.unique(np.searchsorted(first, np.arange(LAYOUT_CHUNK_ROWS, n, LAYOUT_CHUNK_ROWS)))
        bounds = np.r_[0, first[cut_warps[cut_warps > 0]], n]
    else:
        bounds = np.array([0, n])
    rank, row_track, tgroup, track_lane = [], [], [], []
    rounds = greedy = n_tracks = 0
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        warps = (int(row_warp[a]), int(row_warp[b - 1]) + 1) if contiguous else (0, n_warps)
        part = _lanes(group[a:b], r.start[a:b], r.end[a:b], r.kind[a:b], warps, n_cls)
        rank.append(part[0] + a)
        row_track.append(part[1] + n_tracks)
        tgroup.append(part[2])
        track_lane.append(part[3])
        rounds, greedy, n_tracks = max(rounds, part[4]), greedy + part[5], n_tracks + part[2].size
    tgroup, track_lane = np.concatenate(tgroup), np.concatenate(track_lane)
    role_of_warp = [r.role_names[c] if r.role_names else "unknown" for c in r.role[first]] if n else []
    return TrackLayout(
        row_track=np.concatenate(row_track), row_warp=row_warp, rank=np.concatenate(rank),
        track_warp=tgroup // n_cls, track_class=tgroup % n_cls, track_lane=track_lane,
        warp_launch=r.launch[first], warp_cta=r.cta[first], warp_sm=r.sm[first], warp_index=r.warp[first],
        warp_role=role_of_warp, async_names=async_names, lane_rounds=rounds, greedy_groups=greedy)


def _lanes(group: np.ndarray, start: np.ndarray, end: np.ndarray, kind: np.ndarray, warps: tuple, n_cls: int):
    """The layout of some rows holding whole groups (warp * n_cls + class) of warps
    ``warps`` (first, stop): per row its rank ((group, start, -end) order) and track, per
    track its group and lane (tracks in (group, lane) order, each warp's own track included).
    Returns (rank, row_track, track_group, track_lane, lane rounds, greedy groups)."""
    n = group.size
    # rank: (group, start, -end) order; the decoder's row order already sorts by start with
    # outer spans first, so a stable sort by group usually suffices (checked, else full sort)
    order = key_order(group)
    gs, ss, es = group[order], start[order], end[order]
    ok = True
    if n > 1:
        same_g = gs[1:] == gs[:-1]
        ok = bool(((ss[1:] > ss[:-1]) | ((ss[1:] == ss[:-1]) & (es[1:] <= es[:-1])) | ~same_g).all())
    if not ok:
        emax = int(end.max()) if n else 0
        o2 = stable_order(start, emax - end)
        order = o2[np.argsort(group[o2], kind="stable")]
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)

    lane = np.zeros(n, np.int64)
    nonzero = (kind != 1) & (end > start)
    spans = order[nonzero[order]]  # rank order
    active = spans
    rounds = 0
    while active.size and rounds < MAX_LANE_ROUNDS:
        rounds += 1
        tk = group[active] * (int(lane[active].max()) + 2) + lane[active]
        move = _nest_violations(tk, start[active], end[active])
        if move.size == 0:
            active = active[:0]
            break
        moved = active[move]
        lane[moved] += 1
        # checked again: the lanes spans left and the lanes they joined (the others still nest)
        stride = int(lane.max()) + 1
        joined = group[moved] * stride + lane[moved]
        changed = np.unique(np.concatenate([joined - 1, joined]))
        active = spans[np.isin(group[spans] * stride + lane[spans], changed)]
    greedy = 0
    if active.size:
        # pathological data (many mutually crossing spans): exact greedy per remaining group
        tk = group[active] * (int(lane[active].max()) + 2) + lane[active]
        move = _nest_violations(tk, start[active], end[active])
        bad_groups = np.unique(group[active[move]])
        greedy = int(bad_groups.size)
        for gg in bad_groups:
            idx = spans[group[spans] == gg]
            lane[idx] = _greedy_lanes(start[idx], end[idx])

    # lanes of a group are renumbered 0, 1, 2... (a round can empty a lane that others skip)
    if n and lane.any():
        lb = _bits(int(lane.max()))
        uk, inv = _distinct((group << lb) | lane)
        ug = uk >> lb
        dense = np.arange(uk.size) - np.searchsorted(ug, ug)
        lane = dense[inv]

    # tracks: (warp, class, lane), numbered in that order; each warp always has its own track
    tkey_lane_bits = _bits(int(lane.max()) if n else 0) + 1
    tkey = (group << tkey_lane_bits) | lane
    base_keys = (np.arange(*warps, dtype=np.int64) * n_cls) << tkey_lane_bits
    all_keys, inv = _distinct(np.concatenate([tkey, base_keys]))
    row_track = inv[:n]
    return (rank, row_track, all_keys >> tkey_lane_bits, all_keys & ((1 << tkey_lane_bits) - 1), rounds, greedy)


def _distinct(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of non-negative ``key``, ascending, and each row's index among them
    (``np.unique(key, return_inverse=True)``), by a count table where the values are few and
    small (no sort)."""
    top = int(key.max()) if key.size else 0
    if top > 4 * key.size + 1024:
        u, inv = np.unique(key, return_inverse=True)
        return u, inv.reshape(-1).astype(np.int64)
    present = np.bincount(key, minlength=top + 1) > 0
    dense = np.cumsum(present) - 1
    return np.flatnonzero(present), dense[key]


def _nest_violations(tk: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Spans (given in rank order, start < end) that must move up a lane for their track to nest.

    Builds each track's BEGIN/END stream (ENDs before BEGINs at equal times, inner spans end
    first, outer spans begin first), takes the nesting level of every event and checks that the
    event following each BEGIN at its level is its own END. Where it is another span's END the
    two cross; :func:`_choose_moves` picks which of each crossing pair moves.
    """
    n = tk.size
    o = _stream_order(tk, start, end)  # stream event k: the END of span n-1-o[k] (o < n) or the BEGIN of o[k]-n
    is_b = o >= n
    span = np.where(is_b, o - n, n - 1 - o)
    # nesting level: the running count of open spans, which each track starts at 0 (its BEGINs and
    # ENDs sum to zero); a BEGIN's level is the count before it
    level = np.cumsum(is_b.astype(np.int32) * 2 - 1, dtype=np.int32) - is_b
    ol = key_order(level)
    sp, b = span[ol], is_b[ol]
    isb = np.flatnonzero(b[:-1])
    bad = sp[isb + 1] != sp[isb]  # the next event at a BEGIN's level is not its own END (span ids are unique)
    if not bad.any():
        return np.zeros(0, np.int64)
    j = isb[bad]
    return _choose_moves(np.minimum(sp[j], sp[j + 1]), np.maximum(sp[j], sp[j + 1]))


def _stream_order(tk: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The order of [ENDs in reverse rank order, BEGINs in rank order] by (track, time, ENDs
    first): the stable sort of that stream by its key, done as a sort of the ENDs alone, a
    radix sort of the BEGINs by track (in rank order their starts ascend within a track) and a
    merge of the two sorted runs."""
    n = tk.size
    if n == 0:
        return np.zeros(0, np.int64)
    bn = _bits(int(max(end.max(), start.max())) * 2 + 1)
    if _bits(int(tk.max())) + bn > 63:
        return stable_order(np.concatenate([tk[::-1], tk]),
                            np.concatenate([end[::-1], start]) * 2 + np.repeat(np.array([0, 1], np.int64), n))
    key_e = (tk[::-1] << bn) | (end[::-1] * 2)
    oe = np.argsort(key_e, kind="stable")
    ob = key_order(tk)
    om = sorted_runs_order(key_e[oe], ((tk << bn) | (start * 2 + 1))[ob])
    return np.concatenate([oe, ob + n])[om]


def _choose_moves(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Which spans of the crossing pairs (lo < hi, by rank) move up a lane.

    Moving every ``hi`` would empty a chain of spans that each cross the next (deep async
    pipelines: A1 x A2 x A3 ...) one span per round. Instead each candidate ``hi`` points to its
    nearest lower-ranked partner; along such chains (list ranking by pointer jumping) only every
    other span moves, so a chain splits over two lanes at once. What this misses, later rounds
    (and at worst the exact greedy) fix.
    """
    cand, inv = np.unique(hi, return_inverse=True)
    pred = np.full(cand.size, -1, np.int64)
    np.maximum.at(pred, inv.reshape(-1), lo)
    k = np.searchsorted(cand, pred)
    k = np.minimum(k, cand.size - 1)
    par = np.where((pred >= 0) & (cand[k] == pred), k, -1)  # parent = the partner when it is a candidate too
    dist = (par >= 0).astype(np.int64)
    p = par.copy()
    while (p >= 0).any():
        m = np.flatnonzero(p >= 0)
        dist_new, p_new = dist.copy(), p.copy()
        dist_new[m] += dist[p[m]]
        p_new[m] = p[p[m]]
        dist, p = dist_new, p_new
    return cand[dist % 2 == 0]


def _greedy_lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Exact first-fit lanes for spans in rank order (a Python loop: fallback only)."""
    stacks: list[list[int]] = []
    out = np.zeros(start.size, np.int64)
    for i, (s, e) in enumerate(zip(start.tolist(), end.tolist())):
        for k, st in enumerate(stacks):
            while st and st[-1] <= s:
                st.pop()
            if not st or e <= st[-1]:
                st.append(e)
                out[i] = k
                break
        else:
            stacks.append([e])
            out[i] = len(stacks) - 1
    return out


def vocab_of(meta: dict) -> Vocabulary:
    """The vocabulary a bundle's metadata (as stored) carries; the shared one when it has none
    (or a malformed one: an export must not stop there)."""
    v = BundleMeta.from_meta(meta).vocabulary
    if isinstance(v, dict):
        try:
            return Vocabulary.from_json(v)
        except Exception:  # a malformed vocabulary must not stop an export: fall back
            return VOCAB
    return VOCAB

