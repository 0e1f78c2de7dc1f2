"""What `fa4trace check` measures a recording with, on the host: guard words around a trace
buffer (did the kernel write outside it?) and the slices of a Perfetto trace read back (did
every row become one slice?).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


# ---- guard words around a trace buffer -------------------------------------------------------
GUARD_WORD = 0xDEADBEEFCAFEF00D
# 64 words (512 bytes) each side: a stray write just past either end lands in a guard, and the
# buffer between them keeps the 16-byte alignment the kernels assume.
GUARD_WORDS = 64


def guarded_buffer(spec, guard: int = GUARD_WORDS) -> np.ndarray:
    """Host words: ``guard`` sentinel words, the buffer of ``spec`` (header written, slots
    zeroed), ``guard`` sentinel words. Launch with ``buffer_view`` of its device copy."""
    if guard < 2 or guard % 2:
        raise ValueError(f"guard must be an even number >= 2 of words (16-byte alignment), got {guard}")
    g = np.full(guard, GUARD_WORD, np.uint64)
    return np.concatenate([g, spec.new_buffer(), g])


def buffer_view(words, spec, guard: int = GUARD_WORDS):
    """The trace buffer between the guards (numpy or torch: a contiguous slice, no copy)."""
    return words[guard:guard + spec.words]


def guard_damage(words, spec, guard: int = GUARD_WORDS) -> dict:
    """How many sentinel words changed before and after the buffer (0 and 0: nothing was
    written out of bounds), from the host copy of a guarded buffer after the launch."""
    w = np.asarray(words).reshape(-1).view(np.uint64)
    if w.size != spec.words + 2 * guard:
        raise ValueError(f"guarded buffer has {w.size} words, expected {spec.words + 2 * guard}")
    sentinel = np.uint64(GUARD_WORD)
    return {"before": int((w[:guard] != sentinel).sum()), "after": int((w[guard + spec.words:] != sentinel).sum())}


# ---- Perfetto ---------------------------------------------------------------------------------
def perfetto_slices(path) -> dict:
    """Read a Perfetto trace back and count its track events: ``slices`` (slice begins +
    instants, what the UI shows as slices), ``ends`` and ``counters``. A bundle converts
    correctly when slices == its rows and ends == begins."""
    import zlib

    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    te = pb.TrackEvent
    n = {"begins": 0, "ends": 0, "instants": 0, "counters": 0}
    key = {te.TYPE_SLICE_BEGIN: "begins", te.TYPE_SLICE_END: "ends", te.TYPE_INSTANT: "instants",
           te.TYPE_COUNTER: "counters"}

    def walk(data: bytes):
        for p in pb.Trace.FromString(data).packet:
            if p.HasField("compressed_packets"):
                walk(zlib.decompress(p.compressed_packets))
            elif p.HasField("track_event") and p.track_event.type in key:
                n[key[p.track_event.type]] += 1

    walk(Path(path).read_bytes())
    n["slices"] = n["begins"] + n["instants"]
    return n
