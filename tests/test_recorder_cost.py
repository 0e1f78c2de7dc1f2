"""`fa4trace check`'s recorder-cost rows (fa4trace.check.recorder_cost) and the known-answer
target (fa4trace.check.known_answer), with the GPU work replaced: the rows' verdicts, what they
say, recorder_cost.json as summary --compensate reads it, and one failing recorder leaving the
others' rows."""

from __future__ import annotations

import json

import pytest

from fa4trace.analysis import compensate as C
from fa4trace.check import known_answer as KA
from fa4trace.check import recorder_cost as RC
from fa4trace.check.rows import Context
from fa4trace.probes import known_answer as PK


def _cal(recorder, **kw):
    d = dict(recorder=recorder, offset_cycles=84.0, held_offset_cycles=10.0, event_cycles=46.0,
             lag_offset_cycles=-3.0, clock_ghz=1.98, gpu="NVIDIA H200", measured_at="2026-12-03T00:00:00+00:00")
    d.update(kw)
    return d


def _span(comp_ns, truth_ns=2000.0, raw_ns=2400.0):
    return {"comp_ns": comp_ns, "raw_ns": raw_ns, "truth_ns": truth_ns, "within": KA.within_target(comp_ns, truth_ns)}


@pytest.fixture
def ctx(tmp_path):
    return Context(out=tmp_path, gpu={"name": "NVIDIA H200", "compute_capability": "9.0"}, quick=True)


def _wait(comp_ns, truth_ns=2500.0, raw_ns=2700.0):
    return [_span(comp_ns, truth_ns, raw_ns), {"figure": "lag"}]


@pytest.fixture
def waits_ok(monkeypatch):
    monkeypatch.setattr(KA, "handoff_case", lambda rec, cal, **kw: _wait(2500.0))


def test_rows_ok_within_the_target_warn_outside_it_and_write_the_calibrations(ctx, monkeypatch):
    monkeypatch.setattr(PK, "calibrate",
                        lambda rec, build=None: _cal(rec, fill_event_cycles=90.0, wait_event_cycles=100.0))
    comp = {"recorder_smem": 2010.0, "segment_smem": 2100.0}
    monkeypatch.setattr(KA, "span_case", lambda rec, cal, **kw: _span(comp[rec]))
    wait = {"recorder_smem": 2510.0, "segment_smem": 2600.0}
    monkeypatch.setattr(KA, "handoff_case", lambda rec, cal, **kw: _wait(wait[rec]))
    rows = {r.name: r for r in RC.recorder_cost_rows(ctx)}
    assert list(rows) == ["recorder cost: recorder_smem", "recorder cost: segment_smem"]  # --quick: two
    ok, warn = rows["recorder cost: recorder_smem"], rows["recorder cost: segment_smem"]
    assert ok.verdict == "ok" and warn.verdict == "warn"
    assert "compensated spans and waits of this recorder are not to be trusted" in warn.next
    assert "missed: span and wait" in warn.detail and "missed" not in ok.detail
    assert ok.group == "cost" and "42.4 ns" in ok.measured and "2010 ns compensated (raw 2400) vs 2000" in ok.measured
    assert "(45.5 ns on the way to a fill, 50.5 ns to a wait)" in ok.measured
    assert "wait 2510 (raw 2700) vs 2500" in ok.measured
    assert ok.values["calibration"]["event_ns"] == pytest.approx(46.0 / 1.98)
    saved = C.load_calibrations(ctx.out / C.FILE)
    assert set(saved) == {"recorder_smem", "segment_smem"} and saved["segment_smem"].held_offset_cycles == 10.0
    assert str(ctx.out / C.FILE) in ctx.files


def test_a_wait_alone_off_target_warns_and_says_so(ctx, monkeypatch):
    monkeypatch.setattr(PK, "calibrate", lambda rec, build=None: _cal(rec))
    monkeypatch.setattr(KA, "span_case", lambda rec, cal, **kw: _span(2000.0))
    monkeypatch.setattr(KA, "handoff_case", lambda rec, cal, **kw: _wait(2300.0))
    rows = RC.recorder_cost_rows(ctx)
    assert [r.verdict for r in rows] == ["warn", "warn"]
    assert all("compensated waits of" in r.next and "missed: wait" in r.detail for r in rows)
    assert "on the way to a fill" not in rows[0].measured  # a calibration without the path costs


def test_a_recorder_that_fails_is_a_fail_row_and_the_others_still_run(ctx, monkeypatch, waits_ok):
    def calibrate(rec, build=None):
        if rec == "recorder_smem":
            raise RuntimeError("no known_answer kernel recorder_smem in build/kernels")
        return _cal(rec)

    monkeypatch.setattr(PK, "calibrate", calibrate)
    monkeypatch.setattr(KA, "span_case", lambda rec, cal, **kw: _span(2000.0))
    ctx.quick = False
    rows = {r.name.removeprefix("recorder cost: "): r for r in RC.recorder_cost_rows(ctx)}
    assert len(rows) == 5
    bad = rows.pop("recorder_smem")
    assert bad.verdict == "fail" and "rebuild it" in bad.next and "RuntimeError" in bad.detail
    assert all(r.verdict == "ok" for r in rows.values())
    assert "recorder_smem" not in C.load_calibrations(ctx.out / C.FILE)


def test_a_calibration_that_is_not_a_number_fails_its_row(ctx, monkeypatch, waits_ok):
    monkeypatch.setattr(PK, "calibrate", lambda rec, build=None: _cal(rec, event_cycles=float("nan")))
    monkeypatch.setattr(KA, "span_case", lambda rec, cal, **kw: _span(2000.0))
    rows = RC.recorder_cost_rows(ctx)
    assert [r.verdict for r in rows] == ["fail", "fail"] and "event_cycles is nan" in rows[0].detail
    assert not (ctx.out / C.FILE).exists()


@pytest.mark.parametrize("value,truth,ok", [(2039.0, 2000.0, True), (2041.0, 2000.0, False), (219.0, 200.0, True),
                                            (221.0, 200.0, False), (179.0, 200.0, False), (50_900.0, 50_000.0, True)])
def test_the_target_is_two_percent_or_twenty_ns(value, truth, ok):
    assert KA.within_target(value, truth) is ok


def test_handoff_lengths_grow_both_warps_in_proportion():
    got = KA.handoff_lengths(3956, 1978)
    step = KA.HANDOFF_LENGTH_STEP
    assert len(got) == KA.HANDOFF_LENGTHS and got[0] == (3956, 1978)
    assert [p for p, _ in got] == [3956 + i * step for i in range(KA.HANDOFF_LENGTHS)]
    assert [c for _, c in got] == [1978 + round(i * step / 2) for i in range(KA.HANDOFF_LENGTHS)]
    assert KA.handoff_lengths(4000, 0, 3) == [(4000, 0), (4000 + step, 0), (4000 + 2 * step, 0)]
    with pytest.raises(ValueError, match="lengths must be >= 1"):
        KA.handoff_lengths(4000, 0, 0)


def test_a_handoff_pools_its_set_lengths(monkeypatch):
    """Each figure pools every set length: truth the mean of the lengths' twins, the verdict on
    the pooled mean, each length's own error kept beside (one length 25 ns off, the rest 5 ns:
    within, and the 25 ns shows)."""
    import numpy as np

    seen = []

    def at(recorder, cal, kw):
        seen.append((kw["cycles"], kw["cons_cycles"]))
        i = len(seen) - 1
        truth = 1000.0 + 10 * i
        off = 25.0 if i == 0 else 5.0
        part = lambda t, o, n: {"raw": np.full(4, t + 40.0), "comp": np.full(4, t + o), "truth": t,  # noqa: E731
                                "count": np.full(4, n), "clamped": int(i == 3)}
        return {"ghz": 1.98, "dropped": i, "wait": part(truth, off, 15), "lag": part(40.0, 1.0, 0)}

    monkeypatch.setattr(KA, "_handoff_at", at)
    wait, lag = KA.handoff_case("segment_smem", None, cycles=3956, density=16, cons_cycles=1978, cons_density=16)
    n = KA.HANDOFF_LENGTHS
    assert seen == KA.handoff_lengths(3956, 1978) and wait["lengths"] == lag["lengths"] == n
    truth = float(np.mean([1000.0 + 10 * i for i in range(n)]))
    assert wait["truth_ns"] == pytest.approx(truth)
    assert wait["comp_err_ns"] == pytest.approx((25.0 + 5.0 * (n - 1)) / n) and wait["within"]
    assert wait["length_err_ns"] == [25.0] + [5.0] * (n - 1)
    assert wait["release_events"] == 15 and lag["consumer_events"] == 0 and wait["n"] == 4 * n
    assert wait["clamped"] == lag["clamped"] == 1 and wait["dropped"] == sum(range(n))
    assert wait["cycles"] == 3956 and wait["figure"] == "wait" and lag["figure"] == "lag"
    assert lag["comp_err_ns"] == pytest.approx(1.0)
