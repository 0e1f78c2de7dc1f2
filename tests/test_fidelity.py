"""fa4trace.analysis.fidelity: each bundle's measure of its own perturbation, and when that measure
cannot be trusted.

Synthetic launches with known answers (fa4trace.testing.bundles): ``sampled_like`` (recorded
CTAs run a known amount slower; optionally work that grows along the grid and an opening wave
that contends, which the statistic's own assumption does not hold for) and ``split_kv_like``
(CTAs of a group wait for each other before combining: the recorded, slowed CTAs make untraced
ones longer, so the in-launch comparison is wrong and the shipped statistic must refuse it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fa4trace.analysis.fidelity import (HOST_TIMED, TIMING_METHOD, cta_lifetimes, headline, perturbation,
                                        perturbation_lines, plain_twin)
from fa4trace.analysis.launches import launch_of
from fa4trace.trace.bundle import Trace, load
from fa4trace.trace.decode import decode_buffer
from fa4trace.trace.meta import BundleMeta
from fa4trace.testing.bundles import attention_like, sampled_like, split_kv_like

# what instrument() stores of a plain twin it timed on the device (docs/fidelity.md)
DEVICE_TWIN = {"method": "graph", "noise_pct": 0.5, "l2": "warm"}
ROOT = Path(__file__).resolve().parents[1]


def bundle(**kw) -> Trace:
    extra = kw.pop("instrument", {})
    buf, meta, vocab = sampled_like(**kw)
    meta["instrument"].update(extra)
    return Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab)


def split_kv(twin: bool = False, **kw) -> Trace:
    buf, meta, vocab = split_kv_like(**kw)
    if twin:  # what a device-timed plain twin of this launch reads: the generator's known launch times
        truth = meta["synthetic_truth"]
        meta["instrument"]["plain_twin"] = {"plain_ns": truth["plain_ns"], "traced_ns": truth["traced_ns"],
                                            **DEVICE_TWIN}
    return Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab)


def naive(t: Trace) -> float:
    """The in-launch statistic computed by hand: median recorded / median untraced CTA duration - 1."""
    life = cta_lifetimes(t).to_pandas()
    rec = life.loc[life["recorded"], "dur_ns"].median()
    return rec / life.loc[~life["recorded"], "dur_ns"].median() - 1


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
    assert p["measured"] and p["basis"] == "steady" and p["valid"] and p["status"] == "ok"
    assert p["rel"] == pytest.approx(0.25, abs=0.02) and abs(p["rel"] - 0.25) <= p["noise"] + 0.01
    assert headline(p) == p["rel"] and p["headline_source"] == "in_launch"
    assert p["recorded"]["n"] + p["untraced"]["n"] < 128 and p["timed"] == {"recorded": 16, "untraced": 112}
    assert p["recorded"]["p10_ns"] <= p["recorded"]["median_ns"] <= p["recorded"]["p90_ns"]
    assert p["caveats"] == [] and p["unreliable"] == []
    assert perturbation_lines(p)[0] == (f"recorded CTAs ran +{100 * p['rel']:.1f}% longer than untraced ones "
                                        f"({p['recorded']['n']} recorded, {p['untraced']['n']} untraced; "
                                        f"steady-state waves; noise ±{100 * p['noise']:.1f}%)")


def test_no_slowdown_reads_as_none():
    p = perturbation(bundle(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, slowdown=0.0))
    assert abs(p["rel"]) < 0.01 and p["caveats"] == [] and p["status"] == "ok"


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


# ---- CTAs that wait on each other: the in-launch figure is refused -----------------------------
def test_split_kv_groups_make_the_naive_statistic_wrong():
    """Every CTA of a group waits for its slowest split before combining: a group with one
    recorded (25% slower) CTA ends with it, its untraced CTAs just as long. The naive statistic
    reads ~0% while every recorded CTA ran 25% longer and the launch took 22% longer."""
    t = split_kv(groups=32, splits=4, cta_stride=4, n_recorded=32, slowdown=0.25)
    truth = t.meta["synthetic_truth"]
    assert truth["cta_slowdown"] == 0.25 and truth["launch_cost"] > 0.15
    assert abs(naive(t)) < 0.03  # what the comparison alone would say
    assert abs(naive(t) - truth["launch_cost"]) > 0.15 and abs(naive(t) - truth["cta_slowdown"]) > 0.15


def test_the_shipped_statistic_refuses_it_and_goes_by_the_plain_twin():
    t = split_kv(twin=True, groups=32, splits=4, cta_stride=4, n_recorded=32, slowdown=0.25)
    p = perturbation(t)
    assert p["measured"] and p["rel"] == pytest.approx(naive(t), abs=0.01)  # the comparison itself is made...
    assert p["valid"] is False and "its CTAs wait on each other" in p["invalid"]  # ...and refused
    assert "atom.global.acq_rel.add.u32" in p["invalid"]
    assert p["headline_source"] == "plain_twin" and p["status"] == "ok"
    assert headline(p) == pytest.approx(t.meta["synthetic_truth"]["launch_cost"])
    lines = perturbation_lines(p)
    assert lines[0].startswith("not valid for this kernel: its CTAs wait on each other (returning atomics")
    assert lines[0].endswith("which says nothing of the tracing cost")
    assert lines[1].startswith("instead: traced launch ran +22.") and "CUDA-graph replays" in lines[1]
    assert "L2 warm, noise ±0.5%" in lines[1]


def test_without_a_twin_a_refused_figure_leaves_nothing_to_go_by():
    p = perturbation(split_kv(groups=32, splits=4, cta_stride=4, n_recorded=32))
    assert p["valid"] is False and headline(p) is None and p["status"] == "unreliable"


def test_a_lifetimes_only_build_with_dependent_ctas_is_refused_too():
    # nothing recorded, nothing slowed: the comparison happens to read ~0, but is still refused
    p = perturbation(split_kv(groups=32, splits=4, cta_stride=4, n_recorded=32, slowdown=0.0, events=False))
    assert p["valid"] is False and headline(p) is None


def test_cluster_only_dependencies_keep_the_figure_and_say_why():
    deps = {"verdict": "cluster_only", "found": "cluster barriers: barrier.cluster.wait x1", "waits_on_ctas": [],
            "waits_on_previous_grid": [], "cluster_only": [{"what": "cluster barriers", "ops": {"barrier.cluster.wait": 1}}],
            "fire_and_forget": []}
    p = perturbation(bundle(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, instrument={"cta_dependencies": deps}))
    assert p["valid"] and p["status"] == "ok" and p["dependencies"] == "cluster_only"
    assert any("samples whole clusters" in n for n in p["notes"])
    assert any(x.startswith("note: CTAs of one cluster wait on each other") for x in perturbation_lines(p))


def test_a_pdl_wait_is_a_caveat_where_the_opening_wave_is_compared():
    deps = {"verdict": "waits_on_previous_grid", "found": "griddepcontrol.wait x1", "waits_on_ctas": [],
            "waits_on_previous_grid": [{"what": "griddepcontrol.wait", "ops": {"griddepcontrol.wait": 1}}],
            "cluster_only": [], "fire_and_forget": []}
    one_wave = perturbation(bundle(n_ctas=16, sms=16, cta_stride=4, n_recorded=4, instrument={"cta_dependencies": deps}))
    assert one_wave["valid"] and any("griddepcontrol.wait" in c for c in one_wave["caveats"])
    steady = perturbation(bundle(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, instrument={"cta_dependencies": deps}))
    assert steady["basis"] == "steady" and not any("griddepcontrol" in c for c in steady["caveats"])


def test_a_bundle_that_does_not_say_is_a_caveat():
    t = bundle(n_ctas=128, sms=8, cta_stride=8, n_recorded=16)
    del t.meta["instrument"]["cta_dependencies"]
    p = perturbation(t)
    assert p["valid"] and any(c.startswith("whether this kernel's CTAs wait on each other was not read") for c in
                              p["caveats"])


# ---- a generator that does not build the statistic's assumption in -------------------------------
def test_work_that_grows_along_the_grid_makes_the_first_ctas_read_faster_and_that_is_never_ok():
    """Work that grows with the CTA index (a causal mask) and an opening wave that contends:
    the grid's first CTAs (the default sample) have less work than the rest, so they read faster
    than the untraced ones although they ran 10% slower. The statistic must call that unreliable
    and say why; the caveats name the ordered sample and the unequal work."""
    p = perturbation(bundle(n_ctas=256, sms=16, n_recorded=32, slowdown=0.10, work_gradient=1.0, opening_extra=0.1))
    assert p["measured"] and p["rel"] < -0.1  # 10% slower, read as faster
    assert p["status"] == "unreliable" and headline(p) is None
    assert any("faster than untraced ones" in w and "recording cannot speed a CTA up" in w for w in p["unreliable"])
    assert any("started before almost all untraced ones" in c for c in p["caveats"])
    assert any("unequal work" in c for c in p["caveats"])
    lines = perturbation_lines(p)
    assert lines[0].startswith("unreliable: recorded CTAs ran") and lines[1].startswith("why: recorded CTAs ran")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_work_that_grows_along_the_grid_is_read_right_by_a_spread_sample(seed):
    p = perturbation(bundle(n_ctas=256, sms=16, cta_stride=8, n_recorded=32, slowdown=0.10, work_gradient=1.0,
                            opening_extra=0.1, seed=seed))
    assert p["status"] == "ok" and abs(p["rel"] - 0.10) <= p["noise"]  # within the noise it states
    assert any("unequal work" in c for c in p["caveats"])  # and it still says the CTAs differ


def test_a_lifetimes_only_build_that_reads_large_is_the_samples_bias():
    # the grid's last CTAs record (and record nothing): work grows along the grid, so they read longer
    p = perturbation(bundle(n_ctas=256, sms=16, cta_first=224, n_recorded=32, slowdown=0.0, work_gradient=1.0,
                            events=False))
    assert p["rel"] > 0.1 and p["status"] == "unreliable"
    assert any("recorded nothing but their warps' lifetimes" in w for w in p["unreliable"])


def test_a_negative_difference_reads_shorter_and_unreliable():
    p = perturbation(bundle(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, slowdown=-0.1))
    assert perturbation_lines(p)[0].startswith(f"unreliable: recorded CTAs ran {-100 * p['rel']:.1f}% shorter than "
                                               "untraced ones")
    assert p["status"] == "unreliable"
    # within its noise a small negative is no alarm
    p = perturbation(bundle(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, slowdown=-0.002))
    assert p["rel"] < 0 and -p["rel"] < p["noise"] and p["status"] == "ok"


# ---- the plain twin --------------------------------------------------------------------------------
def test_every_cta_recorded_is_not_measurable_and_names_the_plain_twin():
    p = perturbation(bundle(n_ctas=16, sms=16, n_recorded=16))
    assert not p["measured"] and p["rel"] is None and "not measurable in this launch" in p["reason"]
    assert perturbation_lines(p) == [f"not measured: {p['reason']}"] and headline(p) is None
    t = bundle(n_ctas=16, sms=16, n_recorded=16,
               instrument={"plain_twin": {"plain_ns": 1_000_000, "traced_ns": 1_250_000, **DEVICE_TWIN}})
    p = perturbation(t)
    assert p["plain_twin"] == {"plain_ns": 1e6, "traced_ns": 1.25e6, "rel": 0.25, "n": 1, "method": "graph",
                               "noise_pct": 0.5, "l2": "warm", "over_launches": None}
    assert perturbation_lines(p)[1] == ("traced launch ran +25.0% against its plain twin (1250.00 µs vs 1000.00 µs; "
                                        "CUDA-graph replays alternating with the plain build's, L2 warm, noise ±0.5%)")
    assert headline(p) == 0.25 and p["status"] == "ok" and p["headline_source"] == "plain_twin"


def test_a_host_timed_twin_is_shown_as_unreliable():
    t = bundle(n_ctas=16, sms=16, n_recorded=16, instrument={"plain_twin": {"plain_ns": 61_696, "traced_ns": 342_783}})
    p = perturbation(t)
    assert headline(p) == pytest.approx(342_783 / 61_696 - 1) and p["status"] == "unreliable"
    assert p["twin_unreliable"] == [HOST_TIMED]
    assert perturbation_lines(p)[1:] == ["traced launch ran +455.6% against its plain twin (342.78 µs vs 61.70 µs) "
                                         "— unreliable", f"why: {HOST_TIMED}"]


def test_a_twin_faster_than_plain_beyond_its_noise_is_unreliable():
    t = bundle(n_ctas=16, sms=16, n_recorded=16,
               instrument={"plain_twin": {"plain_ns": 1000, "traced_ns": 900, **DEVICE_TWIN}})
    p = perturbation(t)
    assert p["status"] == "unreliable" and any("ran faster than the plain one" in w for w in p["twin_unreliable"])


def test_a_twin_faster_than_plain_beyond_a_small_noise_is_unreliable():
    """-1.4% with ±0.8% noise (FA4's causal prefill in traces/auto): beyond the noise, not 'ok'."""
    twin = {**DEVICE_TWIN, "noise_pct": 0.8, "rel": -0.014}
    t = bundle(n_ctas=16, sms=16, n_recorded=16,
               instrument={"plain_twin": {"plain_ns": 1000, "traced_ns": 986, **twin}})
    p = perturbation(t)
    assert p["status"] == "unreliable"
    assert p["twin_unreliable"] == ["the traced launch ran faster than the plain one by 1.4% (beyond its ±0.8% noise): "
                                    "recording does not speed a launch up, so the two builds differ in more than "
                                    "recording (code layout, scheduling) or the GPU's speed drifted while they were timed"]
    within = perturbation(bundle(n_ctas=16, sms=16, n_recorded=16, instrument={"plain_twin": {
        "plain_ns": 1000, "traced_ns": 995, **{**twin, "rel": -0.005}}}))
    assert within["status"] == "ok" and within["twin_unreliable"] == []


def test_a_twin_whose_rounds_disagree_with_its_medians_is_unreliable():
    twin = {**DEVICE_TWIN, "noise_pct": 0.8, "rel": 0.02}
    p = perturbation(bundle(n_ctas=16, sms=16, n_recorded=16,
                            instrument={"plain_twin": {"plain_ns": 1000, "traced_ns": 1060, **twin}}))
    assert p["status"] == "unreliable" and p["twin_unreliable"] == [
        "its rounds disagree: their median ratio reads +2.0%, the median times +6.0%: the GPU's speed drifted "
        "between rounds"]


def test_the_shipped_causal_prefill_reads_unreliable_not_its_biased_sample():
    """Its twin is found wrong and its 8 recorded CTAs are no fair sample (they started last and
    causal CTAs do unequal work): neither figure is the headline's 'ok'."""
    p = perturbation(load(ROOT / "traces" / "auto" / "fa4_sm90_prefill_causal.parquet"))
    assert p["measured"] and p["valid"] and not p["unreliable"] and len(p["biased"]) == 2
    assert p["twin_unreliable"] and p["status"] == "unreliable" and p["headline_source"] == "plain_twin"


def test_plain_twin_takes_medians_of_a_list_and_ignores_what_it_cannot_read():
    meta = {"instrument": {"plain_twin": [{"plain_ns": 100, "traced_ns": 110}, {"plain_ns": 100, "traced_ns": 130},
                                          {"plain_ns": 100, "traced_ns": 120}, {"plain_ns": "x"}, None]}}
    assert plain_twin(BundleMeta.from_meta(meta)) == {"plain_ns": 100.0, "traced_ns": 120.0, "rel": pytest.approx(0.2), "n": 3,
                                "method": None, "noise_pct": None, "l2": None, "over_launches": None}
    assert plain_twin(BundleMeta.from_meta({"instrument": {"plain_twin": {"plain_ns": 0, "traced_ns": 5}}})) is None
    assert plain_twin(BundleMeta()) is None


def test_a_device_twin_gives_its_own_ratio_and_an_untimed_one_says_why():
    # the timing's rel is the median of its rounds' ratios: it wins over the ratio of the medians
    t = bundle(n_ctas=16, sms=16, n_recorded=16,
               instrument={"plain_twin": [{"launch": 0, "plain_ns": 1000, "traced_ns": 1100, "rel": 0.08, **DEVICE_TWIN}]})
    assert plain_twin(t.info)["rel"] == 0.08 and headline(perturbation(t)) == 0.08
    t = bundle(n_ctas=16, sms=16, n_recorded=16,
               instrument={"plain_twin": [{"launch": 0, "method": None, "reason": "check=False: no plain build"}]})
    p = perturbation(t)
    assert p["plain_twin"] is None and p["twin_reason"] == "check=False: no plain build" and headline(p) is None
    assert perturbation_lines(p)[-1] == "plain twin not timed: check=False: no plain build"


def test_bundles_without_lifetimes_say_so():
    buf, meta = attention_like("base", n_ctas=2, n_blocks=4)
    t = Trace.from_launches([decode_buffer(buf)], meta)
    assert "cta_lifetimes" not in t.meta and cta_lifetimes(t) is None
    p = perturbation(t)
    assert not p["measured"] and "no CTA lifetimes in this bundle" in p["reason"]
    assert perturbation_lines(p) == [f"not measured: {p['reason']}"] and p["status"] == "not_measured"


def test_our_decode_kernels_bundles_report_their_own_twin_timing():
    # our decode kernel's recorder stamps no CTA lifetimes; its bundles time the traced launch
    # and the untraced kernel on the same inputs (meta "timing", µs, CUDA-graph replay): that is the figure shown
    buf, meta = attention_like("base", n_ctas=2, n_blocks=4)
    meta["timing"] = {"kernel_us": 19.4, "traced_us": 20.44, "bench_us": 21.0}
    p = perturbation(Trace.from_launches([decode_buffer(buf)], meta))
    assert not p["measured"] and p["plain_twin"]["rel"] == pytest.approx(20.44 / 19.4 - 1)
    assert perturbation_lines(p)[1] == (f"traced launch ran +5.4% against its plain twin (20.44 µs vs 19.40 µs; "
                                        f"{TIMING_METHOD}, each timed once, not alternated: noise not measured)")
    assert headline(p) == pytest.approx(0.0536, abs=1e-4) and p["status"] == "ok"
    # an instrument twin wins over the timing block; an incomplete timing block is no twin
    assert plain_twin(BundleMeta.from_meta({"timing": meta["timing"],
                                            "instrument": {"plain_twin": {"plain_ns": 10, "traced_ns": 11}}}))[
        "plain_ns"] == 10.0
    assert plain_twin(BundleMeta.from_meta({"timing": {"kernel_us": 19.4}})) is None
    assert plain_twin(BundleMeta.from_meta({"timing": {"kernel_us": "x", "traced_us": 2}})) is None


# ---- bundles of several launches: one figure per launch, nothing pooled --------------------------
def two_launches(slowdowns=(0.25, 0.0), twin=None) -> Trace:
    parts = [sampled_like(n_ctas=64, sms=8, cta_stride=8, n_recorded=8, slowdown=s, seed=i,
                          t0_ns=1_700_000_000_000_000_000 + i * 19_000_000_000) for i, s in enumerate(slowdowns)]
    meta, vocab = parts[0][1], parts[0][2]
    if twin is not None:
        meta["instrument"]["plain_twin"] = twin
    return Trace.from_launches([decode_buffer(b, vocab=vocab, launch_index=i) for i, (b, _m, _v) in enumerate(parts)],
                               meta, vocab=vocab)


def test_each_launch_has_its_own_figure():
    t = two_launches()
    life = cta_lifetimes(t)
    assert life.num_rows == 128 and sorted(set(life["launch"].to_pylist())) == [0, 1]
    p = perturbation(t)
    assert p["launch"] is None and headline(p) is None and len(p["per_launch"]) == 2
    first, second = p["per_launch"]
    assert first["launch"] == 0 and first["timed"] == {"recorded": 8, "untraced": 56}
    assert first["rel"] == pytest.approx(0.25, abs=0.03) and abs(second["rel"]) < 0.02  # pooled would sit between
    assert perturbation(t, 1)["rel"] == second["rel"] and perturbation(launch_of(t, 1))["rel"] == second["rel"]
    lines = perturbation_lines(p)
    assert lines[0].startswith("launch 0: recorded CTAs ran +") and any(x.startswith("launch 1: ") for x in lines)


def test_a_twin_per_launch_is_that_launchs_and_one_over_several_launches_is_not():
    keyed = [{"launch": 1, "plain_ns": 2000, "traced_ns": 2100, **DEVICE_TWIN},
             {"launch": 0, "plain_ns": 1000, "traced_ns": 1300, **DEVICE_TWIN}]
    p = perturbation(two_launches(twin=keyed))
    assert [q["plain_twin"]["rel"] for q in p["per_launch"]] == [pytest.approx(0.3), pytest.approx(0.05)]
    pooled = perturbation(two_launches(twin={"plain_ns": 1500, "traced_ns": 1700, "launches": 2, **DEVICE_TWIN}))
    for q in pooled["per_launch"]:
        assert q["plain_twin"]["over_launches"] == 2
        assert "one timing over 2 launches of this bundle, not this launch's own" in q["twin_unreliable"]


def test_stamps_that_miss_a_recorded_warp_are_a_caveat():
    t = bundle(n_ctas=128, sms=8, cta_stride=8, n_recorded=16)
    assert not any("outside their lifetime" in c for c in perturbation(t)["caveats"])
    t.meta["launches"][0]["ctas_outside_lifetime"] = 2
    assert any(c.startswith("2 recorded CTAs have warps outside their lifetime entry") for c in perturbation(t)["caveats"])


def test_recorded_ctas_beyond_the_region_are_not_timed():
    p = perturbation(bundle(n_ctas=64, sms=8, cta_first=40, cta_stride=2, n_recorded=8, lifetime_ctas=32))
    assert p["timed"] == {"recorded": 0, "untraced": 32} and "no recorded CTA was timed" in p["reason"]


def test_malformed_lifetimes_meta_reads_as_none():
    t = bundle(n_ctas=16, sms=8, cta_stride=2, n_recorded=4)
    t.meta["cta_lifetimes"] = dict(t.meta["cta_lifetimes"], cta=t.meta["cta_lifetimes"]["cta"][:-1])
    assert cta_lifetimes(t) is None
    t.meta["cta_lifetimes"] = {"cta": [1]}
    assert cta_lifetimes(t) is None and not perturbation(t)["measured"]


def test_the_noise_band_grows_with_fewer_ctas():
    many = perturbation(bundle(n_ctas=256, sms=8, cta_stride=4, n_recorded=64, slowdown=0.1, jitter=0.05))
    few = perturbation(bundle(n_ctas=256, sms=8, cta_stride=32, n_recorded=8, slowdown=0.1, jitter=0.05))
    assert 0 < many["noise"] < few["noise"]
    assert np.isfinite(many["noise"]) and many["noise"] < 0.05


def test_a_device_timed_twin_is_the_launch_cost_and_the_in_launch_figure_the_cta_stretch():
    """Recorded CTAs stretched 25%, but the launch cost 4% (several CTAs per SM hide the stretch):
    the figure to go by is the twin's; the in-launch one is still shown, with no "instead"."""
    twin = {"plain_ns": 1_000_000, "traced_ns": 1_040_000, **DEVICE_TWIN}
    p = perturbation(bundle(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, slowdown=0.25,
                            instrument={"plain_twin": twin}))
    assert p["measured"] and p["valid"] and p["rel"] == pytest.approx(0.25, abs=0.02)
    assert p["headline_source"] == "plain_twin" and headline(p) == pytest.approx(0.04) and p["status"] == "ok"
    lines = perturbation_lines(p)
    assert lines[0].startswith("recorded CTAs ran +2") and lines[1].startswith("traced launch ran +4.0%")
    assert lines[1].endswith(" — the launch's cost, the figure to go by")
    # a host-timed twin is not the launch's cost: the in-launch figure is gone by instead
    host = {"plain_ns": 1_000_000, "traced_ns": 5_000_000}
    p = perturbation(bundle(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, slowdown=0.25,
                            instrument={"plain_twin": host}))
    assert p["headline_source"] == "in_launch" and p["twin_unreliable"] == [HOST_TIMED]
