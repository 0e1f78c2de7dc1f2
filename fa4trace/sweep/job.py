"""What travels between a sweep's driver and its workers: a ``Task`` (one point to run) out, a
``PointResult`` (its rows and bundle bytes) back, and the ``BaseRunner`` a worker runs tasks with.

Workers never write the dataset: they return rows and bundle bytes and the driver writes them
(``run.write_point``), so the layout is the same whether the workers are threads of this
process, processes of this host (``pool``) or Ray tasks on other machines (``ray_executor``),
and a worker that dies leaves nothing half written. A job (``CudaJob``, ``ReplayJob``) is the
picklable recipe a worker builds its runner from.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Protocol


@dataclass
class Task:
    """One point for one worker. ``inputs``: files the job needs (name -> path on the driver's
    machine); ``loaded()`` reads them into ``payload`` so the task carries its data with it."""

    point: object  # grid.Point (or replay.ReplayPoint)
    kernels: list
    sweep_id: str
    bundles: bool = True
    inputs: dict = field(default_factory=dict)
    payload: dict = field(default_factory=dict)
    attempt: int = 1

    def loaded(self) -> "Task":
        if not self.inputs:
            return self
        return dataclasses.replace(self, inputs={},
                                   payload={k: Path(p).read_bytes() for k, p in self.inputs.items()})


@dataclass
class PointResult:
    """A finished point: one row per kernel, the bundles to write (path relative to the
    dataset root -> bytes), the stale bundles to remove, and who computed it."""

    point_id: str
    rows: list
    bundles: dict = field(default_factory=dict)
    drop: list = field(default_factory=list)
    worker: str = ""
    elapsed_s: Optional[float] = None  # the executor's wall time for the point (before the driver's writes)


class BaseRunner:
    """Runs tasks in a worker. ``gpu`` and ``worker`` name where (they go into each row);
    ``clocks`` summarizes the GPU's clock and power over the runner's life (or None)."""

    job: str = "cuda"
    gpu: str = "unknown"
    worker: str = "unknown"

    def compute(self, task: Task) -> PointResult:
        raise NotImplementedError

    def clocks(self) -> Optional[dict]:
        return None

    def close(self):
        pass


class Job(Protocol):
    """A picklable recipe: ``kind`` ("cuda", "replay"), GPUs per task, and the runner a worker
    builds (``gpu``: the GPU the worker is pinned to, as nvidia-smi numbers it, or None)."""

    kind: str
    num_gpus: int

    def make_runner(self, gpu: Optional[str] = None) -> BaseRunner: ...


def line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0]}"[:300] if msg else type(exc).__name__


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def host() -> str:
    return socket.gethostname()


def row(task: Task, kernel: str, r: dict, *, gpu: str, worker: str, job: str) -> dict:
    """A result row of ``task``'s point for ``kernel`` from ``r`` (us, us_spread, tbps, rel_err,
    error, qk/pv_softmax_overlap, bundle, time_s, record_s). finished_at and point_s are the
    driver's to fill."""
    p = task.point
    return {"sweep_id": task.sweep_id, "point_id": p.id, "kernel": kernel, "d": p.d, "hq": p.hq, "hkv": p.hkv,
            "sk": p.sk, "b": p.b, "sq": p.sq, "dtype": p.dtype,
            "us": r.get("us"), "us_spread": r.get("us_spread"), "tbps": r.get("tbps"), "rel_err": r.get("rel_err"),
            "error": r.get("error"), "qk_softmax_overlap": r.get("qk_softmax_overlap"),
            "pv_softmax_overlap": r.get("pv_softmax_overlap"), "bundle": r.get("bundle"),
            "gpu": gpu, "worker": worker, "finished_at": None, "job": job,
            "point_s": None, "time_s": r.get("time_s"), "record_s": r.get("record_s")}


def lost_result(task: Task, why: str, *, gpu: str = "unknown", worker: str = "unknown", job: str = "cuda") -> PointResult:
    """The error rows of a point no worker could finish (its worker died, twice)."""
    return PointResult(task.point.id, [row(task, k, {"error": why}, gpu=gpu, worker=worker, job=job)
                                       for k in task.kernels], worker=worker)


def bundle_bytes(trace) -> bytes:
    """A bundle's file content, written by ``Trace.save`` (the one bundle writer) to a scratch file."""
    with tempfile.TemporaryDirectory(prefix="fa4trace-bundle-") as d:
        path = Path(d) / "bundle.parquet"
        trace.save(path)
        return path.read_bytes()
