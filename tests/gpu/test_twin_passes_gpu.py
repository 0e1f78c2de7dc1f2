"""The plain twin and passes of ``fa4trace.instrument()`` on a real GPU (JIT: the CuTe DSL, FA4
and quack installed where the GPU is; kernels called through FA4's and quack's own torch APIs).

- the plain twin of FA4's forward and quack's RMSNorm, timed inside the call on the device,
  agrees within 3 points with an independent graph-timed measurement made here
  (fa4trace.run.timing.paired_costs of the same plain and traced builds, same arguments);
- a kernel that accumulates into its output leaves exactly one launch's result after the twin
  timing's many launches and a pass's replay;
- passes on FA4's forward: the bundle holds every pass that ran, each figure is sourced from
  one of them (CTA duration from the lifetimes pass), and ``fa4trace summary`` says so.

Run: ``pytest -m gpu tests/gpu/test_twin_passes_gpu.py -s`` (compiles FA4's forward six ways and
RMSNorm twice: a few minutes).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl where the GPU is (pip install 'fa4trace[dsl]')")
import cuda.bindings.driver as cuda  # noqa: E402 (module level: the DSL reads this file's annotations here)
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
fa = pytest.importorskip("flash_attn.cute.interface", reason="needs flash-attn-4 (pip install 'fa4trace[fa4]')")
pytest.importorskip("quack.rmsnorm", reason="needs quack-kernels (pip install 'fa4trace[fa4]')")

import fa4trace  # noqa: E402
from fa4trace.auto.run import Instrumented, call_traced  # noqa: E402

TOLERANCE_PTS = 3.0  # the twin against the independent measurement, percentage points


class Calls:
    """Every traced call of an Instrumented while it is installed: (kernel, args, kwargs)."""

    def __init__(self, monkeypatch):
        self.seen = []
        orig = Instrumented._traced_call

        def spy(k, args, kwargs):
            self.seen.append((k, args, kwargs))
            return orig(k, args, kwargs)

        monkeypatch.setattr(Instrumented, "_traced_call", spy)


def independent_cost(k: Instrumented, args, kwargs, per_graph: int) -> tuple:
    """(plain µs, traced µs, cost %) of ``k``'s builds on the call's arguments, timed by
    fa4trace.run.timing.paired_costs (CUDA graphs, the same inputs every launch: warm L2)."""
    from fa4trace.run.record import new_trace_tensor
    from fa4trace.run.timing import paired_costs

    targs = k.to_arg(new_trace_tensor(k.options.spec(k.warps_per_cta)))
    got = paired_costs(lambda i: k.plain(*args, **kwargs), {"traced": lambda i: call_traced(k.fn, args, kwargs, targs)},
                       1, 10, per_graph, 7)
    return got["traced"]


def check_twin(k: Instrumented, entry: dict, args, kwargs) -> None:
    print(k.meta.get("kernel"), entry)
    assert entry["method"] == "graph" and entry["l2"] == "warm", entry
    assert entry["rounds"] >= 5 and entry["launches_per_replay"] >= 1
    assert entry["plain_ns"] > 0 and 0.9 < entry["traced_ns"] / entry["plain_ns"] < 3.0, entry
    assert entry["noise_pct"] < 5.0, entry
    plain_us, traced_us, ref_pct = independent_cost(k, args, kwargs, entry["launches_per_replay"])
    print(f"independent: plain {plain_us:.2f} µs, traced {traced_us:.2f} µs, {ref_pct:+.2f}%; "
          f"twin {100 * entry['rel']:+.2f}% (noise ±{entry['noise_pct']:.2f})")
    assert abs(100 * entry["rel"] - ref_pct) <= TOLERANCE_PTS, (entry, ref_pct)
    assert abs(entry["plain_ns"] / 1e3 / plain_us - 1) < 0.10, (entry, plain_us)  # the same kernel time


def _fa4(q, k, v):
    o = fa.flash_attn_func(q, k, v, causal=True)
    return o[0] if isinstance(o, tuple) else o


@pytest.fixture(scope="module")
def fa4_passes():
    """FA4's SM90 forward (b 2, s 1024, h 8, d 128: 128 CTAs, every one records) traced with
    passes, from a warm cache: (the Instrumented, its call's args and kwargs, plain and traced
    outputs, the bundle)."""
    mp = pytest.MonkeyPatch()
    calls = Calls(mp)
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        o_plain = _fa4(q, k, v)
        with fa4trace.instrument(passes=True) as rec:
            o = _fa4(q, k, v)
        assert len(rec.launched) == 1, [x.meta["kernel"] for x in rec.kernels]
        kern = rec.launched[0]
        ((_, args, kwargs),) = [c for c in calls.seen if c[0] is kern]
        return kern, args, kwargs, o_plain, o.clone(), kern.trace()
    finally:
        mp.undo()


def test_fa4_forward_plain_twin_agrees_with_an_independent_graph_timing(fa4_passes):
    k, args, kwargs, o_plain, o, t = fa4_passes
    assert torch.equal(o, o_plain)
    twins = t.meta["instrument"]["plain_twin"]
    assert [e["launch"] for e in twins] == list(range(len(t.meta["launches"])))
    (dense,) = [e for e, ln in zip(twins, t.meta["launches"]) if ln["pass"] == "dense"]
    check_twin(k, dense, args, kwargs)
    from fa4trace.analysis.fidelity import perturbation, perturbation_lines

    print("\n".join(perturbation_lines(perturbation(t))))


def test_fa4_forward_passes_every_pass_in_the_bundle_and_each_figure_sourced(fa4_passes, tmp_path):
    from fa4trace.analysis.passes import launch_passes, sourced_figures

    k, _args, _kwargs, o_plain, o, t = fa4_passes
    assert torch.equal(o, o_plain)  # after the dense launch, the twin timing and five replays
    inst = t.meta["instrument"]
    ran = [p["pass"] for p in inst["passes"]]
    print("passes:", ran, "skipped:", inst["passes_skipped"])
    assert ran[0] == "dense" and "lifetimes" in ran and len(ran) >= 4  # FA4's forward has several families
    assert launch_passes(t) == ran  # one call: one launch per pass, in the order they ran
    assert all(ln.get("checked") is not False for ln in t.meta["launches"])
    assert all(ln["checked"] for ln in t.meta["launches"][1:])  # each pass's output checked, bit for bit
    assert [ln.get("l2") for ln in t.meta["launches"]] == ["flushed"] * len(ran)  # each started from a flushed L2
    s = sourced_figures(t)
    assert {p["pass"] for p in s["passes"]} == set(ran)
    w = {p["pass"]: p["events_per_cta"] for p in s["passes"]}
    assert w["lifetimes"] == 0 and all(0 < w[p] < w["dense"] for p in ran if p not in ("dense", "lifetimes")), w
    figs = s["figures"]
    assert figs["cta.median_ns"]["pass"] == "lifetimes"
    assert {f["pass"] for f in figs.values()} <= set(ran)
    light = [key for key, f in figs.items() if f["pass"] not in ("dense", "lifetimes")]
    assert light, figs  # some stage duration or wait came from a one-family pass
    path = t.save(tmp_path / "fa4_passes.parquet")
    r = subprocess.run([sys.executable, "-m", "fa4trace", "summary", str(path)], capture_output=True, text=True)
    assert r.returncode == 0 and "by pass" in r.stdout and "lifetimes" in r.stdout, r.stderr[-2000:]
    print(r.stdout[-3000:])


def test_quack_rmsnorm_plain_twin_agrees_with_an_independent_graph_timing(monkeypatch):
    from quack.rmsnorm import rmsnorm

    calls = Calls(monkeypatch)
    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, device="cuda", dtype=torch.float32)
    y_plain = rmsnorm(x, w)
    with fa4trace.instrument() as rec:
        y = rmsnorm(x, w)
    assert torch.equal(y, y_plain)
    k = rec.launched[-1]
    ((_, args, kwargs),) = [c for c in calls.seen if c[0] is k]
    t = k.trace()
    (entry,) = t.meta["instrument"]["plain_twin"]
    check_twin(k, entry, args, kwargs)


def _accumulate_entry():
    """out += x, one element per thread, on the tvm-ffi environment stream (as quack and FA4
    compile): a kernel whose extra launches would each add x once more."""
    @cute.kernel
    def accumulate_kernel(x: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * 128 + tidx
        out[i] = out[i] + x[i]

    @cute.jit
    def accumulate(x: cute.Tensor, out: cute.Tensor, stream: cuda.CUstream):
        accumulate_kernel(x, out).launch(grid=(x.shape[0] // 128, 1, 1), block=(128, 1, 1), stream=stream)

    return accumulate


def test_a_kernel_that_accumulates_into_its_output_keeps_one_launchs_result():
    from cutlass.cute.runtime import make_fake_compact_tensor

    from fa4trace.analysis.passes import launch_passes

    n = 1 << 20
    x = torch.randn(n, device="cuda", dtype=torch.float32)
    out0 = torch.randn(n, device="cuda", dtype=torch.float32)
    out = out0.clone()
    entry = _accumulate_entry()
    fake = make_fake_compact_tensor(cutlass.Float32, (cute.sym_int(),), assumed_align=16)
    with fa4trace.instrument(passes=True) as rec:
        k = cute.compile(entry, fake, fake, cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True),
                         options="--enable-tvm-ffi")
        k(x, out)
    assert rec.launched == [k] and k.checked == [True]
    torch.cuda.synchronize()
    assert torch.equal(out, out0 + x)  # not out0 + (2 plain + 1 traced + the twin's + the pass's launches) * x
    t = k.trace()
    (twin, *_rest) = t.meta["instrument"]["plain_twin"]
    print(twin, t.meta["instrument"]["passes"], t.meta["instrument"]["passes_skipped"])
    assert twin["method"] == "graph" and twin["launches_per_replay"] > 10  # a short kernel: many launches a replay
    assert launch_passes(t) == ["dense", "lifetimes"]  # no family in this kernel: the lifetimes pass alone
    assert t.meta["launches"][1]["checked"] is True


def test_quack_rmsnorm_passes_replayed_three_times_are_read_over_their_launches(tmp_path):
    """``instrument(passes=True, pass_launches=3)`` through quack's torch API: each pass that ran
    has three launches of the call, each checked bit for bit and started from a flushed L2; the
    sourced figures say so and are read over the three; the output is one call's."""
    from quack.rmsnorm import rmsnorm

    from fa4trace.analysis.passes import launch_passes, pass_traces, sourced_figures

    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, device="cuda", dtype=torch.float32)
    y_plain = rmsnorm(x, w)
    with fa4trace.instrument(passes=True, pass_launches=3) as rec:
        y = rmsnorm(x, w)
    assert torch.equal(y, y_plain)
    t = rec.launched[-1].trace()
    inst = t.meta["instrument"]
    ran = [(p["pass"], p["launches"]) for p in inst["passes"]]
    assert ran[0] == ("dense", 1) and ("lifetimes", 3) in ran and all(n == 3 for p, n in ran[1:]), ran
    names = launch_passes(t)
    assert [names.count(p) for p, _n in ran] == [n for _p, n in ran]
    assert all(ln["checked"] for ln in t.meta["launches"][1:]) and all(ln.get("l2") == "flushed"
                                                                       for ln in t.meta["launches"])
    s = sourced_figures(t)
    assert {p["pass"]: p["launches"] for p in s["passes"]} == dict(ran)
    assert len(pass_traces(t)["lifetimes"].info.launches) == 3 and "cta.median_ns" in s["figures"]
    path = t.save(tmp_path / "rmsnorm_passes3.parquet")
    r = subprocess.run([sys.executable, "-m", "fa4trace", "summary", str(path)], capture_output=True, text=True)
    assert r.returncode == 0 and "lifetimes 0 (3 launches)" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
