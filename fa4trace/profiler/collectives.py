"""The ranks' clocks against each other, read from their collectives.

Each rank's torch.profiler trace is on its own process's clock: Kineto turns its host and CUDA
times into Unix-epoch ns, so ranks on one host share the system clock up to each process's
conversion, and ranks on different hosts only as well as their clocks are synchronized. A
collective gives an anchor that holds whatever the clocks do: all ranks' kernels of one
collective finish at nearly the same time (each waits for the others' data; the one that
started last is the one the others waited for), so the difference of their ends is the
difference of the ranks' clocks, up to how far apart the kernels really finish.

**Anchors** of a trace (:func:`anchors_of`): its NCCL collective kernels (``ncclDevKernel_*`` /
``ncclKernel_*``, point-to-point SendRecv / Send / Recv left out: only two ranks take part),
by end time; where a trace has none, its blocking host collectives (``gloo:all_reduce`` and
the like: the call returns when the collective is done on every rank).

**Pairing** (:func:`pair_anchors`): the collectives of one kernel name run in the same order on
every rank of a communicator, so the i-th of a name on one rank is the (i + lag)-th on another,
the lag being how many more of them the other's profiler window caught first. Per name, the lag
that pairs the most collectives (profiler windows that cover the same steps), then the one
nearest the profilers' own clocks, unless another lag's end differences agree decisively better
(:func:`_best_lag`); ``ambiguous`` where another lag fits about as well at another offset (a
strictly periodic run whose windows started on different collectives, or ends that scatter as
much as the schedule varies).

**Offsets** (:func:`rank_clock`): ranks in the order given; each is paired with every rank
aligned before it and takes its offset from a partner it agrees with about as well as the best
one, the one fewest steps from the reference (the first rank, offset 0), the offset being the
median end difference over the pairs, with its standard error (from the pairs' median absolute
deviation). An offset is *established* where it exceeds ``SIGNIFICANT`` standard errors: ranks
on one host share the system clock, and collectives that scatter more than they differ (gloo
calls on a busy host) must not move a rank by their noise. Ranks of different communicators
(tensor- and data-parallel groups) align through the ranks they share collectives with; a rank
that shares none keeps its epoch clock and says so.

**The alignment error** (:func:`residuals`): after the offsets are taken out, how far the ranks'
kernel ends of each paired collective still are apart (max - min over the ranks), as the median
and the largest over the collectives. It bounds what is left of the clocks' disagreement
together with how far apart the kernels really finished, so it is an upper estimate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .kineto import KinetoTrace

__all__ = ["Anchors", "Pairing", "anchors_of", "pair_anchors", "rank_clock", "residuals", "RANK_CLOCKS",
           "MAX_LAG"]

RANK_CLOCKS = ("nccl", "epoch")  # nccl: take the offsets out; epoch: measure them, keep the profilers' clocks
MAX_LAG = 4096  # collectives of one name one rank's window may hold before the other's first
LAG_SAMPLE = 64  # pairs each lag is first scored on, where lags x pairs exceed EXACT_PAIRS
EXACT_PAIRS = 2_000_000  # up to this many lags x pairs, every lag is scored on all its pairs
LAG_EXACT = 64  # lags then scored on all their pairs (the best of the first scores)
AS_GOOD = 4  # a lag whose pairs scatter this many times less than the default's replaces it
DECIDED_NS = 2000  # a default lag whose pairs scatter less than this is kept
GOOD_MAD_NS = 20_000  # a partner whose ends agree this well is taken without trying the others
SIGNIFICANT = 3  # an offset is established where it exceeds this many standard errors
_P2P = re.compile(r"sendrecv|_send|_recv|\bsend\b|\brecv\b", re.IGNORECASE)
_NCCL = re.compile(r"^nccl", re.IGNORECASE)
_HOST = re.compile(r"^gloo:", re.IGNORECASE)
_DEVICE_CATS = ("kernel",)
_HOST_CATS = ("user_annotation", "cpu_op")


@dataclass
class Anchors:
    """One rank's collective events, in start order: what :func:`pair_anchors` reads."""

    kind: str  # "nccl kernels", "host collectives" or "none"
    names: list = field(default_factory=list)  # per anchor, its name (NCCL kernel / host op)
    start_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    end_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def n(self) -> int:
        return int(self.end_ns.size)

    def shifted(self, offset_ns: int) -> "Anchors":
        """The same anchors on a clock ``offset_ns`` behind (times minus the offset)."""
        return Anchors(self.kind, self.names, self.start_ns - offset_ns, self.end_ns - offset_ns)


def _pick(kt: KinetoTrace, cats: tuple, pattern: re.Pattern) -> np.ndarray:
    codes = [i for i, n in enumerate(kt.names) if pattern.search(n) and not _P2P.search(n)]
    if not codes:
        return np.zeros(0, np.int64)
    rows = np.flatnonzero(kt.cat_mask(*cats) & np.isin(kt.name, codes) & (kt.dur > 0))
    return rows[np.argsort(kt.ts[rows], kind="stable")]


def anchors_of(kt: KinetoTrace) -> Anchors:
    """The collective anchors of a trace (module docstring): NCCL kernels, else host collectives."""
    for kind, cats, pat in (("nccl kernels", _DEVICE_CATS, _NCCL), ("host collectives", _HOST_CATS, _HOST)):
        rows = _pick(kt, cats, pat)
        if rows.size:
            return Anchors(kind, [kt.names[c] for c in kt.name[rows].tolist()], kt.ts[rows].astype(np.int64),
                           (kt.ts[rows] + kt.dur[rows]).astype(np.int64))
    return Anchors("none")


@dataclass
class Pairing:
    """Anchors of rank B paired with anchors of rank A: indices into each, and end_B - end_A."""

    a: np.ndarray
    b: np.ndarray
    diff_ns: np.ndarray
    ambiguous: bool = False
    lags: dict = field(default_factory=dict)  # name -> lag chosen

    @property
    def n(self) -> int:
        return int(self.diff_ns.size)

    @property
    def offset_ns(self) -> int:
        return int(np.median(self.diff_ns)) if self.n else 0

    @property
    def mad_ns(self) -> int:
        """Median absolute deviation of the end differences: how tightly the pairs agree."""
        return int(np.median(np.abs(self.diff_ns - self.offset_ns))) if self.n else 0

    @property
    def se_ns(self) -> int:
        """The offset's standard error: that of a median of n differences whose spread the
        median absolute deviation gives (1.2533 x 1.4826 x MAD / sqrt(n), normal scatter)."""
        return int(round(1.2533 * 1.4826 * self.mad_ns / np.sqrt(self.n))) if self.n else 0


def _best_lag(ea: np.ndarray, eb: np.ndarray) -> tuple[int, bool]:
    """The lag L pairing ea[i] with eb[i + L] (module docstring), and whether another lag fits
    about as well at another offset.

    By default the lag that pairs the most collectives (profiler windows that cover the same
    steps), then the one nearest the profilers' own clocks. Another lag replaces it where its
    end differences agree decisively better: a median absolute deviation, raised by
    1/sqrt(pairs) for the uncertainty of a few pairs, ``AS_GOOD`` times smaller than the
    default's. A schedule that repeats (or ends that scatter) can make a wrong lag look as good
    as the right one by chance; only a decisive difference is taken as evidence. Where lags x
    pairs exceed ``EXACT_PAIRS``, every lag is first scored on ``LAG_SAMPLE`` pairs spread over
    its overlap (one array operation for all lags), and the best ``LAG_EXACT`` of them, with the
    default's candidates, on all their pairs."""
    na, nb = ea.size, eb.size
    short = min(na, nb)
    need = min(short, max(2, (short + 1) // 2))  # a lag pairs half of the shorter side (two at least)
    lags = np.arange(-min(na - need, MAX_LAG), min(nb - need, MAX_LAG) + 1)
    i0, i1 = np.maximum(0, -lags), np.minimum(na, nb - lags)
    near = np.arange(lags.size)
    if lags.size * short > EXACT_PAIRS:  # many lags of many pairs: keep the best of a first scoring
        k = min(LAG_SAMPLE, need)  # no more samples than the shortest overlap: no pair counted twice
        idx = i0[:, None] + ((i1 - i0)[:, None] * ((np.arange(k) + 0.5) / k)[None, :]).astype(np.int64)
        d = eb[idx + lags[:, None]] - ea[idx]
        med = np.median(d, axis=1)
        coarse = np.median(np.abs(d - med[:, None]), axis=1)
        most = np.flatnonzero(i1 - i0 == (i1 - i0).max())
        near = np.union1d(np.argsort(coarse, kind="stable")[:LAG_EXACT], most[np.argsort(np.abs(lags[most]))][:LAG_EXACT])
    scores = []
    for j in near.tolist():
        lag, a0, a1 = int(lags[j]), int(i0[j]), int(i1[j])
        dd = eb[a0 + lag:a1 + lag] - ea[a0:a1]
        m = float(np.median(dd))
        mad = float(np.median(np.abs(dd - m)))
        scores.append((mad, a1 - a0, m, lag, mad * (1 + 1 / np.sqrt(a1 - a0))))
    default = min(scores, key=lambda sc: (-sc[1], abs(sc[2]), sc[3]))
    best = min(scores, key=lambda sc: (sc[4], -sc[1], abs(sc[2]), sc[3]))
    chosen = best if default[0] > DECIDED_NS and best[4] * AS_GOOD <= default[0] else default
    tol = max(DECIDED_NS, AS_GOOD * chosen[0])
    ambiguous = any(sc[0] <= AS_GOOD * max(chosen[0], 500.0) and abs(sc[2] - chosen[2]) > tol for sc in scores)
    return chosen[3], ambiguous


def pair_anchors(a: Anchors, b: Anchors) -> Pairing:
    """Pair rank B's anchors with rank A's, name by name (module docstring)."""
    if a.kind != b.kind or not a.n or not b.n:
        return Pairing(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    na, nb = np.array(a.names, object), np.array(b.names, object)
    ia_all, ib_all, lags = [], [], {}
    ambiguous = False
    for name in sorted(set(a.names) & set(b.names)):
        ia, ib = np.flatnonzero(na == name), np.flatnonzero(nb == name)
        lag, amb = _best_lag(a.end_ns[ia], b.end_ns[ib])
        ambiguous |= amb
        lags[name] = lag
        i0, i1 = max(0, -lag), min(ia.size, ib.size - lag)
        ia_all.append(ia[i0:i1])
        ib_all.append(ib[i0 + lag:i1 + lag])
    if not ia_all:
        return Pairing(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    ia, ib = np.concatenate(ia_all), np.concatenate(ib_all)
    return Pairing(ia, ib, b.end_ns[ib] - a.end_ns[ia], ambiguous, lags)


def rank_clock(anchors: dict, order: list | None = None) -> dict:
    """Per rank its clock offset against the reference rank (the first of ``order`` with
    collectives, ``order`` defaulting to the dict's): ``{rank: {"offset_ns", "partner", "hops", "pairs", "mad_ns", "ambiguous", "kind",
    "anchors", "reference"}}``;
    offset None for a rank with no collective in common with an aligned rank (module docstring).
    A rank's times minus its offset are on the reference's clock."""
    order = list(anchors) if order is None else list(order)
    out: dict = {}
    for r in order:
        out[r] = align_rank(anchors, r, out)
    return out


def align_rank(anchors: dict, r, aligned: dict) -> dict:
    """Rank ``r``'s entry of :func:`rank_clock`, given the ranks ``aligned`` before it. The
    reference is tried first and taken where its collectives' ends agree with r's within
    ``GOOD_MAD_NS`` (median absolute deviation): ranks of one communicator. Else each aligned
    rank is tried, and r takes the partner fewest steps from the reference among those agreeing
    about as well as the best (within twice its deviation, plus 1 µs): every step of a chain
    adds its own error."""
    a_r = anchors[r]
    none = {"offset_ns": None, "partner": None, "hops": None, "pairs": 0, "mad_ns": None, "se_ns": None,
            "significant": False, "ambiguous": False, "kind": a_r.kind, "anchors": a_r.n, "reference": False}
    if not a_r.n:
        return none
    if not any(e["offset_ns"] is not None for e in aligned.values()):  # the first rank with collectives
        return dict(none, offset_ns=0, hops=0, mad_ns=0, se_ns=0, reference=True)
    cands = []
    for q, e in sorted(aligned.items(), key=lambda qe: (qe[1]["hops"] is None, qe[1]["hops"] or 0)):
        if e["offset_ns"] is None:
            continue
        p = pair_anchors(anchors[q].shifted(e["offset_ns"]), a_r)
        if p.n:
            cands.append((q, e["hops"] + 1, p))
            if e["hops"] == 0 and p.n >= 2 and p.mad_ns <= GOOD_MAD_NS:
                break
    if not cands:
        return none
    best_mad = min(c[2].mad_ns for c in cands)
    q, hops, p = min((c for c in cands if c[2].mad_ns <= 2 * best_mad + 1000), key=lambda c: (c[1], c[2].mad_ns, -c[2].n))
    return {"offset_ns": p.offset_ns, "partner": q, "hops": hops, "pairs": p.n, "mad_ns": p.mad_ns,
            "se_ns": p.se_ns, "significant": abs(p.offset_ns) > SIGNIFICANT * p.se_ns,
            "ambiguous": bool(p.ambiguous), "kind": a_r.kind, "anchors": a_r.n, "reference": False}


def residuals(anchors: dict, offsets: dict) -> dict:
    """How far apart each paired collective's ends still are once ``offsets`` ({rank: ns, or
    None: not aligned}) are taken out (module docstring). Collectives are counted on the
    reference rank (the first of ``offsets``) and take every rank whose pairing with it holds
    them. Returns {"collectives", "median_ns", "max_ns", "ranks"} ({} when nothing pairs)."""
    ranks = [r for r, o in offsets.items() if o is not None]
    if len(ranks) < 2:
        return {}
    ref = ranks[0]
    a = anchors[ref].shifted(offsets[ref])
    lo = a.end_ns.astype(np.int64).copy()  # int64: epoch ns are beyond a double's exact integers
    hi = lo.copy()
    seen = np.ones(a.n, np.int64)
    for r in ranks[1:]:
        p = pair_anchors(a, anchors[r].shifted(offsets[r]))
        if not p.n:
            continue
        e = (anchors[r].end_ns[p.b] - offsets[r]).astype(np.int64)
        np.minimum.at(lo, p.a, e)
        np.maximum.at(hi, p.a, e)
        np.add.at(seen, p.a, 1)
    both = seen > 1
    if not both.any():
        return {}
    spread = (hi - lo)[both]
    return {"collectives": int(both.sum()), "median_ns": int(np.median(spread)), "max_ns": int(spread.max()),
            "ranks": int(len(ranks))}
