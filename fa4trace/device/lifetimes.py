"""CTA lifetimes: when every CTA of a kernel fa4trace.auto compiled began and ended, recording or not.

Each warp stamps its start and its end into its CTA's entry of the buffer's lifetime region
(``fa4trace.format.layout``: header word 4 says where it is and how many CTAs it times); the
entry keeps the earliest start and the latest end of the CTA's warps. Per warp: two
%globaltimer reads, one header load (issued with the CTA selection's, so the warp waits on one
L2 round trip as before) and two reductions from lane 0; between them one Int32 (the entry's
word index) stays live across the body, nothing else.

    taken = take_cta_start(trace)          # first thing in the kernel
    ...                                    # (the recorder's own header loads issued)
    entry = store_cta_start(trace, taken)
    ...                                    # the kernel's body
    stamp_cta_end(trace, entry)            # where the warp leaves the kernel

``trace=None`` compiles to nothing.
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, const_expr

from ..format import layout as L
from .store import LO32


def take_cta_start(trace: Optional[cute.Tensor]):
    """The warp's start: %globaltimer now and the load of header word 4 issued (not waited on).
    Call first thing in the kernel, then ``store_cta_start`` once the recorder's own header
    loads are issued too. None without a buffer."""
    if const_expr(trace is None):
        return None
    return cute.arch.globaltimer(), trace[L.G_LIFETIMES]


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


@cute.jit
def _lifetime_entry(g4: Int64) -> Int32:
    """Word index of this CTA's lifetime entry, -1 where the buffer does not time the CTA
    (header word 4: region offset | CTAs timed << 32; layout module doc)."""
    bx, by, bz = cute.arch.block_idx()
    gx, gy, _ = cute.arch.grid_dim()
    cta = bx + gx * (by + gy * bz)
    return cutlass.select_(cta < Int32(g4 >> 32), Int32(g4 & LO32) + cta * L.LIFETIME_WORDS, Int32(-1))


@cute.jit
def _stamp(trace: cute.Tensor, index: Int32, value: Int64):
    """Lane 0: ``red.global.max.u64`` of ``value`` at word ``index`` (>= 0) of the buffer (a
    reduction: no value comes back, the warp does not wait for it)."""
    if (index >= 0) & (cute.arch.lane_idx() == 0):
        cute.arch.red((trace.iterator + index).llvm_ptr, value, op="umax", dtype="u64", sem="relaxed",
                      scope="gpu")
