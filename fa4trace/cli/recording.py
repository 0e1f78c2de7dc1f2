"""`fa4trace record`, `build` and `check`: run a kernel on this machine's GPU with tracing on and
write its bundle (our decode attention, FlashAttention-4, the calibration and marker kernels,
or any CuTe DSL kernel a script compiles), build fa4trace's kernels ahead of time, and check
whether fa4trace can be trusted on this GPU.

Every option is checked, in one line, before anything looks for a GPU or a package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from ..format.errors import BadOption, Fa4traceError, MissingDependency, WouldOverwrite
from ..format.options import Placement, Sampling
from ..format.shape import DTYPES, Shape
from ..kernels.decode_spec import LEAD_WARPS, SCHEDULES, WARPS_PER_CTA
from ..kernels.marker_spec import RECORDING_VARIANTS
from ..run import deps
from .common import EXIT_FAIL, check_out, fail, first_line, parse_families, require_kernels

# FA4's own schedules (record --impl fa4): its sm100 switch; its SM90 forward is FA3's.
FA4_SCHEDULES = ("base", "pingpong", "fa3")


# ---- record --------------------------------------------------------------------------------
# The modes of `record`, one function each, and the options each takes (besides -o and --force).
RECORD_OPTIONS = {
    "ours": ("kind", "impl", "schedule", "d", "hq", "hkv", "sk", "b", "sq", "dtype", "num_splits", "ctas", "warps",
             "events", "capacity", "build_dir"),
    "fa4": ("kind", "impl", "schedule", "d", "hq", "hkv", "sk", "b", "sq", "dtype", "ctas", "warps", "capacity",
            "build_dir", "families"),
    "calibration": ("kind", "timebase", "build_dir"),
    "markers": ("kind", "variant", "ctas", "warps", "capacity", "build_dir"),
    "script": ("script", "script_args", "families", "capacity", "ctas", "warps", "passes", "pass_launches"),
}
RECORD_MODE_NAMES = {"ours": "our decode attention", "fa4": "--impl fa4", "calibration": "--kernel calibration",
                     "markers": "--kernel markers", "script": "--script"}
# Why an option does not go with a mode, where more can be said than "does not apply".
RECORD_NOT_FOR = {
    ("warps", "calibration"): "--warps: the calibration kernel records every warp (its checks need them)",
    ("events", None): "--events picks the event set of our decode attention kernels only",
    ("families", None): "--families goes with --script or --impl fa4 (our kernels place their events by hand)",
    ("passes", None): "--passes goes with --script (kernels traced by fa4trace.instrument)",
    ("pass_launches", None): "--pass-launches goes with --script --passes",
}


@click.command()
@click.option("--kernel", "kind", default="attention", type=click.Choice(["attention", "calibration", "markers"]),
              show_default=True, help="What to run.")
@click.option("--impl", default="ours", type=click.Choice(["ours", "fa4"]), show_default=True,
              help="Attention implementation: our CuTe DSL kernels or upstream FlashAttention-4.")
@click.option("--schedule", default="pingpong", type=click.Choice(list(dict.fromkeys(SCHEDULES + FA4_SCHEDULES))),
              show_default=True,
              help="Ours: base, pingpong (QK(i+1) overlaps softmax(i)) or intrawg (FA3's intra-warpgroup "
                   "overlap: softmax(i) overlaps PV(i-1)). --impl fa4: pingpong or base (sm100), fa3 (sm90).")
@click.option("--d", "d", default=Shape.d, type=int, show_default=True, help="Head dim.")
@click.option("--hq", default=Shape.hq, type=int, show_default=True, help="Query heads.")
@click.option("--hkv", default=Shape.hkv, type=int, show_default=True, help="KV heads.")
@click.option("--sk", default=Shape.sk, type=int, show_default=True, help="KV length.")
@click.option("--b", "b", default=Shape.b, type=int, show_default=True, help="Batch.")
@click.option("--sq", default=Shape.sq, type=int, show_default=True, help="Query tokens per sequence (multi-token decode).")
@click.option("--dtype", default=Shape.dtype, type=click.Choice(list(DTYPES)), show_default=True)
@click.option("--num-splits", default=None, type=int, help="Split-KV count (default: heuristic).")
@click.option("--timebase", default="clock64", type=click.Choice(["clock64", "globaltimer"]), show_default=True,
              help="Calibration kernel: per-event timer.")
@click.option("--variant", default="fa4trace", type=click.Choice(RECORDING_VARIANTS), show_default=True,
              help="Markers kernel: which recorder variant.")
@click.option("--ctas", default=None, help="Record a subset of CTAs: FIRST:COUNT[:STRIDE].")
@click.option("--warps", default=None,
              help="Record a subset of each CTA's warps: comma warp indices, or 'lead' (decode attention: "
                   "warp 0 of the consumer warpgroup and the producer warp 4; a quarter of the records).")
@click.option("--events", "events", default=None, type=click.Choice(["core", "stalls"]),
              help="Our decode attention: what it records. core (default): loads, QK/PV in flight, softmax, "
                   "correction, epilogue, combine. stalls: also WAIT_K/WAIT_V, the consumer waiting for K/V "
                   "to land (costs more: ~+5 points at d64).")
@click.option("--capacity", default=None, type=int, help="Records per warp slot (default: sized from the shape).")
@click.option("--build", "build_dir", default=None, type=click.Path(file_okay=False),
              help="AOT build folder (default $FA4TRACE_BUILD or build/kernels) when the DSL cannot JIT here.")
@click.option("--script", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Run this Python script under fa4trace.instrument: every CuTe DSL kernel it compiles gets "
                   "automatic events; each one it launches is written as a bundle (-o, then -o's stem + _1, _2...).")
@click.option("--families", default=None,
              help="Comma list of generic event families (pipeline,tma,mma,barrier). --script: what is "
                   "recorded (default all). --impl fa4: recorded besides FA4's own events (default none).")
@click.option("--passes", is_flag=True,
              help="--script: each launch is also replayed with lighter recordings (lifetimes only, then one family "
                   "at a time, then the named spans), memory restored between them; the bundle holds every pass and "
                   "`summary` takes each figure from the lightest pass that reports it.")
@click.option("--pass-launches", "pass_launches", default=1, show_default=True, type=click.IntRange(1, 64),
              help="--passes: launches of each pass per call; its figures are read over them together "
                   "(more samples per figure for a short kernel).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Bundle to write (.parquet).")
@click.option("--force", is_flag=True, help="Overwrite the bundle if it exists.")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def record(ctx, output, force, **opts):
    """Run a kernel on this machine's GPU with tracing on and write a bundle.

    With --script, run your own script instead (arguments after --): fa4trace record --script
    gemm.py -o gemm.parquet -- --m 8192."""
    if opts["script_args"] and not opts["script"]:
        raise click.BadParameter(f"unexpected arguments {' '.join(opts['script_args'])} (they go to --script)")
    mode = record_mode(opts["kind"], opts["impl"], opts["script"])
    _check_record_options(ctx, mode)
    out = check_out(output, force)
    take = [k for k in RECORD_OPTIONS[mode] if k not in ("kind", "impl")]
    RECORDERS[mode](out, force, **{k: opts[k] for k in take})


def record_mode(kind: str, impl: str, script) -> str:
    """Which recording `record` makes: script, calibration, markers, fa4 or ours."""
    if script:
        return "script"
    if kind != "attention":
        return kind
    return "fa4" if impl == "fa4" else "ours"


def _check_record_options(ctx: click.Context, mode: str) -> None:
    """Refuse options given on the command line that the mode does not take (one line)."""
    takes = set(RECORD_OPTIONS[mode]) | {"output", "force"}
    for p in ctx.command.params:
        # the script's own arguments are checked by `record` itself: click before 8.3 says an
        # empty variadic argument came from the command line
        if (p.name in takes or isinstance(p, click.Argument)
                or ctx.get_parameter_source(p.name) is not ParameterSource.COMMANDLINE):
            continue
        flag = max([o for o in p.opts if o.startswith("--")] or p.opts, key=len)
        why = RECORD_NOT_FOR.get((p.name, mode)) or RECORD_NOT_FOR.get((p.name, None))
        raise click.UsageError(why or f"{flag} does not apply to {RECORD_MODE_NAMES[mode]}")


def _save(trace, out: Path, force: bool) -> None:
    trace.save(out, overwrite=force)
    click.echo(f"wrote {out}: {len(trace)} rows, {trace.info.total_dropped or 0} dropped")


def _record_ours(out: Path, force: bool, *, schedule, d, hq, hkv, sk, b, sq, dtype, num_splits, ctas, warps, events,
                 capacity, build_dir):
    """Our decode attention: one traced launch on random inputs."""
    shape = _shape("ours", schedule, num_splits, d=d, hq=hq, hkv=hkv, sk=sk, b=b, sq=sq, dtype=dtype)
    sampling = _sampling(ctas, warps, capacity, lead=True, max_warps=WARPS_PER_CTA)
    require_kernels("fa4trace record")
    from ..attention.record import record_attention

    _save(record_attention(schedule, shape, sampling=sampling, num_splits=num_splits, build=build_dir,
                           trace_events=events or "core"), out, force)


def _record_fa4(out: Path, force: bool, *, schedule, d, hq, hkv, sk, b, sq, dtype, ctas, warps, capacity, build_dir,
                families):
    """Upstream FlashAttention-4: one traced launch, with the generic families asked for."""
    shape = _shape("fa4", schedule, None, d=d, hq=hq, hkv=hkv, sk=sk, b=b, sq=sq, dtype=dtype)
    sampling = _sampling(ctas, warps, capacity)
    fams = parse_families(families)
    deps.require("fa4trace record --impl fa4", "torch")
    deps.require_route("fa4trace record --impl fa4", jit=("cutlass", "flash_attn"), aot=("tvm_ffi",), what="FA4")
    from .. import fa4

    _save(fa4.record(shape, schedule=schedule, sampling=sampling, build=build_dir, families=fams), out, force)


def _record_calibration(out: Path, force: bool, *, timebase, build_dir):
    """The calibration kernel: its trace and the timer checks (tick, agreement with globaltimer)."""
    require_kernels("fa4trace record --kernel calibration")
    from ..probes.calibration import record_calibration

    trace, checks = record_calibration(timebase=timebase, build=build_dir)
    click.echo(f"tick {checks['tick_ns']} ns; decoded vs globaltimer bracket: median "
               f"{checks['err_vs_bracket_mid_ns_median']} ns, worst {checks['outside_ns_max']} ns outside; "
               f"{checks['warps_within_one_tick']}/{checks['warps']} warps within one tick")
    _save(trace, out, force)


def _record_markers(out: Path, force: bool, *, variant, ctas, warps, capacity, build_dir):
    """The marker-dense microbenchmark: one traced launch of a recording variant."""
    sampling = _sampling(ctas, warps, capacity)
    require_kernels("fa4trace record --kernel markers")
    from ..probes.markers import record_markers

    _save(record_markers(variant=variant, build=build_dir, sampling=sampling), out, force)


def _record_script(out: Path, force: bool, *, script, script_args, families, capacity, ctas, warps, passes=False,
                   pass_launches=1):
    """``--script``: the user's script runs under ``fa4trace.instrument``; every kernel it
    launched is written as a bundle (-o, then -o's stem + _1, _2...). ``passes``: every launch
    is replayed with lighter recordings too (``instrument(passes=True)``), each
    ``pass_launches`` times."""
    import runpy

    if pass_launches != 1 and not passes:
        raise click.BadParameter("--pass-launches goes with --passes (the launches of each pass)")

    fams = parse_families(families)
    sampling = _sampling(ctas, warps, capacity)
    if sampling.cta_first:
        raise click.BadParameter("--ctas with --script: FIRST must be 0 (FIRST:COUNT[:STRIDE])")
    placement = Placement(families=fams) if fams else Placement()
    deps.require("fa4trace record --script", "torch", "cutlass")
    from ..auto.api import instrument

    argv = sys.argv
    sys.argv = [script, *script_args]
    try:
        with instrument(sampling=sampling, placement=placement, passes=bool(passes),
                        pass_launches=pass_launches) as recording:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            fail(f"{script} exited with {e.code}", EXIT_FAIL)
    except Fa4traceError:
        raise
    except ImportError as e:  # the script imports a package that is not here
        fail(f"{script}: {deps.explain(e) or first_line(e)}", EXIT_FAIL)
    except Exception as e:  # noqa: BLE001 - the user's script failed: say where, in one line
        fail(f"{script} raised {type(e).__name__}: {first_line(e)}", EXIT_FAIL)
    finally:
        sys.argv = argv
    launched = recording.launched
    if not recording.kernels:
        fail(f"{script} compiled no CuTe DSL kernel (cute.compile) while it ran: nothing to trace", EXIT_FAIL)
    if not launched:
        fail(f"{script} compiled {len(recording.kernels)} kernel(s) but launched none of them", EXIT_FAIL)
    paths = [out] + [out.with_name(f"{out.stem}_{i}{out.suffix}") for i in range(1, len(launched))]
    for p in paths[1:]:
        check_out(str(p), force)
    for k, p in zip(launched, paths):
        t = k.trace()
        t.save(p, overwrite=force)
        info = t.info
        missing = info.instrument.missing or []
        ran = [x["pass"] for x in info.instrument.passes or []]
        click.echo(f"wrote {p}: {info.kernel}, {len(t)} rows"
                   + (f"; no {', '.join(missing)} events found in this kernel" if missing else "")
                   + (f"; passes {', '.join(ran)}" if ran else ""))


RECORDERS = {"ours": _record_ours, "fa4": _record_fa4, "calibration": _record_calibration,
             "markers": _record_markers, "script": _record_script}


def _shape(impl, schedule, num_splits, *, d, hq, hkv, sk, b, sq, dtype) -> Shape:
    """The shape flags as the problem they name, checked before anything looks for a GPU
    (``attention.shape_problem``: the rules of ``fa4trace.decode_attention``; for FA4 only the
    general ones, it checks its own head dims), and the schedule and split count with them."""
    from ..attention import shape_problem

    flags = {key: f"--{key}" for key in ("b", "sq", "hq", "hkv", "sk", "d")}
    problem = shape_problem(b=b, sq=sq, hq=hq, hkv=hkv, sk=sk, d=d, names=flags, ours=impl != "fa4")
    if problem:
        raise click.BadParameter(problem)
    if num_splits is not None and num_splits < 1:
        raise click.BadParameter(f"--num-splits must be >= 1, got {num_splits}")
    if impl != "fa4" and schedule not in SCHEDULES:
        raise click.BadParameter(f"--schedule {schedule} is FA4's; our kernels have {', '.join(SCHEDULES)}")
    if impl == "fa4" and schedule not in FA4_SCHEDULES:
        raise click.BadParameter(f"--schedule {schedule} is one of ours; FA4 has {', '.join(FA4_SCHEDULES)}")
    return Shape(b=b, sq=sq, hq=hq, hkv=hkv, sk=sk, d=d, dtype=dtype)


def _sampling(ctas: str | None, warps: str | None, capacity: int | None, *, lead: bool = False,
              max_warps: int | None = None) -> Sampling:
    """``--ctas``, ``--warps`` and ``--capacity`` as the Sampling they ask for (a bad value is
    one line naming its flag)."""
    fields = _parse_ctas(ctas)
    if warps is not None:
        fields["warps"] = _parse_warps(warps, lead=lead, max_warps=max_warps)
    try:
        return Sampling(capacity=capacity, **fields)
    except BadOption as e:
        raise click.BadParameter(f"--{e}") from None


def _parse_ctas(spec: str | None) -> dict:
    """``--ctas FIRST:COUNT[:STRIDE]`` as Sampling's cta_first, ctas and cta_stride."""
    if not spec:
        return {}
    try:
        parts = [int(x) for x in spec.split(":")]
    except ValueError:
        raise click.BadParameter(f"--ctas must be FIRST:COUNT[:STRIDE], got {spec!r}") from None
    if len(parts) not in (2, 3) or parts[0] < 0 or parts[1] < 1 or (len(parts) == 3 and parts[2] < 1):
        raise click.BadParameter(f"--ctas must be FIRST:COUNT[:STRIDE] with COUNT, STRIDE >= 1, got {spec!r}")
    return {"cta_first": parts[0], "ctas": parts[1], "cta_stride": parts[2] if len(parts) == 3 else 1}


def _parse_warps(spec: str, *, lead: bool = False, max_warps: int | None = None) -> tuple:
    """``--warps``: comma warp indices (below ``max_warps`` when the kernel's warp count is
    known), or 'lead' where the kernel defines lead warps (our decode attention)."""
    if spec == "lead":
        if not lead:  # (also --script: warp roles are the kernel's own)
            raise click.BadParameter("--warps lead is defined for our decode attention; give warp indices")
        return LEAD_WARPS
    try:
        ws = tuple(int(x) for x in spec.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"--warps must be comma warp indices or 'lead', got {spec!r}") from None
    if not ws or min(ws) < 0:
        raise click.BadParameter(f"--warps must be comma warp indices >= 0 or 'lead', got {spec!r}")
    if max_warps is not None and max(ws) >= max_warps:
        raise click.BadParameter(f"--warps: decode attention has warps 0..{max_warps - 1}, got {spec!r}")
    return ws


# ---- build ---------------------------------------------------------------------------------
@click.command()
@click.option("--arch", default="sm_90a", type=click.Choice(["sm_90a", "sm_100a"]), show_default=True,
              help="GPU target (no GPU needed to build).")
@click.option("-o", "--output", default="build/kernels", show_default=True, type=click.Path(file_okay=False),
              help="Build folder (shared library + manifest.json).")
@click.option("--only", default=None, help="Comma-separated kernel kinds (calibration,markers,attention).")
@click.option("--force", is_flag=True, help="Replace an existing build folder.")
def build(arch, output, only, force):
    """AOT-compile the instrumented kernels (tvm-ffi export + link) into a folder with a manifest."""
    from .. import kernels
    from ..run.aot import build_library

    kinds = tuple(k.strip() for k in only.split(",") if k.strip()) if only is not None else None
    unknown = [k for k in kinds or () if k not in kernels.KINDS]
    if kinds == () or unknown:
        raise click.BadParameter(f"unknown kernel kind {', '.join(unknown) or repr(only)}; the kinds are "
                                 f"{', '.join(kernels.KINDS)}", param_hint="--only")
    out = Path(output)
    if out.is_dir() and any(out.iterdir()) and not force:
        raise WouldOverwrite(f"{out} exists and is not empty; refusing to replace it")
    deps.require("fa4trace build", "cutlass", "tvm_ffi")
    os.environ["CUTE_DSL_ARCH"] = arch
    variants = list(kernels.aot_variants(arch, only=kinds))
    compiled = {}
    for i, (name, thunk, entry) in enumerate(variants, 1):
        click.echo(f"[{i}/{len(variants)}] compiling {name}", err=True)
        compiled[name] = (thunk(), entry)
    out = build_library(compiled, output, arch=arch, overwrite=force)
    click.echo(f"built {len(compiled)} kernels for {arch} into {out}")


# ---- check ---------------------------------------------------------------------------------
@click.command()
@click.option("--out", default="fa4trace-check", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the bundles, Perfetto traces and check.json it writes (attach it to a bug report).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (progress goes to stderr).")
@click.option("--build", "build_dir", default=None, type=click.Path(file_okay=False),
              help="AOT build folder of fa4trace's kernels (default: JIT with the CuTe DSL where it is "
                   "installed, else $FA4TRACE_BUILD or build/kernels).")
@click.option("--fa4-build", default=None, type=click.Path(file_okay=False),
              help="AOT build folder of FA4 (default: JIT where flash-attn-4 is installed, else "
                   "$FA4TRACE_FA4_BUILD or build/fa4_sm90).")
@click.option("--quick", is_flag=True, help="One schedule each: our ping-pong, FA4's first path.")
@click.option("--force", is_flag=True, help="Overwrite bundles an earlier check left in --out.")
def check(out, as_json, build_dir, fa4_build, quick, force):
    """Can fa4trace be trusted on this GPU? Runs the timer calibration, the recorder, our decode
    kernel (Hopper) and FA4's decode, and what tracing costs; ends with one line: usable,
    usable with warnings or not usable.

    Exit status: 0 usable, 3 usable with warnings, 1 not usable, 2 no CUDA GPU (or no PyTorch) here."""
    from ..check import run as C
    from ..check.report import exit_code, render
    from ..check.rows import detect_gpu

    C.prepare_out_dir(out, force, create=False)
    try:
        deps.require("fa4trace check", "torch")
    except MissingDependency as e:
        fail(str(e), C.EXIT_NO_GPU)
    if detect_gpu() is None:
        fail(C.NO_GPU_MESSAGE, C.EXIT_NO_GPU)
    report = C.run_checks(out, build=build_dir, fa4_build=fa4_build, quick=quick, force=force,
                          log=lambda m: click.echo(m, err=True))
    click.echo(report.to_json() if as_json else render(report))
    return exit_code(report.verdict)
