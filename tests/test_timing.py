"""fa4trace.run.timing's paired costs without a GPU: graphs stand in as plain callables, so the
pairing (each launch after a plain one), the rotated order and the medians are what is tested.
The CUDA side runs in tests/gpu/test_timing_gpu.py."""

from __future__ import annotations

from contextlib import nullcontext

import pytest

from fa4trace.run import timing


@pytest.fixture
def fake_gpu(monkeypatch):
    """A GPU whose clock slows 1% per replay (drift), replaying 'graphs' that are functions of it."""
    state = {"slow": 1.0, "order": []}

    def capture(launch, n_sets, per_graph):
        return launch

    def replay_us(g, replays, per_graph):
        state["slow"] *= 1.01
        return g(state)

    monkeypatch.setattr(timing, "_capture", capture)
    monkeypatch.setattr(timing, "_replay_us", replay_us)
    return state


def _launch(name: str, work: float):
    def g(state):
        state["order"].append(name)
        return work * state["slow"]

    return g


def test_each_launch_is_timed_right_after_a_plain_one_in_a_rotated_order(fake_gpu):
    got = timing.paired_costs(_launch("plain", 10.0), {"a": _launch("a", 10.0), "b": _launch("b", 20.0),
                                                        "c": _launch("c", 15.0)}, 2, 10, 8, 3)
    order = fake_gpu["order"]
    assert order[0::2] == ["plain"] * 9 and order[1::2] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    # the drift between a pair is one step (1%), not the run's (18 steps): the costs stay true
    assert got["a"][2] == pytest.approx(1.0, abs=1e-6) and got["b"][2] == pytest.approx(102.0, abs=1e-6)
    assert got["c"][2] == pytest.approx(51.5, abs=1e-6)
    assert got["b"][1] > got["b"][0] > 10.0  # medians of its own times and of the plain ones next to it


def test_no_traced_launch_times_nothing(fake_gpu):
    assert timing.paired_costs(_launch("plain", 1.0), {}, 1, 1, 1, 3) == {}
    assert fake_gpu["order"] == []


# ---- the plain twin (twin_times) on a fake GPU --------------------------------------------------
class FakeGPU:
    """Launches cost ``us`` each, times a clock that drifts ``drift`` per launch; ``_round_us``
    sums what each interval queued (the head's work is untimed). ``capture_fails``: graphs
    cannot be captured (the kernel launches somewhere a capture cannot follow)."""

    def __init__(self, drift=0.0, capture_fails=False, elsewhere=False):
        self.slow, self.drift, self.capture_fails, self.elsewhere = 1.0, drift, capture_fails, elsewhere
        self.pending = 0.0
        self.log: list = []  # ("capture", n) / ("interval", what ran) / ("head",)

    def launch(self, name, us):
        def run():
            self.pending += 0.0 if self.elsewhere else us * self.slow
            self.slow *= 1 + self.drift
            self.log.append(name)
        return run

    def capture(self, launch, n_sets, per_graph):
        if self.capture_fails:
            raise RuntimeError("operation not permitted when stream is capturing\ndetails")
        if self.elsewhere:
            raise timing.EmptyGraphError("the capture holds no launch")
        gpu = self

        class Graph:
            def replay(self):
                for _ in range(per_graph):
                    launch(0)

        self.log.append(("capture", per_graph))
        return Graph()

    def round_us(self, order, head):
        mark = len(self.log)
        head(order)
        self.log.insert(mark, ("head",))
        self.pending = 0.0
        out = []
        for enqueue in order:
            enqueue()
            out.append(self.pending)
            self.pending = 0.0
        return out


@pytest.fixture
def twin_gpu(monkeypatch):
    def make(**kw):
        gpu = FakeGPU(**kw)
        monkeypatch.setattr(timing, "_capture", gpu.capture)
        monkeypatch.setattr(timing, "_round_us", gpu.round_us)
        monkeypatch.setattr(timing, "_sleep_cycles_per_us", lambda: 1000.0)
        monkeypatch.setattr(timing, "_spin", lambda us, rate: gpu.log.append(("spin", us)))
        monkeypatch.setattr(timing, "_on_default_stream", lambda: gpu.log.append(("default stream",)) or nullcontext())
        monkeypatch.setattr(timing, "time", type("T", (), {"perf_counter": staticmethod(lambda: 0.0)}))
        import torch

        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
        return gpu

    return make


def test_the_twin_is_graph_timed_with_enough_launches_per_replay_and_interleaved(twin_gpu):
    gpu = twin_gpu()
    got = timing.twin_times(gpu.launch("P", 2.0), gpu.launch("T", 2.5), target_us=200, rounds=6)
    # the probe (4 launches at 2 µs) sizes a replay of 200 µs: 100 launches per graph
    assert [e for e in gpu.log if isinstance(e, tuple) and e[0] == "capture"] == [
        ("capture", 4), ("capture", 100), ("capture", 100)]
    assert got["method"] == "graph" and got["launches_per_replay"] == 100 and got["l2"] == "warm"
    assert got["plain_ns"] == pytest.approx(2000) and got["traced_ns"] == pytest.approx(2500)
    assert got["rel"] == pytest.approx(0.25) and got["noise_pct"] == pytest.approx(0) and got["rounds"] == 6
    # every timed round: a head (untimed), then outer / middle / outer, the order alternating
    rounds = []
    for e in gpu.log:
        if e == ("head",):
            rounds.append([])
        elif isinstance(e, str) and rounds:
            rounds[-1].append(e)
    timed = rounds[-6:]
    firsts = ["".join(dict.fromkeys(r[:1])) for r in timed]
    assert firsts == ["P", "T"] * 3


def test_a_drifting_clock_cancels_in_the_twin(twin_gpu):
    """The GPU slows 0.01% per launch (over a run, tens of %): plain and traced timed in the
    same round, the middle one against the mean of the outer two, keep the true ratio."""
    gpu = twin_gpu(drift=1e-4)
    got = timing.twin_times(gpu.launch("P", 10.0), gpu.launch("T", 11.0), target_us=200, rounds=9)
    assert gpu.slow > 1.05  # the drift over the run is far larger than the 10% to measure
    assert got["rel"] == pytest.approx(0.10, abs=2e-3) and got["noise_pct"] < 0.5


def test_a_kernel_that_cannot_be_captured_is_timed_in_batches_behind_a_spin(twin_gpu):
    gpu = twin_gpu(capture_fails=True)
    got = timing.twin_times(gpu.launch("P", 4.0), gpu.launch("T", 5.0), target_us=200, rounds=5)
    assert got["method"] == "batch" and got["launches_per_replay"] == 50
    assert got["rel"] == pytest.approx(0.25) and got["plain_ns"] == pytest.approx(4000)
    spins = [e for e in gpu.log if isinstance(e, tuple) and e[0] == "spin"]
    assert len(spins) >= 5  # one before every round (and the probes)


def test_the_batches_run_on_the_default_stream(twin_gpu):
    gpu = twin_gpu(capture_fails=True)
    timing.twin_times(gpu.launch("P", 4.0), gpu.launch("T", 5.0), target_us=200, rounds=5)
    assert gpu.log[0] == ("default stream",)  # before the first launch of the batch timing


def test_launches_on_a_stream_of_their_own_are_refused_not_timed_as_nothing(twin_gpu):
    """A kernel compiled without a stream argument launches on stream 0: a graph captured on
    torch's stream holds nothing, and events of a stream not ordered against it see nothing.
    Neither may read as a twin of 0 ns."""
    gpu = twin_gpu(elsewhere=True)
    with pytest.raises(timing.TwinTimingError) as e:
        timing.twin_times(gpu.launch("P", 4.0), gpu.launch("T", 5.0))
    msg = str(e.value)
    assert msg.startswith("graph: the capture holds no launch; batch: 8 launches took 0.00 µs of the timed stream")
    assert msg.endswith("they ran on a stream of their own") and "\n" not in msg


def test_an_empty_capture_is_refused_and_torchs_other_warnings_stay(monkeypatch):
    """``_capture`` itself: torch warns "The CUDA Graph is empty" at the end of a capture that
    holds nothing; that becomes EmptyGraphError (no warning reaches the program), and any
    other warning torch gave is warned again."""
    import contextlib
    import warnings

    import torch

    said = {"warn": []}

    class Graph:
        def replay(self):
            said["replayed"] = True

    @contextlib.contextmanager
    def graph(g, capture_error_mode=None):
        assert capture_error_mode == "thread_local"
        yield
        for w in said["warn"]:
            warnings.warn(w, UserWarning)

    class Stream:
        def wait_stream(self, other):
            pass

    for name, value in {"Stream": Stream, "current_stream": lambda: Stream(), "stream": lambda s: nullcontext(),
                        "synchronize": lambda: None, "CUDAGraph": Graph, "graph": graph}.items():
        monkeypatch.setattr(torch.cuda, name, value, raising=False)
    launched = []
    said["warn"] = ["The CUDA Graph is empty. This usually means that the graph was attempted to be captured on "
                    "wrong device or stream."]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with pytest.raises(timing.EmptyGraphError):
            timing._capture(lambda i: launched.append(i), 1, 4)
    assert not w and "replayed" not in said and len(launched) == 1 + 4
    said["warn"] = ["something else"]
    with pytest.warns(UserWarning, match="something else"):
        g = timing._capture(lambda i: launched.append(i), 1, 4)
    assert isinstance(g, Graph) and said["replayed"]


def test_when_no_method_works_the_error_names_both(twin_gpu):
    gpu = twin_gpu(capture_fails=True)

    def broken():
        raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS: boom")

    with pytest.raises(timing.TwinTimingError) as e:
        timing.twin_times(gpu.launch("P", 4.0), broken)
    assert "graph: operation not permitted when stream is capturing" in str(e.value)
    assert "batch: CUDA_ERROR_ILLEGAL_ADDRESS: boom" in str(e.value) and "\n" not in str(e.value)


def test_launches_per_interval_and_rounds_within_the_budget():
    assert timing.launches_for(2.0, 200, 1000) == 100
    assert timing.launches_for(0.05, 200, 1000) == 1000  # capped
    assert timing.launches_for(900.0, 200, 1000) == 1  # a long kernel: one launch an interval
    assert timing.launches_for(0.0) == timing.TWIN_MAX_LAUNCHES
    assert timing._rounds_for(200.0, 15, 1.0) == 15
    assert timing._rounds_for(100_000.0, 15, 1.0) == timing.TWIN_MIN_ROUNDS  # 100 ms intervals


def test_the_twin_is_timed_without_graphs_while_another_thread_runs():
    """A graph capture would fail another thread's synchronize: batches only then."""
    import threading

    from fa4trace.run.timing import twin_methods

    alone = ("graph", "batch") if threading.active_count() == 1 else ("batch",)  # pytest-xdist may run a thread
    assert twin_methods() == alone
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert twin_methods() == ("batch",)
    finally:
        stop.set()
        t.join()
    assert twin_methods() == alone
