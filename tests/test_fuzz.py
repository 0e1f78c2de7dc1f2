"""Random, truncated and corrupted buffers and bundles: TraceFormatError or a valid decode, nothing else."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fa4trace.format import layout as L
from fa4trace.format.errors import Fa4traceError, TraceFormatError
from fa4trace.format.vocab import EV, ROLE
from fa4trace.trace.bundle import Trace, load
from fa4trace.trace.decode import SCHEMA, decode_buffer
from fa4trace.testing.bundles import WarpEvents, write_buffer

settings.register_profile("ci", max_examples=150, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile("ci")

EVENTS = [EV.QK, EV.SOFTMAX, EV.PV, EV.LOAD_K, EV.MARK]


@st.composite
def valid_buffers(draw):
    n_cta = draw(st.integers(1, 4))
    cap = draw(st.integers(1, 24))
    life = draw(st.integers(0, 6))  # CTAs the lifetime region times (0: no region)
    if draw(st.booleans()):  # every warp below warps_per_cta
        warp_ids = list(range(draw(st.integers(1, 4))))
        spec = L.BufferSpec(len(warp_ids), n_cta, cap, lifetime_ctas=life)
    else:  # a warp subset (warp mask)
        warp_ids = sorted(draw(st.sets(st.integers(0, 31), min_size=1, max_size=4)))
        spec = L.BufferSpec(len(warp_ids), n_cta, cap, warp_mask=sum(1 << w for w in warp_ids), lifetime_ctas=life)
    ws = []
    for c in range(n_cta):
        for w in warp_ids:
            if draw(st.booleans()):
                continue
            n_spans = draw(st.integers(0, 8))
            kinds, evs, pays, ts = [], [], [], []
            t = 0
            for i in range(n_spans):
                ev = draw(st.sampled_from(EVENTS))
                gap, dur = draw(st.integers(0, 50)), draw(st.integers(0, 500))
                kinds += [L.KIND_BEGIN, L.KIND_END]
                evs += [ev, ev]
                pays += [i, i]
                ts += [t + gap, t + gap + dur]
                t += gap + dur
            clk0 = draw(st.integers(0, 2**40))
            ws.append(WarpEvents(c, w, draw(st.integers(0, 131)), ROLE.CONSUMER, clk0, clk0 + t + 10,
                                 10**12, 10**12 + (t + 10) // 2,
                                 np.array(kinds, np.int64), np.array(evs, np.int64), np.array(pays, np.int64),
                                 clk0 + np.array(ts, np.int64)))
    return spec, ws


def lifetimes_of(spec, ws):
    """Every CTA the region times gets a lifetime that holds its warps (as the stamps leave it)."""
    ctas = np.arange(min(spec.lifetime_ctas, spec.n_cta_slots))
    end = [max([w.gt1 for w in ws if w.cta == c], default=10**12) + 1 for c in ctas]
    return ctas, np.full(ctas.size, 10**12 - 1), np.array(end, np.int64)


@given(valid_buffers())
def test_valid_buffers_decode_consistently(sb):
    spec, ws = sb
    buf = write_buffer(spec, ws, lifetimes=lifetimes_of(spec, ws))
    try:
        d = decode_buffer(buf)
    except TraceFormatError as e:
        assert "no recorded warp" in str(e) and not ws
        return
    t = d.table
    assert t.schema == SCHEMA
    starts, ends = t["start_ns"].to_numpy(), t["end_ns"].to_numpy()
    assert (ends >= starts).all()
    assert (t.filter(pa.compute.equal(t["kind"].cast("string"), "warp")).num_rows) == len(ws)
    assert sorted(set(t["warp"].to_pylist())) == sorted({w.warp for w in ws})
    expect_spans = sum(min(len(w.kind), spec.capacity) // 2 for w in ws)
    assert t.num_rows - len(ws) == expect_spans
    assert d.summary["dropped"] == sum(max(0, len(w.kind) - spec.capacity) for w in ws)
    timed = min(spec.lifetime_ctas, spec.n_cta_slots)
    assert d.summary["ctas_timed"] == timed
    if timed:
        assert d.cta_lifetimes["cta"].tolist() == list(range(timed)) and d.summary["ctas_outside_lifetime"] == 0
        assert d.cta_lifetimes["recorded"].tolist() == [any(w.cta == c for w in ws) for c in range(timed)]


@given(valid_buffers(), st.data())
def test_corrupted_buffers_raise_only_trace_format_error(sb, data):
    spec, ws = sb
    buf = write_buffer(spec, ws, lifetimes=lifetimes_of(spec, ws)).copy()
    n = data.draw(st.integers(1, 6))
    for _ in range(n):
        i = data.draw(st.integers(0, buf.size - 1))
        buf[i] = np.uint64(data.draw(st.integers(0, 2**64 - 1)))
    cut = data.draw(st.integers(0, buf.size))
    try:
        decode_buffer(buf[:cut])
    except TraceFormatError:
        pass


@given(st.binary(max_size=4096))
def test_random_bytes_raise_only_trace_format_error(blob):
    try:
        decode_buffer(blob)
    except TraceFormatError:
        pass


@pytest.fixture(scope="module")
def good_bundle(tmp_path_factory):
    from fa4trace.testing.bundles import attention_like

    buf, meta = attention_like("pingpong", n_ctas=4, n_blocks=6)
    p = tmp_path_factory.mktemp("b") / "good.parquet"
    Trace.from_launches([decode_buffer(buf)], meta).save(p)
    return p.read_bytes()


@given(st.data())
def test_corrupted_or_truncated_bundles_fail_cleanly(good_bundle, tmp_path_factory, data):
    blob = bytearray(good_bundle)
    mode = data.draw(st.sampled_from(["truncate", "flip", "both"]))
    if mode in ("flip", "both"):
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] = data.draw(st.integers(0, 255))
    if mode in ("truncate", "both"):
        blob = blob[:data.draw(st.integers(0, len(blob)))]
    p = tmp_path_factory.mktemp("c") / "bad.parquet"
    p.write_bytes(bytes(blob))
    try:
        t = load(p)
    except Fa4traceError:
        return
    assert t.events.schema == SCHEMA


def test_every_footer_byte_damaged_fails_cleanly(good_bundle, tmp_path):
    """Deterministic sweep of the Parquet footer (schema, row groups, our metadata): each byte
    set to a few values must give a trace or a one-line Fa4traceError, never a pyarrow error.
    Hypothesis found one such byte (a column's integer width read as > 64 bits) at random; this
    walks all of them so the class stays covered."""
    import io

    import pyarrow.parquet as pq

    footer_len = int.from_bytes(good_bundle[-8:-4], "little")
    start = len(good_bundle) - 8 - footer_len
    # the footer's two long text values (the Arrow schema in base64, our metadata as JSON) are
    # most of its bytes: their first and last 64 bytes and every 11th between are damaged, every
    # byte of the Thrift structure around them
    texts = [(j, j + len(v)) for v in pq.read_metadata(io.BytesIO(good_bundle)).metadata.values()
             if len(v) > 256 and (j := good_bundle.find(v, start)) >= 0]
    assert texts, "the footer's metadata values were not found"

    def walked(i: int) -> bool:
        return all(not (a + 64 <= i < b - 64) or (i - a) % 11 == 0 for a, b in texts)

    p = tmp_path / "bad.parquet"
    outcomes = {"error": 0, "loaded": 0}
    for i in filter(walked, range(start, len(good_bundle) - 8)):
        for value in (0x2F, 0xFF, good_bundle[i] ^ 0x01):
            blob = bytearray(good_bundle)
            blob[i] = value
            p.write_bytes(bytes(blob))
            try:
                t = load(p)
            except Fa4traceError as exc:
                assert "\n" not in str(exc)
                outcomes["error"] += 1
                continue
            assert t.events.schema == SCHEMA
            outcomes["loaded"] += 1
    assert outcomes["error"] > 0, outcomes  # the sweep did damage the file
