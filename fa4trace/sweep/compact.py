"""Compaction: one Parquet file per partition instead of one per (point, kernel).

A sweep writes a result file per (point, kernel), which keeps writes atomic and resume simple,
but DuckDB then opens thousands of files for one query (7 s for 10 000 points on two cores).
``compact`` merges each partition folder's files into one ``compact-<time>-<tag>.parquet``:

1. list the folder's per-point files (and its earlier compacted files), noting each one's
   size, mtime and inode;
2. read them, keep the newest row per (point_id, kernel) (``dataset.newest``) and write the
   merged file under a temporary name, then rename it into place;
3. remove the files it merged, skipping any that changed since step 1 (a ``--force`` re-run
   that wrote a newer row meanwhile: it stays, and wins on ``finished_at``).

A crash between 2 and 3 leaves a row in two files: every reader keeps one (the newest), and the
next compaction merges them. No row is lost or counted twice. Only pyarrow is needed (no DuckDB),
so a GPU machine compacts at the end of its sweep.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .dataset import COMPACT_PREFIX, Dataset, atomic_write, newest, read_table
from .job import now


def _stat(p: Path):
    st = p.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


def compact_partition(folder: Path) -> tuple[int, int]:
    """Merge one partition folder's result files; (files merged, rows in the merged file).
    A folder with nothing to merge (no per-point file and at most one compacted one) is left as is."""
    files = sorted(folder.glob("*.parquet"))
    loose = [f for f in files if not f.name.startswith(COMPACT_PREFIX)]
    packs = [f for f in files if f.name.startswith(COMPACT_PREFIX)]
    if not loose and len(packs) <= 1:
        return 0, 0
    seen = {f: _stat(f) for f in files}
    merged = newest(pa.concat_tables([read_table(f) for f in files], promote_options="permissive"))
    name = f"{COMPACT_PREFIX}{now().strftime('%Y%m%dT%H%M%S%fZ')}-{uuid.uuid4().hex[:6]}.parquet"
    atomic_write(folder / name, lambda tmp: pq.write_table(merged, tmp, compression="zstd"))
    for f in files:
        try:
            if _stat(f) == seen[f]:
                os.unlink(f)
        except FileNotFoundError:  # another compaction took it: its merged file holds the row
            pass
    return len(files), merged.num_rows


def compact(ds) -> dict:
    """Compact every partition of a dataset (a ``Dataset`` or its root folder). Returns
    {"partitions": folders looked at, "merged": files merged, "written": files written, "rows": rows in them}."""
    ds = ds if isinstance(ds, Dataset) else Dataset(ds)
    stats = {"partitions": 0, "merged": 0, "written": 0, "rows": 0}
    for folder in sorted((ds.root / "results").glob("kernel=*/d=*/hkv=*")):
        if not folder.is_dir():
            continue
        stats["partitions"] += 1
        merged, rows = compact_partition(folder)
        if merged:
            stats["merged"] += merged
            stats["written"] += 1
            stats["rows"] += rows
    ds.forget_packed()
    return stats
