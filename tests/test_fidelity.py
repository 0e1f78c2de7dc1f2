"""fa4trace.analysis.fidelity: each bundle's measure of its own perturbation, on synthetic launches whose
recorded CTAs run a known amount slower (fa4trace.trace.synthetic.sampled_like)."""

from __future__ import annotations

import pytest

from fa4trace.analysis.fidelity import cta_lifetimes, headline, perturbation, perturbation_lines, plain_twin
from fa4trace.trace.bundle import Trace, load
from fa4trace.trace.decode import decode_buffer
from fa4trace.trace.synthetic import attention_like, sampled_like


def bundle(**kw) -> Trace:
    extra = kw.pop("instrument", {})
    buf, meta, vocab = sampled_like(**kw)
    meta["instrument"].update(extra)
    return Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab)


def test_lifetimes_travel_through_the_bundle(tmp_path):
    t = bundle(n_ctas=40, sms=8, cta_stride=5, n_recorded=8)
    back = load(t.save(tmp_path / "s.parquet"))
    life = cta_lifetimes(back)
    assert life.num_rows == 40 and life["cta"].to_pylist() == list(range(40))
    assert life["recorded"].to_pylist() == [c % 5 == 0 for c in range(40)]
    assert (life["dur_ns"].to_numpy() > 0).all()
    # on the events' time axis: a recorded CTA's warps lie within its lifetime
    ev = back.events.to_pandas()
    warps = ev[ev["name"] == "WARP"].groupby("cta").agg(s=("start_ns", "min"), e=("end_ns", "max"))
    lt = life.to_pandas().set_index("cta").loc[warps.index]
    assert (lt["start_ns"] <= warps["s"]).all() and (lt["end_ns"] >= warps["e"]).all()


def test_phases_split_the_launch_into_opening_steady_and_tail():
    life = cta_lifetimes(bundle(n_ctas=40, sms=8, jitter=0.0, slowdown=0.0)).to_pandas()
    # 8 slots, 40 equal CTAs: five waves; the first starts together, the last ends together
    assert life.loc[life["phase"] == "opening", "cta"].tolist() == list(range(8))
    assert life.loc[life["phase"] == "tail", "cta"].tolist() == list(range(32, 40))
    assert (life["phase"] == "steady").sum() == 24


def test_a_spread_sample_recovers_the_slowdown():
    p = perturbation(bundle(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, slowdown=0.25))
    assert p["measured"] and p["basis"] == "steady"
    assert p["rel"] == pytest.approx(0.25, abs=0.02)
    assert p["recorded"]["n"] + p["untraced"]["n"] < 128 and p["timed"] == {"recorded": 16, "untraced": 112}
    assert p["recorded"]["p10_ns"] <= p["recorded"]["median_ns"] <= p["recorded"]["p90_ns"]
    assert p["caveats"] == []
    assert perturbation_lines(p)[0] == (f"recorded CTAs ran +{100 * p['rel']:.1f}% longer than untraced ones "
                                        f"({p['recorded']['n']} recorded, {p['untraced']['n']} untraced; "
                                        "steady-state waves)")


def test_no_slowdown_reads_as_none():
    p = perturbation(bundle(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, slowdown=0.0))
    assert abs(p["rel"]) < 0.01 and p["caveats"] == []


def test_the_first_ctas_of_the_grid_are_a_biased_sample():
    """The default sample (the grid's first CTAs) starts in the opening wave, where every CTA
    starts at once: with an opening that runs 20% slower, comparing all CTAs counts that as
    perturbation; the steady-state waves do not, and a caveat says the sample is ordered."""
    p = perturbation(bundle(n_ctas=128, sms=8, n_recorded=16, slowdown=0.10, opening_extra=0.20))
    assert p["all"]["rel"] > 0.2  # 8 of the 16 recorded ran in the opening
    assert p["basis"] == "steady" and p["rel"] == pytest.approx(0.10, abs=0.02)
    assert any("started before almost all untraced ones" in c and "cta_stride" in c for c in p["caveats"])


def test_without_steady_state_ctas_all_are_compared_with_the_order_caveat():
    p = perturbation(bundle(n_ctas=24, sms=8, n_recorded=8, slowdown=0.1))  # three waves: no steady CTA records
    assert p["basis"] == "all" and p["steady"] is None
    assert any("started before" in c for c in p["caveats"])


def test_one_wave_says_what_a_persistent_kernel_hides():
    p = perturbation(bundle(n_ctas=16, sms=16, cta_stride=4, n_recorded=4))
    assert p["measured"] and p["basis"] == "all" and p["rel"] == pytest.approx(0.25, abs=0.03)
    assert any(c.startswith("only 4 recorded CTAs") for c in p["caveats"])
    assert any(c.startswith("one wave") and "dynamic tile scheduler" in c for c in p["caveats"])
    assert not any("started before" in c for c in p["caveats"])  # every CTA starts at once


def test_unequal_work_is_a_caveat():
    p = perturbation(bundle(n_ctas=128, sms=8, cta_stride=4, n_recorded=32, work_spread=0.4))
    assert any("unequal work" in c for c in p["caveats"])


def test_one_body_is_a_caveat():
    p = perturbation(bundle(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, split=False))
    assert any(c.startswith("one instrumented body") for c in p["caveats"])


def test_every_cta_recorded_is_not_measurable_and_names_the_plain_twin():
    p = perturbation(bundle(n_ctas=16, sms=16, n_recorded=16))
    assert not p["measured"] and p["rel"] is None and "not measurable in this launch" in p["reason"]
    assert perturbation_lines(p) == [f"not measured: {p['reason']}"] and headline(p) is None
    t = bundle(n_ctas=16, sms=16, n_recorded=16, instrument={"plain_twin": {"plain_ns": 1_000_000, "traced_ns": 1_250_000}})
    p = perturbation(t)
    assert p["plain_twin"] == {"plain_ns": 1e6, "traced_ns": 1.25e6, "rel": 0.25, "n": 1}
    assert perturbation_lines(p)[1] == "traced launch ran +25.0% against its plain twin (1250.00 µs vs 1000.00 µs)"
    assert headline(p) == 0.25


def test_plain_twin_takes_medians_of_a_list_and_ignores_what_it_cannot_read():
    meta = {"instrument": {"plain_twin": [{"plain_ns": 100, "traced_ns": 110}, {"plain_ns": 100, "traced_ns": 130},
                                          {"plain_ns": 100, "traced_ns": 120}, {"plain_ns": "x"}, None]}}
    assert plain_twin(meta) == {"plain_ns": 100.0, "traced_ns": 120.0, "rel": pytest.approx(0.2), "n": 3}
    assert plain_twin({"instrument": {"plain_twin": {"plain_ns": 0, "traced_ns": 5}}}) is None
    assert plain_twin({}) is None


def test_bundles_without_lifetimes_say_so():
    buf, meta = attention_like("base", n_ctas=2, n_blocks=4)
    t = Trace.from_launches([decode_buffer(buf)], meta)
    assert "cta_lifetimes" not in t.meta and cta_lifetimes(t) is None
    p = perturbation(t)
    assert not p["measured"] and "no CTA lifetimes in this bundle" in p["reason"]
    assert perturbation_lines(p) == [f"not measured: {p['reason']}"]


def test_our_decode_kernels_bundles_report_their_own_twin_timing():
    # our decode kernel's recorder stamps no CTA lifetimes; its bundles time the traced launch
    # and the untraced kernel on the same inputs (meta "timing", µs): that is the figure shown
    buf, meta = attention_like("base", n_ctas=2, n_blocks=4)
    meta["timing"] = {"kernel_us": 19.4, "traced_us": 20.44, "bench_us": 21.0}
    p = perturbation(Trace.from_launches([decode_buffer(buf)], meta))
    assert not p["measured"] and p["plain_twin"]["rel"] == pytest.approx(20.44 / 19.4 - 1)
    assert perturbation_lines(p)[1] == "traced launch ran +5.4% against its plain twin (20.44 µs vs 19.40 µs)"
    assert headline(p) == pytest.approx(0.0536, abs=1e-4)
    # an instrument twin wins over the timing block; an incomplete timing block is no twin
    assert plain_twin({"timing": meta["timing"], "instrument": {"plain_twin": {"plain_ns": 10, "traced_ns": 11}}})[
        "plain_ns"] == 10.0
    assert plain_twin({"timing": {"kernel_us": 19.4}}) is None
    assert plain_twin({"timing": {"kernel_us": "x", "traced_us": 2}}) is None


def test_recorded_ctas_beyond_the_region_are_not_timed():
    p = perturbation(bundle(n_ctas=64, sms=8, cta_first=40, cta_stride=2, n_recorded=8, lifetime_ctas=32))
    assert p["timed"] == {"recorded": 0, "untraced": 32} and "no recorded CTA was timed" in p["reason"]


def test_launches_pool_their_ctas():
    t1, t2 = (sampled_like(n_ctas=64, sms=8, cta_stride=8, n_recorded=8, seed=s) for s in (1, 2))
    buf1, meta, vocab = t1
    t = Trace.from_launches([decode_buffer(buf1, vocab=vocab, launch_index=0),
                             decode_buffer(t2[0], vocab=vocab, launch_index=1)], meta, vocab=vocab)
    life = cta_lifetimes(t)
    assert life.num_rows == 128 and sorted(set(life["launch"].to_pylist())) == [0, 1]
    p = perturbation(t)
    assert p["timed"] == {"recorded": 16, "untraced": 112} and p["rel"] == pytest.approx(0.25, abs=0.03)


def test_a_negative_difference_reads_shorter():
    p = perturbation(bundle(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, slowdown=-0.1))
    assert perturbation_lines(p)[0].startswith(f"recorded CTAs ran {-100 * p['rel']:.1f}% shorter than untraced ones")


def test_malformed_lifetimes_meta_reads_as_none():
    t = bundle(n_ctas=16, sms=8, cta_stride=2, n_recorded=4)
    t.meta["cta_lifetimes"] = dict(t.meta["cta_lifetimes"], cta=t.meta["cta_lifetimes"]["cta"][:-1])
    assert cta_lifetimes(t) is None
    t.meta["cta_lifetimes"] = {"cta": [1]}
    assert cta_lifetimes(t) is None and not perturbation(t)["measured"]


def test_stamps_that_miss_a_recorded_warp_are_a_caveat():
    t = bundle(n_ctas=128, sms=8, cta_stride=8, n_recorded=16)
    assert not any("outside their lifetime" in c for c in perturbation(t)["caveats"])
    t.meta["launches"][0]["ctas_outside_lifetime"] = 2
    assert any(c.startswith("2 recorded CTAs have warps outside their lifetime entry") for c in perturbation(t)["caveats"])
