"""Bundles of several launches: every figure is one launch's (fa4trace.analysis.launches).

Synthetic two-launch bundles whose launches run other shapes 19 s apart (as instrument() keeps
every launch of a kernel in a training step): ``summary`` lists the launches and shows each
one's own figures, which equal those of a bundle holding that launch alone; ``compare`` pairs
launches; the CLI's ``--launch`` picks one; and the bundled traces/step GEMMs read their
launches' own kernel times (12.64 and 28.42 µs), not the 19.3 s between them.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fa4trace.analysis import kernel as K
from fa4trace.analysis import overlap as A
from fa4trace.analysis.fidelity import perturbation
from fa4trace.analysis.launches import launch_ids, launch_of, launch_pairs, launch_table
from fa4trace.analysis.text import format_kernel_summary
from fa4trace.format.errors import Fa4traceError
from fa4trace.trace.bundle import Trace, load
from fa4trace.trace.decode import decode_buffer
from fa4trace.testing.bundles import T0_NS, attention_like, pipelined_like, sampled_like

GAP_NS = 19_347_167_232  # two launches this far apart (a bundled training step's GEMM once read as one kernel)
STEP = Path(__file__).resolve().parents[1] / "traces" / "step"
SHAPES = (dict(n_ctas=4, k_tiles=8, stages=4, load_ns=400), dict(n_ctas=6, k_tiles=32, stages=4, load_ns=900))
# the figures of a summary that must not depend on where on the bundle's time axis a launch lies
SAME = ("rows", "ctas", "warps", "events", "kernel_time_ns", "total_span_ns", "role_fractions", "waiting_by_event",
        "pipelines", "cta_span_ns", "wait_chain_ns", "wait_chain_steps", "mma_in_flight")


def gemm_launches(shapes=SHAPES, gap=GAP_NS) -> Trace:
    """One bundle of len(shapes) launches of one GEMM-like kernel, ``gap`` ns apart."""
    parts = [pipelined_like(**s, t0_ns=T0_NS + i * gap) for i, s in enumerate(shapes)]
    meta, vocab = parts[0][1], parts[0][2]
    return Trace.from_launches([decode_buffer(b, vocab=vocab, launch_index=i) for i, (b, _m, _v) in enumerate(parts)],
                               meta, vocab=vocab)


def gemm_alone(i: int) -> Trace:
    buf, meta, vocab = pipelined_like(**SHAPES[i])
    return Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab)


def attention_launches() -> Trace:
    """Two launches of our decode kernel's synthetic timeline, the second GAP_NS later."""
    decoded = []
    for i, n_blocks in enumerate((8, 24)):
        buf, meta = attention_like("pingpong", n_ctas=3, n_blocks=n_blocks, seed=i)
        d = decode_buffer(buf, launch_index=i)
        decoded.append(dataclasses.replace(d, t0_globaltimer_ns=d.t0_globaltimer_ns + i * GAP_NS))
    return Trace.from_launches(decoded, meta)


def attention_alone(i: int) -> Trace:
    buf, meta = attention_like("pingpong", n_ctas=3, n_blocks=(8, 24)[i], seed=i)
    return Trace.from_launches([decode_buffer(buf)], meta)


def test_launch_of_cuts_a_bundle_to_one_launch():
    t = gemm_launches()
    assert launch_ids(t) == [0, 1]
    one = launch_of(t, 1)
    assert set(one.events["launch"].to_pylist()) == {1} and one.events.num_rows < t.events.num_rows
    assert [m["launch"] for m in one.meta["launches"]] == [1]
    assert {k: one.meta["launch_of"][k] for k in ("launch", "of")} == {"launch": 1, "of": 2}
    assert [r["launch"] for r in one.meta["launch_of"]["others"]] == [0]
    with pytest.raises(Fa4traceError, match=r"no launch 5 in this bundle \(its launches: 0, 1\)"):
        launch_of(t, 5)


def test_launch_of_takes_each_launchs_share_of_the_metadata():
    parts = [sampled_like(n_ctas=32, sms=8, cta_stride=4, n_recorded=8, seed=i, t0_ns=T0_NS + i * GAP_NS)
             for i in range(2)]
    meta, vocab = parts[0][1], parts[0][2]
    meta["timing"] = {"kernel_us": 1.0, "traced_us": 2.0}  # one timing for a bundle of two: no launch's own
    meta["instrument"]["plain_twin"] = [{"launch": 0, "plain_ns": 100, "traced_ns": 110, "method": "graph"},
                                        {"launch": 1, "plain_ns": 200, "traced_ns": 260, "method": "graph"}]
    t = Trace.from_launches([decode_buffer(b, vocab=vocab, launch_index=i) for i, (b, _m, _v) in enumerate(parts)],
                            meta, vocab=vocab)
    one = launch_of(t, 1)
    assert set(one.meta["cta_lifetimes"]["launch"]) == {1} and len(one.meta["cta_lifetimes"]["cta"]) == 32
    assert "timing" not in one.meta
    assert one.meta["instrument"]["plain_twin"]["traced_ns"] == 260
    # a bundle of one launch keeps its timing block: it is that launch's
    single = Trace.from_launches([decode_buffer(parts[0][0], vocab=vocab)], dict(meta, timing={"kernel_us": 1.0,
                                                                                             "traced_us": 2.0}))
    assert launch_of(single, 0).meta["timing"] == {"kernel_us": 1.0, "traced_us": 2.0}


def test_a_kernel_summary_of_two_launches_shows_each_launchs_own_figures():
    t = gemm_launches()
    s = K.summarize_kernel(t)
    assert s["launch"] is None and s["launch_count"] == s["launches"] == 2
    assert "kernel_time_ns" not in s and "role_fractions" not in s  # nothing at the top mixes launches
    for i, one in enumerate(s["per_launch"]):
        alone = K.summarize_kernel(gemm_alone(i))
        assert one["launch"] == i and one["launch_count"] == 2
        for key in SAME:
            assert one[key] == alone[key], (i, key)
        assert one["kernel_time_ns"] < 1e6  # µs, not the 19 s between the launches
    spans = [r["span_ns"] for r in s["launch_table"]]
    assert spans == [one["kernel_time_ns"] for one in s["per_launch"]] and spans[0] != spans[1]
    # launches of different work (grids, counts per CTA) get no figure pooled over them
    assert s["across_launches"]["kernel_time_ns"] is None
    assert s["launches_differ"] == "CTAs 4, 6; ab counts per CTA 8, 32"
    same = K.summarize_kernel(gemm_launches((SHAPES[0], SHAPES[0])))
    kt = same["across_launches"]["kernel_time_ns"]
    spans = [one["kernel_time_ns"] for one in same["per_launch"]]
    assert same["launches_differ"] is None and kt["of"] == "kernel_time_ns"
    assert kt["n"] == 2 and kt["min"] == min(spans) and kt["max"] == max(spans)
    # one launch on request, the others listed with their spans
    one = K.summarize_kernel(t, launch=1)
    assert {k: one[k] for k in SAME} == {k: s["per_launch"][1][k] for k in SAME}
    assert [r["launch"] for r in one["other_launches"]] == [0]


def test_an_attention_summary_of_two_launches_shows_each_launchs_own_figures():
    t = attention_launches()
    s = A.summarize(t)
    assert s["launch"] is None and len(s["per_launch"]) == 2 and "kernel_span_ns" not in s
    for i, one in enumerate(s["per_launch"]):
        alone = A.summarize(attention_alone(i))
        for key in ("kernel_time_ns", "kernel_span_ns", "qk_softmax_overlap", "pv_softmax_overlap", "period_ns",
                    "hidden_softmax_ns", "tensor_core_busy", "kv_blocks_per_cta", "mainloop_end_ns", "median_ns"):
            assert one[key] == alone[key], (i, key)
        assert one["kernel_time_ns"] < 1e6
    assert A.summarize(t, launch=0)["kv_blocks_per_cta"]["max"] == 8


def test_the_text_lists_the_launches_then_each_ones_figures():
    s = K.summarize_kernel(gemm_launches())
    text = format_kernel_summary(s)
    assert "  launches       2 in this bundle; each launch's own figures below" in text
    assert "launch 0 of 2" in text and "launch 1 of 2" in text and "+19.347167 s" in text
    assert ("  kernel time    the launches did different work (CTAs 4, 6; ab counts per CTA 8, 32): no figure "
            "across them, each launch's is its own") in text and "median of 2 launches" not in text
    same = format_kernel_summary(K.summarize_kernel(gemm_launches((SHAPES[0], SHAPES[0]))))
    assert "  kernel time    median of 2 launches " in same and "did different work" not in same
    one = format_kernel_summary(K.summarize_kernel(gemm_launches(), launch=1))
    assert "(6 CTAs, " in one and "launch 1 of 2)" in one and "  other launches 0 (" in one


def test_compare_pairs_launches_and_refuses_to_guess():
    a, b = gemm_launches(), gemm_launches()
    c = K.compare_kernels(a, b)
    assert c["launch_pairs"] == [[0, 0], [1, 1]] and len(c["pairs"]) == 2
    assert c["pairs"][1]["a"]["kernel_time_ns"] == K.summarize_kernel(a, launch=1)["kernel_time_ns"]
    c = K.compare_kernels(a, b, launch_a=0, launch_b=1)
    assert (c["launch_a"], c["launch_b"]) == (0, 1) and c["diff"]["kernel_time_ns"]["b"] > c["diff"]["kernel_time_ns"]["a"]
    three = gemm_launches(SHAPES + SHAPES[:1])
    with pytest.raises(Fa4traceError, match="A holds 2 launch.*B 3: choose one of each"):
        K.compare_kernels(a, three)
    assert launch_pairs(a, three, 1, 2) == [(1, 2)]
    assert launch_pairs(gemm_alone(0), three, None, 2) == [(0, 2)]  # a bundle of one launch: its only one
    with pytest.raises(Fa4traceError, match="B has no launch 7"):
        launch_pairs(a, three, 0, 7)
    att = A.compare(attention_launches(), attention_launches())
    assert len(att["pairs"]) == 2 and att["pairs"][0]["launch_a"] == 0


def test_perturbation_of_a_bundle_of_launches_is_per_launch():
    p = perturbation(gemm_launches())
    assert p["launch"] is None and [q["launch"] for q in p["per_launch"]] == [0, 1]


# ---- the bundled step traces (H200) ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["step_GemmSm90", "step_GemmSm90_2", "step_GemmSm90_3"])
def test_the_step_gemms_read_each_launchs_own_time(name):
    t = load(STEP / f"{name}.parquet")
    s = K.summarize_kernel(t)
    assert s["launch_count"] == 2
    for one, m in zip(s["per_launch"], t.meta["launches"]):
        # the launch's own untraced time, its plain twin's; the recorded warps' span beside it, as
        # the launch's decoder measured it
        twin = one["perturbation"]["plain_twin"]
        assert one["kernel_time_kind"] == "plain_twin" and one["kernel_time_ns"] == twin["plain_ns"] < 1e6
        assert one["total_span_ns"] == m["span_ns"] and one["ctas"] == m["ctas_recorded"]
    assert [r["span_ns"] for r in launch_table(t)] == [m["span_ns"] for m in t.meta["launches"]]


def test_the_issues_example_bundle():
    """The bundled GEMM with two launches 10.8 s apart (the issue showed its predecessor as one
    19.3 s "kernel"): each launch has its own kernel time and its own plain twin, timed by CUDA-
    graph replays of that launch, not one host-timed figure over both."""
    t = load(STEP / "step_GemmSm90_2.parquet")
    s = K.summarize_kernel(t)
    assert [round(one["total_span_ns"] / 1e3, 2) for one in s["per_launch"]] == [13.44, 27.71]
    assert [round(one["kernel_time_ns"] / 1e3, 2) for one in s["per_launch"]] == [11.91, 27.58]  # untraced
    twins = [one["perturbation"]["plain_twin"] for one in s["per_launch"]]
    assert all(tw["method"] == "graph" and tw["over_launches"] is None for tw in twins), twins
    assert twins[0]["traced_ns"] != twins[1]["traced_ns"]


# ---- the command line -------------------------------------------------------------------------------
def run(*args):
    r = subprocess.run([sys.executable, "-m", "fa4trace", *args], capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout, r.stderr


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("launches")
    return {"two": str(gemm_launches().save(d / "two.parquet")),
            "three": str(gemm_launches(SHAPES + SHAPES[:1]).save(d / "three.parquet")),
            "att": str(attention_launches().save(d / "att.parquet"))}


def test_cli_summary_by_launch(paths):
    code, out, err = run("summary", paths["two"], "--launch", "1", "--json")
    assert code == 0, err
    assert json.loads(out) == json.loads(json.dumps(K.summarize_kernel(load(paths["two"]), launch=1)))
    code, out, _ = run("summary", paths["two"])
    assert code == 0 and "launch 0 of 2" in out and "launch 1 of 2" in out
    code, out, _ = run("summary", paths["att"])
    assert code == 0 and "launch 1 of 2" in out and "QK ∥ SOFTMAX" in out
    code, out, err = run("summary", paths["two"], "--launch", "5")
    assert code != 0 and out == "" and len(err.strip().splitlines()) == 1 and "no launch 5" in err


def test_cli_compare_by_launch(paths):
    code, out, err = run("compare", paths["two"], paths["two"])
    assert code == 0, err
    assert "A launch 0 of 2 vs B launch 0 of 2" in out and "A launch 1 of 2 vs B launch 1 of 2" in out
    code, out, err = run("compare", paths["two"], paths["three"])
    assert code != 0 and len(err.strip().splitlines()) == 1 and "--launch-a N --launch-b M" in err
    code, out, err = run("compare", paths["two"], paths["three"], "--launch-a", "1", "--launch-b", "2", "--json")
    assert code == 0, err
    c = json.loads(out)
    assert (c["launch_a"], c["launch_b"]) == (1, 2)
    code, out, err = run("compare", paths["att"], paths["att"], "--launch", "1")
    assert code == 0 and "A launch 1 of 2 vs B launch 1 of 2" in out, err
