"""``fa4trace.instrument()`` never crashes the program it traces (JIT on the GPU: the CuTe DSL,
FA4 and quack installed where the GPU is, called through their own torch APIs, caches warm).

- a training step whose loss is a mean hands quack's cross-entropy backward a broadcast
  gradient (stride 0): the output check must not write through that overlap;
- a CUDA graph captured inside the block: no host-to-device copy while the stream captures,
  the replays inside and after the block give the plain results, and the traced launch's
  buffer stays allocated for the graph (its replays after the block fill it).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl where the GPU is (pip install 'fa4trace[dsl]')")
fa = pytest.importorskip("flash_attn.cute.interface", reason="needs flash-attn-4 (pip install 'fa4trace[fa4]')")
ce = pytest.importorskip("quack.cross_entropy", reason="needs quack-kernels (pip install 'fa4trace[fa4]')")

import fa4trace  # noqa: E402
from fa4trace.auto import run as auto_run  # noqa: E402


def _ce_step(x, target):
    xg = x.detach().clone().requires_grad_(True)
    loss = ce.cross_entropy(xg, target)  # reduction "mean": backward gets an expanded scalar
    loss.backward()
    return loss.detach().clone(), xg.grad.clone()


def test_a_mean_reduced_loss_through_quack_cross_entropy_steps_inside_the_block():
    torch.manual_seed(0)
    x = torch.randn(4096, 8192, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, 8192, (4096,), device="cuda")
    plain = [_ce_step(x, target) for _ in range(2)]  # warm caches; what plain reproduces
    for _block in range(2):  # two blocks of two steps, as a training loop would
        with fa4trace.instrument() as rec:
            traced = [_ce_step(x, target) for _ in range(2)]
        names = [k.meta["kernel"] for k in rec.launched]
        print("traced:", names, "nondeterministic:", {k.meta["kernel"]: sorted(k.nondeterministic)
                                                      for k in rec.launched})
        assert any("Backward" in n or "bwd" in n.lower() for n in names), names
        for k in rec.launched:
            assert k.checked and all(k.checked), (k.meta["kernel"], k.checked)
        for (l0, g0), (l1, g1) in zip(plain, traced):
            assert torch.equal(l0, l1) and torch.equal(g0, g1)
    after = _ce_step(x, target)
    assert torch.equal(after[1], plain[0][1])


def _fa4(q, k, v):
    o = fa.flash_attn_func(q, k, v, causal=True)
    return o[0] if isinstance(o, tuple) else o


def test_a_cuda_graph_captured_inside_the_block_replays_right_inside_and_after_it(tmp_path):
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    q2 = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16, generator=g)
    want1, want2 = _fa4(q, k, v), _fa4(q2, k, v)  # warm: FA4 compiled and cached plain
    kept = len(auto_run.GRAPH_BUFFERS)
    with fa4trace.instrument() as rec:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # torch's warm-up before a capture: the traced build runs eagerly
            _fa4(q, k, v)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        static_q = q.clone()
        with torch.cuda.graph(graph):
            out = _fa4(static_q, k, v)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want1)
    assert len(auto_run.GRAPH_BUFFERS) == kept + 1  # the captured launch's buffer, kept for the graph
    buf = auto_run.GRAPH_BUFFERS[-1]
    launched = rec.launched[0]
    assert [r.info.get("captured", False) for r in launched._launches] == [False, True]
    t = launched.trace()
    assert set(t.events.column("launch").to_pylist()) == {0, 1}  # the eager launch and the graph's replay
    # after the block: the graph replays with new inputs, right, and still fills its own buffer
    buf.zero_()
    static_q.copy_(q2)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want2)
    from fa4trace.format.layout import BUF_MAGIC

    words = buf.cpu().numpy()
    assert int(words[0]) & 0xFFFFFFFF == BUF_MAGIC and (words[8:] != 0).any()
    # and a plain call after the block is plain again
    assert torch.equal(_fa4(q2, k, v), want2)
    del graph


def test_a_capture_before_the_kernel_ran_in_the_block_runs_plain_and_says_so(capfd):
    g = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (torch.randn(1, 512, 4, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    want = _fa4(q, k, v)
    with fa4trace.instrument() as rec:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _fa4(q, k, v)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, want)
    # a build that had not launched eagerly in this process is captured plain, and one line says so;
    # one that had (an earlier block compiled and ran it: traced builds are reused) is captured traced.
    # The block also lists builds of earlier blocks it reused but did not call: only the called count.
    called = [kk for kk in rec.kernels if kk.captured_plain or kk.launched]
    assert called, "the captured FA4 call reached no instrumented kernel"
    err = capfd.readouterr().err
    for kk in called:
        if kk.captured_plain:
            assert not kk.launched_ok and not kk.launched
            assert "captured into a CUDA graph ran plain" in err
        else:
            assert kk.launched_ok and all(r.info.get("captured") for r in kk._launches)
