"""Threads and ``fa4trace.instrument()`` on the GPU (JIT: the CuTe DSL, FA4 and quack installed
where the GPU is, called through their own torch APIs, caches warm before the block).

The block is the process's (docs/instrument.md, "Threads"): a second thread that calls quack
while the main thread runs FA4 inside the block is traced into the same recording, each
traced launch checked bit for bit against the plain kernel; a thread still calling when the
block ends gets right results on either side of it, and plain kernels after it.

    python -m pytest -q tests/gpu/test_instrument_threads_gpu.py
"""

from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl where the GPU is (pip install 'fa4trace[dsl]')")
fa = pytest.importorskip("flash_attn.cute.interface", reason="needs flash-attn-4 (pip install 'fa4trace[fa4]')")
qnorm = pytest.importorskip("quack.rmsnorm", reason="needs quack-kernels (pip install 'fa4trace[fa4]')")

import fa4trace  # noqa: E402


def _fa4(q, k, v):
    o = fa.flash_attn_func(q, k, v, causal=True)
    return o[0] if isinstance(o, tuple) else o


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(4096, device="cuda", dtype=torch.float32, generator=g)
    want_o, want_y = _fa4(q, k, v), qnorm.rmsnorm(x, w)  # warm: both compiled and cached plain
    torch.cuda.synchronize()
    return q, k, v, x, w, want_o, want_y


def test_a_second_thread_calling_quack_is_traced_into_the_same_recording(inputs):
    q, k, v, x, w, want_o, want_y = inputs
    together = threading.Barrier(2, timeout=120)
    ys, errors = [], []

    def other():
        try:
            together.wait()
            for _ in range(3):
                ys.append(qnorm.rmsnorm(x, w))
            torch.cuda.synchronize()
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    with fa4trace.instrument() as rec:
        t = threading.Thread(target=other)
        t.start()
        together.wait()
        outs = [_fa4(q, k, v) for _ in range(3)]
        t.join(600)
        torch.cuda.synchronize()
    assert not errors, errors
    assert all(torch.equal(o, want_o) for o in outs) and len(ys) == 3 and all(torch.equal(y, want_y) for y in ys)
    names = [kk.meta["kernel"].lower() for kk in rec.launched]
    print("traced:", names, "unreached:", rec.unreached)
    assert any("rmsnorm" in n for n in names), names  # launched from the other thread
    assert any("flash" in n for n in names), names
    for kk in rec.launched:
        assert kk.checked and all(kk.checked), (kk.meta["kernel"], kk.checked)
        assert kk.trace().events.num_rows > 0
    assert torch.equal(_fa4(q, k, v), want_o) and torch.equal(qnorm.rmsnorm(x, w), want_y)  # plain after


def test_a_thread_calling_across_the_blocks_end_gets_right_results_on_both_sides(inputs):
    q, k, v, x, w, want_o, want_y = inputs
    stop, calls, errors = threading.Event(), [], []

    def other():
        try:
            while not stop.is_set():
                y = qnorm.rmsnorm(x, w)
                torch.cuda.synchronize()
                calls.append(torch.equal(y, want_y))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    try:
        with fa4trace.instrument():
            for _ in range(3):
                assert torch.equal(_fa4(q, k, v), want_o)
        n_at_end = len(calls)
        while len(calls) < n_at_end + 3 and t.is_alive():  # a few calls after the block
            stop.wait(0.01)
    finally:
        stop.set()
        t.join(600)
    assert not errors, errors
    assert calls and all(calls)
    from fa4trace.auto import block

    assert block.open_block() is None
