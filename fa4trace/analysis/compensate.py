"""Compensated figures: a trace's spans, waits and lags less what recording them cost.

Every event a warp records costs that warp some cycles (a timer read, a store, a cursor move),
so a span's measured duration holds, besides the work it brackets, the fixed gap between its
begin's timer read and its end's (``e``) and the cost of every event the same warp recorded
in between (``c`` each). A calibration measures both on the GPU at hand, per recorder
(``fa4trace.probes.known_answer.calibrate``; ``fa4trace check`` writes them to
``recorder_cost.json``), and this module subtracts them, as Triton Proton's ``time_shift`` does:

* span (any kind, one warp): ``raw - e - n_inner * c``; ``n_inner`` counts the records the same
  warp made strictly between the span's two timer reads. ``e`` is the recorder's offset (its
  inner offset where ``n_inner`` > 0), or, for a segment recorder's pipeline / MMA / barrier
  spans (their two records held in one segment around the call), its ``held`` offset;
* pipeline wait released by another warp's fill, both warps having last left one recorded
  barrier together and waited on nothing since (``fa4trace.analysis.barriers``): the records
  each made since, the filling warp's until the fill (``P``) and the waiting warp's until the
  wait's begin (``C``), moved the two apart; the wait is
  ``fill - begin - (P * c'_fill - C * c'_wait)`` plus the fill-to-wake time (its own where it
  blocked, the fill coming after its begin record was done, else the median of those that
  did, else the calibrated handoff lag), no shorter than an unblocked wait; so a wait that did
  not block traced but would have untraced is given back (``n_release`` = P - C);
* else, a pipeline wait released by another warp's fill after it began (the fill as
  ``fa4trace.analysis.kernel`` defines it: the first commit of the count, else the end of its
  acquire): ``raw - n_release * c'_fill``, ``n_release`` counting the records the filling warp made
  between the wait's begin and the fill (they delayed the fill). No offset: the recorder's ops
  after the begin read ran while the warp would have waited anyway. A wait whose fill came
  before it began, or has none recorded (MMA waits, barriers), is a span as above;
* producer -> consumer lag (fill to the end of the wait): after a common barrier, the wait's
  end as above less the untraced fill (its read less ``lag_offset``); else
  ``raw - n_cons * c'_wait - lag_offset``;
  ``n_cons`` counts the consumer's records between the fill and the wait's end, the wait's own
  begin aside (its own recording delays it); a wait that began after the fill did not block,
  and its offset goes too. ``lag_offset`` is the calibrated gap between a traced and an
  untraced handoff with nothing recorded in between (the fill event's read after the arrive,
  the wait's read after the wake).

``c'_fill`` and ``c'_wait`` are what one record costs a warp on its way to a handoff (from a
barrier to its fill, or to its wait's begin), measured in the handoff kernel for each way;
calibrations from before they were measured take ``c``.

Costs are calibrated in SM cycles and turned into ns per warp with the warp's own clock (its
WARP row: ns over cycles). A figure that comes out negative is clamped at 0 and counted. Raw
values stay beside compensated ones; docs/compensation.md says what the calibration measures
and how well it holds against the known-answer kernels.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..format.errors import Fa4traceError
from ..trace.bundle import Trace
from ..trace.meta import BundleMeta
from .autoevents import AutoCols
from .barriers import last_common_exit, waits_between
from .fills import filled_waits, fills
from .launches import launch_ids, launch_of
from .warptimes import WarpTimes

KEY = "recorder_cost"  # the bundle metadata key holding the calibration its figures are compensated with
FILE = "recorder_cost.json"  # what `fa4trace check` writes: {recorder: calibration}
# Spans that a segment recorder records as one segment around the call (both records held until
# it closes): instrument()'s pipeline, MMA, barrier and TMA hooks. Its user spans and hand-placed
# events store their begin at once.
HELD_FAMILIES = frozenset({"pipeline", "mma", "barrier", "tma"})
# What every compensated section says of itself: how far the calibrated costs hold is measured on
# the known-answer kernels only (docs/compensation.md); on real kernels' dense traces few
# compensated figures land within 2% of the lightest trace (BENCHMARKS, fidelity).
CAVEAT = ("an estimate, not a measurement: costs per event calibrated on spins (inside a span, and on a "
          "warp's way to a handoff), off by more where more of a figure is subtracted: an event's cost "
          "depends on the code around it, which in a real kernel no calibration measured (docs/compensation.md); "
          "take durations from passes (instrument(passes=True), record --script --passes) where they matter")


@dataclass(frozen=True)
class Calibration:
    """What one recorder's events cost its warp, in SM cycles (and ns at ``clock_ghz``).

    ``offset_cycles``: median duration of an empty span (begin right before end);
    ``held_offset_cycles``: the same with both records in one segment (segment recorders; a
    ``Recorder`` has one kind of span, the same value); ``event_cycles``: one more record inside
    a span (between work, as a real kernel's events are: ``fa4trace.probes.known_answer.calibrate``);
    ``lag_offset_cycles``: a traced handoff's lag less the untraced twin's, nothing recorded
    between (None where not measured: no lag compensation beyond the consumer's events);
    ``handoff_lag_cycles``: that traced lag itself (fill record to the end of the wait it
    released): how long a wait runs past its fill, for the waits of a pipeline where none
    blocked (None where not measured); ``inner_offset_cycles``: the offset of a span with records
    inside it, the intercept of the line through what spans holding 1 to 31 records cost (an
    empty span's two reads run back to back; with work between, what each costs overlaps that
    work differently: None in calibrations from before it was measured, and ``offset_cycles``
    is taken); ``fill_event_cycles`` and ``wait_event_cycles``: what one record costs a warp on
    its way from a barrier to a handoff, the filling warp's to its fill and the waiting warp's
    to its wait's begin, each the slope measured in the handoff kernel: the cost of the records
    counted between two warps (``P`` and ``n_release``; ``C`` and ``n_consumer``), which a
    span's own two reads do not see the same way (None in calibrations from before they were
    measured: ``event_cycles`` is taken)."""

    recorder: str
    offset_cycles: float
    held_offset_cycles: float
    event_cycles: float
    lag_offset_cycles: float | None = None
    handoff_lag_cycles: float | None = None
    inner_offset_cycles: float | None = None
    fill_event_cycles: float | None = None
    wait_event_cycles: float | None = None
    clock_ghz: float | None = None
    gpu: str | None = None
    measured_at: str | None = None
    source: str | None = None
    samples: int | None = None
    noise: dict = field(default_factory=dict)  # p10/p90 of what each median came from

    def __post_init__(self):
        for name in ("offset_cycles", "held_offset_cycles", "event_cycles"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not np.isfinite(v):
                raise Fa4traceError(f"recorder calibration of {self.recorder!r}: {name} is {v!r}, not a number")

    def span_offset_cycles(self, has_inner) -> np.ndarray:
        """A span's offset (its begin stored at once), per ``has_inner`` (a bool or bool array:
        the span holds records of its warp): the inner offset where it does and one was
        calibrated, else the offset."""
        inner = self.offset_cycles if self.inner_offset_cycles is None else self.inner_offset_cycles
        return np.where(has_inner, float(inner), float(self.offset_cycles))

    @property
    def fill_cycles(self) -> float:
        """One record's cost to the filling warp on its way to its fill: ``fill_event_cycles``
        where measured, else ``event_cycles``."""
        return float(self.event_cycles if self.fill_event_cycles is None else self.fill_event_cycles)

    @property
    def wait_cycles(self) -> float:
        """One record's cost to the waiting warp on its way to its wait (and past the fill, to
        its wake): ``wait_event_cycles`` where measured, else ``event_cycles``."""
        return float(self.event_cycles if self.wait_event_cycles is None else self.wait_event_cycles)

    def ns(self, cycles: float) -> float | None:
        """``cycles`` in ns at the calibration's clock (None where it is unknown)."""
        return cycles / self.clock_ghz if self.clock_ghz else None

    def to_dict(self) -> dict:
        """The calibration as stored (bundle metadata, result files): cycles, and ns at its clock."""
        d = asdict(self)
        for name in ("offset", "held_offset", "event", "lag_offset", "handoff_lag", "inner_offset", "fill_event",
                     "wait_event"):
            c = d[f"{name}_cycles"]
            d[f"{name}_ns"] = None if c is None else self.ns(c)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Calibration":
        if not isinstance(d, dict) or "recorder" not in d:
            raise Fa4traceError("a recorder calibration must be an object with 'recorder', 'offset_cycles', "
                                "'held_offset_cycles' and 'event_cycles'")
        names = {f.name for f in fields(cls)}
        missing = [n for n in ("offset_cycles", "held_offset_cycles", "event_cycles") if n not in d]
        if missing:
            raise Fa4traceError(f"recorder calibration of {d['recorder']!r} lacks {', '.join(missing)}")
        return cls(**{k: v for k, v in d.items() if k in names})


# ---- which calibration a bundle takes ----------------------------------------------------------------
def recorder_of(meta: dict) -> str | None:
    """The recorder a bundle was recorded with, where its metadata (as stored) says: the
    calibration it holds, else ``segment_<cursor>`` for a kernel traced by fa4trace.instrument."""
    info = BundleMeta.from_meta(meta)
    held = info.recorder_cost
    if isinstance(held, dict) and held.get("recorder"):
        return str(held["recorder"])
    if info.instrument is not None and info.instrument.cursor:
        return f"segment_{info.instrument.cursor}"
    return None


def attach(trace: Trace, cal: Calibration) -> Trace:
    """Store ``cal`` in the bundle's metadata (``KEY``): its figures are then compensated with it."""
    trace.meta[KEY] = cal.to_dict()
    return trace


def load_calibrations(path) -> dict[str, Calibration]:
    """{recorder: Calibration} from a file: ``recorder_cost.json`` as ``fa4trace check`` writes
    it ({recorder: calibration}), or one calibration object."""
    p = Path(path)
    if not p.is_file():
        raise Fa4traceError(f"{p}: no such calibration file (`fa4trace check` writes {FILE} into its folder)")
    try:
        data = json.loads(p.read_text())
    except ValueError as exc:
        raise Fa4traceError(f"{p}: not JSON ({exc})") from None
    if isinstance(data, dict) and "recorder" in data:
        data = {data["recorder"]: data}
    if not isinstance(data, dict) or not data:
        raise Fa4traceError(f"{p}: expected {{recorder: calibration}} as `fa4trace check` writes it")
    return {str(k): Calibration.from_dict(v) for k, v in data.items()}


def calibration_for(trace: Trace, calibrations: dict | None = None, *, recorder: str | None = None) -> Calibration:
    """The calibration for ``trace``: the one its metadata holds, else the entry of
    ``calibrations`` for ``recorder`` or, not given, the bundle's (``recorder_of``); one line
    saying what is missing otherwise."""
    held = trace.info.recorder_cost
    if isinstance(held, dict) and recorder in (None, held.get("recorder")):
        return Calibration.from_dict(held)
    rec = recorder or recorder_of(trace.meta)
    if not calibrations:
        raise Fa4traceError(f"{trace.name}: no recorder calibration in the bundle; pass one (`fa4trace check` writes "
                            f"{FILE}: --calibration CHECK_FOLDER/{FILE})")
    if rec is None:
        if len(calibrations) == 1:
            return next(iter(calibrations.values()))
        raise Fa4traceError(f"{trace.name}: the bundle does not say which recorder wrote it; name it (--recorder: "
                            f"{', '.join(sorted(calibrations))})")
    if rec not in calibrations:
        raise Fa4traceError(f"{trace.name}: recorded with {rec}, the calibration file has "
                            f"{', '.join(sorted(calibrations))}")
    return calibrations[rec]


# ---- records per warp ------------------------------------------------------------------------------
class _Records:
    """Every record of a trace (span begins, span ends, instants) by warp, in cycles and in ns
    (``WarpTimes``), so that how many a warp made in an interval is two binary searches."""

    def __init__(self, c: AutoCols, start_cycles: np.ndarray, end_cycles: np.ndarray):
        span = (c.kind == 0)
        inst = (c.kind == 1)
        rows = np.concatenate([np.flatnonzero(span | inst), np.flatnonzero(span)])
        gid = c.warp_gid[rows]
        is_end = np.r_[np.zeros(int((span | inst).sum()), bool), np.ones(int(span.sum()), bool)]
        self.cycles = WarpTimes(gid, np.where(is_end, end_cycles[rows], start_cycles[rows]), c.n_warps)
        self.ns = WarpTimes(gid, np.where(is_end, c.end[rows], c.start[rows]), c.n_warps)

    def between(self, gid, t0, t1, *, ns: bool = False) -> np.ndarray:
        """Records of warp ``gid`` strictly between ``t0`` and ``t1`` (arrays, same length)."""
        return (self.ns if ns else self.cycles).between(gid, t0, t1)


def _ns_per_cycle(c: AutoCols, start_cycles, end_cycles, cal: Calibration) -> np.ndarray:
    """Per warp gid: its ns per SM cycle, from its WARP row (both timebases keep the clock64
    anchors there); a warp without one (a filtered table) takes the median of the others, else
    the calibration's clock."""
    out = np.full(c.n_warps, np.nan)
    w = np.flatnonzero(c.is_warp_row)
    dc = (end_cycles[w] - start_cycles[w]).astype(np.float64)
    dn = (c.end[w] - c.start[w]).astype(np.float64)
    ok = dc > 0
    out[c.warp_gid[w[ok]]] = dn[ok] / dc[ok]
    known = np.isfinite(out)
    if not known.all():
        if known.any():
            out[~known] = float(np.median(out[known]))
        elif cal.clock_ghz:
            out[:] = 1.0 / cal.clock_ghz
        else:
            raise Fa4traceError("no warp of the trace has its lifetime row (cycles and ns), and the calibration "
                                "names no clock: cycles cannot be turned into ns")
    return out


# ---- fills: the events that release pipeline waits ---------------------------------------------------
def _releases(c: AutoCols):
    """Per row: the fill that released it (ns, filling warp gid), -1 where the row is not a
    pipeline wait with a recorded fill."""
    fill_ns = np.full(c.n, -1, np.int64)
    fill_gid = np.full(c.n, -1, np.int64)
    for p in c.pipelines():
        keys, ft, fg = fills(c, p)
        rows, pos = filled_waits(c, p, keys)
        fill_ns[rows] = ft[pos]
        fill_gid[rows] = fg[pos]
    return fill_ns, fill_gid


# ---- the compensated tables ----------------------------------------------------------------------------
SPAN_SCHEMA = pa.schema([("launch", pa.int16()), ("cta", pa.int32()), ("warp", pa.int16()), ("name", pa.string()),
                         ("iter", pa.int32()), ("raw_ns", pa.int64()), ("n_inner", pa.int32()),
                         ("n_release", pa.int32()), ("cost_ns", pa.float64()), ("ns", pa.float64()),
                         ("clamped", pa.bool_())])
LAG_SCHEMA = pa.schema([("launch", pa.int16()), ("cta", pa.int32()), ("pipeline", pa.string()), ("iter", pa.int32()),
                        ("warp", pa.int16()), ("raw_ns", pa.int64()), ("n_consumer", pa.int32()),
                        ("cost_ns", pa.float64()), ("ns", pa.float64()), ("clamped", pa.bool_())])


def _offsets(c: AutoCols, rows: np.ndarray, cal: Calibration, inner: np.ndarray | None = None) -> np.ndarray:
    """Per span row: the recorder's gap between its two reads beyond the work between, in cycles:
    its offset, or, where ``inner`` says the span holds records of its warp, its inner offset
    (where calibrated); a segment recorder's pipeline, MMA, barrier and TMA spans: its held offset."""
    off = cal.span_offset_cycles(np.zeros(rows.size, bool) if inner is None else inner)
    if not cal.recorder.startswith("segment_"):
        return off
    held = np.array([f in HELD_FAMILIES for f in c.families])[c.family[rows]]
    return np.where(held, cal.held_offset_cycles, off)


class _Trace:
    """What both tables need of a trace, computed once: its columns, each warp's records and
    clock, and which fill released each pipeline wait."""

    def __init__(self, trace: Trace, cal: Calibration):
        self.c = c = AutoCols.of(trace)
        ev = trace.events
        self.sc, self.ec = ev["start_cycles"].to_numpy(), ev["end_cycles"].to_numpy()
        self.rec = _Records(c, self.sc, self.ec)
        self.ratio = _ns_per_cycle(c, self.sc, self.ec, cal)
        self.fill_ns, self.fill_gid = _releases(c)
        self.aligned = _aligned_waits(self, cal)

    def labels(self, names: list, codes: np.ndarray) -> pa.Array:
        """``names[codes]`` as a string column (one take, no Python loop)."""
        return pa.array(names, pa.string()).take(pa.array(codes.astype(np.int64)))


class _Aligned:
    """Pipeline waits whose two warps passed a recorded barrier together before (module doc):
    ``rows`` (the wait rows, sorted), ``n_net`` (the filling warp's records since that barrier
    less the waiting warp's before its wait began), ``wait_cost`` and ``lag_cost`` (what the raw
    wait and lag hold beyond the wait and the lag the untraced run would have had)."""

    def __init__(self, rows, n_net, wait_cost, lag_cost):
        self.rows, self.n_net, self.wait_cost, self.lag_cost = rows, n_net, wait_cost, lag_cost

    def take(self, rows: np.ndarray, name: str, other: np.ndarray) -> np.ndarray:
        """Per row of ``rows``: this set's ``name`` where it holds the row, else ``other``'s."""
        if not self.rows.size:
            return other
        pos = np.minimum(np.searchsorted(self.rows, rows), self.rows.size - 1)
        return np.where(self.rows[pos] == rows, getattr(self, name)[pos], other)


def _aligned_waits(t: "_Trace", cal: Calibration) -> _Aligned:
    """The waits released by another warp's fill, where both warps last passed one barrier
    (fa4trace.analysis.barriers): each warp's time since it, less its own records' cost, gives
    the fill and the wait's begin as untraced; the wait ran to the fill plus the handoff's own
    fill-to-wake time (this wait's raw one where it blocked, the fill after its begin record was
    done: one offset and one record's cost on the way to a wait after the begin read; else the
    median of the pipeline's waits that did; where none did, the calibrated handoff lag), and
    no shorter than an unblocked wait (its raw less the offset). The lag runs from the untraced
    fill: its read less the lag offset."""
    c, rec, ratio = t.c, t.rec, t.ratio
    rows = np.flatnonzero((t.fill_gid >= 0) & (t.fill_gid != c.warp_gid))
    empty = np.zeros(0)
    if not rows.size:
        return _Aligned(rows, rows, empty, empty)
    gid, fg, f = c.warp_gid[rows], t.fill_gid[rows], t.fill_ns[rows]
    b, e = c.start[rows], c.end[rows]
    xc, xp = last_common_exit(c, gid, b, fg, f)
    keep = xc >= 0
    if keep.any():  # the barrier must be both warps' last point of alignment (barriers.py)
        k = int(keep.sum())
        n = waits_between(c, np.r_[gid[keep], fg[keep]], np.r_[xc[keep], xp[keep]], np.r_[b[keep], f[keep]])
        keep[keep] = (n[:k] == 0) & (n[k:] == 0)
    rows, gid, fg, f, b, e, xc, xp = (a[keep] for a in (rows, gid, fg, f, b, e, xc, xp))
    if not rows.size:
        return _Aligned(rows, rows, empty, empty)
    n_p = rec.between(fg, xp, f, ns=True)
    n_c = rec.between(gid, xc, b, ns=True)
    delta = ratio[fg] * n_p * cal.fill_cycles - ratio[gid] * n_c * cal.wait_cycles
    lag_off = ratio[gid] * (cal.lag_offset_cycles or 0.0)
    offset = ratio[gid] * _offsets(c, rows, cal)
    # blocked: the fill came after the warp polled, its wait's begin record done (the span's
    # offset and a record's cost on the way to a wait after its begin read); a fill before that
    # is seen only when the record ends, and the fill-to-wake time read there holds its rest
    blocked = f - b > offset + ratio[gid] * cal.wait_cycles
    lag = (e - f).astype(np.float64)  # fill read to wake, raw: where the wait blocked, its own
    res = c.resource[rows]
    for r in np.unique(res[~blocked]):
        m = res == r
        if (m & blocked).any():
            lag[m & ~blocked] = float(np.median(lag[m & blocked]))
        else:
            lag[m & ~blocked] = ratio[gid[m & ~blocked]] * (cal.handoff_lag_cycles or 0.0)
    unblocked = np.where(f > b, 0.0, (e - b) - offset)
    wait = np.maximum((f - b) - delta + lag, unblocked)
    wait_cost = (e - b) - wait
    # the lag runs from the untraced fill: delta earlier than the wait's begin moved, and the lag
    # offset earlier than its read (the read after the arrive)
    return _Aligned(rows, n_p - n_c, wait_cost, wait_cost - delta + lag_off)


def spans(trace: Trace, cal: Calibration) -> pa.Table:
    """One row per span (WARP rows aside): launch, cta, warp, name, iter, ``raw_ns``,
    ``n_inner`` (the warp's records strictly between its two reads), ``n_release`` (a pipeline
    wait: the filling warp's records between the wait's begin and the fill; after a common
    barrier, its records since the barrier less the waiting warp's, module doc), ``cost_ns``
    (what is subtracted: negative where a wait is given back), ``ns`` (compensated, >= 0) and
    ``clamped`` (it came out negative)."""
    if trace.events.num_rows == 0:
        return SPAN_SCHEMA.empty_table()
    return _span_table(_Trace(trace, cal), cal)


def _span_table(t: _Trace, cal: Calibration) -> pa.Table:
    c, rec, ratio = t.c, t.rec, t.ratio
    rows = np.flatnonzero(c.kind == 0)
    gid = c.warp_gid[rows]
    n_inner = rec.between(gid, t.sc[rows], t.ec[rows])
    fns, fg = t.fill_ns[rows], t.fill_gid[rows]
    released = (fg >= 0) & (fg != gid) & (fns > c.start[rows])
    n_rel = np.zeros(rows.size, np.int64)
    if released.any():
        n_rel[released] = rec.between(fg[released], c.start[rows][released], fns[released], ns=True)
    # a wait that blocked until a later fill hid the recorder's ops after its begin read: no offset
    offset = np.where(released, 0.0, _offsets(c, rows, cal, n_inner > 0))
    ratio_rel = np.where(released, ratio[np.maximum(fg, 0)], ratio[gid])
    cost = ratio[gid] * (offset + n_inner * cal.event_cycles) + ratio_rel * n_rel * cal.fill_cycles
    raw = (c.end[rows] - c.start[rows]).astype(np.int64)
    cost = t.aligned.take(rows, "wait_cost", cost)  # waits after a barrier both passed: from there
    n_rel = t.aligned.take(rows, "n_net", n_rel)
    comp = raw - cost
    return pa.table({
        "launch": pa.array(c.launch[rows].astype(np.int16)), "cta": pa.array(c.cta[rows].astype(np.int32)),
        "warp": pa.array(c.warp[rows].astype(np.int16)), "name": t.labels(c.name_dict, c.name_codes[rows]),
        "iter": pa.array(c.iter[rows].astype(np.int32)), "raw_ns": pa.array(raw),
        "n_inner": pa.array(n_inner.astype(np.int32)), "n_release": pa.array(n_rel.astype(np.int32)),
        "cost_ns": pa.array(cost), "ns": pa.array(np.maximum(comp, 0.0)), "clamped": pa.array(comp < 0)},
        schema=SPAN_SCHEMA)


def lags(trace: Trace, cal: Calibration) -> pa.Table:
    """One row per pipeline wait with a recorded fill: ``raw_ns`` = the wait's end - the fill
    (``fa4trace.analysis.kernel.pipeline_lags``), ``n_consumer`` (the waiting warp's records
    between the fill and its wait's end, the wait's begin aside; after a common barrier, its
    records since the barrier less the filling warp's), ``cost_ns``, ``ns`` (compensated,
    >= 0), ``clamped``."""
    if trace.events.num_rows == 0:
        return LAG_SCHEMA.empty_table()
    return _lag_table(_Trace(trace, cal), cal)


def _lag_table(t: _Trace, cal: Calibration) -> pa.Table:
    c = t.c
    rows = np.flatnonzero(t.fill_gid >= 0)
    if not rows.size:
        return LAG_SCHEMA.empty_table()
    gid = c.warp_gid[rows]
    f = t.fill_ns[rows]
    # the waiting warp's records after the fill, its wait's own begin aside: a wait that began
    # after the fill did not block, and its two reads are a span's offset apart
    late = c.start[rows] > f
    n_cons = t.rec.between(gid, f, c.end[rows], ns=True) - late
    cost = t.ratio[gid] * (n_cons * cal.wait_cycles + np.where(late, _offsets(c, rows, cal), 0.0)
                           + (cal.lag_offset_cycles or 0.0))
    raw = (c.end[rows] - f).astype(np.int64)
    cost = t.aligned.take(rows, "lag_cost", cost)  # waits after a barrier both passed: from there
    n_cons = -t.aligned.take(rows, "n_net", -n_cons)
    comp = raw - cost
    return pa.table({
        "launch": pa.array(c.launch[rows].astype(np.int16)), "cta": pa.array(c.cta[rows].astype(np.int32)),
        "pipeline": t.labels(c.resources, c.resource[rows]),
        "iter": pa.array(c.iter[rows].astype(np.int32)), "warp": pa.array(c.warp[rows].astype(np.int16)),
        "raw_ns": pa.array(raw), "n_consumer": pa.array(n_cons.astype(np.int32)), "cost_ns": pa.array(cost),
        "ns": pa.array(np.maximum(comp, 0.0)), "clamped": pa.array(comp < 0)}, schema=LAG_SCHEMA)


# ---- summary and text ------------------------------------------------------------------------------------
def _per_name(table: pa.Table, key: str) -> dict:
    """{name in ``key``: n, median and p90 raw and compensated, clamped, and
    ``subtracted_pct``: the median share of a raw figure that was subtracted (what its error
    grows with: the estimate is of the recorder's time, not of the work)} over ``table``'s rows."""
    names = table[key].combine_chunks().dictionary_encode()
    codes = names.indices.to_numpy(zero_copy_only=False)
    raw, comp = table["raw_ns"].to_numpy().astype(np.float64), table["ns"].to_numpy()
    cost = table["cost_ns"].to_numpy()
    clamped = table["clamped"].to_numpy(zero_copy_only=False)
    share = np.where(raw > 0, 100.0 * np.minimum(cost, raw) / np.maximum(raw, 1.0), 0.0)
    out = {}
    for i, n in sorted(enumerate(names.dictionary.to_pylist()), key=lambda kv: kv[1]):
        m = codes == i
        r, v = raw[m], comp[m]
        out[n] = {"n": int(m.sum()), "raw_median_ns": float(np.median(r)), "median_ns": float(np.median(v)),
                  "raw_p90_ns": float(np.percentile(r, 90)), "p90_ns": float(np.percentile(v, 90)),
                  "clamped": int(clamped[m].sum()), "subtracted_pct": float(np.median(share[m]))}
    return out


def summary(trace: Trace, cal: Calibration) -> dict:
    """What ``fa4trace summary --compensate`` adds: per span event and per pipeline's lag, the
    median and p90 raw and compensated, how many came out negative (clamped at 0), and the
    calibration used. ``shown`` names the figures this section holds (compensated, raw beside)."""
    out = {"shown": "compensated (raw beside)", "recorder": cal.recorder, "calibration": cal.to_dict(),
           "caveat": CAVEAT, "spans": {}, "lags": {}, "clamped": 0, "compensated": 0}
    if trace.events.num_rows == 0:
        return out
    t = _Trace(trace, cal)
    for key, table, col in (("spans", _span_table(t, cal), "name"), ("lags", _lag_table(t, cal), "pipeline")):
        if table.num_rows:
            out[key] = _per_name(table, col)
            out["clamped"] += int(table["clamped"].to_numpy(zero_copy_only=False).sum())
            out["compensated"] += table.num_rows
    return out


def summary_by_launch(trace: Trace, cal: Calibration, launch: int | None = None) -> dict:
    """``summary`` of one launch (``launch``, or a bundle of one), else of each launch in turn
    (``per_launch``): no figure mixes launches (fa4trace.analysis.launches)."""
    ids = launch_ids(trace)
    if launch is not None or len(ids) <= 1:
        one = summary(launch_of(trace, launch) if launch is not None else trace, cal)
        one["launch"] = launch if launch is not None else (ids[0] if ids else 0)
        return one
    return {"shown": "compensated (raw beside), per launch", "recorder": cal.recorder, "calibration": cal.to_dict(),
            "caveat": CAVEAT, "launch": None,
            "per_launch": [dict(summary(launch_of(trace, n), cal), launch=n) for n in ids]}


def lines(comp: dict) -> list[str]:
    """``summary`` (or ``summary_by_launch``)'s result as text: the calibration, then per launch
    one line per span event and per lag (median compensated, raw beside), and how many were
    clamped."""
    cal = comp["calibration"]

    def ns(v):
        return "-" if v is None else f"{v:.1f}"

    inner = cal.get("inner_offset_ns")
    head = (f"compensated    recorder {comp['recorder']}: offset {ns(cal.get('offset_ns'))} ns"
            + (f" ({ns(inner)} ns with records inside)" if inner is not None else "")
            + f", held offset {ns(cal.get('held_offset_ns'))} ns, {ns(cal.get('event_ns'))} ns per event"
            + (f" ({ns(cal.get('fill_event_ns'))} ns on the way to a fill, {ns(cal.get('wait_event_ns'))} ns to a wait)"
               if cal.get("fill_event_ns") is not None else "")
            + (f", lag offset {ns(cal.get('lag_offset_ns'))} ns" if cal.get("lag_offset_ns") is not None else "")
            + f" ({cal.get('gpu') or 'GPU not named'}, {cal.get('measured_at') or 'date not recorded'})")
    out = [head, f"               {CAVEAT}",
           "               median ns, compensated (raw); p90; share of raw subtracted"]
    for one in comp.get("per_launch") or [comp]:
        if "per_launch" in comp:
            out.append(f"               launch {one['launch']}")
        for kind, table in (("span", one["spans"]), ("lag", one["lags"])):
            for name, d in table.items():
                share = d.get("subtracted_pct")
                out.append(f"               {kind} {name}: {d['median_ns']:.1f} ({d['raw_median_ns']:.1f}); "
                           f"p90 {d['p90_ns']:.1f} ({d['raw_p90_ns']:.1f})"
                           + (f"; {share:.0f}% subtracted" if share is not None else "") + f"; n {d['n']}"
                           + (f", {d['clamped']} clamped at 0" if d["clamped"] else ""))
        out.append(f"               {one['clamped']} of {one['compensated']} figures clamped at 0")
    return out
