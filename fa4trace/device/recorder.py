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
going out to DRAM between a streaming kernel's reads (``_store_record_word``).

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
"""

from __future__ import annotations

import functools
from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, const_expr

from ..format import layout as L

_LO32 = 0xFFFFFFFF
_PAYLOAD_MASK = (1 << L.PAYLOAD_BITS) - 1


class Recorder:
    # A switch for measuring where the recorder's cost goes (benchmarks/decode_recorder_parts.py),
    # None in every real build: "no-timer" events stage a constant instead of reading the timer,
    # "no-store" events stage nothing (ptxas then drops their timer reads too: a read whose value
    # goes nowhere is removed, seen in the SASS); "no-events": no event compiles in (the warp's
    # start and finish stay); "no-edge": the start and end anchors are one plain read each, not
    # caught at the global timer's tick edge. Read while a kernel compiles.
    ablation: Optional[str] = None
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
        return (self.trace is not None and (self.events is None or int(event) in self.events)
                and Recorder.ablation != "no-events")

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
        a warp that waits for them first starts its real work an L2 round trip late (decode
        attention on the H200: the producer's first TMA and the consumers' Q loads waited
        behind them and a division; at b 1 the recorder's fixed cost was ~0.4 us, +2%).
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
        pending = Recorder._begin_slot(trace, timebase)
        if settle:
            inv = (*Recorder._claim_slot(trace, role, timebase, *pending), buf)
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
        inv = (*Recorder._claim_slot(self.trace, self.role, self.timebase, *self._pending), self._inv[3])
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

    @staticmethod
    @cute.jit
    def _begin_slot(trace: cute.Tensor, timebase: cutlass.Constexpr):
        """The start anchor, then the header loads (issued; nothing here waits for them)."""
        gt0, clk0 = _edge_anchor()
        return gt0, clk0, trace[1], trace[2], trace[3]

    @staticmethod
    @cute.jit
    def _claim_slot(trace: cute.Tensor, role, timebase: cutlass.Constexpr, gt0, clk0, g1, g2, g3,
                    ring: cutlass.Constexpr = 0):
        """This warp's slot from the header words; writes the start of its warp header
        (``ring``: records of the warp's shared-memory ring, 0 without one; header word 2)."""
        slot_words = Int32(g1 & _LO32)
        warps = Int32(g1 >> 32)
        warp_mask = Int32(g3 >> 32)  # 0: warps 0..warps-1 record; else bit w: warp w does
        cta, order, csize, cta_slot, cta_ok = _cta_selection(g2, g3)
        warp = cute.arch.warp_idx()
        lane = cute.arch.lane_idx()

        # With a warp mask, a selected warp's slot in its CTA is the number of selected warps below it.
        in_mask = ((warp_mask >> warp) & 1) == 1
        below = cute.arch.popc(warp_mask & ((Int32(1) << warp) - 1))
        warp_ok = cutlass.select_(warp_mask == 0, warp < warps, in_mask)
        warp_slot = cutlass.select_(warp_mask == 0, warp, Int32(below))
        active = cta_ok & warp_ok
        header = L.GLOBAL_HEADER_WORDS + (cta_slot * warps + warp_slot) * slot_words
        header = cutlass.select_(active, header, Int32(0))
        cap = cutlass.select_(active, slot_words - L.WARP_HEADER_WORDS, Int32(0))

        if active & (lane == 0):
            trace[header + L.W_MAGIC] = Int64(L.warp_word0(timebase)) | (Int64(role) << 48)
            trace[header + L.W_IDS] = Int64(cute.arch.smid()) | (Int64(cta) << 32)
            trace[header + L.W_WARP] = (Int64(warp) | Int64(L.ring_field(ring) << L.RING_SHIFT)
                                        | ((Int64(order) + 1) << 32) | (Int64(csize) << 56))
            trace[header + L.W_GT0] = gt0
            trace[header + L.W_CLK0] = clk0
        return header, cap, lane

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
        return self._read_timer()

    def anchor(self):
        """Tie %clock64 to %globaltimer again, now (clock64 timebase; no-op otherwise).

        Cycles become ns between a warp's anchors by linear interpolation, which assumes a
        constant SM clock. The H200's clock drifts by up to ~0.25% across warps, which over a
        100 µs warp moves mid-life events by a tick (32 ns) or more. Long-lived warps that need
        tick accuracy call this now and then (it spins ≤ one tick to catch the timer's edge);
        the decoder then interpolates piecewise between anchors. Two records, not events.
        """
        if const_expr(self.trace is not None and self.timebase == L.TIMEBASE_CLOCK64):
            gt, clk = _edge_anchor()
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
                word = _pack(self._state[2], self._state[3])
            else:
                word = buf[lane]  # this lane's own store of slot ``lane``: no warp sync needed
            _store_record_word(self.trace, header + L.WARP_HEADER_WORDS + idx, word)

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
            t = self._read_timer()
        in_block = self._take_block_slot()
        self._stage(tag, payload, t, in_block, when)

    def _read_timer(self) -> Int32:
        if const_expr(Recorder.ablation == "no-timer"):
            t = Int32(0)
        elif const_expr(self.timebase == L.TIMEBASE_GLOBALTIMER):
            t = Int32(cute.arch.globaltimer_lo())
        elif const_expr(self.stage == "smem"):
            t = _clock_lo_vector(self._inv[2])
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
                    _store_record_word(self.trace, header + L.WARP_HEADER_WORDS + idx, buf[lane])
                base = base + 32
                pos = Int32(0)
        hi = Int32(tag >> 32) | ((payload & _PAYLOAD_MASK) << (L.PAYLOAD_SHIFT - 32))
        if const_expr(Recorder.ablation != "no-store"):
            _store_shared_v2(buf.iterator + pos, t, hi)
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
        hi = Int32(tag >> 32) | ((payload & _PAYLOAD_MASK) << (L.PAYLOAD_SHIFT - 32))
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
            if const_expr(Recorder.ablation != "no-store"):
                st_lo = cutlass.select_(mine, t, st_lo)
                st_hi = cutlass.select_(mine, hi, st_hi)
            if const_expr(in_block):
                # open_block made the room; close_block writes a full staging
                pos = _advance(when, pos + 1, pos)
            else:
                if _where(when, pos == 31):
                    idx = base + lane
                    if idx < cap:
                        _store_record_word(self.trace, records + idx, _pack(st_lo, st_hi))
                    base = base + 32
                pos = _advance(when, (pos + 1) & 31, pos)
        else:
            if _where(when, (lane == 0) & (base < cap)):
                _store_record_word(self.trace, records + base, _pack(t, hi))
            base = _advance(when, base + 1, base)
        self._state = [Int32(pos), Int32(base), Int32(st_lo), Int32(st_hi)]

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
        gt1, clk1 = _edge_anchor()
        written = cutlass.min(cursor, cap)
        if (cap > 0) & (lane == 0):
            trace = self.trace
            trace[header + L.W_GT1] = gt1
            trace[header + L.W_CLK1] = clk1
            trace[header + L.W_COUNTS] = Int64(written) | (Int64(cursor - written) << 32)


# ---- segment mode: recording from code the recorder cannot be carried through ------------------
def current_block():
    """The MLIR block ops are being inserted into right now (None outside a trace)."""
    from cutlass._mlir import ir

    try:
        return ir.InsertionPoint.current.block
    except (ValueError, AttributeError):
        return None


def _emit_point():
    """Where ops are inserted now: (block, its op count, the op the insertion point is before,
    the op right before the insertion point); None outside a trace. Two equal points taken at
    different times mean nothing was emitted in between (``SegmentRecorder.timer``)."""
    from cutlass._mlir import ir

    try:
        ip = ir.InsertionPoint.current
    except (ValueError, AttributeError):
        return None
    block = ip.block
    ops = block.operations
    n = len(ops)
    ref = ip.ref_operation
    if ref is None:
        return block, n, None, ops[n - 1].operation if n else None
    ref = ref.operation
    prev = None
    for op in ops:
        if op.operation == ref:
            break
        prev = op.operation
    return block, n, ref, prev


def _same_point(a, b) -> bool:
    """``_emit_point`` a == b (MLIR handles do not compare with None); False where in doubt
    (a handle of a module already gone raises)."""
    if a is None or b is None:
        return False
    try:
        return a[0] == b[0] and a[1] == b[1] and all(
            (x is None and y is None) or (x is not None and y is not None and x == y) for x, y in zip(a[2:], b[2:]))
    except (RuntimeError, TypeError, ValueError):
        return False


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
        held = last is not None and _same_point(last[0], _emit_point())
        ret = method(self, *args, **kwargs)
        cur = rec._last_read
        # a read inside the method (cur is new), or a value still shareable at entry
        if cur is not None and (cur is not last or held):
            rec._last_read = (_emit_point(), cur[1])
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
    # Measurements only (benchmarks/fa4_cost_parts.py): "no-timer" records a constant where the
    # timer was read, to tell the reads' cost from the rest ("no-timer-instants" /
    # "no-timer-spans": for those records only); "no-store" drops the record stores (and with
    # them the reads, which the compiler then removes). Class-wide, like share_timer.
    ablation: Optional[str] = None

    def __init__(self, trace, role, timebase, invariants, smem_cursor=None, l2: str = "last", ring=None):
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
              timebase: int = L.TIMEBASE_CLOCK64, cursor: str = "gmem", l2: str = "last",
              ring: int = L.DEFAULT_RING, ring_warps: Optional[int] = None) -> "SegmentRecorder":
        """Claim this warp's slot, write the start of its header and zero its cursor.

        ``cursor``: where the cursor lives between segments. "gmem" (default): the header word
        ``W_COUNTS``, nothing else is allocated. "smem": one Int32 per warp in 128 bytes of
        static shared memory allocated here (one allocation per call site, indexed by warp):
        a segment then waits on a shared-memory load instead of a global one, which matters
        for short segments; the kernel's shared-memory budget grows by that much (plus
        alignment of the dynamic region that follows static shared memory). "ring": the "smem"
        cursor plus a ring of ``ring`` records (a power of two) per warp in static shared
        memory, for ``ring_warps`` warps (the CTA's warp count where the caller knows it at
        compile time; else 32, the most a CTA holds): records are stored there and copied to
        the slot at ``finish``, which keeps the last ``ring`` of them (class doc).

        ``l2``: the L2 policy of the record stores. "last" (evict_last, default): records stay in
        L2 until the launch ends, right for kernels that stream their inputs once (decode
        attention). "first" (evict_first): records leave L2 first, right for kernels whose
        inputs are reused through L2 (GEMM, prefill attention), where millions of pinned records
        would push that reuse out to DRAM.
        """
        if l2 not in L2_POLICY:
            raise ValueError(f"l2 must be one of {sorted(L2_POLICY)}, got {l2!r}")
        if const_expr(trace is None):
            return SegmentRecorder(None, role, timebase, None)
        if timebase not in L.TIMEBASE_NAMES:
            raise ValueError(f"unknown timebase {timebase}")
        if cursor not in CURSORS:
            raise ValueError(f"cursor must be one of {', '.join(repr(c) for c in CURSORS)}, got {cursor!r}")
        records, warps = 0, None
        if cursor == "ring":
            records = L.check_ring(ring)
            warps = ring_warps or L.MAX_CTA_WARPS
            if not 1 <= warps <= L.MAX_CTA_WARPS:
                raise ValueError(f"ring_warps must be 1..{L.MAX_CTA_WARPS}, got {ring_warps}")
            need = L.ring_smem_bytes(records, warps)
            if need > L.STATIC_SMEM_LIMIT:
                raise ValueError(f"a ring of {records} records for {warps} warps needs {need} B of static shared "
                                 f"memory, more than the {L.STATIC_SMEM_LIMIT} B a kernel may hold; choose a smaller ring")
        inv = Recorder._claim_slot(trace, role, timebase, *Recorder._begin_slot(trace, timebase), ring=records)
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
        point (``_emit_point``); ``share_timer = False`` reads every time."""
        last = self._last_read
        if self.share_timer and last is not None and _same_point(last[0], _emit_point()):
            return last[1]
        if const_expr(self.timebase == L.TIMEBASE_GLOBALTIMER):
            t = cute.arch.globaltimer()
        elif const_expr(SegmentRecorder.ablation == "no-timer"):
            t = Int64(0)
        else:
            t = cute.arch.clock64()
        self._last_read = (_emit_point(), t) if self.share_timer else None
        return t

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
        gt1, clk1 = _edge_anchor()
        kept = cutlass.min(cutlass.min(cursor, Int32(n)), cap)
        first = cursor - kept
        active = cute.arch.activemask()
        cute.arch.sync_warp(active)
        rank = Int32(cute.arch.popc(active & ((Int32(1) << lane) - 1)))
        step = Int32(cute.arch.popc(active))
        records = header + L.WARP_HEADER_WORDS
        trace = self.trace
        for i in cutlass.range(rank, kept, step, unroll=1):
            _store_record_word(trace, records + i, ring[(first + i) & (n - 1)], self._policy)
        if cap > 0:
            trace[header + L.W_GT1] = gt1
            trace[header + L.W_CLK1] = clk1
            trace[header + L.W_COUNTS] = Int64(kept) | (Int64(cursor - kept) << 32)

    @cute.jit
    def _finish(self, cursor: Int32):
        header, cap, _lane = self._inv
        gt1, clk1 = _edge_anchor()
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
            _store_record_word(trace, header + L.WARP_HEADER_WORDS + pos, word, self._policy)


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
        if t is None and const_expr(SegmentRecorder.ablation == ("no-timer-instants" if kind == L.KIND_INSTANT
                                                                   else "no-timer-spans")):
            t = Int64(0)
        if t is None:
            t = rec.timer()
        if payload is None:
            tag |= L.PAYLOAD_NONE << L.PAYLOAD_SHIFT
            word = (Int64(t) & _LO32) | Int64(tag)
        else:
            word = (Int64(t) & _LO32) | (Int64(Int32(payload) & _PAYLOAD_MASK) << L.PAYLOAD_SHIFT) | Int64(tag)
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
                if const_expr(SegmentRecorder.ablation != "no-store"):
                    rec._store_record(self._cursor + j, word)
            if self._words:
                rec._store_cursor(self._cursor + len(self._words))
        rec._open = None


# Where a Recorder's staged records wait for their store (Recorder.start)
STAGES = ("lanes", "smem")
# Recorder.ablation's values (measurements only)
ABLATIONS = (None, "no-timer", "no-store", "no-events", "no-edge")

# Where a SegmentRecorder keeps its cursor (and, "ring", its records) between segments
CURSORS = ("gmem", "smem", "ring")

# L2 policy of record stores (the createpolicy encoding CUTLASS names CacheHintSm90::EVICT_LAST).
_L2_EVICT_LAST = 0x14F0000000000000
_L2_EVICT_FIRST = 0x12F0000000000000  # CacheHintSm90::EVICT_FIRST
L2_POLICY = {"last": _L2_EVICT_LAST, "first": _L2_EVICT_FIRST}


def _store_record_word(trace: cute.Tensor, index, word: Int64, policy: int = _L2_EVICT_LAST):
    """``trace[index] = word`` as st.global with an L2 cache policy, evict_last unless told
    (``SegmentRecorder.start(l2=)`` picks evict_first for kernels that reuse their inputs
    through L2). Why evict_last: records stay in L2 until the launch ends; in kernels that stream
    their input with evict_first (decode attention) they otherwise go out to DRAM during the
    launch, between the stream's reads, which costs the kernel more than their bytes. No DSL
    store takes an L2 hint, so asm; no memory clobber: records are ordered with nothing but the
    warp's own later records."""
    from cutlass._mlir.dialects import llvm

    ptr = (trace.iterator + index).llvm_ptr
    llvm.inline_asm(None, [ptr, Int64(word).ir_value(), Int64(policy).ir_value()],
                    "st.global.L2::cache_hint.b64 [$0], $1, $2;", "l,l,l",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def _store_shared_v2(ptr, lo: Int32, hi: Int32):
    """``*ptr = lo | hi << 32`` as one st.shared.v2.b32 (shared-memory pointer)."""
    from cutlass._mlir.dialects import llvm

    llvm.inline_asm(None, [ptr.llvm_ptr, Int32(lo).ir_value(), Int32(hi).ir_value()],
                    "st.shared.v2.b32 [$0], {$1, $2};", "r,r,r",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def _clock_lo_vector(lane: Int32) -> Int32:
    """%clock read into a per-lane register (a read predicated on lane < 32, true everywhere),
    where ptxas would read a uniform one and move it (S2UR, NOP, MOV) for a per-lane store."""
    from cutlass._mlir.dialects import llvm
    from cutlass._mlir import ir

    return Int32(llvm.inline_asm(ir.IntegerType.get_signless(32), [Int32(lane).ir_value()],
                                 "{ .reg .pred p; setp.lt.u32 p, $1, 32; mov.u32 $0, 0; @p mov.u32 $0, %clock; }",
                                 "=r,r", has_side_effects=True, is_align_stack=False,
                                 asm_dialect=llvm.AsmDialect.AD_ATT))


@cute.jit
def _pack(lo: Int32, hi: Int32) -> Int64:
    return (Int64(hi) << 32) | (Int64(lo) & _LO32)


def _where(when, cond):
    """``cond`` only where the runtime condition ``when`` holds (``when=None``: ``cond``)."""
    return cond if when is None else cond & when


def _advance(when, new, old):
    """A cursor move predicated on ``when``: ``new`` where it holds (``when=None``: always)."""
    return new if when is None else cutlass.select_(when, new, old)


@cute.jit
def _edge_anchor():
    """(%globaltimer, %clock64) read together right after the global timer ticks.

    %globaltimer advances in 32 ns steps (H200), so a plain read can be up to a tick stale,
    and the first read a warp makes can be staler still (seen on the H200: decoded times
    36 ns early on median). Spinning until the value changes pins the pair to a tick edge:
    the anchor is then as precise as one loop trip (a few ns). Costs ≤ one tick per warp,
    at start and at finish only.
    """
    if const_expr(Recorder.ablation == "no-edge"):  # measurements only: one plain read
        g = cute.arch.globaltimer()
        c = cute.arch.clock64()
    else:
        g0 = cute.arch.globaltimer()
        g = cute.arch.globaltimer()
        c = cute.arch.clock64()
        while g == g0:
            g = cute.arch.globaltimer()
            c = cute.arch.clock64()
    return g, c



@cute.jit
def _cta_selection(g2: Int64, g3: Int64):
    """(linear CTA index, cluster-order index, cluster size, its slot among the recording CTAs,
    whether it records) from the
    buffer header's words 2 and 3 (first, stride, count of the CTAs that record).

    CTAs are taken in cluster order (cluster index, then rank in the cluster) and the stride
    steps over whole clusters, so a sampled CTA brings its whole cluster: a CTA records when
    its cluster's place (from ``first``, in CTAs of that order) is a multiple of the stride
    and its slot is below the count. A launch without clusters has clusters of one CTA: the
    order is then the linear CTA index, and the selection the plain first/stride/count."""
    cta_first = Int32(g2 & _LO32)
    cta_stride = Int32(g2 >> 32)
    n_cta = Int32(g3 & _LO32)
    bx, by, bz = cute.arch.block_idx()
    gx, gy, _ = cute.arch.grid_dim()
    cta = bx + gx * (by + gy * bz)
    cx, cy, cz = cute.arch.cluster_idx()
    ncx, ncy, _ = cute.arch.cluster_dim()
    size = cute.arch.cluster_size()
    rank = cute.arch.block_idx_in_cluster()
    rel = (cx + ncx * (cy + ncy * cz)) * size + rank - cta_first
    group = rel // size
    group_slot = group // cta_stride
    cta_slot = group_slot * size + rank
    return cta, rel + cta_first, size, cta_slot, (rel >= 0) & (group == group_slot * cta_stride) & (cta_slot < n_cta)


@cute.jit
def cta_records(trace: cute.Tensor) -> cutlass.Boolean:
    """Whether this CTA is one of those the buffer's header selects (CTA-uniform): the test
    each warp's slot claim makes, for fa4trace.auto.split's branch."""
    _cta, _order, _size, _slot, selected = _cta_selection(trace[2], trace[3])
    return selected


# ---- CTA lifetimes: every CTA of a kernel fa4trace.auto compiled, recording or not -------------
# Per warp: two %globaltimer reads, one header load (issued with the CTA selection's, so the
# warp waits on one L2 round trip as before) and two reductions from lane 0; between them one
# Int32 (the entry's word index) stays live across the body, nothing else.
def take_cta_start(trace: Optional[cute.Tensor]):
    """The warp's start: %globaltimer now and the load of header word 4 issued (not waited on).
    Call first thing in the kernel, then ``store_cta_start`` once the recorder's own header
    loads are issued too. None without a buffer."""
    if const_expr(trace is None):
        return None
    return cute.arch.globaltimer(), trace[L.G_LIFETIMES]


@cute.jit
def _lifetime_entry(g4: Int64) -> Int32:
    """Word index of this CTA's lifetime entry, -1 where the buffer does not time the CTA
    (header word 4: region offset | CTAs timed << 32; layout module doc)."""
    bx, by, bz = cute.arch.block_idx()
    gx, gy, _ = cute.arch.grid_dim()
    cta = bx + gx * (by + gy * bz)
    return cutlass.select_(cta < Int32(g4 >> 32), Int32(g4 & _LO32) + cta * L.LIFETIME_WORDS, Int32(-1))


@cute.jit
def _stamp(trace: cute.Tensor, index: Int32, value: Int64):
    """Lane 0: ``red.global.max.u64`` of ``value`` at word ``index`` (>= 0) of the buffer (a
    reduction: no value comes back, the warp does not wait for it)."""
    if (index >= 0) & (cute.arch.lane_idx() == 0):
        cute.arch.red((trace.iterator + index).llvm_ptr, value, op="umax", dtype="u64", sem="relaxed",
                      scope="gpu")


def store_cta_start(trace: Optional[cute.Tensor], taken) -> Optional[Int32]:
    """Write the start ``take_cta_start`` took, inverted, into the CTA's lifetime entry (the
    entry keeps the largest inverse: the earliest start of the CTA's warps). Returns the entry's
    word index (-1: not timed) for ``stamp_cta_end``."""
    if const_expr(trace is None):
        return None
    t, g4 = taken
    entry = _lifetime_entry(g4)
    _stamp(trace, entry + L.LIFE_START_NOT, t ^ Int64(-1))
    return entry


def stamp_cta_end(trace: Optional[cute.Tensor], entry):
    """This warp leaves the kernel: %globaltimer into the CTA's lifetime entry (the entry keeps
    the latest end of its warps). ``entry``: what ``store_cta_start`` returned."""
    if const_expr(trace is not None):
        t = cute.arch.globaltimer()
        _stamp(trace, cutlass.select_(entry >= 0, entry + L.LIFE_END, Int32(-1)), t)
