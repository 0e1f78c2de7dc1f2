"""Parquet bundle: round trip with metadata, refusal to overwrite, readable by pandas."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fa4trace.format.errors import Fa4traceError, TraceFormatError
from fa4trace.trace.bundle import META_KEY, Trace, load
from fa4trace.trace.decode import SCHEMA, decode_buffer
from fa4trace.testing.bundles import attention_like


@pytest.fixture(scope="module")
def trace():
    buf, meta = attention_like("base", n_ctas=6, n_blocks=10)
    meta["config"].update({"b": 1, "sq": 1, "sk": 1280, "hq": 16, "hkv": 1, "d": 128, "dtype": "bf16"})
    return Trace.from_launches([decode_buffer(buf)], meta)


def test_round_trip_keeps_events_and_metadata(trace, tmp_path):
    p = trace.save(tmp_path / "a.parquet")
    t2 = load(p)
    assert t2.events.equals(trace.events)
    for key in ("kernel", "config", "launches", "vocabulary", "total_dropped", "synthetic", "fa4trace_version",
                "recorded_at", "format", "bundle_version", "t0_globaltimer_ns"):
        assert t2.meta[key] == json.loads(json.dumps(trace.meta[key])), key
    assert t2.meta["synthetic"] is True
    assert pq.ParquetFile(p).metadata.row_group(0).column(0).compression == "ZSTD"


def test_save_refuses_to_overwrite(trace, tmp_path):
    p = trace.save(tmp_path / "a.parquet")
    before = p.read_bytes()
    with pytest.raises(Fa4traceError, match="refusing to overwrite"):
        trace.save(p)
    assert p.read_bytes() == before
    trace.save(p, overwrite=True)


def test_pandas_reads_the_bundle_as_is(trace, tmp_path):
    p = trace.save(tmp_path / "a.parquet")
    df = pd.read_parquet(p)
    assert len(df) == len(trace)
    assert set(df.columns) == set(SCHEMA.names)
    assert set(df["name"].astype(str)) >= {"QK", "SOFTMAX", "PV", "WARP"}


def test_multi_launch_rebase(trace):
    from fa4trace.testing.bundles import attention_like

    b1, m1 = attention_like("base", n_ctas=2, n_blocks=3, seed=1)
    d0 = decode_buffer(b1, launch_index=0)
    d1 = decode_buffer(b1, launch_index=1)
    d1.t0_globaltimer_ns += 5_000
    t = Trace.from_launches([d0, d1], {"kernel": "two"})
    ev = t.events.to_pandas()
    assert ev[ev.launch == 1]["start_ns"].min() == ev[ev.launch == 0]["start_ns"].min() + 5_000
    assert [lm["t0_offset_ns"] for lm in t.meta["launches"]] == [0, 5_000]


def test_not_a_bundle(tmp_path):
    p = tmp_path / "x.parquet"
    p.write_text("hello")
    with pytest.raises(TraceFormatError, match="not a Parquet trace bundle"):
        load(p)
    pq.write_table(pa.table({"a": [1, 2]}), p)
    with pytest.raises(TraceFormatError, match="without fa4trace metadata"):
        load(p)
    with pytest.raises(Fa4traceError, match="no such file"):
        load(tmp_path / "missing.parquet")
    with pytest.raises(Fa4traceError, match="directory"):
        load(tmp_path)


def test_wrong_schema_or_newer_version(trace, tmp_path):
    p = tmp_path / "x.parquet"
    meta = json.dumps({"format": "fa4trace-bundle", "bundle_version": 1}).encode()
    pq.write_table(pa.table({"cta": [1]}).replace_schema_metadata({META_KEY: meta}), p)
    with pytest.raises(TraceFormatError, match="lacks column"):
        load(p)
    newer = trace.events.replace_schema_metadata(
        {META_KEY: json.dumps({"format": "fa4trace-bundle", "bundle_version": 99}).encode()})
    pq.write_table(newer, p)
    with pytest.raises(TraceFormatError, match="newer"):
        load(p)
