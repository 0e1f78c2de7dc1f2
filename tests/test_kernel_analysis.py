"""Any-kernel analysis (roles, fractions, occupancy, lag, wait chain) on synthetic bundles with known answers.

The tiny case (1 CTA, 4 k-tiles, 2 stages, 1 consumer warp, loads 100 ns, MMA 50 ns, store
100 ns) is worked out by hand from fa4trace.testing.bundles.pipelined_like's schedule:

    producer (warp 1)  ab.acquire 0 [50,60] 1 [80,90] 2 [110,270] 3 [290,370]; commits 70, 100, 280, 380
    consumer (warp 0)  ab.wait 0 [50,180] 1 [270,280] 2 [370,390] 3 [480,490]
                       mma.wait [200,250] [300,350] [410,460] [510,560]; releases 260, 360, 470, 570
                       barrier.sync(1) [590,600], barrier.arrive(2) 700; lifetime [0,730]
    epilogue (warp 2)  barrier.sync(2) [50,710], tma.store 730, tma.store_wait [740,840]; lifetime [0,890]
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fa4trace.analysis import kernel as K
from fa4trace.analysis.roles import assign_roles, decide_roles
from fa4trace.analysis.wait_chain import wait_chains
from fa4trace.format.errors import Fa4traceError
from fa4trace.trace.bundle import Trace
from fa4trace.trace.decode import decode_buffer
from fa4trace.testing.bundles import attention_like, pipelined_like

TINY = dict(n_ctas=1, k_tiles=4, stages=2, consumer_warps=1, idle_warps=0, load_ns=100, mma_ns=50, store_ns=100)


def bundle(**kw) -> Trace:
    buf, meta, vocab = pipelined_like(**kw)
    return Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab)


@pytest.fixture(scope="module")
def tiny():
    return bundle(**TINY)


# ---- the hand-worked case -----------------------------------------------------------------------
def test_tiny_occupancy_series_and_stats(tiny):
    occ = K.occupancy_series(tiny)
    # fills at the commits (70, 100, 280, 380), frees at the releases (260, 360, 470, 570)
    assert list(zip(occ["t_ns"].to_pylist(), occ["stages_full"].to_pylist())) == [
        (70, 1), (100, 2), (260, 1), (280, 2), (360, 1), (380, 2), (470, 1), (570, 0)]
    st = K.occupancy_stats(occ, {"ab": 2}).to_pylist()[0]
    # 1x30 + 2x160 + 1x20 + 2x80 + 1x20 + 2x90 + 1x100 = 830 over [70, 570]
    assert st["window_ns"] == 500 and st["mean"] == pytest.approx(830 / 500) and st["max"] == 2
    assert st["full_share"] == pytest.approx((160 + 80 + 90) / 500) and st["empty_share"] == 0


def test_tiny_lags(tiny):
    lags = K.pipeline_lags(tiny)
    # wait end - commit: 180-70, 280-100, 390-280, 490-380
    assert lags["lag_ns"].to_pylist() == [110, 180, 110, 110]
    assert lags["stage"].to_pylist() == [0, 1, 0, 1]
    st = K.lag_stats(lags)["ab"]
    assert st["median_ns"] == 110 and st["per_stage"][0]["median_ns"] == 110 and st["per_stage"][1]["median_ns"] == 145


def test_tiny_role_fractions(tiny):
    fr = {r["role"]: r for r in K.role_fractions(assign_roles(tiny)).to_pylist()}
    p = fr["producer"]  # lifetime 430; acquires 10+10+160+80; idle 50 before + 50 after the last commit
    assert (p["lifetime_ns"], p["waiting_ns"], p["idle_ns"], p["busy_ns"]) == (430, 260, 100, 70)
    m = fr["mma"]  # ab.wait 130+10+20+10, mma.wait 4x50, barrier 10; idle 50 + 30
    assert (m["lifetime_ns"], m["waiting_ns"], m["idle_ns"], m["busy_ns"]) == (730, 380, 80, 270)
    e = fr["epilogue"]  # barrier 660 + store_wait 100; idle 50 + 50
    assert (e["lifetime_ns"], e["waiting_ns"], e["idle_ns"], e["busy_ns"]) == (890, 760, 100, 30)
    assert e["busy"] + e["waiting"] + e["idle"] == pytest.approx(1.0)


def test_tiny_wait_chain(tiny):
    ch = wait_chains(assign_roles(tiny)).to_pandas()
    got = list(ch[["warp", "name", "iter", "start_ns", "end_ns", "wait_ns", "released_by_warp"]].itertuples(index=False, name=None))
    assert got == [
        (2, "tma.store_wait", -1, 740, 840, 100, -1),  # the epilogue warp ends last: its store
        (2, "barrier.sync", 2, 50, 710, 10, 0),  # released by the consumer's arrive at 700: counts 710-700
        (0, "barrier.sync", 1, 590, 600, 10, -1),  # the consumer arrived last itself
        (0, "mma.wait", 0, 510, 560, 50, -1),
        (0, "ab.wait", 3, 480, 490, 10, -1),  # committed at 380, before the wait began: stays
        (0, "mma.wait", 0, 410, 460, 50, -1),
        (0, "ab.wait", 2, 370, 390, 20, -1),
        (0, "mma.wait", 0, 300, 350, 50, -1),
        (0, "ab.wait", 1, 270, 280, 10, -1),
        (0, "mma.wait", 0, 200, 250, 50, -1),
        (0, "ab.wait", 0, 50, 180, 110, 1),  # committed at 70 while it waited: counts 180-70, on to the producer
        (1, "ab.acquire", 0, 50, 60, 10, -1),
    ]
    assert ch["step"].tolist() == list(range(12))
    s = K.summarize_kernel(tiny)
    assert s["wait_chain"]["wait_ns"] == 480 and s["wait_chain"]["steps"] == 12
    assert s["wait_chain"]["by_event"] == {"mma.wait": 200, "ab.wait": 150, "tma.store_wait": 100,
                                           "barrier.sync": 20, "ab.acquire": 10}
    assert s["wait_chain"]["share_of_cta"] == pytest.approx(480 / 890)


def test_tiny_summary_numbers(tiny):
    s = K.summarize_kernel(tiny)
    assert s["synthetic"] and s["kernel"] == "synthetic.gemm_like" and s["ctas"] == 1 and s["warps"] == 3
    assert s["total_span_ns"] == 890 and s["kernel_time_kind"] == "trace_span"
    assert s["roles"] == {"producer": {"warps": [1], "source": "inferred"}, "mma": {"warps": [0], "source": "inferred"},
                          "epilogue": {"warps": [2], "source": "inferred"}}
    assert s["role_fractions"]["producer"]["waiting"] == pytest.approx(260 / 430)
    assert s["waiting_by_event"]["mma"] == pytest.approx({"mma.wait": 200 / 730, "ab.wait": 170 / 730,
                                                          "barrier.sync": 10 / 730})
    ab = s["pipelines"]["ab"]
    assert ab["stages"] == 2 and ab["occupancy_mean"] == pytest.approx(1.66) and ab["occupancy_max"] == 2
    assert ab["lag_median_ns"] == 110 and ab["counts_per_cta"]["median"] == 4


# ---- roles ----------------------------------------------------------------------------------------
def test_roles_are_inferred_per_warp_index():
    tr = bundle(n_ctas=2, k_tiles=6)  # warps 0-3 consumers, 4 producer, 5-6 idle, 7 epilogue
    d = decide_roles(tr)
    assert d["by_warp"] == {0: "mma", 1: "mma", 2: "mma", 3: "mma", 4: "producer", 5: "idle", 6: "idle", 7: "epilogue"}
    assert set(d["source"].values()) == {"inferred"}
    rt = assign_roles(tr)
    df = rt.events.to_pandas()
    assert (df.groupby("warp")["role"].nunique() == 1).all()
    assert df[df["warp"] == 4]["role"].iloc[0] == "producer" and rt.meta["role_assignment"]["by_warp"]["7"] == "epilogue"


def test_given_roles_win_over_instrument_meta_and_inference():
    tr = bundle(n_ctas=1, k_tiles=4, roles={"producer": [4], "mma": [0, 1, 2, 3]})
    d = decide_roles(tr)
    assert d["source"][4] == "instrument" and d["source"][0] == "instrument" and d["source"][7] == "inferred"
    d = decide_roles(tr, {5: "scheduler", 4: "loader"})
    assert d["by_warp"][5] == "scheduler" and d["source"][5] == "given" and d["by_warp"][4] == "loader"
    assert d["by_warp"][0] == "mma" and d["source"][0] == "instrument"
    s = K.summarize_kernel(tr, {"loader": [4]})
    assert s["roles"]["loader"] == {"warps": [4], "source": "given"} and "producer" not in s["role_fractions"]
    with pytest.raises(Fa4traceError, match="two roles"):
        decide_roles(tr, {"a": [1], "b": [1]})


# ---- regimes with known answers -------------------------------------------------------------------
def test_load_bound_lag_is_the_load_latency():
    # loads of 2000 ns, 4 stages: every consumer waits for its tile to land; from the second round
    # on each count lands 2000 ns after its commit and the wait ends 10 ns later
    tr = bundle(n_ctas=3, k_tiles=16, stages=4, load_ns=2000, mma_ns=300)
    lags = K.pipeline_lags(tr).to_pandas()
    later = lags[lags["iter"] >= 4]
    assert (later["lag_ns"] == 2010).all() and len(later) == 3 * 12 * 4
    st = K.lag_stats(K.pipeline_lags(tr))["ab"]
    assert [p["median_ns"] for p in st["per_stage"]] == [2010] * 4
    s = K.summarize_kernel(tr)
    # the consumers wait mostly for data, the producer mostly for free stages
    assert s["waiting_by_event"]["mma"]["ab.wait"] > s["waiting_by_event"]["mma"]["mma.wait"]
    assert s["role_fractions"]["producer"]["waiting"] > 0.8
    assert s["pipelines"]["ab"]["occupancy_max"] == 4 and s["pipelines"]["ab"]["full_share"] > 0.8


def test_compute_bound_consumers_find_data_waiting():
    tr = bundle(n_ctas=2, k_tiles=16, stages=4, load_ns=100, mma_ns=1000)
    waits = tr.events.to_pandas().query("name == 'ab.wait' and iter >= 1")
    assert ((waits["end_ns"] - waits["start_ns"]) == 10).all()  # the stage was full: only the 10 ns overhead
    s = K.summarize_kernel(tr)
    assert s["waiting_by_event"]["mma"]["mma.wait"] > 10 * s["waiting_by_event"]["mma"]["ab.wait"]
    ab = s["pipelines"]["ab"]
    # full but for the ramp (4 quick commits) and the drain (the last 3 of 16 releases, ~1 µs apart)
    assert ab["lag_median_ns"] > 2000 and 0.75 < ab["full_share"] < 13 / 16 and ab["empty_share"] < 0.05


def test_straggler_shows_in_the_barrier_and_the_chain():
    tr = bundle(n_ctas=1, k_tiles=8, stages=4, load_ns=2000, straggler_ns=500, consumer_stagger_ns=4)
    ev = tr.events.to_pandas().query("name == 'barrier.sync' and iter == 1").sort_values("warp")
    # warp 3 arrives 500 ns late (plus its 4 ns per warp of stagger): the others wait for it
    assert (ev["end_ns"] - ev["start_ns"]).tolist() == [522, 518, 514, 10]
    ch = wait_chains(assign_roles(tr)).to_pandas()
    assert ch.iloc[1]["name"] == "barrier.sync" and ch.iloc[1]["released_by_warp"] == 3
    assert ch.iloc[2]["warp"] == 3 and ch.iloc[2]["wait_ns"] == 10  # the straggler itself did not wait


def test_slow_producer_hands_the_chain_to_it():
    # the producer issues a tile every 1000 ns: the consumers wait for commits that come while they wait
    tr = bundle(n_ctas=1, k_tiles=6, stages=2, load_ns=50, mma_ns=100, producer_gap_ns=1000)
    ch = wait_chains(assign_roles(tr)).to_pandas()
    jump = ch[(ch["name"] == "ab.wait") & (ch["released_by_warp"] == 4)]
    assert len(jump) == 1
    after = ch[ch["step"] > jump["step"].iloc[0]]
    assert set(after["warp"]) == {4} and set(after["name"]) == {"ab.acquire"}
    # the producer's own acquires never waited for a consumer (stages were always free)
    assert (after["wait_ns"] == 10).all() and len(after) == 6


# ---- the vectorized code against plain loops ------------------------------------------------------
def _naive_occupancy(df: pd.DataFrame):
    out = {}
    for cta, g in df.groupby("cta"):
        fill = g[g.name == "ab.commit"].groupby("iter")["start_ns"].min()
        free = g[g.name == "ab.release"].groupby("iter")["start_ns"].max()
        times = sorted(set(fill) | set(free))
        out[cta] = [(t, int((fill <= t).sum() - (free.reindex(fill.index) <= t).sum())) for t in times]
    return out


def _naive_chain(df: pd.DataFrame, stages: int):
    """The module docstring of fa4trace.analysis.wait_chain, one CTA, with loops."""
    ev = df[df.kind != "warp"]
    waits = ev[ev.name.isin(["ab.acquire", "ab.wait", "mma.wait", "barrier.sync", "tma.store_wait"])
               & (ev.end_ns > ev.start_ns)]

    def releaser(w):
        if w["name"] == "ab.wait":
            src = ev[(ev.name == "ab.commit") & (ev.iter == w.iter) & (ev.start_ns <= w.end_ns)]
        elif w["name"] == "ab.acquire" and w.iter >= stages:
            src = ev[(ev.name == "ab.release") & (ev.iter == w.iter - stages) & (ev.start_ns <= w.end_ns)]
        elif w["name"] == "barrier.sync":
            src = ev[ev.name.isin(["barrier.arrive", "barrier.sync"]) & (ev.iter == w.iter) & (ev.start_ns <= w.end_ns)]
        else:
            return None
        if src.empty:
            return None
        r = src.sort_values(["start_ns", "warp"]).iloc[-1]
        return (r.warp, r.start_ns) if w.start_ns < r.start_ns <= w.end_ns and r.warp != w.warp else None

    last = ev.groupby("warp")["end_ns"].max()
    warp = int(last[last == last.max()].index.max())
    t, seen, out = int(last.max()), set(), []
    while True:
        mine = waits[(waits.warp == warp) & (waits.end_ns <= t)].sort_values(["end_ns", "start_ns"])
        if mine.empty or mine.index[-1] in seen:
            return out
        w = mine.iloc[-1]
        seen.add(mine.index[-1])
        r = releaser(w)
        out.append((int(w.warp), w["name"], int(w.iter), int(w.end_ns - (r[1] if r else w.start_ns))))
        warp, t = (int(r[0]), int(r[1])) if r else (warp, int(w.start_ns))


def test_vectorized_results_equal_plain_loops():
    rng = np.random.default_rng(7)
    load = rng.integers(50, 1500, (5, 12))
    tr = assign_roles(bundle(n_ctas=5, k_tiles=12, stages=3, load_ns=load, mma_ns=200, straggler_ns=150))
    df = tr.events.to_pandas()
    occ = K.occupancy_series(tr).to_pandas()
    for cta, want in _naive_occupancy(df).items():
        got = occ[occ.cta == cta]
        assert list(zip(got.t_ns, got.stages_full)) == want
    ch = wait_chains(tr).to_pandas()
    for cta, g in df.groupby("cta"):
        got = ch[ch.cta == cta]
        assert list(zip(got.warp, got.name, got.iter, got.wait_ns)) == _naive_chain(g, 3)


def test_chain_parts_fit_in_the_cta():
    tr = bundle(n_ctas=4, k_tiles=20, stages=4, load_ns=np.random.default_rng(1).integers(10, 3000, (4, 20)))
    s = K.summarize_kernel(tr)
    assert s["wait_chain_ns"]["max"] <= s["cta_span_ns"]["max"]
    ch = wait_chains(tr).to_pandas()
    for _, g in ch.groupby("cta"):
        # counted parts are disjoint: each ends at or before the start of the one after it in time
        lo = np.where(g.released_by_warp >= 0, g.release_ns, g.start_ns).astype(np.int64)
        assert (g.end_ns.to_numpy()[1:] <= lo[:-1]).all()


# ---- comparison and errors ------------------------------------------------------------------------
def test_compare_two_bundles_of_one_kernel():
    a = bundle(n_ctas=2, k_tiles=16, stages=2, load_ns=2000)
    b = bundle(n_ctas=2, k_tiles=16, stages=6, load_ns=2000)  # more stages hide more of the latency
    c = K.compare_kernels(a, b)
    d = c["diff"]
    assert d["kernel_time_ns"]["b"] < d["kernel_time_ns"]["a"] and "less time" in c["speed"]
    assert c["differs"]["config"] == {"stages": [2, 6]} and "on different configs (stages 2 → 6)" in c["speed"]
    assert d["role.mma.waiting"]["delta"] < 0
    assert d["pipeline.ab.occupancy_mean"]["a"] <= 2 < d["pipeline.ab.occupancy_mean"]["b"]
    assert d["wait_chain_ns"]["a"] == c["a"]["wait_chain_ns"]["median"]
    assert set(d) >= {"role.producer.busy", "pipeline.ab.lag_median_ns", "wait_chain_steps", "total_span_ns"}


def test_errors_are_one_clear_line():
    buf, meta = attention_like("base", n_ctas=2, n_blocks=4)
    att = Trace.from_launches([decode_buffer(buf)], meta)
    with pytest.raises(Fa4traceError, match="not a bundle of an automatically traced kernel"):
        K.summarize_kernel(att)
    a = bundle(**TINY)
    b = bundle(**{**TINY, "kernel": "other.kernel"})
    with pytest.raises(Fa4traceError, match="A is kernel synthetic.gemm_like, B is kernel other.kernel"):
        K.compare_kernels(a, b)


def test_empty_and_subset_bundles_do_not_break():
    tr = bundle(**TINY)
    cons = Trace(tr.events.filter(tr.events["warp"].to_numpy() == 0), tr.meta)  # only the consumer recorded
    s = K.summarize_kernel(cons)
    assert s["roles"] == {"mma": {"warps": [0], "source": "inferred"}}
    # no commit or acquire recorded: no fills, so neither occupancy nor lag; the waits are still there
    assert s["pipelines"]["ab"] == {"stages": 2, "counts_per_cta": {"min": 0.0, "median": 0.0, "max": 0.0}}
    assert s["wait_chain"]["steps"] > 0
    empty = Trace(tr.events.slice(0, 0), tr.meta)
    s = K.summarize_kernel(empty)
    assert s["rows"] == 0 and s["pipelines"] == {} and s["wait_chain_ns"] is None


def test_occupancy_counts_only_what_both_sides_kept_in_a_ctas_that_lost_records():
    """A ring keeps each warp's newest records: a consumer that lost its oldest releases while
    the producer kept those fills would show them held until the CTA ends. In such a CTA only
    the counts between the first and last kept release count; a CTA that lost nothing is as
    before."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = bundle(n_ctas=2, k_tiles=16, stages=4, consumer_warps=1, idle_warps=0)
    before = K.occupancy_series(t)
    ev = t.events
    names = ev["name"].cast(pa.string())
    consumer = pc.and_(pc.equal(ev["cta"], 0), pc.equal(ev["warp"], 0))
    lost = pc.and_(pc.and_(consumer, pc.less(ev["iter"], 6)), pc.not_equal(ev["kind"].cast(pa.string()), "warp"))
    lost = pc.and_(lost, pc.invert(pc.equal(names, "WARP")))
    kept = ev.filter(pc.invert(lost))
    warp_row = pc.and_(pc.and_(pc.equal(kept["cta"], 0), pc.equal(kept["warp"], 0)),
                       pc.equal(kept["kind"].cast(pa.string()), "warp"))
    dropped = pc.if_else(warp_row, pa.scalar(12, kept["dropped"].type), kept["dropped"])
    lossy = Trace(kept.set_column(kept.schema.get_field_index("dropped"), "dropped", dropped), t.meta)
    occ = K.occupancy_series(lossy)
    cta0 = occ.filter(pc.equal(occ["cta"], 0))
    assert 0 < pc.max(cta0["stages_full"]).as_py() <= 4  # not the 6 lost releases piled on top
    cta1 = occ.filter(pc.equal(occ["cta"], 1))
    assert cta1.equals(before.filter(pc.equal(before["cta"], 1)))
    # the same CTA before it lost records held at most its stages too
    assert pc.max(before.filter(pc.equal(before["cta"], 0))["stages_full"]).as_py() <= 4
