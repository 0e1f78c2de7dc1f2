"""Capture windows on the GPU: ``fa4trace.instrument(schedule=...)`` entered once around a loop
of FA4 and quack calls (JIT: the CuTe DSL, FA4 and quack installed where the GPU is).

Only the active steps run traced, each window's bundles are written by ``on_trace_ready``, the
second window compiles nothing, outputs equal plain in every step, and outside the windows
the caches hold the program's own kernel objects with nothing of fa4trace on their call path
(plain builds at plain speed). The same with a running torch.profiler.profile driving the
steps.

    python -m pytest -q tests/gpu/test_instrument_schedule_gpu.py
"""

from __future__ import annotations

import os
import sys

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl where the GPU is (pip install 'fa4trace[dsl]')")
fa = pytest.importorskip("flash_attn.cute.interface", reason="needs flash-attn-4 (pip install 'fa4trace[fa4]')")
qnorm = pytest.importorskip("quack.rmsnorm", reason="needs quack-kernels (pip install 'fa4trace[fa4]')")

import fa4trace  # noqa: E402
from fa4trace.auto import registry  # noqa: E402
from fa4trace.auto.schedule import schedule  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
from tiny_kernels import Made  # noqa: E402


def _fa4(q, k, v):
    o = fa.flash_attn_func(q, k, v, causal=True)
    return o[0] if isinstance(o, tuple) else o


@pytest.fixture(scope="module")
def step_inputs():
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(4096, device="cuda", dtype=torch.float32, generator=g)
    want = (_fa4(q, k, v), qnorm.rmsnorm(x, w))  # warm: compiled and cached plain
    torch.cuda.synchronize()
    return (q, k, v, x, w), want


def _step(inputs):
    q, k, v, x, w = inputs
    return _fa4(q, k, v), qnorm.rmsnorm(x, w)


def _cached_kernels() -> dict:
    """id(cache) -> (the cache, its kernel entries) of every cache holding a kernel now."""
    out = {}
    for d in registry.caches():
        kern = {k: v for k, v in list(d.items()) if registry.is_kernel(v)}
        if kern:
            out[id(d)] = (d, kern)
    return out


def _plain_path(before: dict) -> bool:
    """The caches hold the very kernel objects they held before, and no call of a compiled
    function goes through fa4trace."""
    from cutlass.base_dsl.jit_executor import JitCompiledFunction

    from fa4trace.auto.patches import subclasses

    same = all(d.get(k) is v for d, kern in before.values() for k, v in kern.items())
    wrapped = any(getattr(vars(c).get("__call__"), "__wrapped__", None) is not None
                  for c in subclasses(JitCompiledFunction))
    return same and not wrapped


def test_only_the_active_steps_trace_and_the_second_window_compiles_nothing(step_inputs, tmp_path):
    inputs, want = step_inputs
    before = _cached_kernels()
    assert before, "FA4's and quack's caches were not found"
    windows, plain_steps = [], []
    made = Made()

    def ready(rec):
        paths = rec.save(tmp_path / f"window{len(windows)}.parquet")
        windows.append((rec.step_num, made.n, [p.name for p in paths]))

    try:
        with fa4trace.instrument(schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
                                 on_trace_ready=ready) as rec:
            for step in range(9):
                out = _step(inputs)
                torch.cuda.synchronize()
                assert all(torch.equal(a, b) for a, b in zip(out, want)), step
                if step in (0, 4, 8):  # wait steps, and after the last window
                    plain_steps.append(_plain_path(before))
                rec.step()
    finally:
        made.close()
    print("windows:", windows)
    assert plain_steps == [True, True, True]
    assert [w[0] for w in windows] == [4, 8] and rec.windows == 2
    assert windows[1][1] == windows[0][1]  # no compiled function made in the second window
    assert len(windows[0][2]) >= 2 and windows[0][2] and windows[1][2]  # FA4's and quack's bundles, each window
    for name in windows[1][2]:
        t = fa4trace.load(tmp_path / name)
        assert len(t.meta["launches"]) == 2  # its two active steps, nothing from warm-up or wait steps
    assert _plain_path(before)


def test_a_running_torch_profiler_drives_the_windows(step_inputs, tmp_path):
    inputs, want = step_inputs
    seen = []
    sched = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    # acc_events: the windows read here are instrument()'s, not the profiler's events (torch warns
    # that a scheduled profiler without it clears them at each cycle end)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                                schedule=sched, acc_events=True) as prof:
        with fa4trace.instrument(schedule=prof) as rec:
            for _ in range(6):
                out = _step(inputs)
                torch.cuda.synchronize()
                assert all(torch.equal(a, b) for a, b in zip(out, want))
                seen.append(sum(len(k.trace().meta["launches"]) if k.launched else 0 for k in rec.kernels))
                prof.step()
    # launches recorded at each step (read and cleared each time): only in the profiler's active steps
    assert [n > 0 for n in seen] == [False, False, True, True, False, False], seen
    assert rec.windows == 1
