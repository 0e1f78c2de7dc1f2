"""Per-warp event recorder for CuTe DSL kernels.

Usage inside a ``@cute.kernel`` (every call from warp-uniform code, all 32 lanes):

    rec = Recorder.start(trace, role=ROLE.CONSUMER)   # trace: Optional[cute.Tensor] (Int64, 1-D)
    for i in cutlass.range(n_blocks):
        rec.begin(EV.SOFTMAX, i)
        ...
        rec.end(EV.SOFTMAX, i)
    rec.finish()

``trace`` is the buffer laid out by :mod:`fa4trace.layout` (host: ``BufferSpec.new_buffer``).
Pass ``None`` and every call compiles to nothing: the PTX equals that of the kernel without
the calls (tested). Event ids and the timebase are compile-time constants.

How a record gets to memory (``staged=True``, the default): all lanes compute the 8-byte
record, lane ``cursor % 32`` keeps it in a register, and every 32nd event the whole warp
writes the 32 staged records with one coalesced 256-byte store. Dense markers then cost a
timer read and a few ALU ops each, not a lone 8-byte store each (which is what makes naive
recorders store-bound, DESIGN §2). ``staged=False`` writes each record from lane 0 at once:
use it where events are recorded from single-lane code (inside ``elect_one``).

Every store is bounds-checked against the warp's slot: a full slot keeps counting, so the
header tells how many records were dropped, and never writes past its slot.

The recorder is carried through ``cutlass.range`` loops and dynamic ``if``s as a DSL value
(``__extract_mlir_values__``): its cursor and staging register are loop-carried, nothing
else changes after ``start``.
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, const_expr

from .. import layout as L

_LO32 = 0xFFFFFFFF
_PAYLOAD_MASK = (1 << L.PAYLOAD_BITS) - 1


class Recorder:
    def __init__(self, trace, role, timebase, staged, state, invariants):
        # Static (Python) configuration: never changes, copied as is through loops.
        self.trace = trace
        self.role = role
        self.timebase = timebase
        self.staged = staged
        # Loop-carried DSL values: [cursor, stash] (empty when tracing is off).
        self._state = state
        # DSL values fixed at start (defined before any loop, so they dominate its body):
        # slot index of the warp header, capacity (0 = this warp does not record), lane.
        self._inv = invariants

    # ---- DSL value protocol: lets cutlass.range / dynamic if carry the recorder ----------
    def __extract_mlir_values__(self):
        vals = []
        for v in self._state:
            vals += cutlass.extract_mlir_values(v)
        return vals

    def __new_from_mlir_values__(self, values):
        state = [Int32(values[0]), Int64(values[1])] if self._state else []
        return Recorder(self.trace, self.role, self.timebase, self.staged, state, self._inv)

    @property
    def enabled(self) -> bool:
        return self.trace is not None

    # ---- creation -----------------------------------------------------------------------
    @staticmethod
    def start(trace: Optional[cute.Tensor], role: int = 0, *,
              timebase: int = L.TIMEBASE_CLOCK64, staged: bool = True) -> "Recorder":
        """Claim this warp's slot and write the start of its header. Call once per warp."""
        if const_expr(trace is None):
            return Recorder(None, role, timebase, staged, [], None)
        if timebase not in L.TIMEBASE_NAMES:
            raise ValueError(f"unknown timebase {timebase}")
        return Recorder._start(trace, role, timebase, staged)

    @staticmethod
    @cute.jit
    def _start(trace: cute.Tensor, role, timebase: cutlass.Constexpr, staged: cutlass.Constexpr):
        g1 = trace[1]
        g2 = trace[2]
        g3 = trace[3]
        slot_words = Int32(g1 & _LO32)
        warps = Int32(g1 >> 32)
        cta_first = Int32(g2 & _LO32)
        cta_stride = Int32(g2 >> 32)
        n_cta = Int32(g3 & _LO32)

        bx, by, bz = cute.arch.block_idx()
        gx, gy, _ = cute.arch.grid_dim()
        cta = bx + gx * (by + gy * bz)
        warp = cute.arch.warp_idx()
        lane = cute.arch.lane_idx()

        rel = cta - cta_first
        cta_slot = rel // cta_stride
        active = (rel >= 0) & (rel == cta_slot * cta_stride) & (cta_slot < n_cta) & (warp < warps)
        header = L.GLOBAL_HEADER_WORDS + (cta_slot * warps + warp) * slot_words
        header = cutlass.select_(active, header, Int32(0))
        cap = cutlass.select_(active, slot_words - L.WARP_HEADER_WORDS, Int32(0))

        gt0 = cute.arch.globaltimer()
        clk0 = cute.arch.clock64()
        if active & (lane == 0):
            w0 = L.WARP_MAGIC | (L.FORMAT_VERSION << 32) | (timebase << 40)
            trace[header + L.W_MAGIC] = Int64(w0) | (Int64(role) << 48)
            trace[header + L.W_IDS] = Int64(cute.arch.smid()) | (Int64(cta) << 32)
            trace[header + L.W_WARP] = Int64(warp)
            trace[header + L.W_GT0] = gt0
            trace[header + L.W_CLK0] = clk0
        return Recorder(trace, role, timebase, staged, [Int32(0), Int64(0)], (header, cap, lane))

    # ---- events -------------------------------------------------------------------------
    def begin(self, event: int, payload=None):
        """Start of a span; pair it with ``end`` of the same event and payload."""
        self._record(event, L.KIND_BEGIN, payload)

    def end(self, event: int, payload=None):
        self._record(event, L.KIND_END, payload)

    def instant(self, event: int, payload=None):
        self._record(event, L.KIND_INSTANT, payload)

    def _record(self, event: int, kind: int, payload):
        if const_expr(self.trace is not None):
            tag = L.record_tag(int(event), kind)
            if const_expr(payload is None):
                tag |= L.PAYLOAD_NONE << L.PAYLOAD_SHIFT
                self._emit(tag, Int32(0))
            else:
                self._emit(tag, Int32(payload))

    @cute.jit
    def _emit(self, tag: cutlass.Constexpr, payload: Int32):
        header, cap, lane = self._inv
        cursor, stash = self._state
        if const_expr(self.timebase == L.TIMEBASE_GLOBALTIMER):
            t = cute.arch.globaltimer()
        else:
            t = cute.arch.clock64()
        word = (t & _LO32) | (Int64(payload & _PAYLOAD_MASK) << L.PAYLOAD_SHIFT) | Int64(tag)
        records = header + L.WARP_HEADER_WORDS
        if const_expr(self.staged):
            pos = cursor & 31
            stash = cutlass.select_(lane == pos, word, stash)
            if pos == 31:
                idx = cursor - 31 + lane
                if idx < cap:
                    self.trace[records + idx] = stash
        else:
            if (lane == 0) & (cursor < cap):
                self.trace[records + cursor] = word
        self._state = [cursor + 1, Int64(stash)]

    # ---- end of the warp's work ---------------------------------------------------------
    def finish(self):
        """Flush staged records and close the header (end anchors, written/dropped counts)."""
        if const_expr(self.trace is not None):
            self._finish()

    @cute.jit
    def _finish(self):
        header, cap, lane = self._inv
        cursor, stash = self._state
        if const_expr(self.staged):
            pos = cursor & 31
            idx = cursor - pos + lane
            if (lane < pos) & (idx < cap):
                self.trace[header + L.WARP_HEADER_WORDS + idx] = stash
        gt1 = cute.arch.globaltimer()
        clk1 = cute.arch.clock64()
        written = cutlass.min(cursor, cap)
        if (cap > 0) & (lane == 0):
            trace = self.trace
            trace[header + L.W_GT1] = gt1
            trace[header + L.W_CLK1] = clk1
            trace[header + L.W_COUNTS] = Int64(written) | (Int64(cursor - written) << 32)
