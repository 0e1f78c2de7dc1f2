"""Capture windows: ``fa4trace.instrument(schedule=...)`` entered once around a long loop traces
only the active steps, and a traced build is compiled once per process (CPU: tiny kernels
compiled for sm_90a; the steps, the caches and the compile counts, nothing launched)."""

from __future__ import annotations

import os
import sys

import pytest

from fa4trace.auto.schedule import Action, schedule
from fa4trace.format.errors import Fa4traceError


def test_the_schedule_is_torch_profilers():
    torch = pytest.importorskip("torch")
    import warnings

    for wait, warmup, active, repeat, skip_first in [(1, 1, 2, 2, 0), (0, 0, 1, 0, 0), (2, 0, 3, 1, 3), (0, 2, 1, 3, 1)]:
        ours = schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about warmup=0
            theirs = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat,
                                             skip_first=skip_first)
        assert [ours(n).name for n in range(40)] == [theirs(n).name for n in range(40)]


@pytest.mark.parametrize("kw", [dict(wait=-1, warmup=0, active=1), dict(wait=0, warmup=0, active=0),
                                dict(wait=0, warmup=0, active=1, repeat=1.5)])
def test_a_bad_schedule_is_one_line(kw):
    with pytest.raises(Fa4traceError, match="schedule: "):
        schedule(**kw)


@pytest.fixture
def dsl(monkeypatch):
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (pip install 'fa4trace[dsl]')")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools"))
    import tiny_kernels

    return tiny_kernels


class Library:
    """A library's cache: compiles on a miss (counted, with the step it happened at)."""

    def __init__(self, copy):
        self.copy, self.kernel_cache, self.misses = copy, {}, []
        self.step = None

    def get(self):
        if "k" not in self.kernel_cache:
            self.misses.append(self.step)
            self.kernel_cache["k"] = self.copy.compile()
        return self.kernel_cache["k"]


def _calls_wrapped() -> bool:
    """fa4trace's call counter is on the DSL's compiled functions (a window is open)."""
    from cutlass.base_dsl.jit_executor import JitCompiledFunction

    from fa4trace.auto.patches import subclasses

    return any(getattr(vars(c).get("__call__"), "__wrapped__", None) is not None for c in subclasses(JitCompiledFunction))


def test_only_the_active_steps_trace_and_the_second_window_compiles_nothing(dsl):
    import fa4trace

    lib = Library(dsl.Copy())
    plain = lib.get()
    seen, ready, served = [], [], set()
    made = dsl.Made()
    try:
        with fa4trace.instrument(families=(), schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
                                 on_trace_ready=lambda r: ready.append((r.step_num, made.n))) as rec:
            for step in range(10):
                lib.step = step
                k = lib.get()
                seen.append("plain" if k is plain and not _calls_wrapped() else
                            f"traced{'+' if k.active else '-'}" if type(k).__name__ == "Instrumented" else "other")
                served.add(k)
                rec.step()
    finally:
        made.close()
    assert seen == ["plain", "traced-", "traced+", "traced+", "plain", "traced-", "traced+", "traced+", "plain", "plain"]
    assert lib.misses == [None, 1]  # before the block, then once: in the first window's warm-up step
    first_window = ready[0][1]
    assert [s for s, _ in ready] == [4, 8] and ready[1][1] == first_window  # second window: 0 compiles
    traced = served - {plain}
    assert len(traced) == 1 and traced <= set(rec.kernels)  # one traced build served both windows
    assert rec.windows == 2 and not any(k.active for k in rec.kernels)
    assert lib.kernel_cache["k"] is plain


def test_a_later_block_with_the_same_options_reuses_the_traced_build(dsl):
    import fa4trace

    lib = Library(dsl.Copy())
    plain = lib.get()
    with fa4trace.instrument(families=()) as first:
        traced = lib.get()
    made = dsl.Made()
    try:
        with fa4trace.instrument(families=()) as second:
            again = lib.get()
        n_same, misses = made.n, list(lib.misses)
        with fa4trace.instrument(families=("barrier",)) as third:  # other options: another build
            other = lib.get()
    finally:
        made.close()
    # the second block: no compile, an Instrumented of its own around the same builds
    assert n_same == 0 and misses == [None, None]
    assert again is not traced and again.fn is traced.fn and again.plain is traced.plain
    assert traced in first.kernels and again in second.kernels and traced not in second.kernels
    assert other.fn is not traced.fn and made.n > 0 and other in third.kernels
    assert lib.kernel_cache["k"] is plain
    # nothing a finished recording launched is held for the next block: its Instrumented goes with it
    import gc
    import weakref

    gone = weakref.ref(traced)
    del traced, first
    gc.collect()
    assert gone() is None
    # forget(): the kept builds go, the next block compiles again
    from fa4trace.auto import reuse

    assert reuse.forget() >= 2
    with fa4trace.instrument(families=()):
        lib.get()
    assert len(lib.misses) == len(misses) + 2


def test_a_running_torch_profiler_steps_the_block(dsl):
    torch = pytest.importorskip("torch")
    import fa4trace

    lib = Library(dsl.Copy())
    plain = lib.get()
    seen = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)) as prof:
        with fa4trace.instrument(families=(), schedule=prof) as rec:
            with pytest.raises(Fa4traceError, match="torch.profiler"):
                rec.step()
            for step in range(6):
                lib.step = step
                k = lib.get()
                seen.append((rec.step_num, "plain" if k is plain else f"traced{'+' if k.active else '-'}"))
                prof.step()
        assert "step" not in vars(prof)  # its own step() again
    assert seen == [(0, "plain"), (1, "traced-"), (2, "traced+"), (3, "traced+"), (4, "plain"), (5, "plain")]
    assert rec.windows == 1 and lib.misses == [None, 1]


def test_the_step_actions_accept_torchs():
    torch = pytest.importorskip("torch")
    from fa4trace.auto.schedule import as_action

    assert as_action(torch.profiler.ProfilerAction.RECORD_AND_SAVE) is Action.RECORD_AND_SAVE
    with pytest.raises(Fa4traceError, match="a schedule returned"):
        as_action("record")


def test_on_trace_ready_is_called_for_windows_that_had_active_steps_only(dsl):
    import fa4trace

    ready = []
    with fa4trace.instrument(families=(), schedule=schedule(wait=0, warmup=2, active=1),
                             on_trace_ready=ready.append) as rec:
        rec.step()  # the block ends in the window's second warm-up step
    assert ready == [] and rec.windows == 0
    with fa4trace.instrument(families=(), on_trace_ready=ready.append) as rec:  # no schedule: one window
        pass
    assert ready == [rec] and rec.windows == 1
