"""`fa4trace check`: can fa4trace be trusted on this GPU? The plan, the run and the output folder.

The GPU work lives in ``fa4trace.check.rows`` (one small function per check), the rows, the
verdict rules and the reports in ``fa4trace.check.report``, the guard words and the Perfetto
slice count in ``fa4trace.check.probes``; this module decides which checks run here, runs each
so that one failing check never stops the others, and writes the report into the output folder.

Exit codes of the command: 0 usable, 3 usable with warnings, 1 not usable, 2 no CUDA GPU here
(or bad arguments, as for every fa4trace command).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..format.errors import DeviceUnavailable, Fa4traceError, WouldOverwrite
from ..format.shape import Shape
from .report import GROUPS, Report, Row, failed

EXIT_NO_GPU = 2
NO_GPU_MESSAGE = "no CUDA GPU here: fa4trace check needs one"
REPORT_NAME = "check.json"
# What a check writes into its folder; an existing one of these is not replaced unless forced.
WRITES = ("*.parquet", "*.pftrace", REPORT_NAME, "recorder_cost.json")


# ---- the output folder -----------------------------------------------------------------------
def prepare_out_dir(path, force: bool, *, create: bool = True) -> Path:
    """The folder the bundles go to: created if missing (unless ``create`` is False: only
    checked); one holding a file a check writes (bundles, Perfetto traces, check.json) is
    refused unless ``force``."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise Fa4traceError(f"{p} exists and is not a folder")
    if p.is_dir() and not force:
        for pattern in WRITES:
            hit = sorted(p.glob(pattern))
            if hit:
                raise WouldOverwrite(f"{hit[0]} exists; refusing to overwrite the bundles in {p}")
    if create:
        p.mkdir(parents=True, exist_ok=True)
    return p


# ---- running ----------------------------------------------------------------------------------
class NoGpu(DeviceUnavailable):
    """No CUDA GPU (or no torch with CUDA) here: nothing to check."""


STEP_FAILED = "a check stopped with an error: rerun it; if it repeats, report it with the check folder attached"


def run_step(group: str, name: str, fn, ctx, log=None) -> list[Row]:
    """Run one check function; whatever it raises becomes one fail row, so the rest still run."""
    if log:
        log(f"checking {name} ...")
    try:
        rows = list(fn(ctx))
    except ImportError as e:  # an environment without a package the check imports: say which
        return [failed(group, name, e, missing_module(e))]
    except Exception as e:  # noqa: BLE001 - the point: one failing check never stops the others
        return [failed(group, name, e, STEP_FAILED)]
    return rows


def missing_module(e: ImportError) -> str:
    """What to do where a check could not import a module: install it; `pip check` lists what
    else the environment lacks of fa4trace's dependencies."""
    what = f"the module {e.name}" if e.name else "a module"
    return (f"{what} is not installed here: install the package that provides it (`pip check` lists what "
            "fa4trace needs that is missing)")


def plan(ctx, route: dict) -> tuple[list[Row], list]:
    """(rows known without running anything, steps to run: (group, name, function of ctx)).

    Timer, recorder and what an event costs per recorder (``recorder_cost``) always; our decode
    kernel on Hopper (each schedule; --quick: ping-pong); FA4's paths for the architecture
    (SM100: ping-pong and base; SM90: FA3's; --quick: the first), the first also timed for the
    cost of tracing."""
    from functools import partial

    from ..kernels.decode_spec import SCHEDULES
    from . import rows as R
    from .recorder_cost import recorder_cost_rows

    rows = R.route_rows(ctx, route)
    steps = []
    if route["kernels"] == "none":
        rows += [Row(g, n, "skip", "", "no kernels to run (see the kernels row)")
                 for g, n in (("timer", "calibration kernel"), ("recorder", "marker kernel"))]
    else:
        steps += [("timer", "timer calibration", R.timer_rows), ("recorder", "recorder", R.recorder_rows)]
        steps.append(("cost", "recorder cost", recorder_cost_rows))  # what an event costs, per recorder
    if ctx.major != 9:
        rows.append(Row("decode", "ours", "skip", "", f"no decode kernel for this architecture "
                                                       f"({ctx.gpu.get('arch')}; ours is Hopper's, sm_90a)"))
    elif route["kernels"] != "none":
        for s in (("pingpong",) if ctx.quick else SCHEDULES):
            steps.append(("decode", f"ours {s}", partial(R.decode_rows, schedule=s)))
    fa4 = R.fa4_schedules(ctx.major)
    if not fa4:
        rows.append(Row("fa4", "FA4", "skip", "", "FA4 tracing supports SM90 (H100/H200) and SM100 (B200)"))
    elif route["fa4"] == "none":
        rows.append(R.fa4_missing_row(ctx))
    else:
        for i, s in enumerate(fa4[:1] if ctx.quick else fa4):
            steps.append(("fa4", f"FA4 {s}", partial(R.fa4_rows, schedule=s, cost=i == 0)))
    return rows, steps


def run_checks(out_dir, *, build=None, fa4_build=None, quick: bool = False, force: bool = False, log=None,
               seed: int = 0, shape: Optional[Shape] = None) -> Report:
    """Detect the GPU and the route, run every check it can (a failing one becomes a fail row,
    the others still run), write the bundles and check.json into ``out_dir``, return the
    Report. Raises NoGpu where there is no CUDA GPU. ``shape``: the attention rows' problem
    (the overlap ranges hold for the default, ``rows.DEFAULT_SHAPE``: d128 16:1 sk 32768 b 1)."""
    from . import rows as R

    gpu = R.detect_gpu()
    if gpu is None:
        raise NoGpu(NO_GPU_MESSAGE)
    out = prepare_out_dir(out_dir, force)
    ctx = R.Context(out=out, gpu=gpu, build=build, fa4_build=fa4_build, quick=quick, force=force, seed=seed,
                    shape=shape or R.DEFAULT_SHAPE)
    route = R.detect_route(ctx)
    rows, steps = plan(ctx, route)
    for group, name, fn in steps:
        rows += run_step(group, name, fn, ctx, log)
    rows.sort(key=lambda r: GROUPS.index(r.group))
    files = [f for f in dict.fromkeys(ctx.files) if Path(f).exists()]
    report = Report(gpu=gpu, route=route, rows=rows, out_dir=str(out), files=files,
                    options={"quick": quick, "build": build, "fa4_build": fa4_build, "seed": seed,
                             "shape": ctx.shape.config()})
    dest = out / REPORT_NAME
    report.files.append(str(dest))
    dest.write_text(report.to_json() + "\n")
    return report
