"""Buffers of warps whose shared-memory ring spilled each half into the slot as it filled
(SegmentRecorder cursor="ring", spill=True): the host twin of the recorder (synthetic.spill_ring,
with the device's index rules from fa4trace.format.layout) leaves every record at its own slot
position, never reads a ring entry already overwritten, and the buffer decodes as one recorded
without a ring: nothing overwritten, the newest records past the capacity dropped."""

from __future__ import annotations

import numpy as np
import pytest

from fa4trace.format import layout as L
from fa4trace.trace.decode import decode_buffer
from fa4trace.trace.synthetic import spill_ring, write_buffer

from test_decode_ring import named, spans, warp

SEGMENTS = {
    "one record each": lambda n: [1] * n,
    "begin/end pairs": lambda n: [2] * (n // 2) + [1] * (n % 2),
    "threes": lambda n: [3] * (n // 3) + ([n % 3] if n % 3 else []),
    "long segments": lambda n: [11] * (n // 11) + ([n % 11] if n % 11 else []),
    "random": lambda n: _random_segments(n),
}


def _random_segments(n: int) -> list:
    rng = np.random.default_rng(n)
    out = []
    while sum(out) < n:
        out.append(int(min(rng.integers(1, 20), n - sum(out))))
    return out


@pytest.mark.parametrize("ring", [2, 4, 8, 16, 128])
@pytest.mark.parametrize("segs", sorted(SEGMENTS))
@pytest.mark.parametrize("n, capacity", [(0, 16), (7, 64), (100, 64), (100, 100), (300, 1000), (257, 256)])
def test_every_record_lands_at_its_own_position(ring, segs, n, capacity):
    """Whatever the ring's size and the segments' lengths (longer than half the ring too), the
    slot holds records 0 .. min(n, capacity) - 1 in order, and the counts are a slot's."""
    words = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x1000)
    slot, written, dropped = spill_ring(words, SEGMENTS[segs](n), ring, capacity)
    assert written == min(n, capacity) and dropped == n - written
    assert np.array_equal(slot, words[:written])


def test_the_twin_catches_a_copy_of_an_overwritten_entry(monkeypatch):
    """Spilling at whole-ring boundaries (R instead of R/2) lets a segment's records overwrite the
    start of the ring before it is copied: the twin raises instead of writing wrong records."""
    import fa4trace.trace.synthetic as S

    words = np.arange(1, 41, dtype=np.uint64)
    monkeypatch.setattr(S.L, "spill_due", lambda c, m, half: (c & (2 * half - 1)) >= 2 * half - m)
    monkeypatch.setattr(S.L, "spill_from", lambda c, m, half: ((c + m) & -(2 * half)) - 2 * half)
    with pytest.raises(RuntimeError, match="found record"):
        spill_ring(words, [3] * 13 + [1], 8, 64)


def test_segments_must_add_up():
    with pytest.raises(ValueError, match="add up to the 4 records"):
        spill_ring(np.zeros(4, np.uint64), [1, 2], 8, 16)


def test_a_spilled_buffer_is_a_slot_buffer():
    """write_buffer(ring=8, spill=True) lays out exactly what write_buffer without a ring does
    (ring field 0), and decodes alike: no ring, nothing overwritten, the newest dropped."""
    spec = L.BufferSpec(2, 1, 24)
    w0 = warp(w=0, events=spans(20), segments=[2] * 20)  # 40 records into 24: 16 dropped
    w1 = warp(w=1, events=spans(5), segments=[4, 4, 2])  # segments longer than half the ring
    plain = write_buffer(spec, [warp(w=0, events=spans(20)), warp(w=1, events=spans(5))])
    spilled = write_buffer(spec, [w0, w1], ring=8, spill=True)
    assert np.array_equal(spilled, plain)
    d = decode_buffer(spilled)
    assert named(d) == named(decode_buffer(plain)) and len(named(d)) == 12 + 5
    s = d.summary
    assert "ring" not in s and "overwritten" not in s and s["dropped"] == 16
    ringed = decode_buffer(write_buffer(spec, [w0, w1], ring=8))  # the same warps, no spill: 8 kept each
    assert ringed.summary["overwritten"] == 32 + 2


def test_spill_needs_a_ring():
    with pytest.raises(ValueError, match="needs a ring"):
        write_buffer(L.BufferSpec(1, 1, 8), [warp(events=spans(1))], spill=True)
