"""`fa4trace summary` / `compare` on bundles of automatically traced kernels (synthetic, known
answers; and one GEMM recorded on the H200, in traces/auto)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fa4trace.analysis import kernel as K
from fa4trace.analysis.fidelity import perturbation
from fa4trace.cli import main
from fa4trace.trace.bundle import Trace, load
from fa4trace.trace.decode import decode_buffer
from fa4trace.testing.bundles import attention_like, pipelined_like, sampled_like


def run(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def save(path, **kw):
    buf, meta, vocab = pipelined_like(**kw)
    return Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab).save(path)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_kernel")
    buf, meta = attention_like("base", n_ctas=2, n_blocks=4)
    return {
        "tiny": save(d / "tiny.parquet", n_ctas=1, k_tiles=4, stages=2, consumer_warps=1, idle_warps=0, load_ns=100,
                     mma_ns=50, store_ns=100),
        "s2": save(d / "s2.parquet", n_ctas=2, k_tiles=16, stages=2, load_ns=2000),
        "s6": save(d / "s6.parquet", n_ctas=2, k_tiles=16, stages=6, load_ns=2000),
        "other": save(d / "other.parquet", n_ctas=1, k_tiles=4, kernel="other.kernel"),
        "attention": Trace.from_launches([decode_buffer(buf)], meta).save(d / "att.parquet"),
        "sampled": save_sampled(d / "sampled.parquet", slowdown=0.25),
        "sampled_light": save_sampled(d / "sampled_light.parquet", slowdown=0.05),
    }


def save_sampled(path, **kw):
    buf, meta, vocab = sampled_like(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, **kw)
    return Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab).save(path)


def test_summary_text_has_the_hand_worked_numbers(paths):
    code, out, err = run("summary", paths["tiny"])
    assert code == 0, err
    assert "synthetic.gemm_like  (SYNTHETIC)" in out
    assert "roles          producer 1 (inferred), mma 0 (inferred), epilogue 2 (inferred)" in out
    assert "producer        16.3%    60.5%   23.3%   ab.acquire 60.5%" in out  # 70 / 260 / 100 of 430 ns
    assert "stages held: mean 1.66, max 2; all held 66.0%, none 0.0% of the time" in out
    assert "median 110 ns" in out and "median per stage 0: 110 ns, 1: 145 ns" in out
    assert "wait chain     CTA 0: 12 waits, 480 ns (53.9% of the CTA): mma.wait 200 ns, ab.wait 150 ns" in out
    assert "over CTAs" not in out  # one CTA: no spread to report


def test_summary_json_is_the_library_summary(paths):
    code, out, _ = run("summary", paths["s2"], "--json")
    assert code == 0 and json.loads(out) == json.loads(json.dumps(K.summarize_kernel(load(paths["s2"]))))
    code, out, _ = run("summary", paths["s2"], "--json", "--roles", "loader=4", "--roles", "mma=0-2,3")
    s = json.loads(out)
    assert s["roles"]["loader"] == {"warps": [4], "source": "given"} and s["roles"]["mma"]["source"] == "given"
    # attention bundles keep their summary
    code, out, _ = run("summary", paths["attention"], "--json")
    assert code == 0 and "qk_softmax_overlap" in json.loads(out)


def test_compare_of_one_kernel(paths):
    code, out, err = run("compare", paths["s2"], paths["s6"], "--json")
    assert code == 0, err
    c = json.loads(out)
    assert c == json.loads(json.dumps(K.compare_kernels(load(paths["s2"]), load(paths["s6"]))))
    code, out, _ = run("compare", paths["s2"], paths["s6"])
    lines = {ln[:28].strip(): ln for ln in out.splitlines()}
    assert "ab occupancy mean" in lines and "mma waiting" in lines and "wait chain (median CTA)" in lines
    # the two bundles differ in their config (stages): the time is compared, and the config named
    assert out.splitlines()[-1].startswith("kernel time") and "B takes" in out and "less time" in out
    assert "on different configs (stages 2 → 6)" in out.splitlines()[-1]


@pytest.mark.parametrize("args, message", [
    (["compare", "s2", "attention"], "A is a bundle of an automatically traced kernel and the other is not"),
    (["compare", "attention", "s2"], "B is a bundle of an automatically traced kernel and the other is not"),
    (["compare", "s2", "other"], "A is kernel synthetic.gemm_like, B is kernel other.kernel"),
    (["summary", "s2", "--roles", "loader"], "--roles takes ROLE=WARPS"),
    (["summary", "s2", "--roles", "loader=a-b"], "warps must be indices or ranges"),
    (["summary", "s2", "--roles", "a=1", "--roles", "b=1"], "warp 1 is given two roles"),
    (["summary", "attention", "--roles", "a=1"], "--roles applies to bundles of automatically traced kernels"),
])
def test_errors_are_one_line(paths, args, message):
    code, _, err = run(*[paths.get(a, a) for a in args])
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and lines[0].startswith("fa4trace: error:") and message in lines[0], err


def test_summary_and_compare_say_how_much_the_trace_slowed_its_ctas(paths):
    p = perturbation(load(paths["sampled"]))
    code, out, err = run("summary", paths["sampled"])
    assert code == 0, err
    want = (f"  perturbation   recorded CTAs ran +{100 * p['rel']:.1f}% longer than untraced ones "
            f"({p['recorded']['n']} recorded, {p['untraced']['n']} untraced; steady-state waves; "
            f"noise ±{100 * p['noise']:.1f}%)")
    assert want in out.splitlines() and 0.23 < p["rel"] < 0.27
    code, out, _ = run("summary", paths["sampled"], "--json")
    assert json.loads(out)["perturbation"] == json.loads(json.dumps(p))
    code, out, _ = run("compare", paths["sampled"], paths["sampled_light"])
    lines = out.splitlines()
    a = [ln for ln in lines if ln.startswith("  A perturbation ")]
    b = [ln for ln in lines if ln.startswith("  B perturbation ")]
    assert len(a) == len(b) == 1 and "recorded CTAs ran +2" in a[0] and "recorded CTAs ran +" in b[0]
    assert lines.index(b[0]) == lines.index(a[0]) + 1
    # a bundle without lifetimes says so, on the same row
    code, out, _ = run("summary", paths["s2"])
    assert "  perturbation   not measured: no CTA lifetimes in this bundle" in out


QUACK_SKINNY = Path(__file__).resolve().parents[1] / "traces" / "auto" / "quack_gemm_sm90_skinny_64x8192x8192.parquet"


def test_summary_of_a_recorded_gemm_shows_the_median_chain_and_no_empty_lines():
    """quack's GEMM (traces/auto): its epilogue store pipeline declares stages but records no
    fill, and its idle warps are idle: the text leaves both out (the JSON keeps the pipeline).
    Its scheduler pipeline is filled by one CTA of each 2-CTA cluster: the median count per CTA
    lies between 0 and 1 and is shown so, not rounded to a count no CTA had. The wait chain
    shown is the CTA whose chain waits the median of all CTAs' chains."""
    from fa4trace.analysis.autoevents import AutoCols
    from fa4trace.analysis.roles import assign_roles
    from fa4trace.analysis.wait_chain import chain_per_cta, wait_chains

    code, out, err = run("summary", QUACK_SKINNY)
    assert code == 0, err
    assert "pipeline ab:" in out and "pipeline epi_store" not in out and " 0 counts per CTA" not in out
    assert "pipeline scheduler: 1 stage, 0.5 counts per CTA (median; 0 to 1)" in out
    assert not any(line.startswith("  idle ") for line in out.splitlines())
    per = chain_per_cta(wait_chains(AutoCols.of(assign_roles(load(QUACK_SKINNY), None)))).to_pydict()
    order = sorted(range(len(per["cta"])), key=lambda i: per["wait_ns"][i])
    median_cta = per["cta"][order[(len(order) - 1) // 2]]
    assert f"wait chain     CTA {median_cta} (median of {len(order)} CTAs):" in out
    longest = per["cta"][order[-1]]
    assert median_cta != longest and f"(CTA {longest})" in out  # the longest is named as the max, not as typical
    s = json.loads(run("summary", QUACK_SKINNY, "--json")[1])
    assert s["pipelines"]["epi_store"]["counts_per_cta"]["max"] == 0 and s["wait_chain"]["cta"] == median_cta


def test_compare_of_two_configs_says_so_and_claims_no_speed_up(tmp_path):
    a = save(tmp_path / "a.parquet", n_ctas=1, k_tiles=16, stages=2, load_ns=2000)
    b = save(tmp_path / "b.parquet", n_ctas=1, k_tiles=4, stages=2, load_ns=2000)  # a quarter of the work
    code, out, err = run("compare", a, b)
    assert code == 0, err
    last = out.splitlines()[-1]
    assert "B takes" in last and "less time, on different configs (k_tiles 16 → 4)" in last
    assert "faster" not in out
