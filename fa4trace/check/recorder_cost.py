"""`fa4trace check`'s recorder-cost rows: what one event of each recorder costs its warp on this
GPU, and whether subtracting it gives back a known answer.

Per recorder (``--quick``: ours, ``recorder_smem``, and instrument()'s default, ``segment_smem``):
the calibration (``fa4trace.probes.known_answer.calibrate``: the empty span's offset, the cost
of one event, the lag offset), then a 5 µs known-answer span with 7 events inside, compensated
with it (``fa4trace.check.known_answer.span_case``) against the untraced twin. The row is ok
where the compensated span lies within max(2%, 20 ns) of the twin's, and warns otherwise (the
compensated figures of that recorder are not to be trusted here). The calibrations go to
``recorder_cost.json`` in the check's folder: ``fa4trace summary --compensate --calibration``
reads it.
"""

from __future__ import annotations

import json

from .report import Row, failed

QUICK_RECORDERS = ("recorder_smem", "segment_smem")  # our decode kernel's recorder, instrument()'s default
CHECK_NS = 5000  # the known-answer span's length (the calibration's are 2 µs with 0 and 15 events inside)
CHECK_DENSITY = 8  # sub-spins: 7 events inside it
NEXT = "compensated figures of this recorder are not to be trusted on this GPU: read the raw ones (summary without " \
       "--compensate); report it with the check folder attached"


def recorder_cost_rows(ctx) -> list[Row]:
    """One row per recorder (module doc); writes ``recorder_cost.json`` where any calibrated."""
    from ..analysis import compensate as C
    from ..kernels.known_answer_spec import RECORDERS
    from ..probes.known_answer import calibrate
    from .known_answer import TARGET_NS, TARGET_REL, span_case

    rows, cals = [], {}
    for rec in QUICK_RECORDERS if ctx.quick else RECORDERS:
        name = f"recorder cost: {rec}"
        try:
            cal = C.Calibration.from_dict(calibrate(rec, build=ctx.build))
            cycles = int(CHECK_NS * (cal.clock_ghz or 1.98))
            case = span_case(rec, cal, cycles=cycles, density=CHECK_DENSITY, build=ctx.build)
        except Exception as e:  # noqa: BLE001 - every failure becomes a row
            rows.append(failed("cost", name, e, "check the route row (an AOT build made before the known-answer "
                                                "kernels lacks them: rebuild it); " + NEXT))
            continue
        cals[rec] = cal
        d = cal.to_dict()
        rows.append(Row(
            "cost", name, "ok" if case["within"] else "warn",
            f"offset {d['offset_ns']:.1f} ns, {d['event_ns']:.1f} ns/event; span {case['comp_ns']:.0f} ns "
            f"compensated (raw {case['raw_ns']:.0f}) vs {case['truth_ns']:.0f} untraced",
            f"known-answer span, {CHECK_DENSITY - 1} events inside; ok within max({100 * TARGET_REL:.0f}%, "
            f"{TARGET_NS:.0f} ns)", NEXT, {"calibration": d, "span": case}))
    if cals:
        path = ctx.path(C.FILE)
        path.write_text(json.dumps({k: v.to_dict() for k, v in cals.items()}, indent=1, sort_keys=True) + "\n")
    return rows
