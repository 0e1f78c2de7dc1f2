"""A bundle's metadata, typed (fa4trace.trace.meta): every bundle in traces/ reads as a
``BundleMeta`` and writes back as it was stored, keys a newer fa4trace may add are kept at every
level, nothing is converted, and ``Trace.info`` reads what ``Trace.meta`` holds now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fa4trace.trace.bundle import Trace, load, read_meta
from fa4trace.trace.meta import (BundleMeta, CtaLifetimes, GpuMeta, InstrumentMeta, LaunchMeta, MetaPart,
                                 TimingMeta)

ROOT = Path(__file__).resolve().parents[1]
BUNDLES = sorted(p for p in (ROOT / "traces").rglob("*.parquet") if "results" not in p.parts) \
    + sorted((ROOT / "fa4trace" / "examples").glob("*.parquet"))


def test_every_bundle_in_traces_round_trips():
    """Each stored metadata object reads back exactly (keys, values, types) from its typed form."""
    assert len(BUNDLES) > 100
    for p in BUNDLES:
        m = read_meta(p)
        info = BundleMeta.from_meta(m)
        assert info.to_meta() == m, p
        assert json.dumps(info.to_meta(), sort_keys=True) == json.dumps(m, sort_keys=True), p


def test_the_known_keys_read_as_stored():
    t = load(ROOT / "traces" / "auto" / "quack_gemm_sm90_square_8192.parquet")
    info, m = t.info, t.meta
    assert info.kernel == m["kernel"] == info.kernel_name == "quack GemmSm90"
    assert info.gpu.name == m["gpu"]["name"] and info.gpu.sm_count == m["gpu"]["sm_count"] == 132
    assert isinstance(info.instrument, InstrumentMeta) and info.instrument.pipelines == m["instrument"]["pipelines"]
    assert info.instrument.cursor == "smem" and info.instrument.families == m["instrument"]["families"]
    assert [ln.clock_ghz_median for ln in info.launches] == [ln["clock_ghz_median"] for ln in m["launches"]]
    assert info.launches[0].recorded_ctas == "0:128:16" and info.launches[0].pass_name is None
    assert info.t0_globaltimer_ns == m["t0_globaltimer_ns"] and info.total_dropped == 0
    assert info.vocabulary is m["vocabulary"]  # the stored object itself: nothing is copied or converted
    decode = load(ROOT / "traces" / "decode_d128_16to1_sk131072_b1_pingpong.parquet").info
    assert decode.instrument is None and decode.kernel_name == "decode_attention_sm90"
    assert isinstance(decode.timing, TimingMeta) and decode.timing.kernel_us == pytest.approx(19.3984, abs=1e-3)
    assert decode.config["schedule"] == "pingpong" and decode.launches[0].grid == [1, 132, 1]


def test_what_a_newer_fa4trace_writes_is_kept():
    m = {"kernel": "k", "future_top": {"x": [1, 2]}, "gpu": {"name": "G", "hbm": "5"},
         "launches": [{"launch": 0, "pass": "dense", "new_launch_key": 1}],
         "instrument": {"cursor": "ring", "new_inst_key": True},
         "timing": {"kernel_us": 1.0, "new_timing_key": "x"},
         "cta_lifetimes": {"launch": [0], "cta": [3], "start_ns": [1], "end_ns": [2], "recorded": [1], "sm": [7]}}
    info = BundleMeta.from_meta(m)
    assert info.extra == {"future_top": {"x": [1, 2]}} and info.gpu.extra == {"hbm": "5"}
    assert info.launches[0].extra == {"new_launch_key": 1} and info.launches[0].pass_name == "dense"
    assert info.instrument.extra == {"new_inst_key": True} and info.timing.extra == {"new_timing_key": "x"}
    assert info.cta_lifetimes.extra == {"sm": [7]} and info.cta_lifetimes.complete
    assert info.to_meta() == m


@pytest.mark.parametrize("m", [
    {"gpu": None, "launches": None, "instrument": None, "timing": [1, 2]},  # not what fa4trace writes
    {"launches": [1, {}], "instrument": "x", "cta_lifetimes": {"cta": [1]}},
    {"config": None, "synthetic": "yes", "warp_subset": None},
    {},
])
def test_odd_values_read_as_defaults_and_write_back_as_stored(m):
    info = BundleMeta.from_meta(m)
    assert info.to_meta() == m
    assert isinstance(info.gpu, GpuMeta) and isinstance(info.launches, tuple)
    assert info.instrument is None or isinstance(info.instrument, InstrumentMeta)


def test_a_stored_key_is_told_from_a_missing_one():
    info = BundleMeta.from_meta({"warp_subset": None, "launches": [{"overwritten": 0}]})
    assert info.has("warp_subset") and not info.has("cta_subset") and info.warp_subset is info.cta_subset is None
    assert info.launches[0].has("overwritten") and not info.launches[0].has("ring")
    # updated(): what it changes is stored, even a default (a key absent before is written)
    cut = info.updated(cta_subset=None, total_dropped=0)
    assert cut.to_meta() == {"warp_subset": None, "launches": [{"overwritten": 0}], "cta_subset": None,
                             "total_dropped": 0}
    assert BundleMeta(kernel="k").to_meta() == {"kernel": "k"}  # a made object writes what it sets


def test_trace_info_reads_the_metadata_as_it_is_now(tmp_path):
    t = load(ROOT / "traces" / "markers_h200.parquet")
    assert t.info.calibration is None
    t.meta["calibration"] = {"tick_ns": 32}
    assert t.info.calibration == {"tick_ns": 32}
    t.meta["brand_new"] = 1
    back = load(t.save(tmp_path / "t.parquet"))
    assert back.info.extra == {"brand_new": 1} and back.meta == json.loads(json.dumps(t.meta))


# any JSON object with keys drawn from those the format names and others: it round-trips
KNOWN = sorted(set(BundleMeta._keys()) | set(LaunchMeta._keys()) | set(InstrumentMeta._keys())
               | set(GpuMeta._keys()) | set(TimingMeta._keys()) | set(CtaLifetimes._keys()))
keys = st.one_of(st.sampled_from(KNOWN), st.text("xyz_", min_size=1, max_size=4))
json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=3)),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(keys, inner, max_size=4)), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys, json_values, max_size=8))
def test_any_metadata_round_trips(m):
    info = BundleMeta.from_meta(m)
    assert info.to_meta() == m
    assert BundleMeta.from_meta(info.to_meta()) == info


def test_every_part_is_frozen():
    for part in (BundleMeta(), LaunchMeta(), InstrumentMeta(), GpuMeta(), TimingMeta(), CtaLifetimes()):
        assert isinstance(part, MetaPart)
        with pytest.raises(AttributeError):
            part.extra = {}
    assert Trace.info.__doc__  # the typed reading is documented where users meet it
