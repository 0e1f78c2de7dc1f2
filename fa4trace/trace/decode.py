"""Raw trace buffer -> Arrow events table (vectorized: no Python loop per event).

One launch's buffer decodes to rows of

    launch  cta  sm  warp  role  name  kind  iter  start_ns  end_ns  start_cycles  end_cycles  dropped

where ``kind`` is "span", "instant" or "warp" (one WARP row per warp lifetime), ``iter`` is
the payload (-1 if none), times are ns from the launch's earliest warp start and cycles are
the raw timer values unwrapped to 64 bits (globaltimer ns in the globaltimer timebase).

Cycles become ns per warp with that warp's own Δglobaltimer/Δclock64 (clock64 differs per
SM; the warp's two anchors tie it to the global timer). A warp that lived too few globaltimer
ticks for a precise ratio borrows the median ratio of its SM's long-lived warps (else the
launch's), and the row of that warp says so in the launch summary.

A buffer with a CTA-lifetime region (fa4trace.format.layout) also yields each timed CTA's start and
end (absolute %globaltimer ns) and whether it recorded: ``DecodedLaunch.cta_lifetimes``.

Lost records: a warp whose slot filled lost its newest records (its last spans' ends; those
begins are dropped), a warp with a shared-memory ring (layout: header word 2) lost its oldest
ones (overwritten; the ends whose begins went are dropped). Both count in ``dropped``; the
summary's ``ring`` / ``overwritten`` / ``overwritten_warps`` say which were overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ..format import layout as L
from ..format.errors import TraceFormatError
from ..format.vocab import VOCAB, WARP_EVENT_ID, Vocabulary

U32 = np.uint64(0xFFFFFFFF)
# A warp whose anchors are closer than this many ns (~62 globaltimer ticks on H200) takes a
# borrowed cycles->ns ratio: its own would be off by more than ~3%.
MIN_RATIO_SPAN_NS = 2000

KINDS = ("span", "instant", "warp")

SCHEMA = pa.schema([
    ("launch", pa.int16()),
    ("cta", pa.int32()),
    ("sm", pa.int16()),
    ("warp", pa.int16()),
    ("role", pa.dictionary(pa.int16(), pa.string())),
    ("name", pa.dictionary(pa.int16(), pa.string())),
    ("kind", pa.dictionary(pa.int8(), pa.string())),
    ("iter", pa.int32()),
    ("start_ns", pa.int64()),
    ("end_ns", pa.int64()),
    ("start_cycles", pa.int64()),
    ("end_cycles", pa.int64()),
    ("dropped", pa.int32()),
])


@dataclass
class DecodedLaunch:
    """One launch's events plus what the decoder learned about it."""

    table: pa.Table
    t0_globaltimer_ns: int  # absolute %globaltimer of the earliest warp start (rebase point)
    summary: dict = field(default_factory=dict)
    # CTAs the lifetime region timed: {"cta", "start_gt", "end_gt" (absolute ns), "recorded"}
    # (numpy arrays, by CTA index); None where the buffer has no region or nothing wrote it
    cta_lifetimes: dict | None = None


def _selected_by(h: np.ndarray, cta: np.ndarray, slot: np.ndarray, spec: L.BufferSpec):
    """(the index each warp's CTA was selected by, whether that index belongs in its slot).

    The recorder takes CTAs in cluster order and steps over whole clusters (layout: warp
    header word 2 holds the order index and the cluster size); a buffer from before that
    holds neither, and its slots follow the linear CTA index."""
    w2 = h[:, L.W_WARP]
    order = ((w2 >> np.uint64(32)) & np.uint64(0xFFFFFF)).astype(np.int64) - 1
    size = np.maximum((w2 >> np.uint64(56)).astype(np.int64), 1)
    rel = order - spec.cta_first
    group = np.floor_divide(rel, size)
    by_cluster = (rel >= 0) & (group % spec.cta_stride == 0) & (
        (group // spec.cta_stride) * size + rel % size == slot)
    legacy = order < 0
    selected = np.where(legacy, cta, order)
    ok = np.where(legacy, cta == spec.cta_of_slot(slot), by_cluster)
    return selected, ok


def _warp_name(slot: int, spec: L.BufferSpec) -> str:
    cta = int(spec.cta_of_slot(slot // spec.warps_per_cta))
    return f"warp slot {slot} (CTA {cta}, warp {int(spec.warp_of_slot(slot % spec.warps_per_cta))})"


def decode_buffer(buffer, *, launch_index: int = 0, vocab: Vocabulary = VOCAB,
                  grid_ctas: int | None = None) -> DecodedLaunch:
    """Decode one launch's buffer (numpy array or bytes, 64-bit words).

    Raises TraceFormatError naming the warp and record when the bytes are not a consistent
    fa4trace buffer (wrong magic or version, truncated, unmatched begin/end, foreign bytes).
    The phases run in this order so that the first inconsistency found is the one reported.
    """
    words = _as_words(buffer)
    spec = L.BufferSpec.from_header(words)
    names = vocab.event_names()
    warps = _headers(words, spec, grid_ctas)
    recs = _records(words, spec, warps, names)
    if recs.is_anc.any():
        _check_anchor_pairs(recs, warps, spec)
    times = _times(recs, warps, spec)
    spans = _spans(recs, warps, spec, names)
    table = _rows(recs, warps, times, spans, launch_index, vocab.role_names(), names)
    lifetimes = decode_lifetimes(words, spec, np.unique(warps.cta), grid_ctas)
    summary = _summary(launch_index, spec, warps, recs, times, spans, lifetimes)
    return DecodedLaunch(table, times.t0, summary, lifetimes)


@dataclass
class _Warps:
    """The recorded warps' header fields, one entry per present slot (in slot order)."""

    idx: np.ndarray  # slot index
    timebase: int  # layout.TIMEBASE_* (one per launch)
    role_id: np.ndarray
    sm: np.ndarray
    cta: np.ndarray
    warp: np.ndarray
    gt0: np.ndarray  # start and end anchors: %globaltimer ns and clock64 cycles
    clk0: np.ndarray
    gt1: np.ndarray
    clk1: np.ndarray
    written: np.ndarray  # records kept in the slot
    dropped: np.ndarray  # records lost: to a full slot (the newest), or overwritten in a ring (the oldest)
    ring: np.ndarray  # records of the warp's shared-memory ring, 0: none

    @property
    def lost_oldest(self) -> np.ndarray:
        """Warps whose ring overwrote records: their first kept record is not their first."""
        return (self.ring > 0) & (self.dropped > 0)


@dataclass
class _Records:
    """Every kept record of the present warps, concatenated in (warp, record) order."""

    owner: np.ndarray  # index into the _Warps arrays
    pos: np.ndarray  # record index within its warp (for messages)
    first: np.ndarray  # per warp: global index of its first record
    rec: np.ndarray  # the raw 64-bit words
    lo: np.ndarray  # low 32 bits of the timer
    ev: np.ndarray
    kind: np.ndarray
    payload: np.ndarray
    is_anc: np.ndarray  # anchor records (Recorder.anchor), and which half of a pair each is
    anc_gt: np.ndarray
    anc_clk: np.ndarray


@dataclass
class _Times:
    """Record times: raw timer unwrapped to 64 bits, and ns from the launch's earliest warp start."""

    full: np.ndarray
    ns: np.ndarray
    t0: int  # absolute %globaltimer of the earliest warp start
    ratio: np.ndarray  # per-warp ns/cycle (NaN in the globaltimer timebase)
    borrowed: np.ndarray  # per warp: the ratio is its SM's or the launch's, not its own


@dataclass
class _Spans:
    """Record indices of matched begins and ends (pairwise) and of instants."""

    bi: np.ndarray
    ei: np.ndarray
    ii: np.ndarray
    truncated: int  # begins or ends dropped because their warp lost the other end (a full slot, a ring)


def _headers(words: np.ndarray, spec: L.BufferSpec, grid_ctas: int | None) -> _Warps:
    """Read and check the header of every recorded warp slot (empty slots are skipped).

    Every field a later phase trusts (magic, version, timebase, identity, anchors, counts) is
    checked here, so that foreign or half-written bytes fail with the slot's name."""
    slots = words[L.GLOBAL_HEADER_WORDS:spec.slots_end].reshape(spec.n_slots, spec.slot_words)
    hdr = slots[:, :L.WARP_HEADER_WORDS]
    idx = _present_slots(hdr, spec)
    h = hdr[idx]
    version = (h[:, L.W_MAGIC] >> np.uint64(32)) & np.uint64(0xFF)
    timebase = (h[:, L.W_MAGIC] >> np.uint64(40)) & np.uint64(0xFF)
    role_id = (h[:, L.W_MAGIC] >> np.uint64(48)).astype(np.int64)
    for arr, what, ok in ((version, "format version", version == L.FORMAT_VERSION),
                          (timebase, "timebase", np.isin(timebase, list(L.TIMEBASE_NAMES)))):
        if not ok.all():
            j = int(np.flatnonzero(~ok)[0])
            raise TraceFormatError(f"{_warp_name(int(idx[j]), spec)}: unsupported {what} {int(arr[j])}")
    if np.unique(timebase).size != 1:
        raise TraceFormatError("warps of one launch use different timebases")

    sm = (h[:, L.W_IDS] & U32).astype(np.int64)
    cta = (h[:, L.W_IDS] >> np.uint64(32)).astype(np.int64)
    w2 = h[:, L.W_WARP]
    warp = (w2 & np.uint64((1 << L.WARP_INDEX_BITS) - 1)).astype(np.int64)
    ring_f = ((w2 >> np.uint64(L.RING_SHIFT)) & np.uint64(0xFFFF)).astype(np.int64)  # bits 16-31: the field, then zero
    selected, slot_ok = _selected_by(h, cta, idx // spec.warps_per_cta, spec)
    exp_warp = spec.warp_of_slot(idx % spec.warps_per_cta)
    wrong = ~slot_ok | (warp != exp_warp) | (ring_f > 31)
    if grid_ctas is not None:
        wrong |= cta >= grid_ctas
    if wrong.any():
        j = int(np.flatnonzero(wrong)[0])
        raise TraceFormatError(f"{_warp_name(int(idx[j]), spec)}: header says CTA {selected[j]} (in cluster order), "
                               f"warp {warp[j]}: foreign or corrupted bytes")

    gt0, clk0 = h[:, L.W_GT0].astype(np.int64), h[:, L.W_CLK0].astype(np.int64)
    gt1, clk1 = h[:, L.W_GT1].astype(np.int64), h[:, L.W_CLK1].astype(np.int64)
    unfinished = (gt1 == 0) & (clk1 == 0) & (h[:, L.W_COUNTS] == 0)
    if unfinished.any():
        j = int(np.flatnonzero(unfinished)[0])
        raise TraceFormatError(f"{_warp_name(int(idx[j]), spec)}: started but never finished "
                               "(the kernel did not reach Recorder.finish(), or the buffer was read too early)")
    if ((gt1 < gt0) | (clk1 < clk0)).any():
        j = int(np.flatnonzero((gt1 < gt0) | (clk1 < clk0))[0])
        raise TraceFormatError(f"{_warp_name(int(idx[j]), spec)}: end anchors precede start anchors")
    written = (h[:, L.W_COUNTS] & U32).astype(np.int64)
    dropped = (h[:, L.W_COUNTS] >> np.uint64(32)).astype(np.int64)
    ring = L.ring_records(ring_f).astype(np.int64)
    if (written > spec.capacity).any() or (dropped >= 1 << 31).any():
        j = int(np.flatnonzero((written > spec.capacity) | (dropped >= 1 << 31))[0])
        raise TraceFormatError(f"{_warp_name(int(idx[j]), spec)}: {written[j]} records written, slot holds {spec.capacity}")
    over = (ring > 0) & (written > ring)
    if over.any():
        j = int(np.flatnonzero(over)[0])
        raise TraceFormatError(f"{_warp_name(int(idx[j]), spec)}: {written[j]} records written from a ring of {ring[j]}")
    return _Warps(idx, int(timebase[0]), role_id, sm, cta, warp, gt0, clk0, gt1, clk1, written, dropped, ring)


def _present_slots(hdr: np.ndarray, spec: L.BufferSpec) -> np.ndarray:
    """Indices of the slots a warp wrote (warp magic); a zero header is a slot no warp took.
    Anything else is not an fa4trace warp header; no slot written is a launch that never ran."""
    w0 = hdr[:, L.W_MAGIC]
    magic = w0 & U32
    present = magic == L.WARP_MAGIC
    bad = ~(present | (w0 == 0))
    if bad.any():
        s = int(np.flatnonzero(bad)[0])
        raise TraceFormatError(f"{_warp_name(s, spec)}: header magic 0x{int(magic[s]):08x} is not an fa4trace warp header")
    idx = np.flatnonzero(present)
    if idx.size == 0:
        raise TraceFormatError("trace buffer holds no recorded warp (was the kernel launched with this buffer?)")
    return idx


def _records(words: np.ndarray, spec: L.BufferSpec, warps: _Warps, names) -> _Records:
    """Gather the written part of every present slot (one vectorized take) and split each
    record into its fields; a record with reserved bits, a bad kind or an event the
    vocabulary does not know is foreign bytes and fails here, naming warp and record."""
    n_w = warps.idx.size
    counts = warps.written
    total = int(counts.sum())
    first = np.cumsum(counts) - counts  # first record (global index) of each warp
    owner = np.repeat(np.arange(n_w, dtype=np.int64), counts)
    slot_base = L.GLOBAL_HEADER_WORDS + warps.idx.astype(np.int64) * spec.slot_words + L.WARP_HEADER_WORDS
    lin = np.arange(total, dtype=np.int64) + np.repeat(slot_base - first, counts)
    pos = lin - np.repeat(slot_base, counts)
    rec = words.take(lin)

    halves = rec.view(np.uint32).reshape(-1, 2)  # little-endian: [timer lo, tag word]
    lo = halves[:, 0].astype(np.int64)
    hi = halves[:, 1]
    ev = (hi & 0xFF).astype(np.int64)
    kind = ((hi >> 8) & 3).astype(np.int8)
    reserved = (hi >> 10) & 3
    payload = (hi >> 12).astype(np.int64)
    known = np.array([bool(n) for n in names])
    badrec = (reserved != 0) | (kind == 3) | ~known[ev] | (ev == WARP_EVENT_ID)
    if badrec.any():
        r = int(np.flatnonzero(badrec)[0])
        why = ("reserved bits set" if reserved[r] else "bad kind" if kind[r] == 3
               else f"unknown event id {ev[r]}")
        raise TraceFormatError(f"{_warp_name(int(warps.idx[owner[r]]), spec)}, record {pos[r]}: {why} "
                               f"(word 0x{int(rec[r]):016x})")
    # anchor pairs (Recorder.anchor): clock64 then globaltimer low words
    is_anc = ev == L.ANCHOR_EVENT_ID
    return _Records(owner, pos, first, rec, lo, ev, kind, payload, is_anc,
                    is_anc & (payload == L.ANCHOR_GLOBALTIMER), is_anc & (payload == L.ANCHOR_CLOCK))


def _times(recs: _Records, warps: _Warps, spec: L.BufferSpec) -> _Times:
    """Unwrap the 32-bit record times against each warp's 64-bit start anchor, then turn
    cycles into ns per warp (its own anchors' ratio, piecewise through its anchor pairs).

    A time past the warp's end anchor is foreign bytes or a wrapped timer: an error."""
    w, counts = warps, warps.written
    clock = w.timebase == L.TIMEBASE_CLOCK64
    anchor0, anchor1 = (w.clk0, w.clk1) if clock else (w.gt0, w.gt1)
    n_w = w.idx.size
    full = np.empty(recs.owner.size, np.int64)
    anc_gt = recs.anc_gt
    timer = ~anc_gt  # records on the warp's own timer (globaltimer anchor words are not)
    full[timer] = _unwrap(recs.lo[timer], recs.owner[timer], n_w, anchor0)
    full[anc_gt] = _unwrap(recs.lo[anc_gt], recs.owner[anc_gt], n_w, w.gt0)
    if w.lost_oldest.any():
        _unwrap_from_end(full, recs.owner, timer, w.lost_oldest, anchor1)
    late = np.where(anc_gt, full > np.repeat(w.gt1, counts), full > np.repeat(anchor1, counts))
    if late.any():
        r = int(np.flatnonzero(late)[0])
        raise TraceFormatError(f"{_warp_name(int(w.idx[recs.owner[r]]), spec)}, record {recs.pos[r]}: "
                               "time lies after the warp finished (foreign bytes or a wrapped timer)")

    if clock:
        ratio, borrowed = _ns_per_cycle(w.gt0, w.gt1, w.clk0, w.clk1, w.sm)
        cycles = full - np.repeat(w.clk0, counts)
        ns_abs = np.repeat(w.gt0, counts) + np.rint(cycles * np.repeat(ratio, counts)).astype(np.int64)
        if recs.anc_clk.any():
            _interpolate_between_anchors(ns_abs, full, recs.owner, recs.anc_clk, anc_gt, w.gt0, w.gt1, w.clk0, w.clk1)
    else:
        ratio, borrowed = np.full(n_w, np.nan), np.zeros(n_w, bool)
        ns_abs = full
    t0 = int(w.gt0.min())
    return _Times(full, ns_abs - t0, t0, ratio, borrowed)


def _spans(recs: _Records, warps: _Warps, spec: L.BufferSpec, names) -> _Spans:
    """Pair begins with ends by (warp, event, payload), in record order: the n-th begin of a
    key with its n-th end. Unequal counts are allowed only where the warp overflowed; an end
    before its begin is an error."""
    key = (recs.owner.astype(np.int64) << 28) | (recs.ev << 20) | recs.payload
    kind = recs.kind
    is_b, is_e, is_i = kind == L.KIND_BEGIN, kind == L.KIND_END, (kind == L.KIND_INSTANT) & ~recs.is_anc
    bi, ei = np.flatnonzero(is_b), np.flatnonzero(is_e)
    bi = bi[np.argsort(key[bi], kind="stable")]
    ei = ei[np.argsort(key[ei], kind="stable")]
    truncated = 0
    if bi.size != ei.size or not np.array_equal(key[bi], key[ei]):
        bi, ei, truncated = _match_with_overflow(bi, ei, key, recs.owner, recs.pos, warps, spec)
    backwards = ei < bi
    if backwards.any():
        j = int(np.flatnonzero(backwards)[0])
        r = int(ei[j])
        raise TraceFormatError(f"{_warp_name(int(warps.idx[recs.owner[r]]), spec)}, record {recs.pos[r]}: "
                               f"end of {names[recs.ev[r]]} before its begin")
    return _Spans(bi, ei, np.flatnonzero(is_i), truncated)


def _rows(recs: _Records, warps: _Warps, times: _Times, spans: _Spans, launch_index: int,
          role_names: dict, names) -> pa.Table:
    """The events table: one row per span and instant, plus one WARP row per warp lifetime.

    Rows are ordered by (warp, begin record): records of a warp are in time order, so this
    is (cta, warp, start) order with outer spans before the spans they contain. A WARP row
    goes before its warp's events. Positions are unique, so a scatter replaces a sort."""
    w, t, bi, ii = warps, times, spans.bi, spans.ii
    owner = recs.owner
    n_w = w.idx.size
    bi_or_i = np.concatenate([bi, ii])
    n_rows = bi_or_i.size + n_w
    out_pos = np.empty(n_rows, np.int64)
    out_pos[:bi_or_i.size] = bi_or_i + owner[bi_or_i] + 1
    out_pos[bi_or_i.size:] = recs.first + np.arange(n_w)
    slots_used = np.full(owner.size + n_w, -1, np.int64)
    slots_used[out_pos] = np.arange(n_rows)
    order = slots_used[slots_used >= 0]

    end_idx = np.concatenate([spans.ei, ii])
    row_owner = np.concatenate([owner[bi_or_i], np.arange(n_w)])[order]
    r_start_ns = np.concatenate([t.ns[bi_or_i], w.gt0 - t.t0])[order]
    r_end_ns = np.concatenate([t.ns[end_idx], w.gt1 - t.t0])[order]
    r_start_c = np.concatenate([t.full[bi_or_i], w.clk0])[order]
    r_end_c = np.concatenate([t.full[end_idx], w.clk1])[order]
    r_ev = np.concatenate([recs.ev[bi_or_i], np.full(n_w, WARP_EVENT_ID)])[order]
    r_iter = np.concatenate([recs.payload[bi_or_i], np.full(n_w, L.PAYLOAD_NONE)])[order]
    r_iter = np.where(r_iter == L.PAYLOAD_NONE, -1, r_iter).astype(np.int32)
    r_kind = np.concatenate([np.zeros(bi.size, np.int8), np.ones(ii.size, np.int8),
                             np.full(n_w, 2, np.int8)])[order]
    r_dropped = np.concatenate([np.zeros(bi_or_i.size, np.int32), w.dropped.astype(np.int32)])[order]

    uniq_roles, role_codes = np.unique(w.role_id, return_inverse=True)
    role_dict = [role_names.get(int(r), f"role{int(r)}") for r in uniq_roles]
    used_ev = np.flatnonzero(np.bincount(r_ev, minlength=256))
    ev_code_of = np.zeros(256, np.int16)
    ev_code_of[used_ev] = np.arange(used_ev.size)

    return pa.table({
        "launch": pa.array(np.full(n_rows, launch_index, np.int16)),
        "cta": pa.array(w.cta[row_owner].astype(np.int32)),
        "sm": pa.array(w.sm[row_owner].astype(np.int16)),
        "warp": pa.array(w.warp[row_owner].astype(np.int16)),
        "role": pa.DictionaryArray.from_arrays(pa.array(role_codes[row_owner].astype(np.int16)), pa.array(role_dict)),
        "name": pa.DictionaryArray.from_arrays(pa.array(ev_code_of[r_ev]), pa.array([names[e] for e in used_ev])),
        "kind": pa.DictionaryArray.from_arrays(pa.array(r_kind), pa.array(list(KINDS))),
        "iter": pa.array(r_iter),
        "start_ns": pa.array(r_start_ns),
        "end_ns": pa.array(r_end_ns),
        "start_cycles": pa.array(r_start_c),
        "end_cycles": pa.array(r_end_c),
        "dropped": pa.array(r_dropped),
    }, schema=SCHEMA)


def _summary(launch_index: int, spec: L.BufferSpec, warps: _Warps, recs: _Records, times: _Times,
             spans: _Spans, lifetimes: dict | None) -> dict:
    """What the decoder learned about the launch (DecodedLaunch.summary): the buffer's shape,
    losses (dropped records, truncated spans), the clock and the CTA lifetimes' coverage."""
    w, ratio = warps, times.ratio
    valid = ~np.isnan(ratio)
    summary = {
        "launch": launch_index,
        "timebase": L.TIMEBASE_NAMES[w.timebase],
        "warps_recorded": int(w.idx.size),
        "ctas_recorded": int(np.unique(w.cta).size),
        "warps_per_cta": spec.warps_per_cta,
        "warp_subset": spec.warp_subset,
        "capacity": spec.capacity,
        "cta_first": spec.cta_first,
        "cta_stride": spec.cta_stride,
        "records": int(recs.owner.size),
        "dropped": int(w.dropped.sum()),
        "overflowed_warps": int((w.dropped > 0).sum()),
        "truncated_spans": int(spans.truncated),
        "anchors": int(recs.anc_gt.sum()),
        "borrowed_clock_ratio_warps": int(times.borrowed.sum()),
        "clock_ghz_median": float(np.median(1.0 / ratio[valid])) if valid.any() else None,
        "span_ns": int(w.gt1.max() - times.t0),
    }
    rings = w.ring > 0
    if rings.any():  # records kept in shared-memory rings: the ones lost are the oldest
        summary.update(ring=int(w.ring[rings].max()), ring_warps=int(rings.sum()),
                       overwritten=int(w.dropped[rings].sum()), overwritten_warps=int(w.lost_oldest.sum()))
    summary["ctas_timed"] = 0 if lifetimes is None else int(lifetimes["cta"].size)
    if lifetimes is not None:
        summary["ctas_outside_lifetime"] = _outside_lifetime(lifetimes, w.cta, w.gt0, w.gt1)
    return summary


def _outside_lifetime(lifetimes: dict, cta, gt0, gt1) -> int:
    """Recorded CTAs with a warp whose anchors lie outside the CTA's lifetime entry. The stamps
    wrap each warp's anchors in program order on one global timer, so this is 0 unless the
    device code or the bytes are wrong (the GPU tests assert 0)."""
    pos = np.searchsorted(lifetimes["cta"], cta)
    pos = np.minimum(pos, lifetimes["cta"].size - 1)
    timed = lifetimes["cta"][pos] == cta
    out = timed & ((gt0 < lifetimes["start_gt"][pos]) | (gt1 > lifetimes["end_gt"][pos]))
    return int(np.unique(cta[out]).size)


def decode_lifetimes(words: np.ndarray, spec: L.BufferSpec, recorded_ctas: np.ndarray,
                     grid_ctas: int | None = None) -> dict | None:
    """The CTA-lifetime region (fa4trace.format.layout) as numpy arrays by CTA index: ``cta``,
    ``start_gt`` / ``end_gt`` (absolute %globaltimer ns) and ``recorded`` (the CTA is one of
    ``recorded_ctas``, those with warp slots). Entries never written (CTAs beyond the grid, or
    a build that does not stamp) are left out; None when none was written. An entry with only
    one of its two stamps, an end before its start or a timed CTA beyond ``grid_ctas`` is a
    TraceFormatError (foreign bytes, or a buffer read before the kernel finished)."""
    if not spec.lifetime_ctas:
        return None
    region = words[spec.slots_end:spec.words].reshape(spec.lifetime_ctas, L.LIFETIME_WORDS)
    start_not, end = region[:, L.LIFE_START_NOT], region[:, L.LIFE_END]
    has_start, has_end = start_not != 0, end != 0
    if (has_start != has_end).any():
        c = int(np.flatnonzero(has_start != has_end)[0])
        which = "a start but no end" if has_start[c] else "an end but no start"
        raise TraceFormatError(f"CTA {c}'s lifetime entry has {which} (the kernel did not finish, "
                               "or the buffer was read too early)")
    ctas = np.flatnonzero(has_start)
    if ctas.size == 0:
        return None
    start = (~start_not[ctas]).astype(np.int64)
    stop = end[ctas].astype(np.int64)
    bad = (stop < start) | (start <= 0)
    if grid_ctas is not None:
        bad |= ctas >= grid_ctas
    if bad.any():
        c = int(ctas[np.flatnonzero(bad)[0]])
        raise TraceFormatError(f"CTA {c}'s lifetime entry is not a lifetime (start {int(~start_not[c])}, "
                               f"end {int(end[c])}): foreign or corrupted bytes")
    return {"cta": ctas.astype(np.int64), "start_gt": start, "end_gt": stop,
            "recorded": np.isin(ctas, recorded_ctas)}


def _as_words(buffer) -> np.ndarray:
    if isinstance(buffer, (bytes, bytearray, memoryview)):
        b = bytes(buffer)
        if len(b) % 8:
            raise TraceFormatError(f"trace buffer is {len(b)} bytes, not a whole number of 64-bit words")
        return np.frombuffer(b, dtype="<u8")
    arr = np.asarray(buffer)
    if arr.dtype.itemsize != 8 or arr.dtype.kind not in "iu":
        raise TraceFormatError(f"trace buffer must hold 64-bit integers, got {arr.dtype}")
    return arr.reshape(-1).view(np.uint64)


def _unwrap(lo, owner, n_w, anchor0):
    """Full 64-bit times from 32-bit low words, per warp, against its 64-bit start anchor.

    Records of a warp come in time order, so each step is the low-word difference mod 2**32
    (correct while consecutive records are < 2**32 ticks apart: ~2.2 s of clock64).
    """
    counts = np.bincount(owner, minlength=n_w) if owner.size else np.zeros(n_w, np.int64)
    if lo.size == 0:
        return np.zeros(0, np.int64)
    first = np.cumsum(counts) - counts
    nz = counts > 0
    prev = np.empty(lo.size, np.int64)
    prev[1:] = lo[:-1]
    prev[first[nz]] = anchor0[nz] & 0xFFFFFFFF
    step = (lo - prev) & 0xFFFFFFFF
    csum = np.cumsum(step)
    seg_base = np.repeat(csum[first[nz]] - step[first[nz]], counts[nz])
    return np.repeat(anchor0, counts) + (csum - seg_base)


def _unwrap_from_end(full, owner, timer, lost_oldest, anchor1) -> None:
    """Warps whose ring overwrote records: their first kept record may lie more than one
    32-bit wrap after the start anchor (~2.2 s of clock64), so their times are moved by whole
    wraps until the last lies within one wrap before the end anchor (the ring keeps the end)."""
    rows = np.flatnonzero(timer & lost_oldest[owner])
    if rows.size == 0:
        return
    own = owner[rows]
    last = np.full(lost_oldest.size, -1, np.int64)
    np.maximum.at(last, own, rows)  # each warp's last record
    gap = anchor1[own] - full[last[own]]
    full[rows] += np.where(gap > 0, gap >> 32, 0) << 32


def _check_anchor_pairs(recs: _Records, warps: _Warps, spec: L.BufferSpec) -> None:
    """Anchor records come as (clock, globaltimer) pairs, back to back in one warp, and only
    in the clock64 timebase (they tie its cycles to the global timer)."""
    anc_clk, anc_gt, is_anc, owner, pos = recs.anc_clk, recs.anc_gt, recs.is_anc, recs.owner, recs.pos
    counts, dropped, idx, tb = warps.written, warps.dropped, warps.idx, warps.timebase
    bad = None
    if tb != L.TIMEBASE_CLOCK64:
        bad = int(np.flatnonzero(is_anc)[0]), "anchor record in a globaltimer-timebase warp"
    elif (is_anc & ~(anc_clk | anc_gt)).any():
        bad = int(np.flatnonzero(is_anc & ~(anc_clk | anc_gt))[0]), "anchor record with an unknown payload"
    else:
        c = np.flatnonzero(anc_clk)
        nxt = np.minimum(c + 1, anc_gt.size - 1)
        ok = (c + 1 < anc_gt.size) & anc_gt[nxt] & (owner[nxt] == owner[c])
        # The last kept record of an overflowed warp may be a clock anchor whose partner was dropped.
        cut = (pos[c] == counts[owner[c]] - 1) & (dropped[owner[c]] > 0) & (warps.ring[owner[c]] == 0)
        if not (ok | cut).all():
            bad = int(c[~(ok | cut)][0]), "clock anchor without its globaltimer partner"
        else:
            g = np.flatnonzero(anc_gt)
            prv = np.maximum(g - 1, 0)
            # The first kept record of a ring that overwrote may be a globaltimer anchor whose partner went.
            ok = (anc_clk[prv] & (g > 0) & (owner[prv] == owner[g])) | ((pos[g] == 0) & warps.lost_oldest[owner[g]])
            if not ok.all():
                bad = int(g[~ok][0]), "globaltimer anchor without its clock partner"
    if bad is not None:
        r, why = bad
        raise TraceFormatError(f"{_warp_name(int(idx[owner[r]]), spec)}, record {pos[r]}: {why}")


def _interpolate_between_anchors(ns_abs, full, owner, anc_clk, anc_gt, gt0, gt1, clk0, clk1):
    """Piecewise-linear cycles -> ns through (start, anchors..., finish) for warps with anchors."""
    c = np.flatnonzero(anc_clk)
    g = c + 1
    keep = g < anc_gt.size
    c, g = c[keep], g[keep]
    keep = anc_gt[g]
    c, g = c[keep], g[keep]
    for w in np.unique(owner[c]):
        mine = owner[c] == w
        # Relative to the start anchors: absolute globaltimer ns (~1.8e18) would lose ~256 ns
        # of precision as float64.
        kc = (np.concatenate([[clk0[w]], full[c[mine]], [clk1[w]]]) - clk0[w]).astype(np.float64)
        kg = (np.concatenate([[gt0[w]], full[g[mine]], [gt1[w]]]) - gt0[w]).astype(np.float64)
        recs = np.flatnonzero((owner == w) & ~anc_gt)
        rel = np.interp((full[recs] - clk0[w]).astype(np.float64), kc, kg)
        ns_abs[recs] = gt0[w] + np.rint(rel).astype(np.int64)


def _ns_per_cycle(gt0, gt1, clk0, clk1, sm):
    """Per-warp ns/cycle; short-lived warps borrow their SM's (else the launch's) median."""
    dgt = (gt1 - gt0).astype(np.float64)
    dclk = (clk1 - clk0).astype(np.float64)
    good = (dgt >= MIN_RATIO_SPAN_NS) & (dclk > 0)
    ratio = np.full(dgt.size, np.nan)
    ratio[good] = dgt[good] / dclk[good]
    borrowed = ~good
    if borrowed.any():
        if good.any():
            launch_median = float(np.median(ratio[good]))
        else:
            # No warp lived long enough: the best estimate left is the whole launch's span.
            tot_clk = float(dclk.sum())
            launch_median = float(dgt.sum() / tot_clk) if tot_clk > 0 else 0.5
        for s in np.unique(sm[borrowed]):
            on_sm = sm == s
            ref = ratio[on_sm & good]
            ratio[on_sm & borrowed] = float(np.median(ref)) if ref.size else launch_median
    return ratio, borrowed


def _match_with_overflow(bi, ei, key, owner, pos, warps: _Warps, spec):
    """Slow path: some (warp, event, payload) has unequal begins and ends.

    Allowed only where the warp lost records: a full slot lost its newest (its last begins
    lost their ends: those begins are dropped), a ring its oldest (its first ends lost their
    begins: those ends are dropped); either is counted. Anything else is a format error.
    """
    idx = warps.idx
    newest = (warps.dropped > 0) & (warps.ring == 0)
    oldest = warps.lost_oldest
    kb, cb = np.unique(key[bi], return_counts=True)
    ke, ce = np.unique(key[ei], return_counts=True)
    allk = np.union1d(kb, ke)
    nb = np.zeros(allk.size, np.int64)
    ne = np.zeros(allk.size, np.int64)
    nb[np.searchsorted(allk, kb)] = cb
    ne[np.searchsorted(allk, ke)] = ce
    mism = np.flatnonzero(nb != ne)
    warp_of_key = (allk >> 28)
    for j in mism:
        w = int(warp_of_key[j])
        if (nb[j] > ne[j] and newest[w]) or (ne[j] > nb[j] and oldest[w]):
            continue
        members = bi[key[bi] == allk[j]] if nb[j] > ne[j] else ei[key[ei] == allk[j]]
        r = int(members[-1] if nb[j] > ne[j] else members[0])
        what = "begin without end" if nb[j] > ne[j] else "end without begin"
        raise TraceFormatError(f"{_warp_name(int(idx[owner[r]]), spec)}, record {pos[r]}: {what}")
    # Keep, per key, the first min(nb, ne) begins and the first min(nb, ne) ends, or where a
    # ring lost the oldest records the last ends (record order is preserved).
    keep_n = np.minimum(nb, ne)
    skip_e = np.where(oldest[warp_of_key], ne - keep_n, 0)
    rank_b = _rank_in_group(key[bi])
    rank_e = _rank_in_group(key[ei])
    kb_all = np.searchsorted(allk, key[bi])
    ke_all = np.searchsorted(allk, key[ei])
    bi2 = bi[rank_b < keep_n[kb_all]]
    ei2 = ei[(rank_e >= skip_e[ke_all]) & (rank_e < skip_e[ke_all] + keep_n[ke_all])]
    return bi2, ei2, int(bi.size - bi2.size + ei.size - ei2.size)


def _rank_in_group(sorted_keys: np.ndarray) -> np.ndarray:
    """0,1,2.. within runs of equal keys (input sorted by key)."""
    n = sorted_keys.size
    if n == 0:
        return np.zeros(0, np.int64)
    starts = np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]
    first = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    return np.arange(n) - first
