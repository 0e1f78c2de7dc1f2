"""The GPU job of a sweep: time every kernel on a point, record one bundle per schedule of ours.

``Runner`` is the interface of a GPU runner (``time`` the kernels, ``record`` a schedule) and
``Runner.compute`` the point's work built on it: a point a kernel refuses, or whose timing
fails (CUDA out of memory), becomes rows with the one-line error. ``CudaRunner`` is the runner
of a real GPU: ``fa4trace.bench.decode.bench_shape`` for the timings (CUDA-graph replay, cold
L2, every kernel on the same inputs) and ``attention.record.record_attention`` (lead warps, a CTA
subset) for the bundles. ``CudaJob`` is the recipe a worker process builds one from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from ..format.options import Sampling
from .dataset import bundle_rel
from .grid import OURS, point_seed
from .job import BaseRunner, PointResult, Task, bundle_bytes, host, line, row

MAX_BUNDLE_BYTES = 1 << 20  # a bundle stays <= 1 MB
BUNDLE_ROWS = 60_000  # first try: recorded slots hold at most this many records (~6-8 B per row on disk)


def bundle_subset(n_ctas: int, capacity: int, warps: tuple, budget: int = BUNDLE_ROWS) -> Sampling:
    """Who records so that the ``warps`` of each recorded CTA x ``capacity`` records stay
    within ``budget`` records: at most ``ctas`` CTAs, spread over the grid by ``cta_stride``."""
    if n_ctas < 1 or capacity < 1 or not warps:
        raise ValueError(f"n_ctas and capacity must be >= 1 and warps named, got {n_ctas}, {capacity}, {warps}")
    ctas = max(1, min(n_ctas, budget // (len(warps) * capacity)))
    return Sampling(ctas=ctas, cta_stride=max(1, n_ctas // ctas), warps=tuple(warps), capacity=capacity)


class Runner(BaseRunner):
    """The GPU work of a sweep. ``time`` returns one dict per kernel (kernel, us, us_spread,
    tbps, rel_err, error: None or a line); it may raise (the point's rows then all carry the
    error). ``record`` returns a ``fa4trace.Trace`` of one launch of ``schedule`` whose recorded
    slots hold at most ``budget`` records. ``clocks`` summarizes the GPU's clock and power over
    the sweep (or None)."""

    job = "cuda"

    def time(self, point, kernels: list[str], *, seed: int) -> list[dict]:
        raise NotImplementedError

    def record(self, point, schedule: str, *, seed: int, budget: int):
        raise NotImplementedError

    def compute(self, task: Task) -> PointResult:
        """Time the task's kernels on its point and record our schedules' bundles (as bytes)."""
        point, kernels = task.point, task.kernels
        seed = point_seed(point)
        refused = point.ours_problem()
        res: dict = {}
        if refused:
            for k in kernels:
                if k in OURS:
                    res[k] = {"error": f"our kernels refuse this shape: {refused}"}
        runnable = [k for k in kernels if k not in res]
        time_s = None
        if runnable:
            t = time.perf_counter()
            try:
                got = {r["kernel"]: r for r in self.time(point, runnable, seed=seed)}
            except Exception as exc:  # noqa: BLE001 - out of memory, a driver error: this point's rows say so
                got = {k: {"error": line(exc)} for k in runnable}
            time_s = time.perf_counter() - t
            for k in runnable:
                res[k] = got.get(k) or {"error": "the runner returned no row for this kernel"}
        out = PointResult(point.id, [], worker=self.worker)
        t, recorded = time.perf_counter(), False
        for k in kernels:
            r = res[k]
            r["qk_softmax_overlap"] = r["pv_softmax_overlap"] = r["bundle"] = None
            if k not in OURS or r.get("error"):
                continue
            rel = bundle_rel(point, k)
            if not task.bundles:
                out.drop.append(rel)  # no stale bundle beside a re-run row
                continue
            recorded = True
            try:
                data, summary = self._record(point, k, seed)
            except Exception as exc:  # noqa: BLE001 - the timing stands; the row says why there is no bundle
                r["error"] = "recording failed: " + line(exc)
                continue
            out.bundles[rel] = data
            r.update(bundle=rel, qk_softmax_overlap=summary.get("qk_softmax_overlap"),
                     pv_softmax_overlap=summary.get("pv_softmax_overlap"))
        record_s = time.perf_counter() - t if recorded else None
        for k in kernels:
            out.rows.append(row(task, k, {**res[k], "time_s": time_s, "record_s": record_s}, gpu=self.gpu,
                                worker=self.worker, job=self.job))
        return out

    def _record(self, point, schedule: str, seed: int) -> tuple[bytes, dict]:
        """Record and serialize, halving the CTA budget while the bundle is over MAX_BUNDLE_BYTES;
        the bundle's bytes and its ``analysis.summarize``."""
        from ..analysis.overlap import summarize

        budget = BUNDLE_ROWS
        while True:
            trace = self.record(point, schedule, seed=seed, budget=budget)
            data = bundle_bytes(trace)
            if len(data) <= MAX_BUNDLE_BYTES or budget <= 1:
                break
            budget //= 2
        return data, summarize(trace)


class CudaRunner(Runner):
    """Timings with ``bench_shape``, bundles with ``record_attention`` on CUDA device 0 (the GPU
    ``CUDA_VISIBLE_DEVICES`` pins a pool worker to). ``power_gpu``: the GPU whose clock and power
    to log, as nvidia-smi numbers it (default: the one GPU nvidia-smi lists, if one)."""

    def __init__(self, *, rounds: int = 2, replays: int = 15, power: bool = True, power_gpu: Optional[str] = None):
        from ..bench.results import gpu_name
        from ..run.gpu import require_cuda

        require_cuda()
        self.rounds, self.replays = rounds, replays
        self.gpu = gpu_name()
        self.worker = f"{host()}/cuda:0"
        self._power = None
        self._t0 = time.monotonic()
        if power:
            from ..run.power_log import PowerLog

            self._power = PowerLog(gpu=power_gpu).__enter__()

    def time(self, point, kernels, *, seed):
        import torch

        from ..bench.decode import bench_shape

        try:
            rows = bench_shape(point.shape, kernels, replays=self.replays, seed=seed, rounds=self.rounds)
        finally:
            torch.cuda.empty_cache()  # an out-of-memory point leaves nothing behind for the next
        return [{"kernel": r.kernel, "us": r.us, "us_spread": r.us_spread,
                 "tbps": r.tbps if r.us == r.us else None, "rel_err": r.rel_err,
                 "error": r.extra.get("error")} for r in rows]

    def record(self, point, schedule, *, seed, budget):
        import torch

        from ..attention import LEAD_WARPS, launch_plan, trace_capacity, variant_for
        from ..attention.record import record_attention

        try:
            _, plan = launch_plan(point.shape, variant_for(point.shape, schedule, events="core"), "cuda")
            sampling = bundle_subset(plan.n_ctas, trace_capacity(plan), LEAD_WARPS, budget)
            return record_attention(schedule, point.shape, sampling=sampling, seed=seed)
        finally:
            torch.cuda.empty_cache()

    def clocks(self):
        if self._power is None or not self._power.enabled:
            return None
        return self._power.summary(self._t0, self._power.now())

    def close(self):
        if self._power is not None:
            self._power.__exit__(None, None, None)
            self._power = None


@dataclass(frozen=True)
class CudaJob:
    """Build a ``CudaRunner`` in a worker (``fa4trace sweep`` on GPUs)."""

    rounds: int = 2
    replays: int = 15
    power: bool = True
    kind = "cuda"
    num_gpus = 1

    def make_runner(self, gpu: Optional[str] = None) -> CudaRunner:
        return CudaRunner(rounds=self.rounds, replays=self.replays, power=self.power, power_gpu=gpu)
