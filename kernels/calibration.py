"""Timer calibration kernel: checks the recorder's clocks against %globaltimer on the GPU.

Per warp:
1. ``ticks``: ``n_ticks`` back-to-back %globaltimer reads (lane 0 stores them) — the host
   reads the timer's tick (32 ns on H200) as the smallest positive step.
2. ``samples`` times: spin ``spin`` cycles, read %globaltimer, record ``instant(CALIB, k)``
   through the recorder, read %globaltimer again; both reads go to ``truth`` — the host
   checks that the decoder's time for sample k lies within one tick of that bracket.

Compiled in both recorder timebases (clock64 per event, globaltimer per event) so the GPU
test compares them on the same kernel. The clock64 build re-anchors every ANCHOR_EVERY
samples (``Recorder.anchor``): measured on the H200, one pair of anchors per 100 µs warp left
up to a third of the warps a tick (32 ns) off mid-life, because the SM clock drifts.
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from fa4trace.device import Recorder
from fa4trace.format import layout as L
from fa4trace.format.vocab import EV, ROLE

WARPS_PER_CTA = 4
ANCHOR_EVERY = 8  # samples between Recorder.anchor() calls (~16 µs at the default spin)


class Calibration:
    def __init__(self, timebase: int = L.TIMEBASE_CLOCK64):
        if timebase not in L.TIMEBASE_NAMES:
            raise ValueError(f"unknown timebase {timebase}")
        self.timebase = timebase
        self.threads = 32 * WARPS_PER_CTA

    @cute.jit
    def __call__(self, truth: cute.Tensor, ticks: cute.Tensor, trace: Optional[cute.Tensor],
                 n_ctas: Int32, samples: Int32, n_ticks: Int32, spin: Int32):
        self.kernel(truth, ticks, trace, samples, n_ticks, spin).launch(
            grid=(n_ctas, 1, 1), block=(self.threads, 1, 1))

    @cute.kernel
    def kernel(self, truth: cute.Tensor, ticks: cute.Tensor, trace: Optional[cute.Tensor],
               samples: Int32, n_ticks: Int32, spin: Int32):
        bid, _, _ = cute.arch.block_idx()
        warp = cute.arch.warp_idx()
        lane = cute.arch.lane_idx()
        gwarp = bid * WARPS_PER_CTA + warp
        rec = Recorder.start(trace, ROLE.CALIBRATION, timebase=self.timebase)

        for i in cutlass.range(n_ticks, unroll=1):
            t = cute.arch.globaltimer()
            if lane == 0:
                ticks[gwarp * n_ticks + i] = t

        for k in cutlass.range(samples, unroll=1):
            t_end = cute.arch.clock64() + Int64(spin)
            while cute.arch.clock64() < t_end:
                pass
            if k % ANCHOR_EVERY == ANCHOR_EVERY - 1:
                rec.anchor()  # the SM clock drifts: re-tie it to the global timer now and then
            g_before = cute.arch.globaltimer()
            rec.instant(EV.CALIB, k)
            g_after = cute.arch.globaltimer()
            if lane == 0:
                truth[(gwarp * samples + k) * 2] = g_before
                truth[(gwarp * samples + k) * 2 + 1] = g_after
        rec.finish()


def aot_variants(arch: str):
    from fa4trace.format.entry import Entry

    def thunk(tb):
        def compile_():
            i64 = lambda: cute.runtime.make_fake_compact_tensor(cutlass.Int64, (cute.sym_int(),))  # noqa: E731
            return cute.compile(Calibration(tb), i64(), i64(), i64(), Int32(1), Int32(1), Int32(1), Int32(1),
                                options="--enable-tvm-ffi")
        return compile_

    return [(f"calibration_{L.TIMEBASE_NAMES[tb]}", thunk(tb),
             Entry(f"calibration_{L.TIMEBASE_NAMES[tb]}", "calibration",
                   {"timebase": L.TIMEBASE_NAMES[tb], "warps_per_cta": WARPS_PER_CTA, "arch": arch}))
            for tb in L.TIMEBASE_NAMES]
