"""Timing on the GPU: CUDA-graph replay for every benchmark, and a traced launch's plain twin.

Benchmarks (cold L2): a graph holds many launches that cycle through enough input sets to
rotate ``L2_ROTATE_BYTES`` through L2, so consecutive launches read different data, and each
replay carries about ``REPLAY_BYTES`` of traffic, so the graph's fixed cost per replay is
spread thin. Each replay is timed with CUDA events; the median per launch is reported.

The plain twin (``twin_times``, warm L2: fa4trace.instrument times a traced launch against its
plain build on the program's own arguments, the same inputs back to back): each build is
captured as one graph of n launches (n makes a replay about ``TWIN_TARGET_US`` long), and the
two replays alternate over rounds, every interval timed on the device between events that
follow work already queued (the GPU never waits for the host inside one). Where a kernel
cannot be captured, or its capture holds nothing (compiled without a stream argument, it
launches on stream 0), n back-to-back launches per interval take the graph's place, behind a
spin kernel long enough for the host to queue them all, on the legacy default stream;
batches only, while other Python threads run (``twin_methods``: a capture would fail their
CUDA calls). A timing that sees no launch is refused, never reported.
"""

from __future__ import annotations

import statistics
import time
import warnings
from typing import Callable

L2_ROTATE_BYTES = 256 << 20
# Each graph replay carries a fixed cost that the per-launch time takes a 1/launches share of
# (what an empty kernel reads: docs/decode-attention.md, "How a kernel is timed"), so a replay
# holds enough launches for about REPLAY_BYTES of traffic (8..64 launches).
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


EMPTY_GRAPH = "The CUDA Graph is empty"  # what torch warns at the end of a capture that holds nothing
MIN_LAUNCH_US = 0.5  # device time per launch, between events on its stream, below which none was seen


class LaunchNotSeenError(RuntimeError):
    """Launches queued between two events of the timed stream added no time to it: they ran on
    a stream not ordered against it (its events would time nothing)."""


class EmptyGraphError(RuntimeError):
    """A capture held no launch: the callable queued its work on a stream other than the one
    captured (a kernel without a stream argument launches on its own), so replaying the graph
    would time nothing."""


def _capture(launch, n_sets: int, per_graph: int):
    """A CUDA graph of ``per_graph`` launches of ``launch(i)`` cycling through the input sets,
    after a warm-up outside the graph (module load, workspaces). ``EmptyGraphError`` where the
    capture holds nothing (the launches ran outside it): a graph that times nothing is refused,
    and the twin's batch timing takes its place."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(min(n_sets, 3)):
            launch(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    # thread-local capture: only this thread's calls are checked against the capture (the
    # default, global mode, refuses those of every thread); another thread's device-wide
    # synchronize still fails during a capture, so the plain twin takes no graph while other
    # threads run (twin_methods)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            for j in range(per_graph):
                launch(j % n_sets)
    if any(EMPTY_GRAPH in str(w.message) for w in said):
        raise EmptyGraphError("the capture holds no launch: the kernel runs on a stream of its own, not the one "
                              "captured")
    for w in said:  # what else torch said stays said
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
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
    if not rounds_us:
        raise ValueError("no timing passes")
    if len(rounds_us) < 3:
        return float(rounds_us[-1])
    return float(statistics.median(rounds_us[1:]))


# ---- the plain twin ------------------------------------------------------------------------------
TWIN_TARGET_US = 200.0  # device time of one timed interval (a replay of n launches), so its edges weigh little
TWIN_MAX_LAUNCHES = 1000  # launches per interval at most (a kernel of a few hundred ns)
TWIN_ROUNDS = 15  # rounds of (plain, traced, plain) or (traced, plain, traced)
TWIN_BUDGET_S = 1.0  # device time the rounds may take; fewer rounds (not below TWIN_MIN_ROUNDS) past it
TWIN_MIN_ROUNDS = 5
TWIN_PROBE = 4  # launches of the probe that sizes n


class TwinTimingError(RuntimeError):
    """Neither way of timing the twin worked (the message says why, per method)."""


def launches_for(per_launch_us: float, target_us: float = TWIN_TARGET_US, cap: int = TWIN_MAX_LAUNCHES) -> int:
    """Launches per timed interval: enough for ``target_us`` at ``per_launch_us`` each, 1..cap."""
    if not per_launch_us or per_launch_us <= 0:
        return cap
    return max(1, min(cap, -(-int(target_us * 1000) // max(1, int(per_launch_us * 1000)))))


def twin_times(plain: Callable[[], None], traced: Callable[[], None], *, target_us: float = TWIN_TARGET_US,
               max_launches: int = TWIN_MAX_LAUNCHES, rounds: int = TWIN_ROUNDS,
               budget_s: float = TWIN_BUDGET_S) -> dict:
    """A traced launch against its plain build, timed on the device, warm L2.

    ``plain()`` and ``traced()`` each queue one launch on torch's current stream, on the same
    inputs every time. CUDA graphs of n launches each ("graph"); where capture fails, n
    back-to-back launches behind a spin kernel ("batch"); where that fails too,
    ``TwinTimingError`` names both reasons. Rounds alternate (plain, traced, plain) and
    (traced, plain, traced); each round's ratio sets the middle interval against the mean of
    the outer two, so a linear drift of the clocks cancels. Returns plain_ns and traced_ns
    (medians per launch), rel (the median ratio - 1), noise_pct (half the p10-p90 spread of
    the per-round ratios, in points: how far rel may be off), same_pct (the median difference
    between the outer two intervals of a round, one build against itself, %), method,
    launches_per_replay, rounds and l2 ("warm")."""
    errors = []
    methods = {"graph": _graph_twin, "batch": _batch_twin}
    for name in twin_methods():
        method = methods[name]
        try:
            return method(plain, traced, target_us, max_launches, rounds, budget_s)
        except Exception as exc:  # noqa: BLE001 (the DSL, tvm-ffi and CUDA raise their own types)
            msg = str(exc).strip().splitlines()
            errors.append(f"{name}: {msg[0][:160] if msg else type(exc).__name__}")
    raise TwinTimingError("; ".join(errors))


def twin_methods() -> tuple[str, ...]:
    """The twin timings to try, in order: CUDA graphs, then batches of launches; batches only
    while other Python threads run, since a graph capture makes another thread's synchronize
    (or launch on the legacy default stream) fail with "operation not permitted when stream is
    capturing" (fa4trace.instrument() must not break a thread it does not trace)."""
    import threading

    return ("graph", "batch") if threading.active_count() == 1 else ("batch",)


def _round_us(order: list, head: Callable[[list], None]) -> list[float]:
    """Device time (µs) of each of ``order``'s callables, queued back to back after
    ``head(order)`` (work that keeps the GPU busy while the host queues them), each between
    two events; one wait at the end."""
    import torch

    ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(order) + 1)]
    head(order)
    ev[0].record()
    for i, enqueue in enumerate(order):
        enqueue()
        ev[i + 1].record()
    ev[-1].synchronize()
    return [1e3 * ev[i].elapsed_time(ev[i + 1]) for i in range(len(order))]


def _rounds_for(replay_us: float, rounds: int, budget_s: float) -> int:
    """``rounds``, fewer where four intervals a round would take more than ``budget_s``."""
    fit = int(budget_s * 1e6 / max(4 * replay_us, 1e-3))
    return max(TWIN_MIN_ROUNDS, min(rounds, fit))


def _interleaved(plain_n: Callable, traced_n: Callable, head: Callable, n: int, rounds: int, method: str) -> dict:
    """The rounds of ``twin_times`` over two interval callables (each queues n launches)."""
    plain_t, traced_t, ratios, same = [], [], [], []
    for r in range(rounds):
        outer, middle = (plain_n, traced_n) if r % 2 == 0 else (traced_n, plain_n)
        a, b, c = _round_us([outer, middle, outer], head)
        p, t = ((a + c) / 2, b) if r % 2 == 0 else (b, (a + c) / 2)
        plain_t.append(p)
        traced_t.append(t)
        ratios.append(t / p)
        same.append(abs(c / a - 1))
    lo, hi = _p10_p90(ratios)
    return {"plain_ns": 1e3 * statistics.median(plain_t) / n, "traced_ns": 1e3 * statistics.median(traced_t) / n,
            "rel": statistics.median(ratios) - 1, "noise_pct": 50 * (hi - lo), "same_pct": 100 * statistics.median(same),
            "method": method, "launches_per_replay": n, "rounds": rounds, "l2": "warm"}


def _p10_p90(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=10, method="inclusive")
    return q[0], q[-1]


def _graph_twin(plain, traced, target_us, max_launches, rounds, budget_s) -> dict:
    """``twin_times`` with each build captured as one CUDA graph of n launches (``_capture``:
    a warm-up outside the graph first). A probe graph of TWIN_PROBE plain launches sizes n."""
    probe = _capture(lambda i: plain(), 1, TWIN_PROBE)

    def replay_first(order):  # the first interval's own replay, untimed: the GPU is busy meanwhile
        order[0]()

    per_us = statistics.median(_round_us([probe.replay], replay_first)[0] for _ in range(3)) / TWIN_PROBE
    n = launches_for(per_us, target_us, max_launches)
    gp = probe if n == TWIN_PROBE else _capture(lambda i: plain(), 1, n)
    del probe
    gt = _capture(lambda i: traced(), 1, n)
    try:
        return _interleaved(gp.replay, gt.replay, replay_first, n, _rounds_for(n * per_us, rounds, budget_s), "graph")
    finally:
        del gp, gt


def _sleep_cycles_per_us() -> float:
    """How many cycles of ``torch.cuda._sleep`` (a spin kernel) last one µs on this GPU."""
    import torch

    torch.cuda._sleep(1000)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(1_000_000)
    b.record()
    b.synchronize()
    return 1e6 / max(1e3 * a.elapsed_time(b), 1e-3)


def _spin(us: float, cycles_per_us: float) -> None:
    """Keep the GPU busy for about ``us`` (a spin kernel on the current stream)."""
    import torch

    torch.cuda._sleep(max(1, int(us * cycles_per_us)))


def _probe_head(cycles_per_us: float) -> Callable[[list], None]:
    """What a probe's interval is queued behind: a 2 ms spin."""
    return lambda order: _spin(2000.0, cycles_per_us)


def _empty_us(cycles_per_us: float) -> float:
    """Device time of a probe's interval that holds no launch: what ``_batch_probe`` sets its
    launches' time against."""
    (empty,) = _round_us([lambda: None], _probe_head(cycles_per_us))
    return empty


def _batch_probe(launch: Callable, cycles_per_us: float, empty_us: float, k: int = 8) -> tuple[float, float]:
    """(host µs to queue one launch, device µs per launch) from ``k`` launches queued behind a
    2 ms spin; ``LaunchNotSeenError`` where they add less than ``MIN_LAUNCH_US`` each to
    ``empty_us`` (``_empty_us``)."""
    holder = {}

    def batch():
        t0 = time.perf_counter()
        for _ in range(k):
            launch()
        holder["host"] = (time.perf_counter() - t0) * 1e6 / k

    (dev,) = _round_us([batch], _probe_head(cycles_per_us))
    if dev - empty_us < MIN_LAUNCH_US * k:
        raise LaunchNotSeenError(f"{k} launches took {dev - empty_us:.2f} µs of the timed stream beyond none: they "
                                 "ran on a stream of their own")
    return holder["host"], dev / k


def _batch_twin(plain, traced, target_us, max_launches, rounds, budget_s) -> dict:
    """``twin_times`` with n back-to-back launches per interval, queued behind a spin kernel
    that lasts longer than the host takes to queue a whole round (1.5 x the probes' longer host
    time per launch x 3n, + 50 µs), so no interval waits for the host."""
    with _on_default_stream():
        return _batch_rounds(plain, traced, target_us, max_launches, rounds, budget_s)


def _on_default_stream():
    """torch's legacy default stream made current (a context manager): a kernel compiled
    without a stream argument launches there, and a launch on any blocking stream is ordered
    against it, so events recorded there bracket both."""
    import torch

    return torch.cuda.stream(torch.cuda.default_stream())


def _batch_rounds(plain, traced, target_us, max_launches, rounds, budget_s) -> dict:
    """``_batch_twin``'s probes and rounds, on whatever stream is current."""
    import torch

    plain()
    traced()
    torch.cuda.synchronize()
    rate = _sleep_cycles_per_us()
    empty = _empty_us(rate)
    host_us, per_us = _batch_probe(plain, rate, empty)
    host_us = max(host_us, _batch_probe(traced, rate, empty)[0])  # the traced call may convert its buffer too
    n = launches_for(per_us, target_us, max_launches)

    def plain_n():
        for _ in range(n):
            plain()

    def traced_n():
        for _ in range(n):
            traced()

    def spin(order):
        _spin(1.5 * host_us * 3 * n + 50.0, rate)

    return _interleaved(plain_n, traced_n, spin, n, _rounds_for(n * per_us, rounds, budget_s), "batch")
