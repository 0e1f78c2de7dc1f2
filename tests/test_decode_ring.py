"""Buffers of warps that recorded into shared-memory rings (SegmentRecorder cursor="ring"): the
ring keeps a warp's newest records, so what is lost is the oldest, and the decoder, the bundle
and the summaries say so (hand-built buffers, the host twin of the recorder writes them)."""

from __future__ import annotations

import numpy as np
import pytest

from fa4trace.format import layout as L
from fa4trace.format.errors import TraceFormatError
from fa4trace.format.vocab import EV, ROLE
from fa4trace.trace.bundle import Trace
from fa4trace.trace.decode import decode_buffer
from fa4trace.testing.bundles import WarpEvents, write_buffer

B, E, I = L.KIND_BEGIN, L.KIND_END, L.KIND_INSTANT
GT0 = 1_000_000_000_000


def warp(cta=0, w=0, clk0=10_000, cycles=20_000, ns=10_000, events=(), **kw):
    """A warp living ``cycles`` cycles == ``ns`` ns; events are (kind, event, payload, cycle offset)."""
    ev = list(events)
    return WarpEvents(cta=cta, warp=w, sm=3, role=ROLE.CONSUMER, clk0=clk0, clk1=clk0 + cycles, gt0=GT0,
                      gt1=GT0 + ns, kind=np.array([e[0] for e in ev], np.int64),
                      event=np.array([e[1] for e in ev], np.int64), payload=np.array([e[2] for e in ev], np.int64),
                      t=np.array([clk0 + e[3] for e in ev], np.int64), **kw)


def spans(n, event=EV.QK, step=100):
    """n back-to-back spans of ``event``, payload 0..n-1."""
    out = []
    for i in range(n):
        out += [(B, event, i, step * (2 * i + 1)), (E, event, i, step * (2 * i + 2))]
    return out


def named(d):
    return [(r["name"], r["iter"], r["start_cycles"], r["end_cycles"]) for r in d.table.to_pylist() if r["name"] != "WARP"]


def test_a_ring_that_did_not_wrap_decodes_like_a_slot():
    spec = L.BufferSpec(1, 1, 64)
    events = spans(3)
    plain = decode_buffer(write_buffer(spec, [warp(events=events)]))
    ringed = decode_buffer(write_buffer(spec, [warp(events=events)], ring=8))
    assert named(ringed) == named(plain) and len(named(plain)) == 3
    s = ringed.summary
    assert (s["ring"], s["ring_warps"], s["overwritten"], s["overwritten_warps"], s["dropped"]) == (8, 1, 0, 0, 0)
    assert "ring" not in plain.summary and "overwritten" not in plain.summary


def test_a_wrapped_ring_keeps_the_newest_records_and_counts_the_overwritten():
    spec = L.BufferSpec(2, 1, 64)
    w0 = warp(w=0, events=spans(5))  # 10 records into a ring of 4: the last two spans stay
    w1 = warp(w=1, events=spans(2))  # 4 records: nothing overwritten
    d = decode_buffer(write_buffer(spec, [w0, w1], ring=4))
    mine = [r for r in named(d)]
    assert mine[:2] == [("QK", 3, 10_000 + 700, 10_000 + 800), ("QK", 4, 10_000 + 900, 10_000 + 1000)]
    assert len(mine) == 4
    s = d.summary
    assert (s["ring"], s["ring_warps"], s["overwritten"], s["overwritten_warps"]) == (4, 2, 6, 1)
    assert s["dropped"] == 6 and s["records"] == 8 and s["truncated_spans"] == 0
    warps = [r for r in d.table.to_pylist() if r["name"] == "WARP"]
    assert [r["dropped"] for r in warps] == [6, 0]


def test_a_span_split_by_the_wrap_loses_its_end_not_the_decode():
    """The ring kept the end of SOFTMAX(0) and of QK(0) but not their begins: those ends are
    dropped (counted as truncated spans); QK(1), whole in the ring, is kept."""
    spec = L.BufferSpec(1, 1, 64)
    events = [(B, EV.SOFTMAX, 0, 10), (B, EV.QK, 0, 20), (E, EV.QK, 0, 30), (B, EV.QK, 1, 40), (E, EV.QK, 1, 50),
              (E, EV.SOFTMAX, 0, 60)]
    d = decode_buffer(write_buffer(spec, [warp(events=events)], ring=4))
    assert named(d) == [("QK", 1, 10_040, 10_050)]
    assert d.summary["truncated_spans"] == 2 and d.summary["overwritten"] == 2


def test_the_end_of_a_repeated_key_pairs_with_its_own_begin():
    """Two spans of one (event, payload) and a mark in a ring of 4: it kept the first span's
    end, the whole second span and the mark. The lone end is the first span's, so the span decoded
    is the second (40..50), not begin 40 with end 30 (which would run backwards)."""
    spec = L.BufferSpec(1, 1, 64)
    events = [(B, EV.PV, 7, 10), (E, EV.PV, 7, 30), (B, EV.PV, 7, 40), (E, EV.PV, 7, 50), (I, EV.MARK, -1, 60)]
    d = decode_buffer(write_buffer(spec, [warp(events=events)], ring=4))
    assert named(d) == [("PV", 7, 10_040, 10_050), ("MARK", -1, 10_060, 10_060)]
    assert (d.summary["overwritten"], d.summary["truncated_spans"]) == (1, 1)


def test_a_slot_smaller_than_the_ring_keeps_the_newest_it_holds():
    events = spans(6)
    d = decode_buffer(write_buffer(L.BufferSpec(1, 1, 3), [warp(events=events)], ring=8))
    # the slot holds 3: the newest 3 records (E4, B5, E5) are kept, 9 are counted overwritten
    assert named(d) == [("QK", 5, 10_000 + 1100, 10_000 + 1200)]
    assert (d.summary["overwritten"], d.summary["truncated_spans"]) == (9, 1)


def test_unmatched_records_a_ring_cannot_explain_are_still_errors():
    spec = L.BufferSpec(1, 1, 64)
    # nothing overwritten: an end without begin is foreign bytes, as in a slot
    with pytest.raises(TraceFormatError, match="record 0: end without begin"):
        decode_buffer(write_buffer(spec, [warp(events=[(E, EV.PV, 2, 1)])], ring=4))
    # a ring keeps the newest records: a begin without its end is never the ring's doing
    events = [(B, EV.QK, 0, 10), (E, EV.QK, 0, 20), (B, EV.QK, 1, 30), (B, EV.PV, 0, 40), (E, EV.PV, 0, 50)]
    with pytest.raises(TraceFormatError, match="begin without end"):
        decode_buffer(write_buffer(spec, [warp(events=events)], ring=4))


def test_ring_header_fields_are_checked():
    spec = L.BufferSpec(1, 1, 64)
    buf = write_buffer(spec, [warp(events=spans(4))], ring=4)
    word = L.GLOBAL_HEADER_WORDS + L.W_WARP
    assert (int(buf[word]) >> L.RING_SHIFT) & 0xFF == L.ring_field(4) == 3
    bad = buf.copy()
    bad[word] |= np.uint64(1 << 24)  # bits 24-31 of word 2 are zero
    with pytest.raises(TraceFormatError, match="foreign or corrupted bytes"):
        decode_buffer(bad)
    bad = buf.copy()
    bad[word] = (int(bad[word]) & ~(0xFF << L.RING_SHIFT)) | (L.ring_field(2) << L.RING_SHIFT)
    with pytest.raises(TraceFormatError, match="4 records written from a ring of 2"):
        decode_buffer(bad)


def test_a_long_lived_ring_warp_unwraps_from_its_end():
    """The ring kept records from more than 2**32 cycles after the warp's start: unwrapped
    against the start anchor they would land a wrap early; the end anchor places them."""
    spec = L.BufferSpec(1, 1, 64)
    late = 3 * (1 << 32) + 5_000
    w = warp(cycles=late + 10_000, ns=(late + 10_000) // 2,
             events=spans(1, EV.PV, 100) + [(B, EV.QK, 9, late), (E, EV.QK, 9, late + 100)])
    d = decode_buffer(write_buffer(spec, [w], ring=2))
    assert named(d) == [("QK", 9, 10_000 + late, 10_000 + late + 100)]


@pytest.mark.parametrize("bad", [0, 1, 3, 100, 8192, True, 2.0])
def test_a_bad_ring_size_is_one_line(bad):
    with pytest.raises(ValueError, match="power of two") as exc:
        L.check_ring(bad)
    assert "\n" not in str(exc.value)


def _bundle(buf, meta=None):
    return Trace.from_launches([decode_buffer(buf)], meta or {"kernel": "k"})


def test_bundle_meta_and_summaries_say_the_oldest_records_were_overwritten(tmp_path):
    from click.testing import CliRunner

    from fa4trace.analysis.overlap import summarize
    from fa4trace.analysis.text import dropped_text
    from fa4trace.cli import main

    spec = L.BufferSpec(2, 2, 64)
    ws = [warp(cta=c, w=w, events=spans(5 if w == 0 else 1)) for c in (0, 1) for w in (0, 1)]
    t = _bundle(write_buffer(spec, ws, ring=4))
    assert t.meta["total_dropped"] == t.meta["total_overwritten"] == 12
    assert t.meta["launches"][0]["ring"] == 4 and t.meta["launches"][0]["overwritten_warps"] == 2
    s = summarize(t)
    assert (s["ring"], s["overwritten"], s["overwritten_warps"]) == (4, 12, 2)
    line = "ring of 4 records per warp: the oldest 12 records of 2 warps were overwritten"
    assert dropped_text(s) == line
    path = t.save(tmp_path / "ring.parquet")
    out = CliRunner().invoke(main, ["summary", str(path)])
    assert out.exit_code == 0, out.output
    assert line in out.output and "overflowed" not in out.output

    plain = summarize(_bundle(write_buffer(spec, ws)))
    assert "ring" not in plain and dropped_text(plain) == "0 records (0 warps overflowed)"


def test_auto_bundle_summary_reports_the_ring():
    from fa4trace.analysis.kernel import summarize_kernel
    from fa4trace.analysis.text import format_kernel_summary
    from fa4trace.testing.bundles import pipelined_like

    buf, meta, vocab = pipelined_like(n_ctas=2, k_tiles=8, stages=2, consumer_warps=1, idle_warps=0)
    # the same warps as if they had recorded into rings of 16: rebuild the buffer with the ring
    plain = Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab)
    assert "ring" not in summarize_kernel(plain) and "0 warps overflowed" in format_kernel_summary(summarize_kernel(plain))
    ring_buf = _rering(buf, 16)
    t = Trace.from_launches([decode_buffer(ring_buf, vocab=vocab)], meta, vocab=vocab)
    s = summarize_kernel(t)
    assert s["ring"] == 16 and s["overwritten"] > 0 and s["overwritten_warps"] >= 1
    assert (f"ring of 16 records per warp: the oldest {s['overwritten']} records of "
            f"{s['overwritten_warps']} warps were overwritten") in format_kernel_summary(s)


def _rering(buf, ring: int) -> np.ndarray:
    """A decoded-and-rewritten copy of ``buf`` whose warps kept only their last ``ring`` records
    in a ring (what the device leaves: the newest records, the header's ring field)."""
    spec = L.BufferSpec.from_header(buf)
    out = buf.copy()
    slots = out[L.GLOBAL_HEADER_WORDS:spec.slots_end].reshape(spec.n_slots, spec.slot_words)
    for s in range(spec.n_slots):
        hdr = slots[s, :L.WARP_HEADER_WORDS]
        if int(hdr[L.W_MAGIC]) == 0:
            continue
        n = int(hdr[L.W_COUNTS]) & 0xFFFFFFFF
        kept = min(n, ring)
        recs = slots[s, L.WARP_HEADER_WORDS + n - kept:L.WARP_HEADER_WORDS + n].copy()
        slots[s, L.WARP_HEADER_WORDS:] = 0
        slots[s, L.WARP_HEADER_WORDS:L.WARP_HEADER_WORDS + kept] = recs
        hdr[L.W_WARP] = int(hdr[L.W_WARP]) | (L.ring_field(ring) << L.RING_SHIFT)
        hdr[L.W_COUNTS] = kept | ((n - kept) << 32)
    return out
