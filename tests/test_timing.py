"""fa4trace.run.timing's paired costs without a GPU: graphs stand in as plain callables, so the
pairing (each launch after a plain one), the rotated order and the medians are what is tested.
The CUDA side runs in tests/gpu/test_timing_gpu.py."""

from __future__ import annotations

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
