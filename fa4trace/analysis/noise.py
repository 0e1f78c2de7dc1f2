"""How far one sample of units moved from another, with a band that says what noise allows.

``shift_band(base, new, level)`` returns the Hodges–Lehmann shift (the median of every
difference new_j − base_i over all pairs of units) and its Mann–Whitney confidence interval
(Moses' interval: two order statistics of those differences, placed by the null distribution
of the U statistic). Passed log values, the shift is the log of a ratio: exp(shift) estimates
new/base and, under a change of scale, the ratio of the medians.

Why a rank method (and not a bootstrap of the medians or a t interval):

* the units are the CTAs of a launch (fa4trace.analysis.diff), and their values are not normal:
  a launch's opening and tail waves differ, and some SMs run faster than others (traces/README.md,
  "Per-SM rates"), so the spread is skewed or has two modes. The rank
  interval assumes nothing about that shape, and one odd CTA moves it no more than any other;
* bundles often hold few CTAs (instrument() records a sample; FA4's decode runs one CTA per
  head group). A bootstrap of a median from 8 units gives intervals that are too narrow,
  a t interval trusts normality there; the rank interval is exact for any sizes (the U
  distribution is counted exactly up to ``EXACT_MAX_PAIRS`` pairs, normal beyond), and where
  the units are too few for the asked level it says so (``low``/``high`` None) instead of
  pretending.

Exact up to ties; ties (equal unit values) make it conservative, never narrower.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

EXACT_MAX_PAIRS = 2500  # up to this many unit pairs the U distribution is counted exactly
MAX_UNITS = 2000  # more units than this on a side: evenly spaced order statistics of them


@dataclass(frozen=True)
class Shift:
    """``estimate``: the Hodges–Lehmann shift new − base; ``low``/``high``: its confidence band
    at the asked level (None: too few units to reach that level); ``n_base``/``n_new``: units."""

    estimate: float
    low: float | None
    high: float | None
    n_base: int
    n_new: int

    @property
    def judged(self) -> bool:
        """Whether the units were enough for a band at the asked level."""
        return self.low is not None

    @property
    def beyond(self) -> bool:
        """Whether the band excludes no change (the shift is beyond noise)."""
        return self.judged and (self.low > 0 or self.high < 0)


def u_counts(m: int, n: int) -> np.ndarray:
    """Number of arrangements of ``m`` base and ``n`` new units giving U = u, for u = 0..m*n
    (U: pairs with the new unit above the base one), by f(i, j, u) = f(i-1, j, u-j) + f(i, j-1, u)."""
    prev = [np.ones(1) for _ in range(n + 1)]  # i = 0: one arrangement, U = 0
    for i in range(1, m + 1):
        cur = [np.ones(1)]  # j = 0
        for j in range(1, n + 1):
            f = np.zeros(i * j + 1)
            f[: cur[j - 1].size] += cur[j - 1]
            f[j: j + prev[j].size] += prev[j]
            cur.append(f)
        prev = cur
    return prev[n]


def critical_count(m: int, n: int, level: float) -> int:
    """How many of the m*n ordered pair differences lie outside the band on each side: the
    largest c with P(U <= c - 1) <= (1 - level) / 2 (0: the sizes cannot reach ``level``)."""
    tail = (1.0 - level) / 2.0
    if m * n <= EXACT_MAX_PAIRS:
        f = u_counts(m, n)
        cdf = np.cumsum(f) / f.sum()
        return int(np.searchsorted(cdf, tail * (1 + 1e-12), side="right"))
    z = NormalDist().inv_cdf(1.0 - tail)
    return max(int(math.floor(m * n / 2.0 - z * math.sqrt(m * n * (m + n + 1) / 12.0))), 0)


def thin(x: np.ndarray, k: int = MAX_UNITS) -> np.ndarray:
    """At most ``k`` values: ``x`` itself, or ``k`` evenly spaced order statistics of it (same
    spread, fewer units: the band only widens)."""
    if x.size <= k:
        return x
    return np.sort(x)[np.rint(np.linspace(0, x.size - 1, k)).astype(np.int64)]


def shift_band(base, new, level: float) -> Shift:
    """The Hodges–Lehmann shift new − base and its Moses band at ``level`` (module docstring)."""
    a = thin(np.asarray(base, np.float64))
    b = thin(np.asarray(new, np.float64))
    m, n = a.size, b.size
    if m == 0 or n == 0:
        raise ValueError("shift_band needs at least one unit on each side")
    d = (b[None, :] - a[:, None]).ravel()
    mn = d.size
    c = critical_count(m, n, level)
    mids = sorted({(mn - 1) // 2, mn // 2})
    ks = sorted(set(mids + ([c - 1, mn - c] if c >= 1 else [])))
    part = np.partition(d, ks)
    est = float((part[mids[0]] + part[mids[-1]]) / 2.0)
    if c < 1:
        return Shift(est, None, None, m, n)
    return Shift(est, float(part[c - 1]), float(part[mn - c]), m, n)
