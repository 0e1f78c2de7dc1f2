"""Per-warp recorder for code the recorder cannot be carried through: fa4trace.instrument's events.

``SegmentRecorder`` (class doc) keeps its cursor in memory instead of registers, so hooks placed
in someone else's kernel (upstream FlashAttention-4, quack, a user's kernel, unedited) record
from inside loops and dynamic ``if``s that carry only the kernel's own state. Its records,
buffer layout and warp header are ``Recorder``'s (``recorder.py``); the slot claim, the stores
and the anchors are shared with it (``slot``, ``store``, ``clock``).
"""

from __future__ import annotations

import functools
from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, const_expr

from ..format import layout as L
from ..format.options import CURSORS, Placement, options
from . import clock
from .insertion import current_block, emit_point, same_point
from .slot import begin_slot, claim_slot
from .store import L2_POLICY, LO32, PAYLOAD_MASK, store_record_word

__all__ = ["CURSORS", "Segment", "SegmentRecorder"]  # CURSORS: where a cursor may live (fa4trace.format.options)


def _recorder_ops(method):
    """For a method that emits only the recorder's own ops (an event's record, a segment's open
    or close): a timer value shareable before it stays shareable after it, so an event after
    it may reuse that value (``SegmentRecorder.timer``). Any other op emitted meanwhile
    (the kernel's) moves the insertion point, and the next event reads the timer again."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        rec = self._rec if isinstance(self, Segment) else self
        if rec.trace is None or not SegmentRecorder.share_timer:
            return method(self, *args, **kwargs)
        last = rec._last_read
        held = last is not None and same_point(last[0], emit_point())
        ret = method(self, *args, **kwargs)
        cur = rec._last_read
        # a read inside the method (cur is new), or a value still shareable at entry
        if cur is not None and (cur is not last or held):
            rec._last_read = (emit_point(), cur[1])
        else:
            rec._last_read = None
        return ret

    return wrapper


class SegmentRecorder:
    """Per-warp recorder whose cursor lives in the warp's header in global memory.

    ``Recorder`` keeps its cursor in registers and must be carried through every loop and
    dynamic ``if`` between its events. That is impossible where the events come from hooks
    placed in someone else's code (upstream FlashAttention-4: its loops carry only their own
    state). ``SegmentRecorder`` needs no carrying:

        rec = SegmentRecorder.start(trace, role=ROLE.MMA)   # once per warp, at the warp's entry
        ...                                                 # anywhere below, inside any loop:
        seg = rec.open()            # loads the warp's cursor (latency hidden until close)
        seg.begin(EV.QK, n_block)   # a timer read; the record stays in registers
        ...                         # (more events, in the same region as open)
        seg.end(EV.QK, n_block)
        seg.close()                 # stores the segment's records, then the new cursor
        ...
        rec.finish()                # end anchors and written/dropped counts, as Recorder

    Only values defined at ``start`` (slot index, capacity, lane) are used across segments, and
    they dominate everything below the warp's entry. The cursor travels through memory: word
    ``W_COUNTS`` of the warp header holds the number of events so far while the warp runs and
    the usual ``written | dropped << 32`` after ``finish``, so the buffer layout and the decoder
    are unchanged. Every active lane loads and stores the same words (same address, same value:
    one transaction), so a segment may run on the whole warp or on one elected lane.

    Rules, checked while tracing: a segment's events must be recorded in the region (MLIR block)
    where it was opened, since its records are stored at ``close`` there; segments of one warp
    must not overlap in time (the second would read a stale cursor). Both are properties of where
    the hooks sit, so a violation fails the compile, never the trace.

    Cost per segment: one global load (its result is needed only at ``close``), one store per
    record, one store for the cursor. ``trace=None`` compiles to nothing, as for ``Recorder``.

    Ring (``start(cursor="ring")``): each record is one shared-memory store into the warp's ring
    of R records, at ``(cursor + j) & (R - 1)``, with no bounds check and no global store; the
    cursor is in shared memory as with "smem". ``finish`` copies the ring's last
    ``min(cursor, R, capacity)`` records into the warp's slot, oldest first, with the warp's
    active lanes side by side, and its header says so (layout: word 2's ring field), so the
    decoder knows that the records lost are the oldest ones (overwritten), not the newest.
    """

    # Adjacent events share one timer read (``timer``). Class-wide, as a switch for tests and
    # measurements of the reads it saves; on by default.
    share_timer: bool = True

    def __init__(self, trace, role, timebase, invariants, smem_cursor=None, l2: str = "first", ring=None):
        self.trace = trace
        self.role = role
        self.timebase = timebase
        self._inv = invariants
        self._smem = smem_cursor  # (cute tensor of 32 Int32 in shared memory, warp index) or None
        self._ring = ring  # (this warp's ring: cute tensor of R Int64 in shared memory, R) or None
        self._policy = L2_POLICY[l2]
        self._open: Optional["Segment"] = None
        self._last_read = None  # (emit point, value) of the last timer read, while shareable

    @property
    def enabled(self) -> bool:
        return self.trace is not None

    @staticmethod
    def start(trace: Optional[cute.Tensor], role: int = 0, *,
              timebase: int = L.TIMEBASE_CLOCK64, placement: Optional[Placement] = None,
              ring_warps: Optional[int] = None, cursor: Optional[str] = None, l2: Optional[str] = None,
              ring: Optional[int] = None) -> "SegmentRecorder":
        """Claim this warp's slot, write the start of its header and zero its cursor.

        ``placement`` (``fa4trace.format.options.Placement``; its defaults unless given, or made
        of the ``cursor`` / ``l2`` / ``ring`` keywords): where the cursor lives between segments
        and how records are stored. ``cursor`` "smem" (default): one Int32 per warp in 128
        bytes of static shared memory allocated here (one allocation per call site, indexed by
        warp): a segment then waits on a shared-memory load, which matters for short segments;
        the kernel's shared-memory budget grows by that much (plus alignment of the dynamic
        region that follows static shared memory). "gmem": the header word ``W_COUNTS``,
        nothing else is allocated (for a kernel that needs all its shared memory). "ring": the
        "smem" cursor plus a ring of ``ring`` records (a power of two) per warp in static shared
        memory, for ``ring_warps`` warps (the CTA's warp count where the caller knows it at
        compile time; else 32, the most a CTA holds): records are stored there and copied to
        the slot at ``finish``, which keeps the last ``ring`` of them (class doc).

        ``l2``: the L2 policy of the record stores. "first" (evict_first, default): records
        leave L2 first, right for kernels whose inputs are reused through L2 (GEMM, prefill
        attention), where millions of pinned records would push that reuse out to DRAM. "last"
        (evict_last): records stay in L2 until the launch ends, right for kernels that stream
        their inputs once (decode attention: the FA4 adapter and our known-answer kernels ask
        for it).
        """
        placement = options(Placement, placement, "SegmentRecorder.start", cursor=cursor, l2=l2, ring=ring)
        cursor, l2 = placement.cursor, placement.l2
        if const_expr(trace is None):
            return SegmentRecorder(None, role, timebase, None)
        if timebase not in L.TIMEBASE_NAMES:
            raise ValueError(f"unknown timebase {timebase}")
        records, warps = 0, None
        if cursor == "ring":
            records = placement.ring
            warps = ring_warps or L.MAX_CTA_WARPS
            if not 1 <= warps <= L.MAX_CTA_WARPS:
                raise ValueError(f"ring_warps must be 1..{L.MAX_CTA_WARPS}, got {ring_warps}")
            need = L.ring_smem_bytes(records, warps)
            if need > L.STATIC_SMEM_LIMIT:
                raise ValueError(f"a ring of {records} records for {warps} warps needs {need} B of static shared "
                                 f"memory, more than the {L.STATIC_SMEM_LIMIT} B a kernel may hold; choose a smaller ring")
        inv = claim_slot(trace, role, timebase, *begin_slot(trace, timebase), ring=records)
        smem = ring_buf = None
        if cursor in ("smem", "ring"):
            ptr = cute.arch.alloc_smem(Int32, L.MAX_CTA_WARPS, alignment=16)
            smem = (cute.make_tensor(ptr, cute.make_layout(L.MAX_CTA_WARPS)), cute.arch.warp_idx() % L.MAX_CTA_WARPS)
        if cursor == "ring":
            # warps * records words, this warp's ring at warp * records: a warp index is below
            # the CTA's warp count (ring_warps, else 32), so no ring reaches another's
            rptr = cute.arch.alloc_smem(Int64, warps * records, alignment=16)
            ring_buf = (cute.make_tensor(rptr + smem[1] * records, cute.make_layout(records)), records)
        rec = SegmentRecorder(trace, role, timebase, inv, smem, l2, ring_buf)
        rec._store_cursor(Int32(0))
        return rec

    def set_role(self, role: int):
        """Write ``role`` into this warp's header (a warp whose recorder started before its role
        was known: fa4trace.auto starts every warp at kernel entry, a kernel's own hooks say
        later which role the warp took). One store; no-op when tracing is off."""
        if const_expr(self.trace is not None):
            self.role = role
            self._store_role(role)

    @cute.jit
    def _store_role(self, role: cutlass.Constexpr):
        header, cap, _lane = self._inv
        trace = self.trace
        if cap > 0:
            trace[header + L.W_MAGIC] = Int64(L.warp_word0(self.timebase, int(role)))

    def _load_cursor(self) -> Int32:
        if self._smem is not None:
            cur, w = self._smem
            return Int32(cur[w])
        header, _cap, _lane = self._inv
        return Int32(self.trace[header + L.W_COUNTS])

    def _store_cursor(self, cursor: Int32):
        if self._smem is not None:
            cur, w = self._smem
            cur[w] = cursor
        else:
            self._store_cursor_gmem(cursor)

    @cute.jit
    def _store_cursor_gmem(self, cursor: Int32):
        header, cap, _lane = self._inv
        trace = self.trace
        if cap > 0:
            trace[header + L.W_COUNTS] = Int64(cursor)

    @_recorder_ops
    def open(self, *, shared: bool = False) -> "Segment":
        """Start a segment. ``shared``: hooks called inside it record into it (``Segment.joinable``)
        instead of recording nothing, as a kernel's own hooks want for the generic families."""
        if self._open is not None:
            raise RuntimeError("fa4trace: a segment of this warp is already open (segments must not overlap)")
        seg = Segment(self)
        seg.shared = shared
        if self.enabled:
            seg._cursor = self._load_cursor()
            seg._block = current_block()
        self._open = seg
        return seg

    @property
    def current(self) -> Optional["Segment"]:
        """The open segment, if any (hooks nested in a hooked call join it)."""
        return self._open

    def timer(self):
        """This recorder's timer now (for events whose record is written later).

        Where nothing but the recorder's own ops (records, segment open/close) was emitted since
        the last read, in the same MLIR block, that read's value: no op of the kernel runs in
        between, so a second read would only add a volatile read (which ptxas does not move) and
        the few cycles of the recorder's own ops. Adjacent events then share one read: an end
        and the next begin inside one hooked call, a begin/end around a call that emits nothing,
        one hook's instant and the next hook's begin. Checked while tracing, from the insertion
        point (``insertion.emit_point``); ``share_timer = False`` reads every time."""
        last = self._last_read
        if self.share_timer and last is not None and same_point(last[0], emit_point()):
            return last[1]
        t = self.read_timer()
        self._last_read = (emit_point(), t) if self.share_timer else None
        return t

    def read_timer(self):
        """One read of this recorder's timer (%globaltimer or %clock64, as its timebase), as
        ``timer`` takes it where no earlier read can be shared. The one place a record's time is
        read: benchmarks/fa4_cost_parts.py replaces it to measure the reads' cost."""
        if const_expr(self.timebase == L.TIMEBASE_GLOBALTIMER):
            return cute.arch.globaltimer()
        return cute.arch.clock64()

    def finish(self):
        """Close the header: end anchors and written/dropped counts (as ``Recorder.finish``);
        with a ring, first copy its records into the slot."""
        if self._open is not None:
            raise RuntimeError("fa4trace: finish() with a segment still open")
        if const_expr(self.trace is not None):
            if const_expr(self._ring is not None):
                self._finish_ring(self._load_cursor())
            else:
                self._finish(self._load_cursor())

    @cute.jit
    def _finish_ring(self, cursor: Int32):
        """End anchors, then the ring's kept records into the slot, then the counts.

        The anchors come first: the warp's recorded end is when its own work ended, not when
        the copy did. The copy keeps the newest ``min(cursor, R, capacity)`` records, oldest
        first; the lanes active here (all 32 where the warp reaches its exit converged, as at
        fa4trace.auto's kernel exit) take every n-th record, so a warp stores 256 B at a time.
        ``bar.warp.sync`` over those lanes orders the ring stores other lanes made before."""
        header, cap, lane = self._inv
        ring, n = self._ring
        gt1, clk1 = clock.edge_anchor()
        kept = cutlass.min(cutlass.min(cursor, Int32(n)), cap)
        first = cursor - kept
        active = cute.arch.activemask()
        cute.arch.sync_warp(active)
        rank = Int32(cute.arch.popc(active & ((Int32(1) << lane) - 1)))
        step = Int32(cute.arch.popc(active))
        records = header + L.WARP_HEADER_WORDS
        trace = self.trace
        for i in cutlass.range(rank, kept, step, unroll=1):
            store_record_word(trace, records + i, ring[(first + i) & (n - 1)], self._policy)
        if cap > 0:
            trace[header + L.W_GT1] = gt1
            trace[header + L.W_CLK1] = clk1
            trace[header + L.W_COUNTS] = Int64(kept) | (Int64(cursor - kept) << 32)

    @cute.jit
    def _finish(self, cursor: Int32):
        header, cap, _lane = self._inv
        gt1, clk1 = clock.edge_anchor()
        written = cutlass.min(cursor, cap)
        trace = self.trace
        if cap > 0:
            trace[header + L.W_GT1] = gt1
            trace[header + L.W_CLK1] = clk1
            trace[header + L.W_COUNTS] = Int64(written) | (Int64(cursor - written) << 32)

    def _store_record(self, pos: Int32, word: Int64):
        if const_expr(self._ring is not None):
            # one shared-memory store: the ring wraps, so no bounds check (finish copies it out)
            ring, n = self._ring
            ring[pos & (n - 1)] = word
        else:
            self._store_record_slot(pos, word)

    @cute.jit
    def _store_record_slot(self, pos: Int32, word: Int64):
        header, cap, _lane = self._inv
        trace = self.trace
        if pos < cap:
            store_record_word(trace, header + L.WARP_HEADER_WORDS + pos, word, self._policy)


class Segment:
    """Events of one ``SegmentRecorder`` between ``open`` and ``close`` (see there)."""

    def __init__(self, rec: SegmentRecorder):
        self._rec = rec
        self._words = []
        self._cursor = None
        self._block = None
        self.shared = False

    def joinable(self) -> bool:
        """A hook called now may record into this segment: it was opened ``shared`` and the
        trace is in the region it was opened in (events elsewhere could not be stored at close)."""
        return self.shared and (self._rec.trace is None or current_block() == self._block)

    def begin(self, event: int, payload=None, t=None):
        """Start of a span. ``t``: a timer value read earlier (``rec.timer()``), else now."""
        self._record(event, L.KIND_BEGIN, payload, t)

    def end(self, event: int, payload=None, t=None):
        self._record(event, L.KIND_END, payload, t)

    def instant(self, event: int, payload=None, t=None):
        self._record(event, L.KIND_INSTANT, payload, t)

    def __len__(self) -> int:
        return len(self._words)

    @_recorder_ops
    def _record(self, event: int, kind: int, payload, t):
        rec = self._rec
        if rec._open is not self:
            raise RuntimeError("fa4trace: event recorded on a closed segment")
        if const_expr(rec.trace is None):
            return
        if current_block() != self._block:
            raise RuntimeError(
                f"fa4trace: event {event} recorded in another region than its segment was opened in "
                "(a hook inside a loop or dynamic if of a hooked call): open a segment there instead")
        tag = L.record_tag(int(event), kind)
        if t is None:
            t = rec.timer()
        if payload is None:
            tag |= L.PAYLOAD_NONE << L.PAYLOAD_SHIFT
            word = (Int64(t) & LO32) | Int64(tag)
        else:
            word = (Int64(t) & LO32) | (Int64(Int32(payload) & PAYLOAD_MASK) << L.PAYLOAD_SHIFT) | Int64(tag)
        self._words.append(word)

    @_recorder_ops
    def close(self):
        rec = self._rec
        if rec._open is not self:
            raise RuntimeError("fa4trace: segment closed twice")
        if const_expr(rec.trace is not None):
            if current_block() != self._block:
                raise RuntimeError("fa4trace: segment closed in another region than it was opened in")
            for j, word in enumerate(self._words):
                rec._store_record(self._cursor + j, word)
            if self._words:
                rec._store_cursor(self._cursor + len(self._words))
        rec._open = None
