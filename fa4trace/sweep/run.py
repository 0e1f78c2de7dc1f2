"""The sweep loop and the GPU work behind it.

``run_sweep`` walks a grid's points, skips the (point, kernel) pairs whose result file exists
(resume; ``force`` re-runs them), asks a ``Runner`` for the timings of the rest and one
recorded bundle per schedule of ours, and writes bundles first, result rows last. A point that
fails (CUDA out of memory, a shape a kernel refuses) becomes rows with an ``error`` and the
sweep goes on; an interrupt (Ctrl-C, a kill) loses only the point in flight.

``CudaRunner`` is the runner of a real GPU: ``fa4trace.bench.decode.bench_shape`` for the
timings (CUDA-graph replay, cold L2, every kernel on the same inputs) and
``attention.record_attention`` (lead warps, a CTA subset) for the bundles.
"""

from __future__ import annotations

import datetime as dt
import socket
import sys
import time
import uuid
import zlib
from typing import Callable, Optional

from .dataset import Dataset
from .grid import OURS, Grid, Point

MAX_BUNDLE_BYTES = 1 << 20  # a bundle stays <= 1 MB
BUNDLE_ROWS = 60_000  # first try: recorded slots hold at most this many records (~6-8 B per row on disk)


def bundle_subset(n_ctas: int, capacity: int, warps: int, budget: int = BUNDLE_ROWS) -> dict:
    """The CTAs to record so that ``warps`` warps per CTA x ``capacity`` records stay within
    ``budget`` records: at most ``max_ctas`` of them, spread over the grid by ``cta_stride``."""
    if n_ctas < 1 or capacity < 1 or warps < 1:
        raise ValueError(f"n_ctas, capacity and warps must be >= 1, got {n_ctas}, {capacity}, {warps}")
    max_ctas = max(1, min(n_ctas, budget // (warps * capacity)))
    return {"cta_first": 0, "cta_stride": max(1, n_ctas // max_ctas), "max_ctas": max_ctas}


class Runner:
    """The GPU work of a sweep. ``time`` returns one dict per kernel (kernel, us, us_spread,
    tbps, rel_err, error: None or a line); it may raise (the point's rows then all carry the
    error). ``record`` returns a ``fa4trace.Trace`` of one launch of ``schedule`` whose recorded
    slots hold at most ``budget`` records. ``clocks`` summarizes the GPU's clock and power over
    the sweep (or None)."""

    gpu: str = "unknown"
    worker: str = "unknown"

    def time(self, point: Point, kernels: list[str], *, seed: int) -> list[dict]:
        raise NotImplementedError

    def record(self, point: Point, schedule: str, *, seed: int, budget: int):
        raise NotImplementedError

    def clocks(self) -> Optional[dict]:
        return None

    def close(self):
        pass


class CudaRunner(Runner):
    """Timings with ``bench_shape``, bundles with ``record_attention`` on CUDA device 0."""

    def __init__(self, *, rounds: int = 2, replays: int = 15, power: bool = True):
        from ..bench.results import gpu_name
        from ..gpu import require_cuda

        require_cuda()
        self.rounds, self.replays = rounds, replays
        self.gpu = gpu_name()
        self.worker = f"{socket.gethostname()}/cuda:0"
        self._power = None
        self._t0 = time.monotonic()
        if power:
            from ..power_log import PowerLog

            self._power = PowerLog().__enter__()

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

        from ..attention import LEAD_WARPS, launch_plan, record_attention, trace_capacity, variant_for

        try:
            _, plan = launch_plan(point.shape, variant_for(point.shape, schedule, events="core"), "cuda")
            subset = bundle_subset(plan.n_ctas, trace_capacity(plan), len(LEAD_WARPS), budget)
            return record_attention(schedule, d=point.d, hq=point.hq, hkv=point.hkv, sk=point.sk, b=point.b,
                                    sq=point.sq, dtype=point.dtype, seed=seed, warps=LEAD_WARPS, **subset)
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


def _line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0]}"[:300] if msg else type(exc).__name__


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def new_sweep_id() -> str:
    """UTC start time plus a short random tail: sortable, unique across workers."""
    return _now().strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def point_seed(point: Point) -> int:
    """The inputs' seed of a point: stable across runs and resumes."""
    return zlib.crc32(point.id.encode()) & 0x7FFFFFFF


def _eta(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def run_point(ds: Dataset, runner: Runner, point: Point, kernels: list[str], *, sweep_id: str,
              bundles: bool = True) -> list[dict]:
    """Time ``kernels`` on ``point``, record our schedules' bundles, write the rows; returns them."""
    seed = point_seed(point)
    refused = point.ours_problem()
    res: dict = {}
    if refused:
        for k in kernels:
            if k in OURS:
                res[k] = {"error": f"our kernels refuse this shape: {refused}"}
    runnable = [k for k in kernels if k not in res]
    if runnable:
        try:
            got = {r["kernel"]: r for r in runner.time(point, runnable, seed=seed)}
        except Exception as exc:  # noqa: BLE001 - out of memory, a driver error: this point's rows say so
            got = {k: {"error": _line(exc)} for k in runnable}
        for k in runnable:
            res[k] = got.get(k) or {"error": "the runner returned no row for this kernel"}
    for k in kernels:
        r = res[k]
        r["qk_softmax_overlap"] = r["pv_softmax_overlap"] = r["bundle"] = None
        if k not in OURS or r.get("error"):
            continue
        if not bundles:
            ds.bundle_path(point, k).unlink(missing_ok=True)  # no stale bundle beside a re-run row
            continue
        try:
            r.update(_record(ds, runner, point, k, seed))
        except Exception as exc:  # noqa: BLE001 - the timing stands; the row says why there is no bundle
            r["error"] = "recording failed: " + _line(exc)
    rows = []
    for k in kernels:
        r = res[k]
        row = {"sweep_id": sweep_id, "point_id": point.id, "kernel": k, "d": point.d, "hq": point.hq,
               "hkv": point.hkv, "sk": point.sk, "b": point.b, "sq": point.sq, "dtype": point.dtype,
               "us": r.get("us"), "us_spread": r.get("us_spread"), "tbps": r.get("tbps"),
               "rel_err": r.get("rel_err"), "error": r.get("error"),
               "qk_softmax_overlap": r["qk_softmax_overlap"], "pv_softmax_overlap": r["pv_softmax_overlap"],
               "bundle": r["bundle"], "gpu": runner.gpu, "worker": runner.worker, "finished_at": _now()}
        ds.write_result(row)
        rows.append(row)
    return rows


def _record(ds: Dataset, runner: Runner, point: Point, schedule: str, seed: int) -> dict:
    """Record, save, and halve the CTA budget while the bundle is over MAX_BUNDLE_BYTES."""
    from ..analysis import summarize

    budget = BUNDLE_ROWS
    while True:
        trace = runner.record(point, schedule, seed=seed, budget=budget)
        rel = ds.write_bundle(point, schedule, trace)
        if (ds.root / rel).stat().st_size <= MAX_BUNDLE_BYTES or budget <= 1:
            break
        budget //= 2
    s = summarize(trace)
    return {"bundle": rel, "qk_softmax_overlap": s.get("qk_softmax_overlap"),
            "pv_softmax_overlap": s.get("pv_softmax_overlap")}


def run_sweep(grid: Grid, root, runner: Runner, *, force: bool = False, bundles: bool = True,
              command: str = "", log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
              sweep_id: Optional[str] = None) -> dict:
    """Run every missing (point, kernel) of ``grid`` into the dataset at ``root``. Returns the
    sweep's record (also ``ROOT/sweeps/sweep=<id>/sweep.json``)."""
    from ..bench.results import current_commit

    ds = Dataset(root)
    points = grid.points()
    todo = [(p, list(grid.kernels) if force else ds.missing(p, grid.kernels)) for p in points]
    todo = [(p, ks) for p, ks in todo if ks]
    sweep_id = sweep_id or new_sweep_id()
    doc = {"sweep_id": sweep_id, "gpu": runner.gpu, "worker": runner.worker, "commit": current_commit(),
           "command": command, "grid": grid.to_json(), "points": len(points), "points_run": 0,
           "error_rows": 0, "started_at": _now().isoformat(timespec="seconds"), "finished_at": None,
           "status": "running", "clocks": None}
    ds.write_sweep(sweep_id, doc)
    log(f"sweep {sweep_id}: {len(points)} points x {len(grid.kernels)} kernels into {root}; "
        f"{len(points) - len(todo)} done already, {len(todo)} to run")
    t0 = time.monotonic()
    try:
        for i, (p, ks) in enumerate(todo, 1):
            t = time.monotonic()
            rows = run_point(ds, runner, p, ks, sweep_id=sweep_id, bundles=bundles)
            doc["points_run"] = i
            doc["error_rows"] += sum(r["error"] is not None for r in rows)
            cells = " ".join(f"{r['kernel']}=" + (f"{r['us']:.1f}" if r["us"] is not None and r["us"] == r["us"]
                                                    else "err") for r in rows)
            eta = (time.monotonic() - t0) / i * (len(todo) - i)
            log(f"[{i}/{len(todo)}] {p.id}: {cells} ({time.monotonic() - t:.1f} s, ETA {_eta(eta)})")
        doc["status"] = "finished"
    except BaseException:
        doc["status"] = "interrupted"
        raise
    finally:
        doc["finished_at"] = _now().isoformat(timespec="seconds")
        doc["clocks"] = runner.clocks()
        ds.write_sweep(sweep_id, doc)
    return doc
