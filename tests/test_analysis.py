"""Overlap metrics on traces with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from fa4trace.analysis import overlap as A
from fa4trace.format import layout as L
from fa4trace.format.vocab import EV, ROLE
from fa4trace.trace.bundle import Trace
from fa4trace.trace.decode import decode_buffer
from fa4trace.trace.meta import TimingMeta
from fa4trace.testing.bundles import WarpEvents, attention_like, write_buffer

B, E = L.KIND_BEGIN, L.KIND_END


def trace_of(warps, spec, meta=None):
    return Trace.from_launches([decode_buffer(write_buffer(spec, warps))], meta or {"kernel": "t"})


def w(cta, warp, events, span=1_000):
    ev = sorted(events, key=lambda e: e[3])
    return WarpEvents(cta, warp, cta, ROLE.CONSUMER, 0, span, 10**12, 10**12 + span,
                      np.array([e[0] for e in ev]), np.array([e[1] for e in ev]), np.array([e[2] for e in ev]),
                      np.array([e[3] for e in ev], np.int64))


def spans(*triples):
    out = []
    for ev, it, (a, b) in triples:
        out += [(B, ev, it, a), (E, ev, it, b)]
    return out


def test_overlap_fractions_and_hidden_softmax():
    ev = spans((EV.QK, 0, (0, 200)), (EV.SOFTMAX, 0, (100, 300)), (EV.PV, 0, (250, 400)))
    t = trace_of([w(0, 0, ev)], L.BufferSpec(1, 1, 16))
    s = A.summarize(t)
    assert s["qk_softmax_overlap"] == pytest.approx(0.5)
    assert s["pv_softmax_overlap"] == pytest.approx(0.25)
    assert s["hidden_softmax_ns"] == pytest.approx(150)
    assert s["tensor_core_busy"] == pytest.approx(350 / 1000)
    assert s["kernel_span_ns"] == 1000
    assert s["median_ns"] == {"qk": 200, "softmax": 200, "pv": 150}


def test_unions_across_warps_of_a_cta_and_weighting_across_ctas():
    # CTA 0: two warps' softmax [0,100] and [50,150] -> union 150; QK [100,200] -> overlap 50
    c0 = [w(0, 0, spans((EV.SOFTMAX, 0, (0, 100)))), w(0, 1, spans((EV.SOFTMAX, 0, (50, 150)), (EV.QK, 1, (100, 200))))]
    # CTA 1: softmax [0, 50] fully under QK [0, 60]
    c1 = [w(1, 0, spans((EV.SOFTMAX, 0, (0, 50)), (EV.QK, 1, (0, 60))))]
    t = trace_of(c0 + c1, L.BufferSpec(2, 2, 16))
    per = A.per_cta(t).to_pydict()
    assert per["qk_softmax_overlap"] == pytest.approx([50 / 150, 1.0])
    s = A.summarize(t)
    assert s["qk_softmax_overlap"] == pytest.approx((50 + 50) / (150 + 50))  # time-weighted
    assert s["qk_softmax_overlap_cta_median"] == pytest.approx((1 / 3 + 1) / 2)


def test_period_per_iteration_and_typical_cta():
    ev = []
    for i in range(5):
        ev += spans((EV.SOFTMAX, i, (100 * i, 100 * i + 40)))
    t = trace_of([w(0, 0, ev), w(1, 0, ev, span=2_000), w(2, 0, ev, span=3_000)], L.BufferSpec(1, 3, 16))
    s = A.summarize(t)
    assert s["period_ns"] == 100
    assert s["typical_cta"] == 1
    pi = A.per_iteration(t).to_pydict()
    assert set(pi["iter"]) == set(range(5)) and all(m == 40 for n, m in zip(pi["name"], pi["median_ns"]) if n == "SOFTMAX")


def test_pingpong_beats_base_in_compare():
    tr = {}
    for sched in ("base", "pingpong"):
        buf, meta = attention_like(sched, n_ctas=8, n_blocks=20)
        meta["config"].update({"b": 1, "sk": 2560, "hq": 16, "hkv": 1, "d": 128, "dtype": "bf16"})
        tr[sched] = Trace.from_launches([decode_buffer(buf)], meta)
    c = A.compare(tr["base"], tr["pingpong"])
    assert c["b"]["qk_softmax_overlap"] > 0.5 > c["a"]["qk_softmax_overlap"]
    assert c["diff"]["period_ns"]["delta"] < 0
    assert "hides" in c["headline"] and "less time" in c["speed"] and "x faster" in c["speed"]
    assert c["differs"]["config"] == {}  # the schedule differs, the shape does not
    assert c["a"]["bandwidth_tbps"] > 0 and c["a"]["bytes"] == 2 * (2 * 16 * 128 + 2 * 2560 * 128)


def test_attention_bytes_needs_the_shape():
    assert A.attention_bytes({}) is None
    assert A.attention_bytes({"b": 2, "sq": 1, "sk": 10, "hq": 4, "hkv": 2, "d": 64, "dtype": "fp16"}) == \
        2 * (2 * 2 * 4 * 64 + 2 * 2 * 10 * 2 * 64)


def test_union_sweep_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(30):
        n = 40
        g = rng.integers(0, 3, n)
        s = rng.integers(0, 1000, n)
        e = s + rng.integers(0, 200, n)
        m = rng.random(n) < 0.5
        la, lb, inter = A.overlap_length(g[m], s[m], e[m], g[~m], s[~m], e[~m], 3)
        for k in range(3):
            a = np.zeros(1300, bool)
            b = np.zeros(1300, bool)
            for i in np.flatnonzero(m & (g == k)):
                a[s[i]:e[i]] = True
            for i in np.flatnonzero(~m & (g == k)):
                b[s[i]:e[i]] = True
            assert (la[k], lb[k], inter[k]) == (a.sum(), b.sum(), (a & b).sum())


def test_mainloop_balance_finds_the_fast_sms_and_the_idle_tail():
    """CTAs 0-1 run 4 KV blocks at 100 ns each, CTAs 2-4 at 130 ns (sm == cta here)."""
    def cta(c, p):
        ev = []
        for i in range(4):
            ev += spans((EV.QK, i, (i * p, i * p + p // 2)), (EV.SOFTMAX, i, (i * p + p // 2, i * p + 3 * p // 4)),
                        (EV.PV, i, (i * p + 3 * p // 4, (i + 1) * p)))
        return w(c, 0, ev)

    t = trace_of([cta(0, 100), cta(1, 100), cta(2, 130), cta(3, 130), cta(4, 130)], L.BufferSpec(1, 5, 64))
    s = A.summarize(t)
    assert s["mainloop_end_ns"] == {"min": 400, "median": 520.0, "max": 520}
    assert s["fast_sms"] == [0, 1]
    assert s["fast_sm_rate_ratio"] == pytest.approx(1.3)
    assert s["mainloop_idle_share"] == pytest.approx(2 * (120 / 520) / 5)
    # Even CTAs: nothing fast, nothing idle.
    even = A.summarize(trace_of([cta(c, 100) for c in range(3)], L.BufferSpec(1, 3, 64)))
    assert even["fast_sms"] == [] and even["mainloop_idle_share"] == pytest.approx(0.0)


def test_stream_profile_against_a_perfect_stream():
    """4 CTAs, 16 KV blocks each: a block every 100 ns from t=500 (500 ns lost at the start),
    except the last 4 of CTA 3 which come 300 ns apart (a slow end); warps live 3000 ns."""
    cfg = {"tile_n": 64, "d": 128, "dtype": "bf16"}  # 32 KiB per block
    block = 2 * 64 * 128 * 2

    def cta(c):
        times = [500 + 100 * i for i in range(12)]
        times += [times[-1] + (300 if c == 3 else 100) * k for k in range(1, 5)]
        ev = []
        for i, t0 in enumerate(times):
            ev += spans((EV.PV, i, (t0, t0 + 50)))
        return w(c, 0, ev, span=3000)

    t = trace_of([cta(c) for c in range(4)], L.BufferSpec(1, 4, 64), meta={"kernel": "t", "config": cfg})
    s = A.summarize(t)
    # middle half: blocks 16..47 of 64 sorted times; 4 CTAs at one block per 100 ns each
    assert s["stream_tbps"] == pytest.approx(4 * block / 100 / 1e3, rel=0.05)
    rate = 4 * block / 100  # bytes per ns
    # the 25% mark (block 4 of every CTA) comes at 900 ns; at the steady rate 16 blocks take 400 ns
    assert s["stream_start_loss_ns"] == pytest.approx(900 - 16 * block / rate, abs=60)
    assert s["stream_end_loss_ns"] > 600  # CTA 3's last blocks: 900 ns late
    assert s["after_stream_ns"] == pytest.approx(3000 - (500 + 1100 + 1200), abs=1)
    series = s["stream_series"]
    assert len(series) == A.STREAM_BINS and series[0] == [0.0, 0.0]  # nothing consumed before 500 ns
    # Without the block size (no config) there is no profile, and nothing else changes.
    bare = A.summarize(trace_of([cta(c) for c in range(4)], L.BufferSpec(1, 4, 64)))
    assert "stream_tbps" not in bare and bare["kernel_span_ns"] == s["kernel_span_ns"]



def test_startup_profile_is_the_median_cta():
    """Per CTA: first LOAD_K end, LOAD_Q end, first QK start, first PV start, from the launch's
    first warp."""
    def cta(c, shift):
        prod = w(c, 1, spans((EV.LOAD_K, 0, (100 + shift, 150 + shift)), (EV.LOAD_K, 1, (160 + shift, 170 + shift))))
        cons = w(c, 0, spans((EV.LOAD_Q, 0, (60 + shift, 300 + shift)), (EV.QK, 0, (400 + shift, 450 + shift)),
                             (EV.PV, 0, (600 + shift, 650 + shift)), (EV.QK, 1, (700, 720))))
        # another consumer warp stores its part of Q earlier: Q is ready when the last one has
        early = w(c, 2, spans((EV.LOAD_Q, 0, (60 + shift, 200 + shift))))
        return [cons, prod, early]

    t = trace_of(cta(0, 0) + cta(1, 100) + cta(2, 40), L.BufferSpec(3, 3, 64))
    s = A.summarize(t)
    assert (s["startup_first_load_ns"], s["startup_q_ready_ns"], s["startup_first_qk_ns"],
            s["startup_first_pv_ns"]) == (190, 340, 440, 640)
    bare = A.summarize(trace_of([w(0, 0, spans((EV.MARK, 0, (1, 2))))], L.BufferSpec(1, 1, 16)))
    assert "startup_first_qk_ns" not in bare


def test_kv_block_bytes_from_either_config_spelling():
    assert A.kv_block_bytes({"tile_n": 64, "d": 128, "dtype": "bf16"}) == 2 * 64 * 128 * 2
    assert A.kv_block_bytes({"tile": [128, 128], "d": 128, "dtype": "bf16"}) == 2 * 128 * 128 * 2  # FA4 adapter
    assert A.kv_block_bytes({"tile_n": 64, "head_dim": 64, "dtype": "fp8"}) == 2 * 64 * 64
    assert A.kv_block_bytes({"d": 128}) is None and A.kv_block_bytes({"tile": [], "d": 1}) is None


def test_kernel_time_source_order():
    """bench_us (cold L2) over kernel_us (recorded inputs) over the trace span."""
    k = A.kernel_time(TimingMeta(bench_us=2.0, kernel_us=1.5, traced_us=1.6), 900)
    assert (k["kernel_time_ns"], k["kernel_time_kind"]) == (2000.0, "cold_l2_bench")
    assert k["recorded_kernel_time_ns"] == 1500.0 and k["traced_time_ns"] == 1600.0
    k = A.kernel_time(TimingMeta(kernel_us=1.5), 900)
    assert (k["kernel_time_ns"], k["kernel_time_kind"]) == (1500.0, "recorded_inputs")
    assert "recorded inputs" in k["kernel_time_source"] and k["bench_time_ns"] is None
    k = A.kernel_time(None, 900)
    assert (k["kernel_time_ns"], k["kernel_time_kind"], k["traced_time_ns"]) == (900, "trace_span", None)


def test_bandwidth_uses_the_kernel_time_shown():
    buf, meta = attention_like("pingpong", n_ctas=2, n_blocks=6)
    cfg = dict(meta.get("config") or {}, d=128, hq=16, hkv=1, sk=4096, b=1, sq=1, dtype="bf16")
    tr = Trace.from_launches([decode_buffer(buf)], dict(meta, config=cfg, timing={"bench_us": 10.0, "kernel_us": 5.0}))
    s = A.summarize(tr)
    assert s["kernel_time_kind"] == "cold_l2_bench"
    assert s["bandwidth_tbps"] == pytest.approx(s["bytes"] / 10_000 / 1e3)


SRC = {"kernel_time_kind": "trace_span", "kernel_time_source": "trace span of the recorded warps"}


@pytest.mark.parametrize("a_ns, b_ns, caveat, want", [
    (20_000, 10_000, None, "kernel time 20.00 µs → 10.00 µs: B takes 50.0% less time (2.00x faster)"),
    (10_000, 25_000, None, "kernel time 10.00 µs → 25.00 µs: B takes 150.0% more time (2.50x slower)"),
    (10_000, 10_000, None, "kernel time 10.00 µs → 10.00 µs: B takes the same time"),
    (1_390_880, 93_630, "on different configs (m 8192 → 64)",
     "kernel time 1390.88 µs → 93.63 µs: B takes 93.3% less time, on different configs (m 8192 → 64)"),
])
def test_speed_text_says_how_much_less_time_and_no_ratio_across_different_work(a_ns, b_ns, caveat, want):
    got = A.speed_text(dict(SRC, kernel_time_ns=a_ns), dict(SRC, kernel_time_ns=b_ns), caveat)
    assert got == want + " [trace span of the recorded warps]"


def test_compare_of_two_shapes_says_they_differ():
    tr = []
    for sched, sk in (("base", 2560), ("pingpong", 5120)):
        buf, meta = attention_like(sched, n_ctas=4, n_blocks=10)
        meta["config"].update({"b": 1, "sk": sk, "hq": 16, "hkv": 1, "d": 128, "dtype": "bf16"})
        tr.append(Trace.from_launches([decode_buffer(buf)], dict(meta, kernel=f"k_{sched}")))
    c = A.compare(*tr)
    assert c["differs"] == {"config": {"sk": [2560, 5120]}, "kernel": ["k_base", "k_pingpong"]}
    assert "but A and B ran different shapes (sk 2560 → 5120): not a speed-up" in c["speed"]
    assert "faster" not in c["speed"] and "slower" not in c["speed"]
