"""One traced launch's part of a merged trace: its SM / CTA / warp tracks (and its numbers).

:func:`render_launch` is what :func:`fa4trace.profiler.merge.merge` runs per traced launch, in
this process for a small merge and in worker processes for a large one (spawned: a job names
its bundle by path, or carries that launch's rows); :func:`bundle_numbers` is a large merge's
job for the numbers of every launch of a bundle, started before the launches are matched.
Each job writes its packets, made by :func:`fa4trace.export.perfetto.to_perfetto` at the
:class:`fa4trace.export.perfetto.Placement` the merge chose (with the roles and occupancy of
:func:`fa4trace.analysis.kernel.export_inputs`), to a file of its own; the merge then writes the
files one after the other into the output. A job can also say where the launch's events land
once placed (:func:`launch_stats`): the merge of several ranks has its workers read each bundle
once, for that and for the tracks.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..trace.bundle import Trace, load
from ..analysis.kernel import export_inputs
from ..export.perfetto import Placement, to_perfetto
from .report import launch_numbers

__all__ = ["RenderJob", "RenderResult", "render_launch", "launch_events", "launch_stats", "bundle_numbers",
           "all_numbers", "worker_init"]

_LOADED: dict = {}  # per process: the last bundle read from disk (a worker's jobs come bundle by bundle)


@dataclass
class RenderJob:
    source: object  # a bundle path (str) or a Trace holding (at least) the launch's rows
    launch: int
    place: Placement | None  # None: no tracks (the launch's warps are not drawn)
    compress: bool
    numbers: bool
    spool_dir: str
    kernel_ns: tuple | None = None  # (kernel start, end): compute launch_stats with place's offset; the
    # placement's name is then completed with the launch's CTA and warp counts


@dataclass
class RenderResult:
    path: str | None  # the packets, in a file of their own (the caller removes it)
    bytes: int
    slices: int
    next_uuid: int
    next_sequence_id: int
    next_flow_id: int
    numbers: dict | None
    seconds: float
    stats: dict | None = None
    cpu_seconds: float = 0.0  # CPU time of the job (its process's)


def launch_events(trace: Trace, launch: int) -> Trace:
    """The rows of one launch (the trace itself when it holds no other)."""
    la = trace.events["launch"]
    if trace.events.num_rows == 0 or pc.min(la).as_py() == pc.max(la).as_py() == launch:
        return trace
    return Trace(trace.events.filter(pc.equal(la, launch)), trace.meta)


def worker_init() -> None:
    """A worker process's first step: keep the memory its jobs free for the next job rather than
    giving it back to the system (glibc's ``mallopt``; nothing elsewhere). Each job allocates and
    frees arrays of hundreds of MB; returned to the system, every job faults them in afresh (a
    tenth of a second of system time per million rows)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        for param, value in ((-3, 1 << 30), (-1, 1 << 30), (-2, 256 << 20)):  # M_MMAP_THRESHOLD, TRIM, TOP_PAD
            libc.mallopt(param, value)
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


def launch_stats(trace: Trace, shift_ns: int, k0: int, k1: int) -> dict:
    """Where one launch's events land once shifted by ``shift_ns`` against its kernel slice
    [``k0``, ``k1``]: first and last event times, start and end slack, events outside the slice,
    and the launch's rows, CTAs and warps."""
    ev = trace.events
    st0 = ev["start_ns"].to_numpy()
    st = st0 + shift_ns
    en = np.maximum(ev["end_ns"].to_numpy(), st0) + shift_ns
    cta = ev["cta"].to_numpy()
    return {
        "first_ns": int(st.min()) if st.size else k0, "last_ns": int(en.max()) if en.size else k0,
        "start_slack_ns": (int(st.min()) - k0) if st.size else 0, "end_slack_ns": (k1 - int(en.max())) if en.size else 0,
        "outside": int(((st < k0) | (en > k1)).sum()), "rows": int(ev.num_rows),
        "ctas": _distinct_count(cta) if ev.num_rows else 0, "warps": _count_of(ev["kind"], "warp")}


def _distinct_count(x: np.ndarray) -> int:
    """How many distinct values ``x`` holds (a count table where they are small and non-negative)."""
    lo, hi = int(x.min()), int(x.max())
    if lo >= 0 and hi <= 4 * x.size + 1024:
        return int(np.count_nonzero(np.bincount(x, minlength=hi + 1)))
    return int(np.unique(x).size)


def _count_of(col, value: str) -> int:
    """Rows of a (dictionary-encoded) string column equal to ``value``."""
    n = 0
    for chunk in col.chunks:
        if pa.types.is_dictionary(chunk.type):
            codes = [i for i, v in enumerate(chunk.dictionary.to_pylist()) if v == value]
            n += int(np.isin(chunk.indices.to_numpy(zero_copy_only=False), codes).sum()) if codes else 0
        else:
            n += int(pc.sum(pc.equal(chunk.cast(pa.string()), value)).as_py() or 0)
    return n


def _bundle(source) -> Trace:
    if isinstance(source, Trace):
        return source
    key = os.fspath(source)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = load(key)
    return _LOADED[key]


def bundle_numbers(source) -> dict:
    """launch -> :func:`fa4trace.profiler.report.launch_numbers` of every launch of a bundle (path or
    Trace): what a worker computes while the merge is still reading the profiler trace."""
    tr = _bundle(source)
    if tr.events.num_rows == 0:
        return {}
    launches = sorted(set(pc.unique(tr.events["launch"]).to_pylist()))
    return {int(k): launch_numbers(launch_events(tr, k)) for k in launches}


def all_numbers(sources: list) -> list[dict]:
    """:func:`bundle_numbers` of each bundle, one after the other: a large merge gives this to one
    worker, which leaves the other core to the process reading the profiler trace."""
    return [bundle_numbers(s) for s in sources]


def render_launch(job: RenderJob) -> RenderResult:
    """The tracks and packets of one launch (and its numbers when asked); see the module docstring."""
    t, cpu = time.perf_counter(), time.process_time()
    tr = launch_events(_bundle(job.source), job.launch)
    path, nbytes, slices, nxt = None, 0, 0, (0, 0, 0)
    stats = None
    place = job.place
    if job.kernel_ns is not None:
        stats = launch_stats(tr, place.ts_offset_ns if place is not None else 0, *job.kernel_ns)
        if place is not None:
            place = replace(place, name=f"{place.name}{stats['ctas']} CTAs, {stats['warps']} warps")
    if place is not None:
        fd, path = tempfile.mkstemp(prefix="launch-", suffix=".part", dir=job.spool_dir)
        shown, occupancy = export_inputs(tr)  # roles and stage occupancy, as `fa4trace convert` draws them
        with os.fdopen(fd, "wb") as f:
            st = to_perfetto(shown, f, occupancy=occupancy, compress=job.compress, place=place)
        nbytes, slices, nxt = st.bytes, st.slices, (st.next_uuid, st.next_sequence_id, st.next_flow_id)
    numbers = launch_numbers(tr) if job.numbers else None
    return RenderResult(path, nbytes, slices, *nxt, numbers, time.perf_counter() - t, stats,
                        time.process_time() - cpu)
