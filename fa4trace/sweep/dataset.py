"""A sweep dataset on disk: hive-partitioned Parquet under one root folder.

    ROOT/results/kernel=<k>/d=<d>/hkv=<hkv>/<point_id>.parquet   one row per (point, kernel)
    ROOT/results/kernel=<k>/d=<d>/hkv=<hkv>/compact-*.parquet     many rows: a partition's points,
                                                                 merged by ``compact`` (compact.py)
    ROOT/bundles/kernel=<k>/d=<d>/<point_id>.parquet             a recorded trace bundle per
                                                                 (point, schedule of ours)
    ROOT/sweeps/sweep=<sweep_id>/sweep.json                      workers, GPUs, clocks, commit,
                                                                 command, grid, started / finished

Every file is written to a temporary name in its folder (a dot name ending in .tmp, which no
``*.parquet`` glob matches) and renamed into place, so a crash or a kill loses at most the point
in flight. A point's result file is written last, after its bundles: its presence means done.

A (point, kernel) may have more than one stored row (a ``--force`` re-run beside a compacted
file, or a compaction interrupted before it removed what it merged): readers keep the newest
``finished_at`` (``newest``), so nothing is lost or counted twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..format.errors import Fa4traceError
from ..trace.files import replacing

RESULT_SCHEMA = pa.schema([
    ("sweep_id", pa.string()), ("point_id", pa.string()), ("kernel", pa.string()),
    ("d", pa.int32()), ("hq", pa.int32()), ("hkv", pa.int32()), ("sk", pa.int64()), ("b", pa.int32()),
    ("sq", pa.int32()), ("dtype", pa.string()),
    ("us", pa.float64()), ("us_spread", pa.float64()), ("tbps", pa.float64()), ("rel_err", pa.float64()),
    ("error", pa.string()),
    ("qk_softmax_overlap", pa.float64()), ("pv_softmax_overlap", pa.float64()),
    ("bundle", pa.string()), ("gpu", pa.string()), ("worker", pa.string()),
    ("finished_at", pa.timestamp("us", tz="UTC")),
    # what the row is ("cuda": a GPU timing; "replay": a recorded buffer decoded and analysed on a CPU)
    ("job", pa.string()),
    # the point's cost, the same on each of its rows: its wall time from being handed to a worker
    # to its rows being written (less the rows' own write), the part inside the timing harness,
    # and the part recording, saving and analysing bundles (or replaying)
    ("point_s", pa.float64()), ("time_s", pa.float64()), ("record_s", pa.float64()),
])
COMPACT_PREFIX = "compact-"
RESULT_GLOB = "kernel=*/d=*/hkv=*/*.parquet"


def point_id(p) -> str:
    """A stable, readable id of a shape: d128_h16kv1_sk131072_b1_sq1_bf16."""
    return f"d{p.d}_h{p.hq}kv{p.hkv}_sk{p.sk}_b{p.b}_sq{p.sq}_{p.dtype}"


def bundle_rel(point, kernel: str) -> str:
    """Where a point's bundle of ``kernel`` lives, relative to the dataset root."""
    return f"bundles/kernel={kernel}/d={point.d}/{point.id}.parquet"


def atomic_write(path: Path, write) -> Path:
    """``write(tmp_path)`` then rename onto ``path`` (same folder: atomic on POSIX; the file gets
    the mode any new file of the user gets: fa4trace.trace.files)."""
    with replacing(path) as tmp:
        write(tmp)
    return path


def _clean(x):
    """NaN and inf to None (Parquet null): a missing timing is null, not NaN."""
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return None
    return x


def conform(t: pa.Table) -> pa.Table:
    """A result table in RESULT_SCHEMA's columns and types: columns a file lacks are null;
    columns RESULT_SCHEMA does not know are kept, after its own."""
    cols, fields = [], []
    for f in RESULT_SCHEMA:
        cols.append(t.column(f.name).cast(f.type) if f.name in t.column_names else pa.nulls(t.num_rows, f.type))
        fields.append(f)
    for name in t.column_names:
        if name not in RESULT_SCHEMA.names:
            cols.append(t.column(name))
            fields.append(t.schema.field(name))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def newest(t: pa.Table) -> pa.Table:
    """One row per (point_id, kernel): the one that finished last (rows without a time lose)."""
    if t.num_rows < 2:
        return t
    # nulls sort last in either direction (pyarrow's default)
    order = pc.sort_indices(t, sort_keys=[("point_id", "ascending"), ("kernel", "ascending"),
                                          ("finished_at", "descending")])
    t = t.take(order)
    pid, ker = t.column("point_id").to_pylist(), t.column("kernel").to_pylist()
    keep = [i for i in range(t.num_rows) if i == 0 or pid[i] != pid[i - 1] or ker[i] != ker[i - 1]]
    return t.take(pa.array(keep, pa.int64())) if len(keep) < t.num_rows else t


def read_table(path) -> pa.Table:
    return conform(pq.ParquetFile(path).read())


class Dataset:
    def __init__(self, root):
        self.root = Path(root)
        self._packed: dict[Path, set] = {}  # partition folder -> point ids in its compacted files

    # ---- paths ----
    def partition(self, kernel: str, d: int, hkv: int) -> Path:
        return self.root / "results" / f"kernel={kernel}" / f"d={d}" / f"hkv={hkv}"

    def result_path(self, point, kernel: str) -> Path:
        return self.partition(kernel, point.d, point.hkv) / f"{point.id}.parquet"

    def sweep_path(self, sweep_id: str) -> Path:
        return self.root / "sweeps" / f"sweep={sweep_id}" / "sweep.json"

    def result_files(self) -> list[Path]:
        """Every result file, per-point and compacted."""
        return sorted((self.root / "results").glob(RESULT_GLOB))

    # ---- state ----
    def packed(self, folder: Path) -> set:
        """The point ids held by the compacted files of one partition folder (read once)."""
        if folder not in self._packed:
            ids: set = set()
            for f in folder.glob(COMPACT_PREFIX + "*.parquet"):
                ids.update(pq.ParquetFile(f).read(columns=["point_id"]).column("point_id").to_pylist())
            self._packed[folder] = ids
        return self._packed[folder]

    def forget_packed(self) -> None:
        self._packed.clear()

    def has_result(self, point, kernel: str) -> bool:
        path = self.result_path(point, kernel)
        return path.is_file() or point.id in self.packed(path.parent)

    def missing(self, point, kernels) -> list[str]:
        return [k for k in kernels if not self.has_result(point, k)]

    # ---- writes ----
    def write_result(self, row: dict) -> Path:
        """One (point, kernel) row, every RESULT_SCHEMA column (missing ones null)."""
        unknown = set(row) - set(RESULT_SCHEMA.names)
        if unknown:
            raise ValueError(f"result row has unknown columns {sorted(unknown)}")
        table = pa.Table.from_pylist([{n: _clean(row.get(n)) for n in RESULT_SCHEMA.names}], schema=RESULT_SCHEMA)
        path = self.partition(row["kernel"], row["d"], row["hkv"]) / f"{row['point_id']}.parquet"
        return atomic_write(path, lambda tmp: pq.write_table(table, tmp))

    def write_bytes(self, rel: str, data: bytes) -> Path:
        """A file under the root (a bundle a worker sent), written atomically."""
        return atomic_write(self.root / rel, lambda tmp: Path(tmp).write_bytes(data))

    def write_sweep(self, sweep_id: str, doc: dict) -> Path:
        text = json.dumps(doc, indent=1, default=str) + "\n"
        return atomic_write(self.sweep_path(sweep_id), lambda tmp: Path(tmp).write_text(text))

    # ---- reads ----
    def read_results(self, *, every_row: bool = False) -> pa.Table:
        """The result rows (the files' columns, without the hive ones), the newest per (point,
        kernel); ``every_row``: every stored row, superseded ones too. For tests and small
        datasets: ``fa4trace query`` reads large ones."""
        files = self.result_files()
        if not files:
            return RESULT_SCHEMA.empty_table()
        t = pa.concat_tables([read_table(f) for f in files], promote_options="permissive")
        return t if every_row else newest(t)

    def sweeps(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted((self.root / "sweeps").glob("sweep=*/sweep.json"))]


def require_folder(root) -> Path:
    """``root`` as a Path, refused in one line where it is empty, missing or a file (before any
    reader says "not a sweep dataset" of a folder that is not there)."""
    if not str(root).strip():
        raise Fa4traceError("the dataset path is empty: give a sweep dataset folder")
    p = Path(root)
    if not p.exists():
        raise Fa4traceError(f"{p}: no such directory")
    if not p.is_dir():
        raise Fa4traceError(f"{p} is a file, not a sweep dataset folder")
    return p


def find_dataset(root) -> Optional[Path]:
    """The root if it looks like a sweep dataset (holds results/ or sweeps/), else None."""
    p = Path(root)
    return p if p.is_dir() and ((p / "results").is_dir() or (p / "sweeps").is_dir()) else None
