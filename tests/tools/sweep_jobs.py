"""Replay jobs with test behaviours, for the pool and Ray tests. Importable by spawned worker
processes (jobs travel pickled by reference to this module), never by the package."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from fa4trace.sweep.replay import ReplayRunner


class _Runner(ReplayRunner):
    def __init__(self, job):
        super().__init__()
        self.j = job

    def compute(self, task):
        j, name = self.j, task.point.id
        if j.sleep:
            time.sleep(j.sleep)
        if name == j.hang and (j.flags is None or not (Path(j.flags) / "released").exists()):
            if j.flags:
                (Path(j.flags) / f"inflight-{os.getpid()}").write_text(name)
            time.sleep(600)
        if name == j.die:
            if j.flags:  # once: the retry runs normally
                if (Path(j.flags) / "died").exists():
                    return self._compute(task)
                (Path(j.flags) / "died").write_text(name)
            os.kill(os.getpid(), signal.SIGKILL)
        return self._compute(task)

    def _compute(self, task):
        res = super().compute(task)
        for r in res.rows:  # what this worker process sees, on each of its rows
            r["gpu"] = f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}"
        return res


@dataclass(frozen=True)
class TestJob:
    """A replay job whose worker: sleeps ``sleep`` s per point; hangs on point ``hang`` (writing
    ``flags``/inflight-<pid> first) until ``flags``/released exists; kills itself (SIGKILL) on
    point ``die`` (once where ``flags`` is given); refuses to start with ``fail_start``; with
    ``slow_restart``, a worker started after the first two hangs while starting. Rows' gpu
    column: the worker's CUDA_VISIBLE_DEVICES."""

    __test__ = False  # not a pytest class
    sleep: float = 0.0
    hang: Optional[str] = None
    die: Optional[str] = None
    flags: Optional[str] = None
    fail_start: Optional[str] = None
    slow_restart: bool = False
    kind = "replay"
    num_gpus = 0

    def make_runner(self, gpu=None):
        if self.fail_start:
            raise RuntimeError(self.fail_start)
        if self.slow_restart:
            (Path(self.flags) / f"start-{os.getpid()}").write_text("")
            if len(list(Path(self.flags).glob("start-*"))) > 2:
                time.sleep(600)
        return _Runner(self)
