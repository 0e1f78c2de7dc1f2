"""How a record reaches memory: the 8-byte word's packing and the stores both recorders use.

``Recorder`` (hand-placed events, ``recorder.py``) and ``SegmentRecorder`` (fa4trace.instrument's
events, ``segment.py``) write the same records into the same buffer (``fa4trace.format.layout``);
the stores they share live here, with the L2 policy the records are stored under.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32, Int64

from ..format import layout as L

# The low 32 bits of a word (a record's timer field, the header's packed counts).
LO32 = 0xFFFFFFFF
# A record's payload field, before it is shifted into place (layout.PAYLOAD_SHIFT).
PAYLOAD_MASK = (1 << L.PAYLOAD_BITS) - 1

# L2 policy of record stores (the createpolicy encoding CUTLASS names CacheHintSm90::EVICT_LAST).
L2_EVICT_LAST = 0x14F0000000000000
L2_EVICT_FIRST = 0x12F0000000000000  # CacheHintSm90::EVICT_FIRST
# ``SegmentRecorder.start(l2=)``'s names of them
L2_POLICY = {"last": L2_EVICT_LAST, "first": L2_EVICT_FIRST}


def store_record_word(trace: cute.Tensor, index, word: Int64, policy: int = L2_EVICT_LAST):
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


def store_shared_v2(ptr, lo: Int32, hi: Int32):
    """``*ptr = lo | hi << 32`` as one st.shared.v2.b32 (shared-memory pointer): a record staged
    in shared memory by its two halves, with no 64-bit pack first."""
    from cutlass._mlir.dialects import llvm

    llvm.inline_asm(None, [ptr.llvm_ptr, Int32(lo).ir_value(), Int32(hi).ir_value()],
                    "st.shared.v2.b32 [$0], {$1, $2};", "r,r,r",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@cute.jit
def pack(lo: Int32, hi: Int32) -> Int64:
    """The 8-byte record of its low and high 32-bit halves."""
    return (Int64(hi) << 32) | (Int64(lo) & LO32)
