"""The sweep loop: hand out the missing points, write what comes back, keep the sweep's record.

``run_sweep`` walks a grid's points, skips the (point, kernel) pairs already in the dataset
(resume; ``force`` re-runs them), hands the rest to an executor and writes each finished
point: its bundles first, its result rows last (``write_point``). Executors:

    InProcess  a runner in this process (one GPU: ``fa4trace sweep`` without ``--gpus``)
    pool.Pool  one worker process per GPU of this host (``--gpus all|0,1|0,0``)
    ray_executor.RayExecutor   one Ray task per point on a Ray cluster (``--executor ray``)

A point that fails (CUDA out of memory, a shape a kernel refuses) becomes rows with an
``error`` and the sweep goes on; an interrupt (Ctrl-C, a kill) loses only the points in flight.
The GPU work is in ``cuda`` (``Runner``, ``CudaRunner``), the CPU replay job in ``replay``.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import PurePosixPath
from typing import Callable, Iterator, Optional

from .dataset import Dataset
from .grid import Grid
from .job import BaseRunner, PointResult, Task, host, now

Log = Callable[[str], None]


def _stderr(m: str) -> None:
    print(m, file=sys.stderr, flush=True)


def new_sweep_id() -> str:
    """UTC start time plus a short random tail: sortable, unique across workers."""
    return now().strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def _eta(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class InProcess:
    """Run every task here, one after the other, with ``runner``."""

    kind = "serial"

    def __init__(self, runner: BaseRunner):
        self.runner = runner
        self.workers = [{"worker": runner.worker, "host": host(), "gpu": runner.gpu, "pid": os.getpid(),
                         "job": runner.job}]
        self.lost: list = []

    def start(self, log: Log) -> None:
        pass

    def run(self, tasks: list[Task], log: Log) -> Iterator[tuple[Task, PointResult]]:
        for task in tasks:
            t = time.perf_counter()
            res = self.runner.compute(task.loaded())
            res.elapsed_s = time.perf_counter() - t
            yield task, res

    def clocks(self) -> Optional[dict]:
        return self.runner.clocks()

    def close(self) -> None:
        pass


def _safe_rel(rel: str) -> str:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] != "bundles":
        raise ValueError(f"a worker sent a bundle path outside bundles/: {rel!r}")
    return rel


def write_point(ds: Dataset, res: PointResult) -> list[dict]:
    """Remove the point's stale bundles, write its new ones, then its rows (last: a row means
    done). Fills ``point_s`` (the executor's ``elapsed_s`` plus the bundle writes) and
    ``finished_at`` (this machine's clock: the newest row of a point wins)."""
    t = time.perf_counter()
    for rel in res.drop:
        (ds.root / _safe_rel(rel)).unlink(missing_ok=True)
    for rel, data in res.bundles.items():
        ds.write_bytes(_safe_rel(rel), data)
    elapsed = getattr(res, "elapsed_s", None)
    point_s = None if elapsed is None else elapsed + time.perf_counter() - t
    finished = now()
    for r in res.rows:
        r["point_s"], r["finished_at"] = point_s, finished
        ds.write_result(r)
    return res.rows


def _cells(rows: list[dict]) -> str:
    def one(r):
        if r.get("error"):
            return f"{r['kernel']}=err"
        if r.get("us") is not None and r["us"] == r["us"]:
            return f"{r['kernel']}={r['us']:.1f}"
        if r.get("qk_softmax_overlap") is not None:
            return f"{r['kernel']}: QK∥SOFTMAX {100 * r['qk_softmax_overlap']:.0f}%"
        return f"{r['kernel']}=ok"

    return " ".join(one(r) for r in rows)


def _names(workers: list[dict], key: str) -> Optional[str]:
    vals = list(dict.fromkeys(str(w[key]) for w in workers if w.get(key)))
    return ", ".join(vals) if vals else None


def run_sweep(grid: Grid, root, runner: Optional[BaseRunner] = None, *, executor=None, force: bool = False,
              bundles: bool = True, command: str = "", log: Log = _stderr, sweep_id: Optional[str] = None,
              compact: bool = False) -> dict:
    """Run every missing (point, kernel) of ``grid`` into the dataset at ``root``, with
    ``executor`` (default: ``InProcess(runner)``). ``compact``: merge the result files of each
    partition once the sweep is done (``compact.compact``). Returns the sweep's record (also
    ``ROOT/sweeps/sweep=<id>/sweep.json``)."""
    from ..bench.results import current_commit

    if executor is None:
        if runner is None:
            raise ValueError("run_sweep needs a runner or an executor")
        executor = InProcess(runner)
    ds = Dataset(root)
    points = grid.points()
    todo = [(p, list(grid.kernels) if force else ds.missing(p, grid.kernels)) for p in points]
    todo = [(p, ks) for p, ks in todo if ks]
    sweep_id = sweep_id or new_sweep_id()
    inputs = getattr(grid, "inputs", lambda p: {})
    tasks = [Task(p, ks, sweep_id, bundles, inputs=inputs(p)) for p, ks in todo]
    doc = {"sweep_id": sweep_id, "gpu": None, "worker": None, "commit": current_commit(),
           "command": command, "grid": grid.to_json(), "points": len(points), "points_run": 0,
           "error_rows": 0, "started_at": now().isoformat(timespec="seconds"), "finished_at": None,
           "status": "running", "clocks": None, "executor": executor.kind, "workers": [], "lost": []}
    ds.write_sweep(sweep_id, doc)
    log(f"sweep {sweep_id}: {len(points)} points x {len(grid.kernels)} kernels into {root}; "
        f"{len(points) - len(todo)} done already, {len(todo)} to run")
    t0 = time.monotonic()
    started = False

    def workers_now():
        doc["workers"] = list(executor.workers)
        doc["gpu"], doc["worker"] = _names(doc["workers"], "gpu"), _names(doc["workers"], "worker")

    try:
        if tasks:
            executor.start(log)
            started = True
            workers_now()
            ds.write_sweep(sweep_id, doc)
            many = len(executor.workers) > 1 or executor.kind == "ray"
            for i, (task, res) in enumerate(executor.run(tasks, log), 1):
                rows = write_point(ds, res)
                doc["points_run"] = i
                doc["error_rows"] += sum(r["error"] is not None for r in rows)
                took = rows[0]["point_s"] if rows and rows[0]["point_s"] is not None else 0.0
                eta = (time.monotonic() - t0) / i * (len(tasks) - i)
                where = f" on {res.worker}" if many and res.worker else ""
                log(f"[{i}/{len(tasks)}] {task.point.id}: {_cells(rows)} ({took:.1f} s{where}, ETA {_eta(eta)})")
        doc["status"] = "finished"
    except KeyboardInterrupt:
        doc["status"] = "interrupted"
        raise
    except BaseException:
        doc["status"] = "failed"
        raise
    finally:
        if started:
            executor.close()
            doc["clocks"] = executor.clocks()
            workers_now()
            doc["lost"] = list(executor.lost)
        doc["finished_at"] = now().isoformat(timespec="seconds")
        ds.write_sweep(sweep_id, doc)
    if compact:
        from .compact import compact as compact_dataset

        stats = compact_dataset(ds)
        doc["compacted"] = stats
        ds.write_sweep(sweep_id, doc)
        if stats["merged"]:
            log(f"compacted {stats['merged']} result files into {stats['written']} ({stats['partitions']} partitions)")
    return doc
