"""Bundles that are not what they claim, for the tests of the commands that refuse them."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from fa4trace.trace.decode import SCHEMA


def damage_page(src: Path, dst: Path, column: str = "end_ns") -> Path:
    """A copy of the bundle ``src`` with one byte flipped inside ``column``'s data page, its
    footer intact (what read_meta reads passes; the column's data does not)."""
    chunk = pq.ParquetFile(src).metadata.row_group(0).column(SCHEMA.get_field_index(column))
    assert chunk.path_in_schema == column
    data = bytearray(Path(src).read_bytes())
    data[chunk.data_page_offset + chunk.total_compressed_size // 2] ^= 0xFF
    Path(dst).write_bytes(bytes(data))
    return Path(dst)


def no_event_bundle(path: Path) -> Path:
    """A well-formed Parquet bundle of 0 rows (what Trace.save refuses to write)."""
    meta = json.dumps({"format": "fa4trace-bundle", "bundle_version": 1, "kernel": "k"}).encode()
    pq.write_table(SCHEMA.empty_table().replace_schema_metadata({b"fa4trace": meta}), path)
    return Path(path)
