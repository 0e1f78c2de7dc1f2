"""Golden decodes of hand-built buffers (the host twin of the recorder writes them)."""

from __future__ import annotations

import numpy as np
import pytest

from fa4trace.format import layout as L
from fa4trace.format.errors import TraceFormatError
from fa4trace.format.vocab import EV, ROLE
from fa4trace.trace.decode import SCHEMA, decode_buffer
from fa4trace.testing.bundles import WarpEvents, pack_records, write_buffer

B, E, I = L.KIND_BEGIN, L.KIND_END, L.KIND_INSTANT
GT0 = 1_000_000_000_000


def warp(cta=0, w=0, sm=3, role=ROLE.CONSUMER, clk0=10_000, cycles=20_000, ns=10_000, events=(), **kw):
    """A warp living `cycles` cycles == `ns` ns; events are (kind, event, payload, cycle offset)."""
    ev = list(events)
    return WarpEvents(cta=cta, warp=w, sm=sm, role=role, clk0=clk0, clk1=clk0 + cycles, gt0=GT0 + kw.pop("gt_off", 0),
                      gt1=GT0 + kw.pop("gt_off1", 0) + ns,
                      kind=np.array([e[0] for e in ev], np.int64), event=np.array([e[1] for e in ev], np.int64),
                      payload=np.array([e[2] for e in ev], np.int64), t=np.array([clk0 + e[3] for e in ev], np.int64),
                      **kw)


def rows(table):
    return table.to_pylist()


def test_cycles_to_ns_uses_each_warps_own_ratio():
    spec = L.BufferSpec(2, 1, 16)
    # warp 0 runs at 2 cycles/ns, warp 1 at 1 cycle/ns (a different SM clock), both 10 µs long.
    w0 = warp(w=0, cycles=20_000, events=[(B, EV.QK, 0, 2_000), (E, EV.QK, 0, 6_000)])
    w1 = warp(w=1, sm=7, clk0=555_555, cycles=10_000, events=[(I, EV.MARK, -1, 5_000)])
    d = decode_buffer(write_buffer(spec, [w0, w1]))
    assert d.table.schema == SCHEMA
    r = rows(d.table)
    qk = [x for x in r if x["name"] == "QK"][0]
    assert (qk["start_ns"], qk["end_ns"]) == (1_000, 3_000)
    assert (qk["start_cycles"], qk["end_cycles"]) == (12_000, 16_000)
    assert qk["kind"] == "span" and qk["iter"] == 0 and qk["role"] == "consumer"
    mark = [x for x in r if x["name"] == "MARK"][0]
    assert mark["start_ns"] == mark["end_ns"] == 5_000 and mark["iter"] == -1 and mark["kind"] == "instant"
    warps = [x for x in r if x["name"] == "WARP"]
    assert [(x["warp"], x["sm"], x["start_ns"], x["end_ns"]) for x in warps] == [(0, 3, 0, 10_000), (1, 7, 0, 10_000)]
    assert d.summary["clock_ghz_median"] == pytest.approx(1.5)
    assert d.t0_globaltimer_ns == GT0


def test_rows_are_ordered_by_cta_warp_start_with_outer_spans_first():
    spec = L.BufferSpec(1, 2, 16)
    w = warp(events=[(B, EV.SOFTMAX, 1, 100), (B, EV.CORRECTION, 1, 100), (E, EV.CORRECTION, 1, 200),
                     (E, EV.SOFTMAX, 1, 300), (B, EV.PV, 1, 400), (E, EV.PV, 1, 500)])
    w2 = warp(cta=1, events=[(B, EV.QK, 0, 50), (E, EV.QK, 0, 60)])
    r = rows(decode_buffer(write_buffer(spec, [w2, w])).table)
    assert [(x["cta"], x["name"]) for x in r] == [(0, "WARP"), (0, "SOFTMAX"), (0, "CORRECTION"), (0, "PV"),
                                                   (1, "WARP"), (1, "QK")]


def test_async_spans_overlapping_a_sync_span_pair_by_event_and_payload():
    # ping-pong: QK(1) issued before SOFTMAX(0), waited after PV(0)
    spec = L.BufferSpec(1, 1, 32)
    w = warp(events=[(B, EV.QK, 0, 10), (E, EV.QK, 0, 100), (B, EV.QK, 1, 110), (B, EV.SOFTMAX, 0, 120),
                     (E, EV.SOFTMAX, 0, 300), (B, EV.PV, 0, 310), (E, EV.QK, 1, 320), (E, EV.PV, 0, 400)])
    r = rows(decode_buffer(write_buffer(spec, [w])).table)
    got = {(x["name"], x["iter"]): (x["start_cycles"] - 10_000, x["end_cycles"] - 10_000) for x in r if x["name"] != "WARP"}
    assert got == {("QK", 0): (10, 100), ("QK", 1): (110, 320), ("SOFTMAX", 0): (120, 300), ("PV", 0): (310, 400)}


def test_32bit_timer_wraps_are_unwrapped():
    spec = L.BufferSpec(1, 1, 8)
    clk0 = (1 << 32) - 1_000  # low word wraps during the warp
    w = warp(clk0=clk0, cycles=10_000, events=[(B, EV.QK, 3, 500), (E, EV.QK, 3, 5_000)])
    r = [x for x in rows(decode_buffer(write_buffer(spec, [w])).table) if x["name"] == "QK"][0]
    assert (r["start_cycles"], r["end_cycles"]) == (clk0 + 500, clk0 + 5_000)
    assert r["end_ns"] - r["start_ns"] == 4_500


def test_overflowed_warp_is_flagged_and_its_cut_span_dropped():
    spec = L.BufferSpec(1, 1, 3)
    w = warp(events=[(B, EV.QK, 0, 1), (E, EV.QK, 0, 2), (B, EV.QK, 1, 3), (E, EV.QK, 1, 4)], attempted=6)
    d = decode_buffer(write_buffer(spec, [w]))
    assert d.summary["dropped"] == 3 and d.summary["overflowed_warps"] == 1 and d.summary["truncated_spans"] == 1
    r = rows(d.table)
    assert [x["name"] for x in r] == ["WARP", "QK"]
    assert r[0]["dropped"] == 3


def test_unmatched_begin_in_a_complete_warp_is_an_error_naming_the_record():
    spec = L.BufferSpec(2, 1, 8)
    w = warp(w=1, events=[(B, EV.QK, 0, 1), (B, EV.SOFTMAX, 0, 2), (E, EV.SOFTMAX, 0, 3)])
    with pytest.raises(TraceFormatError, match=r"CTA 0, warp 1\), record 0: begin without end"):
        decode_buffer(write_buffer(spec, [w]))


def test_end_without_begin_is_an_error():
    spec = L.BufferSpec(1, 1, 8)
    w = warp(events=[(E, EV.PV, 2, 1)])
    with pytest.raises(TraceFormatError, match="record 0: end without begin"):
        decode_buffer(write_buffer(spec, [w]))


def test_short_lived_warp_borrows_its_sms_clock_ratio():
    spec = L.BufferSpec(2, 1, 8)
    long = warp(w=0, cycles=40_000, ns=20_000)
    short = warp(w=1, cycles=200, ns=0, events=[(I, EV.MARK, 1, 100)])  # anchors in the same 32 ns tick
    d = decode_buffer(write_buffer(spec, [long, short]))
    assert d.summary["borrowed_clock_ratio_warps"] == 1
    mark = [x for x in rows(d.table) if x["name"] == "MARK"][0]
    assert mark["start_ns"] == 50  # 100 cycles at the SM's 2 cycles/ns


def test_globaltimer_timebase_records_are_ns():
    spec = L.BufferSpec(1, 1, 8)
    w = warp(clk0=GT0, cycles=10_000, ns=10_000, events=[(B, EV.LOAD_K, 4, 320), (E, EV.LOAD_K, 4, 640)])
    d = decode_buffer(write_buffer(spec, [w], timebase=L.TIMEBASE_GLOBALTIMER))
    r = [x for x in rows(d.table) if x["name"] == "LOAD_K"][0]
    assert (r["start_ns"], r["end_ns"]) == (320, 640)
    assert d.summary["timebase"] == "globaltimer"


def test_cta_subset_slots_map_back_to_real_cta_ids():
    spec = L.BufferSpec.for_grid(100, 1, 4, cta_first=5, cta_stride=10)
    assert spec.n_cta_slots == 10
    ws = [warp(cta=c, events=[(I, EV.MARK, c, 1)]) for c in range(100)]
    d = decode_buffer(write_buffer(spec, ws))
    assert sorted(set(d.table["cta"].to_pylist())) == list(range(5, 100, 10))


def test_warp_subset_slots_map_back_to_real_warp_ids():
    spec = L.BufferSpec.for_grid(3, 5, 4, warps=[4, 0])
    assert (spec.warps_per_cta, spec.warp_mask, spec.recorded_warps) == (2, 0b10001, (0, 4))
    assert L.BufferSpec.from_header(spec.new_buffer()) == spec
    ws = [warp(cta=c, w=w, events=[(I, EV.MARK, c, 1)]) for c in range(3) for w in range(5)]
    d = decode_buffer(write_buffer(spec, ws))
    got = sorted({(r["cta"], r["warp"]) for r in rows(d.table)})
    assert got == [(c, w) for c in range(3) for w in (0, 4)]
    assert d.summary["warp_subset"] == [0, 4]
    # a slot whose header names a warp outside the mask is foreign bytes
    buf = write_buffer(spec, ws)
    buf[L.GLOBAL_HEADER_WORDS + spec.slot_words + L.W_WARP] = 3
    with pytest.raises(TraceFormatError, match="warp 3"):
        decode_buffer(buf)


@pytest.mark.parametrize("warps", [[], [5], [-1], [0, 40]])
def test_bad_warp_subsets_are_refused(warps):
    with pytest.raises(ValueError, match="warps must be warp indices 0..4"):
        L.BufferSpec.for_grid(3, 5, 4, warps=warps)


def test_warp_mask_that_disagrees_with_the_warp_count_is_corrupt():
    buf = L.BufferSpec.for_grid(3, 5, 4, warps=[0, 4]).new_buffer()
    buf[3] = int(buf[3]) | (0b111 << 32)  # three warps selected, header says two
    with pytest.raises(TraceFormatError, match="header is corrupt"):
        decode_buffer(buf)
    with pytest.raises(ValueError, match="selects 3 warps"):
        L.BufferSpec(2, 1, 4, warp_mask=0b111)


def test_empty_slots_are_absent_warps_not_errors():
    spec = L.BufferSpec(4, 2, 4)
    d = decode_buffer(write_buffer(spec, [warp(cta=1, w=2)]))
    assert d.summary["warps_recorded"] == 1


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b.__setitem__(0, 0), "not an fa4trace buffer"),
    (lambda b: b.__setitem__(0, L.BUF_MAGIC | (99 << 32)), "format version 99"),
    (lambda b: b.__setitem__(L.GLOBAL_HEADER_WORDS, 0x1234), "header magic 0x00001234"),
    (lambda b: b.__setitem__(L.GLOBAL_HEADER_WORDS + L.W_GT1, 0) or b.__setitem__(L.GLOBAL_HEADER_WORDS + L.W_CLK1, 0)
     or b.__setitem__(L.GLOBAL_HEADER_WORDS + L.W_COUNTS, 0), "never finished"),
    (lambda b: b.__setitem__(L.GLOBAL_HEADER_WORDS + L.WARP_HEADER_WORDS, int(b[L.GLOBAL_HEADER_WORDS + L.WARP_HEADER_WORDS]) | (1 << 42)),
     "record 0: reserved bits"),
    (lambda b: b.__setitem__(L.GLOBAL_HEADER_WORDS + L.WARP_HEADER_WORDS, int(pack_records([10_001], [200], [I], [0])[0])),
     "unknown event id 200"),
    (lambda b: b.__setitem__(L.GLOBAL_HEADER_WORDS + L.W_IDS, 3 | (77 << 32)), "header says CTA 77"),
])
def test_corruptions_raise_trace_format_error(mutate, message):
    spec = L.BufferSpec(1, 1, 4)
    buf = write_buffer(spec, [warp(events=[(I, EV.MARK, 0, 1)])])
    mutate(buf)
    with pytest.raises(TraceFormatError, match=message):
        decode_buffer(buf)


def test_cluster_order_selects_the_slot_and_the_linear_cta_is_kept():
    """A CTA selected in cluster order: its slot follows that order (word 2's upper half), while
    the bundle keeps its linear CTA index (quack's RMSNorm clusters run along y: slot 1 is the
    y = 1 partner of CTA 0, linear index 4096 in a grid 4096 wide)."""
    spec = L.BufferSpec(warps_per_cta=1, n_cta_slots=2, capacity=4)
    buf = write_buffer(spec, [warp(cta=c, events=[(I, EV.MARK, 0, 1)]) for c in (0, 1)])
    base1 = L.GLOBAL_HEADER_WORDS + spec.slot_words
    buf[base1 + L.W_IDS] = 3 | (4096 << 32)
    buf[L.GLOBAL_HEADER_WORDS + L.W_WARP] = 0 | (1 << 32)  # cluster-order index 0 (+1)
    buf[base1 + L.W_WARP] = 0 | (2 << 32)  # cluster-order index 1 (+1)
    d = decode_buffer(buf)
    assert sorted(set(d.table.column("cta").to_pylist())) == [0, 4096]
    buf[base1 + L.W_WARP] = 0 | (3 << 32)  # index 2 does not belong in slot 1
    with pytest.raises(TraceFormatError, match="header says CTA 2 \\(in cluster order\\)"):
        decode_buffer(buf)


def test_a_strided_sample_of_clusters_fills_its_slots_cluster_by_cluster():
    """Clusters of 2 CTAs, every 8th cluster: slots 0, 1 are cluster 0's CTAs (order 0, 1),
    slots 2, 3 cluster 8's (order 16, 17); order 8 (cluster 4) belongs in no slot."""
    spec = L.BufferSpec(warps_per_cta=1, n_cta_slots=4, capacity=4, cta_stride=8)
    buf = write_buffer(spec, [warp(cta=c, events=[(I, EV.MARK, 0, 1)]) for c in (0, 8, 16, 24)])
    for slot, order in enumerate((0, 1, 16, 17)):
        buf[L.GLOBAL_HEADER_WORDS + slot * spec.slot_words + L.W_WARP] = ((order + 1) << 32) | (2 << 56)
    assert decode_buffer(buf).summary["warps_recorded"] == 4
    buf[L.GLOBAL_HEADER_WORDS + 2 * spec.slot_words + L.W_WARP] = ((8 + 1) << 32) | (2 << 56)
    with pytest.raises(TraceFormatError, match="header says CTA 8 \\(in cluster order\\)"):
        decode_buffer(buf)


def test_truncated_buffer():
    spec = L.BufferSpec(1, 4, 4)
    buf = write_buffer(spec, [warp()])
    with pytest.raises(TraceFormatError, match="truncated"):
        decode_buffer(buf[:-3])
    with pytest.raises(TraceFormatError, match="whole number of 64-bit words"):
        decode_buffer(buf.tobytes()[:-3])


def test_bytes_input_and_layout_round_trip():
    spec = L.BufferSpec(3, 5, 7, cta_first=2, cta_stride=3)
    assert L.BufferSpec.from_header(spec.new_buffer()) == spec
    buf = write_buffer(spec, [warp(cta=5, w=2, events=[(I, EV.MARK, 9, 3)])])
    d = decode_buffer(buf.tobytes())
    assert d.table.num_rows == 2


def test_pack_record_matches_vectorized_packer():
    for t, ev, k, p in [(0, 1, 0, None), (2**32 - 1, 255, 2, 5), (123, 7, 1, L.PAYLOAD_MAX)]:
        assert L.pack_record(t, ev, k, p) == int(pack_records([t], [ev], [k], [-1 if p is None else p])[0])


def _two_speed_warp(with_anchor: bool, attempted=None, cap_cut=False):
    """A warp whose SM clock runs 2 cycles/ns for 5 µs, then 1 cycle/ns for 5 µs."""
    clk0, g0 = 1_000_000, GT0
    mid_c, mid_g = clk0 + 10_000, g0 + 5_000  # after 10k cycles = 5 µs
    end_c, end_g = mid_c + 5_000, mid_g + 5_000
    ev = [(I, EV.MARK, 0, clk0 + 4_000), (I, EV.MARK, 1, mid_c + 2_000)]
    kinds, evs, pays, ts = [e[0] for e in ev], [e[1] for e in ev], [e[2] for e in ev], [e[3] for e in ev]
    if with_anchor:
        kinds[1:1] = [I, I]
        evs[1:1] = [L.ANCHOR_EVENT_ID, L.ANCHOR_EVENT_ID]
        pays[1:1] = [L.ANCHOR_CLOCK, L.ANCHOR_GLOBALTIMER]
        ts[1:1] = [mid_c, mid_g]
    return WarpEvents(0, 0, 1, ROLE.CONSUMER, clk0, end_c, g0, end_g, np.array(kinds), np.array(evs),
                      np.array(pays), np.array(ts, np.int64), attempted=attempted)


def test_anchors_make_cycles_to_ns_piecewise():
    spec = L.BufferSpec(1, 1, 8)
    d = decode_buffer(write_buffer(spec, [_two_speed_warp(True)]))
    marks = [x for x in rows(d.table) if x["name"] == "MARK"]
    assert [m["start_ns"] for m in marks] == [2_000, 7_000]  # exact on both sides of the change
    assert all(x["name"] != "ANCHOR" for x in rows(d.table)) and d.summary["anchors"] == 1
    plain = decode_buffer(write_buffer(spec, [_two_speed_warp(False)]))
    got = [x["start_ns"] for x in rows(plain.table) if x["name"] == "MARK"]
    assert got != [2_000, 7_000]  # one ratio for the whole warp cannot follow the change


def test_broken_anchor_pair_is_a_format_error():
    spec = L.BufferSpec(1, 1, 8)
    w = _two_speed_warp(True)
    w.payload[2] = 5  # the globaltimer half gets an unknown payload
    with pytest.raises(TraceFormatError, match="record 2: anchor record with an unknown payload"):
        decode_buffer(write_buffer(spec, [w]))
    w = _two_speed_warp(True)
    w.event[2] = EV.MARK  # the globaltimer half is gone
    with pytest.raises(TraceFormatError, match="record 1: clock anchor without its globaltimer partner"):
        decode_buffer(write_buffer(spec, [w]))


def test_anchor_cut_by_overflow_is_tolerated():
    spec = L.BufferSpec(1, 1, 2)  # keeps MARK 0 and the clock half of the anchor
    d = decode_buffer(write_buffer(spec, [_two_speed_warp(True, attempted=4)]))
    assert d.summary["overflowed_warps"] == 1 and d.summary["dropped"] == 2
    assert [x["name"] for x in rows(d.table)] == ["WARP", "MARK"]


def test_calibration_check_allows_the_anchors_few_ns_and_no_more():
    """A decoded sample counts as within one tick of its globaltimer bracket up to
    probes.calibration.ANCHOR_SLACK_NS beyond it (the anchors' own precision); further out it does not."""
    from types import SimpleNamespace

    import pyarrow as pa

    from fa4trace.probes.calibration import ANCHOR_SLACK_NS, calibration_checks
    from fa4trace.trace.meta import BundleMeta

    tick, t0 = 32, 1_000_000
    # two warps, two samples each: truth (before, after) brackets in absolute globaltimer ns
    truth = np.array([[[t0 + 100, t0 + 132], [t0 + 500, t0 + 532]],
                      [[t0 + 100, t0 + 132], [t0 + 500, t0 + 532]]], dtype=np.int64)
    ticks = np.arange(2 * 4, dtype=np.int64).reshape(2, 4) * tick
    hi_edge = 532 + 2 * tick  # the widened bracket's upper end of sample 1

    def checks(miss_ns):
        start = [116, 516, 116, hi_edge + miss_ns]  # warp 1's second sample misses by miss_ns
        events = pa.table({"name": pa.array(["CALIB"] * 4).dictionary_encode(), "cta": [0, 0, 0, 0],
                           "warp": [0, 0, 1, 1], "iter": [0, 1, 0, 1], "start_ns": start,
                           "sm": [0, 0, 1, 1]})
        meta = {"t0_globaltimer_ns": t0, "launches": [{"t0_offset_ns": 0}]}
        trace = SimpleNamespace(events=events, meta=meta, info=BundleMeta.from_meta(meta))
        return calibration_checks(trace, truth, ticks, warps_per_cta=2)

    ok = checks(ANCHOR_SLACK_NS)
    assert ok["tick_ns"] == tick and ok["warps_within_one_tick"] == 2 and ok["outside_ns_max"] == ANCHOR_SLACK_NS
    # SM 0's samples sit 16 ns before their brackets' centres; SM 1's median is (-16 + 64 + miss) / 2
    assert ok["sms"] == 2 and ok["sm_skew_ns"] == (-16 + 64 + ANCHOR_SLACK_NS) / 2 + 16
    off = checks(ANCHOR_SLACK_NS + 5)
    assert off["warps_within_one_tick"] == 1 and off["outside_ns_max"] == ANCHOR_SLACK_NS + 5


# ---- the CTA-lifetime region ------------------------------------------------------------------
def test_for_grid_times_ctas_in_a_region_after_the_warp_slots():
    spec = L.BufferSpec.for_grid(64, 4, 16, cta_stride=8)
    assert spec.lifetime_ctas == L.DEFAULT_LIFETIME_CTAS
    assert spec.words == spec.slots_end + L.LIFETIME_WORDS * spec.lifetime_ctas
    g4 = int(spec.header()[L.G_LIFETIMES])
    assert (g4 & 0xFFFFFFFF, g4 >> 32) == (spec.slots_end, L.DEFAULT_LIFETIME_CTAS)
    assert L.BufferSpec.from_header(spec.new_buffer()) == spec
    none = L.BufferSpec.for_grid(64, 4, 16, lifetime_ctas=0)
    assert none.words == none.slots_end and int(none.header()[L.G_LIFETIMES]) == 0


def test_lifetimes_decode_by_cta_with_who_recorded():
    spec = L.BufferSpec(1, 2, 8, cta_first=1, cta_stride=2, lifetime_ctas=6)  # CTAs 1 and 3 record
    ws = [warp(cta=1, gt_off=100, ns=5_000), warp(cta=3, gt_off=200, ns=5_000)]
    # CTAs 0..4 ran (5 stays untimed: beyond the grid); CTA 7 is beyond the region, not timed
    cta = np.array([0, 1, 2, 3, 4, 7])
    start = GT0 + np.array([0, 50, 120, 150, 6_000, 0])
    end = GT0 + np.array([4_000, 5_200, 4_100, 5_300, 9_000, 100])
    d = decode_buffer(write_buffer(spec, ws, lifetimes=(cta, start, end)))
    life = d.cta_lifetimes
    assert life["cta"].tolist() == [0, 1, 2, 3, 4]
    assert life["start_gt"].tolist() == start[:5].tolist() and life["end_gt"].tolist() == end[:5].tolist()
    assert life["recorded"].tolist() == [False, True, False, True, False]
    assert d.summary["ctas_timed"] == 5 and d.summary["ctas_outside_lifetime"] == 0


def test_a_buffer_without_region_or_without_stamps_has_no_lifetimes():
    assert decode_buffer(write_buffer(L.BufferSpec(1, 1, 4), [warp()])).cta_lifetimes is None
    d = decode_buffer(write_buffer(L.BufferSpec(1, 1, 4, lifetime_ctas=8), [warp()]))  # a build that does not stamp
    assert d.cta_lifetimes is None and d.summary["ctas_timed"] == 0


def test_a_recorded_warp_outside_its_ctas_lifetime_is_counted():
    spec = L.BufferSpec(1, 2, 4, lifetime_ctas=2)
    ws = [warp(cta=0, gt_off=100, ns=1_000), warp(cta=1, gt_off=100, ns=1_000)]
    # CTA 1's entry ends before its warp does: the stamps would never leave that
    d = decode_buffer(write_buffer(spec, ws, lifetimes=([0, 1], [GT0, GT0], [GT0 + 2_000, GT0 + 500])))
    assert d.summary["ctas_outside_lifetime"] == 1


def _one_entry(start_word, end_word):
    spec = L.BufferSpec(1, 1, 4, lifetime_ctas=2)
    buf = write_buffer(spec, [warp()])
    buf[spec.slots_end + L.LIFE_START_NOT] = start_word
    buf[spec.slots_end + L.LIFE_END] = end_word
    return buf


@pytest.mark.parametrize("start_word, end_word, message", [
    (~np.uint64(GT0), 0, "CTA 0's lifetime entry has a start but no end"),
    (0, GT0, "CTA 0's lifetime entry has an end but no start"),
    (~np.uint64(GT0 + 10), GT0, "CTA 0's lifetime entry is not a lifetime"),
    (1, GT0, "is not a lifetime"),  # ~1 is no time (negative as int64)
])
def test_broken_lifetime_entries_raise_trace_format_error(start_word, end_word, message):
    with pytest.raises(TraceFormatError, match=message):
        decode_buffer(_one_entry(start_word, end_word))


def test_a_lifetime_beyond_the_grid_is_foreign():
    buf = _one_entry(~np.uint64(GT0), GT0 + 10)
    buf[L.BufferSpec(1, 1, 4, lifetime_ctas=2).slots_end + 2:] = [~np.uint64(GT0), GT0 + 10]  # CTA 1 too
    with pytest.raises(TraceFormatError, match="CTA 1's lifetime entry is not a lifetime"):
        decode_buffer(buf, grid_ctas=1)


@pytest.mark.parametrize("g4, message", [
    (5 | (2 << 32), "lifetime region at word 5"),
    (7, "lifetime region at word 7"),
])
def test_a_misplaced_lifetime_region_is_a_corrupt_header(g4, message):
    buf = write_buffer(L.BufferSpec(1, 1, 4, lifetime_ctas=2), [warp()])
    buf[L.G_LIFETIMES] = g4
    with pytest.raises(TraceFormatError, match=message):
        decode_buffer(buf)


def test_a_truncated_lifetime_region():
    buf = write_buffer(L.BufferSpec(1, 1, 4, lifetime_ctas=4), [warp()])
    with pytest.raises(TraceFormatError, match="truncated"):
        decode_buffer(buf[:-1])


def test_a_buffer_the_device_cannot_index_is_refused():
    with pytest.raises(ValueError, match="too large: the device indexes it with 32-bit integers"):
        L.BufferSpec.for_grid(2048, 12, 1 << 17)
    assert L.BufferSpec.for_grid(2048, 12, 1 << 13).words < 1 << 31
