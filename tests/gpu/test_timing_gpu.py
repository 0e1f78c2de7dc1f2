"""fa4trace.run.timing on a real GPU: CUDA-graph replay times, and the paired costs the cost
benchmarks (benchmarks/fa4_cost_parts.py) report. Needs a CUDA GPU and torch; skips otherwise."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _matmuls(n: int, repeat: int):
    """launch(i): ``repeat`` n x n matmuls on input set i (two sets)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    sets = [(torch.randn(n, n, device="cuda", generator=g), torch.empty(n, n, device="cuda")) for _ in range(2)]

    def launch(i):
        a, out = sets[i]
        for _ in range(repeat):
            torch.matmul(a, a, out=out)

    return launch


def test_graph_time_is_per_launch_and_grows_with_the_work():
    from fa4trace.run.timing import graph_time

    one, spread = graph_time(_matmuls(1024, 1), 2, 10, 8)
    four, _ = graph_time(_matmuls(1024, 4), 2, 10, 8)
    assert 0 < spread < one and 3.0 < four / one < 5.0, (one, four, spread)


def test_paired_costs_time_each_launch_against_the_plain_one_right_before_it():
    from fa4trace.run.timing import paired_costs

    plain = _matmuls(1024, 2)
    got = paired_costs(plain, {"same": _matmuls(1024, 2), "double": _matmuls(1024, 4)}, 2, 10, 8, 4)
    assert set(got) == {"same", "double"}
    same_p, same_t, same_pct = got["same"]
    dbl_p, dbl_t, dbl_pct = got["double"]
    assert abs(same_pct) < 5.0 and 0.9 < same_t / same_p < 1.1, got  # the same work: no cost
    assert 80.0 < dbl_pct < 120.0 and dbl_t > dbl_p, got  # twice the work: +100%
