"""fa4trace in the user's own PyTorch program, JIT on the GPU (the CuTe DSL, FA4 and quack
installed where the GPU is): kernels called through FA4's and quack's own torch APIs, with
their caches warm, under ``fa4trace.instrument()``.

Set FA4TRACE_GPU_OUT to keep the bundles written here (the viewer's CPU tests open them).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl where the GPU is (pip install 'fa4trace[dsl]')")
fa = pytest.importorskip("flash_attn.cute.interface", reason="needs flash-attn-4 (pip install 'fa4trace[fa4]')")
pytest.importorskip("quack.rmsnorm", reason="needs quack-kernels (pip install 'fa4trace[fa4]')")

import fa4trace  # noqa: E402
from fa4trace.analysis.fidelity import plain_twin  # noqa: E402
from fa4trace.auto.run import Instrumented  # noqa: E402
from fa4trace.trace.meta import BundleMeta  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def keep(path: Path) -> Path:
    out = os.environ.get("FA4TRACE_GPU_OUT")
    if out:
        dst = Path(out) / path.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(path.read_bytes())
    return path


def cached_values() -> list:
    """Everything FA4's and quack's caches hold now."""
    from quack import rmsnorm as qr

    vals = []
    for f in (fa._flash_attn_fwd, fa._flash_attn_bwd, fa._bwd_preprocess, fa._bwd_postprocess_convert):
        vals += list(f.compile_cache.cache.values())
    for name in dir(qr):
        c = getattr(getattr(qr, name), "cache", None)
        if isinstance(c, dict):
            vals += list(c.values())
    return vals


def qkv(b=2, s=1024, h=8, d=128, seed=0, grad=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(grad)
            for _ in range(3)]


def test_fa4_forward_from_a_warm_cache_is_traced_then_plain_again(tmp_path):
    q, k, v = qkv()
    o_plain = fa.flash_attn_func(q, k, v, causal=True)  # warm: FA4 compiled and cached it
    o_plain = o_plain[0] if isinstance(o_plain, tuple) else o_plain
    before = cached_values()
    with fa4trace.instrument() as rec:
        o = fa.flash_attn_func(q, k, v, causal=True)
        o = o[0] if isinstance(o, tuple) else o
    assert rec.hidden >= 1 and len(rec.launched) == 1, (rec.hidden, rec.kernels)
    assert torch.equal(o, o_plain)
    k0 = rec.launched[0]
    assert k0.checked == [True] and not k0.not_traced
    after = cached_values()
    assert [id(x) for x in after] == [id(x) for x in before] and not any(isinstance(x, Instrumented) for x in after)
    paths = rec.save(tmp_path / "fa4_fwd.parquet")
    t = fa4trace.load(keep(paths[0]))
    tw = plain_twin(BundleMeta.from_meta(t.meta))
    assert len(t) > 0 and tw is not None and tw["traced_ns"] > 0 and tw["plain_ns"] > 0, tw
    # after the block: the plain kernel, memory flat over 1,000 calls
    torch.cuda.synchronize()
    fa.flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
    gc.collect()
    m0 = torch.cuda.memory_allocated()
    for _ in range(1000):
        fa.flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
    gc.collect()
    assert torch.cuda.memory_allocated() <= m0 + (1 << 20)


class Block(torch.nn.Module):
    """rmsnorm (quack) -> qkv projection (quack's GEMM) -> FA4 attention -> out projection
    (quack's GEMM), forward and backward through FA4's and quack's own autograd functions."""

    def __init__(self, dim=1024, heads=8):
        super().__init__()
        self.heads = heads
        self.w_norm = torch.nn.Parameter(torch.ones(dim, device="cuda", dtype=torch.float32))
        self.w_qkv = torch.nn.Parameter(torch.randn(3 * dim, dim, device="cuda", dtype=torch.bfloat16) / dim ** 0.5)
        self.w_out = torch.nn.Parameter(torch.randn(dim, dim, device="cuda", dtype=torch.bfloat16) / dim ** 0.5)

    def forward(self, x):
        from quack.linear import linear_func
        from quack.rmsnorm import rmsnorm

        b, s, dim = x.shape
        h = rmsnorm(x.reshape(b * s, dim), self.w_norm)
        qkv_ = linear_func(h, self.w_qkv, tuned=False).reshape(b, s, 3, self.heads, dim // self.heads)
        o = fa.flash_attn_func(qkv_[:, :, 0], qkv_[:, :, 1], qkv_[:, :, 2], causal=True)
        o = o[0] if isinstance(o, tuple) else o
        return linear_func(o.reshape(b * s, dim), self.w_out, tuned=False).reshape(b, s, dim)


def step(model, x):
    model.zero_grad(set_to_none=True)
    xg = x.detach().clone().requires_grad_(True)
    model(xg).float().square().mean().backward()
    return {"x": xg.grad.clone(), **{n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}}


def test_training_step_traces_every_kernel_and_keeps_the_grads(tmp_path):
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(2, 1024, 1024, device="cuda", dtype=torch.bfloat16)
    g1, g2 = step(model, x), step(model, x)  # warm caches; which grads plain reproduces
    with fa4trace.instrument() as rec:
        g3 = step(model, x)
    names = [k.meta["kernel"] for k in rec.launched]
    print("traced:", names, "unreached:", rec.unreached)
    assert len(rec.launched) >= 5, names  # rmsnorm, GEMMs, FA4 forward, backward (+ pre/post)
    assert any("Backward" in n or "bwd" in n.lower() for n in names), names
    assert rec.unreached == {}
    for n in g3:
        if torch.equal(g1[n], g2[n]):
            assert torch.equal(g3[n], g1[n]), n
    for k in rec.launched:
        assert all(k.checked), (k.meta["kernel"], k.checked)
    n = len(rec.launched)
    paths = rec.save(tmp_path / "step.parquet")
    assert len(paths) == n
    for p in paths:
        keep(p)
        r = subprocess.run([sys.executable, "-m", "fa4trace", "summary", str(p)], capture_output=True, text=True)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    # after the block: the same grads as the plain steps, from the plain kernels
    g4 = step(model, x)
    for n in g4:
        if torch.equal(g1[n], g2[n]):
            assert torch.equal(g4[n], g1[n]), n


def test_fa4_backward_at_the_shared_memory_limit_falls_back_to_a_global_cursor(tmp_path, capfd):
    """b 2, s 2048, h 16, d 128, non-causal: FA4's SM90 backward takes all the shared memory a
    block may have (232,448 B), so its traced build with the shared-memory cursor cannot launch:
    fa4trace compiles it again with the cursor in global memory, says so in one line, and the
    launch is traced and checked."""
    q, k, v = qkv(b=2, s=2048, h=16, grad=True)
    o = fa.flash_attn_func(q, k, v)
    o = o[0] if isinstance(o, tuple) else o
    do = torch.randn_like(o)
    o.backward(do)  # warm
    with fa4trace.instrument() as rec:
        o = fa.flash_attn_func(q, k, v)
        o = o[0] if isinstance(o, tuple) else o
        o.backward(do)
    err = capfd.readouterr().err
    # the kernels this block launched (a block keeps those traced by earlier blocks of the
    # process too, fa4trace.auto.reuse: a backward of another shape among them did not launch)
    kinds = {k.meta["kernel"]: k for k in rec.kernels if k.launched}
    print({n: (k.meta.get("cursor"), k.meta.get("cursor_reason"), k.not_traced, sorted(k.nondeterministic))
           for n, k in kinds.items()})
    bwd = [k for n, k in kinds.items() if "Backward" in n and "Pre" not in n and "Post" not in n]
    assert bwd and bwd[0].launched and not bwd[0].not_traced
    assert bwd[0].checked and all(bwd[0].checked)
    t = bwd[0].trace()
    assert len(t) > 0
    inst = t.meta["instrument"]
    assert inst["cursor"] == "gmem", inst.get("cursor")
    assert "shared-memory cursor did not launch" in inst["cursor_reason"], inst["cursor_reason"]
    lines = [ln for ln in err.splitlines() if "shared-memory cursor" in ln]
    assert len(lines) == 1 and "global memory" in lines[0], err[-2000:]
    # the forward, far from the limit, kept the shared-memory cursor
    fwd = [k for n, k in kinds.items() if "Forward" in n]
    assert fwd and fwd[0].meta["cursor"] == "smem"
    keep(t.save(tmp_path / "fa4_bwd_limit.parquet"))


def test_a_traced_build_the_gpu_refuses_twice_runs_plain_and_says_so(capfd, monkeypatch):
    """The last fallback: where neither the shared-memory nor the global-memory traced build
    launches, the plain kernel runs, the result is the plain one, and one line names the kernel."""
    from fa4trace.auto import compiler

    # a sliding window: a forward no earlier test of this process compiled (a build traced by an
    # earlier block is kept for this one and would not compile again: fa4trace.auto.reuse)
    q, k, v = qkv(b=1, s=512, h=4)
    window = dict(window_size=(96, 0))
    want = fa.flash_attn_func(q, k, v, **window)
    want = want[0] if isinstance(want, tuple) else want

    def refuse(*a, **kw):
        raise RuntimeError("CUDA_ERROR_INVALID_VALUE: launch refused (forced by the test)")

    real = compiler.compile_traced

    def compile_refused(*a, **kw):
        c = real(*a, **kw)
        c.fn = refuse  # every traced build of this block: the GPU "refuses" it
        return c

    monkeypatch.setattr(compiler, "compile_traced", compile_refused)
    with fa4trace.instrument() as rec:
        o = fa.flash_attn_func(q, k, v, **window)
        o = o[0] if isinstance(o, tuple) else o
    monkeypatch.undo()
    assert torch.equal(o, want)
    err = capfd.readouterr().err
    # the forward this call compiled (kernels traced in an earlier block of this process are
    # kept for this one too: fa4trace.auto.reuse; they were not called here)
    fwd = [kk for kk in rec.kernels if "Forward" in kk.meta["kernel"] and kk.not_traced]
    assert len(fwd) == 1, [(kk.meta["kernel"], kk.not_traced) for kk in rec.kernels]
    assert fwd[0].not_traced.startswith("CUDA_ERROR_INVALID_VALUE") and not fwd[0].launched
    assert not rec.launched  # nothing ran traced
    lines = [ln for ln in err.splitlines() if "runs untraced" in ln]
    assert len(lines) == len([kk for kk in rec.kernels if kk.not_traced]) >= 1, err[-2000:]


def test_cluster_sampling_brings_whole_clusters():
    """quack's RMSNorm at N = 32768 runs 2-CTA clusters along y (grid (gx, 2)): CTA x and CTA
    x + gx are one cluster. A sample of 8 CTAs must be 4 whole clusters: for every recorded CTA
    its partner records too. (The grid's first 8 linear CTAs would be 8 halves of 8 clusters.)"""
    import numpy as np

    from quack.rmsnorm import rmsnorm

    x = torch.randn(4096, 32768, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(32768, device="cuda", dtype=torch.float32)
    rmsnorm(x, w)
    with fa4trace.instrument(ctas=8) as rec:
        rmsnorm(x, w)
    t = rec.launched[-1].trace()
    ctas = sorted(set(t.events.column("cta").to_pylist()))
    timed = np.asarray(t.meta["cta_lifetimes"]["cta"])  # every CTA of the launch (the region times all)
    n = int(timed.max()) + 1
    assert n % 2 == 0 and len(timed) == n, (n, len(timed))
    gx = n // 2
    assert len(ctas) == 8, ctas
    for c in ctas:
        partner = c + gx if c < gx else c - gx
        assert partner in ctas, (c, partner, ctas)
    assert sum(c < gx for c in ctas) == 4


def test_nondeterministic_outputs_are_named_not_reported_as_a_bug():
    """FA4's SM90 backward accumulates dQ with reduce-adds in arrival order: its dQ accumulator
    (mdQaccum) differs between two plain runs and is named, not compared; dK and dV are
    reproducible and checked bit for bit."""
    q, k, v = qkv(b=2, s=2048, h=16, grad=True)
    o = fa.flash_attn_func(q, k, v, causal=True)
    o = o[0] if isinstance(o, tuple) else o
    do = torch.randn_like(o)
    o.backward(do)
    with fa4trace.instrument() as rec:
        o = fa.flash_attn_func(q, k, v, causal=True)
        o = o[0] if isinstance(o, tuple) else o
        o.backward(do)
    bwd = [k for k in rec.launched if "Backward" in k.meta["kernel"] and "Pre" not in k.meta["kernel"]
           and "Post" not in k.meta["kernel"]]
    assert bwd, [k.meta["kernel"] for k in rec.launched]
    nd = sorted(bwd[0].nondeterministic)
    print("nondeterministic:", nd)
    assert "mdQaccum" in nd, nd
    assert not {"mdK", "mdV"} & set(nd), nd
    assert all(bwd[0].checked)
    t = bwd[0].trace()
    assert t.meta["instrument"]["nondeterministic"] == nd


def test_record_routes_without_builds(tmp_path):
    env = dict(os.environ)
    env.pop("FA4TRACE_BUILD", None)
    script = tmp_path / "attn.py"
    script.write_text("import torch\nfrom flash_attn.cute import flash_attn_func\n"
                      "q = torch.randn(1, 512, 4, 128, device='cuda', dtype=torch.bfloat16)\n"
                      "flash_attn_func(q, q, q, causal=True)\n")
    runs = {
        "ours": ["record", "--sk", "4096", "-o", str(tmp_path / "ours.parquet")],
        "fa4": ["record", "--impl", "fa4", "--schedule", "fa3", "--sk", "4096", "-o", str(tmp_path / "fa4.parquet")],
        "script": ["record", "--script", str(script), "-o", str(tmp_path / "script.parquet")],
    }
    for name, argv in runs.items():
        r = subprocess.run([sys.executable, "-m", "fa4trace", *argv], capture_output=True, text=True, env=env,
                           timeout=600)
        assert r.returncode == 0, (name, r.stdout[-2000:], r.stderr[-2000:])
        out = Path(argv[-1])
        assert out.is_file() and len(fa4trace.load(out)) > 0, name
        keep(out)


def _cutlass_example(name: str):
    d = os.environ.get("FA4TRACE_CUTLASS_EXAMPLES")
    path = Path(d) / name if d else None
    if path is None or not path.is_file():
        pytest.skip(f"set FA4TRACE_CUTLASS_EXAMPLES to a folder holding CUTLASS's Hopper example {name}")
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(name).stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("example", ["dense_gemm.py", "dense_gemm_persistent.py"])
def test_cutlass_hopper_examples_run_traced(example):
    """CUTLASS's own Hopper GEMM examples, run by their own run(): it compiles, checks the
    result against torch (inside the block: the traced kernel's result) and times it."""
    import cutlass

    mod = _cutlass_example(example)
    with fa4trace.instrument() as rec:
        mod.run(mnkl=(1024, 1024, 1024, 1), a_dtype=cutlass.Float16, b_dtype=cutlass.Float16,
                c_dtype=cutlass.Float16, acc_dtype=cutlass.Float32, a_major="k", b_major="k", c_major="n",
                tile_shape_mn=(128, 128), cluster_shape_mn=(1, 1), tolerance=1e-01, warmup_iterations=0,
                iterations=1, skip_ref_check=False)
    assert rec.launched, rec.kernels
    t = rec.launched[0].trace()
    names = set(t.events.column("name").to_pylist())
    print(example, len(t), sorted(names)[:12])
    assert len(t) > 0 and any(n.endswith(".wait") for n in names)
