"""A sweep dataset on disk: hive-partitioned Parquet under one root folder.

    ROOT/results/kernel=<k>/d=<d>/hkv=<hkv>/<point_id>.parquet   one row per (point, kernel)
    ROOT/bundles/kernel=<k>/d=<d>/<point_id>.parquet             a recorded trace bundle per
                                                                 (point, schedule of ours)
    ROOT/sweeps/sweep=<sweep_id>/sweep.json                      GPU, clocks, commit, command,
                                                                 grid, started / finished

Every file is written to a temporary name in its folder (a dot name ending in .tmp, which no
``*.parquet`` glob matches) and renamed into place, so a crash or a kill loses at most the point
in flight. A point's result file is written last, after its bundles: its presence means done.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq

RESULT_SCHEMA = pa.schema([
    ("sweep_id", pa.string()), ("point_id", pa.string()), ("kernel", pa.string()),
    ("d", pa.int32()), ("hq", pa.int32()), ("hkv", pa.int32()), ("sk", pa.int64()), ("b", pa.int32()),
    ("sq", pa.int32()), ("dtype", pa.string()),
    ("us", pa.float64()), ("us_spread", pa.float64()), ("tbps", pa.float64()), ("rel_err", pa.float64()),
    ("error", pa.string()),
    ("qk_softmax_overlap", pa.float64()), ("pv_softmax_overlap", pa.float64()),
    ("bundle", pa.string()), ("gpu", pa.string()), ("worker", pa.string()),
    ("finished_at", pa.timestamp("us", tz="UTC")),
])


def point_id(p) -> str:
    """A stable, readable id of a shape: d128_h16kv1_sk131072_b1_sq1_bf16."""
    return f"d{p.d}_h{p.hq}kv{p.hkv}_sk{p.sk}_b{p.b}_sq{p.sq}_{p.dtype}"


def _atomic(path: Path, write) -> Path:
    """``write(tmp_path)`` then rename onto ``path`` (same folder: atomic on POSIX)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _clean(x):
    """NaN and inf to None (Parquet null): a missing timing is null, not NaN."""
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return None
    return x


class Dataset:
    def __init__(self, root):
        self.root = Path(root)

    # ---- paths ----
    def result_path(self, point, kernel: str) -> Path:
        return self.root / "results" / f"kernel={kernel}" / f"d={point.d}" / f"hkv={point.hkv}" / f"{point_id(point)}.parquet"

    def bundle_rel(self, point, kernel: str) -> str:
        return f"bundles/kernel={kernel}/d={point.d}/{point_id(point)}.parquet"

    def bundle_path(self, point, kernel: str) -> Path:
        return self.root / self.bundle_rel(point, kernel)

    def sweep_path(self, sweep_id: str) -> Path:
        return self.root / "sweeps" / f"sweep={sweep_id}" / "sweep.json"

    # ---- state ----
    def has_result(self, point, kernel: str) -> bool:
        return self.result_path(point, kernel).is_file()

    def missing(self, point, kernels) -> list[str]:
        return [k for k in kernels if not self.has_result(point, k)]

    # ---- writes ----
    def write_result(self, row: dict) -> Path:
        """One (point, kernel) row, every RESULT_SCHEMA column (missing ones null)."""
        from .grid import Point

        unknown = set(row) - set(RESULT_SCHEMA.names)
        if unknown:
            raise ValueError(f"result row has unknown columns {sorted(unknown)}")
        table = pa.Table.from_pylist([{n: _clean(row.get(n)) for n in RESULT_SCHEMA.names}], schema=RESULT_SCHEMA)
        p = Point(row["d"], row["hq"], row["hkv"], row["sk"], row["b"], row["sq"], row["dtype"])
        return _atomic(self.result_path(p, row["kernel"]), lambda tmp: pq.write_table(table, tmp))

    def write_bundle(self, point, kernel: str, trace) -> str:
        """Save a trace bundle (``Trace.save`` writes atomically); returns its path relative to the root."""
        trace.save(self.bundle_path(point, kernel), overwrite=True)
        return self.bundle_rel(point, kernel)

    def write_sweep(self, sweep_id: str, doc: dict) -> Path:
        text = json.dumps(doc, indent=1, default=str) + "\n"
        return _atomic(self.sweep_path(sweep_id), lambda tmp: Path(tmp).write_text(text))

    # ---- reads ----
    def read_results(self) -> pa.Table:
        """Every result row (the files, without the hive columns), for tests and small datasets."""
        files = sorted((self.root / "results").glob("kernel=*/d=*/hkv=*/*.parquet"))
        if not files:
            return RESULT_SCHEMA.empty_table()
        return pa.concat_tables([pq.ParquetFile(f).read().cast(RESULT_SCHEMA) for f in files])

    def sweeps(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted((self.root / "sweeps").glob("sweep=*/sweep.json"))]


def find_dataset(root) -> Optional[Path]:
    """The root if it looks like a sweep dataset (holds results/ or sweeps/), else None."""
    p = Path(root)
    return p if p.is_dir() and ((p / "results").is_dir() or (p / "sweeps").is_dir()) else None
