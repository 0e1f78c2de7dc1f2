"""Threads and ``fa4trace.instrument()`` (CPU: kernels compiled for sm_90a, nothing launched).

The block is the process's: a kernel another thread compiles while it is open is traced into
the same recording; compiles run one at a time (the DSL traces one kernel at a time and the
hooks of a traced compile are process-wide); the block ends only after a compile in flight
on another thread has finished, and compiles after it are plain.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (pip install 'fa4trace[dsl]')")

import cutlass.cute as cute  # noqa: E402  (module-level: the kernels' annotations name it)

import fa4trace  # noqa: E402
from fa4trace.auto.run import Instrumented  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "tools"))
import auto_probe  # noqa: E402
from tiny_kernels import fake  # noqa: E402


@pytest.fixture(autouse=True)
def sm90(monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")


def traced_while(at_trace):
    """A copy kernel that calls ``at_trace()`` each time the DSL traces its body (Python runs
    then: the DSL traces Python)."""

    @cute.kernel
    def copy_kernel(src: cute.Tensor, dst: cute.Tensor):
        at_trace()
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * 128 + tidx
        dst[i] = src[i]

    @cute.jit
    def copy_entry(src: cute.Tensor, dst: cute.Tensor):
        copy_kernel(src, dst).launch(grid=(src.shape[0] // 128, 1, 1), block=(128, 1, 1))

    return copy_entry


def test_a_second_thread_compiles_into_the_same_recording_one_compile_at_a_time():
    log = []

    def at_trace():
        log.append(("in", threading.get_ident()))
        time.sleep(0.05)  # long enough for the other thread to get in, were it let in
        log.append(("out", threading.get_ident()))

    entries = [traced_while(at_trace), traced_while(at_trace)]
    before = auto_probe.originals()
    got, errors = {}, []

    def other():
        try:
            got["other"] = cute.compile(entries[1], fake(), fake())
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    with fa4trace.instrument(families=("barrier",)) as rec:
        t = threading.Thread(target=other)
        t.start()
        got["main"] = cute.compile(entries[0], fake(), fake())
        t.join()
    assert not errors, errors
    assert all(isinstance(k, Instrumented) for k in got.values())
    assert all(k in rec.kernels for k in got.values())
    threads = {tid for _, tid in log}
    assert len(threads) == 2
    for a, b in zip(log[::2], log[1::2]):  # every trace of a body ends before another begins
        assert a[0] == "in" and b == ("out", a[1]), log
    assert auto_probe.originals() == before  # the hooks of both traced compiles are out


def test_the_block_ends_after_a_compile_in_flight_on_another_thread():
    started, proceed, done = threading.Event(), threading.Event(), {}

    def at_trace():
        started.set()
        proceed.wait(30)

    entry = traced_while(at_trace)
    quick = traced_while(lambda: None)

    def other():
        done["kernel"] = cute.compile(entry, fake(), fake())

    with fa4trace.instrument(families=()) as rec:
        t = threading.Thread(target=other)
        t.start()
        assert started.wait(60)
        threading.Timer(0.5, proceed.set).start()
        leaving = time.monotonic()
    ended = time.monotonic()
    t.join()
    assert ended - leaving >= 0.45  # the block's end waited for the compile in flight
    assert isinstance(done["kernel"], Instrumented)
    assert done["kernel"] in rec.kernels and not done["kernel"].active  # compiled inside: runs plain now
    assert not isinstance(cute.compile(quick, fake(), fake()), Instrumented)
