"""Binary layout of a trace buffer: the contract between the device recorder and the decoder.

Everything is little-endian 64-bit words, so a buffer is one ``int64``/``uint64`` array.

    buffer  = global header (8 words) + n_cta_slots * warps_per_cta warp slots
              + CTA-lifetime region (lifetime_ctas entries of 2 words)
    slot    = warp header (8 words) + capacity records (1 word each)

Global header (written by the host before the launch, read by every recording warp):
    g0  BUF_MAGIC | version << 32
    g1  slot_words | warps_per_cta << 32
    g2  cta_first  | cta_stride << 32      which CTAs record: first, first+stride, ...
    g3  n_cta_slots | warp_mask << 32      how many of them; which warps of such a CTA record
    g4  lifetime_offset | lifetime_ctas << 32   where the CTA-lifetime region starts (word index,
                                           right after the warp slots) and how many CTAs it times
CTAs are counted in cluster order (cluster index, then rank in the cluster; without clusters
that is the linear CTA index), and the stride steps over whole clusters, so a recording CTA
brings its cluster. A warp records iff its CTA is one of those and its warp is selected:
warp_mask bit w selects warp w (then warps_per_cta = popcount(warp_mask)); warp_mask 0 selects
warps 0..warps_per_cta-1. Its slot is fixed by (CTA, warp), so no atomics are needed and a
launch writes each slot at most once. (warp_mask came after the first buffers; those have 0
there and read as before.)

CTA-lifetime region (g4; 0 there: none): entry c (linear CTA index c < lifetime_ctas) is
    l0  bitwise NOT of the CTA's start %globaltimer     l1  the CTA's end %globaltimer
written by kernels compiled by fa4trace.auto (``compile_traced``, ``fa4trace.instrument``) in
every CTA, recording or not: lane 0 of each warp does ``red.global.max.u64`` of ~start as the
warp enters the kernel and of end as it leaves, so l0 ends as ~(earliest start), l1 as the
latest end, and a zeroed buffer needs no other initialization (0 = not timed). CTAs at or
beyond lifetime_ctas are not timed. It lets a bundle compare the recorded CTAs' durations with
those of the CTAs that ran the untouched body in the same launch (fa4trace.analysis.fidelity). Builds
made before the region existed leave it zero; kernels with their own ``Recorder`` never write it.

Warp header (written by lane 0 of the warp: words 0-4 at start, 5-7 at finish):
    w0  WARP_MAGIC | version << 32 | timebase << 40 | role << 48
    w1  smid | cta_linear << 32
    w2  warp index in CTA | ring << 16 | (cluster-order index + 1) << 32 | cluster size << 56
        (bits 32-55 0: a buffer from before cluster order, whose slots follow the linear CTA
        index; ring, bits 16-23: log2(records) + 1 of the warp's shared-memory ring, 0: none)
    w3  %globaltimer at start     w4  %clock64 at start
    w5  %globaltimer at finish    w6  %clock64 at finish
    w7  records written | records dropped << 32

A warp without a ring stores each record into its slot as it happens; a full slot keeps
counting, so its dropped records are the newest ones. A warp with a ring
(``SegmentRecorder`` cursor="ring") keeps its last R records in shared memory and copies them
into its slot, oldest first, when it finishes: its dropped records are the oldest ones
(overwritten in the ring), and ``written`` is at most R. (The ring field came after the first
buffers; those have 0 there and read as before.)

Record (one word, one per event):
    bits  0..31  low 32 bits of the timer (clock64 cycles, or globaltimer ns)
    bits 32..39  event id (vocabulary)
    bits 40..41  kind: 0 begin, 1 end, 2 instant
    bits 42..43  zero (a non-zero value marks foreign bytes)
    bits 44..63  payload (KV block / iteration); PAYLOAD_NONE means "no payload"

Why 8-byte records with 32-bit times: a recorder is store-bound when markers are dense,
so the smallest record wins; the 64-bit anchors in the warp header let the
decoder unwrap the 32-bit times (clock64 wraps 32 bits every ~2.2 s at 1.98 GHz).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import TraceFormatError

FORMAT_VERSION = 1
# What the device side of this fa4trace reads from a buffer header (2: with the warp mask in
# g3's high word). Builds record it in their manifest; the loader refuses a build of another.
RECORDER_ABI = 2
BUF_MAGIC = 0x42543446  # b"F4TB" little-endian
WARP_MAGIC = 0x57543446  # b"F4TW" little-endian
GLOBAL_HEADER_WORDS = 8
WARP_HEADER_WORDS = 8


def warp_word0(timebase=0, role=0):
    """Word 0 of a warp header: magic, format version, timebase and role (layout above).
    Integers or numpy arrays."""
    return WARP_MAGIC | (FORMAT_VERSION << 32) | (timebase << 40) | (role << 48)


KIND_BEGIN, KIND_END, KIND_INSTANT = 0, 1, 2

EVENT_SHIFT, EVENT_BITS = 32, 8
KIND_SHIFT, KIND_BITS = 40, 2
RESERVED_SHIFT, RESERVED_BITS = 42, 2
PAYLOAD_SHIFT, PAYLOAD_BITS = 44, 20
PAYLOAD_NONE = (1 << PAYLOAD_BITS) - 1  # decodes to iter = -1
PAYLOAD_MAX = PAYLOAD_NONE - 1

# Anchor records (Recorder.anchor): a pair of instants with this event id, payload
# ANCHOR_CLOCK carrying %clock64's low word, then payload ANCHOR_GLOBALTIMER carrying
# %globaltimer's low word, read together at a timer edge. The decoder turns them into
# interpolation knots and drops them from the events.
ANCHOR_EVENT_ID = 255
ANCHOR_CLOCK, ANCHOR_GLOBALTIMER = 0, 1

TIMEBASE_CLOCK64 = 0  # per-event %clock64 (0.5 ns at 1.98 GHz), anchored per warp
TIMEBASE_GLOBALTIMER = 1  # per-event %globaltimer (the IKET way: 32 ns ticks on H200)
TIMEBASE_NAMES = {TIMEBASE_CLOCK64: "clock64", TIMEBASE_GLOBALTIMER: "globaltimer"}

# Warp header word indices
W_MAGIC, W_IDS, W_WARP, W_GT0, W_CLK0, W_GT1, W_CLK1, W_COUNTS = range(WARP_HEADER_WORDS)

# Warp header word 2: the warp index (bits 0-15) and the ring field (bits 16-23; bits 24-31 zero)
WARP_INDEX_BITS = 16
RING_SHIFT, RING_BITS = 16, 8
# Shared-memory ring of SegmentRecorder(cursor="ring"): records per warp unless told (1 KB a warp),
# and the most a kernel may hold in static shared memory (the ring is static: 48 KB per CTA)
DEFAULT_RING = 128
STATIC_SMEM_LIMIT = 48 * 1024
MAX_CTA_WARPS = 32


def ring_field(records: int) -> int:
    """Warp header word 2's ring field for a ring of ``records`` (a power of two; 0: none)."""
    return int(records).bit_length() if records else 0


def ring_records(field):
    """Records of the ring a ring field names (0: none). Integers or numpy arrays."""
    return np.where(field > 0, np.left_shift(1, np.maximum(np.asarray(field, np.int64) - 1, 0)), 0)


def check_ring(records) -> int:
    """``records`` as the ring size of a ``cursor="ring"`` recorder, or a one-line ValueError."""
    if isinstance(records, bool) or not isinstance(records, (int, np.integer)) or records < 2 \
            or records & (records - 1) or records > 1 << 12:
        raise ValueError(f"ring must be a power of two from 2 to 4096 (records per warp), got {records!r}")
    return int(records)


def ring_smem_bytes(records: int, warps: int) -> int:
    """Static shared memory a ring recorder takes: ``warps`` rings of ``records`` 8-byte
    records and the warps' cursors (128 B)."""
    return 8 * records * warps + 4 * MAX_CTA_WARPS

# CTA-lifetime region: header word, words per entry, word indices in an entry
G_LIFETIMES = 4
LIFETIME_WORDS = 2
LIFE_START_NOT, LIFE_END = 0, 1
# CTAs a buffer made by BufferSpec.for_grid times unless told (256 KiB of the buffer)
DEFAULT_LIFETIME_CTAS = 16384


def record_tag(event_id: int, kind: int) -> int:
    """The constant upper bits of a record without payload (folded at compile time)."""
    if not 0 <= event_id < (1 << EVENT_BITS):
        raise ValueError(f"event id {event_id} does not fit in {EVENT_BITS} bits")
    if kind not in (KIND_BEGIN, KIND_END, KIND_INSTANT):
        raise ValueError(f"bad record kind {kind}")
    return (event_id << EVENT_SHIFT) | (kind << KIND_SHIFT)


def pack_record(timer_lo: int, event_id: int, kind: int, payload: int | None) -> int:
    """Host-side twin of the device encoder (used by tests and synthetic traces)."""
    p = PAYLOAD_NONE if payload is None or payload < 0 else min(int(payload), PAYLOAD_MAX)
    return (int(timer_lo) & 0xFFFFFFFF) | record_tag(event_id, kind) | (p << PAYLOAD_SHIFT)


@dataclass(frozen=True)
class BufferSpec:
    """Shape of a trace buffer: which CTAs record and how many events each warp may keep."""

    warps_per_cta: int
    n_cta_slots: int
    capacity: int  # records per warp
    cta_first: int = 0
    cta_stride: int = 1
    warp_mask: int = 0  # bit w: warp w records; 0: warps 0..warps_per_cta-1
    lifetime_ctas: int = 0  # CTAs 0..lifetime_ctas-1 get a lifetime entry (0: no region)

    def __post_init__(self):
        for name in ("warps_per_cta", "n_cta_slots", "capacity", "cta_stride"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.cta_first < 0:
            raise ValueError(f"cta_first must be >= 0, got {self.cta_first}")
        if not 0 <= self.warp_mask < 1 << 32:
            raise ValueError(f"warp_mask must fit in 32 bits, got {self.warp_mask:#x}")
        if self.warp_mask and self.warp_mask.bit_count() != self.warps_per_cta:
            raise ValueError(f"warp_mask {self.warp_mask:#x} selects {self.warp_mask.bit_count()} warps, "
                             f"warps_per_cta says {self.warps_per_cta}")
        if not 0 <= self.lifetime_ctas < 1 << 31:
            raise ValueError(f"lifetime_ctas must be 0..2**31-1, got {self.lifetime_ctas}")
        if self.slot_words >= 1 << 32 or self.n_cta_slots >= 1 << 32:
            raise ValueError("trace buffer too large")
        if self.lifetime_ctas and self.words >= 1 << 31:  # the device indexes the region's words with Int32
            raise ValueError(f"trace buffer of {self.words} words is too large: the device indexes it with 32-bit "
                             "integers (under 2**31 words, 16 GiB); record fewer CTAs or warps, or a smaller capacity")

    @classmethod
    def for_grid(cls, n_ctas: int, warps_per_cta: int, capacity: int, *,
                 cta_first: int = 0, cta_stride: int = 1, max_ctas: int | None = None,
                 warps=None, lifetime_ctas: int = DEFAULT_LIFETIME_CTAS) -> "BufferSpec":
        """Slots for CTAs first, first+stride, ... < n_ctas (at most max_ctas of them), and in
        each for every warp of the CTA (``warps_per_cta`` of them) or only the ``warps`` listed;
        a lifetime entry for CTAs 0..``lifetime_ctas``-1 (module doc; 0: none)."""
        n = max(0, (n_ctas - cta_first + cta_stride - 1) // cta_stride)
        if max_ctas is not None:
            n = min(n, max_ctas)
        if n < 1:
            raise ValueError(f"no CTA of the {n_ctas}-CTA grid is selected (first={cta_first}, stride={cta_stride})")
        if warps is None:
            return cls(warps_per_cta, n, capacity, cta_first, cta_stride, lifetime_ctas=lifetime_ctas)
        chosen = sorted({int(w) for w in warps})
        if not chosen or chosen[0] < 0 or chosen[-1] >= min(warps_per_cta, 32):
            raise ValueError(f"warps must be warp indices 0..{min(warps_per_cta, 32) - 1}, got {list(warps)}")
        return cls(len(chosen), n, capacity, cta_first, cta_stride, sum(1 << w for w in chosen), lifetime_ctas)

    @property
    def slot_words(self) -> int:
        return WARP_HEADER_WORDS + self.capacity

    @property
    def recorded_warps(self) -> tuple:
        """Warp index (in its CTA) of each of a CTA's slots."""
        if not self.warp_mask:
            return tuple(range(self.warps_per_cta))
        return tuple(w for w in range(32) if self.warp_mask >> w & 1)

    @property
    def recorded_ctas(self) -> str:
        """The recorded CTAs as a bundle's launch says them: "first:end:stride" (a Python slice
        of the grid, in cluster order)."""
        return f"{self.cta_first}:{self.cta_first + self.n_cta_slots * self.cta_stride}:{self.cta_stride}"

    @property
    def warp_subset(self) -> list | None:
        """The recorded warps when a warp mask picks them (metadata), else None (every warp)."""
        return list(self.recorded_warps) if self.warp_mask else None

    def warp_of_slot(self, slot_in_cta):
        return np.asarray(self.recorded_warps, dtype=np.int64)[np.asarray(slot_in_cta)]

    @property
    def n_slots(self) -> int:
        return self.n_cta_slots * self.warps_per_cta

    @property
    def slots_end(self) -> int:
        """Word index just past the last warp slot (where the lifetime region starts)."""
        return GLOBAL_HEADER_WORDS + self.n_slots * self.slot_words

    @property
    def words(self) -> int:
        return self.slots_end + LIFETIME_WORDS * self.lifetime_ctas

    @property
    def nbytes(self) -> int:
        return 8 * self.words

    def header(self) -> np.ndarray:
        h = np.zeros(GLOBAL_HEADER_WORDS, dtype=np.uint64)
        h[0] = BUF_MAGIC | (FORMAT_VERSION << 32)
        h[1] = self.slot_words | (self.warps_per_cta << 32)
        h[2] = self.cta_first | (self.cta_stride << 32)
        h[3] = self.n_cta_slots | (self.warp_mask << 32)
        h[G_LIFETIMES] = (self.slots_end | (self.lifetime_ctas << 32)) if self.lifetime_ctas else 0
        return h

    def new_buffer(self) -> np.ndarray:
        """A zeroed buffer with its header: copy it to the device before the launch."""
        buf = np.zeros(self.words, dtype=np.uint64)
        buf[:GLOBAL_HEADER_WORDS] = self.header()
        return buf

    def cta_of_slot(self, cta_slot: np.ndarray | int):
        return self.cta_first + np.asarray(cta_slot) * self.cta_stride

    @classmethod
    def from_header(cls, words: np.ndarray) -> "BufferSpec":
        if words.size < GLOBAL_HEADER_WORDS:
            raise TraceFormatError(f"trace buffer has {words.size} words, fewer than its {GLOBAL_HEADER_WORDS}-word header")
        g = words[:GLOBAL_HEADER_WORDS].astype(np.uint64)
        magic, version = int(g[0]) & 0xFFFFFFFF, int(g[0]) >> 32
        if magic != BUF_MAGIC:
            raise TraceFormatError(f"not an fa4trace buffer: header magic 0x{magic:08x}, expected 0x{BUF_MAGIC:08x}")
        if version != FORMAT_VERSION:
            raise TraceFormatError(f"trace buffer format version {version}, this fa4trace reads version {FORMAT_VERSION}")
        slot_words, warps = int(g[1]) & 0xFFFFFFFF, int(g[1]) >> 32
        first, stride = int(g[2]) & 0xFFFFFFFF, int(g[2]) >> 32
        n_cta, mask = int(g[3]) & 0xFFFFFFFF, int(g[3]) >> 32
        life_at, life_n = int(g[G_LIFETIMES]) & 0xFFFFFFFF, int(g[G_LIFETIMES]) >> 32
        if (slot_words <= WARP_HEADER_WORDS or warps < 1 or stride < 1 or n_cta < 1
                or (mask and mask.bit_count() != warps) or life_n >= 1 << 31):
            raise TraceFormatError(
                f"trace buffer header is corrupt (slot_words={slot_words}, warps_per_cta={warps}, "
                f"cta_stride={stride}, n_cta_slots={n_cta}, warp_mask={mask:#x}, lifetime_ctas={life_n})")
        try:
            spec = cls(warps, n_cta, slot_words - WARP_HEADER_WORDS, first, stride, mask, life_n)
        except ValueError as exc:
            raise TraceFormatError(f"trace buffer header is corrupt ({exc})") from None
        if life_at != (spec.slots_end if life_n else 0):
            raise TraceFormatError(f"trace buffer header is corrupt (lifetime region at word {life_at}, "
                                   f"the warp slots end at {spec.slots_end})")
        if words.size < spec.words:
            raise TraceFormatError(
                f"trace buffer is truncated: {words.size} words, its header needs {spec.words}")
        return spec
