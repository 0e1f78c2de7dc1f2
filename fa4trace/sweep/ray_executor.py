"""One Ray task per point: a sweep over the GPUs of a Ray cluster (``--executor ray``).

    fa4trace sweep --seed-grid -o SWEEP --executor ray --address auto        # on a node of the cluster
    fa4trace sweep --seed-grid -o SWEEP --executor ray --address ray://head:10001   # from outside it

Each point is one task, ``num_gpus=1`` for GPU points (Ray pins the task to a GPU through
``CUDA_VISIBLE_DEVICES`` and starts a fresh worker process for each GPU task), 0 for replay
points. A task returns the point's rows and bundle bytes and the driver writes them
(``run.write_point``): the dataset is the driver's, and workers need no shared file system,
only fa4trace installed. A task whose worker dies is retried once by Ray (``max_retries=1``),
then its point becomes error rows. At most ``window`` tasks are in flight (default: twice the
cluster's GPUs, or CPUs for replay points), so the driver never holds every payload at once.
Ray is an optional dependency: ``pip install 'fa4trace[ray]'``.
"""

from __future__ import annotations

import socket
import time
import warnings
from collections import deque
from typing import Iterator, Optional
from urllib.parse import urlsplit

from ..format.errors import Fa4traceError, MissingDependency
from .job import PointResult, Task, host, line, lost_result

CONNECT_TIMEOUT_S = 5.0


def _run_task(job, task: Task) -> PointResult:
    """In a Ray worker: build the job's runner for this task's GPU, run the point, close it."""
    import ray

    gpus = [str(g) for g in ray.get_gpu_ids()]
    runner = job.make_runner(gpus[0] if len(gpus) == 1 else None)
    try:
        runner.worker = f"{host()}/gpu{','.join(gpus)}" if gpus else f"{host()}/cpu"
        t = time.perf_counter()
        res = runner.compute(task)
        res.elapsed_s = time.perf_counter() - t
        return res
    finally:
        runner.close()


def check_reachable(address: Optional[str], timeout: float = CONNECT_TIMEOUT_S) -> None:
    """A one-line error, fast, where ``address`` (host:port or ray://host:port) takes no TCP
    connection: Ray itself would retry for minutes. "auto" and None are Ray's to resolve."""
    if not address or address in ("auto", "local"):
        return
    parts = urlsplit(address if "://" in address else f"gcs://{address}")
    try:
        hostname, port = parts.hostname, parts.port
    except ValueError:
        raise Fa4traceError(f"Ray address {address}: want auto, HOST:PORT or ray://HOST:PORT") from None
    if not hostname or port is None:
        raise Fa4traceError(f"Ray address {address}: want auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((hostname, port), timeout=timeout).close()
    except OSError as exc:
        raise Fa4traceError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from None


class RayExecutor:
    """Run a sweep's tasks on the Ray cluster at ``address`` (None: a Ray already initialized
    in this process, else a local one)."""

    kind = "ray"

    def __init__(self, job, address: Optional[str] = "auto", *, window: Optional[int] = None):
        self.job, self.address, self.window = job, address, window
        self.lost: list = []
        self._seen: dict = {}
        self._owns = False
        self._refs: dict = {}
        self._remote = None

    @property
    def workers(self) -> list[dict]:
        return list(self._seen.values())

    def clocks(self) -> Optional[dict]:
        return None

    def start(self, log) -> None:
        """Connect (once; the command line does it before the sweep starts writing)."""
        if self._remote is not None:
            return
        from ..run.deps import install_command, require

        require("the Ray executor", "ray")
        try:
            import ray
        except ImportError as exc:  # installed, but broken
            raise MissingDependency(f"the Ray executor needs ray, which does not import here ({exc}): "
                                    f"{install_command(['ray'])}") from None
        if not ray.is_initialized():
            check_reachable(self.address)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ray.init(address=self.address, logging_level="ERROR")
            except (ConnectionError, OSError, ValueError, RuntimeError) as exc:
                raise Fa4traceError(f"cannot reach the Ray cluster at {self.address}: {line(exc)}") from None
            self._owns = True
        res = ray.cluster_resources()
        gpus, cpus = int(res.get("GPU", 0)), int(res.get("CPU", 0))
        if self.job.num_gpus and gpus < 1:
            self.close()
            raise Fa4traceError(f"the Ray cluster at {self.address} has no GPU (it has {cpus} CPUs)")
        self._remote = ray.remote(num_gpus=self.job.num_gpus, max_retries=1)(_run_task)
        self._slots = max(1, gpus if self.job.num_gpus else cpus)
        log(f"Ray cluster: {cpus} CPUs, {gpus} GPUs; one task per point ({self.job.num_gpus} GPU each)")

    def run(self, tasks: list[Task], log) -> Iterator[tuple[Task, PointResult]]:
        import ray

        window = self.window or 2 * self._slots
        queue = deque(tasks)
        while queue or self._refs:
            while queue and len(self._refs) < window:
                t = queue.popleft()
                self._refs[self._remote.remote(self.job, t.loaded())] = t
            done, _ = ray.wait(list(self._refs), num_returns=1)
            for ref in done:
                t = self._refs.pop(ref)
                try:
                    res = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    why = line(exc)
                    self.lost.append({"point_id": t.point.id, "worker": None, "why": why})
                    log(f"{t.point.id}: its Ray task failed ({why}): written as error rows")
                    res = lost_result(t, f"its Ray task failed ({why})", job=getattr(self.job, "kind", "cuda"))
                self._note(res)
                yield t, res

    def _note(self, res: PointResult) -> None:
        name = res.worker or "unknown"
        w = self._seen.setdefault(name, {"worker": name, "host": name.split("/")[0],
                                         "gpu": res.rows[0]["gpu"] if res.rows else None, "points": 0})
        w["points"] += 1

    def close(self) -> None:
        try:
            import ray
        except ImportError:
            return
        for ref in list(self._refs):
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - best effort: the cluster drops them with the driver
                pass
        self._refs.clear()
        if self._owns and ray.is_initialized():
            ray.shutdown()
        self._owns, self._remote = False, None
