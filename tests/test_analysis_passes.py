"""fa4trace.analysis.passes on synthetic bundles with known answers: each figure from the lightest
pass that reports it, the pass named, the dense reading beside it; `fa4trace summary` shows it.

The bundle: one synthetic pipelined kernel (fa4trace.testing.bundles.pipelined_like) recorded
four ways, as ``instrument(passes=...)`` would: "dense" (every family; its MMA waits and loads
stretched by the recording, mma 330 ns and load 420 ns), and the same launch unperturbed (mma
300 ns, load 400 ns) seen through lighter recordings: "pipeline" (the ab pipeline's events),
"mma" (the MMA events), "lifetimes" (warp lifetimes only).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner

from fa4trace.analysis import passes as P
from fa4trace.analysis.figures import trace_metrics
from fa4trace.analysis.roles import decide_roles
from fa4trace.trace.bundle import Trace
from fa4trace.trace.decode import DecodedLaunch, decode_buffer
from fa4trace.testing.bundles import pipelined_like, sampled_like

SHAPE = dict(n_ctas=3, k_tiles=6, stages=2, consumer_warps=2, idle_warps=0, store_ns=100)


def _launch(i: int, keep=None, **kw):
    """Launch ``i``: pipelined_like(**SHAPE, **kw), only warp rows and events named ``keep(name)``."""
    buf, meta, vocab = pipelined_like(**SHAPE, **kw)
    d = decode_buffer(buf, launch_index=i, vocab=vocab)
    if keep is not None:
        t = d.table
        names = np.asarray(t["name"].cast("string").to_pylist())
        kinds = np.asarray(t["kind"].cast("string").to_pylist())
        m = (kinds == "warp") | np.array([keep(n) for n in names], bool)
        d = DecodedLaunch(t.filter(m), d.t0_globaltimer_ns, dict(d.summary), d.cta_lifetimes)
    return d, meta, vocab


@pytest.fixture(scope="module")
def bundle():
    light = dict(mma_ns=300, load_ns=400)
    parts = [("dense", _launch(0, mma_ns=330, load_ns=420)),
             ("pipeline", _launch(1, lambda n: n.startswith("ab."), **light)),
             ("mma", _launch(2, lambda n: n.startswith("mma."), **light)),
             ("lifetimes", _launch(3, lambda n: False, **light))]
    meta = dict(parts[0][1][1], launches=[{"pass": p, "call": 0} for p, _ in parts])
    return Trace.from_launches([d for _, (d, _m, _v) in parts], meta, vocab=parts[0][1][2])


@pytest.fixture(scope="module")
def unperturbed():
    """The light launch recorded densely: what every light pass should read."""
    d, meta, vocab = _launch(0, mma_ns=300, load_ns=400)
    return Trace.from_launches([d], meta, vocab=vocab)


def test_the_passes_split_and_renumber(bundle):
    assert P.launch_passes(bundle) == ["dense", "pipeline", "mma", "lifetimes"] and P.has_passes(bundle)
    by = P.pass_traces(bundle)
    assert list(by) == ["dense", "pipeline", "mma", "lifetimes"]
    for p, t in by.items():
        assert set(t.events["launch"].to_pylist()) == {0}
        assert t.meta["launches"] == [dict(bundle.meta["launches"][list(by).index(p)])]
    names = set(by["mma"].events["name"].cast("string").to_pylist())
    assert names == {"WARP", "mma.commit", "mma.wait"}


def test_lightest_is_fewest_events_per_recorded_cta(bundle):
    s = P.sourced_figures(bundle)
    assert [p["pass"] for p in s["passes"]] == ["lifetimes", "mma", "pipeline", "dense"]
    w = {p["pass"]: p["events_per_cta"] for p in s["passes"]}
    assert w["lifetimes"] == 0 and 0 < w["mma"] < w["pipeline"] < w["dense"]
    # 2 consumers x 6 k-tiles x (mma.commit + mma.wait) per CTA
    assert w["mma"] == 2 * 6 * 2


def test_each_figure_comes_from_the_lightest_pass_that_reports_it(bundle, unperturbed):
    s = P.sourced_figures(bundle)
    f = s["figures"]
    roles = decide_roles(P.pass_traces(bundle)["dense"])["by_warp"]
    truth = trace_metrics(unperturbed, roles)
    dense = trace_metrics(P.pass_traces(bundle)["dense"], roles)
    want = {"cta.median_ns": "lifetimes", "span.mma.wait.median_ns": "mma", "lag.ab.median_ns": "pipeline",
            "span.ab.wait.median_ns": "pipeline", "waiting.producer.ab.acquire": "pipeline",
            "span.barrier.sync.median_ns": "dense", "span.tma.store_wait.median_ns": "dense"}
    for key, src in want.items():
        assert f[key]["pass"] == src, (key, f[key])
        if src != "dense":  # a light pass reads the unperturbed launch, not the dense one
            assert f[key]["value"] == pytest.approx(truth[key]), key
        assert f[key]["dense"] == pytest.approx(dense[key]), key
    assert f["span.mma.wait.median_ns"]["value"] == pytest.approx(302.0)  # consumers 300 and 304 ns
    assert f["span.mma.wait.median_ns"]["dense_rel"] == pytest.approx(332.0 / 302.0 - 1)
    assert f["cta.median_ns"]["dense"] > f["cta.median_ns"]["value"]
    assert set(f) == set(dense)  # every figure the dense trace reports is sourced, and none else here


def test_without_passes_it_is_one_line():
    from fa4trace.format.errors import Fa4traceError

    buf, meta, vocab = pipelined_like(**SHAPE)
    t = Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab)
    assert P.launch_passes(t) is None and not P.has_passes(t)
    with pytest.raises(Fa4traceError, match="not recorded with passes"):
        P.sourced_figures(t)


def test_selecting_launches_keeps_their_lifetimes_and_twin_entries():
    launches = []
    for i in range(3):
        buf, meta, vocab = sampled_like(n_ctas=32, sms=8, n_recorded=4, slowdown=0.1 * i)
        launches.append(decode_buffer(buf, launch_index=i, vocab=vocab))
    meta = dict(meta, launches=[{"pass": p} for p in ("dense", "lifetimes", "dense")],
                instrument=dict(meta.get("instrument") or {}, plain_twin=[
                    {"launch": 0, "plain_ns": 10.0, "traced_ns": 11.0}, {"launch": 1, "method": None, "reason": "pass"},
                    {"launch": 2, "plain_ns": 10.0, "traced_ns": 12.0}]))
    t = Trace.from_launches(launches, meta, vocab=vocab)
    sub = P.select_launches(t, [0, 2])
    assert sorted(set(sub.events["launch"].to_pylist())) == [0, 1]
    life = sub.meta["cta_lifetimes"]
    assert sorted(set(life["launch"])) == [0, 1] and len(life["cta"]) == 2 * 32
    assert [e["launch"] for e in sub.meta["instrument"]["plain_twin"]] == [0, 1]
    assert [e["traced_ns"] for e in sub.meta["instrument"]["plain_twin"]] == [11.0, 12.0]
    assert pc.sum(pc.equal(sub.events["launch"], 1)).as_py() == pc.sum(pc.equal(t.events["launch"], 2)).as_py()


def test_the_lines_name_the_pass_and_the_dense_reading(bundle):
    lines = P.figures_lines(P.sourced_figures(bundle))
    assert lines[0].startswith("  by pass") and "lifetimes 0, mma 24" in lines[0]
    mma = next(x for x in lines if "span.mma.wait.median_ns" in x)
    assert "302 ns" in mma and " mma " in mma and "dense 332 ns (+9.9%)" in mma
    bar = next(x for x in lines if "span.barrier.sync.median_ns" in x)
    assert "dense" in bar and "dense " not in bar.split("dense", 1)[1]  # from the dense pass: no second reading


def test_summary_shows_the_main_recording_and_where_each_figure_came_from(bundle, tmp_path):
    from fa4trace.cli import main

    path = bundle.save(tmp_path / "passes.parquet")
    r = CliRunner().invoke(main, ["summary", str(path)])
    assert r.exit_code == 0, r.output
    assert "by pass" in r.output and "span.mma.wait.median_ns" in r.output
    r = CliRunner().invoke(main, ["summary", str(path), "--json"])
    s = json.loads(r.output)
    assert [x["call"] for x in s["passes"]] == [0]
    assert s["passes"][0]["figures"]["cta.median_ns"]["pass"] == "lifetimes"
    # the main recording's summary: the dense launch's rows only, not the passes'
    assert s["rows"] == len(P.pass_traces(bundle)["dense"]) < len(bundle)


@pytest.fixture(scope="module")
def two_calls():
    """Two calls, each a dense launch and its lifetimes pass: call 0's kernel runs mma 300 ns,
    call 1's mma 600 ns (another input): nothing of one call may reach the other's figures."""
    parts = []
    for call, mma in ((0, 300), (1, 600)):
        parts.append(("dense", call, _launch(2 * call, mma_ns=mma + 30)))
        parts.append(("lifetimes", call, _launch(2 * call + 1, lambda n: False, mma_ns=mma)))
    meta = dict(parts[0][2][1], launches=[{"pass": p, "call": c} for p, c, _ in parts])
    return Trace.from_launches([d for _p, _c, (d, _m, _v) in parts], meta, vocab=parts[0][2][2])


def test_each_call_is_sourced_from_its_own_launches(two_calls):
    assert P.calls(two_calls) == [0, 1]
    a, b = (P.sourced_figures(two_calls, call=c) for c in (0, 1))
    assert (a["call"], a["calls"], b["call"]) == (0, 2, 1)
    assert [p["launches"] for p in a["passes"]] == [1, 1]  # one launch per pass: no pooling of calls
    assert a["figures"]["span.mma.wait.median_ns"]["value"] == pytest.approx(332.0)  # dense: 330 and 334
    assert b["figures"]["span.mma.wait.median_ns"]["value"] == pytest.approx(632.0)
    assert b["figures"]["cta.median_ns"]["value"] > a["figures"]["cta.median_ns"]["value"] + 6 * 250
    assert P.sourced_figures(two_calls)["call"] == 0
    from fa4trace.format.errors import Fa4traceError

    with pytest.raises(Fa4traceError, match="no call 5"):
        P.sourced_figures(two_calls, call=5)


def test_summary_shows_each_call_or_the_one_of_the_launch_asked_for(two_calls, tmp_path):
    from fa4trace.cli import main

    path = two_calls.save(tmp_path / "calls.parquet")
    r = CliRunner().invoke(main, ["summary", str(path)])
    assert r.exit_code == 0, r.output
    assert "call 0 of 2" in r.output and "call 1 of 2" in r.output
    r = CliRunner().invoke(main, ["summary", str(path), "--launch", "1", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert [x["call"] for x in s["passes"]] == [1]


@pytest.fixture(scope="module")
def repeated():
    """One call whose lifetimes pass replayed it three times: mma waits of 290, 300 and 310 ns."""
    parts = [("dense", _launch(0, mma_ns=330, load_ns=420))]
    parts += [("lifetimes", _launch(i, lambda n: n.startswith("mma."), mma_ns=ns)) for i, ns in ((1, 290), (2, 300),
                                                                                                (3, 310))]
    meta = dict(parts[0][1][1], launches=[{"pass": p, "call": 0} for p, _ in parts])
    return Trace.from_launches([d for _, (d, _m, _v) in parts], meta, vocab=parts[0][1][2])


def test_a_pass_replayed_several_times_is_read_over_all_its_launches(repeated):
    s = P.sourced_figures(repeated)
    assert [(p["pass"], p["launches"]) for p in s["passes"]] == [("lifetimes", 3), ("dense", 1)]
    f = s["figures"]["span.mma.wait.median_ns"]
    alone = [P.sourced_figures(P.select_launches(repeated, [0, i]))["figures"]["span.mma.wait.median_ns"]["value"]
             for i in (1, 2, 3)]
    assert alone[0] < alone[1] < alone[2]
    assert f["pass"] == "lifetimes" and f["value"] == pytest.approx(alone[1])  # the median over the three launches
    cta = s["figures"]["cta.median_ns"]["value"]  # every CTA of each launch, launches kept apart
    assert cta == pytest.approx(trace_metrics(P.select_launches(repeated, [2]))["cta.median_ns"], rel=0.05)
    assert "lifetimes " in P.figures_lines(s)[0] and "(3 launches)" in P.figures_lines(s)[0]
