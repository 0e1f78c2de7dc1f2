"""Record the calibration kernel (``fa4trace.kernels.calibration``) and check the timers with
it: the tick of %globaltimer, and where each decoded sample time lies against the globaltimer
reads around it.
"""

from __future__ import annotations

import numpy as np

from ..run.gpu import require_cuda
from ..run.record import TracedLaunch, record
from ..trace.bundle import Trace


# ---- the calibration kernel ------------------------------------------------------------------
def record_calibration(*, timebase: str = "clock64", n_ctas: int = 264, samples: int = 48,
                       n_ticks: int = 64, spin: int = 4000, build=None) -> tuple[Trace, dict]:
    """Run the calibration kernel; return its trace and the timer checks (tick, agreement)."""
    torch = require_cuda()
    from ..run import loader

    kern = loader.load("calibration", build=build, timebase=timebase)
    fn, how = kern.fn, kern.how
    warps = 4
    n_warps = n_ctas * warps
    truth = torch.zeros(n_warps * samples * 2, dtype=torch.int64, device="cuda")
    ticks = torch.zeros(n_warps * n_ticks, dtype=torch.int64, device="cuda")
    launch = TracedLaunch(
        kernel=f"calibration_{timebase}", grid_ctas=n_ctas, warps_per_cta=warps,
        run=lambda tr: fn(truth, ticks, tr, n_ctas, samples, n_ticks, spin),
        grid=(n_ctas, 1, 1), block=(32 * warps, 1, 1), capacity=2 * samples + 8, extra={"how": how})
    trace = record([launch], kernel=f"calibration_{timebase}",
                   config={"timebase": timebase, "n_ctas": n_ctas, "samples": samples, "spin_cycles": spin})
    checks = calibration_checks(trace, truth.cpu().numpy().reshape(n_warps, samples, 2),
                                ticks.cpu().numpy().reshape(n_warps, n_ticks), warps)
    info = trace.info
    trace.meta["clock"] = dict(info.clock or {}, globaltimer_tick_ns=checks["tick_ns"],
                               clock_ghz_median=info.launches[0].clock_ghz_median)
    trace.meta["calibration"] = checks
    return trace, checks


# How far a decoded time may fall outside its bracket widened by one tick and still count as
# "within one tick": the anchors that turn cycles into ns are (globaltimer, clock64) pairs
# caught at a timer edge, each as precise as one trip of the spin loop that catches it (a few
# ns, device.clock.edge_anchor); what the H200 showed is in docs/recorder.md ("Times").
ANCHOR_SLACK_NS = 8


def calibration_checks(trace: Trace, truth: np.ndarray, ticks: np.ndarray, warps_per_cta: int) -> dict:
    """Tick of %globaltimer; where each decoded sample time lies against its bracket.

    truth[w, k] = (globaltimer read just before the event, just after). The event happened
    in [before, after + tick); ``outside_ns`` is how far a decoded time falls outside that
    interval widened by one tick on each side (0 = within one tick). A warp is within one tick
    when none of its samples is more than ANCHOR_SLACK_NS outside (``outside_ns_max`` reports
    the largest miss as is). ``sm_skew_ns``: how far apart the SMs' median errors are (max -
    min over SMs): events on different SMs share one time axis only as well as that.
    """
    import pyarrow.compute as pc

    steps = np.diff(ticks, axis=1)
    pos = steps[steps > 0]
    tick = int(pos.min()) if pos.size else 32
    cal = trace.events.filter(pc.equal(trace.events["name"].cast("string"), "CALIB"))
    gw = cal["cta"].to_numpy().astype(np.int64) * warps_per_cta + cal["warp"].to_numpy()
    k = cal["iter"].to_numpy()
    info = trace.info
    t_abs = cal["start_ns"].to_numpy() + info.t0_globaltimer_ns + info.launches[0].t0_offset_ns
    before, after = truth[gw, k, 0], truth[gw, k, 1]
    lo, hi = before - tick, after + 2 * tick
    outside = np.maximum(lo - t_abs, 0) + np.maximum(t_abs - hi, 0)
    per_warp = np.zeros(truth.shape[0])
    np.maximum.at(per_warp, gw, outside)
    mid = (before + after + tick) / 2  # centre of the interval the event lies in
    err = t_abs - mid
    sm = cal["sm"].to_numpy().astype(np.int64)
    sm_median = [float(np.median(err[sm == s])) for s in np.unique(sm)]
    return {
        "tick_ns": tick,
        "repeat_fraction": float((steps == 0).mean()) if steps.size else None,
        "samples": int(t_abs.size),
        "bracket_ns_median": float(np.median(after - before)) if t_abs.size else None,
        "err_vs_bracket_mid_ns_median": float(np.median(err)) if err.size else None,
        "err_vs_bracket_mid_ns_p99_abs": float(np.percentile(np.abs(err), 99)) if err.size else None,
        "outside_ns_max": float(outside.max()) if outside.size else None,
        "warps_within_one_tick": int((per_warp <= ANCHOR_SLACK_NS).sum()),
        "warps": int(truth.shape[0]),
        "sms": len(sm_median),
        "sm_skew_ns": float(max(sm_median) - min(sm_median)) if sm_median else None,
    }
