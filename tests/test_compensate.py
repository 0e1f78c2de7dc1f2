"""Compensation (fa4trace.analysis.compensate) on traces whose true durations are known.

The traces are buffers the device recorder's host twin writes (fa4trace.testing.bundles), decoded
by the real decoder: warps that spin known numbers of cycles, where each record costs its warp a
set number of cycles, as the cost model of docs/compensation.md says (a span's begin costs
OFFSET before the work it brackets, each inner record EVENT, a fill is read DELTA after the
arrive, a wait wakes LAG after the arrive). Compensation must give back the work to within the
ns rounding of the decoder; the raw figures must not (else these tests could not fail).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from fa4trace.analysis import compensate as C
from fa4trace.format import layout as L
from fa4trace.format.errors import Fa4traceError
from fa4trace.kernels import known_answer_spec as S
from fa4trace.trace.bundle import Trace
from fa4trace.trace.decode import decode_buffer
from fa4trace.testing.bundles import WarpEvents, write_buffer

GHZ = 2.0  # the synthetic SM clock: 0.5 ns per cycle
OFFSET, HELD, EVENT, DELTA, LAG = 80, 12, 50, 6, 100  # cycles
CAL = C.Calibration("recorder_smem", offset_cycles=OFFSET, held_offset_cycles=HELD, event_cycles=EVENT,
                    lag_offset_cycles=-DELTA, clock_ghz=GHZ)
TOL_NS = 1.5  # the decoder rounds each time to a whole ns


class Timeline:
    """One warp's records as the cost model makes them: ``read`` records at the current cycle and
    moves on by the record's cost, ``work`` spins."""

    def __init__(self, warp: int, role: int, t0: int = 4_000_000):
        self.warp, self.role, self.start, self.t = warp, role, t0, t0
        self.recs: list[tuple[int, int, int, int]] = []

    def read(self, kind: int, event: int, payload: int, cost: int = 0) -> int:
        at = self.t
        self.recs.append((at, kind, event, payload))
        self.t += cost
        return at

    def work(self, cycles: int) -> None:
        self.t += int(cycles)

    def events(self, cta: int = 0) -> WarpEvents:
        end = self.t + 200
        a = np.array(self.recs, np.int64).reshape(-1, 4)
        gt = lambda cyc: 1_700_000_000_000 + int(round((cyc - 4_000_000) / GHZ))  # noqa: E731
        return WarpEvents(cta=cta, warp=self.warp, sm=0, role=self.role, clk0=self.start, clk1=end,
                          gt0=gt(self.start), gt1=gt(end), kind=a[:, 1], event=a[:, 2], payload=a[:, 3], t=a[:, 0])


def _trace(timelines: list[Timeline], *, instrument: dict | None = None) -> Trace:
    spec = L.BufferSpec(warps_per_cta=len(timelines), n_cta_slots=1, capacity=4096)
    buf = write_buffer(spec, [t.events() for t in timelines])
    d = decode_buffer(buf, vocab=S.vocabulary())
    meta = {"kernel": "synthetic.known_cost", "synthetic": True}
    if instrument:
        meta["instrument"] = instrument
    return Trace.from_launches([d], meta, vocab=S.vocabulary())


def spans_case(cases):
    """One warp: a span per (work cycles, density): begin (OFFSET), density sub-spins with an
    inner instant (EVENT) between two, end."""
    w = Timeline(0, 9)
    for r, (work, k) in enumerate(cases):
        w.read(L.KIND_BEGIN, S.SPAN, r, OFFSET)
        for j in range(k):
            if j:
                w.read(L.KIND_INSTANT, S.INNER, j, EVENT)
            w.work(work // k)
        w.read(L.KIND_END, S.SPAN, r, EVENT)
        w.work(300)
    return _trace([w])


CASES = [(400, 1), (400, 4), (2000, 8), (2000, 16), (20000, 1), (20000, 32), (100_000, 16)]


def test_compensated_spans_give_back_the_work_and_raw_ones_do_not():
    sp = C.spans(spans_case(CASES), CAL)
    sp = sp.filter(np.asarray(sp["name"].to_pylist()) == "ka.span")
    truth = np.array([w // k * k for w, k in CASES]) / GHZ
    comp, raw = sp["ns"].to_numpy(), sp["raw_ns"].to_numpy()
    assert sp["n_inner"].to_pylist() == [k - 1 for _, k in CASES]
    assert np.abs(comp - truth).max() <= TOL_NS, (comp, truth)
    # raw holds the offset and every inner event: off by (OFFSET + (k - 1) * EVENT) cycles
    assert np.allclose(raw - truth, [(OFFSET + (k - 1) * EVENT) / GHZ for _, k in CASES], atol=TOL_NS)
    assert (np.abs(raw - truth) > 30).all()
    assert not sp["clamped"].to_numpy(zero_copy_only=False).any()


def test_a_span_with_records_inside_takes_the_inner_offset():
    """A span holding records of its warp costs its inner offset (here 30 cycles) besides its
    events, an empty one its offset (80): with the inner offset calibrated both come back to the
    work; a calibration without one (from before it was measured) takes the offset for both."""
    inner = 30
    w = Timeline(0, 9)
    cases = [(2000, 1), (2000, 4), (20000, 16)]
    for r, (work, k) in enumerate(cases):
        w.read(L.KIND_BEGIN, S.SPAN, r, OFFSET if k == 1 else inner)
        for j in range(k):
            if j:
                w.read(L.KIND_INSTANT, S.INNER, j, EVENT)
            w.work(work // k)
        w.read(L.KIND_END, S.SPAN, r)
        w.work(300)
    tr = _trace([w])
    truth = np.array([w_ // k * k for w_, k in cases]) / GHZ
    with_inner = dataclasses.replace(CAL, inner_offset_cycles=inner)
    for cal, off in ((with_inner, [0, 0, 0]), (CAL, [0, inner - OFFSET, inner - OFFSET])):
        sp = C.spans(tr, cal)
        sp = sp.filter(np.asarray(sp["name"].to_pylist()) == "ka.span")
        assert np.allclose(sp["ns"].to_numpy() - truth, np.array(off) / GHZ, atol=TOL_NS), (sp["ns"], truth)
    assert C.Calibration.from_dict(with_inner.to_dict()).inner_offset_cycles == inner
    assert with_inner.to_dict()["inner_offset_ns"] == inner / GHZ


def test_the_cost_per_event_is_the_line_through_spans_with_records_inside():
    from fa4trace.probes.known_answer import fit_event_cost

    inside = [0, 1, 3, 7, 15, 31]
    offset, inner, event, res = fit_event_cost(inside, [30.0] + [2.0 + 28.0 * n for n in inside[1:]])
    assert (offset, round(inner, 9), round(event, 9)) == (30.0, 2.0, 28.0) and np.allclose(res, 0)
    with pytest.raises(ValueError, match="no record inside"):
        fit_event_cost([1, 3, 7], [1.0, 2.0, 3.0])


def test_a_span_shorter_than_its_cost_is_clamped_at_zero_and_counted():
    cal = C.Calibration("recorder_smem", offset_cycles=OFFSET + 400, held_offset_cycles=HELD, event_cycles=EVENT)
    sp = C.spans(spans_case([(100, 1), (20000, 1)]), cal)
    sp = sp.filter(np.asarray(sp["name"].to_pylist()) == "ka.span")
    assert sp["ns"].to_pylist()[0] == 0.0 and sp["clamped"].to_pylist() == [True, False]
    s = C.summary(spans_case([(100, 1), (20000, 1)]), cal)
    assert s["clamped"] == 1 and s["spans"]["ka.span"]["clamped"] == 1


def handoff_case(rounds, *, prod_density=1, cons_work=0, cons_density=1, late=False, gap=OFFSET, barrier=False,
                 inner=EVENT):
    """Producer warp 0 spins ``work`` cycles in ``prod_density`` sub-spins (inner events between),
    arrives, reads its fill DELTA later; consumer warp 1 spins ``cons_work`` in ``cons_density``
    sub-spins, then waits from its begin read until LAG after the arrive (its recorder's ops after
    the begin read, ``gap`` cycles, overlap the wait; a wait that does not block ends ``gap`` after
    its begin: the recorder's offset, OFFSET for a Recorder, HELD for a segment's). ``barrier``: the
    round's CTA barrier is recorded (a span in each warp; its end costs EVENT after the release;
    "first": the first round's only). ``inner``: what each inner event costs its warp (a
    pair: the producer's, the consumer's).
    ``cons_work`` may be a list (one per round). Returns (trace, true waits, true lags) in cycles:
    what the same code does with no recorder (fill read right at the arrive, no events)."""
    p, q = Timeline(0, 1), Timeline(1, 2)
    waits, lags = [], []
    for r, work in enumerate(rounds):
        s = max(p.t, q.t) + 500
        rec_barrier = barrier is True or (barrier == "first" and r == 0)
        if rec_barrier:
            p.read(L.KIND_BEGIN, S.ROUND, r)
            q.read(L.KIND_BEGIN, S.ROUND, r)
        p.t = q.t = s
        if rec_barrier:
            p.read(L.KIND_END, S.ROUND, r, EVENT)
            q.read(L.KIND_END, S.ROUND, r, EVENT)
        p_cost, c_cost = inner if isinstance(inner, tuple) else (inner, inner)
        for j in range(prod_density):
            if j:
                p.read(L.KIND_INSTANT, S.INNER, j, p_cost)
            p.work(work // prod_density)
        arrive = p.t
        p.work(DELTA)
        p.read(L.KIND_INSTANT, S.COMMIT, r, EVENT)
        cw = cons_work[r] if isinstance(cons_work, list) else cons_work
        for j in range(cons_density):
            if j:
                q.read(L.KIND_INSTANT, S.INNER, j, c_cost)
            q.work(cw // cons_density)
        begin = q.read(L.KIND_BEGIN, S.WAIT, r)
        wake = arrive + LAG
        q.t = max(wake, begin + gap)
        q.read(L.KIND_END, S.WAIT, r, EVENT)
        # untraced: the producer arrives after its work alone, the consumer begins after its own
        u_arrive, u_begin = s + work // prod_density * prod_density, s + cw // cons_density * cons_density
        waits.append(max(u_arrive + LAG - u_begin, 0))
        lags.append(max(u_arrive + LAG, u_begin) - u_arrive)
        assert late is None or late == (begin > arrive), "the case does not do what its caller says"
    return _trace([p, q]), np.array(waits) / GHZ, np.array(lags) / GHZ


def _wait_rows(trace, cal=CAL):
    sp = C.spans(trace, cal)
    return sp.filter(np.asarray(sp["name"].to_pylist()) == "handoff.wait")


def test_a_wait_released_by_a_dense_producer_loses_the_producers_events():
    trace, truth, _ = handoff_case([4000, 8000, 20000], prod_density=16)
    w = _wait_rows(trace)
    assert w["n_release"].to_pylist() == [15, 15, 15] and w["n_inner"].to_pylist() == [0, 0, 0]
    assert np.abs(w["ns"].to_numpy() - truth).max() <= TOL_NS
    assert (w["raw_ns"].to_numpy() - truth > 15 * EVENT / GHZ - TOL_NS).all()  # raw: every producer event
    light, truth1, _ = handoff_case([4000, 8000, 20000])
    assert np.abs(_wait_rows(light)["ns"].to_numpy() - truth1).max() <= TOL_NS


def test_after_a_barrier_both_passed_a_wait_loses_the_producers_events_less_the_consumers():
    # both warps record 15 events a round: the fill and the wait's begin are late alike, so the
    # raw wait is right and subtracting the producer's events alone (no barrier recorded) is not
    kw = dict(prod_density=16, cons_work=2000, cons_density=16)
    trace, truth, lag_truth = handoff_case([6000, 8000, 20000], barrier=True, **kw)
    w = _wait_rows(trace)
    assert w["n_release"].to_pylist() == [0, 0, 0]
    assert np.abs(w["ns"].to_numpy() - truth).max() <= TOL_NS
    assert np.abs(C.lags(trace, CAL)["ns"].to_numpy() - lag_truth).max() <= TOL_NS
    blind, truth_b, _ = handoff_case([6000, 8000, 20000], **kw)
    assert np.allclose(truth_b, truth) and (truth - _wait_rows(blind)["ns"].to_numpy() > 100).all()


def test_records_counted_between_two_warps_take_the_path_costs_where_calibrated():
    """Records on a warp's way to a handoff that cost more than a span's inner event, the
    producer's FILL cycles and the consumer's WAIT: with the path costs calibrated the waits
    and lags come back, after a common barrier (a dense producer, a dense consumer, both) and
    without one (the producer's records during the wait); a calibration without them (from
    before they were measured) takes EVENT and misses by P (FILL - EVENT) - C (WAIT - EVENT)."""
    fill, wait = 73, 88
    cal = dataclasses.replace(CAL, fill_event_cycles=fill, wait_event_cycles=wait)
    assert cal.to_dict()["fill_event_ns"] == fill / GHZ and cal.to_dict()["wait_event_ns"] == wait / GHZ
    assert C.Calibration.from_dict(cal.to_dict()) == cal
    cases = [(dict(prod_density=16, barrier=True), 15, 0), (dict(prod_density=16), 15, 0),
             (dict(cons_work=[2000, 2000], cons_density=16, barrier=True), 0, 15),
             (dict(prod_density=16, cons_work=[2000, 2000], cons_density=8, barrier=True), 15, 7)]
    for kw, p, c in cases:
        trace, truth, lag_truth = handoff_case([6000, 8000], inner=(fill, wait), late=None, **kw)
        assert np.abs(_wait_rows(trace, cal)["ns"].to_numpy() - truth).max() <= TOL_NS, kw
        assert np.abs(C.lags(trace, cal)["ns"].to_numpy() - lag_truth).max() <= TOL_NS, kw
        old = _wait_rows(trace, CAL)["ns"].to_numpy()
        assert np.allclose(old - truth, (p * (fill - EVENT) - c * (wait - EVENT)) / GHZ, atol=TOL_NS), (kw, old - truth)
    head = C.lines(C.summary(trace, cal))[0]
    assert f"({fill / GHZ:.1f} ns on the way to a fill, {wait / GHZ:.1f} ns to a wait)" in head


def test_the_path_costs_are_each_ways_slope():
    from fa4trace.probes.known_answer import fit_path_cost

    n = [0, 3, 9, 24]
    fill, wait, res = fit_path_cost(n, [40.0 + 46.0 * k for k in n], [-12.0 + 53.0 * k for k in n])
    assert (round(fill, 9), round(wait, 9)) == (46.0, 53.0)
    assert np.allclose(res["producer"], 0) and np.allclose(res["consumer"], 0)
    with pytest.raises(ValueError, match="at least two"):
        fit_path_cost([3, 3], [1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="same record counts"):
        fit_path_cost([0, 3], [1.0, 2.0], [1.0])


def test_a_handoffs_ways_are_read_per_round_from_its_barrier_exits():
    from fa4trace.probes.known_answer import handoff_lags, handoff_paths

    work, cons = [6000, 8000, 3000], [2000, 5000, 1000]
    trace, _, _ = handoff_case(work, prod_density=4, cons_work=cons, cons_density=2, barrier=True, late=False)
    assert handoff_lags(trace).tolist() == [LAG - DELTA] * 3  # every wait blocked: fill read to wake
    prod, con = handoff_paths(trace)
    # from the end record's read: its own cost, the work, the inner events, the arrive-to-read DELTA
    assert prod.tolist() == [EVENT + w + 3 * EVENT + DELTA for w in work]
    assert con.tolist() == [EVENT + c + EVENT for c in cons]


def test_path_cost_reads_the_cost_of_records_on_the_way_from_handoffs_and_their_twins(monkeypatch):
    """calibrate's path cost over synthetic handoffs whose records on the way cost PATH cycles
    (the GPU's record and twin replaced by the cost model's traces and their untraced timings)."""
    from fa4trace.probes import known_answer as K

    fill, wait = 73, 91

    def case(kw):
        work = [kw["cycles"]] * kw["reps"]
        return handoff_case(work, prod_density=kw["density"], cons_work=kw["cons_cycles"],
                            cons_density=kw["cons_density"], barrier=True, inner=(fill, wait), late=None)

    def untraced(test, **kw):
        _, wait, lag = case(kw)
        produce = np.full(kw["reps"], kw["cycles"] // kw["density"] * kw["density"])
        return {"produce": produce, "wait": wait * GHZ, "lag": lag * GHZ}

    monkeypatch.setattr(K, "record", lambda rec, test, **kw: case(kw)[0])
    monkeypatch.setattr(K, "time_untraced", untraced)
    got = K.path_cost("recorder_smem")
    assert got["fill_event_cycles"] == pytest.approx(fill, abs=0.5), got
    assert got["wait_event_cycles"] == pytest.approx(wait, abs=0.5), got
    res = got["fit_residual_cycles"]
    assert np.abs(res["producer"] + res["consumer"]).max() < 5 and got["densities"] == list(K.PATH_DENSITIES)


def test_a_barrier_is_counted_from_only_while_no_wait_came_after_it():
    # only the first round's barrier is recorded: each later wait follows the previous round's
    # (which realigned the warps), so counting from that barrier would add up every round's
    # producer events; those waits fall back to the producer's events after their begin
    trace, truth, _ = handoff_case([4000, 8000, 20000], prod_density=16, barrier="first")
    w = _wait_rows(trace)
    assert w["n_release"].to_pylist() == [15, 15, 15]
    assert np.abs(w["ns"].to_numpy() - truth).max() <= TOL_NS


def test_a_barrier_occurrence_is_matched_across_warps_by_time_not_by_count():
    from fa4trace.analysis.autoevents import AutoCols
    from fa4trace.analysis.barriers import last_common_exit

    p, q = Timeline(0, 1), Timeline(1, 2)
    for r in range(4):  # four rounds: both warps leave the round's barrier at the same cycle
        s = max(p.t, q.t) + 3000
        for w in (p, q):
            if not (w is p and r == 0):  # the producer's first barrier is lost (a ring that wrapped)
                w.read(L.KIND_BEGIN, S.ROUND, r)
        p.t = q.t = s
        for w in (p, q):
            if not (w is p and r == 0):
                w.read(L.KIND_END, S.ROUND, r, EVENT)
        p.work(2000)
        q.work(1000)
    c = AutoCols.of(_trace([p, q]))
    cons, prod = (int(c.warp_gid[c.warp == w][0]) for w in (1, 0))
    ends = np.sort(c.end[c.where("barrier", "sync") & (c.warp_gid == cons) & (c.kind == 0)])
    assert ends.size == 4
    t = ends + 250  # queries 500 cycles after each exit
    g = np.ones(4, np.int64)
    xc, xp = last_common_exit(c, g * cons, t, g * prod, t)
    # rounds 1..3: the consumer's exit of the round and the producer's of the same occurrence,
    # though the producer holds one exit fewer (counted, its k-th would be the consumer's k+1-th)
    assert xc.tolist()[1:] == ends.tolist()[1:] and np.abs(xp[1:] - xc[1:]).max() <= 1
    assert xc[0] == -1 and xp[0] == -1  # round 0: the producer has no exit near the consumer's
    # a producer that fills before it leaves the barrier has no common point with the consumer
    xc, xp = last_common_exit(c, g[:1] * cons, t[1:2], g[:1] * prod, ends[1:2] - 10)
    assert xc[0] == -1 and xp[0] == -1


def test_a_wait_that_blocks_only_untraced_is_given_back():
    # the consumer's 15 events bring it to its wait after the fill (raw: no wait), where untraced
    # it would have waited; the rounds that blocked anyway give the handoff's own lag
    cons = [3000, 1000, 1000, 3000]
    trace, truth, lag_truth = handoff_case([3400, 8000, 8000, 3400], cons_work=cons, cons_density=16,
                                           barrier=True, late=None)
    w = _wait_rows(trace)
    raw = w["raw_ns"].to_numpy()
    assert (truth[[0, 3]] > 200).all() and (raw[[0, 3]] < truth[[0, 3]] - 150).all()
    assert w["n_release"].to_pylist() == [-15, -15, -15, -15]
    assert np.abs(w["ns"].to_numpy() - truth).max() <= TOL_NS
    assert np.abs(C.lags(trace, CAL)["ns"].to_numpy() - lag_truth).max() <= TOL_NS


def test_where_no_wait_of_a_pipeline_blocked_the_calibrated_handoff_lag_ends_them():
    # every round: the consumer's 15 events bring it to its wait after the fill, where untraced
    # it would have waited; no wait blocked traced, so none shows how long a wait runs past its
    # fill: the calibration's handoff lag (traced, nothing recorded between) says it
    trace, truth, _ = handoff_case([3400, 3400, 3400], cons_work=[3000, 3000, 3000], cons_density=16,
                                   barrier=True, late=True)
    assert (truth > 200).all()
    cal = dataclasses.replace(CAL, handoff_lag_cycles=LAG - DELTA)
    assert np.abs(_wait_rows(trace, cal)["ns"].to_numpy() - truth).max() <= TOL_NS
    without = _wait_rows(trace, CAL)["ns"].to_numpy()  # not measured: nothing past the fill
    assert (truth - without > (LAG - DELTA) / GHZ - TOL_NS).all()


def test_a_fill_inside_the_waits_begin_record_does_not_set_the_lag_of_the_others():
    # three rounds the consumer's 15 events bring it to its wait well after the fill; in one the
    # fill lands 10 cycles after its wait's begin read, while its record still runs (the warp
    # polls ``gap`` after the read): the wake read there holds the record's rest, no
    # fill-to-wake time; counted as blocked, its lag (240 cycles, not 94) would end every wait
    trace, truth, _ = handoff_case([3400, 3754, 3400, 3400], cons_work=3000, cons_density=16, barrier=True,
                                   late=None, gap=250)
    f_minus_b = 3754 + DELTA - (3000 + 15 * EVENT)
    assert 0 < f_minus_b < OFFSET + EVENT and (truth > 200).all()
    cal = dataclasses.replace(CAL, handoff_lag_cycles=LAG - DELTA)
    w = _wait_rows(trace, cal)
    assert np.abs(w["ns"].to_numpy() - truth).max() <= TOL_NS, (w["ns"].to_pylist(), truth)


def test_lags_lose_the_consumers_own_events_after_the_fill_and_the_calibrated_offset():
    trace, _, truth = handoff_case([4000, 8000], late=False)
    lg = C.lags(trace, CAL)
    assert np.abs(lg["ns"].to_numpy() - truth).max() <= TOL_NS
    # a consumer that reaches its wait after the fill, recording 7 events on the way, all after it
    late, _, truth = handoff_case([400, 400], cons_work=8000, cons_density=8, late=True)
    lg = C.lags(late, CAL)
    assert lg["n_consumer"].to_pylist() == [7, 7]
    assert np.abs(lg["ns"].to_numpy() - truth).max() <= TOL_NS
    assert (lg["raw_ns"].to_numpy() - truth > 7 * EVENT / GHZ - TOL_NS).all()
    w = _wait_rows(late)  # its wait did not block: a span, less the held offset of a segment recorder
    assert w["n_release"].to_pylist() == [0, 0]


def test_segment_recorders_take_the_held_offset_for_pipeline_spans_only():
    seg = C.Calibration("segment_smem", offset_cycles=OFFSET, held_offset_cycles=HELD, event_cycles=EVENT)
    late, _, truth = handoff_case([400, 400], cons_work=8000, cons_density=8, late=True, gap=HELD)
    lanes, segment = _wait_rows(late, CAL), _wait_rows(late, seg)
    # the same unblocked waits: a Recorder takes its one offset, a segment recorder its held one
    assert np.allclose(lanes["cost_ns"].to_numpy(), OFFSET / GHZ, atol=0.01)
    assert np.allclose(segment["cost_ns"].to_numpy(), HELD / GHZ, atol=0.01)
    seg_lag = C.lags(late, C.Calibration("segment_smem", OFFSET, HELD, EVENT, lag_offset_cycles=-DELTA))
    assert np.abs(seg_lag["ns"].to_numpy() - truth).max() <= TOL_NS
    sp = C.spans(spans_case([(4000, 4)]), seg)
    span = sp.filter(np.asarray(sp["name"].to_pylist()) == "ka.span")
    assert np.allclose(span["cost_ns"].to_numpy(), (OFFSET + 3 * EVENT) / GHZ, atol=0.01)  # hand-placed: stored


def test_summary_and_text_hold_raw_beside_compensated():
    trace, _, _ = handoff_case([4000, 8000, 20000], prod_density=16)
    s = C.summary(trace, CAL)
    assert s["recorder"] == "recorder_smem" and s["shown"].startswith("compensated")
    w = s["spans"]["handoff.wait"]
    assert w["n"] == 3 and w["median_ns"] < w["raw_median_ns"]
    assert s["lags"]["handoff"]["n"] == 3
    text = "\n".join(C.lines(s))
    assert "span handoff.wait" in text and "lag handoff" in text and "recorder recorder_smem" in text
    json.dumps(s)  # it goes into `summary --json`
    # it says what it is, and how much of each figure it took away (the share its error grows with)
    assert s["caveat"] == C.CAVEAT and C.CAVEAT in text and "an estimate, not a measurement" in text
    rows = C.spans(trace, CAL)
    wait = rows.filter(np.asarray(rows["name"].to_pylist()) == "handoff.wait")
    share = 100 * wait["cost_ns"].to_numpy() / wait["raw_ns"].to_numpy()
    assert 0 < w["subtracted_pct"] < 100 and w["subtracted_pct"] == pytest.approx(float(np.median(share)))
    assert f"{w['subtracted_pct']:.0f}% subtracted" in text


def test_which_calibration_a_bundle_takes(tmp_path):
    trace, _, _ = handoff_case([4000])
    with pytest.raises(Fa4traceError, match="no recorder calibration"):
        C.calibration_for(trace)
    f = tmp_path / C.FILE
    f.write_text(json.dumps({k: C.Calibration(k, 1.0, 1.0, 2.0).to_dict() for k in ("segment_smem", "segment_ring")}))
    cals = C.load_calibrations(f)
    with pytest.raises(Fa4traceError, match="does not say which recorder wrote it; name it"):
        C.calibration_for(trace, cals)
    trace.meta["instrument"] = {"cursor": "ring"}
    assert C.calibration_for(trace, cals).recorder == "segment_ring"
    trace.meta["instrument"] = {"cursor": "gmem"}
    with pytest.raises(Fa4traceError, match="recorded with segment_gmem"):
        C.calibration_for(trace, cals)
    C.attach(trace, CAL)  # the bundle's own calibration wins
    assert C.calibration_for(trace, cals) == CAL
    back = Trace(trace.events, json.loads(json.dumps(trace.meta)))
    assert C.calibration_for(back).event_cycles == EVENT
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"recorder": "x", "offset_cycles": 1.0}))
    with pytest.raises(Fa4traceError, match="lacks held_offset_cycles, event_cycles"):
        C.load_calibrations(bad)
    with pytest.raises(Fa4traceError, match="no such calibration file"):
        C.load_calibrations(tmp_path / "missing.json")


# ---- fa4trace summary --compensate -------------------------------------------------------------------
def _cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "fa4trace", *args], capture_output=True, text=True, timeout=300)


def test_summary_compensate_on_an_automatic_bundle_and_a_hand_placed_one(tmp_path):
    trace, _, _ = handoff_case([4000, 8000, 20000], prod_density=16)
    trace.meta["instrument"] = {"cursor": "smem", "kernel": "synthetic.known_cost"}
    auto = trace.save(tmp_path / "auto.parquet")
    cal = tmp_path / C.FILE
    seg = C.Calibration("segment_smem", OFFSET, HELD, EVENT, lag_offset_cycles=-DELTA, clock_ghz=GHZ, gpu="test GPU")
    cal.write_text(json.dumps({"segment_smem": seg.to_dict(), "recorder_smem": CAL.to_dict()}))
    r = _cli("summary", str(auto), "--compensate", "--calibration", str(cal), "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    comp = s["compensation"]
    assert comp["recorder"] == "segment_smem" and comp["lags"]["handoff"]["n"] == 3
    assert comp["spans"]["handoff.wait"]["median_ns"] < comp["spans"]["handoff.wait"]["raw_median_ns"]
    r = _cli("summary", str(auto), "--compensate", "--calibration", str(cal))
    assert r.returncode == 0 and "compensated    recorder segment_smem" in r.stdout and "test GPU" in r.stdout
    assert "compensation" not in json.loads(_cli("summary", str(auto), "--json").stdout)  # --raw: as before
    # a hand-placed bundle says no recorder: name it
    hand = spans_case(CASES).save(tmp_path / "hand.parquet")
    r = _cli("summary", str(hand), "--compensate", "--calibration", str(cal))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "--recorder" in r.stderr
    r = _cli("summary", str(hand), "--compensate", "--calibration", str(cal), "--recorder", "recorder_smem", "--json")
    assert r.returncode == 0, r.stderr
    span = json.loads(r.stdout)["compensation"]["spans"]["ka.span"]
    assert abs(span["median_ns"] - 1000.0) <= TOL_NS  # the median case: 2000 cycles of work


def test_summary_compensate_refuses_in_one_line(tmp_path):
    hand = spans_case([(4000, 2)]).save(tmp_path / "hand.parquet")
    r = _cli("summary", str(hand), "--compensate")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "no recorder calibration" in r.stderr
    r = _cli("summary", str(hand), "--calibration", "x.json")
    assert r.returncode == 2 and "go with --compensate" in r.stderr
    r = _cli("summary", str(hand), "--compensate", "--calibration", str(tmp_path / "nope.json"))
    assert r.returncode == 1 and "no such calibration file" in r.stderr and "Traceback" not in r.stderr


def test_compensated_figures_are_per_launch():
    """A bundle of two launches (the second's spans 4x as long): each launch's figures apart,
    or the one asked for; never one median over both."""
    def launch(cases, index):
        w = Timeline(0, 9)
        for r, (work, k) in enumerate(cases):
            w.read(L.KIND_BEGIN, S.SPAN, r, OFFSET)
            for j in range(k):
                if j:
                    w.read(L.KIND_INSTANT, S.INNER, j, EVENT)
                w.work(work // k)
            w.read(L.KIND_END, S.SPAN, r, EVENT)
        spec = L.BufferSpec(warps_per_cta=1, n_cta_slots=1, capacity=4096)
        return decode_buffer(write_buffer(spec, [w.events()]), launch_index=index, vocab=S.vocabulary())

    trace = Trace.from_launches([launch([(2000, 4)] * 3, 0), launch([(8000, 4)] * 5, 1)],
                                {"kernel": "synthetic.known_cost"}, vocab=S.vocabulary())
    both = C.summary_by_launch(trace, CAL)
    first, second = both["per_launch"]
    assert (first["launch"], second["launch"]) == (0, 1) and "spans" not in both
    assert first["spans"]["ka.span"]["n"] == 3 and second["spans"]["ka.span"]["n"] == 5
    assert abs(first["spans"]["ka.span"]["median_ns"] - 1000) <= TOL_NS
    assert abs(second["spans"]["ka.span"]["median_ns"] - 4000) <= TOL_NS
    one = C.summary_by_launch(trace, CAL, launch=1)
    assert one["launch"] == 1 and one["spans"]["ka.span"]["n"] == 5
    text = "\n".join(C.lines(both))
    assert "launch 0" in text and "launch 1" in text and text.count("compensated    recorder") == 1


@pytest.mark.parametrize("d", [16, 24])
def test_recorded_h100_handoffs_of_a_dense_consumer_compensate_within_target(d):
    """Two handoffs recorded on an H100 (tests/data/known_answer): recorder_smem's consumer
    reaches its wait after the fill, 15 records on its way. At d = 24, 17 of 2,112 rounds see
    the fill land during their wait's begin record (1 to 16 ns after its read, waking 65 ns
    after it): taken as blocked, their wake times set every other wait's lag (+31 ns); both
    lengths now lie within the target of the untraced twin."""
    from pathlib import Path

    from fa4trace.check.known_answer import within_target
    from fa4trace.trace.bundle import load

    here = Path(__file__).parent / "data" / "known_answer"
    facts = json.loads((here / "recorder_smem_handoff.json").read_text())
    cal = C.Calibration.from_dict(facts["calibration"])
    trace = load(here / f"recorder_smem_handoff_{d}.parquet")
    ghz = float(trace.info.launches[0].clock_ghz_median)
    truth = facts["twin_wait_cycles"][str(d)] / ghz
    comp = float(np.mean(_wait_rows(trace, cal)["ns"].to_numpy()))
    assert within_target(comp, truth) and abs(comp - truth) < 8, (comp, truth)
    if d == 24:  # the case is there: rounds whose fill came within 20 ns after their wait's begin read
        ev = trace.events.to_pandas()
        key = ["cta", "iter"]
        fill = ev[ev["name"] == "handoff.commit"].set_index(key)["start_ns"]
        begin = ev[(ev["name"] == "handoff.wait") & (ev["kind"] == "span")].set_index(key)["start_ns"]
        gap = (fill - begin).dropna()
        assert ((gap > 0) & (gap < 20)).sum() >= 10
