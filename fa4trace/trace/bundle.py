"""A trace bundle: one Parquet file (zstd) = the events table + JSON metadata in its schema.

pandas, polars and duckdb read the file as is; fa4trace reads it with :func:`load`.
Metadata (key ``fa4trace`` in the Parquet schema metadata) holds: fa4trace version, kernel
name and config (shape, dtype, schedule), GPU name, SM count, driver, clock facts,
grid/block per launch, total dropped records (``total_overwritten``: of those, the oldest
records that shared-memory rings overwrote, where the warps recorded into rings; each launch's
``ring``, ``overwritten``, ``overwritten_warps`` say more), recording date, which CTAs were
recorded, and the event vocabulary the bundle was decoded with.

``cta_lifetimes`` (where the launches' buffers had a CTA-lifetime region that the kernel
wrote; fa4trace.format.layout): one row per timed CTA of every launch, as columns of equal length:
``launch``, ``cta``, ``start_ns`` / ``end_ns`` (on the events' time axis: ns from the
bundle's ``t0_globaltimer_ns``; a CTA that did not record may start before it, so negative
values occur) and ``recorded`` (0/1: the CTA has warps in the events table). fa4trace.analysis.fidelity
reads it; readers that do not know the key ignore it. ``instrument.plain_twin`` (optional,
{"plain_ns", "traced_ns"}): the traced launch and its plain build timed next to each other,
where every CTA records and the launch cannot measure itself.

A bundle holds at least one event row: every recorded warp has its lifetime row (kind
"warp"), so a recording yields rows even where its warps recorded no event, and decoding
refuses a buffer that no warp wrote. :func:`load` and :func:`read_meta` refuse a bundle of 0
rows in one line, as they refuse any other file that is not a bundle; every command that
reads bundles (summary, compare, convert, merge, view) goes through them. :func:`load` reads
every column, and bundles are written with page checksums, so a damaged data page fails
there, not later in a page of the viewer.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..format.version import __version__
from ..format.errors import Fa4traceError, TraceFormatError, WouldOverwrite
from ..format.vocab import VOCAB, Vocabulary
from .decode import SCHEMA, DecodedLaunch
from .files import replacing
from .meta import BundleMeta

META_KEY = b"fa4trace"
BUNDLE_FORMAT = "fa4trace-bundle"
BUNDLE_VERSION = 1


class Trace:
    """Events (pyarrow.Table with decode.SCHEMA) and metadata: ``meta``, the JSON object the
    bundle stores (a dict), and ``info``, the same read as typed fields (``BundleMeta``)."""

    def __init__(self, events: pa.Table, meta: dict):
        self.events = events
        self.meta = meta

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_launches(cls, launches: Iterable[DecodedLaunch], meta: dict | None = None, *,
                      vocab: Vocabulary = VOCAB) -> "Trace":
        """Join decoded launches on one time axis: ns from the earliest warp start of all."""
        launches = list(launches)
        if not launches:
            raise ValueError("a trace needs at least one launch")
        t0 = min(d.t0_globaltimer_ns for d in launches)
        tables, launch_meta = [], []
        given = BundleMeta.from_meta(meta or {}).launches  # what the recording says of each launch
        for i, d in enumerate(launches):
            shift = d.t0_globaltimer_ns - t0
            t = d.table
            if shift:
                t = t.set_column(t.schema.get_field_index("start_ns"), "start_ns",
                                 pa.compute.add(t["start_ns"], shift))
                t = t.set_column(t.schema.get_field_index("end_ns"), "end_ns",
                                 pa.compute.add(t["end_ns"], shift))
            tables.append(t)
            lm = given[i].to_meta() if i < len(given) else {}
            lm.update(d.summary)
            lm["t0_offset_ns"] = int(shift)
            launch_meta.append(lm)
        events = pa.concat_tables(tables, promote_options="permissive").combine_chunks()
        events = events.cast(SCHEMA) if events.schema != SCHEMA else events
        m = dict(meta or {})
        m["launches"] = launch_meta
        lifetimes = _lifetimes_meta(launches, t0)
        if lifetimes is not None:
            m["cta_lifetimes"] = lifetimes
        m["t0_globaltimer_ns"] = int(t0)
        m["total_dropped"] = int(sum(d.summary.get("dropped", 0) for d in launches))
        if any("ring" in d.summary for d in launches):  # of those, the ones rings overwrote (the oldest)
            m["total_overwritten"] = int(sum(d.summary.get("overwritten", 0) for d in launches))
        m.setdefault("vocabulary", vocab.to_json())
        return cls(events, _complete_meta(m))

    # ---- persistence --------------------------------------------------------------------
    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write the bundle (mode 0666 less the umask, like any new file); refuses to replace an
        existing file unless overwrite=True, and refuses a trace of no events."""
        path = Path(path)
        if path.exists() and not overwrite:
            raise WouldOverwrite(f"{path} exists; refusing to overwrite it")
        if path.is_dir():
            raise Fa4traceError(f"{path} is a directory")
        if self.events.num_rows == 0:  # load() would refuse it: write nothing no command can read
            raise Fa4traceError(f"{path}: a trace with no events is not saved as a bundle")
        meta = json.dumps(_complete_meta(self.meta), sort_keys=True, default=_json_default).encode()
        schema = self.events.schema.with_metadata({META_KEY: meta})
        table = self.events.replace_schema_metadata(schema.metadata)
        # Written next to the target and renamed (trace.files): an interrupted save never leaves
        # half a bundle. Page checksums (CRC32): load() finds a damaged data page, not only a
        # damaged footer.
        with replacing(path) as tmp:
            pq.write_table(table, tmp, compression="zstd", compression_level=6,
                           use_dictionary=["role", "name", "kind"], write_statistics=True,
                           row_group_size=1 << 20, write_page_checksum=True)
        return path

    # ---- convenience --------------------------------------------------------------------
    @property
    def info(self) -> BundleMeta:
        """The metadata as typed fields (``fa4trace.trace.meta``), read from ``meta`` as it is now."""
        return BundleMeta.from_meta(self.meta)

    @property
    def vocab(self) -> Vocabulary:
        return Vocabulary.from_json(self.info.vocabulary)

    @property
    def name(self) -> str:
        info = self.info
        sched = (info.config or {}).get("schedule")  # the kernel's own config key
        return f"{info.kernel if info.has('kernel') else 'trace'}" + (f" [{sched}]" if sched else "")

    def event_names(self) -> set[str]:
        """The distinct event names the bundle records ("WARP" for the warps' lifetimes among them)."""
        return set(pc.unique(self.events["name"].cast(pa.string())).to_pylist())

    def __len__(self) -> int:
        return self.events.num_rows

    def __repr__(self) -> str:
        return f"Trace({self.name!r}, {len(self)} rows, {len(self.info.launches)} launch(es))"


def _lifetimes_meta(launches: list[DecodedLaunch], t0: int) -> dict | None:
    """The launches' CTA lifetimes as the metadata's ``cta_lifetimes`` columns (module doc)."""
    cols: dict = {"launch": [], "cta": [], "start_ns": [], "end_ns": [], "recorded": []}
    for i, d in enumerate(launches):
        life = d.cta_lifetimes
        if life is None:
            continue
        cols["launch"] += [int(d.summary.get("launch", i))] * int(life["cta"].size)
        cols["cta"] += life["cta"].tolist()
        cols["start_ns"] += (life["start_gt"] - t0).tolist()
        cols["end_ns"] += (life["end_gt"] - t0).tolist()
        cols["recorded"] += life["recorded"].astype(int).tolist()
    return cols if cols["cta"] else None


def _complete_meta(m: dict) -> dict:
    m = dict(m)
    m.setdefault("format", BUNDLE_FORMAT)
    m.setdefault("bundle_version", BUNDLE_VERSION)
    m.setdefault("fa4trace_version", __version__)
    m.setdefault("recorded_at", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    m.setdefault("kernel", "unknown")
    m.setdefault("config", {})
    m.setdefault("gpu", {})
    m.setdefault("synthetic", False)
    return m


def _json_default(o):
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def read_meta(path: str | os.PathLike) -> dict:
    """The metadata of the bundle at ``path``, after every check ``load`` makes short of reading
    the events (a damaged data page passes here: ``load`` finds it): cheap, for refusing a file
    that is not a bundle before any work starts."""
    return _open(Path(path))[1]


def load(path: str | os.PathLike) -> Trace:
    """Read a bundle, every column of its events. Anything that is not one (a damaged data page
    with an intact footer, 0 event rows included) raises TraceFormatError with one clear line."""
    path = Path(path)
    pf, meta = _open(path)
    try:
        table = pf.read(columns=SCHEMA.names)
        table = table.replace_schema_metadata(None)
        if table.schema != SCHEMA:
            table = table.cast(SCHEMA)
    except (pa.ArrowException, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceFormatError(f"{path}: bundle data is unreadable ({first})") from None
    if "vocabulary" not in meta:
        meta["vocabulary"] = VOCAB.to_json()
    return Trace(table, meta)


def _open(path: Path) -> tuple[pq.ParquetFile, dict]:
    """The Parquet file and its fa4trace metadata, checked (format, version, columns, vocabulary,
    at least one row). Pages written with checksums are checked as they are read."""
    if not path.exists():
        raise Fa4traceError(f"{path}: no such file")
    if path.is_dir():
        raise Fa4traceError(f"{path} is a directory, not a trace bundle")
    try:
        pf = pq.ParquetFile(path, page_checksum_verification=True)
    # A damaged footer surfaces as any ArrowException (a flipped byte gave ArrowNotImplementedError,
    # "Integers with more than 64 bits") or as ValueError (UnicodeDecodeError of a column name).
    except (pa.ArrowException, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceFormatError(f"{path} is not a Parquet trace bundle ({first})") from None
    raw = (pf.schema_arrow.metadata or {}).get(META_KEY)
    if raw is None:
        raise TraceFormatError(f"{path} is a Parquet file without fa4trace metadata: not a trace bundle")
    try:
        meta = json.loads(raw)
        if not isinstance(meta, dict):
            raise ValueError("metadata is not an object")
    except ValueError as exc:
        raise TraceFormatError(f"{path}: fa4trace metadata is not valid JSON ({exc})") from None
    info = BundleMeta.from_meta(meta)
    if info.format != BUNDLE_FORMAT:
        raise TraceFormatError(f"{path}: metadata format {info.format!r} is not {BUNDLE_FORMAT!r}")
    if int(info.bundle_version or 0) > BUNDLE_VERSION:
        raise TraceFormatError(f"{path}: bundle version {info.bundle_version} is newer than this fa4trace reads "
                               f"({BUNDLE_VERSION}); upgrade fa4trace")
    missing = [f.name for f in SCHEMA if f.name not in pf.schema_arrow.names]
    if missing:
        raise TraceFormatError(f"{path}: bundle lacks column(s) {', '.join(missing)}")
    if pf.metadata.num_rows == 0:
        raise TraceFormatError(f"{path}: the bundle holds no events (0 rows): nothing to summarize, export or show")
    if info.vocabulary is not None:
        Vocabulary.from_json(info.vocabulary)  # validate early, one clear error
    return pf, meta
