"""One Perfetto trace from a torch.profiler trace and fa4trace bundles: host ops, CUDA streams,
and under each traced kernel the SMs, CTAs and warps of its launch.

Track tree of the output::

    fa4trace merge                               one slice: the merge report (JSON), read back by the viewer
    python (pid P)                               a process per host pid of the profiler trace
      thread T (python)                          cpu_op, user_annotation, cuda_runtime / cuda_driver ...
        thread T (python) · overlap 1            events that would break nesting (rare)
    GPU 0 · NVIDIA H200                          a process per CUDA device
      stream 7                                   kernel, gpu_memcpy, gpu_memset slices
        stream 7 · annotations                   gpu_user_annotation (they overlap the kernels)
        <kernel> · traced launch 0.1             one per traced launch: a slice over its kernel's time,
          <bundle> · launch 1: 8 CTAs, 96 warps    with the alignment numbers as args
            SM s > CTA c > warp w · role           fa4trace.export.perfetto.to_perfetto's tracks, placed here

Arrows: every launch call -> its kernel (Kineto's ``ac2g``, by correlation id), Kineto's other
flows (``fwdbwd``), each traced kernel -> its "traced launch" slice, and fa4trace's own
QK -> SOFTMAX -> PV flows inside each launch.

**Clocks.** Host and device events keep the profiler's times (Unix-epoch ns). A traced
launch's warps were timed by %globaltimer; :mod:`fa4trace.profiler.match` pairs the launch with
its kernel activity and records ``delta`` = kernel start − first warp start. ``align="start"``
(default) places each launch's first warp start at its kernel slice's start; ``align="clock"``
places every launch with one offset, the median delta, keeping %globaltimer's spacing between
launches. Either way the report gives, per launch, the end slack (kernel end − last warp end:
negative means warps outside the slice) and the number of events outside the slice, and over
the launches the spread of delta (largest |delta − median|): how far one clock offset is from
explaining every launch, the alignment error.

The host events are encoded in bulk (:func:`fa4trace.export.perfetto.encode_hot_packets`, one packet
sequence per track, interned names, an incremental clock), nesting made strict by
:func:`fa4trace.export.tracks.layout_tracks` and ordered by :func:`fa4trace.export.perfetto.slice_events`; each traced launch is written by
:func:`fa4trace.export.perfetto.to_perfetto` with a :class:`fa4trace.export.perfetto.Placement`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from ..trace.bundle import Trace, load
from ..trace.files import create_beside
from ..format.errors import Fa4traceError
from ..format.options import options as resolve_options
from ..export.packets import descriptor
from ..export.perfetto import Placement
from .host import host_flows, host_part, op_stack
from .kineto import KinetoTrace, load_kineto
from .match import Match, match_launches, traced_launches
from .options import ALIGN_MODES, MergeOptions
from .packets import Ids, append_file, report_slice, short, summary_slices
from .render import RenderJob, all_numbers, launch_events, launch_stats, render_launch
from .report import REPORT_SLICE, MergeReport

__all__ = ["merge", "attach", "ALIGN_MODES"]




# ---- traced launches ------------------------------------------------------------------------

def align_launches(matches: list, mode: str) -> tuple[dict, dict]:
    """Per match (by id): the ns added to its bundle's start_ns; and the clock statistics."""
    deltas = np.array([m.delta_ns for m in matches], np.int64)
    med = int(np.median(deltas)) if deltas.size else 0
    clock = {"n": int(deltas.size), "median_delta_ns": med,
             "spread_ns": int(np.abs(deltas - med).max()) if deltas.size else 0,
             "min_delta_ns": int(deltas.min()) if deltas.size else 0, "max_delta_ns": int(deltas.max()) if deltas.size else 0}
    shift = {}
    for m in matches:
        ln = m.launch
        t0 = ln.first_ns - ln.first_rel_ns  # the bundle's t0_globaltimer_ns: start_ns counts from it
        # start: the first warp start lands on the kernel's start; clock: one offset for all
        shift[id(m)] = (ln.first_ns + int(m.delta_ns) - ln.first_rel_ns) if mode == "start" else t0 + med
    return shift, clock


PARALLEL_ROWS = 2_000_000  # from this many rows of traced launches on, they are written by worker processes
UUID_WARPS = 1 << 56  # parallel writing: launch k's track uuids count up from UUID_WARPS + (k << 32)


def _inputs(profiler_trace, traces, names) -> tuple:
    """The Kineto trace and the bundles, read at the same time: bundles in a thread pool (Parquet
    reads leave the GIL), the JSON in this thread. Returns (kt, bundles, labels, paths)."""
    labels, paths, todo = [], [], []
    for i, t in enumerate(traces):
        if isinstance(t, Trace):
            paths.append(None)
            labels.append((names[i] if names and i < len(names) else None) or t.name)
        else:
            paths.append(str(Path(t).resolve()) if Path(t).exists() else str(t))
            labels.append(Path(t).name)
            todo.append(i)
    if not traces:
        raise Fa4traceError("no bundle to merge: name at least one fa4trace bundle")
    bundles = list(traces)
    with ThreadPoolExecutor(max(1, min(2, len(todo)))) as ex:
        futs = {i: ex.submit(load, traces[i]) for i in todo}
        kt = profiler_trace if isinstance(profiler_trace, KinetoTrace) else load_kineto(profiler_trace)
        for i, f in futs.items():
            bundles[i] = f.result()
    return kt, bundles, labels, paths


def launch_entry(kt: KinetoTrace, m: Match, sh: int, drawn: bool, fid: int, label: str, clock: dict,
                 op_names: list, stats: dict | None) -> dict:
    """The report's row of one traced launch: its kernel, how it was matched, where its events
    land (``stats``: :func:`fa4trace.profiler.render.launch_stats`, None: filled in later)."""
    ln = m.launch
    k0, k1 = int(kt.ts[m.row]), int(kt.ts[m.row] + kt.dur[m.row])
    e = {
        "bundle": ln.bundle, "launch": ln.launch, "label": label, "kernel": kt.names[int(kt.name[m.row])],
        "method": m.method, "candidates": m.candidates, "ambiguous": bool(m.ambiguous),
        "stream": int(kt.stream[m.row]), "device": int(kt.device[m.row]), "correlation": int(kt.correlation[m.row]),
        "kernel_start_ns": k0, "kernel_dur_ns": k1 - k0, "delta_ns": int(m.delta_ns),
        "residual_ns": int(m.delta_ns) - clock["median_delta_ns"], "shift_ns": int(sh), "span_ns": int(ln.span_ns)}
    e.update(stats or dict.fromkeys(STATS_KEYS))
    e.update({"ops": op_names, "warps_drawn": bool(drawn), "flow_id": int(fid)})
    return e


STATS_KEYS = ("first_ns", "last_ns", "start_slack_ns", "end_slack_ns", "outside", "rows", "ctas", "warps")


def _pool(traces: list, workers: int):
    """Worker processes for a large merge (>= PARALLEL_ROWS bundle rows and ``workers`` > 1), else
    None. Spawned: nothing of this process's threads (Arrow's, the bundle readers') is inherited."""
    rows = 0
    for t in traces:
        try:
            rows += t.events.num_rows if isinstance(t, Trace) else pq.ParquetFile(t).metadata.num_rows
        except (OSError, ValueError, pa.ArrowException):
            pass  # reading the bundle says what is wrong with it, in one line
    if workers < 2 or rows < PARALLEL_ROWS:
        return None
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))


def _render_all(jobs: list, ids: Ids, pool, host_bound: int, build_host):
    """Every launch's part (fa4trace.profiler.render), and the host part.

    Without ``pool``: one after the other in this process, each launch's ids continuing where the
    last one's ended. With it: in the worker processes, each launch given id ranges of its own up
    front (its rows bound its tracks, sequences and arrows; the host part's bound is
    ``host_bound``), while this process builds the host part. Returns (host, results)."""
    rows = [int(j.rows) for j in jobs]
    seq_need = sum(2 * r + 16 for r in rows) + 2 * host_bound + 16
    if pool is None or ids.seq + seq_need >= 2**32 - 1:
        host = build_host()
        out = []
        for j in jobs:
            if j.job.place is not None:
                j.job.place = replace(j.job.place, uuid_base=ids.uuid, first_sequence_id=ids.seq,
                                      first_flow_id=ids.flow)
            r = render_launch(j.job)
            if j.job.place is not None:
                ids.uuid, ids.seq, ids.flow = r.next_uuid, r.next_sequence_id, r.next_flow_id
            out.append(r)
        return host, out
    seq = ids.seq + 2 * host_bound + 16
    flow = ids.flow + host_bound + 1
    for k, (j, r) in enumerate(zip(jobs, rows)):
        if j.job.place is not None:
            j.job.place = replace(j.job.place, uuid_base=UUID_WARPS + (k << 32), first_sequence_id=seq,
                                  first_flow_id=flow)
            seq += 2 * r + 16
            flow += r + 1
    futs = [pool.submit(render_launch, j.job) for j in jobs]
    host = build_host()
    return host, [f.result() for f in futs]


@dataclass
class _Job:
    job: RenderJob
    rows: int


def merge(profiler_trace, traces, out, *, options: MergeOptions | None = None, force: bool = False,
          names: list[str] | None = None, workers: int | None = None, align: str | None = None,
          max_launches: int | None = None, compress: bool | None = None, analysis: bool | None = None,
          tolerance_ns: int | None = None, max_clock_offset_ns: int | None = None,
          allow_unmatched: bool | None = None) -> MergeReport:
    """Write one Perfetto trace of ``profiler_trace`` (a torch.profiler Chrome JSON path or a
    :class:`KinetoTrace`) with the warps of ``traces`` (bundles: :class:`Trace` objects or
    paths) under their kernels (module docstring). Returns the report.

    ``options`` (:class:`MergeOptions`), or its fields as keywords (``align``, ``max_launches``,
    ``compress``, ``analysis``, ``tolerance_ns``, ``max_clock_offset_ns``, ``allow_unmatched``;
    both at once is refused in one line). ``force``: replace an existing ``out``. ``names``:
    labels of in-memory bundles. ``workers``: processes that write a large merge's launches
    (default: 2, or 1 on one core). Raises Fa4traceError (one line) when a bundle has no launch
    in the trace (unless ``allow_unmatched``); nothing is written then."""
    t_start, cpu_start = time.perf_counter(), time.process_time()
    opts = resolve_options(MergeOptions, options, "merge", "options", align=align, max_launches=max_launches,
                           compress=compress, analysis=analysis, tolerance_ns=tolerance_ns,
                           max_clock_offset_ns=max_clock_offset_ns, allow_unmatched=allow_unmatched)
    out = Path(out)
    if out.exists() and not force:
        raise Fa4traceError(f"{out} exists; refusing to overwrite it (add --force)")
    if out.is_dir():
        raise Fa4traceError(f"{out} is a directory")
    stages = {}
    traces = list(traces)
    with contextlib.ExitStack() as stack:
        pool = _pool(traces, workers or min(2, os.cpu_count() or 1))
        if pool is not None:
            stack.callback(pool.shutdown, cancel_futures=True)
        # a large merge's first worker computes the numbers while this process reads (one job:
        # the other core stays with the reader; the launches' jobs queue behind it)
        numbers = pool.submit(all_numbers, traces) if pool is not None and opts.analysis else None
        report = _merge(profiler_trace, traces, out, pool, numbers, stages, t_start, opts, names)
    # CPU time: this process's, and the launches' (in this process, or the workers' where they drew them)
    report.written["cpu_s"] = {"main": round(time.process_time() - cpu_start, 2),
                               "launches": report.written.pop("launch_cpu_s")}
    return report


def _merge(profiler_trace, traces, out, pool, numbers, stages, t_start, opts: MergeOptions, names) -> MergeReport:
    """merge()'s steps, given its worker pool (or None) and the numbers' future (or None)."""
    kt, bundles, labels, paths = _inputs(profiler_trace, traces, names)
    stages["read_s"] = time.perf_counter() - t_start
    launches = traced_launches(bundles)
    res = match_launches(kt, launches, tolerance_ns=opts.tolerance_ns, max_clock_offset_ns=opts.max_clock_offset_ns)
    per_bundle = np.bincount([m.launch.bundle for m in res.matches], minlength=len(bundles))
    if not opts.allow_unmatched:
        for b in range(len(bundles)):
            if per_bundle[b] == 0:
                why = next((u.reason for u in res.unmatched if u.launch.bundle == b), "it holds no events")
                raise Fa4traceError(f"{labels[b]}: none of its launches is in {Path(kt.path).name}: {why}")
    matches = sorted(res.matches, key=lambda m: int(kt.ts[m.row]))
    shift, clock = align_launches(matches, opts.align)
    gpu = kt.gpu_names()
    report = MergeReport(profiler_trace=str(kt.path), output=str(out), align=opts.align,
                         max_launches=opts.max_launches,
                         clock=clock, notes=list(res.notes))
    for b, tr in enumerate(bundles):
        report.bundles.append({"index": b, "name": labels[b], "path": paths[b], "kernel": tr.name,
                               "launches": len({ln.launch for ln in launches if ln.bundle == b}),
                               "matched": int(per_bundle[b]), "gpu": tr.info.gpu.name})
    for u in res.unmatched:
        report.unmatched.append({"bundle": u.launch.bundle, "launch": u.launch.launch, "reason": u.reason})
    bgpu = {b["gpu"] for b in report.bundles if b["gpu"]}
    if gpu and bgpu and not (bgpu & set(gpu)):
        report.notes.append(f"the bundles were recorded on {', '.join(sorted(bgpu))}, the profiler trace on "
                            f"{', '.join(gpu)}")

    # ids: each traced kernel's arrow to its "traced launch" slice first, then the host's, then the warps'
    ids = Ids()
    calls = kt.launch_calls()
    by_track: dict = {}
    drawn_count: dict = {}
    placed = []
    for m in matches:
        b = m.launch.bundle
        drawn = opts.max_launches is None or drawn_count.get(b, 0) < opts.max_launches
        drawn_count[b] = drawn_count.get(b, 0) + int(drawn)
        tr = launch_events(bundles[b], m.launch.launch)
        call = calls.get(int(kt.correlation[m.row]))
        ops = op_stack(kt, call, by_track) if call is not None else []
        k0, k1 = int(kt.ts[m.row]), int(kt.ts[m.row] + kt.dur[m.row])
        stats = launch_stats(tr, shift[id(m)], k0, k1)
        placed.append((m, tr, launch_entry(kt, m, shift[id(m)], drawn, ids.new_flows(1), labels[b], clock, ops,
                                           stats)))
    report_seq, summary_seq, desc_seq = ids.new_seq(), ids.new_seq(), ids.new_seq()
    merge_track = ids.new_uuid()
    traced_tracks = [ids.new_uuid() for _ in placed]
    spool = tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent if out.parent.exists() else None)
    jobs = []
    for i, (m, tr, e) in enumerate(placed):
        place = None
        if e["warps_drawn"]:
            place = Placement(parent_uuid=traced_tracks[i], name=f"{short(e['label'], 40)} · launch {e['launch']}: "
                              f"{e['ctas']} CTAs, {e['warps']} warps", uuid_base=0, first_sequence_id=0,
                              ts_offset_ns=e["shift_ns"])
        inline_numbers = opts.analysis and numbers is None
        if place is not None or inline_numbers:
            src = paths[m.launch.bundle] or tr
            jobs.append((i, _Job(RenderJob(src, m.launch.launch, place, opts.compress, inline_numbers, spool.name),
                                 e["rows"])))
    stages["match_s"] = time.perf_counter() - t_start - stages["read_s"]
    flows = host_flows(kt)
    extra = {m.row: e["flow_id"] for m, _, e in placed}
    try:
        host, results = _render_all([j for _, j in jobs], ids, pool, kt.n + 16,
                                    lambda: host_part(kt, ids, *flows, extra, gpu[0] if gpu else ""))
        stages["render_s"] = time.perf_counter() - t_start - sum(stages.values())
        report.host = {"events": int(kt.n), "slices": host.slices, "tracks": host.tracks, "flows": host.flows,
                       "skipped": dict(kt.skipped), "start_ns": host.start_ns, "end_ns": host.end_ns,
                       "gpu": gpu, "base_ns": kt.base_ns}
        head = bytearray()
        for i, ((m, tr, e), u) in enumerate(zip(placed, traced_tracks)):
            head.extend(descriptor(u, f"{short(e['label'])} · traced launch {e['bundle']}.{e['launch']}", desc_seq,
                                    parent=host.lane0_uuid.get(int(kt.track[m.row])), rank=1000 + i))
        for (i, _j), r in zip(jobs, results):
            if r.numbers is not None:
                placed[i][2]["numbers"] = r.numbers
        if numbers is not None:
            per_bundle_numbers = numbers.result()
            for m, _t, e in placed:
                e["numbers"] = per_bundle_numbers[m.launch.bundle].get(m.launch.launch, {})
        report.launches = [e for _m, _t, e in placed]
        slices = host.slices + sum(r.slices for r in results)
        with _atomic(out) as f:
            f.write(descriptor(merge_track, REPORT_SLICE, desc_seq, rank=-1000))
            f.write(report_slice(report, merge_track, report_seq, host.start_ns, max(host.end_ns, host.start_ns)))
            f.write(host.head)
            f.write(bytes(head))
            f.write(host.setup)
            f.write(host.hot)
            f.write(summary_slices(placed, traced_tracks, summary_seq, opts.max_launches))
            for r in results:
                if r.path:
                    append_file(f, r.path)
    finally:
        spool.cleanup()
    stages["write_s"] = time.perf_counter() - t_start - sum(stages.values())
    report.written = {"bytes": out.stat().st_size, "slices": int(slices), "seconds": time.perf_counter() - t_start,
                      "stages": {k: round(v, 3) for k, v in stages.items()},
                      "launch_seconds": [round(r.seconds, 3) for r in results],
                      "launch_cpu_s": round(sum(r.cpu_seconds for r in results), 2)}
    return report


class _atomic:
    """Write next to the target and rename: an interrupted merge never leaves half a file."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = create_beside(self.path)  # mode 0666 less the umask, as other outputs (mkstemp: 0600)
        self.f = open(self.tmp, "wb")
        return self.f

    def __exit__(self, exc_type, exc, tb):
        self.f.close()
        if exc_type is None:
            os.replace(self.tmp, self.path)
        elif os.path.exists(self.tmp):
            os.unlink(self.tmp)
        return False


# ---- inside a torch.profiler session ------------------------------------------------------------

def attach(prof, traces, path, *, chrome_trace=None, **kw) -> MergeReport:
    """Merge the bundles of a recording into the trace of a finished ``torch.profiler.profile``.

    ``prof``: the profiler (after its block ended), or a path to its exported Chrome trace.
    ``traces``: a bundle :class:`Trace`, a path, a list of them, or a recording
    (``fa4trace.instrument()``'s: every compiled kernel that ran gives its bundle).
    ``path``: the merged Perfetto file. ``chrome_trace``: where the profiler's Chrome trace is
    exported and kept (for another merge or for torch's own tools); default a temporary file
    next to ``path``, removed after. A profile exports once only (torch refuses a second
    ``export_chrome_trace``): to merge it again, pass the kept file as ``prof``. Keywords go to
    :func:`merge`. No torch import here."""
    bundles = _bundles_of(traces)
    if not hasattr(prof, "export_chrome_trace"):
        return merge(prof, bundles, path, **kw)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if chrome_trace is not None:
        kt = load_kineto(_export_chrome_trace(prof, Path(chrome_trace)))
        return merge(kt, bundles, path, **kw)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".kineto.json", dir=out.parent)
    os.close(fd)
    try:
        kt = load_kineto(_export_chrome_trace(prof, Path(tmp)))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    kt.path = "torch.profiler (exported in memory)"
    return merge(kt, bundles, path, **kw)


def _export_chrome_trace(prof, dest: Path) -> Path:
    """``prof.export_chrome_trace(dest)``, one clear line where torch refuses (a profile that was
    exported already: torch 2.11 on says "Trace is already saved")."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        prof.export_chrome_trace(str(dest))
    except RuntimeError as exc:
        if "already saved" in str(exc):
            raise Fa4traceError("this torch.profiler profile was exported already (torch exports a profile "
                                "once): pass the exported Chrome trace file to attach instead of the "
                                "profiler") from None
        raise
    return dest


def _bundles_of(traces) -> list:
    if isinstance(traces, (Trace, str, os.PathLike)):
        return [traces]
    kernels = getattr(traces, "kernels", None)
    if kernels is not None and not isinstance(traces, (list, tuple)):
        out = []
        for k in kernels:
            try:
                out.append(k.trace())
            except Fa4traceError:  # a kernel compiled but never launched
                continue
        return out
    return list(traces)
