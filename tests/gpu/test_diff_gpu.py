"""`fa4trace diff` on a real regression: our decode kernel recorded twice on the GPU, once as
shipped and once with a deliberately slowed softmax; diff must name the consumer's SOFTMAX span.

The slowed build is the shipped kernel class with its ``softmax`` step wrapped (a subclass made
here, JIT-compiled with the CuTe DSL): every SOFTMAX span spins ``EXTRA_CYCLES`` SM cycles
before the real softmax. The span's begin stamp is the QK retire read taken before the step
(kernels/attention_sm90.py, ``qk_then_softmax``), so the spin lies inside the span; the output
is the same bits. Schedule "base" (QK, then softmax, then PV: nothing overlaps the softmax), so
QK, CORRECTION and PV keep their durations. Both builds are compiled here the same way and
each bundle holds ``LAUNCHES`` launches of the same call, diffed with ``repeats``: the noise
band then holds the launch-to-launch noise too.

Needs an sm_90 GPU, torch and the CuTe DSL (the slowed build is JIT-only).
Run: python -m pytest -q tests/gpu/test_diff_gpu.py
"""

from __future__ import annotations

import json
import math

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)
if torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("our decode kernel targets sm_90a", allow_module_level=True)
pytest.importorskip("cutlass")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Int64, const_expr  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from fa4trace.analysis.diff import diff, regressions_above  # noqa: E402
from fa4trace.attention.api import num_sms, variant_for, workspaces  # noqa: E402
from fa4trace.attention.planner import plan_splits, trace_capacity  # noqa: E402
from fa4trace.attention.shapes import validate  # noqa: E402
from fa4trace.cli import main  # noqa: E402
from fa4trace.kernels.attention_sm90 import ARCH, PTXAS_OPTIONS, DecodeAttentionSm90, fake_arguments  # noqa: E402
from fa4trace.kernels.decode_spec import WARPS_PER_CTA  # noqa: E402
from fa4trace.run.record import TracedLaunch, record  # noqa: E402

EXTRA_CYCLES = 200  # the softmax of a 64-key block at d128 takes ~420 cycles on the H200: about +50%
LAUNCHES = 8  # per bundle: 8 against 8 launches reach the band's level for a diff of ~22 figures
SHAPE = dict(b=1, sq=1, hq=16, hkv=1, sk=131072, d=128)  # 132 CTAs on an H100 / H200
SCHEDULE = "base"
COMPUTE = ("consumer/QK/span", "consumer/CORRECTION/span", "consumer/PV/span")


class SlowSoftmax(DecodeAttentionSm90):
    """The shipped kernel with ``EXTRA_CYCLES`` of spinning inside every SOFTMAX span."""

    @cute.jit
    def softmax(self, rec, ctx, acc_S, n_block, may_mask: cutlass.Constexpr, t=None):
        t0 = t
        if const_expr(t0 is None):
            t0 = rec.timer()  # the span begins here, before the spin
        start = Int64(cute.arch.clock64())
        now = start
        while now - start < EXTRA_CYCLES:
            now = Int64(cute.arch.clock64())
        return DecodeAttentionSm90.softmax(self, rec, ctx, acc_S, n_block, may_mask, t=t0)


def compile_traced(cls, variant):
    """``cls`` compiled as kernels/attention_sm90.compile_variant compiles the shipped variants."""
    return cute.compile(cls(variant), *fake_arguments(variant.head_dim, variant.dtype, True),
                        options=f"--enable-tvm-ffi --gpu-arch {ARCH} {PTXAS_OPTIONS}")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """{"plain", "slow", "plain2"}: paths of bundles of ``LAUNCHES`` traced launches each, on the
    same inputs (plain, slowed, plain again), and the outputs of one launch of each."""
    g = torch.Generator(device="cuda").manual_seed(0)
    b, sq, hq, hkv, sk, d = (SHAPE[k] for k in ("b", "sq", "hq", "hkv", "sk", "d"))
    q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda", generator=g)
    k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda", generator=g)
    v = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda", generator=g)
    shape = validate(q, k, v, schedule=SCHEDULE)
    variant = variant_for(shape, SCHEDULE, events="core")
    plan = plan_splits(shape, variant.tile_n, num_sms(q.device), None, variant.block_rows)
    lse, o_part, lse_part, count = workspaces(shape, plan, q.device)
    scale = 1.0 / math.sqrt(d)
    fns = {"plain": compile_traced(DecodeAttentionSm90, variant), "slow": compile_traced(SlowSoftmax, variant)}
    d_out = tmp_path_factory.mktemp("diff_gpu")
    paths, outs = {}, {}
    for name, fn_key in (("plain", "plain"), ("slow", "slow"), ("plain2", "plain")):
        fn = fns[fn_key]
        o = torch.empty_like(q)

        def run(trace, fn=fn, o=o):
            fn(q, k, v, o, lse, o_part, lse_part, count, *plan.kernel_args(scale), trace)

        warm = TracedLaunch(kernel="decode_attention_sm90", grid_ctas=plan.n_ctas, warps_per_cta=WARPS_PER_CTA,
                            run=run, grid=plan.grid, block=(32 * WARPS_PER_CTA, 1, 1), capacity=trace_capacity(plan))
        record([warm], kernel="decode_attention_sm90", config={})  # module load, first-launch costs
        trace = record([warm] * LAUNCHES, kernel="decode_attention_sm90",
                       config={"schedule": SCHEDULE, **SHAPE, "dtype": "bf16", "build": name,
                               "softmax_extra_cycles": EXTRA_CYCLES if fn_key == "slow" else 0})
        paths[name] = trace.save(d_out / f"{name}.parquet")
        outs[name] = o.clone()
    return paths, outs


def test_the_slowed_build_computes_the_same_bits(bundles):
    _, outs = bundles
    assert torch.equal(outs["plain"], outs["slow"])


def test_diff_names_the_slowed_softmax(bundles):
    from fa4trace.trace.bundle import load

    paths, _ = bundles
    r = diff(load(paths["plain"]), load(paths["slow"]), repeats=True)
    figs = {f["id"]: f for f in r["figures"]}
    sm = figs["consumer/SOFTMAX/span"]
    assert sm["units"] == "launch" and sm["n_base"] == LAUNCHES
    assert sm["status"] == "regressed", sm
    assert sm["change_pct"] > 20, sm  # EXTRA_CYCLES on a ~420-cycle step
    assert r["differs"]["config"]["softmax_extra_cycles"] == [0, EXTRA_CYCLES]
    # the consumer's other compute steps keep their durations: none moved a third as much
    for fid in COMPUTE:
        assert abs(figs[fid]["change_pct"]) < sm["change_pct"] / 3, figs[fid]
    spans = [f for f in r["figures"] if f["role"] == "consumer" and f["metric"] == "span" and f.get("rank")]
    assert min(spans, key=lambda f: f["rank"])["id"] == "consumer/SOFTMAX/span"
    assert "consumer/SOFTMAX/span" in [f["id"] for f in regressions_above(r, 10)]


def test_the_gate_fails_on_the_slowed_build_and_passes_on_a_rerecording(bundles):
    paths, _ = bundles
    res = CliRunner().invoke(main, ["diff", str(paths["plain"]), str(paths["slow"]), "--repeats", "--json",
                                    "--fail-above", "10"])
    assert res.exit_code == 1, res.stderr
    assert "consumer/SOFTMAX/span" in json.loads(res.stdout)["gate"]["failed"]
    # the same build recorded again: the consumer's compute steps regress by no more than 10%
    res = CliRunner().invoke(main, ["diff", str(paths["plain"]), str(paths["plain2"]), "--repeats", "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    for f in doc["figures"]:
        if f["id"] in ("consumer/SOFTMAX/span", *COMPUTE):
            assert not (f["status"] == "regressed" and f["magnitude"] > 10), f
