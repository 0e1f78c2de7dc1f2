"""`fa4trace summary` / `compare` on bundles of automatically traced kernels (synthetic, known answers)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fa4trace import kernel_analysis as K
from fa4trace.bundle import Trace, load
from fa4trace.cli import main
from fa4trace.decode import decode_buffer
from fa4trace.fidelity import perturbation
from fa4trace.synthetic import attention_like, pipelined_like, sampled_like


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
    assert "wait chain     CTA 0 (typical): 12 waits, 480 ns (53.9% of the CTA): mma.wait 200 ns, ab.wait 150 ns" in out


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
    assert out.splitlines()[-1].startswith("kernel time") and "faster" in out


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
            f"({p['recorded']['n']} recorded, {p['untraced']['n']} untraced; steady-state waves)")
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
