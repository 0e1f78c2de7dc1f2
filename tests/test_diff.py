"""`fa4trace diff`: what moved beyond noise, per role and stage (fa4trace.analysis.diff, .noise).

Synthetic bundles with a regression injected in one stage of one role, bundles that differ only
by their noise (the same generator, other seeds), refusals, the CLI's exit codes and JSON, and
the bundled H200 traces for a realistic run.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fa4trace.analysis import diff as D
from fa4trace.analysis.noise import critical_count, shift_band, u_counts
from fa4trace.cli import main
from fa4trace.format.errors import Fa4traceError
from fa4trace.trace.bundle import Trace, load
from fa4trace.trace.decode import decode_buffer
from fa4trace.testing.bundles import attention_like, pipelined_like

TRACES = Path(__file__).resolve().parent.parent / "traces"
DECODE = "decode_d128_16to1_sk131072_b1_{}.parquet"


def attention(seed: int, *, n_ctas: int = 32, n_blocks: int = 24, launches: int = 1, **stretch) -> Trace:
    """Our decode schedule "base" (fa4trace.testing.bundles.attention_like), ``stretch``: {event: factor}."""
    decoded, meta = [], None
    for i in range(launches):
        buf, meta = attention_like("base", n_ctas=n_ctas, n_blocks=n_blocks, seed=seed + 1000 * i,
                                   stretch=stretch or None)
        decoded.append(decode_buffer(buf, launch_index=i))
    return Trace.from_launches(decoded, meta)


def gemm(seed: int, *, store: float = 1.0, n_ctas: int = 24, k_tiles: int = 16, kernel: str = "synthetic.gemm_like"):
    """A GEMM-like automatic bundle (fa4trace.testing.bundles.pipelined_like) whose loads, MMAs and
    stores take random times; ``store`` scales the epilogue's TMA store."""
    rng = np.random.default_rng(seed)
    load = rng.normal(400, 40, (n_ctas, k_tiles)).clip(100).astype(np.int64)
    mma = rng.normal(300, 20, (n_ctas, k_tiles)).clip(100).astype(np.int64)
    st = (rng.normal(200, 15, n_ctas).clip(50) * store).astype(np.int64)
    buf, meta, vocab = pipelined_like(n_ctas=n_ctas, k_tiles=k_tiles, stages=4, load_ns=load, mma_ns=mma,
                                      store_ns=st, kernel=kernel)
    return Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab)


def beyond(result: dict) -> dict:
    """{figure id: status} of the figures that moved beyond noise."""
    return {f["id"]: f["status"] for f in result["figures"] if f.get("rank")}


def figure(result: dict, fid: str) -> dict:
    return next(f for f in result["figures"] if f["id"] == fid)


def run(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


# ---- the noise band (fa4trace.analysis.noise) -----------------------------------------------------
def test_u_distribution_and_critical_counts_match_the_tables():
    f = u_counts(3, 2)
    assert f.tolist() == [1, 1, 2, 2, 2, 1, 1] and f.sum() == math.comb(5, 2)
    assert u_counts(8, 8).sum() == math.comb(16, 8)
    # Hollander & Wolfe: for m = n = 8 the 95% interval runs from the 14th to the 51st of 64 differences
    assert critical_count(8, 8, 0.95) == 14
    assert critical_count(1, 1, 0.95) == 0  # two units cannot say anything at 95%
    # beyond EXACT_MAX_PAIRS the normal approximation continues the exact count
    assert abs(critical_count(50, 50, 0.95) - critical_count(51, 51, 0.95) * 2500 / 2601) < 20


def test_shift_band_finds_a_known_scale_change():
    rng = np.random.default_rng(0)
    a = rng.lognormal(6, 0.05, 40)
    s = shift_band(np.log(a), np.log(a * 1.25), 0.99)
    assert s.estimate == pytest.approx(math.log(1.25))
    assert s.low <= math.log(1.25) <= s.high and s.beyond
    same = shift_band(np.log(a), np.log(rng.permutation(a)), 0.99)
    assert same.estimate == 0 and not same.beyond
    few = shift_band([1.0, 2.0], [10.0, 20.0], 0.99)
    assert not few.judged and few.low is None and not few.beyond


# ---- a regression injected in one stage of one role --------------------------------------------------
def test_slower_softmax_is_named_first_and_no_other_stage_moves():
    """The consumers' SOFTMAX spans take 25% longer (other seed, other noise). Beyond noise: that
    span, first, and only what a longer softmax moves in this serial schedule: the PV of a block
    starts later after its V landed (the LOAD_V -> PV lag), the CTA takes longer, the tensor
    cores are busy a smaller share of it, the warps' busy / idle shares shift. Every other
    stage (QK, CORRECTION, PV, the loads, the K lag) stays within noise."""
    r = D.diff(attention(1), attention(2, SOFTMAX=1.25))
    moved = beyond(r)
    assert r["moved"][0] == "consumer/SOFTMAX/span"
    sm = figure(r, "consumer/SOFTMAX/span")
    assert sm["status"] == "regressed" and sm["band_pct"][0] <= 25 <= sm["band_pct"][1]
    assert 20 < sm["change_pct"] < 30
    stages = {k for k in moved if k.split("/")[2] in ("span", "wait")}
    assert stages == {"consumer/SOFTMAX/span"}
    consequences = {"consumer/LOAD_V→PV/lag": "regressed", "cta/recorded/duration": "regressed",
                    "cta/QK∪PV/tensor_busy": "regressed"}
    assert {k: moved[k] for k in consequences if k in moved} == consequences
    shares = {k for k in moved if k.split("/")[1] == "lifetime"}
    assert set(moved) == {"consumer/SOFTMAX/span", *consequences, *shares}
    assert all(moved[k] == "changed" for k in shares)  # busy / idle: neither better nor worse
    for fid in ("consumer/QK/span", "consumer/PV/span", "consumer/CORRECTION/span", "producer/LOAD_K/span",
                "producer/LOAD_V/span", "consumer/LOAD_K→QK/lag"):
        assert figure(r, fid)["status"] == "within noise", fid


def test_slower_store_in_an_automatic_bundle_is_named_alone():
    """The epilogue's TMA store takes 25% longer: its store_wait is the one figure beyond noise
    (it is the CTA's last step, so nothing else waits on it; the CTA's duration moves by less
    than its noise)."""
    r = D.diff(gemm(1), gemm(2, store=1.25))
    assert beyond(r) == {"epilogue/tma.store_wait/wait": "regressed"}
    f = figure(r, "epilogue/tma.store_wait/wait")
    assert f["band_pct"][0] <= 25 <= f["band_pct"][1]
    assert {"producer/ab.acquire/wait", "mma/ab/lag", "mma/mma.wait/wait", "cta/recorded/duration"} <= \
        {x["id"] for x in r["figures"]}


@pytest.mark.parametrize("seeds", [(11, 12), (13, 14), (15, 16)])
def test_bundles_that_differ_only_by_noise_move_nothing(seeds):
    for make in (attention, gemm):
        r = D.diff(make(seeds[0]), make(seeds[1]))
        assert r["moved"] == [] and r["figures_judged"] > 10
        assert all(f["status"] == "within noise" for f in r["figures"])
        assert D.regressions_above(r, 0.0) == []


def test_a_change_beyond_the_band_below_the_floor_is_negligible():
    """Two recordings of one build moved QK, PV, SOFTMAX by 0.4-0.6% on the H200, beyond a band of
    8 launches each (the SM clock): below ``min_change`` such a change is negligible."""
    a = np.random.default_rng(1).lognormal(6, 0.002, 40)
    f = D.judge(a, a * 1.005, "span", 0.999)
    assert f["status"] == "regressed" and f["change_pct"] == pytest.approx(0.5)
    assert D.judge(a, a * 1.005, "span", 0.999, min_change=1.0)["status"] == "negligible"
    assert D.judge(a, a * 1.02, "span", 0.999, min_change=1.0)["status"] == "regressed"
    shares = np.random.default_rng(2).uniform(0.50, 0.502, 40)
    assert D.judge(shares, shares + 0.005, "overlap", 0.999, min_change=1.0)["status"] == "negligible"  # 0.5 pts
    assert D.judge(shares, shares + 0.05, "overlap", 0.999, min_change=1.0)["status"] == "improved"


def test_the_band_is_family_wise():
    r = D.diff(attention(3), attention(4))
    m = r["figures_judged"]
    assert r["per_figure_confidence"] == pytest.approx(1 - 0.05 / m)
    assert D.diff(attention(3), attention(4), confidence=0.8)["per_figure_confidence"] == pytest.approx(1 - 0.2 / m)


# ---- launches: one by one, or repetitions ---------------------------------------------------------
def test_repeated_launches_are_the_units_and_launches_are_paired_by_default():
    base = attention(21, n_ctas=8, n_blocks=12, launches=8)
    slow = attention(22, n_ctas=8, n_blocks=12, launches=8, SOFTMAX=1.25)
    r = D.diff(base, slow, repeats=True)
    assert {f["units"] for f in r["figures"]} == {"launch"}
    assert r["groups"] == [{"base_launches": list(range(8)), "new_launches": list(range(8)),
                            "base_grid_ctas": 8, "new_grid_ctas": 8}]
    assert figure(r, "consumer/SOFTMAX/span")["status"] == "regressed"
    by_launch = D.diff(base, slow)  # default: launch i of BASE against launch i of NEW
    assert len(by_launch["groups"]) == 8
    assert {f["units"] for f in by_launch["figures"]} == {"cta"}
    assert "launch 3: consumer/SOFTMAX/span" in by_launch["moved"]


def test_launches_that_differ_are_not_pooled():
    t = load(TRACES / "step" / "step_GemmSm90.parquet")  # two launches: 132 and 96 CTAs
    with pytest.raises(Fa4traceError, match="launches ran different grids or CUDA symbols .*not repetitions"):
        D.diff(t, t, repeats=True)
    with pytest.raises(Fa4traceError, match="BASE holds 1 launches, NEW 2: diff compares them launch by launch"):
        D.diff(attention(1), attention(1, launches=2))
    r = D.diff(t, load(TRACES / "step" / "step_GemmSm90_2.parquet"))
    assert [g["base_grid_ctas"] for g in r["groups"]] == [132, 96]
    assert any("launch 0 vs 0: the launches ran different grids: 132 CTAs (BASE) vs 96 (NEW)" in n for n in r["notes"])
    assert all(f["id"].startswith(("launch 0: ", "launch 1: ")) for f in r["figures"])


def test_too_few_ctas_fall_back_to_batches_of_each_warps_spans():
    a = attention(5, n_ctas=2, n_blocks=32)
    b = attention(6, n_ctas=2, n_blocks=32, SOFTMAX=1.5)
    r = D.diff(a, b)
    sm = figure(r, "consumer/SOFTMAX/span")
    assert sm["units"] == "batch" and sm["n_base"] == 2 * 4 * D.BATCHES and sm["status"] == "regressed"
    assert figure(r, "cta/recorded/duration")["status"] == "too few units"


# ---- refusals ---------------------------------------------------------------------------------------
def test_other_kernels_and_vocabularies_are_refused_in_one_line():
    with pytest.raises(Fa4traceError, match="was traced by a recorder placed in the kernel and NEW .* by "
                                            "fa4trace.instrument") as e:
        D.diff(attention(1), gemm(1))
    assert "\n" not in str(e.value)
    with pytest.raises(Fa4traceError, match="BASE is kernel synthetic.gemm_like, NEW is kernel other.kernel"):
        D.diff(gemm(1), gemm(2, kernel="other.kernel"))
    g = gemm(3)
    vocab = json.loads(json.dumps(g.meta["vocabulary"]))
    for e in vocab["events"]:
        if e["name"] == "ab.wait":
            e["op"] = "release"
    other = Trace(g.events, dict(g.meta, vocabulary=vocab))
    with pytest.raises(Fa4traceError, match="name event 'ab.wait' differently .*not the same event vocabulary"):
        D.diff(g, other)
    a = attention(1)
    names = a.events["name"].cast("string").to_numpy(zero_copy_only=False)
    only = lambda keep: Trace(a.events.filter(np.isin(names, ["WARP", keep])), a.meta)  # noqa: E731
    with pytest.raises(Fa4traceError, match="record no event in common"):
        D.diff(only("QK"), only("PV"))


def test_fa4_causal_and_full_are_one_kernel_in_two_configurations():
    """`compare` refuses these two (their labels differ); they ran the same CUDA kernel, and diff
    says how the two configurations differ."""
    full = load(TRACES / "auto" / "fa4_sm90_prefill_full.parquet")
    causal = load(TRACES / "auto" / "fa4_sm90_prefill_causal.parquet")
    r = D.diff(full, causal)
    assert r["kernel"] == "FlashAttentionForwardSm90.kernel"
    assert r["differs"]["config"] == {"causal": [False, True]}
    assert r["differs"]["label"] == ["FA4 FlashAttentionForwardSm90 prefill", "FA4 FlashAttentionForwardSm90 prefill causal"]
    # the causal mask skips about half the KV blocks: the CTAs that ran untraced take about half as long
    cta = figure(r, "cta/untraced/duration")
    assert cta["status"] == "improved" and -60 < cta["change_pct"] < -35, cta


# ---- the bundled H200 traces ----------------------------------------------------------------------------
def test_base_against_pingpong_on_the_h200():
    r = D.diff(load(TRACES / DECODE.format("base")), load(TRACES / DECODE.format("pingpong")))
    assert r["differs"]["config"]["schedule"] == ["base", "pingpong"]
    qk = figure(r, "consumer/SOFTMAX∥QK/overlap")
    assert qk["status"] == "improved" and qk["change_pts"] > 80  # what the ping-pong is for
    assert figure(r, "producer/LOAD_K/span")["status"] == "improved"
    assert r["moved"][:2] == ["consumer/SOFTMAX∥PV/overlap", "consumer/SOFTMAX∥QK/overlap"]
    text = D.format_diff(r)
    assert "config       n_blocks 1024 → 2048, schedule base → pingpong, tile_n 128 → 64" in text
    assert "consumer    SOFTMAX∥QK             overlap            0.3%      93.6%  +93.2 pts" in text


def test_a_slowed_softmax_recorded_on_the_h200():
    """traces/diff: our decode kernel, schedule base, 8 launches a bundle, recorded by
    tests/gpu/test_diff_gpu.py as shipped, with 200 cycles spun inside every SOFTMAX span, and as
    shipped again."""
    def bundle(name):
        return load(TRACES / "diff" / f"decode_d128_16to1_sk131072_b1_base_{name}.parquet")

    plain = bundle("plain")
    r = D.diff(plain, bundle("slow_softmax"), repeats=True)
    sm = figure(r, "consumer/SOFTMAX/span")
    assert sm["units"] == "launch" and sm["status"] == "regressed" and sm["change_pct"] > 50
    spans = [f for f in r["figures"] if f["role"] == "consumer" and f["metric"] == "span" and f.get("rank")]
    assert min(spans, key=lambda f: f["rank"])["id"] == "consumer/SOFTMAX/span"
    for fid in ("consumer/QK/span", "consumer/PV/span", "consumer/CORRECTION/span"):
        assert figure(r, fid)["status"] in ("within noise", "negligible"), fid
    # memory-bound: the consumers had slack, the producer now waits longer for a free V stage
    assert figure(r, "producer/LOAD_V/span")["status"] == "regressed"
    assert figure(r, "cta/recorded/duration")["status"] == "within noise"
    assert [f["id"] for f in D.regressions_above(r, 10)] == ["producer/LOAD_V/span", "consumer/SOFTMAX/span"]
    again = D.diff(plain, bundle("plain_again"), repeats=True)
    assert D.regressions_above(again, 1.0) == []
    assert figure(again, "consumer/SOFTMAX/span")["status"] == "negligible"  # -0.4%: the clock
    assert figure(D.diff(plain, bundle("plain_again"), repeats=True, min_change=0), "consumer/SOFTMAX/span")[
        "status"] == "improved"


def test_a_bundle_against_itself_moves_nothing():
    for path in (TRACES / DECODE.format("intrawg"), TRACES / "auto" / "quack_gemm_sm90_square_8192.parquet",
                 TRACES / "fa4_sm90_d128_h16kv1_sk32768_b1.parquet"):
        t = load(path)
        r = D.diff(t, t)
        assert r["moved"] == [], path
        assert all(f["change_pct"] == 0 for f in r["figures"] if f.get("change_pct") is not None)


# ---- the command line --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("diff")
    out = {"base": attention(1).save(d / "base.parquet"), "noise": attention(2).save(d / "noise.parquet"),
           "slow": attention(2, SOFTMAX=1.25).save(d / "slow.parquet"), "gemm": gemm(1).save(d / "gemm.parquet")}
    (d / "report.json").write_text('{"kind": "not a bundle"}')
    out["json"] = d / "report.json"
    return out


def test_cli_names_the_regression_and_fails_the_gate(files):
    code, out, err = run("diff", files["base"], files["slow"], "--fail-above", "10")
    assert code == 1
    assert "moved beyond noise:" in out and "consumer    SOFTMAX" in out
    assert err.startswith("fa4trace: diff: ") and "consumer/SOFTMAX/span +" in err and err.count("\n") == 1
    code, out, err = run("diff", files["base"], files["slow"], "--fail-above", "30")  # 25% < 30%
    assert code == 0 and err == ""
    code, _, _ = run("diff", files["base"], files["slow"], "--fail-above", "10", "--ignore", "consumer/*",
                     "--ignore", "cta/*")
    assert code == 0
    # the softmax grew by ~66 ns a span (263 -> 329 ns), the CTA by ~1.5 µs (24 blocks)
    code, _, err = run("diff", files["base"], files["slow"], "--fail-above", "5", "--min-ns", "50")
    assert code == 1 and "and 50 ns" in err and "consumer/SOFTMAX/span" in err
    code, _, _ = run("diff", files["base"], files["slow"], "--fail-above", "5", "--min-ns", "5000")
    assert code == 0
    code, out, err = run("diff", files["base"], files["slow"])
    assert code == 0 and err == ""  # no gate: a report


def test_cli_noise_passes_the_gate(files):
    code, out, err = run("diff", files["base"], files["noise"], "--fail-above", "0")
    assert code == 0, err
    assert "nothing moved beyond noise" in out


def test_cli_inputs_that_cannot_be_diffed_exit_2_in_one_line(files, tmp_path):
    for args, msg in (((files["base"], files["gemm"]), "traced by"),
                      ((files["base"], files["json"]), "is JSON, not a trace bundle"),
                      ((files["base"], tmp_path / "missing.parquet"), "missing.parquet: no such file"),
                      ((files["base"], files["base"], "--min-ns", "5"), "give --fail-above PCT with them"),
                      ((files["base"], files["base"], "--fail-above", "-1"), "--fail-above"),
                      ((files["base"], files["base"], "--confidence", "1.5"), "--confidence")):
        code, out, err = run("diff", *args)
        assert code == 2, (args, err)
        assert out == "" and err.startswith("fa4trace: error: ") and msg in err and err.count("\n") == 1


FIGURE_KEYS = {"id", "group", "launch", "role", "stage", "metric", "scale", "unit", "better", "units", "base", "new",
               "n_base", "n_new", "status", "magnitude"}


def test_cli_json_has_every_figure_and_the_gate(files):
    code, out, err = run("diff", files["base"], files["slow"], "--json", "--fail-above", "10")
    assert code == 1
    doc = json.loads(out)
    assert {"format", "version", "base", "new", "kernel", "traced_by", "differs", "notes", "confidence",
            "per_figure_confidence", "figures_judged", "min_change", "repeats", "groups", "figures", "only_in_base",
            "only_in_new", "moved", "gate"} <= set(doc)
    assert doc["format"] == "fa4trace-diff" and doc["version"] == 1
    assert doc["base"]["path"] == str(files["base"]) and doc["new"]["synthetic"] is True
    assert len(doc["figures"]) == doc["figures_judged"]
    for f in doc["figures"]:
        assert FIGURE_KEYS <= set(f), f["id"]
        assert f["status"] in ("regressed", "improved", "changed", "negligible", "within noise", "too few units")
        assert ("change_pts" in f) == (f["unit"] == "share") and ("change_pct" in f) == (f["unit"] == "ns")
    assert doc["gate"]["failed"][0] == "consumer/SOFTMAX/span" and doc["gate"]["fail_above"] == 10
    assert doc["moved"] == [f["id"] for f in sorted((f for f in doc["figures"] if f.get("rank")),
                                                   key=lambda f: f["rank"])]


def test_cli_all_and_top(files):
    _, out, _ = run("diff", files["base"], files["noise"], "--all")
    assert out.count("within noise") >= 10
    _, out, _ = run("diff", files["base"], files["slow"], "--top", "1")
    rows = [line for line in out.splitlines() if line.endswith(("regressed", "improved", "changed"))]
    assert len(rows) == 1 and "SOFTMAX" in rows[0] and "the 1 that moved most" in out


def test_input_kinds():
    from fa4trace.cli.diffing import diff_input_kind

    assert diff_input_kind(str(TRACES / DECODE.format("base"))) == "bundle"
    assert diff_input_kind(str(TRACES)) == "a folder"
    assert diff_input_kind(str(TRACES / "README.md")) == "another file"


# ---- the viewer ----------------------------------------------------------------------------------------
def test_viewer_lists_what_moved_beyond_noise(app_env, files):
    pytest.importorskip("streamlit")
    from test_app import run_app  # the viewer's AppTest harness

    from fa4trace.viewer import data, diff_view, literal

    a, b = files["base"], files["slow"]
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(a), str(b)]))
    at = run_app(trace_a=data.path_key(a), trace_b=data.path_key(b))
    want = D.diff(load(a), load(b))
    label = diff_view.title(want)
    assert label.startswith("B against A, beyond noise: ") and "regressed" in label
    assert any(e.label == label for e in at.expander)
    table = next(t.value for t in at.table if "noise band" in t.value.columns)
    # the table shows the rows with their names escaped for Markdown (st.table renders cells as Markdown)
    assert table.to_dict("records") == literal.md_rows(diff_view.moved_rows(want))
    assert table.iloc[0]["stage"] == "SOFTMAX" and table.iloc[0][""] == "▲ regressed"
    # a pair diff refuses: one line, no table
    app_env.setenv("FA4TRACE_BUNDLES", os.pathsep.join([str(a), str(files["gemm"])]))
    at = run_app(trace_a=data.path_key(a), trace_b=data.path_key(files["gemm"]))
    assert any(c.value.startswith("Beyond noise (fa4trace diff): not diffed: BASE (") for c in at.caption)
    assert not any("noise band" in t.value.columns for t in at.table)


# ---- docs/diff.md shows what the command prints ----------------------------------------------------------
def doc_examples() -> list[tuple[list[str], str, int | None]]:
    """(arguments, what the terminal shows, exit status or None) of every ``$ fa4trace diff`` block."""
    import shlex

    text = (Path(__file__).resolve().parent.parent / "docs" / "diff.md").read_text()
    out = []
    for block in text.split("```text\n")[1:]:
        lines = block.split("\n```")[0].split("\n")
        if not lines[0].startswith("$ fa4trace diff "):
            continue
        code = None
        if "$ echo $?" in lines:
            i = lines.index("$ echo $?")
            code, lines = int(lines[i + 1]), lines[:i]
        out.append((shlex.split(lines[0])[2:], "\n".join(lines[1:]), code))  # after "$ fa4trace"
    return out


@pytest.mark.parametrize("args, shown, code", doc_examples(), ids=lambda x: None)
def test_docs_show_what_the_command_prints(args, shown, code, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    r = CliRunner().invoke(main, args)
    assert (r.stdout + r.stderr).rstrip("\n") == shown
    if code is not None:
        assert r.exit_code == code


def test_the_docs_have_examples():
    assert len(doc_examples()) >= 5
