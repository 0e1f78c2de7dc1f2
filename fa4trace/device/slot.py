"""A warp's slot in the trace buffer: which CTAs and warps record, and the claim of the slot.

Both recorders start a warp the same way (``fa4trace.format.layout``): take the start anchor,
load the buffer header's words 1..3 (``begin_slot``), then from them find the warp's slot, if
its CTA and warp record, and write the start of its warp header (``claim_slot``). ``Recorder``
may split the two to let the warp's first work go ahead of the header loads
(``Recorder.start(settle=False)``). fa4trace.auto's CTA split asks the same question per CTA
(``cta_records``).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from ..format import layout as L
from . import clock
from .store import LO32


@cute.jit
def begin_slot(trace: cute.Tensor, timebase: cutlass.Constexpr):
    """The start anchor, then the header loads (issued; nothing here waits for them):
    (globaltimer, clock64, header words 1, 2, 3), what ``claim_slot`` takes after ``role`` and
    ``timebase``."""
    gt0, clk0 = clock.edge_anchor()
    return gt0, clk0, trace[1], trace[2], trace[3]


@cute.jit
def claim_slot(trace: cute.Tensor, role, timebase: cutlass.Constexpr, gt0, clk0, g1, g2, g3,
               ring: cutlass.Constexpr = 0):
    """This warp's slot from the header words; writes the start of its warp header
    (``ring``: records of the warp's shared-memory ring, 0 without one; header word 2).
    Returns (word index of the warp header, capacity in records (0: the warp does not record),
    lane)."""
    slot_words = Int32(g1 & LO32)
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
    cta_first = Int32(g2 & LO32)
    cta_stride = Int32(g2 >> 32)
    n_cta = Int32(g3 & LO32)
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
