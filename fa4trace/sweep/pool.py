"""Every GPU of a host: one worker process per GPU, points handed out as workers free up.

    Pool(CudaJob(), gpus=["0", "1"])   two workers, CUDA_VISIBLE_DEVICES=0 and =1
    Pool(CudaJob(), gpus=["0", "0"])   two workers sharing GPU 0
    Pool(ReplayJob(), gpus=[None, None])   two CPU workers (no GPU visible to them)

Each worker is a fresh interpreter (``spawn``) whose ``CUDA_VISIBLE_DEVICES`` is set before it
starts, so torch in it sees its GPU as device 0. The driver keeps a queue of points and hands
the next one to whichever worker is free; a worker sends back the point's rows and bundle
bytes (``job.PointResult``) and the driver writes them, so each point is written once, by one
process, atomically. A worker that dies (a crash, a CUDA fault, ``kill -9``, over
``point_timeout``) loses only its point in flight: the point goes back to the queue once (a
second loss makes it error rows), the worker is restarted (up to ``max_restarts`` times) and the
other workers go on. Ctrl-C (or SIGTERM to the driver) stops every worker: the workers ignore
SIGINT and the driver terminates them, writing nothing of the points in flight.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Iterator, Optional

from ..auto.patches import Patches
from ..format.errors import Fa4traceError
from .job import Job, PointResult, Task, host, line, lost_result

START_TIMEOUT_S = 600.0  # a worker's import of torch and its first CUDA context


def visible_gpus() -> int:
    """How many CUDA GPUs this process sees (0 without torch or CUDA); creates no CUDA context."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def parse_gpus(spec: Optional[str]):
    """A GPU list: "all" (None too), or comma GPU indices ("0,1"; "0,0": two workers on GPU 0)."""
    spec = "all" if spec is None else spec.strip()
    if spec == "all":
        return "all"
    try:
        out = [int(x) for x in spec.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 0:
        raise Fa4traceError(f"want all or comma GPU indices such as 0,1 (0,0: two workers on GPU 0), got {spec!r}")
    return out


def pick_gpus(gpus, visible: int) -> list[int]:
    """``parse_gpus``' answer checked against the GPUs this process sees."""
    if gpus == "all":
        return list(range(visible))
    bad = [i for i in gpus if i >= visible]
    if bad:
        raise Fa4traceError(f"GPU {bad[0]} is not here (this machine sees {visible} GPU"
                            f"{'s' if visible != 1 else ''}: 0..{visible - 1})")
    return list(gpus)


def device_id(index: int, parent_visible: Optional[str] = None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` of a worker on this process's GPU ``index``: the index itself,
    or, where this process has a ``CUDA_VISIBLE_DEVICES`` of its own, the entry at that index."""
    if parent_visible is None:
        parent_visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if parent_visible is None or not parent_visible.strip():
        return str(index)
    ids = [x.strip() for x in parent_visible.split(",") if x.strip()]
    if index >= len(ids):
        raise Fa4traceError(f"GPU {index} is not in CUDA_VISIBLE_DEVICES={parent_visible}")
    return ids[index]


def worker_env(gpu: Optional[str], environ=None) -> dict:
    """The environment a worker starts with: its GPU (or none for a CPU worker) and, where the
    GPUs are numbered by this host's index (no CUDA_VISIBLE_DEVICES here), nvidia-smi's order."""
    environ = os.environ if environ is None else environ
    env = {"CUDA_VISIBLE_DEVICES": "" if gpu is None else gpu}
    if "CUDA_VISIBLE_DEVICES" not in environ and "CUDA_DEVICE_ORDER" not in environ:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def exit_reason(code: Optional[int]) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


@contextlib.contextmanager
def _environ(env: dict):
    patches = Patches()
    for k, v in env.items():
        patches.set_env(k, v)
    try:
        yield
    finally:
        patches.restore()


def _worker_main(conn, job: Job, gpu: Optional[str], name: str, env: dict) -> None:
    """A worker: build the runner, say ready, then run points until told to stop (or the driver goes)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    signal.signal(signal.SIGTERM, _exit_on_term)  # the driver stopping it: close the runner on the way out
    os.environ.update(env)
    try:
        power_gpu = gpu if gpu and (env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" or gpu.startswith("GPU-")) else None
        runner = job.make_runner(power_gpu)
        runner.worker = name
    except BaseException as exc:  # noqa: BLE001 - told to the driver as one line
        conn.send(("failed", line(exc)))
        return
    conn.send(("ready", {"worker": name, "host": host(), "pid": os.getpid(), "gpu": runner.gpu, "gpu_index": gpu,
                         "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "job": runner.job}))
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break  # the driver is gone
            if msg[0] == "stop":
                conn.send(("bye", runner.clocks()))
                break
            task = msg[1]
            try:
                res = runner.compute(task)
            except Exception as exc:  # noqa: BLE001 - a bug in a job: its point's rows say so, the worker lives
                res = lost_result(task, "worker error: " + line(exc), gpu=runner.gpu, worker=name, job=runner.job)
            conn.send(("done", res))
    finally:
        runner.close()


@dataclass
class _Worker:
    slot: int
    gpu: Optional[str]
    name: str
    proc: object = None
    conn: object = None
    state: str = "new"  # starting, idle, busy, dead
    task: Optional[Task] = None
    since: float = 0.0
    restarts: int = 0
    info: dict = field(default_factory=dict)


class Pool:
    """Worker processes on this host, one per entry of ``gpus`` (a CUDA_VISIBLE_DEVICES value,
    or None for a CPU worker that sees no GPU)."""

    kind = "pool"

    def __init__(self, job: Job, gpus: list, *, point_timeout: Optional[float] = None, max_restarts: int = 3,
                 start_timeout: float = START_TIMEOUT_S):
        if not gpus:
            raise ValueError("a pool needs at least one worker")
        self.job, self.point_timeout, self.max_restarts, self.start_timeout = job, point_timeout, max_restarts, start_timeout
        me = host()
        self._w = [_Worker(i, g, f"{me}/gpu{g}#{i}" if g is not None else f"{me}/cpu#{i}") for i, g in enumerate(gpus)]
        self._ctx = mp.get_context("spawn")
        self.lost: list = []
        self._old_term = None

    # ---- what the sweep record shows ----
    @property
    def workers(self) -> list[dict]:
        return [{"worker": w.name, "host": w.info.get("host"), "gpu_index": w.gpu, "gpu": w.info.get("gpu"),
                 "pid": w.info.get("pid"), "cuda_visible_devices": w.info.get("cuda_visible_devices"),
                 "job": w.info.get("job"), "points": w.info.get("points", 0), "restarts": w.restarts,
                 "clocks": w.info.get("clocks")} for w in self._w]

    def clocks(self) -> Optional[dict]:
        """The clocks of the GPU, where every worker shares one (else each worker's are in ``workers``)."""
        if len({w.gpu for w in self._w}) != 1:
            return None
        return next((w.info["clocks"] for w in self._w if w.info.get("clocks")), None)

    # ---- life ----
    def _spawn(self, w: _Worker) -> None:
        env = worker_env(w.gpu)
        parent, child = self._ctx.Pipe()
        with _environ(env):  # the child starts with it: set before anything in it imports torch
            proc = self._ctx.Process(target=_worker_main, args=(child, self.job, w.gpu, w.name, env), daemon=True,
                                     name=f"fa4trace-sweep-{w.slot}")
            proc.start()
        child.close()
        w.proc, w.conn, w.state, w.task, w.since = proc, parent, "starting", None, time.monotonic()
        w.info["pid"] = proc.pid

    def start(self, log) -> None:
        """Start every worker and wait until each is ready (once: a started pool is left as is)."""
        if any(w.proc is not None for w in self._w):
            return
        if threading.current_thread() is threading.main_thread():
            self._old_term = signal.signal(signal.SIGTERM, _term_as_interrupt)
        for w in self._w:
            self._spawn(w)
        deadline = time.monotonic() + self.start_timeout
        try:
            while any(w.state == "starting" for w in self._w):
                left = deadline - time.monotonic()
                starting = [w for w in self._w if w.state == "starting"]
                if left <= 0:
                    raise Fa4traceError(f"worker {starting[0].name} did not start within {self.start_timeout:.0f} s")
                ready = wait([w.conn for w in starting] + [w.proc.sentinel for w in starting], left)
                for w in starting:
                    if w.conn in ready or w.proc.sentinel in ready:
                        msg = self._recv(w)
                        if msg is not None and msg[0] == "ready":
                            self._ready(w, msg[1])
                        elif msg is not None and msg[0] == "failed":
                            raise Fa4traceError(f"worker {w.name} could not start: {msg[1]}")
                        else:
                            w.proc.join(5)
                            raise Fa4traceError(f"worker {w.name} died while starting ({exit_reason(w.proc.exitcode)})")
        except BaseException:
            self.close()
            raise
        log(f"{len(self._w)} workers: " + ", ".join(f"{w.name} [{w.info.get('gpu')}]" for w in self._w))

    def _ready(self, w: _Worker, info: dict) -> None:
        w.info = {**w.info, **info, "points": w.info.get("points", 0)}
        w.state = "idle"

    @staticmethod
    def _recv(w: _Worker):
        try:
            return w.conn.recv()
        except (EOFError, OSError):
            return None

    def run(self, tasks: list[Task], log) -> Iterator[tuple[Task, PointResult]]:
        queue = deque(tasks)
        while queue or any(w.state == "busy" for w in self._w):
            for w in self._w:
                if w.state == "idle" and queue:
                    t = queue.popleft()
                    w.since = time.monotonic()  # before send: a large payload blocks it until the worker reads
                    try:
                        w.conn.send(("point", t.loaded()))
                    except (OSError, ValueError):  # died while idle: its sentinel says so below
                        queue.appendleft(t)
                        w.state = "busy"  # so that the death is handled; no task in flight
                        continue
                    w.task, w.state = t, "busy"
            live = [w for w in self._w if w.state in ("busy", "starting", "idle")]
            if not live:
                raise Fa4traceError(f"every worker died (see above); {len(queue)} points not run: "
                                    "run the sweep again to resume")
            waiting = [w for w in live if w.state in ("busy", "starting")]
            ends = [w.since + limit - time.monotonic() for w in waiting if (limit := self._limit(w)) is not None]
            ready = wait([w.conn for w in waiting] + [w.proc.sentinel for w in waiting],
                         max(0.0, min(ends)) if ends else None)
            for w in waiting:
                if w.conn not in ready and w.proc.sentinel not in ready:
                    limit = self._limit(w)
                    if limit is not None and time.monotonic() - w.since > limit:
                        w.proc.kill()
                        w.proc.join(10)
                        why = (f"over the point timeout of {limit:g} s" if w.task is not None
                               else f"not started within {limit:g} s")
                        yield from self._died(w, queue, log, why)
                    continue
                msg = self._recv(w)
                if msg is None:
                    w.proc.join(10)
                    yield from self._died(w, queue, log, exit_reason(w.proc.exitcode))
                elif msg[0] == "done":
                    res, task = msg[1], w.task
                    res.elapsed_s = time.monotonic() - w.since
                    w.task, w.state = None, "idle"
                    w.info["points"] = w.info.get("points", 0) + 1
                    yield task, res
                elif msg[0] == "ready":
                    self._ready(w, msg[1])
                    log(f"worker {w.name} is back")
                elif msg[0] == "failed":
                    w.proc.join(10)
                    w.state = "dead"
                    log(f"worker {w.name} could not restart: {msg[1]}")

    def _limit(self, w: _Worker) -> Optional[float]:
        """How long ``w`` may stay as it is: a restarting worker, to be ready; a busy one, its point."""
        if w.state == "starting":
            return self.start_timeout
        return self.point_timeout if w.task is not None else None

    def _died(self, w: _Worker, queue: deque, log, why: str):
        """A dead worker: its point back to the queue (or, the second time, error rows); restart it."""
        t, w.task = w.task, None
        if t is not None:
            self.lost.append({"point_id": t.point.id, "worker": w.name, "why": why, "attempt": t.attempt})
            if t.attempt < 2:
                queue.append(dataclasses.replace(t, attempt=t.attempt + 1))
                log(f"worker {w.name} died ({why}) running {t.point.id}: the point goes back to the queue")
            else:
                log(f"worker {w.name} died ({why}) running {t.point.id}, its second loss: written as error rows")
                res = lost_result(t, f"lost twice: its worker died ({why})", gpu=w.info.get("gpu") or "unknown",
                                  worker=w.name, job=getattr(self.job, "kind", "cuda"))
                yield t, res
        else:
            log(f"worker {w.name} died ({why})")
        with contextlib.suppress(OSError):
            w.conn.close()
        if w.restarts < self.max_restarts:
            w.restarts += 1
            self._spawn(w)
            log(f"worker {w.name}: restarting ({w.restarts} of at most {self.max_restarts})")
        else:
            w.state = "dead"
            log(f"worker {w.name}: not restarted (restarted {w.restarts} times already)")

    def close(self) -> None:
        """Stop every worker: idle ones are asked (and report their clocks), others terminated."""
        asked = []
        for w in self._w:
            if w.proc is None or not w.proc.is_alive():
                continue
            if w.state == "idle":
                try:
                    w.conn.send(("stop",))
                    asked.append(w)
                    continue
                except (OSError, ValueError):
                    pass
            w.proc.terminate()
        deadline = time.monotonic() + 30
        for w in asked:
            if w.conn.poll(max(0.0, deadline - time.monotonic())):
                msg = self._recv(w)
                if msg is not None and msg[0] == "bye":
                    w.info["clocks"] = msg[1]
        for w in self._w:
            if w.proc is None:
                continue
            w.proc.join(max(0.1, deadline - time.monotonic()))
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(5)
            with contextlib.suppress(OSError):
                w.conn.close()
            w.state = "dead"
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None


def _term_as_interrupt(signum, frame):
    raise KeyboardInterrupt


def _exit_on_term(signum, frame):
    raise SystemExit(128 + signum)
