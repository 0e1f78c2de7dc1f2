"""Which CUDA kernel activity of a torch.profiler trace is which traced launch of a bundle.

A bundle's launch knows its kernel by Python name (its ``instrument.kernels``, e.g.
``FlashAttentionForwardSm90.kernel``, or its ``kernel``), its block size and recorded CTAs,
and the %globaltimer times of its warps; the profiler knows each kernel by its CUDA symbol
(CuTe DSL: ``kernel_cutlass_<function>_<module><Class>_object_at_..._0``), grid, block and
its start and end on the profiler's clock. Where a recording also stored them, per launch (see
:data:`LAUNCH_FIELDS`), the CUDA symbol(s) and the host time around the launch call make the
match exact. The steps:

1. **Candidates** of a launch: kernels named by one of its ``cuda_symbols``; else kernels whose
   name holds every identifier of the launch's kernel qualname (``FlashAttentionForwardSm90``;
   generic words like ``kernel`` aside); else those holding the most of the words of
   its ``kernel``. Then kernels whose block is not the bundle's warps x 32, whose grid is
   smaller than the CTAs it recorded, or that ran on another device, are dropped.
2. **Host time** (``host_launch_ns`` .. ``host_return_ns``): the candidate whose launch call
   (the ``cuda_runtime`` / ``cuda_driver`` event of the same correlation id) began inside that
   window. Exact: a plain launch of the same kernel just before (``check=True``) is not in it.
3. **One clock offset** for the rest: %globaltimer is one clock for every launch of every
   bundle, so the right kernels sit at one offset from their launches' first warp start. Every
   (launch, candidate) pair proposes an offset; the window of ``tolerance_ns`` holding the most
   launches wins (ties: more launches whose warp span fits in the kernel's duration, then the
   tightest window, then the offset nearest zero), and each launch takes its candidate nearest that offset. A tie between
   windows is reported as ``ambiguous``; an offset beyond ``max_clock_offset_ns`` is refused
   (a bundle recorded at another time than the trace).

The result says how each launch was matched, among how many candidates, and the raw clock
difference (kernel start − first warp start, epoch ns) that :mod:`fa4trace.profiler.merge`
aligns with and reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..trace.bundle import Trace
from ..trace.meta import InstrumentMeta, LaunchMeta
from .kineto import KinetoTrace

__all__ = ["TracedLaunch", "Match", "Unmatched", "traced_launches", "match_launches", "LAUNCH_FIELDS",
           "name_candidates"]

# Optional per-launch metadata (each launch's LaunchMeta; fa4trace.trace.meta) that makes matching exact. A recording made
# inside torch.profiler should write them; bundles without them are matched by name and clock.
LAUNCH_FIELDS = {
    "cuda_symbols": "list of the CUDA symbol names the launch ran (the compiled function's kernel names)",
    "host_launch_ns": "time.time_ns() right before the launch call (Unix epoch ns)",
    "host_return_ns": "time.time_ns() right after the launch call returned",
    "device": "CUDA device index the launch ran on",
}
GENERIC_WORDS = {"kernel", "call", "__call__", "forward", "run", "main", "fn", "func", "jit", "cute", "launch",
                 "device", "impl", "self", "synthetic"}
DEFAULT_TOLERANCE_NS = 20_000  # offset window: launch latency jitter between kernel start and first warp
HOST_SLACK_NS = 50_000  # host clock conversion slack around the launch call window
DEFAULT_MAX_CLOCK_OFFSET_NS = 1_000_000_000


@dataclass
class TracedLaunch:
    """One recorded launch of a bundle, as matching sees it."""

    bundle: int
    launch: int
    label: str  # the bundle's kernel label
    qualnames: list
    symbols: list
    host_window: tuple | None
    first_ns: int  # %globaltimer (epoch ns) of the launch's first warp start
    last_ns: int  # ... of its last warp end
    first_rel_ns: int  # the same first warp start in the bundle's own ns (start_ns)
    block_threads: int | None
    min_grid_ctas: int
    device: int | None = None

    @property
    def span_ns(self) -> int:
        return self.last_ns - self.first_ns


@dataclass
class Match:
    launch: TracedLaunch
    row: int  # the kernel's row in the KinetoTrace
    method: str  # "host-time" | "clock-offset"
    candidates: int
    ambiguous: bool = False
    delta_ns: int = 0  # kernel start - first warp start (profiler clock vs %globaltimer, epoch ns)


@dataclass
class Unmatched:
    launch: TracedLaunch
    reason: str


@dataclass
class MatchResult:
    matches: list = field(default_factory=list)
    unmatched: list = field(default_factory=list)
    offset_ns: int | None = None  # the clock offset the clock-offset step settled on
    notes: list = field(default_factory=list)


def _as_list(v) -> list:
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    return [str(x) for x in v]


def traced_launches(traces: list[Trace]) -> list[TracedLaunch]:
    """Every launch of every bundle, with what matching needs from its events and metadata."""
    out = []
    for b, tr in enumerate(traces):
        info = tr.info
        inst = info.instrument or InstrumentMeta()
        qual = _as_list(inst.kernels)
        label = str(info.kernel_name or "kernel")
        t0 = int(info.t0_globaltimer_ns or 0)
        ev = tr.events
        if ev.num_rows == 0:
            continue
        la = ev["launch"].to_numpy().astype(np.int64)
        st = ev["start_ns"].to_numpy()
        en = ev["end_ns"].to_numpy()
        cta = ev["cta"].to_numpy().astype(np.int64)
        ids, first, last, max_cta = _per_launch(la, st, en, cta)
        top_symbols = _as_list(inst.cuda_symbols or info.cuda_symbols)
        for i, k in enumerate(ids.tolist()):
            lm = info.launches[k] if 0 <= k < len(info.launches) else LaunchMeta()
            wpc = lm.warps_per_cta or inst.warps_per_cta or info.warps_per_cta
            block = lm.block or info.block
            threads = None
            if isinstance(block, (list, tuple)) and len(block) == 3:
                threads = int(block[0]) * int(block[1]) * int(block[2])
            elif wpc:
                threads = int(wpc) * 32
            h0, h1 = lm.host_launch_ns, lm.host_return_ns
            window = (int(h0), int(h1)) if h0 is not None and h1 is not None else None
            out.append(TracedLaunch(
                bundle=b, launch=int(k), label=str(lm.kernel or label), qualnames=qual or [label],
                symbols=_as_list(lm.cuda_symbols) or top_symbols,
                host_window=window, first_ns=t0 + int(first[i]), last_ns=t0 + int(last[i]),
                first_rel_ns=int(first[i]), block_threads=threads, min_grid_ctas=int(max_cta[i]) + 1,
                device=int(lm.device) if lm.device is not None else None))
    return out


def _per_launch(la: np.ndarray, st: np.ndarray, en: np.ndarray, cta: np.ndarray) -> tuple:
    """Per launch id (ascending): its first start, last end and largest CTA index. The rows are
    grouped by one stable sort (none where they come launch by launch, as bundles hold them),
    then reduced segment by segment."""
    if la.size > 1 and not (la[1:] >= la[:-1]).all():
        o = np.argsort(la, kind="stable")
        la, st, en, cta = la[o], st[o], en[o], cta[o]
    cut = np.flatnonzero(np.r_[True, la[1:] != la[:-1]])
    return (la[cut], np.minimum.reduceat(st, cut), np.maximum.reduceat(en, cut), np.maximum.reduceat(cta, cut))


def _words(s: str) -> list[str]:
    return [w for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", s) if w.lower() not in GENERIC_WORDS and len(w) >= 3]


def name_candidates(names: list[str], launch: TracedLaunch) -> tuple[set, str]:
    """The kernel names that may be this launch's, and how they were chosen."""
    if launch.symbols:
        exact = {n for n in names if n in set(launch.symbols)}
        if exact:
            return exact, "symbol"
    low = [n.lower() for n in names]
    qual_words = [w.lower() for q in launch.qualnames for w in _words(q)]
    if qual_words:
        hit = {n for n, ln in zip(names, low) if all(w in ln for w in qual_words)}
        if hit:
            return hit, "qualname"
    words = [w.lower() for w in _words(launch.label)]
    best, out = 0, set()
    for n, ln in zip(names, low):
        score = sum(len(w) for w in words if len(w) >= 4 and w in ln)
        if score > best:
            best, out = score, {n}
        elif score == best and score > 0:
            out.add(n)
    return out, "label words" if out else "none"


def _candidate_rows(kt: KinetoTrace, krows: np.ndarray, launch: TracedLaunch, names_of: dict) -> tuple[np.ndarray, str]:
    key = (tuple(launch.symbols), tuple(launch.qualnames), launch.label)
    if key not in names_of:
        names = sorted({kt.names[c] for c in np.unique(kt.name[krows]).tolist()})
        names_of[key] = name_candidates(names, launch)
    ok_names, how = names_of[key]
    if not ok_names:
        return krows[:0], how
    codes = [i for i, n in enumerate(kt.names) if n in ok_names]
    rows = krows[np.isin(kt.name[krows], codes)]
    if launch.block_threads:
        bt = kt.block[rows].prod(axis=1)
        rows = rows[(bt == launch.block_threads) | (kt.block[rows, 0] < 0)]
    gc = kt.grid[rows].prod(axis=1)
    rows = rows[(gc >= launch.min_grid_ctas) | (kt.grid[rows, 0] < 0)]
    if launch.device is not None:
        rows = rows[(kt.device[rows] == launch.device) | (kt.device[rows] < 0)]
    return rows, how


def match_launches(kt: KinetoTrace, launches: list[TracedLaunch], *, tolerance_ns: int = DEFAULT_TOLERANCE_NS,
                   max_clock_offset_ns: int | None = DEFAULT_MAX_CLOCK_OFFSET_NS) -> MatchResult:
    """Match every traced launch to one kernel activity (module docstring)."""
    res = MatchResult()
    krows = kt.kernels()
    if krows.size == 0:
        for ln in launches:
            res.unmatched.append(Unmatched(ln, "the profiler trace holds no CUDA kernel activity "
                                               "(record it with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])"))
        return res
    calls = kt.launch_calls()
    names_of: dict = {}
    cands = {}
    used: set = set()
    for ln in launches:
        rows, how = _candidate_rows(kt, krows, ln, names_of)
        if rows.size == 0:
            want = ln.symbols[:1] or ln.qualnames[:1] or [ln.label]
            res.unmatched.append(Unmatched(ln, f"no CUDA kernel in the profiler trace is named like {want[0]!r}"
                                               + (" with its block and grid" if how != "none" else "")))
            continue
        cands[id(ln)] = (ln, rows)

    # host time: the launch call inside [host_launch_ns, host_return_ns]
    rest = []
    for ln, rows in cands.values():
        if ln.host_window is None:
            rest.append((ln, rows))
            continue
        h0, h1 = ln.host_window
        call_ts = np.array([kt.ts[calls[c]] if c in calls else -1 for c in kt.correlation[rows].tolist()], np.int64)
        pick = []
        for slack in (0, HOST_SLACK_NS):  # strictly inside first; the slack covers clock conversion error
            inside = (call_ts >= h0 - slack) & (call_ts <= h1 + slack) & (call_ts >= 0)
            pick = [r for r, ok in zip(rows.tolist(), inside.tolist()) if ok and r not in used]
            if pick:
                break
        if not pick:
            rest.append((ln, rows))
            continue
        mid = (h0 + h1) // 2
        r = min(pick, key=lambda x: abs(int(kt.ts[calls[int(kt.correlation[x])]]) - mid))
        used.add(r)
        res.matches.append(Match(ln, r, "host-time", int(rows.size), len(pick) > 1, int(kt.ts[r]) - ln.first_ns))

    if rest:
        _match_by_offset(kt, rest, used, res, tolerance_ns, max_clock_offset_ns)
    res.matches.sort(key=lambda m: (m.launch.bundle, m.launch.launch))
    return res


def _match_by_offset(kt: KinetoTrace, rest: list, used: set, res: MatchResult, tol: int, max_off: int | None) -> None:
    """Step 3 of the module docstring: one clock offset for every launch left."""
    li, rr = [], []
    for i, (ln, rows) in enumerate(rest):
        rows = np.array([r for r in rows.tolist() if r not in used], np.int64)
        li.append(np.full(rows.size, i, np.int64))
        rr.append(rows)
    li = np.concatenate(li) if li else np.zeros(0, np.int64)
    rr = np.concatenate(rr) if rr else np.zeros(0, np.int64)
    first = np.array([ln.first_ns for ln, _ in rest], np.int64)
    span = np.array([ln.span_ns for ln, _ in rest], np.int64)
    if rr.size == 0:
        for ln, _ in rest:
            res.unmatched.append(Unmatched(ln, "every kernel named like it is already matched to another launch"))
        return
    off = kt.ts[rr] - first[li]
    fits = span[li] <= kt.dur[rr] + tol
    o = np.argsort(off, kind="stable")
    off_s, li_s, fit_s = off[o], li[o], fits[o]
    # sliding window [off_s[a], off_s[a] + tol]: distinct launches in it, and those whose span fits
    n_l, n_f, ends = np.zeros(off_s.size, np.int64), np.zeros(off_s.size, np.int64), np.zeros(off_s.size, np.int64)
    count: dict = {}
    fcount: dict = {}
    bb = 0
    for a in range(off_s.size):
        while bb < off_s.size and off_s[bb] <= off_s[a] + tol:
            k = int(li_s[bb])
            count[k] = count.get(k, 0) + 1
            fcount[k] = fcount.get(k, 0) + int(fit_s[bb])
            bb += 1
        n_l[a], n_f[a], ends[a] = len(count), sum(1 for v in fcount.values() if v), bb
        k = int(li_s[a])
        count[k] -= 1
        fcount[k] -= int(fit_s[a])
        if not count[k]:
            del count[k], fcount[k]
    centres = (off_s + off_s[np.maximum(ends - 1, 0)]) // 2  # middle of each window
    spread = off_s[np.maximum(ends - 1, 0)] - off_s  # a constant clock difference gives a tight window
    key = np.lexsort((-np.abs(centres), -spread, n_f, n_l))  # ascending: the best window last
    best = int(key[-1])
    centre = int(np.median(off_s[best:ends[best]]))
    same = np.flatnonzero((n_l == n_l[best]) & (n_f == n_f[best]))
    lo, hi = off_s[best], off_s[ends[best] - 1]
    ambiguous = bool(((off_s[same] > hi) | (off_s[np.maximum(ends[same] - 1, 0)] < lo)).any())
    res.offset_ns = centre
    if max_off is not None and abs(centre) > max_off:
        for ln, _ in rest:
            res.unmatched.append(Unmatched(
                ln, f"its kernels sit {centre / 1e9:+.3f} s from its warps' %globaltimer times (more than "
                    f"{max_off / 1e9:g} s): recorded at another time than the profiler trace?"))
        return
    if ambiguous:
        res.notes.append("several clock offsets fit the launches equally well (no host times or symbols in the "
                         "bundles): the tightest window (then the offset nearest zero) was taken; record under the profiler (host times, CUDA symbols) for an exact match")
    err = np.abs(off - centre)
    ok = err <= tol
    order = np.flatnonzero(ok)[np.argsort(err[ok], kind="stable")]
    taken: dict = {}
    for p in order.tolist():
        i, r = int(li[p]), int(rr[p])
        if i in taken or r in used:
            continue
        taken[i] = r
        used.add(r)
    n_cand = np.bincount(li, minlength=len(rest))
    for i, (ln, _) in enumerate(rest):
        if i in taken:
            r = taken[i]
            res.matches.append(Match(ln, r, "clock-offset", int(n_cand[i]), ambiguous, int(kt.ts[r]) - ln.first_ns))
        else:
            res.unmatched.append(Unmatched(ln, f"no kernel named like it starts within {tol / 1e3:g} µs of the "
                                               "clock offset the other launches agree on"))
