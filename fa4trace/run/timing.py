"""Timing on the GPU for every benchmark: CUDA-graph replay with a cold L2.

A graph holds many launches that cycle through enough input sets to rotate ``L2_ROTATE_BYTES``
through L2, so consecutive launches read different data (cold L2), and each replay carries
about ``REPLAY_BYTES`` of traffic, so the graph's fixed cost per replay is spread thin. Each
replay is timed with CUDA events; the median per launch is reported.
"""

from __future__ import annotations

L2_ROTATE_BYTES = 256 << 20
# Each graph replay carries a fixed cost that the per-launch time takes a 1/launches share of
# (on the H200 an empty kernel read ~4 us per launch at 4 launches per replay, ~0.75 us at 64),
# so a replay holds enough launches for about REPLAY_BYTES of traffic (8..64 launches).
REPLAY_BYTES = 8 << 30


def launches_per_graph(set_bytes: int) -> tuple[int, int]:
    """(input sets, launches per graph) for one input set of ``set_bytes`` of KV: enough sets
    to rotate through L2_ROTATE_BYTES (1..64; consecutive launches read different sets, so L2
    is cold), and a multiple of them that makes each replay about REPLAY_BYTES of traffic
    (8..64 launches), so the replay's fixed cost is spread thin."""
    n_sets = max(1, min(64, -(-L2_ROTATE_BYTES // set_bytes)))
    want = max(8, min(64, -(-REPLAY_BYTES // set_bytes)))
    return n_sets, n_sets * -(-want // n_sets)


def cold_l2_inputs(shape, *, seed: int = 0, device: str = "cuda"):
    """Random (q, k, v, out) sets for timing a decode-attention ``shape`` (an
    ``attention.Shape``: b, sq, hq, hkv, sk, d, dtype, kv_bytes()) with a cold L2: as many sets
    as make up L2_ROTATE_BYTES of KV (1..64), and the launches per graph that cycle through them
    (``launches_per_graph``). Returns (sets, per_graph)."""
    import torch

    tdt = torch.bfloat16 if shape.dtype == "bf16" else torch.float16
    g = torch.Generator(device=device).manual_seed(seed)
    n_sets, per_graph = launches_per_graph(shape.kv_bytes())
    sets = []
    for _ in range(n_sets):
        q = torch.randn(shape.b, shape.sq, shape.hq, shape.d, dtype=tdt, device=device, generator=g)
        k = torch.randn(shape.b, shape.sk, shape.hkv, shape.d, dtype=tdt, device=device, generator=g)
        v = torch.randn(shape.b, shape.sk, shape.hkv, shape.d, dtype=tdt, device=device, generator=g)
        sets.append((q, k, v, torch.empty_like(q)))
    return sets, per_graph


def graph_time(launch, n_sets: int, replays: int, per_graph: int):
    """Median per-launch time (µs) of ``launch(i)`` over CUDA-graph replays.

    One graph holds ``per_graph`` launches cycling through the input sets (so consecutive
    launches read different KV: a cold L2); each replay is timed with events.
    """
    g = _capture(launch, n_sets, per_graph)
    times = _replay_times(g, replays, per_graph)
    med = times[len(times) // 2]
    spread = (times[int(0.9 * (len(times) - 1))] - times[int(0.1 * (len(times) - 1))]) / 2
    del g
    return med, spread


def _capture(launch, n_sets: int, per_graph: int):
    """A CUDA graph of ``per_graph`` launches of ``launch(i)`` cycling through the input sets,
    after a warm-up outside the graph (module load, workspaces)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(min(n_sets, 3)):
            launch(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for j in range(per_graph):
            launch(j % n_sets)
    g.replay()
    torch.cuda.synchronize()
    return g


def _replay_times(g, replays: int, per_graph: int) -> list[float]:
    """Per-launch times (µs, sorted) of ``replays`` replays of graph ``g``, each timed with
    CUDA events."""
    import torch

    times = []
    for _ in range(replays):
        a, b_ = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b_.record()
        b_.synchronize()
        times.append(a.elapsed_time(b_) * 1e3 / per_graph)
    return sorted(times)


def _replay_us(g, replays: int, per_graph: int) -> float:
    """Median per-launch time (µs) of ``replays`` timed replays of graph ``g``."""
    times = _replay_times(g, replays, per_graph)
    return times[len(times) // 2]


def paired_costs(plain, traced: dict, n_sets: int, replays: int, per_graph: int, rounds: int) -> dict:
    """Each traced launch's cost against the plain one timed right before it.

    ``plain`` and every value of ``traced`` are ``launch(i)`` callables (input set i). Each is
    captured once as a graph; every round times, for each traced launch in turn (the order
    rotated by one each round, so no launch always runs on a GPU warmed by the same neighbour),
    the plain graph and then the traced one. Clock and power drift over a run then moves both
    times of a pair alike. Returns {name: (plain µs, traced µs, cost %)}: the medians over the
    rounds of the plain times next to it, of its own times, and of the per-round ratios."""
    import statistics

    gp = _capture(plain, n_sets, per_graph)
    graphs = {name: _capture(fn, n_sets, per_graph) for name, fn in traced.items()}
    names = list(graphs)
    pairs = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            tp = _replay_us(gp, replays, per_graph)
            pairs[name].append((tp, _replay_us(graphs[name], replays, per_graph)))
    return {name: (statistics.median(p for p, _ in ps), statistics.median(t for _, t in ps),
                   100 * (statistics.median(t / p for p, t in ps) - 1)) for name, ps in pairs.items()}


def reported_us(rounds_us: list[float]) -> float:
    """The time a benchmark row reports from its passes (see bench_shape): the last of one or
    two, else the median of all but the first (the warm-up pass)."""
    import statistics

    if not rounds_us:
        raise ValueError("no timing passes")
    if len(rounds_us) < 3:
        return float(rounds_us[-1])
    return float(statistics.median(rounds_us[1:]))
