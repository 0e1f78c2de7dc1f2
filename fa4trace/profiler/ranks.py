"""One Perfetto trace of several ranks: each rank's torch.profiler trace and bundles, on one clock.

A tensor-parallel program runs one process per GPU (or several on one GPU), each with its own
torch.profiler trace and its own bundles. :func:`merge_ranks` writes them all into one file::

    fa4trace merge                                  the report (JSON): ranks, clocks, launches
    rank 0 · host · pid 4242 · GPU 0                a process track per rank
      thread 4242 (python)                          its host threads (cpu_op, launch calls ...)
      GPU 0 · NVIDIA H200                           its device
        stream 7                                    kernels (NCCL's on their own stream)
          <kernel> · traced launch 0.1              each traced launch, as in a merge of one process
            <bundle> · launch 1: 8 CTAs, 96 warps     (fa4trace.profiler.merge): SMs, CTAs, warps
    rank 1 · ...

**Clocks.** Each rank's events keep its profiler's Unix-epoch times, less the rank's clock
offset against the first rank, which its collectives give (:mod:`fa4trace.profiler.collectives`:
the ranks' NCCL kernels of one collective end together). ``rank_clock="nccl"`` (default) takes
the offsets out; ``"epoch"`` measures them and keeps the profilers' clocks. Either way the
report states the method and the cross-rank alignment error: how far apart the ranks' ends of
one collective still are once placed (median and worst over the collectives), and each rank's
warps are placed against its own kernels as in a merge of one process (their own alignment error
per rank).

**Streaming.** Ranks are read one after the other; a rank's host part is written as soon as its
offset is known (from the ranks read before it), its traced launches are drawn by worker
processes (each reads its bundle once: the events' placement, the tracks, the numbers) while the
next rank's profiler trace is read, and at most two ranks are held at a time. The report,
written first so that readers find it at the start of the file, takes a slot reserved for it
and is written into that slot once everything else is (a report that outgrows its slot makes
the file be written once more behind it).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections import Counter, deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..export.packets import descriptor
from ..export.perfetto import Placement
from ..format.errors import Fa4traceError
from ..format.options import options as resolve_options
from ..trace.bundle import Trace, read_meta
from ..trace.files import create_beside
from ..trace.meta import BundleMeta
from .collectives import SIGNIFICANT, align_rank, anchors_of, residuals
from .host import host_flows, host_part, op_stack
from .kineto import KinetoTrace, load_kineto
from .match import match_launches, traced_launches
from .merge import PARALLEL_ROWS, UUID_WARPS, align_launches, launch_entry
from .options import MergeOptions
from .packets import Ids, append_file, report_begin, report_end, short, summary_slices
from .render import RenderJob, render_launch, worker_init
from .report import REPORT_SLICE, MergeReport

__all__ = ["RankInput", "merge_ranks", "head_from_footer", "RANK_PID"]

RANK_PID = 0x7FA60000  # pid of a rank's process track where two ranks have the same pid
SEQ_WARPS = 1 << 21  # the traced launches' packet sequences count up from here (the host parts' from 1):
FLOW_WARPS = 1 << 28  # ... and their flow ids from here; low, as every hot packet carries its sequence id
REPORT_RESERVE = 256 << 10  # bytes kept for the report, and per launch, bundle and rank below
REPORT_PER_LAUNCH, REPORT_PER_BUNDLE, REPORT_PER_RANK = 4096, 2048, 8192
HEAD_COLUMNS = ["launch", "start_ns", "end_ns", "cta"]  # what matching reads of a bundle
PLACEHOLDER_T0 = 1 << 62  # the report slice's start until it is known (the same varint length)
FEW_COLLECTIVES = 8  # fewer paired collectives than this: the report says the clocks' figures are rough


@dataclass
class RankInput:
    """One rank: its number, its torch.profiler trace (a path or a KinetoTrace) and its bundles
    (paths or Traces; ``names``: labels of in-memory ones)."""

    rank: int
    profile: object
    bundles: list = field(default_factory=list)
    names: list | None = None


@dataclass
class _Head:
    """What matching needs of a bundle, read without its events' other columns."""

    index: int  # the bundle's index in the merge (over every rank)
    label: str
    path: str | None
    source: object  # what a render job reads: the path, or the Trace
    head: Trace  # launch, start_ns, end_ns, cta, warp and the metadata
    rows: dict  # launch -> rows


@dataclass
class _Rank:
    """A rank between its host part and its traced launches' tail (summaries and tracks)."""

    info: dict  # the report's rank entry
    entries: list  # report entries of its traced launches, in time order
    parents: list  # per entry: uuid of its stream track
    tracks: list  # per entry: uuid of its "traced launch" track
    futures: list  # per entry: the render job's future
    desc_seq: int
    summary_seq: int


class _Inline:
    """A pool that runs each job when it is given (small merges, or one core)."""

    def submit(self, fn, *args):
        f = Future()
        try:
            f.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits, as a pool would
            f.set_exception(exc)
        return f

    def shutdown(self, **kw):
        pass


def _read_heads(inp: RankInput, first_index: int) -> list[_Head]:
    """The rank's bundles, checked (one-line errors) and read for matching."""
    out = []
    for j, b in enumerate(inp.bundles):
        idx = first_index + j
        if isinstance(b, Trace):
            name = (inp.names[j] if inp.names and j < len(inp.names) else None) or b.name
            ev = b.events
            out.append(_Head(idx, name, None, b, b, _rows_per_launch(ev)))
            continue
        path = Path(b)
        meta = read_meta(path)
        ev, rows = head_from_footer(path)
        if ev is None:
            try:
                ev = pq.read_table(path, columns=HEAD_COLUMNS)
            except (pa.ArrowException, OSError, ValueError) as exc:
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise Fa4traceError(f"{path}: bundle data is unreadable ({first})") from None
            ev = ev.replace_schema_metadata(None)
            rows = _rows_per_launch(ev)
        out.append(_Head(idx, path.name, str(path.resolve()), str(path.resolve()), Trace(ev, meta), rows))
    return out


def head_from_footer(path: Path) -> tuple:
    """What matching reads of a bundle of one launch, from its Parquet footer: the column
    statistics give the launch's first start, last end and largest CTA without reading its
    rows (a worker reads them once, to draw them). Returns (a two-row table with those values,
    {launch: rows}), or (None, None) where the bundle holds several launches or its footer
    does not say (its rows are read then)."""
    try:
        md = pq.ParquetFile(path).metadata
        names = [md.schema.column(i).name for i in range(md.num_columns)]
        lo: dict = {}
        hi: dict = {}
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            for c in HEAD_COLUMNS:
                st = rg.column(names.index(c)).statistics
                if st is None or not st.has_min_max or st.null_count:
                    return None, None
                lo[c] = min(lo.get(c, st.min), st.min)
                hi[c] = max(hi.get(c, st.max), st.max)
    except (pa.ArrowException, OSError, ValueError, TypeError):
        return None, None  # reading the rows says what is wrong with it
    if md.num_rows == 0 or md.num_row_groups == 0 or lo["launch"] != hi["launch"]:
        return None, None
    head = pa.table({"launch": pa.array([lo["launch"]] * 2, pa.int16()),
                     "start_ns": pa.array([lo["start_ns"]] * 2, pa.int64()),
                     "end_ns": pa.array([hi["end_ns"]] * 2, pa.int64()),
                     "cta": pa.array([lo["cta"], hi["cta"]], pa.int32())})
    return head, {int(lo["launch"]): int(md.num_rows)}


def _rows_per_launch(ev: pa.Table) -> dict:
    la = ev["launch"].to_numpy().astype(np.int64)
    ids, n = np.unique(la, return_counts=True)
    return dict(zip(ids.tolist(), n.tolist()))


def _bundle_rows(inputs: list[RankInput]) -> int:
    rows = 0
    for inp in inputs:
        for b in inp.bundles:
            try:
                rows += b.events.num_rows if isinstance(b, Trace) else pq.ParquetFile(b).metadata.num_rows
            except (OSError, ValueError, pa.ArrowException):
                pass  # reading the bundle says what is wrong with it, in one line
    return rows


def _report_reserve(inputs: list[RankInput]) -> int:
    """Bytes kept for the report: a bound from the counts of ranks, bundles and launches."""
    n_b = n_l = 0
    for inp in inputs:
        for b in inp.bundles:
            n_b += 1
            try:
                info = b.info if isinstance(b, Trace) else BundleMeta.from_meta(read_meta(b))
                n_l += max(1, len(info.launches))
            except Fa4traceError:
                n_l += 1  # reading it later says what is wrong with it
    return REPORT_RESERVE + REPORT_PER_LAUNCH * n_l + REPORT_PER_BUNDLE * n_b + REPORT_PER_RANK * len(inputs)


class _Output:
    """The merged file, written next to its target (fa4trace.trace.files: the mode of any new
    file) and renamed when complete (never half a file); ``put`` writes the report into its slot."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = create_beside(path)
        self.f = open(self.tmp, "wb")

    def tell(self) -> int:
        return self.f.tell()

    def write(self, data: bytes) -> None:
        self.f.write(data)

    def append(self, part: str) -> None:
        append_file(self.f, part)

    def put(self, offset: int, data: bytes) -> None:
        self.f.flush()
        os.pwrite(self.f.fileno(), data, offset)

    def rewrite_head(self, head: bytes, skip: int) -> None:
        """Replace the file's first ``skip`` bytes by ``head`` (a report that outgrew its slot)."""
        self.f.close()
        tmp = create_beside(self.path)
        with open(tmp, "wb") as g, open(self.tmp, "rb") as old:
            g.write(head)
            old.seek(skip)
            while True:
                chunk = old.read(16 << 20)
                if not chunk:
                    break
                g.write(chunk)
        os.unlink(self.tmp)
        self.tmp = tmp
        self.f = open(self.tmp, "ab")

    def commit(self) -> None:
        self.f.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.f.close()
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)


def merge_ranks(ranks: list[RankInput], out, *, options: MergeOptions | None = None, force: bool = False,
                workers: int | None = None, align: str | None = None, rank_clock: str | None = None,
                max_launches: int | None = None, compress: bool | None = None, analysis: bool | None = None,
                tolerance_ns: int | None = None, max_clock_offset_ns: int | None = None,
                allow_unmatched: bool | None = None) -> MergeReport:
    """Write one Perfetto trace of several ranks (module docstring). Returns the report.

    ``ranks``: one :class:`RankInput` each (rank numbers distinct). ``options``
    (:class:`MergeOptions`), or its fields as keywords, as :func:`fa4trace.profiler.merge`'s, per
    rank, and ``rank_clock``: "nccl" or "epoch" (module docstring). ``workers``: processes that
    draw the traced launches of a large merge (default 2, or 1 on one core). Raises
    Fa4traceError (one line) for bad input; nothing is written then."""
    t_start, cpu_start = time.perf_counter(), time.process_time()
    opts = resolve_options(MergeOptions, options, "merge_ranks", "options", align=align, rank_clock=rank_clock,
                           max_launches=max_launches, compress=compress, analysis=analysis,
                           tolerance_ns=tolerance_ns, max_clock_offset_ns=max_clock_offset_ns,
                           allow_unmatched=allow_unmatched)
    ranks = list(ranks)
    if not ranks:
        raise Fa4traceError("no rank to merge: name each rank's torch.profiler trace")
    dup = [r for r, n in Counter(int(x.rank) for x in ranks).items() if n > 1]
    if dup:
        raise Fa4traceError(f"rank {dup[0]} is given twice: each rank has one torch.profiler trace")
    for x in ranks:
        if not x.bundles and not opts.allow_unmatched:
            raise Fa4traceError(f"rank {x.rank} has no bundle: name its fa4trace bundles after its profiler trace")
    out = Path(out)
    if out.exists() and not force:
        raise Fa4traceError(f"{out} exists; refusing to overwrite it (add --force)")
    if out.is_dir():
        raise Fa4traceError(f"{out} is a directory")
    workers = workers or min(2, os.cpu_count() or 1)
    with contextlib.ExitStack() as stack:
        pool = _Inline()
        if workers >= 2 and _bundle_rows(ranks) >= PARALLEL_ROWS:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=worker_init)
            stack.callback(pool.shutdown, cancel_futures=True)
        spool = stack.enter_context(tempfile.TemporaryDirectory(
            prefix=f".{out.name}.", dir=out.parent if out.parent.exists() else None))
        output = _Output(out)
        try:
            report = _write(ranks, out, output, pool, spool, t_start, opts)
        except BaseException:
            output.abort()
            raise
        output.commit()
    report.written["bytes"] = out.stat().st_size
    report.written["seconds"] = time.perf_counter() - t_start
    # CPU time: this process's, and the launches' (in this process, or the workers' where they drew them)
    report.written["cpu_s"] = {"main": round(time.process_time() - cpu_start, 2),
                               "launches": report.written.pop("launch_cpu_s")}
    return report


def _write(ranks, out, output: _Output, pool, spool, t_start, opts: MergeOptions) -> MergeReport:
    """merge_ranks's steps, given the output, the pool and the spool folder."""
    stages = {"read_s": 0.0, "place_s": 0.0, "host_s": 0.0, "wait_s": 0.0, "write_s": 0.0}
    ids = Ids()
    report = MergeReport(profiler_trace=", ".join(_name(x.profile) for x in ranks), output=str(out),
                         align=opts.align, max_launches=opts.max_launches)
    report_track, report_seq = ids.new_uuid(), ids.new_seq()
    top_seq = ids.new_seq()
    head = descriptor(report_track, REPORT_SLICE, top_seq, rank=-1000)
    reserve = _report_reserve(ranks)
    placeholder = report_begin(" " * reserve, report_track, report_seq, PLACEHOLDER_T0)
    output.write(head)
    slot = output.tell()
    output.write(placeholder)
    anchors: dict = {}
    clocks: dict = {}
    cursor = {"launch": 0, "seq": SEQ_WARPS, "flow": FLOW_WARPS, "bundle": 0}
    pending: deque = deque()
    used_pids: set = set()
    t_min, t_max, slices, events = None, None, 0, 0
    results_seconds, results_cpu = [], []
    for inp in ranks:
        t = time.perf_counter()
        kt = inp.profile if isinstance(inp.profile, KinetoTrace) else load_kineto(inp.profile)
        heads = _read_heads(inp, cursor["bundle"])
        cursor["bundle"] += len(heads)
        stages["read_s"] += time.perf_counter() - t
        t = time.perf_counter()
        state, host_job = _place_rank(inp, kt, heads, ids, pool, spool, cursor, anchors, clocks, used_pids, report,
                                      opts)
        stages["place_s"] += time.perf_counter() - t
        t = time.perf_counter()
        host = host_job()
        host_job = kt = None  # the rank's profiler trace is no longer needed: free it before the next
        if ids.seq >= SEQ_WARPS or ids.flow >= FLOW_WARPS:
            raise Fa4traceError(f"too many host tracks or arrows for one merged file (over {SEQ_WARPS:,} tracks or "
                                f"{FLOW_WARPS:,} arrows in the profiler traces): merge fewer ranks at a time")
        stages["host_s"] += time.perf_counter() - t
        t = time.perf_counter()
        output.write(state.info.pop("_descriptor"))
        output.write(host.head)
        output.write(host.setup)
        output.write(host.hot)
        stages["write_s"] += time.perf_counter() - t
        state.parents = [host.lane0_uuid.get(p) for p in state.parents]
        slices += host.slices
        events += host.slices
        if host.slices:
            t_min = host.start_ns if t_min is None else min(t_min, host.start_ns)
            t_max = host.end_ns if t_max is None else max(t_max, host.end_ns)
        state.info.update(events=int(host.slices), tracks=int(host.tracks), flows=int(host.flows),
                          start_ns=int(host.start_ns), end_ns=int(host.end_ns))
        pending.append(state)
        while len(pending) > 1:  # hold two ranks at most: the one just written and the one drawing
            slices += _finish_rank(pending.popleft(), output, stages, opts.max_launches, results_seconds, results_cpu)
    while pending:
        slices += _finish_rank(pending.popleft(), output, stages, opts.max_launches, results_seconds, results_cpu)

    report.rank_clock = _rank_clock_report(anchors, clocks, opts.rank_clock, report)
    report.host = {"events": int(events), "slices": int(events), "start_ns": int(t_min or 0), "end_ns": int(t_max or 0),
                   "gpu": sorted({g for r in report.ranks for g in r.get("gpu") or []}), "ranks": len(report.ranks)}
    report.launches.sort(key=lambda e: (e["kernel_start_ns"], e["rank"]))
    n = sum(r["clock"].get("n", 0) for r in report.ranks)
    report.clock = {"n": int(n), "per_rank": True, "median_delta_ns": None,
                    "spread_ns": int(max((r["clock"].get("spread_ns", 0) for r in report.ranks), default=0))}
    t = time.perf_counter()
    t0 = int(t_min or 0)
    output.write(report_end(report_track, report_seq, max(int(t_max or 0), t0)))
    text = report.to_json()  # what was merged, not how long it took: that is returned (written) only
    begin = report_begin(text + " " * max(0, reserve - len(text)), report_track, report_seq, t0)
    if len(begin) == len(placeholder):
        output.put(slot, begin)
    else:  # the report outgrew its slot (or its start time its varint): write the file once more
        output.rewrite_head(head + begin, slot + len(placeholder))
    stages["report_s"] = time.perf_counter() - t
    report.written = {"slices": int(slices), "stages": {k: round(v, 3) for k, v in stages.items()},
                      "launch_seconds": results_seconds, "launch_cpu_s": round(sum(results_cpu), 2)}
    return report


def _name(profile) -> str:
    return Path(profile.path).name if isinstance(profile, KinetoTrace) else Path(profile).name


def _main_pid(kt: KinetoTrace):
    """The rank's process: the pid most of its host events (launch calls first) are on."""
    rows = np.flatnonzero(kt.cat_mask("cuda_runtime", "cuda_driver"))
    if not rows.size:
        rows = np.arange(kt.n)
    pids = Counter(kt.tracks[t].pid for t in kt.track[rows].tolist() if not kt.tracks[t].device
                   and isinstance(kt.tracks[t].pid, int))
    return pids.most_common(1)[0][0] if pids else None


def _place_rank(inp: RankInput, kt: KinetoTrace, heads: list, ids: Ids, pool, spool, cursor, anchors, clocks, used_pids,
                report: MergeReport, opts: MergeOptions):
    """Match a rank's launches, find its clock offset, start its render jobs; return its state and
    a function that builds its host part (run next, while the workers draw)."""
    r = int(inp.rank)
    launches = traced_launches([h.head for h in heads])
    for ln in launches:
        ln.bundle = heads[ln.bundle].index
    res = match_launches(kt, launches, tolerance_ns=opts.tolerance_ns, max_clock_offset_ns=opts.max_clock_offset_ns)
    per_bundle = Counter(m.launch.bundle for m in res.matches)
    for h in heads:
        if not per_bundle[h.index] and not opts.allow_unmatched:
            why = next((u.reason for u in res.unmatched if u.launch.bundle == h.index), "it holds no events")
            raise Fa4traceError(f"rank {r}: {h.label}: none of its launches is in {Path(kt.path).name}: {why}")
    # the rank's clock against the ranks before it (fa4trace.profiler.collectives)
    anchors[r] = anchors_of(kt)
    clocks[r] = align_rank(anchors, r, clocks)
    measured = clocks[r]["offset_ns"]
    off = int(measured) if opts.rank_clock == "nccl" and measured is not None and clocks[r]["significant"] else 0
    if off:
        kt.ts = kt.ts - off
        for m in res.matches:
            m.delta_ns -= off
    matches = sorted(res.matches, key=lambda m: int(kt.ts[m.row]))
    shift, clock = align_launches(matches, opts.align)
    pid = _main_pid(kt)
    track_pid = pid if isinstance(pid, int) and pid not in used_pids and 0 < pid < 0x7FA00000 else RANK_PID + r
    used_pids.add(pid)
    kernels = kt.kernels()
    devices = sorted({int(d) for d in kt.device[kernels].tolist() if d >= 0})
    gpu = kt.gpu_names()
    host_name = kt.metadata.get("host_name") if isinstance(kt.metadata.get("host_name"), str) else None
    root = ids.new_uuid()
    name = " · ".join([f"rank {r}", *([host_name] if host_name else []), f"pid {pid}" if pid is not None else "pid ?",
                       f"GPU {', '.join(map(str, devices))}" if devices else "no GPU activity"])
    desc_seq = ids.new_seq()
    info = {"rank": r, "profiler_trace": _name(inp.profile), "path": str(kt.path), "host": host_name, "pid": pid,
            "track_pid": int(track_pid), "devices": devices, "gpu": gpu,
            "distributed": kt.metadata.get("distributedInfo") if isinstance(kt.metadata.get("distributedInfo"), dict)
            else None,
            "bundles": [h.index for h in heads], "launches": len(matches), "clock": clock,
            "offset_ns": measured, "shift_ns": off, **{k: clocks[r][k] for k in
                                                        ("partner", "hops", "pairs", "mad_ns", "se_ns",
                                                         "significant", "ambiguous", "kind", "anchors",
                                                         "reference")},
            "_descriptor": descriptor(root, name, desc_seq, pid=track_pid, rank=r, process_name=name)}
    report.ranks.append(info)
    for h in heads:
        report.bundles.append({"index": h.index, "rank": r, "name": h.label, "path": h.path,
                               "kernel": h.head.name,
                               "launches": len(h.rows), "matched": int(per_bundle[h.index]),
                               "gpu": h.head.info.gpu.name})
    for u in res.unmatched:
        report.unmatched.append({"bundle": u.launch.bundle, "launch": u.launch.launch, "reason": u.reason, "rank": r})
    for note in res.notes:
        report.notes.append(f"rank {r}: {note}")

    by_index = {h.index: h for h in heads}
    calls = kt.launch_calls()
    by_track: dict = {}
    drawn_count: Counter = Counter()
    state = _Rank(info, [], [], [], [], desc_seq, ids.new_seq())
    extra = {}
    for m in matches:
        h = by_index[m.launch.bundle]
        k = m.launch.launch
        drawn = opts.max_launches is None or drawn_count[h.index] < opts.max_launches
        drawn_count[h.index] += int(drawn)
        call = calls.get(int(kt.correlation[m.row]))
        ops = op_stack(kt, call, by_track) if call is not None else []
        fid = ids.new_flows(1)
        extra[m.row] = fid
        e = launch_entry(kt, m, shift[id(m)], drawn, fid, h.label, clock, ops, None)
        e["rank"] = r
        k0, k1 = e["kernel_start_ns"], e["kernel_start_ns"] + e["kernel_dur_ns"]
        u = ids.new_uuid()
        place = None
        if drawn:
            rows = h.rows.get(k, 0)
            if cursor["seq"] + 2 * rows + 16 >= 2**32 - 1:
                raise Fa4traceError("too many bundle rows for one merged file (its packet sequence ids run out): "
                                    "merge fewer ranks or bundles at a time, or use --max-launches")
            place = Placement(parent_uuid=u, name=f"{short(h.label, 40)} · launch {k}: ",
                              uuid_base=UUID_WARPS + (cursor["launch"] << 32), first_sequence_id=cursor["seq"],
                              first_flow_id=cursor["flow"], ts_offset_ns=int(shift[id(m)]))
            cursor["launch"] += 1
            cursor["seq"] += 2 * rows + 16
            cursor["flow"] += rows + 1
        job = RenderJob(h.source, k, place, opts.compress, opts.analysis, spool, kernel_ns=(k0, k1))
        state.entries.append(e)
        state.parents.append(int(kt.track[m.row]))
        state.tracks.append(u)
        state.futures.append(pool.submit(render_launch, job))
    report.launches.extend(state.entries)
    flows = host_flows(kt)
    gpu_name = gpu[devices[0]] if devices and devices[0] < len(gpu) else (gpu[0] if gpu else "")
    return state, (lambda: host_part(kt, ids, *flows, extra, gpu_name, root=root, main_pid=pid))


def _finish_rank(state: _Rank, output: _Output, stages: dict, max_launches, seconds: list, cpu: list) -> int:
    """Wait for a rank's render jobs; write its traced launches' tracks, summaries and parts.
    Returns the slices written."""
    t = time.perf_counter()
    results = [f.result() for f in state.futures]
    stages["wait_s"] += time.perf_counter() - t
    t = time.perf_counter()
    slices = 0
    for e, r in zip(state.entries, results):
        e.update(r.stats)
        if r.numbers is not None:
            e["numbers"] = r.numbers
        slices += r.slices
        seconds.append(round(r.seconds, 3))
        cpu.append(r.cpu_seconds)
    head = bytearray()
    for i, (e, parent, u) in enumerate(zip(state.entries, state.parents, state.tracks)):
        head.extend(descriptor(u, f"{short(e['label'])} · traced launch {e['bundle']}.{e['launch']}", state.desc_seq,
                               parent=parent or 0, rank=1000 + i))
    output.write(bytes(head))
    output.write(summary_slices([(None, None, e) for e in state.entries], state.tracks, state.summary_seq,
                                max_launches))
    for r in results:
        if r.path:
            output.append(r.path)
            os.unlink(r.path)
    stages["write_s"] += time.perf_counter() - t
    return slices


def _rank_clock_report(anchors: dict, clocks: dict, mode: str, report: MergeReport) -> dict:
    """The report's ``rank_clock``: the method, the reference, and the alignment error with the
    offsets as placed (and with none: how far the profilers' own clocks were apart)."""
    ranks = list(clocks)
    ref = next((r for r in ranks if clocks[r]["reference"]), None)
    kinds = {clocks[r]["kind"] for r in ranks if anchors[r].n}
    kind = kinds.pop() if len(kinds) == 1 else ("mixed anchors" if kinds else "none")
    method = ("nccl: each rank's clock offset against rank {ref}, the median difference of the ends of its "
              "collectives, taken out where they establish it (beyond 3 standard errors)" if mode == "nccl" else
              "epoch: each rank kept on its profiler's Unix-epoch clock (the offsets its collectives give are "
              "measured, not taken out)").format(ref=ref)
    out = {"mode": mode, "method": method, "reference": ref, "anchor_kind": kind}
    measured = {r: clocks[r]["offset_ns"] for r in ranks}
    placed = {r: (o if mode == "nccl" and clocks[r]["significant"] else 0) if o is not None else None
              for r, o in measured.items()}
    res = residuals(anchors, placed)
    raw = residuals(anchors, {r: 0 if o is not None else None for r, o in measured.items()})
    for r in ranks:
        if measured[r] is None and len(ranks) > 1:
            why = ("no collective (NCCL kernel, gloo call) in its profiler trace" if not clocks[r]["anchors"] else
                   f"no collective in common with the ranks before it ({clocks[r]['anchors']} {clocks[r]['kind']})")
            report.notes.append(f"rank {r}: {why}: placed by its profiler's Unix-epoch clock, its alignment not "
                                "measured")
        if mode == "nccl" and measured[r] is not None and not clocks[r]["reference"] and not clocks[r]["significant"]:
            report.notes.append(f"rank {r}: its collectives put its clock {measured[r] / 1e3:+,.3f} µs off, within "
                                f"their scatter ({SIGNIFICANT} x {clocks[r]['se_ns'] / 1e3:,.3f} µs, the standard "
                                "error): kept on its profiler's clock")
        if clocks[r].get("ambiguous"):
            report.notes.append(f"rank {r}: its collectives pair with rank {clocks[r]['partner']}'s at more than "
                                "one offset (a regular schedule and profiler windows that did not start on the same "
                                "collective): the offset nearest the profilers' own clocks was taken")
    if res:
        out.update(collectives=res["collectives"], error_ns=res["median_ns"], worst_ns=res["max_ns"],
                   ranks_measured=res["ranks"])
        if res["collectives"] < FEW_COLLECTIVES:
            report.notes.append(f"the ranks' clocks rest on {res['collectives']} collective(s) only: the offsets and "
                                "the alignment error are rough (profile more steps)")
        if raw:
            out.update(epoch_error_ns=raw["median_ns"], epoch_worst_ns=raw["max_ns"])
    else:
        out["why"] = ("one rank" if len(ranks) < 2 else
                      "no collective kernel (NCCL) or blocking host collective (gloo) in common between the ranks")
    return out
