"""Per-warp event recorder for CuTe DSL kernels.

Usage inside a ``@cute.kernel`` (every call from warp-uniform code, all 32 lanes):

    rec = Recorder.start(trace, role=ROLE.CONSUMER)   # trace: Optional[cute.Tensor] (Int64, 1-D)
    for i in cutlass.range(n_blocks):
        rec.begin(EV.SOFTMAX, i)
        ...
        rec.end(EV.SOFTMAX, i)
    rec.finish()

``trace`` is the buffer laid out by :mod:`fa4trace.format.layout` (host: ``BufferSpec.new_buffer``).
Pass ``None`` and every call compiles to nothing: the PTX equals that of the kernel without
the calls (tested). Event ids and the timebase are compile-time constants.

How a record gets to memory (``staged=True``, the default): all lanes compute the 8-byte
record, lane ``n % 32`` keeps the n-th in a register, and every 32nd event the whole warp
writes the 32 staged records with one coalesced 256-byte store. Dense markers then cost a
timer read and a few ALU ops each, not a lone 8-byte store each (which is what makes naive
recorders store-bound). ``staged=False`` writes each record from lane 0 at once:
use it where events are recorded from single-lane code (inside ``elect_one``).
``stage="smem"`` stages in shared memory instead of lane registers: every lane stores the
record into the warp's 32-record buffer (one ``st.shared.b64``, the same word at the same
address from all lanes) and the flush has each lane load its own slot back and store it as
above. An event then costs a timer read and one shared store, where lane staging costs a
compare and two selects (and two registers held across the kernel); nothing is lost either way.
Records are
stored with the L2 policy evict_last, so they stay in L2 until the launch ends instead of
going out to DRAM between a streaming kernel's reads (``store.store_record_word``).

Every store is bounds-checked against the warp's slot: a full slot keeps counting, so the
header tells how many records were dropped, and never writes past its slot.

Blocks: a mainloop iteration that records at most n events can say so,
``rec = rec.open_block(n)`` ... ``rec = rec.close_block()``: the room for n records is made
once at the top, and the events inside skip the per-event "staging full?" compare, branch and
wrap (a third of the recorder's instructions per event; the count is checked when the kernel
compiles). Blocks pay where a block holds many events (the decode-attention mainloop records
up to 12 per step); a block of 2 events costs more than it saves. Inside a block an event also
finds its staging lane as ``lane - pos0 == k`` with k a compile-time count (one instruction
less per event).

The recorder is carried through ``cutlass.range`` loops and dynamic ``if``s as a DSL value
(``__extract_mlir_values__``): its counters and staging registers are loop-carried, nothing
else changes after ``start``.

An event's parts are one method each: whether it compiles in (``records``), its timer read
(``read_timer``), where its record is kept (``keep_in_lanes``, ``keep_in_smem``); the warp's
start and end anchors are ``clock.edge_anchor``. Measurements of where the recorder's cost goes
build it with one part replaced (benchmarks/decode_recorder_parts.py); nothing in here knows
which build is a measurement.
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, const_expr

from ..format import layout as L
from . import clock
from .clock import clock_lo_vector
from .insertion import current_block
from .slot import begin_slot, claim_slot
from .store import PAYLOAD_MASK, pack, store_record_word, store_shared_v2


class Recorder:
    # Trace-time: events left in the open block (``open_block``), None outside one. Tracing
    # runs one kernel at a time, in order, so a class attribute is enough.
    _block_budget: Optional[int] = None
    # Trace-time, inside an open block: (MLIR block, lane - pos there, events staged since).
    # An event then asks "lane - pos == k?" with k a constant: one compare, where
    # "pos + k == lane" costs an add and a compare (SASS). Recomputed wherever the code region
    # changes (a dynamic if or loop body: pos may differ per path).
    _block_lane_offset = None

    def __init__(self, trace, role, timebase, staged, state, invariants, events=None, pending=None, stage="lanes"):
        # Static (Python) configuration: never changes, copied as is through loops.
        self.trace = trace
        self.role = role
        self.timebase = timebase
        self.staged = staged
        self.events = events  # frozenset of event ids that record; None = all
        self.stage = stage  # "lanes" or "smem": where staged records wait (module doc)
        # Loop-carried DSL values (empty when off): [pos, base, staged low word, staged high word]
        # where pos = events staged (0..31) and base = events already flushed, so the
        # warp has recorded base + pos events. (Lane mode: pos stays 0, base counts; smem
        # staging: [pos, base] only, the records wait in shared memory.)
        self._state = state
        # DSL values fixed at start (defined before any loop, so they dominate its body):
        # slot index of the warp header, capacity (0 = this warp does not record), lane, and
        # the warp's staging buffer in shared memory (None unless stage="smem").
        # Before ``settle`` (``start(settle=False)``): (None, None, lane, buffer).
        self._inv = invariants
        # Before ``settle``: (start anchor globaltimer, clock64, header words g1..g3 as loaded).
        self._pending = pending

    # ---- DSL value protocol: lets cutlass.range / dynamic if carry the recorder ----------
    def __extract_mlir_values__(self):
        vals = []
        for v in self._state:
            vals += cutlass.extract_mlir_values(v)
        return vals

    def __new_from_mlir_values__(self, values):
        state = [Int32(v) for v in values[:len(self._state)]]
        return Recorder(self.trace, self.role, self.timebase, self.staged, state, self._inv, self.events,
                        self._pending, self.stage)

    @property
    def enabled(self) -> bool:
        return self.trace is not None

    def records(self, event: int) -> bool:
        """Trace time: is ``event`` compiled in (tracing on and the event in ``start``'s set)?
        For code that exists only to feed an event, such as a probe deciding whether to record."""
        return self.trace is not None and (self.events is None or int(event) in self.events)

    # ---- creation -----------------------------------------------------------------------
    @staticmethod
    def start(trace: Optional[cute.Tensor], role: int = 0, *,
              timebase: int = L.TIMEBASE_CLOCK64, staged: bool = True, events=None,
              settle: bool = True, stage: str = "lanes", stage_warps: Optional[int] = None) -> "Recorder":
        """Claim this warp's slot and write the start of its header. Call once per warp.

        ``events``: ids of the events that record (a subset costs fewer instructions: the
        others compile to nothing, as with ``trace=None``); None records every event.

        ``stage``: where staged records wait for their 256-byte store: "lanes" (one per lane
        register) or "smem" (a 32-record buffer per warp in static shared memory, 256 B per
        warp for ``stage_warps`` warps, else for the 32 a CTA may hold; module doc). Warp w
        stages in buffer ``w % stage_warps`` of this call site's allocation: no two warps that
        call this site may share that number (where unsure, give the CTA's warp count), else
        they mix their records.

        ``settle=False``: take the start anchor and issue the loads of the buffer header, but
        do not wait for them; ``rec = rec.settle()`` later, in the same straight-line code,
        claims the slot. In between the warp can issue its first loads and record up to 31
        events (staged, no dynamic ``if`` or loop). Why: the slot needs the header words, and
        a warp that waits for them first starts its real work an L2 round trip late (in our
        decode kernel the producer's first TMA and the consumers' Q loads waited behind them
        and a division; what that cost: docs/recorder.md).
        """
        Recorder._block_budget = None  # a failed compile may have left a block open
        Recorder._block_lane_offset = None
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(repr(x) for x in STAGES)}, got {stage!r}")
        if stage == "smem" and not staged:
            raise ValueError('stage="smem" needs the staged mode (lane mode stores each record at once)')
        if const_expr(trace is None):
            return Recorder(None, role, timebase, staged, [], None, stage=stage)
        if timebase not in L.TIMEBASE_NAMES:
            raise ValueError(f"unknown timebase {timebase}")
        buf = Recorder._stage_buffer(stage_warps) if stage == "smem" else None
        zero = Recorder._zero_state()[:2] if stage == "smem" else Recorder._zero_state()
        pending = begin_slot(trace, timebase)
        if settle:
            inv = (*claim_slot(trace, role, timebase, *pending), buf)
            rec = Recorder(trace, role, timebase, staged, zero, inv, stage=stage)
        else:
            if not staged:
                raise ValueError("start(settle=False) needs the staged mode (lane mode stores each record at once)")
            rec = Recorder(trace, role, timebase, staged, zero,
                           (None, None, cute.arch.lane_idx(), buf), pending=pending, stage=stage)
            # the events before settle are an implicit block: staged, no flush, lanes by count
            Recorder._block_budget = 31
        if events is not None:
            rec.events = frozenset(int(e) for e in events)
        return rec

    def settle(self) -> "Recorder":
        """Claim the slot of a ``start(settle=False)`` recorder (waits for the header loads);
        use the returned recorder. No-op when tracing is off."""
        if const_expr(self.trace is None):
            return self
        if self._pending is None:
            raise RuntimeError("fa4trace: settle() without start(settle=False), or twice")
        Recorder._block_budget = None
        Recorder._block_lane_offset = None
        inv = (*claim_slot(self.trace, self.role, self.timebase, *self._pending), self._inv[3])
        return Recorder(self.trace, self.role, self.timebase, self.staged, self._state, inv, self.events,
                        stage=self.stage)

    def _settled(self):
        if self._pending is not None:
            raise RuntimeError("fa4trace: this recorder needs rec = rec.settle() first (start(settle=False))")

    @staticmethod
    def _zero_state():
        return [Int32(0), Int32(0), Int32(0), Int32(0)]

    @staticmethod
    def _stage_buffer(warps: Optional[int]) -> cute.Tensor:
        """This warp's 32 staging records in static shared memory (one allocation per
        ``start`` call site, ``warps`` buffers side by side, indexed by warp)."""
        warps = warps or L.MAX_CTA_WARPS
        if not 1 <= warps <= L.MAX_CTA_WARPS:
            raise ValueError(f"stage_warps must be 1..{L.MAX_CTA_WARPS}, got {warps}")
        ptr = cute.arch.alloc_smem(Int64, 32 * warps, alignment=16)
        return cute.make_tensor(ptr + (cute.arch.warp_idx() % warps) * 32, cute.make_layout(32))

    # ---- events -------------------------------------------------------------------------
    def begin(self, event: int, payload=None, *, when=None, t=None):
        """Start of a span; pair it with ``end`` of the same event and payload.

        ``when``: a runtime (warp-uniform) condition; the event is recorded only where it holds.
        For work under a dynamic ``if``: record it outside the ``if`` with the same condition
        rather than inside. A staged record inside a dynamic ``if`` can cost registers far
        away: in decode attention, the producer's LOAD_K under ``if count > 1`` moved the
        consumers' pipeline state to vector registers for their whole mainloop (SASS, +49
        instructions per two steps at d64). Inside a block (``open_block``, or before
        ``settle``) it counts against the block's events; it and the events after it in the
        same code region find their staging lane at run time (one instruction more each).
        """
        self._record(event, L.KIND_BEGIN, payload, when, t)

    def end(self, event: int, payload=None, *, when=None, t=None):
        self._record(event, L.KIND_END, payload, when, t)

    def instant(self, event: int, payload=None, *, when=None, t=None):
        self._record(event, L.KIND_INSTANT, payload, when, t)

    def timer(self):
        """The timer now, as an event records it (None with tracing off)."""
        if const_expr(self.trace is None):
            return None
        return self.read_timer()

    def anchor(self):
        """Tie %clock64 to %globaltimer again, now (clock64 timebase; no-op otherwise).

        Cycles become ns between a warp's anchors by linear interpolation, which assumes a
        constant SM clock. The SM clock drifts across warps (docs/recorder.md, "Times"), so
        over a long warp mid-life events can move by a tick or more. Long-lived warps that need
        tick accuracy call this now and then (it spins ≤ one tick to catch the timer's edge);
        the decoder then interpolates piecewise between anchors. Two records, not events.
        """
        if const_expr(self.trace is not None and self.timebase == L.TIMEBASE_CLOCK64):
            gt, clk = clock.edge_anchor()
            tag = L.record_tag(L.ANCHOR_EVENT_ID, L.KIND_INSTANT)
            self._stage(tag, Int32(L.ANCHOR_CLOCK), Int32(clk), self._take_block_slot())
            self._stage(tag, Int32(L.ANCHOR_GLOBALTIMER), Int32(gt), self._take_block_slot())

    # ---- blocks: runs of events without the per-event flush check ------------------------
    def open_block(self, n: int) -> "Recorder":
        """Start a run of at most ``n`` events (say, one mainloop iteration) that skip the
        per-event "staging full?" check: the room is made here, once (if fewer than ``n``
        staging slots are free, the staged records are written now). End it with
        ``close_block``; use the returned recorder (``rec = rec.open_block(12)``).

        The traced code between the two may record at most ``n`` events, counting both sides
        of every dynamic ``if`` (checked while the kernel compiles: more raises), and must
        not loop over events (a loop body is traced once, so its count would not bound the
        run). Staged mode only; elsewhere (and with tracing off) this is a no-op.
        """
        if const_expr(self.trace is None or not self.staged):
            return self
        self._settled()
        if Recorder._block_budget is not None:
            raise RuntimeError("fa4trace: open_block inside an open block (close it first)")
        if not 1 <= n <= 32:
            raise ValueError(f"open_block: n must be 1..32 (staging slots), got {n}")
        self._make_room(n)
        Recorder._block_budget = n
        Recorder._block_lane_offset = None
        return self

    def close_block(self) -> "Recorder":
        """End the block opened by ``open_block`` (writes the staged records if all 32 slots
        are full)."""
        if const_expr(self.trace is None or not self.staged):
            return self
        if Recorder._block_budget is None:
            raise RuntimeError("fa4trace: close_block without open_block")
        Recorder._block_budget = None
        Recorder._block_lane_offset = None
        if const_expr(self.stage == "lanes"):  # smem staging flushes a full buffer at the next event
            self._make_room(1)
        return self

    @cute.jit
    def _make_room(self, n: cutlass.Constexpr):
        self._settled()
        pos = self._state[0]
        base = self._state[1]
        if pos > 32 - n:  # write lanes 0..pos-1 (pos <= 32)
            self._write_staged()
            base = base + pos
            pos = Int32(0)
        self._state = [Int32(pos), Int32(base)] + self._state[2:]

    @cute.jit
    def _write_staged(self):
        """Store the records staged so far (staging slots 0..pos-1, slot n in lane n) at
        base.., bounds-checked."""
        self._settled()
        header, cap, lane, buf = self._inv
        pos = self._state[0]
        idx = self._state[1] + lane
        if (lane < pos) & (idx < cap):
            if const_expr(buf is None):
                word = pack(self._state[2], self._state[3])
            else:
                word = buf[lane]  # this lane's own store of slot ``lane``: no warp sync needed
            store_record_word(self.trace, header + L.WARP_HEADER_WORDS + idx, word)

    def _record(self, event: int, kind: int, payload, when=None, t=None):
        if const_expr(self.records(event)):
            tag = L.record_tag(int(event), kind)
            if const_expr(payload is None):
                tag |= L.PAYLOAD_NONE << L.PAYLOAD_SHIFT
                self._emit(tag, Int32(0), when, t)
            else:
                self._emit(tag, Int32(payload), when, t)

    def _emit(self, tag: int, payload: Int32, when=None, t=None):
        if const_expr(t is None):
            t = self.read_timer()
        in_block = self._take_block_slot()
        self._stage(tag, payload, t, in_block, when)

    def read_timer(self) -> Int32:
        """One timer read for an event's record: the low 32 bits of this recorder's timebase
        (with smem staging, %clock into a per-lane register). The one place an event reads the
        timer: benchmarks/decode_recorder_parts.py replaces it to measure the reads' cost."""
        if const_expr(self.timebase == L.TIMEBASE_GLOBALTIMER):
            t = Int32(cute.arch.globaltimer_lo())
        elif const_expr(self.stage == "smem"):
            t = clock_lo_vector(self._inv[2])
        else:
            t = Int32(cute.arch.clock64())
        return t

    def _stage(self, tag: int, payload: Int32, t: Int32, in_block: bool = False, when=None):
        """Stage one record, where this recorder stages (lane registers or shared memory)."""
        if self.stage == "smem":
            self._stage_smem(tag, payload, t, in_block, when)
        else:
            self._stage_lanes(tag, payload, t, in_block, when)

    @cute.jit
    def _stage_smem(self, tag: cutlass.Constexpr, payload: Int32, t: Int32, in_block: cutlass.Constexpr = False,
                    when=None):
        """Stage one record in the warp's shared-memory buffer: every lane stores the same word at
        slot pos (no lane test, no select). Outside a block a full buffer is flushed first (so
        ``close_block`` has nothing to do: a block's room is made once, at ``open_block``).
        ``when``: the store happens anyway, only pos moves where it holds (an unmoved slot is
        written over or never flushed)."""
        header, cap, lane, buf = self._inv
        pos = self._state[0]
        base = self._state[1]
        if const_expr(not in_block):
            self._settled()
            if pos == 32:
                idx = base + lane
                if idx < cap:
                    store_record_word(self.trace, header + L.WARP_HEADER_WORDS + idx, buf[lane])
                base = base + 32
                pos = Int32(0)
        hi = Int32(tag >> 32) | ((payload & PAYLOAD_MASK) << (L.PAYLOAD_SHIFT - 32))
        self.keep_in_smem(buf.iterator + pos, t, hi)
        pos = _advance(when, pos + 1, pos)
        self._state = [Int32(pos), Int32(base)]

    def _take_block_slot(self) -> bool:
        """Trace time: True if this event is one of an open block's reserved ones."""
        if Recorder._block_budget is None or not self.staged:
            return False
        if Recorder._block_budget == 0:
            raise RuntimeError("fa4trace: more events in a block than open_block(n) reserved "
                               "(both sides of a dynamic if count)")
        Recorder._block_budget -= 1
        return True

    @cute.jit
    def _stage_lanes(self, tag: cutlass.Constexpr, payload: Int32, t: Int32, in_block: cutlass.Constexpr = False,
                     when=None):
        """Stage (or, in lane mode, store) one record in lane registers. ``when``: a runtime condition; the
        record, its flush and the cursor moves are predicated on it, so no dynamic ``if``
        surrounds the record (only the flush). In a block the lane then comes from the run-time
        position: whether earlier predicated events recorded is not known while compiling."""
        header, cap, lane, _buf = self._inv
        pos, base, st_lo, st_hi = self._state
        # Per event the SASS is about: CS2R.32 (timer, often predicated straight into the
        # staging register), ISETP (is this lane the stager), a predicated move of the high
        # word, the pos add, and a compare + branch for the flush. Keeping pos (0..31) apart
        # from base avoids the masks and extra induction variables a single cursor costs.
        hi = Int32(tag >> 32) | ((payload & PAYLOAD_MASK) << (L.PAYLOAD_SHIFT - 32))
        if const_expr(not in_block):  # a record that may be stored now: the slot must be known
            self._settled()
            records = header + L.WARP_HEADER_WORDS
        if const_expr(self.staged):
            if const_expr(in_block and when is None):
                mine = self._block_lane_is(pos, lane)
            else:
                mine = pos == lane
                # the count-based lane of the events after this one no longer holds
                Recorder._block_lane_offset = None
            mine = _where(when, mine)
            st_lo, st_hi = self.keep_in_lanes(mine, t, hi, st_lo, st_hi)
            if const_expr(in_block):
                # open_block made the room; close_block writes a full staging
                pos = _advance(when, pos + 1, pos)
            else:
                if _where(when, pos == 31):
                    idx = base + lane
                    if idx < cap:
                        store_record_word(self.trace, records + idx, pack(st_lo, st_hi))
                    base = base + 32
                pos = _advance(when, (pos + 1) & 31, pos)
        else:
            if _where(when, (lane == 0) & (base < cap)):
                store_record_word(self.trace, records + base, pack(t, hi))
            base = _advance(when, base + 1, base)
        self._state = [Int32(pos), Int32(base), Int32(st_lo), Int32(st_hi)]

    def keep_in_lanes(self, mine, t: Int32, hi: Int32, st_lo: Int32, st_hi: Int32):
        """The staging registers after an event (lane staging): its record's halves ``t`` and
        ``hi`` in the lane that stages it (``mine``), the other lanes' unchanged. With
        ``keep_in_smem``, where an event's record is kept: benchmarks/decode_recorder_parts.py
        replaces both to measure the recorder without them."""
        return cutlass.select_(mine, t, st_lo), cutlass.select_(mine, hi, st_hi)

    def keep_in_smem(self, slot, t: Int32, hi: Int32):
        """An event's record into its staging slot in shared memory (smem staging): one
        st.shared.v2.b32 of its halves ``t`` and ``hi``, the same word from every lane."""
        store_shared_v2(slot, t, hi)

    @staticmethod
    def _block_lane_is(pos, lane):
        """Inside a block: is this lane the stager of the next event (pos == lane)? As
        ``lane - pos0 == k`` with pos0 taken once per code region and k counted here."""
        region = current_block()
        cached = Recorder._block_lane_offset
        if cached is None or cached[0] != region:
            cached = (region, lane - pos, 0)
        region, offset, k = cached
        Recorder._block_lane_offset = (region, offset, k + 1)
        return offset == k

    # ---- end of the warp's work ---------------------------------------------------------
    def finish(self):
        """Flush staged records and close the header (end anchors, written/dropped counts)."""
        if const_expr(self.trace is not None):
            self._settled()
            self._finish()

    @cute.jit
    def _finish(self):
        header, cap, lane, _buf = self._inv
        cursor = self._state[0] + self._state[1]
        if const_expr(self.staged):
            self._write_staged()
        gt1, clk1 = clock.edge_anchor()
        written = cutlass.min(cursor, cap)
        if (cap > 0) & (lane == 0):
            trace = self.trace
            trace[header + L.W_GT1] = gt1
            trace[header + L.W_CLK1] = clk1
            trace[header + L.W_COUNTS] = Int64(written) | (Int64(cursor - written) << 32)


# Where a Recorder's staged records wait for their store (Recorder.start)
STAGES = ("lanes", "smem")


def _where(when, cond):
    """``cond`` only where the runtime condition ``when`` holds (``when=None``: ``cond``)."""
    return cond if when is None else cond & when


def _advance(when, new, old):
    """A cursor move predicated on ``when``: ``new`` where it holds (``when=None``: always)."""
    return new if when is None else cutlass.select_(when, new, old)
