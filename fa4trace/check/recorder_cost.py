"""`fa4trace check`'s recorder-cost rows: what one event of each recorder costs its warp on this
GPU, and whether subtracting it gives back a known answer.

Per recorder (``--quick``: ours, ``recorder_smem``, and instrument()'s default, ``segment_smem``):
the calibration (``fa4trace.probes.known_answer.calibrate``: the empty span's offset, the cost
of one event, its costs on a warp's way to a fill and to a wait, the lag offset), then, compensated
with it against the untraced twin, a 5 µs known-answer span with 7 events inside
(``fa4trace.check.known_answer.span_case``) and the wait of a consumer that a producer releases
after 2.5 µs with 11 events on its way (``handoff_case``, the round's barrier recorded, pooled
over its set lengths). The row is ok where both lie within max(2%, 20 ns) of the twin's, and
warns otherwise, naming which missed (the compensated figures of that kind are not to be
trusted here). The calibrations go to
``recorder_cost.json`` in the check's folder: ``fa4trace summary --compensate --calibration``
reads it.
"""

from __future__ import annotations

import json

from .report import Row, failed

QUICK_RECORDERS = ("recorder_smem", "segment_smem")  # our decode kernel's recorder, instrument()'s default
CHECK_NS = 5000  # the known-answer span's length (the calibration's: 2 µs, 0 to 31 events inside)
CHECK_DENSITY = 8  # sub-spins: 7 events inside it
WAIT_NS = 2500  # the producer's spin before it releases the waiting consumer (the calibration's: 3 µs)
WAIT_DENSITY = 12  # its sub-spins: 11 events on its way to the fill
NEXT = "compensated {what} of this recorder are not to be trusted on this GPU: read the raw ones (summary " \
       "without --compensate); report it with the check folder attached"


def recorder_cost_rows(ctx) -> list[Row]:
    """One row per recorder (module doc); writes ``recorder_cost.json`` where any calibrated."""
    from ..analysis import compensate as C
    from ..kernels.known_answer_spec import RECORDERS
    from ..probes.known_answer import calibrate
    from .known_answer import TARGET_NS, TARGET_REL, handoff_case, span_case

    rows, cals = [], {}
    for rec in QUICK_RECORDERS if ctx.quick else RECORDERS:
        name = f"recorder cost: {rec}"
        try:
            cal = C.Calibration.from_dict(calibrate(rec, build=ctx.build))
            ghz = cal.clock_ghz or 1.98
            case = span_case(rec, cal, cycles=int(CHECK_NS * ghz), density=CHECK_DENSITY, build=ctx.build)
            wait = handoff_case(rec, cal, cycles=int(WAIT_NS * ghz), density=WAIT_DENSITY, build=ctx.build)[0]
        except Exception as e:  # noqa: BLE001 - every failure becomes a row
            rows.append(failed("cost", name, e, "check the route row (an AOT build made before the known-answer "
                                                "kernels lacks them: rebuild it); " + NEXT.format(what="figures")))
            continue
        cals[rec] = cal
        d = cal.to_dict()
        missed = [k for k, v in (("span", case), ("wait", wait)) if not v["within"]]
        path = ("" if d.get("fill_event_ns") is None else
                f" ({d['fill_event_ns']:.1f} ns on the way to a fill, {d['wait_event_ns']:.1f} ns to a wait)")
        rows.append(Row(
            "cost", name, "warn" if missed else "ok",
            f"offset {d['offset_ns']:.1f} ns, {d['event_ns']:.1f} ns/event{path}; span {case['comp_ns']:.0f} ns "
            f"compensated (raw {case['raw_ns']:.0f}) vs {case['truth_ns']:.0f} untraced; wait {wait['comp_ns']:.0f} "
            f"(raw {wait['raw_ns']:.0f}) vs {wait['truth_ns']:.0f}",
            f"known-answer span, {CHECK_DENSITY - 1} events inside, and wait, {WAIT_DENSITY - 1} producer events; "
            f"ok within max({100 * TARGET_REL:.0f}%, {TARGET_NS:.0f} ns)"
            + (f"; missed: {' and '.join(missed)}" if missed else ""),
            NEXT.format(what=" and ".join(f"{k}s" for k in missed) or "figures"),
            {"calibration": d, "span": case, "wait": wait}))
    if cals:
        path = ctx.path(C.FILE)
        path.write_text(json.dumps({k: v.to_dict() for k, v in cals.items()}, indent=1, sort_keys=True) + "\n")
    return rows
