"""Record the known-answer kernels (``fa4trace.kernels.known_answer``) and calibrate the
recorder with them: what one event of each recorder costs its warp on the GPU at hand.

``record`` runs a recorder variant and returns its bundle; ``time_untraced`` runs the untraced
twin (the same spins, two %clock64 reads around each region) and returns what each region
lasted, in cycles: the truth the traces are held against. ``calibrate`` measures, for one
recorder, the numbers ``fa4trace.analysis.compensate`` subtracts (``Calibration``'s fields):
the offset of a span with work inside and what each event inside adds (spans set against the
untraced twin's), what a record costs a warp on its way to a handoff (the handoff kernel, set
against its twin), the held offset (an empty span held in one segment), the handoff lag (a
traced handoff's producer -> consumer lag, nothing recorded between) and the lag offset (that
less the untraced twin's).
Results are cached per process, GPU, recorder and build.
"""

from __future__ import annotations

import numpy as np

from ..kernels import known_answer_spec as S
from ..run.gpu import gpu_facts, require_cuda
from ..run.record import TracedLaunch
from ..run.record import record as record_launches
from ..trace.bundle import Trace

CAL_REPS = 32  # calibration rounds per warp (an empty span, a held one, a run of CAL_EVENTS events)
CAL_SPANS = 16  # spans per warp at each density of the calibration
CAL_CYCLES = 4000  # their length (2 µs at 2 GHz)
CAL_DENSITIES = (1, 2, 4, 8, 16, 32)  # 0 to 31 events inside: events from 2 µs to ~60 ns apart
LAG_REPS = 64  # handoff rounds of the lag offset
LAG_CYCLES = 4000  # the producer's spin in those rounds: the consumer waits before the fill
PATH_REPS = 16  # handoff rounds per density of the path cost
PATH_CYCLES = 6000  # the spin of the warp that records on its way (3 µs at 2 GHz)
PATH_DENSITIES = (1, 4, 10, 25)  # 0 to 24 records on the way
_CACHE: dict = {}


def _sms() -> int:
    return int(require_cuda().cuda.get_device_properties(0).multi_processor_count)


def _params(test: str, reps: int, cal_reps: int, cycles: int, density: int, cons_cycles: int,
            cons_density: int, n_ctas: int | None) -> dict:
    if reps < 0 or cal_reps < 0 or reps + cal_reps < 1:
        raise ValueError(f"reps and cal_reps must be >= 0 with at least one round, got {reps} and {cal_reps}")
    if density < 1 or cons_density < 1 or cycles < 0 or cons_cycles < 0 or max(cycles, cons_cycles) >= 1 << 31:
        raise ValueError("densities must be >= 1 and cycles 0..2**31-1")
    if test == "handoff" and (cal_reps or reps < 1):
        raise ValueError("the handoff test has no calibration rounds and needs reps >= 1")
    return dict(test=test, reps=reps, cal_reps=cal_reps, cycles=cycles, density=density, cons_cycles=cons_cycles,
                cons_density=cons_density, n_ctas=n_ctas or _sms())


def _launch_args(p: dict):
    return (p["n_ctas"], p["reps"], p["cal_reps"], p["cycles"], p["density"], p["cons_cycles"], p["cons_density"])


def record(variant: str, test: str = "spans", *, reps: int = 16, cal_reps: int = 0, cycles: int = 0,
           density: int = 1, cons_cycles: int = 0, cons_density: int = 1, n_ctas: int | None = None,
           build=None) -> Trace:
    """One traced launch of a recorder variant (``known_answer_spec.RECORDERS``) of ``test``
    (every warp of every CTA records; the slot holds every record). ``n_ctas``: default one per SM."""
    from ..run import loader

    S.check_variant(variant, test)
    if variant == S.UNTRACED:
        raise ValueError(f"{S.UNTRACED!r} records nothing: time it with time_untraced")
    p = _params(test, reps, cal_reps, cycles, density, cons_cycles, cons_density, n_ctas)
    cap = S.records_per_warp(test, reps, cal_reps, density, cons_density)
    if variant == "segment_ring" and cap > S.RING_RECORDS:
        raise ValueError(f"{cap} records per warp overflow the ring of {S.RING_RECORDS}: record fewer rounds")
    torch = require_cuda()
    kern = loader.load("known_answer", build=build, variant=variant, test=test)
    out = torch.zeros(max(1, S.out_words(test, p["n_ctas"], reps, cal_reps)), dtype=torch.int64, device="cuda")
    launch = TracedLaunch(
        kernel=f"known_answer_{test}_{variant}", grid_ctas=p["n_ctas"], warps_per_cta=S.WARPS_PER_CTA,
        run=lambda tr: kern.fn(out, tr, *_launch_args(p)), grid=(p["n_ctas"], 1, 1),
        block=(32 * S.WARPS_PER_CTA, 1, 1), capacity=cap + 8, extra={"how": kern.how})
    return record_launches([launch], kernel=f"known_answer_{test}_{variant}", vocab=S.vocabulary(),
                           config={"variant": variant, **{k: v for k, v in p.items()}})


def time_untraced(test: str = "spans", *, reps: int = 16, cal_reps: int = 0, cycles: int = 0, density: int = 1,
                  cons_cycles: int = 0, cons_density: int = 1, n_ctas: int | None = None, build=None) -> dict:
    """The untraced twin's regions, in %clock64 cycles, as numpy arrays.

    spans: ``empty``, ``held``, ``run`` (calibration rounds: two reads around nothing, and around
    the run's place) and ``span`` (each span's region), shape (warps, rounds). handoff, shape
    (CTAs, rounds): ``wait`` (the consumer's wait, read to read), ``lag`` (the producer's read
    right after its arrive to the consumer's read right after its wake; one SM, one clock) and
    ``produce`` (the producer's round start to that read)."""
    from ..run import loader

    S.check_variant(S.UNTRACED, test)
    p = _params(test, reps, cal_reps, cycles, density, cons_cycles, cons_density, n_ctas)
    torch = require_cuda()
    kern = loader.load("known_answer", build=build, variant=S.UNTRACED, test=test)
    out = torch.zeros(max(1, S.out_words(test, p["n_ctas"], reps, cal_reps)), dtype=torch.int64, device="cuda")
    kern.fn(out, None, *_launch_args(p))
    torch.cuda.synchronize()
    w = out.cpu().numpy()
    if test == "spans":
        t = w.reshape(p["n_ctas"] * S.WARPS_PER_CTA, S.span_slots(reps, cal_reps), S.SPAN_WORDS)
        d = t[:, :, 1] - t[:, :, 0]
        cal = d[:, :3 * cal_reps].reshape(d.shape[0], cal_reps, 3)
        return {"empty": cal[:, :, 0], "held": cal[:, :, 1], "run": cal[:, :, 2], "span": d[:, 3 * cal_reps:]}
    t = w.reshape(p["n_ctas"], reps, S.HANDOFF_WORDS)
    return {"wait": t[:, :, 3] - t[:, :, 2], "lag": t[:, :, 3] - t[:, :, 1], "produce": t[:, :, 1] - t[:, :, 0]}


def durations(trace: Trace, name: str) -> np.ndarray:
    """Cycles between the two reads of every span called ``name`` (one warp's own clock)."""
    rows = events_named(trace.events, name, "span")
    return (rows["end_cycles"].to_numpy() - rows["start_cycles"].to_numpy()).astype(np.int64)


def events_named(ev, name: str, kind: str | None = None):
    """The rows of the events table ``ev`` called ``name`` (and of ``kind``: "span", "instant")."""
    import pyarrow.compute as pc

    m = pc.equal(ev["name"].cast("string"), name)
    if kind is not None:
        m = pc.and_(m, pc.equal(ev["kind"].cast("string"), kind))
    return ev.filter(m)


def _per_round(first, then, first_at: str, then_at: str) -> np.ndarray:
    """Per row of ``then`` with a row of ``first`` in the same CTA and round (``iter``): its
    ``then_at`` cycles less that row's ``first_at`` (one SM's clock)."""
    key = lambda t: t["cta"].to_numpy().astype(np.int64) << 32 | t["iter"].to_numpy()  # noqa: E731
    fk, tk = key(first), key(then)
    if not fk.size or not tk.size:
        return np.zeros(0, np.int64)
    o = np.argsort(fk)
    pos = np.minimum(np.searchsorted(fk[o], tk), fk.size - 1)
    hit = fk[o][pos] == tk
    return (then[then_at].to_numpy()[hit] - first[first_at].to_numpy()[o][pos][hit]).astype(np.int64)


def handoff_lags(trace: Trace) -> np.ndarray:
    """Cycles from each round's fill (``handoff.commit``) to the end of its wait, per CTA (the
    producer and the consumer share their SM's clock)."""
    ev = trace.events
    return _per_round(events_named(ev, f"{S.PIPELINE}.commit"), events_named(ev, f"{S.PIPELINE}.wait", "span"),
                      "start_cycles", "end_cycles")


def _spread(x: np.ndarray) -> dict:
    x = np.asarray(x, np.float64)
    return {"p10": float(np.percentile(x, 10)), "median": float(np.median(x)), "p90": float(np.percentile(x, 90))}


def calibrate(recorder: str, *, n_ctas: int | None = None, build=None, cache: bool = True) -> dict:
    """What one event of ``recorder`` costs its warp on this GPU: a dict of
    ``fa4trace.analysis.compensate.Calibration``'s fields, cycles and the clock they were
    measured at, with the spread of what each came from (``noise``).

    Measured where the events of a real kernel sit, between work: spans of ``CAL_CYCLES`` with
    0 to 31 events inside (``CAL_DENSITIES``), each set against the untraced twin's (the same
    spins; means over every span; each sub-spin is shortened by the one before's overshoot, so a
    span's spins overshoot once, as the twin's do). ``offset``: what a span with nothing inside
    reads beyond the twin's. ``event`` and ``inner offset``: the line through what the others
    read beyond the twin's against the events inside them (``fit_event_cost``). ``held offset``:
    the median empty span held in one segment. ``fill event`` and ``wait event``: what a record
    costs a warp on its way from a barrier to its fill, and to its wait (``path_cost``).
    ``handoff lag``: a traced handoff's fill-to-wake lag, its median; ``lag offset``: its mean
    less the twin's. Also reported, not used: the fits' residuals, and
    ``back_to_back_event_cycles``, one event of a run of ``CAL_EVENTS`` with nothing between
    them."""
    S.check_variant(recorder, "spans")
    if recorder == S.UNTRACED:
        raise ValueError("calibrate a recorder, not the untraced twin")
    torch = require_cuda()
    key = (torch.cuda.current_device(), torch.cuda.get_device_name(), recorder, str(build), n_ctas)
    if cache and key in _CACHE:
        return dict(_CACHE[key])
    kw = dict(reps=CAL_SPANS, cycles=CAL_CYCLES, n_ctas=n_ctas, build=build)
    light = record(recorder, "spans", cal_reps=CAL_REPS, density=1, **kw)
    excess, raws = [], []
    for k in CAL_DENSITIES:
        traced = light if k == 1 else record(recorder, "spans", density=k, **kw)
        twin = time_untraced("spans", cal_reps=4, density=k, **kw)
        raw = durations(traced, "ka.span")
        raws.append(raw)
        excess.append(float(np.mean(raw)) - (float(np.mean(twin["span"])) - float(np.mean(twin["empty"]))))
    offset, inner_offset, event, residuals = fit_event_cost(np.asarray(CAL_DENSITIES) - 1, excess)
    empty, held, run = (durations(light, n) for n in ("ka.empty", "ka.held", "ka.run"))
    handoff = record(recorder, "handoff", reps=LAG_REPS, cycles=LAG_CYCLES, n_ctas=n_ctas, build=build)
    twin = time_untraced("handoff", reps=LAG_REPS, cycles=LAG_CYCLES, n_ctas=n_ctas, build=build)
    lag = handoff_lags(handoff)
    path = path_cost(recorder, n_ctas=n_ctas, build=build)
    ghz = light.info.launches[0].clock_ghz_median
    out = {"recorder": recorder, "offset_cycles": offset, "held_offset_cycles": float(np.median(held)),
           "event_cycles": event, "inner_offset_cycles": inner_offset,
           "fill_event_cycles": path["fill_event_cycles"], "wait_event_cycles": path["wait_event_cycles"],
           "lag_offset_cycles": float(np.mean(lag) - np.mean(twin["lag"])) if lag.size else None,
           "handoff_lag_cycles": float(np.median(lag)) if lag.size else None,
           "clock_ghz": float(ghz) if ghz else None, "gpu": gpu_facts().get("name"),
           "measured_at": _now(), "source": "fa4trace.probes.known_answer.calibrate",
           "samples": int(sum(r.size for r in raws)),
           "noise": {"densities": list(CAL_DENSITIES), "excess_cycles": excess, "fit_residual_cycles": residuals,
                     "empty_cycles": _spread(empty), "held_cycles": _spread(held),
                     "lag_cycles": _spread(lag) if lag.size else None, "untraced_lag_cycles": _spread(twin["lag"]),
                     "back_to_back_event_cycles": (float(np.median(run)) - float(np.median(empty))) / S.CAL_EVENTS,
                     "path": path}}
    _CACHE[key] = out
    return dict(out)


def path_cost(recorder: str, *, n_ctas: int | None = None, build=None) -> dict:
    """What one record costs a warp on its way from the round's barrier to its handoff, in
    cycles: the producer's records before its fill (the consumer waiting), and the consumer's
    before its wait's begin (the producer spinning past it), ``PATH_DENSITIES`` sub-spins of
    ``PATH_CYCLES`` in all, each way set against the untraced twin's (means over every round).
    ``fill_event_cycles`` and ``wait_event_cycles``: the slope of each way's least-squares line
    (``fit_path_cost``), the costs ``compensate`` takes for the filling and the waiting warp's
    records it counts between two warps; the excess and the residuals are reported beside."""
    kw = dict(reps=PATH_REPS, n_ctas=n_ctas, build=build)
    sides = {"producer": lambda k: dict(cycles=PATH_CYCLES, density=k, cons_cycles=0, cons_density=1),
             "consumer": lambda k: dict(cycles=PATH_CYCLES + PATH_CYCLES // 2, density=1,
                                        cons_cycles=PATH_CYCLES, cons_density=k)}
    excess = {}
    for side, params in sides.items():
        excess[side] = []
        for k in PATH_DENSITIES:
            traced = record(recorder, "handoff", **kw, **params(k))
            twin = time_untraced("handoff", **kw, **params(k))
            prod, cons = handoff_paths(traced)
            if side == "producer":
                excess[side].append(float(np.mean(prod)) - float(np.mean(twin["produce"])))
            else:  # the twin's consumer reaches its wait produce + lag - wait cycles after the round began
                excess[side].append(float(np.mean(cons))
                                    - float(np.mean(twin["produce"] + twin["lag"] - twin["wait"])))
    n = np.asarray(PATH_DENSITIES, np.float64) - 1
    fill, wait, residuals = fit_path_cost(n, excess["producer"], excess["consumer"])
    return {"fill_event_cycles": fill, "wait_event_cycles": wait, "densities": list(PATH_DENSITIES),
            "cycles": PATH_CYCLES, "excess_cycles": excess, "fit_residual_cycles": residuals}


def fit_path_cost(inside, producer, consumer) -> tuple[float, float, dict]:
    """(the producer's cost per record, the consumer's, each side's residuals): each side's
    least-squares line of what its way took beyond the twin's against the records on it."""
    n = np.asarray(inside, np.float64)
    if np.unique(n).size < 2:
        raise ValueError("fit_path_cost needs at least two record counts")
    out, res = [], {}
    for side, ex in (("producer", producer), ("consumer", consumer)):
        y = np.asarray(ex, np.float64)
        if y.shape != n.shape:
            raise ValueError("fit_path_cost needs each side at the same record counts")
        slope, icpt = np.polyfit(n, y, 1)
        out.append(float(slope))
        res[side] = [float(x) for x in y - (icpt + slope * n)]
    return out[0], out[1], res


def handoff_paths(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Per round of a handoff trace, in cycles: the producer's way from its exit of the round's
    barrier to its fill (``handoff.commit``), and the consumer's to its wait's begin."""
    import pyarrow as pa

    ev = trace.events
    rounds = events_named(ev, f"{S.PIPELINE}.round", "span")
    warp = rounds["warp"].to_numpy()
    return (_per_round(rounds.filter(pa.array(warp == 0)), events_named(ev, f"{S.PIPELINE}.commit"),  # warp 0 produces
                       "end_cycles", "start_cycles"),
            _per_round(rounds.filter(pa.array(warp == 1)), events_named(ev, f"{S.PIPELINE}.wait", "span"),
                       "end_cycles", "start_cycles"))


def fit_event_cost(inside, excess) -> tuple[float, float, float, list[float]]:
    """(offset, inner offset, cost per event, residuals), in the units of ``excess``: what spans
    holding ``inside`` records read beyond their untraced twins'. The offset is the excess of the
    spans with none inside; the cost per event and the inner offset are the least-squares line
    through the others (every density counts, events close together and far apart: what one
    costs varies with what surrounds it). Not one line through the offset: an empty span's two
    reads run back to back, and with work between them what each costs overlaps that work
    otherwise (docs/compensation.md). Residuals: each excess less the model's (the offset for
    none inside)."""
    n = np.asarray(inside, np.float64)
    ex = np.asarray(excess, np.float64)
    if n.shape != ex.shape or not (n == 0).any() or np.unique(n[n > 0]).size < 2:
        raise ValueError("fit_event_cost needs spans with no record inside and with at least two other counts")
    offset = float(ex[n == 0].mean())
    more = n > 0
    event, inner = np.polyfit(n[more], ex[more], 1)
    model = np.where(more, inner + event * n, offset)
    return offset, float(inner), float(event), [float(x) for x in ex - model]


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
