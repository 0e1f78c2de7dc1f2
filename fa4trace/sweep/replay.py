"""Replay points: recorded raw trace buffers decoded, converted and analysed into a sweep
dataset, on a CPU.

A replay folder holds one point per pair of files::

    NAME.bin    a launch's raw trace buffer as the device recorder leaves it (64-bit little-endian words)
    NAME.json   its launch metadata: kernel, config (d, hq, hkv, sk, b, sq, dtype, schedule, ...), grid, block

A replay point decodes its buffer (``decode.decode_buffer``), makes the bundle
(``bundle.Trace``, written to ``bundles/kernel=replay/d=<d>/NAME.parquet``) and one result row
of kernel ``replay``, job ``replay``, with the analysis' numbers (``overlap.summarize``: QK and
PV ∥ SOFTMAX); its us / tbps are null: a replay times nothing. It is the job that runs the
pool and the Ray executor for real on machines without a GPU, and it re-analyses buffers
recorded elsewhere. ``fa4trace.testing.replay`` writes a folder of synthetic points (labelled
synthetic in their metadata), for tests and for trying an executor::

    python -m fa4trace.testing.replay FOLDER --points 8
    fa4trace sweep --replay FOLDER -o DATASET --workers 2
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ..format.errors import Fa4traceError
from ..trace.meta import BundleMeta
from .dataset import COMPACT_PREFIX, bundle_rel
from .grid import DTYPES, Point
from .job import BaseRunner, PointResult, Task, bundle_bytes, host, line, row

KERNEL = "replay"
GPU = "none (replay on the CPU)"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,199}")
SHAPE_KEYS = ("d", "hq", "hkv", "sk", "b", "sq", "dtype")


@dataclass(frozen=True)
class ReplayPoint(Point):
    """A replay point: the shape from its metadata (the partition it lands in) and its file name (its id)."""

    name: str = ""

    @property
    def id(self) -> str:
        return self.name


def _check_name(name: str) -> str:
    if not NAME.fullmatch(name) or name.startswith(COMPACT_PREFIX):
        raise Fa4traceError(f"replay point name {name!r}: want letters, digits and _.+- (not starting "
                            f"with {COMPACT_PREFIX!r})")
    return name


def point_of(name: str, meta: dict) -> ReplayPoint:
    """The replay point of a buffer named ``name`` with launch metadata ``meta``."""
    info = BundleMeta.from_meta(meta)
    cfg = info.config if info.has("config") else None
    if not isinstance(cfg, dict):
        raise Fa4traceError(f"replay point {name}: its metadata has no 'config' object")
    lacks = [k for k in SHAPE_KEYS if k not in cfg]
    if lacks:
        raise Fa4traceError(f"replay point {name}: config lacks {', '.join(lacks)}")
    try:
        ints = {k: int(cfg[k]) for k in SHAPE_KEYS if k != "dtype"}
    except (TypeError, ValueError):
        raise Fa4traceError(f"replay point {name}: d, hq, hkv, sk, b, sq must be integers") from None
    if min(ints.values()) < 1 or cfg["dtype"] not in DTYPES:
        raise Fa4traceError(f"replay point {name}: sizes must be >= 1 and dtype one of {', '.join(DTYPES)}")
    return ReplayPoint(**ints, dtype=cfg["dtype"], name=_check_name(name))


class ReplayGrid:
    """The points of a replay folder, in name order (a grid for ``run_sweep``)."""

    def __init__(self, folder):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise Fa4traceError(f"{folder}: no such replay folder")
        self.kernels = [KERNEL]
        self._points = []
        for b in sorted(self.folder.glob("*.bin")):
            meta = b.with_suffix(".json")
            if not meta.is_file():
                raise Fa4traceError(f"{b}: no {meta.name} beside it (the launch metadata)")
            try:
                doc = json.loads(meta.read_text())
            except ValueError as exc:
                raise Fa4traceError(f"{meta}: not valid JSON ({str(exc).splitlines()[0]})") from None
            self._points.append(point_of(b.stem, doc))
        if not self._points:
            raise Fa4traceError(f"{folder}: no replay points (NAME.bin with NAME.json beside it)")

    def points(self) -> list[ReplayPoint]:
        return list(self._points)

    def inputs(self, point: ReplayPoint) -> dict:
        """The files a task carries to its worker (read on this machine when it is handed out)."""
        return {"buffer": str(self.folder / f"{point.id}.bin"), "meta": str(self.folder / f"{point.id}.json")}

    def to_json(self) -> dict:
        return {"kernels": [KERNEL], "replay": str(self.folder), "points": len(self._points)}


class ReplayRunner(BaseRunner):
    """Decode, convert and analyse a task's buffer (sent in ``task.payload``)."""

    job = "replay"
    gpu = GPU

    def __init__(self):
        self.worker = f"{host()}/cpu"

    def compute(self, task: Task) -> PointResult:
        from ..analysis.overlap import summarize
        from ..trace.bundle import Trace
        from ..trace.decode import decode_buffer

        point = task.point
        out = PointResult(point.id, [], worker=self.worker)
        t = time.perf_counter()
        r: dict = {}
        try:
            meta = json.loads(task.payload["meta"])
            launch = decode_buffer(np.frombuffer(task.payload["buffer"], dtype="<u8"))
            trace = Trace.from_launches([launch], meta)
            s = summarize(trace)
            r = {"qk_softmax_overlap": s.get("qk_softmax_overlap"), "pv_softmax_overlap": s.get("pv_softmax_overlap")}
            if task.bundles:
                rel = bundle_rel(point, KERNEL)
                out.bundles[rel] = bundle_bytes(trace)
                r["bundle"] = rel
            else:
                out.drop.append(bundle_rel(point, KERNEL))
        except Exception as exc:  # noqa: BLE001 - a buffer that does not decode is this point's error row
            r = {"error": "replay failed: " + line(exc)}
        r["record_s"] = time.perf_counter() - t
        out.rows.append(row(task, KERNEL, r, gpu=self.gpu, worker=self.worker, job=self.job))
        return out


@dataclass(frozen=True)
class ReplayJob:
    """Build a ``ReplayRunner`` in a worker (no GPU)."""

    kind = "replay"
    num_gpus = 0

    def make_runner(self, gpu: Optional[str] = None) -> ReplayRunner:
        return ReplayRunner()


def write_point(folder, name: str, buffer: np.ndarray, meta: dict) -> Path:
    """Write one replay point: ``NAME.bin`` (the buffer's words) and ``NAME.json`` (``meta``)."""
    point_of(name, meta)  # refuse what could not be replayed
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.bin").write_bytes(np.ascontiguousarray(buffer, dtype="<u8").tobytes())
    (folder / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
    return folder / f"{name}.bin"
