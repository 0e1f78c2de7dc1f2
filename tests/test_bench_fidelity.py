"""benchmarks/bench_fidelity.py on the CPU: every analysis step on synthetic bundles with known
answers (figures shown from passes, compensated and raw against the lightest reference; noise;
the medians over rounds and the shares; the perturbation headline against the cost of the same
recording), the result files and their rendering, the argument parsing, the build workers and,
where the CuTe DSL is installed, one build compiled the way the run's workers compile it.

The synthetic kernel (fa4trace.testing.bundles.pipelined_like: 4 consumer warps, a producer, an
epilogue warp) is recorded as ``instrument(passes=...)`` would record it: "dense" (every family,
its MMA waits and loads stretched by the recording: mma 330 ns, load 420 ns) and the same launch
unperturbed (mma 300 ns, load 400 ns) seen through the lighter builds, which are also the
references, each launched twice (the mma build's second launch reads 3% slower: noise).
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fa4trace.analysis import compensate as C
from fa4trace.analysis.figures import trace_metrics
from fa4trace.trace.bundle import Trace
from fa4trace.trace.decode import DecodedLaunch, decode_buffer
from fa4trace.testing.bundles import pipelined_like, sampled_like, split_kv_like

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
SCRIPT = BENCH / "bench_fidelity.py"
SHAPE = dict(n_ctas=4, k_tiles=6, stages=2, consumer_warps=4, idle_warps=0, store_ns=100)
LIGHT = dict(mma_ns=300, load_ns=400)
LEAD = (0, 4)  # lead_warps(6 warps): the first consumer and the producer
CAL = C.Calibration("segment_smem", offset_cycles=5.0, held_offset_cycles=3.0, event_cycles=10.0, clock_ghz=1.0)


def _load(path: Path, name: str | None = None):
    spec = importlib.util.spec_from_file_location(name or f"benchmarks_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bf = _load(SCRIPT)


def _launch(i: int, keep=None, **kw):
    buf, meta, vocab = pipelined_like(**SHAPE, **kw)
    d = decode_buffer(buf, launch_index=i, vocab=vocab)
    if keep is not None:
        t = d.table
        names = np.asarray(t["name"].cast("string").to_pylist())
        kinds = np.asarray(t["kind"].cast("string").to_pylist())
        m = (kinds == "warp") | np.array([keep(n) for n in names], bool)
        d = DecodedLaunch(t.filter(m), d.t0_globaltimer_ns, dict(d.summary), d.cta_lifetimes)
    return d, meta, vocab


def _one(keep=None, **kw) -> Trace:
    d, meta, vocab = _launch(0, keep, **kw)
    return Trace.from_launches([d], meta, vocab=vocab)


KEEP = {"lifetimes": lambda n: False, "pipeline": lambda n: n.startswith("ab."),
        "mma": lambda n: n.startswith("mma."), "barrier": lambda n: n.startswith("barrier.")}


@pytest.fixture(scope="module")
def bundle():
    parts = [("dense", _launch(0, mma_ns=330, load_ns=420))]
    parts += [(p, _launch(i + 1, KEEP[p], **LIGHT)) for i, p in enumerate(KEEP)]
    meta = dict(parts[0][1][1], launches=[{"pass": p, "call": 0} for p, _ in parts])
    return Trace.from_launches([d for _, (d, _m, _v) in parts], meta, vocab=parts[0][1][2])


@pytest.fixture(scope="module")
def refs():
    out = {p: [_one(keep, **LIGHT), _one(keep, **LIGHT)] for p, keep in KEEP.items()}
    out["mma"][1] = _one(KEEP["mma"], mma_ns=309, load_ns=400)  # its second launch: 3% slower MMAs
    full = _one(**LIGHT)
    out[bf.LEAD] = [bf.only_warps(full, LEAD), bf.only_warps(full, LEAD)]
    return out


def test_each_figure_is_shown_three_ways_against_the_lightest_reference(bundle, refs):
    rows, info = bf.round_rows("k", bundle, refs, LEAD, CAL)
    by = {r["metric"]: r for r in rows}
    # lightest first: fewest events per recorded CTA; the lead-warps trace last
    assert list(info["references"]) == ["lifetimes", "barrier", "mma", "pipeline", bf.LEAD]
    assert info["passes"][0] == "lifetimes" and info["passes"][-1] == "dense"
    cta = by["cta.median_ns"]
    assert cta["reference"] == "lifetimes" and cta["passes_from"] == "lifetimes"
    assert cta["passes_err_pct"] == 0.0 and cta["raw_err_pct"] > 5  # the dense CTAs ran longer
    assert cta["compensated"] is False and cta["compensated_value"] == cta["raw_value"]  # not compensated
    mma = by["span.mma.wait.median_ns"]
    assert mma["reference"] == "mma" and mma["reference_value"] == 306.0  # consumers 300, 304, 308, 312 ns
    assert mma["passes_err_pct"] == 0.0
    assert mma["raw_err_pct"] == pytest.approx(100 * (336 / 306 - 1))
    assert mma["noise_pct"] == pytest.approx(100 * (315 / 306 - 1))  # the second mma launch
    lag = by["lag.ab.median_ns"]
    assert lag["reference"] == "pipeline" and lag["passes_err_pct"] == 0.0 and lag["raw_err_pct"] > 0
    assert by["span.barrier.sync.median_ns"]["reference"] == "barrier"
    # reported by the dense trace alone, on a warp the lead-warps trace does not record: nothing to compare
    store = by["span.tma.store_wait.median_ns"]
    assert store["reference"] is None and store["raw_err_pct"] is None and store["passes_from"] == "dense"
    # compensated: exactly what `fa4trace summary --compensate` shows for spans and lags, the rest raw
    from fa4trace.analysis.passes import pass_traces

    dense = pass_traces(bundle)["dense"]
    s = C.summary(dense, CAL)
    assert by["span.mma.wait.median_ns"]["compensated_value"] == s["spans"]["mma.wait"]["median_ns"]
    assert by["lag.ab.p90_ns"]["compensated_value"] == s["lags"]["ab"]["p90_ns"]
    assert by["lag.ab.median_ns"]["compensated_value"] < by["lag.ab.median_ns"]["raw_value"]
    assert {r["metric"] for r in rows if r["compensated"]} == {k for k in by if k.startswith(("span.", "lag."))}
    assert info["compensated"] > 0
    # beside mode b: the compensated figure against its reference compensated alike (spans, lags)
    ref_s = C.summary(refs["mma"][0], CAL)["spans"]["mma.wait"]["median_ns"]
    assert mma["compensated_vs_ref_err_pct"] == pytest.approx(100 * abs(mma["compensated_value"] / ref_s - 1))
    assert cta["compensated_vs_ref_err_pct"] is None  # not a compensated figure


def test_a_reference_read_as_the_mean_of_its_two_recordings(bundle, refs):
    """--reference mean: a figure's reference is the mean of the reference's two recordings, its
    noise still the second against the first; every row says how it was read, and so does the
    shown table."""
    first = {r["metric"]: r for r in bf.round_rows("k", bundle, refs, LEAD, CAL)[0]}
    rows, _ = bf.round_rows("k", bundle, refs, LEAD, CAL, reference="mean", launches=3)
    by = {r["metric"]: r for r in rows}
    mma = by["span.mma.wait.median_ns"]
    assert mma["reference_value"] == pytest.approx((306.0 + 315.0) / 2)  # the second mma launch: 315 ns
    assert mma["noise_pct"] == pytest.approx(100 * (315 / 306 - 1)) == first["span.mma.wait.median_ns"]["noise_pct"]
    assert mma["passes_err_pct"] == pytest.approx(100 * abs(306 / 310.5 - 1))
    assert by["cta.median_ns"]["reference_value"] == first["cta.median_ns"]["reference_value"]  # both launches alike
    assert all(r["launches"] == 3 and r["reference_of"] == "mean" for r in rows)
    assert all(r["launches"] == 1 and r["reference_of"] == "first" for r in first.values())
    shown = bf.shown_summary(bf.aggregate_metrics([rows]), {"k": [rows]})
    assert shown[0]["reading"] == "3 launches per recording; reference: the mean of its two recordings"
    # rows of files written before these keys read as one launch against the first recording
    old = [{k: v for k, v in r.items() if k not in ("launches", "reference_of")} for r in first.values()]
    assert bf.shown_summary(bf.aggregate_metrics([old]), {"k": [old]})[0]["reading"] == \
        "1 launch per recording; reference: its first recording"
    with pytest.raises(ValueError, match="reference must be one of first, mean"):
        bf.round_rows("k", bundle, refs, LEAD, CAL, reference="median")


def test_a_figure_only_the_lead_warps_trace_reports_is_compared_on_those_warps(bundle, refs):
    roles = bf.dense_roles(bundle)
    no_barrier = {k: v for k, v in refs.items() if k != "barrier"}
    rows, _info = bf.round_rows("k", bundle, no_barrier, LEAD, None)
    row = {r["metric"]: r for r in rows}["span.barrier.sync.median_ns"]
    assert row["reference"] == bf.LEAD and row["passes_from"] == "barrier"
    from fa4trace.analysis.passes import pass_traces

    by = pass_traces(bundle)
    key = "span.barrier.sync.median_ns"
    assert row["passes_value"] == bf.metrics_of(bf.only_warps(by["barrier"], LEAD), roles)[key]
    assert row["raw_value"] == bf.metrics_of(bf.only_warps(by["dense"], LEAD), roles)[key]
    assert row["raw_value"] != trace_metrics(by["dense"], roles)[key]  # the dense trace's other warps differ
    assert row["compensated_value"] is None and row["compensated_err_pct"] is None  # no calibration: not measured


def test_compensation_replaces_spans_and_lags_only(bundle):
    from fa4trace.analysis.passes import pass_traces

    dense = pass_traces(bundle)["dense"]
    raw = trace_metrics(dense, bf.dense_roles(dense))
    zero = C.Calibration("segment_smem", 0.0, 0.0, 0.0, 0.0, clock_ghz=1.0)
    same, done = bf.compensated_metrics(dense, zero, raw)
    assert same == raw and done  # nothing to take off: every compensated figure is the raw one
    comp, done = bf.compensated_metrics(dense, CAL, raw)
    assert set(comp) == set(raw) and all(comp[k] == raw[k] for k in raw if k not in done)
    assert any(comp[k] < raw[k] for k in done) and not any(k.startswith(("waiting.", "cta.")) for k in done)


def _row(metric, noise, passes, comp, raw, ref="pipeline", kernel="k"):
    def v(e):
        return None if e is None else 100 + e

    return {"kernel": kernel, "metric": metric, "reference": ref, "reference_value": 100.0 if ref else None,
            "noise_pct": noise, "passes_from": "pipeline", "compensated": True, "passes_value": v(passes),
            "passes_err_pct": passes, "compensated_value": v(comp), "compensated_err_pct": comp, "raw_value": v(raw),
            "raw_err_pct": raw}


def test_rounds_are_aggregated_by_median_and_noisy_figures_are_not_judged():
    rounds = [[_row("a", 0.5, 1.0, 1.5, 9.0), _row("b", 5.0, 0.0, 0.0, 0.0), _row("c", 1.0, 3.0, 1.0, 30.0),
               _row("d", None, None, None, None, ref=None)],
              [_row("a", 0.7, 3.0, 1.0, 8.0), _row("b", 1.0, 0.0, 0.0, 0.0), _row("c", 0.5, 2.5, 1.9, 31.0)],
              [_row("a", 0.6, 1.5, 1.2, 10.0), _row("b", 4.0, 0.0, 0.0, 0.0), _row("c", 0.8, 2.6, 1.8, 29.0)]]
    rows = {r["metric"]: r for r in bf.aggregate_metrics(rounds)}
    a = rows["a"]
    assert a["passes_err_pct"] == 1.5 and a["raw_err_pct"] == 9.0 and a["noise_pct"] == 0.6 and a["rounds"] == 3
    assert a["judged"] and a["passes_within"] and not a["raw_within"]
    assert rows["b"]["noise_limited"] and not rows["b"]["judged"]  # median noise 4%
    assert rows["c"]["judged"] and not rows["c"]["passes_within"] and rows["c"]["compensated_within"]
    assert rows["d"]["reference"] is None and not rows["d"]["judged"] and not rows["d"]["noise_limited"]
    (s,) = bf.shown_summary(list(rows.values()), {"k": rounds})
    assert (s["figures"], s["compared"], s["noise_limited"], s["judged"], s["rounds"]) == (4, 3, 1, 2, 3)
    assert (s["passes_within"], s["compensated_within"], s["raw_within"]) == (1, 2, 0)
    assert s["compensated_share_pct"] == 100.0 and s["passes_share_pct"] == 50.0 and s["status"] == "met"
    assert s["passes_rounds_pct"] == [33.3, 50.0]  # round 2 judged b (noise 1% then) and missed a (3%)
    assert s["compensated_cell"] == "2 of 2 (100%; rounds 100..100%, median 100%)"
    # round 2 judges b (its noise was 1% then): per-round shares use each round's own noise
    assert bf._round_shares(rounds[1], "raw") == 100 / 3
    assert bf.status(85.0, 2) == "unconfirmed (2 rounds)" and bf.status(79.9, 5) == "missed"
    assert bf.status(None, 3) == "not measured"


def test_a_duration_too_short_for_its_tick_is_not_judged():
    """A bundle's times are whole ns: a 31 ns wait against 32 ns reads 3.2% whatever the tracing did,
    so a duration under 50 ns is resolution-limited and not judged (noise or no noise); 50 ns
    and longer, and figures that are not durations, are."""
    def short(metric, ref_v, err):
        r = _row(metric, 0.0, err, err, err)
        r["reference_value"] = ref_v
        return r

    rounds = [[short("span.v.wait.median_ns", 31.0, 3.2), short("span.k.wait.median_ns", 50.0, 0.0),
               short("waiting.mma.v.wait", 0.1, 0.0), short("lag.v.median_ns", 7800.0, 3.0)]]
    rows = {r["metric"]: r for r in bf.aggregate_metrics(rounds)}
    v = rows["span.v.wait.median_ns"]
    assert v["resolution_limited"] and not v["judged"] and not v["noise_limited"]
    assert rows["span.k.wait.median_ns"]["judged"] and not rows["span.k.wait.median_ns"]["resolution_limited"]
    assert rows["waiting.mma.v.wait"]["judged"]  # a fraction, not a duration: no tick of 1 ns
    assert rows["lag.v.median_ns"]["judged"] and not rows["lag.v.median_ns"]["passes_within"]
    (s,) = bf.shown_summary(list(rows.values()), {"k": rounds})
    assert (s["resolution_limited"], s["judged"], s["passes_within"]) == (1, 3, 2)
    assert bf._round_shares(rounds[0], "passes") == pytest.approx(200 / 3)  # the 31 ns wait left out
    assert bf.resolution_limited("span.x.median_ns", 0.0) and not bf.resolution_limited("cta.median_ns", None)


def _bundle(make, **kw):
    buf, meta, vocab = make(**kw)
    return Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab)


def test_an_in_launch_headline_is_set_against_every_cta_recording():
    t = _bundle(sampled_like, n_ctas=128, sms=8, cta_stride=8, n_recorded=16, slowdown=0.2)
    costs = {"plain": 0.3, "default": 4.0, "sample": 2.5, "every CTA": 19.0}
    r = bf.line_round("k", "sample", t, costs)
    assert r["source"] == "in_launch" and r["compared_with"] == "every CTA" and r["cost_pct"] == 19.0
    assert 18 < r["headline_pct"] < 22 and r["diff_pts"] == pytest.approx(r["headline_pct"] - 19.0)
    assert r["recorded"] == "16 of 128 CTAs" and r["plain_vs_plain_pct"] == 0.3


def test_a_plain_twin_headline_is_set_against_its_own_recording():
    t = _bundle(split_kv_like, groups=16, splits=4, sms=132, n_recorded=16, cta_stride=4)
    costs = {"plain": -0.1, "sample": 6.0, "every CTA": 20.0}
    none = bf.line_round("k", "sample", t, costs)
    assert none["valid"] is False and none["headline_pct"] is None and none["diff_pts"] is None
    t.meta["instrument"]["plain_twin"] = [{"launch": 0, "plain_ns": 10_000.0, "traced_ns": 10_700.0, "rel": 0.07,
                                          "noise_pct": 0.5, "method": "graph", "l2": "warm"}]
    r = bf.line_round("k", "sample", t, costs)
    assert r["source"] == "plain_twin" and r["compared_with"] == "sample" and r["cost_pct"] == 6.0
    assert r["headline_pct"] == pytest.approx(7.0) and r["diff_pts"] == pytest.approx(1.0)
    assert r["twin_method"] == "graph" and r["in_launch_pct"] is not None  # measured, not valid
    # with the benchmark's warm-L2 costs beside its cold ones, a warm twin is set against the warm cost
    warm = {"plain": 0.2, "sample": 6.5, "every CTA": 22.0}
    w = bf.line_round("k", "sample", t, costs, warm)
    assert w["compared_with"] == "sample, warm L2" and w["cost_pct"] == 6.5 and w["plain_vs_plain_pct"] == 0.2
    assert w["diff_pts"] == pytest.approx(0.5)
    # the in-launch figure against every CTA's cold cost, beside (how far a CTA's stretch is from a launch cost)
    assert w["stretch_vs_every_pts"] == pytest.approx(w["in_launch_pct"] - 20.0)


def test_lines_and_costs_over_rounds():
    base = {"kernel": "k", "recorded": "16 of 128 CTAs", "status": "ok", "in_launch_pct": 19.0,
            "in_launch_noise_pct": 1.0, "twin_pct": None, "twin_noise_pct": None, "valid": True,
            "dependencies": "none", "caveats": ["c"], "dropped": 0, "compared_with": "every CTA"}
    lines = [dict(base, config="sample", source="in_launch", headline_pct=h, cost_pct=c, diff_pts=h - c,
                  plain_vs_plain_pct=p) for h, c, p in ((19.0, 18.0, 0.2), (20.0, 18.5, -0.4), (21.0, 17.0, 0.1))]
    lines.append(dict(base, config="default", source="plain_twin", headline_pct=9.0, cost_pct=4.0, diff_pts=5.0,
                      plain_vs_plain_pct=0.0, compared_with="default"))
    rows = bf.aggregate_lines(lines)
    assert [r["config"] for r in rows] == ["default", "sample"]
    s = rows[1]
    assert s["headline_pct"] == 20.0 and s["cost_pct"] == 18.0 and s["diff_pts"] == 1.5 and s["within"]
    assert s["cost_spread_pts"] == 0.75 and s["plain_vs_plain_pct"] == 0.2 and s["rounds"] == 3
    assert rows[0]["within"] is False and rows[0]["compared_with"] == "default"
    assert s["headline_cell"] == "+20.0% (in-launch)" and s["recording_cell"] == "fidelity sample: 16 of 128 CTAs"
    assert s["cost_cell"] == "+18.0% (every CTA records; ±0.8; plain vs plain 0.2%)"
    assert rows[0]["cost_cell"] == "+4.0% (the same recording; plain vs plain 0.0%)"
    mixed = bf.aggregate_lines([dict(lines[0], source="in_launch"), dict(lines[1], source="plain_twin")])
    assert mixed[0]["source"].startswith("mixed: ")
    costs = [{"kernel": "quack GEMM", "shape": "8192x8192x8192", "build": "dense", "l2": "x", "plain_us": p,
              "costs": {"plain": pp, "default": 3.0, "sample": 1.0, "every CTA": a}}
             for p, pp, a in ((1400.0, 0.1, 5.0), (1410.0, -0.3, 6.0), (1390.0, 0.2, 4.0))]
    (c,) = bf.aggregate_costs(costs)
    assert (c["plain_us"], c["cost_all_pct"], c["cost_sample_pct"], c["cost_default_pct"]) == (1400.0, 5.0, 1.0, 3.0)
    assert c["cost_all_spread_pts"] == 1.0 and c["plain_vs_plain_pct"] == 0.1 and c["rounds"] == 3


def test_result_files_render_and_feed_the_cost_targets(tmp_path, bundle, refs):
    report = _load(BENCH / "report.py")
    targets = _load(BENCH / "cost_targets.py")
    rows, _ = bf.round_rows(bf.NAMES["fa4"], bundle, refs, LEAD, CAL)
    lines = [{"kernel": bf.NAMES["fa4"], "config": "default", "recorded": "256 of 2048 CTAs", "headline_pct": 24.0,
              "source": "in_launch", "status": "ok", "in_launch_pct": 24.0, "in_launch_noise_pct": 1.0, "valid": True,
              "unreliable": 0, "twin_pct": 5.0, "twin_noise_pct": 0.4, "twin_method": "graph", "dependencies": "none",
              "caveats": [], "dropped": 0, "compared_with": "every CTA", "cost_pct": 23.0, "plain_vs_plain_pct": 0.1,
              "diff_pts": 1.0}]
    costs = [{"kernel": k, "shape": "s", "build": b, "l2": "cold", "plain_us": 1700.0,
              "costs": {"plain": 0.1, "default": 5.0, "sample": 2.0, "every CTA": 23.0}}
             for k, b in ((bf.NAMES["fa4"], "dense"), (bf.NAMES["fa4-bwd"], "every family"))]
    base = tmp_path / "results" / "fidelity_test.json"
    paths = bf.write_results(str(base), metric_rounds={bf.NAMES["fa4"]: [rows]}, lines=lines, costs=costs,
                             gpu="none: test", command="python benchmarks/bench_fidelity.py run", complete=False)
    assert [p.name for p in paths.values()] == ["fidelity_test.json", "fidelity_test_shown.json",
                                                "fidelity_test_line.json", "fidelity_test_cost.json"]
    loaded = {r["area"]: r for r in report.load_results(base.parent)}
    assert set(loaded) == {"fidelity-error", "fidelity-shown", "perturbation-line", "fidelity"}
    assert loaded["fidelity-shown"]["complete"] is False and "Partial" in loaded["fidelity"]["notes"]
    assert loaded["fidelity-error"]["rounds_detail"][bf.NAMES["fa4"]][0][0]["metric"] == rows[0]["metric"]
    md = report.render(list(loaded.values()), base.parent)
    section = md.split("## Faithful timelines")[1]
    assert section.index("The perturbation line against") < section.index("Shown figures within 2%")
    assert "Tracing cost by recording" not in md  # the costs by configuration: on docs/tracing-cost.md
    assert "Tracing cost by recording" in report.render_page("tracing-cost.md", list(loaded.values()))
    assert "| FA4 SM90 prefill | 2 |" not in md and "| FA4 SM90 prefill | 1 |" in section  # one round
    assert "cta.median_ns" not in md  # figure by figure: its own page
    page = report.render_page("fidelity-error.md", list(loaded.values()))
    assert "| FA4 SM90 prefill | cta.median_ns | lifetimes |" in page
    # cost_targets reads one every-CTA measurement per kernel and build from the cost file
    doc = dict(loaded["fidelity"], _file="fidelity_test_cost.json")
    ms = [m for m in targets.fidelity_measurements(doc) if m["every"]]
    fa4 = [m for m in ms if m["kernel"] == targets.FA4]
    assert len(fa4) == 1 and fa4[0]["cost_pct"] == 23.0 and fa4[0]["spans"] and fa4[0]["families"] == targets.ALL
    assert all(not m["kernel"].startswith(targets.FA4) for m in ms if m is not fa4[0])  # the backward is not FA4's prefill
    # `shown P` writes P_shown again from P's rounds: the same rows, P's provenance
    before = json.loads(paths["fidelity-shown"].read_text())
    paths["fidelity-shown"].unlink()
    assert bf.rewrite_shown(str(base)) == paths["fidelity-shown"]
    again = json.loads(paths["fidelity-shown"].read_text())
    assert again["rows"] == before["rows"] and again["commit"] == loaded["fidelity-error"]["commit"]
    assert again["notes"] == before["notes"] and again["complete"] is False  # this run was partial
    # --merge keeps the rows of kernels not measured again
    bf.write_results(str(base), metric_rounds={}, lines=[], costs=[dict(costs[0], kernel=bf.NAMES["gemm"])],
                     gpu="none: test", command="python benchmarks/bench_fidelity.py run --kernels gemm", merge=True)
    cost = json.loads(paths["fidelity"].read_text())
    assert [r["kernel"] for r in cost["rows"]] == [bf.NAMES["fa4"], bf.NAMES["gemm"], bf.NAMES["fa4-bwd"]]
    assert cost["command"].count("bench_fidelity.py run") == 2
    assert [r.get("commit") for r in cost["rows"]] == [loaded["fidelity"]["commit"], None, loaded["fidelity"]["commit"]]
    # ... and their rounds: the figures file of a merge holds both kernels', and `shown` rereads both
    gemm_rows = [dict(r, kernel=bf.NAMES["gemm"]) for r in rows]
    bf.write_results(str(base), metric_rounds={bf.NAMES["gemm"]: [gemm_rows, gemm_rows]}, lines=[], costs=[],
                     gpu="none: test", command="python benchmarks/bench_fidelity.py run --kernels gemm", merge=True)
    err = json.loads(paths["fidelity-error"].read_text())
    assert {k: len(v) for k, v in err["rounds_detail"].items()} == {bf.NAMES["fa4"]: 1, bf.NAMES["gemm"]: 2}
    bf.rewrite_shown(str(base))
    shown = {r["kernel"]: r["rounds"] for r in json.loads(paths["fidelity-shown"].read_text())["rows"]}
    assert shown == {bf.NAMES["fa4"]: 1, bf.NAMES["gemm"]: 2}
    # a merged file's word on where each kernel's rows came from is kept in the shown notes
    err["rows_from"] = "GEMM's rows: commit abc1234, 2 rounds."
    paths["fidelity-error"].write_text(json.dumps(err))
    bf.rewrite_shown(str(base))
    assert json.loads(paths["fidelity-shown"].read_text())["notes"].endswith(" GEMM's rows: commit abc1234, 2 rounds.")


def test_arguments(capsys, tmp_path):
    for argv in (["run", "--kernels", "fa4,nope"], ["run", "--rounds", "0"], ["compile", "--kernels", "rmsnorm"],
                 ["compile", "--builds", "tma"], ["build", "gemm:spans", "--out", str(tmp_path)],
                 ["build", "rmsnorm:dense", "--out", str(tmp_path)], ["shown", str(tmp_path / "none.json")],
                 ["shown", __file__]):
        with pytest.raises(SystemExit) as e:
            bf.main(argv)
        assert e.value.code == 2, argv
        assert "error:" in capsys.readouterr().err
    bf.main(["run", "--dry-run", "--quick", "--kernels", "gemm,rmsnorm", "--json", str(tmp_path / "f.json")])
    plan = json.loads(capsys.readouterr().out)
    assert (plan["rounds"], plan["cost_rounds"], plan["replays"]) == (1, 3, 5)
    assert plan["kernels"] == ["gemm", "rmsnorm"]
    assert plan["jobs"] == ["gemm:dense", "calibration", "gemm:lifetimes", "gemm:pipeline", "gemm:mma", "gemm:barrier"]
    assert plan["files"]["perturbation-line"].endswith("f_line.json")
    bf.main(["run", "--dry-run", "--kernels", "rmsnorm", "--rounds", "4", "--jit"])
    plan = json.loads(capsys.readouterr().out)
    assert plan["rounds"] == 4 and plan["jobs"] == [] and plan["files"] == {}
    r = subprocess.run([sys.executable, str(SCRIPT), "run", "--kernels", "x"], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_builds_and_their_passes():
    assert bf.builds_of("fa4") == ("dense", "lifetimes", "pipeline", "mma", "barrier", "spans")
    assert bf.builds_of("gemm") == ("dense", "lifetimes", "pipeline", "mma", "barrier")
    with pytest.raises(ValueError):
        bf.builds_of("rmsnorm")
    assert bf.recipe("dense") == (("pipeline", "tma", "mma", "barrier"), True)
    assert bf.recipe("spans") == ((), True) and bf.recipe("mma") == (("mma",), False)
    # the recompile arguments fa4trace.auto.run gives each pass (pass_plan) name the build it replays with
    from fa4trace.auto.run import pass_plan

    meta = {"families": ["pipeline", "tma", "mma", "barrier"], "missing": [], "spans": ["softmax"],
            "spans_missing": []}
    plan, skipped = pass_plan(meta, bf.PASS_BUILDS)
    assert [bf.pass_build_name(f, s) for _n, f, s in plan] == list(bf.PASS_BUILDS) and not skipped
    builds = {b: bf.Build(fn=b, vocab=None, meta={}) for b in ("lifetimes", "mma")}
    rc = bf.prebuilt(builds)
    assert rc("smem", families=("mma",), spans={}).fn == "mma" and rc("smem", families=(), spans={}).fn == "lifetimes"
    from fa4trace.format.errors import Fa4traceError

    with pytest.raises(Fa4traceError, match="pipeline pass build"):
        rc("smem", families=("pipeline",), spans={})
    with pytest.raises(Fa4traceError, match="gmem"):
        rc("gmem")  # a cursor fallback: no build prepared
    assert bf.job_name("fa4:dense") == "fa4_dense" and bf.lead_warps(12) == (0, 4, 8)
    # the line's recordings: every CTA only where instrument()'s default leaves CTAs out; always timed
    small, big = (bf.Case("k", "k", "s", g, 1, 1, None, {}) for g in (132, 2048))
    assert list(bf.line_options(small)) == ["default"] and list(bf.line_options(big)) == ["default", "every CTA"]
    every = bf.line_options(small, timed=True)["every CTA"]
    assert (every.sampling.ctas, every.sampling.capacity, every.check) == (132, small.capacity, True)


def test_call_spy_keeps_each_instances_last_arguments_and_puts_the_call_back():
    class K:
        def __init__(self, name):
            self.meta = {"kernel": name}

        def __call__(self, *a, **kw):
            return ("ran", a, kw)

    a, b = K("flash_attn.FlashAttentionBackwardSm90"), K("flash_attn.FlashAttentionBackwardPreprocess")
    orig = K.__call__
    with bf.CallSpy(K) as spy:
        assert a(1, x=2) == ("ran", (1,), {"x": 2})
        a(3)
        b(4)
        inst, args, kw = spy.find(bf.API["fa4-bwd"].is_main)
        assert inst is a and args == (3,) and kw == {}
        with pytest.raises(RuntimeError, match="expected one main kernel"):
            spy.find(lambda n: "backward" in n.lower())
    assert K.__call__ is orig


def test_build_workers_run_jobs_and_report_failures(tmp_path):
    def command(job, out):
        if job == "bad":
            return [sys.executable, "-c", "import sys; print('compile error: no'); sys.exit(3)"]
        code = f"import pathlib; p = pathlib.Path({str(out)!r}); p.mkdir(parents=True); (p / 'manifest.json').write_text('{{}}')"
        return [sys.executable, "-c", code]

    said = []
    pool = bf.BuildPool(["a", "bad", "c"], tmp_path, 2, log=said.append, command=command)
    try:
        assert pool.result("c", timeout=60) == tmp_path / "c"
        assert pool.result("bad", timeout=60) is None
        assert pool.result("a", timeout=60) == tmp_path / "a"
    finally:
        pool.close()
    assert len(said) == 1 and "build bad failed (exit 3)" in said[0] and "compile error: no" in said[0]
    with pytest.raises(KeyError):
        pool.result("nope")
    assert bf.default_workers() >= 1


def test_a_round_analysed_in_a_worker_process_matches_the_inline_one(bundle, refs, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_fidelity as mod  # importable by name: a spawned worker finds analyse_round there

    task = {"kernel": "k", "round": 0, "bundle": bundle, "refs": refs, "lead": LEAD, "cal": CAL, "save": None}
    got = []
    inline = mod.Analysis(0, got.append)
    inline.submit(task)
    worker = mod.Analysis(1, got.append)
    try:
        worker.submit(task)
        worker.wait()
    finally:
        worker.close()
    assert len(got) == 2 and got[0]["rows"] == got[1]["rows"] and got[0]["info"] == got[1]["info"]
    failed = []
    broken = mod.Analysis(0, got.append, log=failed.append)
    broken.submit(dict(task, bundle=refs["mma"][0]))  # no passes in it: one line, the run goes on
    assert len(failed) == 1 and "round 0: analysis failed" in failed[0]


def test_one_build_compiles_as_a_worker_builds_it(tmp_path):
    """A run's worker: `build gemm:lifetimes --out DIR` (quack's GEMM, no family: the lightest
    build), then the build folder loads as a Build with what the compile found."""
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl")
    pytest.importorskip("quack", reason="needs quack-kernels")
    pytest.importorskip("tvm_ffi", reason="needs tvm-ffi to link an AOT build")
    if not bf.can_link():
        pytest.skip("no C++ compiler to link an AOT build")
    out = tmp_path / "gemm_lifetimes"
    r = subprocess.run([sys.executable, str(SCRIPT), "build", "gemm:lifetimes", "--out", str(out)],
                       capture_output=True, text=True, timeout=900, env={**__import__("os").environ,
                                                                         "CUTE_DSL_ARCH": "sm_90a"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    b = bf.load_build(out, "gemm:lifetimes")
    assert b.meta["families"] == [] and b.meta["kernel"] == bf.NAMES["gemm"] and b.plain is None
    assert b.meta["params"][-1] == "fa4trace_buf" and b.meta["warps_per_cta"] == 12
    assert b.meta["cta_lifetimes"] and b.meta["cursor"] == "smem"


def test_a_run_writes_what_it_measured_after_every_step_and_stops_at_its_deadline(tmp_path, bundle, refs,
                                                                                 monkeypatch):
    """run() with its GPU steps replaced by synthetic ones: rounds kernel by kernel, the torch-API
    kernels first, a kernel that fails named in the files while the others go on, rounds past
    the deadline skipped, the files rewritten after each step (complete only at the end)."""
    pytest.importorskip("torch")
    import fa4trace.bench.results as results
    import fa4trace.run.loader as loader

    mod = _load(SCRIPT, "bench_fidelity_run_test")
    monkeypatch.setattr(loader, "gpu_arch", lambda device=0: "sm_90a")
    monkeypatch.setattr(results, "gpu_name", lambda: "synthetic GPU")
    line_bundle = _bundle(sampled_like, n_ctas=128, sms=8, cta_stride=8, n_recorded=16, slowdown=0.2)
    costs = {"plain": 0.1, "default": 3.0, "sample": 2.0, "every CTA": 19.0}
    written = []

    def api(key, rounds, cost_rounds, replays, log, save, deadline):
        name = mod.NAMES[key]
        return ([mod.line_round(name, "default", line_bundle, costs)] * rounds,
                [{"kernel": name, "shape": "s", "build": "every family", "l2": "x", "plain_us": 50.0, "costs": costs}])

    seen_launches = set()

    def fid_round(case, r, launches, prelude):
        seen_launches.add((launches, prelude))
        if case.key == "decode":
            raise RuntimeError("the GPU refused it")
        return ({"kernel": case.kernel, "round": r, "bundle": bundle, "refs": refs, "lead": LEAD, "launches": launches},
                {"sample": line_bundle, "default": line_bundle})

    clock = {"t": 0.0}

    def cost(case, cost_rounds, replays):
        clock["t"] += 100.0  # each round "takes" 100 s
        return {"kernel": case.kernel, "shape": "s", "build": "dense", "l2": "x", "plain_us": 10.0, "costs": costs}

    monkeypatch.setattr(mod, "api_rounds", api)
    monkeypatch.setattr(mod, "fidelity_round", fid_round)
    monkeypatch.setattr(mod, "cost_round", cost)
    monkeypatch.setattr(mod, "calibration", lambda pool, log=print: CAL)
    monkeypatch.setattr(mod, "case_builds", lambda key, pool, log=print: {})
    monkeypatch.setattr(mod, "CASES", {k: (lambda b, k=k: mod.Case(k, mod.NAMES[k], "s", 8, 1, 1, None, b))
                                       for k in mod.FIDELITY_KERNELS})
    real_write = mod.write_results
    monkeypatch.setattr(mod, "write_results", lambda *a, **kw: (written.append(kw["complete"]), real_write(*a, **kw))[1])
    monkeypatch.setattr(mod.time, "monotonic", lambda: clock["t"])
    base = tmp_path / "fidelity_run.json"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where run() makes its build folder
    args = mod.parser().parse_args(["run", "--kernels", "gemm,decode,rmsnorm", "--json", str(base), "--jit",
                                    "--deadline-s", "250", "--launches", "3",
                                    "--pass-prelude", "2", "--reference", "mean"])
    said = []
    mod.run(mod.plan_of(args), json_base=str(base), save=None, workers=1, analysis_workers=0, merge=False,
            log=said.append)
    assert written[-1] is True and written.count(True) == 1 and len(written) >= 4
    assert list(scratch.iterdir()) == []  # nothing left behind in the temporary folder
    docs = {p: json.loads(p.read_text()) for p in mod.result_paths(str(base)).values()}
    by_area = {d["area"]: d for d in docs.values()}
    assert all(d["complete"] and d["gpu"] == "synthetic GPU" for d in docs.values())
    assert by_area["fidelity"]["errors"] == {"our decode": "RuntimeError: the GPU refused it"}
    shown = {r["kernel"]: r for r in by_area["fidelity-shown"]["rows"]}
    assert list(shown) == ["quack GEMM"] and shown["quack GEMM"]["rounds"] == 2  # round 3 would end past 250 s
    assert any("round 3 skipped (deadline)" in s for s in said)
    assert {r["kernel"] for r in by_area["fidelity"]["rows"]} == {"quack GEMM", "quack RMSNorm"}
    assert by_area["fidelity-shown"]["calibration"]["recorder"] == "segment_smem"
    # each pass and reference: 3 launches per round, as asked, and the notes say so
    assert seen_launches == {(3, 2)} and by_area["fidelity-shown"]["plan"]["launches"] == 3
    assert by_area["fidelity-shown"]["plan"]["pass_prelude"] == 2
    for area in ("fidelity-shown", "fidelity-error"):
        assert "3 launches of the call per round" in by_area[area]["notes"]
        assert "after 2 plain launches of the call and an L2 flush" in by_area[area]["notes"]
        assert "This run (quack GEMM, our decode, quack RMSNorm):" in by_area[area]["notes"]
        assert "the mean of its two recordings (run --reference mean)" in by_area[area]["notes"]
    assert by_area["fidelity-shown"]["plan"]["reference"] == "mean"
    assert shown["quack GEMM"]["reading"] == "3 launches per recording; reference: the mean of its two recordings"
    lines = by_area["perturbation-line"]["rows"]
    assert {(r["kernel"], r["config"]) for r in lines} == {("quack GEMM", "sample"), ("quack GEMM", "default"),
                                                           ("quack RMSNorm", "default")}
    assert said.index(next(s for s in said if s.startswith("quack RMSNorm: done"))) < \
        said.index(next(s for s in said if s.startswith("quack GEMM: round 1")))


def test_a_prelude_runs_the_plain_build_then_flushes_before_each_traced_launch(monkeypatch):
    import fa4trace.run.l2 as l2

    calls = []
    monkeypatch.setattr(l2, "scratch", lambda device=None: "buf")
    monkeypatch.setattr(l2, "flush", lambda buf: calls.append(("flush", buf)))
    plain = lambda *a, **kw: calls.append(("plain", a, kw))  # noqa: E731
    builds = {"lifetimes": bf.Build(lambda *a, **kw: calls.append(("traced", a, kw)) or "out", None, {}),
              "pipeline": bf.Build(lambda *a, **kw: calls.append(("pipe", a, kw)), None, {"x": 1})}
    wrapped = bf.with_prelude(builds, plain, 2)
    assert set(wrapped) == set(builds) and wrapped["pipeline"].meta == {"x": 1}
    # positional trace buffer (last): the plain build gets the call's own arguments
    assert wrapped["lifetimes"].fn(1, 2, "TRACE") == "out"
    assert calls == [("plain", (1, 2), {}), ("plain", (1, 2), {}), ("flush", "buf"), ("traced", (1, 2, "TRACE"), {})]
    calls.clear()
    # keyword call: the buffer travels as fa4trace_buf, which the plain build never sees
    wrapped["pipeline"].fn(1, k=3, fa4trace_buf="TRACE")
    assert calls == [("plain", (1,), {"k": 3}), ("plain", (1,), {"k": 3}), ("flush", "buf"),
                     ("pipe", (1,), {"k": 3, "fa4trace_buf": "TRACE"})]


def test_a_negative_prelude_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        bf.main(["run", "--pass-prelude", "-1", "--dry-run"])
    assert e.value.code == 2 and "--pass-prelude must be at least 0" in capsys.readouterr().err


def test_a_calibration_of_another_recorder_compensates_nothing(bundle, refs):
    from fa4trace.analysis.passes import DENSE, launch_passes

    other = Trace(bundle.events, dict(bundle.meta, instrument=dict(bundle.meta["instrument"], cursor="gmem")))
    assert launch_passes(other)[0] == DENSE
    rows, info = bf.round_rows("k", other, refs, LEAD, CAL)  # CAL is segment_smem's; this bundle says segment_gmem
    assert all(r["compensated_value"] is None for r in rows) and "compensated" not in info
