"""Every way a program reaches a CuTe DSL kernel, inside ``fa4trace.instrument()`` on the GPU (JIT:
the CuTe DSL, FA4 and quack installed where the GPU is), each called through its own torch API
with its caches warm: every kernel is traced, or named in the block's one stderr line — never
silent, never wrong — and after the block the program runs its plain kernels from the same caches."""

from __future__ import annotations

import functools
import os
import sys

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl where the GPU is (pip install 'fa4trace[dsl]')")
fa = pytest.importorskip("flash_attn.cute.interface", reason="needs flash-attn-4 (pip install 'fa4trace[fa4]')")
pytest.importorskip("quack.rmsnorm", reason="needs quack-kernels (pip install 'fa4trace[fa4]')")

import fa4trace  # noqa: E402
from fa4trace.auto.run import Instrumented  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))


def _first(o):
    return o[0] if isinstance(o, tuple) else o


def _names(rec) -> list[str]:
    return [k.meta["kernel"] for k in rec.launched]


def test_fa4_forward_backward_and_varlen_are_traced_and_right():
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
               for _ in range(3))
    lens = torch.tensor([0, 300, 1024, 2048], device="cuda", dtype=torch.int32)
    qv, kv, vv = (torch.randn(2048, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))

    def run():
        o = _first(fa.flash_attn_func(q, k, v, causal=True))
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
        ov = _first(fa.flash_attn_varlen_func(qv, kv, vv, cu_seqlens_q=lens, cu_seqlens_k=lens, max_seqlen_q=1024,
                                              max_seqlen_k=1024, causal=True))
        return o.detach(), dk, dv, ov

    want = run()
    with fa4trace.instrument() as rec:
        got = run()
    names = _names(rec)
    print("traced:", names, "unreached:", rec.unreached)
    assert any("Forward" in n for n in names) and any("Backward" in n for n in names)
    assert sum("Forward" in n for n in names) >= 1 and len(rec.launched) >= 4, names  # fwd, varlen fwd, bwd (+pre/post)
    assert rec.unreached == {}
    for w, x in zip(want, got):  # dq is accumulated in arrival order: not compared
        assert torch.equal(w, x)
    for kern in rec.launched:
        assert kern.checked and all(kern.checked), kern.meta["kernel"]


def test_quack_rmsnorm_cross_entropy_softmax_and_gemm_are_traced_and_right():
    from quack.cross_entropy import cross_entropy
    from quack.gemm_interface import gemm
    from quack.rmsnorm import rmsnorm
    from quack.softmax import softmax

    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.ones(4096, device="cuda", dtype=torch.float32)
    a = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, generator=g)
    tgt = torch.randint(0, 4096, (4096,), device="cuda", generator=g)

    def run():
        xr = x.clone().requires_grad_(True)
        y = rmsnorm(xr, w)
        (gx,) = torch.autograd.grad(y.float().square().mean(), (xr,))
        xs = x.clone().requires_grad_(True)
        s = softmax(xs)
        (gs,) = torch.autograd.grad(s, (xs,), torch.ones_like(s))
        xc = x.clone().requires_grad_(True)
        (gc,) = torch.autograd.grad(cross_entropy(xc, tgt), (xc,))
        return y.detach(), gx, s.detach(), gs, gc, gemm(a, b, tuned=False)

    want = run()
    with fa4trace.instrument() as rec:
        got = run()
    names = _names(rec)
    print("traced:", names, "unreached:", rec.unreached)
    for part in ("RMSNorm", "Softmax", "CrossEntropy", "Gemm"):
        assert any(part.lower() in n.lower() for n in names), (part, names)
    assert rec.unreached == {}
    for w_, x_ in zip(want, got):
        assert torch.equal(w_, x_)


def test_a_users_own_kernels_are_traced_where_cached_and_named_where_not(capfd):
    import user_kernels as uk

    x = torch.randn(128 * 64, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    local_kernel = uk.compile_scale(x, y)  # a local variable
    kernel_cache = {"scale": uk.compile_scale(x, y)}  # a dict named like a cache
    my_kernels = {"scale": uk.compile_scale(x, y)}  # a dict of its own, named otherwise

    @functools.lru_cache(maxsize=None)
    def cached_kernel(n):
        return uk.compile_scale(x, y)

    cached_kernel(x.numel())

    def from_cache():
        if "scale" not in kernel_cache:
            kernel_cache["scale"] = uk.compile_scale(x, y)
        return kernel_cache["scale"]

    capfd.readouterr()
    with fa4trace.instrument() as rec:
        for kern in (local_kernel, from_cache(), my_kernels["scale"], cached_kernel(x.numel())):
            y.zero_()
            kern(x, y)
            assert torch.equal(y, x * 2)
    err = capfd.readouterr().err
    print(err, rec.unreached, _names(rec))
    # the cache entry was taken out and compiled again, traced; the three others ran plain and are named
    assert len(rec.launched) == 1 and "scale" in rec.launched[0].meta["kernel"]
    assert sum(rec.unreached.values()) == 3, rec.unreached
    lines = [ln for ln in err.splitlines() if "could not reach" in ln]
    assert len(lines) == 1 and "3 kernel call(s)" in lines[0], err
    # after the block: every holder has the plain kernel it had
    assert not isinstance(kernel_cache["scale"], Instrumented) and not isinstance(my_kernels["scale"], Instrumented)
    # a dict the user names is a cache too
    with fa4trace.instrument(caches=[my_kernels]) as rec2:
        my_kernels.get("scale") or my_kernels.setdefault("scale", uk.compile_scale(x, y))
        kern = my_kernels["scale"]
        y.zero_()
        kern(x, y)
        assert torch.equal(y, x * 2)
    assert len(rec2.launched) == 1


def test_an_exception_inside_the_block_leaves_every_cache_as_it_was():
    q, k, v = (torch.randn(1, 512, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    want = _first(fa.flash_attn_func(q, k, v, causal=True))
    before = dict(fa._flash_attn_fwd.compile_cache.cache)
    with pytest.raises(ZeroDivisionError):
        with fa4trace.instrument():
            _first(fa.flash_attn_func(q, k, v, causal=True))
            1 / 0
    after = dict(fa._flash_attn_fwd.compile_cache.cache)
    assert list(after) == list(before) and all(after[key] is before[key] for key in before)
    assert not any(isinstance(val, Instrumented) for val in after.values())
    assert torch.equal(_first(fa.flash_attn_func(q, k, v, causal=True)), want)
