"""Which traces the viewer shows, and loading them (cached, never touching disk for uploads).

Sources, in the order the app lists them: bundles named on the command line
(``fa4trace view A B`` → ``streamlit run server.py -- A B``, or $FA4TRACE_BUNDLES), the
bundled traces in ``traces/`` (or $FA4TRACE_TRACES_DIR), and uploads.

Default pairing: bundles in ``traces/`` are paired from their metadata, not their file names:
the config's ``schedule`` is "base" for one and "pingpong" for the other, and the problem
is the same (``SHAPE_KEYS``: b, sq, sk, d, hq, hkv, dtype, impl, arch — a schedule may pick its
own tile size, so implementation keys may differ); a config that records no shape must match
in every key but the schedule. The d128 16:1 sk 131072 b1 pair is preferred when present.

Loaded tables live in ``st.cache_resource`` (shared, not copied); uploads are parsed from
memory (a Linux memfd, else a private temporary file that is removed at once) with the same
checks and one-line messages as :func:`fa4trace.trace.bundle.load`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import streamlit as st

from fa4trace.analysis import kernel, overlap
from fa4trace.analysis.autoevents import AutoCols, is_automatic
from fa4trace.analysis.launches import launch_of
from fa4trace.analysis.passes import has_passes, sourced_figures
from fa4trace.analysis.roles import assign_roles
from fa4trace.analysis.words import plural
from fa4trace.analysis.wait_chain import wait_chains
from fa4trace.format.errors import Fa4traceError
from fa4trace.trace.bundle import META_KEY, Trace, load
from fa4trace.trace.meta import BundleMeta

from .literal import md



def default_traces_dir() -> Path:
    """The bundled traces: ``traces/`` of the source tree this viewer runs from (app/../traces),
    else ``traces/`` in the current directory (an installed package ships no traces)."""
    checkout = Path(__file__).resolve().parent.parent / "traces"
    return checkout if checkout.is_dir() else Path.cwd() / "traces"


TRACES_DIR = default_traces_dir()
# The pair the app opens with (A = base, B = ping-pong). Other schedules' bundles (intrawg,
# FA4's) are listed for the A / B pickers but never auto-paired.
PAIR_SCHEDULES = ("base", "pingpong")
# Config keys that restate the schedule (FA4 records its own switch too): not part of the pair key.
SCHEDULE_KEYS = ("schedule", "schedule_requested", "s_ping_pong", "use_s_ping_pong")
# The problem a kernel solves (and whose kernel it is). Two schedules of one problem may choose
# different implementation parameters: the recorded ping-pong uses 64-key tiles where base uses
# 128 (registers), so tile_n and n_blocks differ within a pair and are not part of its key.
SHAPE_KEYS = ("b", "sq", "sk", "d", "head_dim", "hq", "hkv", "dtype", "impl", "arch")
# The headline shape: long-KV decode with one KV head, where split-KV decode leaves the most
# bandwidth on the table.
PREFERRED_SHAPE = {"d": 128, "hq": 16, "hkv": 1, "sk": 131072, "b": 1}


# ---- discovery from metadata ---------------------------------------------------------------
@dataclass(frozen=True)
class BundleInfo:
    """What the Parquet footer of one bundle says, read without loading its table."""

    path: Path
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    rows: int = 0
    error: str | None = None

    @property
    def info(self) -> BundleMeta:
        """The metadata, typed (``fa4trace.trace.meta``)."""
        return BundleMeta.from_meta(self.meta)

    @property
    def config(self) -> dict:
        cfg = self.info.config
        return cfg if isinstance(cfg, dict) else {}

    @property
    def schedule(self) -> str | None:
        s = self.config.get("schedule")
        return s if isinstance(s, str) else None

    @property
    def pair_key(self) -> str:
        """What must match for two bundles to form a base/ping-pong pair: the problem shape
        (SHAPE_KEYS) when the config records one, else every config key but the schedule."""
        cfg = self.config
        if any(k in cfg for k in ("b", "sk", "d", "hq", "hkv")):
            rest = {k: cfg[k] for k in SHAPE_KEYS if k in cfg}
        else:
            rest = {k: v for k, v in cfg.items() if k not in SCHEDULE_KEYS}
        return json.dumps(rest, sort_keys=True, default=str)

    @property
    def synthetic(self) -> bool:
        return bool(self.info.synthetic)


def read_info(path: str | os.PathLike) -> BundleInfo:
    path = Path(path)
    try:
        md = pq.read_metadata(path)
        raw = (pq.read_schema(path).metadata or {}).get(META_KEY)
        if raw is None:
            return BundleInfo(path, {}, md.num_rows, f"{path.name}: Parquet without fa4trace metadata")
        meta = json.loads(raw)
        if not isinstance(meta, dict):
            raise ValueError("metadata is not an object")
        return BundleInfo(path, meta, md.num_rows)
    except (OSError, ValueError, pa.ArrowException) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return BundleInfo(path, {}, 0, f"{path.name}: not a readable trace bundle ({first})")


def discover(folder: str | os.PathLike) -> list[BundleInfo]:
    """Bundles in ``folder`` and one level of subfolders (traces/auto/), except subfolders that
    are sweep datasets (their bundles open from the Sweep tab)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    subs = [d for d in sorted(folder.iterdir()) if d.is_dir() and not (d / "results").is_dir()
            and not (d / "sweeps").is_dir()]
    paths = sorted(folder.glob("*.parquet")) + [p for d in subs for p in sorted(d.glob("*.parquet"))]
    return [read_info(p) for p in paths if p.is_file()]


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


def is_preferred(info: BundleInfo) -> bool:
    cfg = info.config
    return all(_num(cfg.get(k)) == float(v) for k, v in PREFERRED_SHAPE.items())


def find_pairs(infos: list[BundleInfo]) -> list[tuple[BundleInfo, BundleInfo]]:
    """(base, pingpong) pairs with equal config apart from the schedule; preferred shape first."""
    groups: dict[str, dict[str, list[BundleInfo]]] = {}
    for info in infos:
        if info.error or info.schedule not in PAIR_SCHEDULES or "instrument" in info.meta:
            continue  # (automatic-event bundles pair by kernel in their own page, not as attention)
        groups.setdefault(info.pair_key, {}).setdefault(info.schedule, []).append(info)
    pairs = []
    for g in groups.values():
        if "base" in g and "pingpong" in g:
            # several bundles of one shape and schedule: prefer measured over synthetic, then name
            pick = {s: sorted(g[s], key=lambda i: (i.synthetic, i.path.name))[0] for s in PAIR_SCHEDULES}
            pairs.append((pick["base"], pick["pingpong"]))
    pairs.sort(key=lambda p: (not is_preferred(p[0]), p[0].synthetic, p[0].path.name))
    return pairs


# ---- sources ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    key: str  # unique and stable: path + mtime + size, or upload content hash
    label: str
    origin: str  # "argument" | "bundled" | "upload"
    path: Path | None = None
    upload_name: str | None = None


def path_key(path: Path) -> str:
    st_ = path.stat()
    return f"path:{path.resolve()}:{st_.st_mtime_ns}:{st_.st_size}"


def describe(meta: dict, rows: int) -> str:
    info = BundleMeta.from_meta(meta)
    cfg = info.config if isinstance(info.config, dict) else {}
    sched = cfg.get("schedule")
    shape = " ".join(f"{k}={cfg[k]}" for k in ("d", "hq", "hkv", "sk", "b") if k in cfg)
    bits = [str(info.kernel if info.has("kernel") else "trace")]
    if sched:
        bits.append(f"[{sched}]")
    if shape:
        bits.append(shape)
    bits.append(plural(rows, "row"))
    n_launches = len(info.launches)
    if n_launches > 1:
        bits.append(f"{n_launches} launches")
    if info.synthetic:
        bits.append("SYNTHETIC")
    return " · ".join(bits)


def source_for_path(path: Path, origin: str, info: BundleInfo | None = None) -> Source:
    info = info or read_info(path)
    shown = f"{path.parent.name}/{path.name}" if path.parent.resolve() != TRACES_DIR.resolve() and \
        path.parent.parent.resolve() == TRACES_DIR.resolve() else path.name
    return Source(path_key(path), f"{shown} — {describe(info.meta, info.rows)}", origin, path=path)


@dataclass
class Startup:
    sources: list[Source]
    default_a: str | None
    default_b: str | None
    notes: list[str]  # Markdown (names in them escaped)
    errors: list[str]  # plain text: shown through fa4trace.viewer.literal.md


def startup(arg_bundles: list[str], traces_dir: Path) -> Startup:
    """Sources at start and the default pair (A = base, B = ping-pong) with notes for the user."""
    notes, errors, sources = [], [], []
    arg_infos = []
    for a in arg_bundles:
        p = Path(a)
        if not p.is_file():
            errors.append(f"{a}: no such file")
            continue
        info = read_info(p)
        if info.error:
            errors.append(info.error)
            continue
        arg_infos.append(info)
        sources.append(source_for_path(p, "argument", info))
    infos = discover(traces_dir)
    bundled = []
    for info in infos:
        if info.error:
            errors.append(f"traces/{info.error}")
            continue
        bundled.append(info)
        if not any(s.path and s.path.resolve() == info.path.resolve() for s in sources):
            sources.append(source_for_path(info.path, "bundled", info))
    key_of = {s.path.resolve(): s.key for s in sources if s.path}

    a = b = None
    if arg_infos:
        a = key_of[arg_infos[0].path.resolve()]
        if len(arg_infos) >= 2:
            first, second = arg_infos[0], arg_infos[1]
            if first.schedule == "pingpong" and second.schedule == "base":
                first, second = second, first
            a, b = key_of[first.path.resolve()], key_of[second.path.resolve()]
    else:
        pairs = find_pairs(bundled)
        if pairs:
            base, pp = pairs[0]
            a, b = key_of[base.path.resolve()], key_of[pp.path.resolve()]
            if not is_preferred(base):
                notes.append(f"No d128 16:1 sk 131072 b1 pair in {md(traces_dir.name)}/; showing the "
                             f"{md(base.path.name)} / {md(pp.path.name)} pair.")
        elif bundled:
            # an attention trace (its config names a schedule) before calibration/microbenchmarks
            first = sorted(bundled, key=lambda i: (i.schedule is None, i.synthetic, i.path.name))[0]
            a = key_of[first.path.resolve()]
            notes.append(f"No base / ping-pong pair of one shape in {md(traces_dir.name)}/ yet (pairs are found from "
                         f"each bundle's metadata: config.schedule 'base' and 'pingpong', same b, sq, sk, d, hq, "
                         f"hkv, dtype). Showing the single traces there; upload or pass two bundles to compare.")
        else:
            notes.append(f"No trace bundles in {md(traces_dir)}: upload one (sidebar) or run "
                         f"`fa4trace view A.parquet B.parquet`.")
    return Startup(sources, a, b, notes, errors)


# ---- loading -------------------------------------------------------------------------------
class UploadError(Fa4traceError):
    """An uploaded file is not a usable trace bundle (one clear line)."""


@st.cache_resource(max_entries=16, show_spinner=False)
def load_path(key: str, path: str) -> Trace:
    """Cached by ``key`` (path, mtime, size): a bundle that changes on disk is read again."""
    return load(path)


@contextlib.contextmanager
def _memory_path(data: bytes):
    """A filesystem path whose bytes live in memory (Linux memfd); else a private temp file."""
    if hasattr(os, "memfd_create") and sys.platform.startswith("linux"):
        fd = os.memfd_create("fa4trace-upload", getattr(os, "MFD_CLOEXEC", 0))
        try:
            _write_all(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    d = tempfile.mkdtemp(prefix="fa4trace-upload-")
    p = os.path.join(d, "upload.parquet")
    try:
        with open(p, "wb") as f:
            f.write(data)
        yield p
    finally:
        with contextlib.suppress(OSError):
            os.unlink(p)
        with contextlib.suppress(OSError):
            os.rmdir(d)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def parse_upload(name: str, data: bytes) -> Trace:
    """An uploaded file -> Trace, or UploadError with one line naming the file."""
    if len(data) == 0:
        raise UploadError(f"{name} is empty (0 bytes): not a trace bundle")
    if data[:4] == b"PAR1" and (len(data) < 12 or data[-4:] != b"PAR1"):
        raise UploadError(f"{name} is truncated: it starts like a Parquet file but its footer is missing "
                          f"({len(data):,} bytes; an interrupted download or copy?)")
    with _memory_path(data) as p:
        try:
            trace = load(p)
        except Fa4traceError as exc:
            msg = str(exc).splitlines()[0].replace(str(p), name)
            raise UploadError(msg) from None
    if len(trace) == 0:
        raise UploadError(f"{name} is a trace bundle that holds no events")
    try:
        overlap.per_cta(trace)  # the app's first use of the table: fail here, with a name
    except Exception as exc:  # noqa: BLE001 - any failure of a foreign table is the upload's fault
        raise UploadError(f"{name} reads as a bundle but cannot be analysed ({type(exc).__name__}: {exc})") from None
    return trace


@st.cache_resource(max_entries=16, show_spinner=False)
def load_upload(digest: str, name: str, _data: bytes) -> Trace:
    return parse_upload(name, _data)


def upload_key(data: bytes) -> str:
    return "upload:" + hashlib.sha256(data).hexdigest()


def get_trace(src: Source, uploads: dict[str, tuple[str, bytes]]) -> Trace:
    if src.path is not None:
        return load_path(src.key, str(src.path))
    name, data = uploads[src.key]
    return load_upload(src.key, name, data)


# ---- selections within a trace --------------------------------------------------------------
def cta_rows(trace: Trace, launch: int, cta: int) -> pa.Table:
    ev = trace.events
    m = pc.and_(pc.equal(ev["cta"], pa.scalar(cta, ev.schema.field("cta").type)),
                pc.equal(ev["launch"], pa.scalar(launch, ev.schema.field("launch").type)))
    return ev.filter(m)


def iteration_values(rows: pa.Table, events=None) -> np.ndarray:
    """Sorted distinct KV-block numbers (``iter``) of one CTA's per-iteration events.

    Only the events overlap.per_iteration reads (LOAD_K ... PV) count (or ``events``: for
    automatically traced kernels :func:`iter_events`, whose iter is a pipeline count): other
    events may carry other payloads (a combine partition, a ticket). Split-KV kernels number
    blocks globally, so CTA c may hold blocks 8c..8c+7: the viewer windows by position in this
    list, not by number. Falls back to every row with a payload when the trace has none of those.
    """
    names = rows["name"].cast(pa.string()) if rows.num_rows else pa.array([], pa.string())
    it = rows["iter"]
    m = pc.and_(pc.is_in(names, pa.array(list(events or overlap.ITER_EVENTS), pa.string())), pc.greater_equal(it, 0))
    vals = pc.filter(it, m)
    if len(vals) == 0:
        vals = pc.filter(it, pc.greater_equal(it, 0))
    return np.unique(vals.to_numpy()).astype(np.int64) if len(vals) else np.zeros(0, np.int64)


def window_blocks(values: np.ndarray, k0: int, k1: int) -> tuple[int, int] | None:
    """Positions k0..k1 (clipped) of a CTA's block list -> (first, last) block number."""
    if values.size == 0 or k0 >= values.size:
        return None
    return int(values[k0]), int(values[min(k1, values.size - 1)])


def subset(trace: Trace, rows: pa.Table, note: str) -> Trace:
    """A Trace of some of ``trace``'s rows (same metadata, marked as a subset)."""
    meta = dict(trace.meta)
    meta["subset"] = note
    return Trace(rows, meta)


# ---- one launch of a bundle of several (fa4trace.analysis.launches) -------------------------
@st.cache_resource(max_entries=16, show_spinner=False)
def launch_cached(key: str, launch: int, _t: Trace) -> Trace:
    """Launch ``launch`` of the bundle ``key`` names: every view and number of the page is one
    launch's, never one that mixes launches."""
    return launch_of(_t, launch)


@st.cache_resource(max_entries=16, show_spinner=False)
def sourced_cached(key: str, call: int, _t: Trace) -> dict | None:
    """Each figure of call ``call`` of the bundle ``key`` from the lightest pass that reports it
    (fa4trace.analysis.passes.sourced_figures: what `fa4trace summary` shows by pass), or None
    for a bundle recorded without passes."""
    return sourced_figures(_t, call=call) if has_passes(_t) else None


def launch_key(key: str, launch: int) -> str:
    """The Source key of one launch of a bundle: every cache below is keyed per launch."""
    return f"{key}#launch{launch}"


# ---- derived tables, cached per trace (keys are the Source keys) ---------------------------
@st.cache_resource(max_entries=32, show_spinner=False)
def compare_cached(key_a: str, key_b: str, _a: Trace, _b: Trace) -> dict:
    return overlap.compare(_a, _b)


@st.cache_resource(max_entries=32, show_spinner=False)
def summary_cached(key: str, _t: Trace) -> dict:
    return overlap.summarize(_t)


@st.cache_resource(max_entries=32, show_spinner=False)
def per_cta_cached(key: str, _t: Trace) -> pa.Table:
    return overlap.per_cta(_t)


# What every kernel's per-CTA table says; overlap.per_cta's other columns read attention events.
CTA_COLUMNS = ("launch", "cta", "sm", "span_ns", "start_ns", "end_ns", "dropped")


def cta_info(key: str, trace: Trace) -> pa.Table:
    """The per-CTA table a bundle shows: every column for attention bundles, only
    :data:`CTA_COLUMNS` for automatically traced kernels (their attention columns are empty)."""
    table = per_cta_cached(key, trace)
    if not is_kernel(trace):
        return table
    return table.select([c for c in CTA_COLUMNS if c in table.column_names])


def by_position(trace: Trace) -> Trace:
    """The trace with each per-iteration event's ``iter`` replaced by its position in its CTA's
    own block list (0 = the CTA's first block); other rows get -1.

    Split-KV kernels number KV blocks globally (CTA c holds blocks 8c..8c+7), so
    ``overlap.per_iteration`` on the raw trace has one CTA per block; on this view each
    position is a median over every CTA, with the core's own definitions (incl. SOFTMAX_HIDDEN).
    """
    ev = trace.events
    n = ev.num_rows
    names = ev["name"].cast(pa.string())
    it = ev["iter"].to_numpy().astype(np.int64)
    m = pc.and_(pc.is_in(names, pa.array(overlap.ITER_EVENTS)), pc.greater_equal(ev["iter"], 0)).to_numpy(zero_copy_only=False)
    pos = np.full(n, -1, np.int64)
    if m.any():
        grp = (ev["launch"].to_numpy().astype(np.int64) << 32) | ev["cta"].to_numpy().astype(np.int64)
        g, i = grp[m], it[m]
        order = np.lexsort((i, g))
        gs, is_ = g[order], i[order]
        new_val = np.r_[True, (gs[1:] != gs[:-1]) | (is_[1:] != is_[:-1])]
        new_grp = np.r_[True, gs[1:] != gs[:-1]]
        dense = np.cumsum(new_val) - 1  # distinct (cta, block) index
        first = np.maximum.accumulate(np.where(new_grp, dense, 0))
        rank = np.empty(order.size, np.int64)
        rank[order] = dense - first
        pos[np.flatnonzero(m)] = rank
    events = ev.set_column(ev.schema.get_field_index("iter"), "iter", pa.array(pos.astype(np.int32)))
    return Trace(events, trace.meta)


@st.cache_resource(max_entries=32, show_spinner=False)
def per_iteration_cached(key: str, _t: Trace, positional: bool = False, events: tuple[str, ...] | None = None) -> pa.Table:
    """overlap.per_iteration of the trace (by position: :func:`by_position`), of ``events``
    (default: the attention events, overlap.ITER_EVENTS)."""
    t = by_position(_t) if positional else _t
    return overlap.per_iteration(t) if events is None else overlap.per_iteration(t, events=events)


@st.cache_resource(max_entries=64, show_spinner=False)
def cta_rows_cached(key: str, launch: int, cta: int, _t: Trace) -> pa.Table:
    return cta_rows(_t, launch, cta)


@st.cache_resource(max_entries=4, show_spinner=False)
def pftrace_cached(key: str, scope: str, _t: Trace) -> bytes:
    from .perfetto_ui import export_pftrace

    return export_pftrace(_t)


# ---- a recording of lifetimes only (no event family) ---------------------------------------
@st.cache_resource(max_entries=32, show_spinner=False)
def lifetimes_only(key: str, _t: Trace) -> bool:
    """The trace holds rows and every one is a warp's lifetime (WARP): a recording without any
    event family (``instrument(families=[])``, the "lifetimes" pass), with nothing to chart."""
    return len(_t) > 0 and _t.event_names() <= {"WARP"}


@st.cache_resource(max_entries=16, show_spinner=False)
def cta_durations(key: str, _t: Trace) -> pa.Table | None:
    """The bundle's timed CTAs (fa4trace.analysis.fidelity.cta_lifetimes) as the viewer lists
    them: CTA, recorded, start µs (from its launch's first CTA start), duration µs, phase, and
    the launch where there are several; None when the bundle did not time its CTAs."""
    from fa4trace.analysis.fidelity import cta_lifetimes

    life = cta_lifetimes(_t)
    if life is None:
        return None
    launch = life["launch"].to_numpy()
    start = life["start_ns"].to_numpy()
    first = {int(L): int(start[launch == L].min()) for L in np.unique(launch)}
    t0 = np.array([first[int(L)] for L in launch], np.int64)
    cols = {"CTA": life["cta"], "recorded": life["recorded"],
            "start µs": pa.array(np.round((start - t0) / 1e3, 3)),
            "duration µs": pa.array(np.round(life["dur_ns"].to_numpy() / 1e3, 3)), "phase": life["phase"]}
    if np.unique(launch).size > 1:
        cols = {"launch": life["launch"], **cols}
    return pa.table(cols)


# ---- bundles of automatically traced kernels (fa4trace.instrument) -------------------------
def is_kernel(trace: Trace | None) -> bool:
    """A bundle of an automatically traced kernel: the any-kernel analysis and views apply."""
    return trace is not None and is_automatic(trace)


@st.cache_resource(max_entries=16, show_spinner=False)
def view_trace(key: str, _t: Trace) -> Trace:
    """What the timeline draws: for automatically traced kernels, the trace with its roles
    assigned (fa4trace.analysis.roles); other bundles as they are."""
    return assign_roles(_t) if is_automatic(_t) else _t


@st.cache_resource(max_entries=32, show_spinner=False)
def kernel_summary_cached(key: str, _t: Trace) -> dict:
    return kernel.summarize_kernel(_t)


@st.cache_resource(max_entries=32, show_spinner=False)
def kernel_compare_cached(key_a: str, key_b: str, _a: Trace, _b: Trace) -> dict:
    return kernel.compare_kernels(_a, _b)


@st.cache_resource(max_entries=16, show_spinner=False)
def occupancy_cached(key: str, _t: Trace) -> pa.Table:
    return kernel.occupancy_series(view_trace(key, _t))


@st.cache_resource(max_entries=16, show_spinner=False)
def chains_cached(key: str, _t: Trace) -> pa.Table:
    return wait_chains(view_trace(key, _t))


def of_cta(table: pa.Table, launch: int, cta: int) -> pa.Table:
    """The rows of one (launch, CTA) of a per-CTA table (occupancy series, wait chains)."""
    if table.num_rows == 0:
        return table
    return table.filter(pc.and_(pc.equal(table["launch"], launch), pc.equal(table["cta"], cta)))


@st.cache_resource(max_entries=32, show_spinner=False)
def iter_events(key: str, _t: Trace) -> tuple[str, ...] | None:
    """The events whose iter windows the timeline: for automatically traced kernels the
    pipeline events of the pipeline with the most counts (iter = its running count); None
    (overlap.ITER_EVENTS) for other bundles."""
    if not is_automatic(_t):
        return None
    c = AutoCols.of(_t)
    pipes = c.pipelines()
    if not pipes:
        return ()
    best = max(pipes, key=lambda p: int(np.unique(c.iter[c.where("pipeline", resource=p)]).size))
    return tuple(sorted({c.name_dict[k] for k in np.unique(c.name_codes[c.where("pipeline", resource=best)])}))


# Families of automatic events whose payload counts iterations: a pipeline's wait or acquire
# carries the pipeline's running count in its CTA, a user span what the user passed. Other
# payloads name a thing, not an iteration (a barrier's id, how many MMA groups a wait leaves).
ITERATION_FAMILIES = ("pipeline", "user")


@st.cache_resource(max_entries=32, show_spinner=False)
def iteration_spans(key: str, _t: Trace) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """For an automatically traced kernel: (the span events whose payload is an iteration and
    takes more than one value — the per-iteration chart draws those —, the pipelines that have
    events at all). Spans only: an instant has no duration to chart."""
    c = AutoCols.of(_t)
    pipes = tuple(c.pipelines())
    m = np.zeros(c.n, bool)
    for fam in ITERATION_FAMILIES:
        m |= c.where(fam)
    m &= (c.kind == 0) & (c.iter >= 0)
    names = []
    for code in np.unique(c.name_codes[m]).tolist():
        if np.unique(c.iter[m & (c.name_codes == code)]).size > 1:
            names.append(c.name_dict[code])
    return tuple(sorted(names)), pipes


# ---- fa4trace diff: B against A beyond noise (fa4trace.analysis.diff) ------------------------
@st.cache_resource(max_entries=16, show_spinner=False)
def diff_cached(key_a: str, key_b: str, _a: Trace, _b: Trace) -> dict | str:
    """`fa4trace diff --json A B` of the two traces shown, or the one line that refuses them
    (other kernels, other event vocabularies)."""
    from fa4trace.analysis.diff import diff

    try:
        return diff(_a, _b)
    except Fa4traceError as exc:
        return str(exc).splitlines()[0]
