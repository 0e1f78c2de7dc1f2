"""`fa4trace` command line: record | convert | summary | compare | diff | merge | view | plot | build | bench | check |
sass | sweep | compact | query.

Every failure prints one line (``fa4trace: error: ...``) and exits non-zero: bad input, a
missing file, a missing optional package (what is missing and the pip command that brings it)
alike; nothing a user recorded is overwritten without --force.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from .format.errors import Fa4traceError, MissingDependency, WouldOverwrite
from .bench.options import DEFAULT_TRACED, TRACE_AT, TRACED_VARIANTS
from .kernels.decode_spec import LEAD_WARPS, SCHEDULES, WARPS_PER_CTA
from .kernels.marker_spec import RECORDING_VARIANTS
from .run import deps

# FA4's own schedules (record --impl fa4): its sm100 switch; its SM90 forward is FA3's.
FA4_SCHEDULES = ("base", "pingpong", "fa3")
EXIT_USAGE = 2
EXIT_FAIL = 1
DEBUG_ENV = "FA4TRACE_DEBUG"  # set to 1: an unexpected error shows its traceback instead of one line


# Commands users look for under another name: click's spelling suggestion misses them
# (`fa4trace export` would be offered `plot`).
COMMAND_HINTS = {"export": "convert", "perfetto": "convert", "chrome": "convert", "info": "summary",
                 "show": "view", "open": "view", "serve": "view"}


class _OneLineErrors(click.Group):
    """Turn usage errors, fa4trace errors and missing packages into one line on stderr."""

    def resolve_command(self, ctx, args):
        name = args[0] if args else None
        if name in COMMAND_HINTS and self.get_command(ctx, name) is None:
            raise click.UsageError(f"No such command {name!r}. Did you mean {COMMAND_HINTS[name]!r}?", ctx)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except WouldOverwrite as e:  # say how to allow it where the command can
            cmd = self.get_command(ctx, ctx.invoked_subcommand) if ctx.invoked_subcommand else None
            if cmd is not None and any(p.name == "force" for p in cmd.params):
                raise WouldOverwrite(f"{e} (add --force)") from None
            raise

    def main(self, args=None, prog_name=None, **kw):
        try:
            rv = super().main(args=args, prog_name=prog_name or "fa4trace", standalone_mode=False, **kw)
            return rv if isinstance(rv, int) else 0
        except click.exceptions.Exit as e:
            return e.exit_code
        except click.Abort:
            _fail("aborted", EXIT_FAIL)
        except click.UsageError as e:
            hint = f" (see: {e.ctx.command_path} --help)" if e.ctx else ""
            _fail(f"{e.format_message()}{hint}", EXIT_USAGE)
        except click.ClickException as e:
            _fail(e.format_message(), e.exit_code or EXIT_FAIL)
        except (Fa4traceError, ValueError, OSError, KeyError) as e:
            _fail(_first_line(e), EXIT_FAIL)
        except ImportError as e:  # an optional package imported past the checks (or broken)
            _fail(deps.explain(e) or f"a module does not import here: {_first_line(e)}", EXIT_FAIL)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except Exception as e:  # noqa: BLE001 - a bug: still one line, unless asked for the traceback
            if os.environ.get(DEBUG_ENV):
                raise
            _fail(f"unexpected {type(e).__name__}: {_first_line(e)} (a bug in fa4trace: please report it; "
                  f"{DEBUG_ENV}=1 shows where it happened)", EXIT_FAIL)


def _first_line(e: BaseException) -> str:
    if isinstance(e, OSError) and not isinstance(e, Fa4traceError) and e.filename and e.strerror:
        return f"{e.filename}: {e.strerror}"  # not "[Errno 2] No such file or directory: 'x'"
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _fail(msg: str, code: int):
    click.echo(f"fa4trace: error: {msg}", err=True)
    sys.exit(code)


def _check_out(path: str, force: bool) -> Path:
    """The output file ``path``, refused when it is empty, exists (unless ``force``) or is a folder."""
    if not str(path).strip():
        raise Fa4traceError("the output path is empty: give a file name")
    p = Path(path)
    if p.is_dir():
        raise Fa4traceError(f"{p} is a directory")
    if p.exists() and not force:
        raise WouldOverwrite(f"{p} exists; refusing to overwrite it")
    return p


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fa4trace", prog_name="fa4trace")
def main():
    """Per-warp timelines of GPU kernels written in NVIDIA's CuTe DSL: record, inspect, compare, view."""


# ---- summary / compare ---------------------------------------------------------------------
ROLES_HELP = ("Any-kernel bundles: the role of some warps, ROLE=WARPS (e.g. producer=4 or mma=0-3,8); repeat for "
              "more roles. Wins over the roles the bundle names or the analysis infers.")


@main.command()
@click.argument("bundle", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--roles", "roles", multiple=True, metavar="ROLE=WARPS", help=ROLES_HELP)
@click.option("--compensate/--raw", "compensate", default=False,
              help="--compensate: also show each span, wait and lag less the recorder's own cost (calibrated per "
                   "recorder, docs/compensation.md), raw beside. --raw (default): raw figures only.")
@click.option("--calibration", type=click.Path(dir_okay=False), default=None,
              help="With --compensate, for a bundle that holds no calibration: recorder_cost.json as `fa4trace "
                   "check` writes it into its folder.")
@click.option("--recorder", default=None, metavar="NAME",
              help="With --compensate: the recorder that wrote the bundle where it does not say (recorder_smem for "
                   "our decode kernel's bundles; instrument()'s say segment_<cursor>).")
@click.option("--launch", "launch", default=None, type=click.IntRange(0), metavar="N",
              help="A bundle of several launches: the figures of launch N only (default: each launch's own, one "
                   "after the other).")
def summary(bundle, as_json, roles, compensate, calibration, recorder, launch):
    """What a trace bundle holds: shape, kernel time, overlap fractions, dropped events; for a
    kernel traced automatically: roles, busy/waiting/idle, stage occupancy, lag, wait chain.
    Every figure is one launch's: a bundle of several launches lists them and shows each one's.
    --compensate adds the spans, waits and lags less what recording them cost."""
    from .analysis.autoevents import is_automatic
    from .trace.bundle import load

    if (calibration or recorder) and not compensate:
        raise click.UsageError("--calibration and --recorder go with --compensate")
    trace = load(bundle)
    if is_automatic(trace):
        from .analysis.kernel import summarize_kernel
        from .analysis.text import format_kernel_summary

        trace, by_pass = _passes_of(trace, _parse_roles(roles), launch)
        s = summarize_kernel(trace, _parse_roles(roles), launch)
        if by_pass:
            s["passes"] = by_pass
        _add_compensation(s, trace, compensate, calibration, recorder, launch)
        click.echo(json.dumps(s, indent=1, sort_keys=True) if as_json else format_kernel_summary(s)
                   + "".join("\n" + line for line in _pass_lines(by_pass)) + _compensation_text(s))
        return
    if roles:
        raise click.UsageError("--roles applies to bundles of automatically traced kernels (meta 'instrument')")
    from .analysis.overlap import summarize

    s = summarize(trace, launch)
    _add_compensation(s, trace, compensate, calibration, recorder, launch)
    if as_json:
        click.echo(json.dumps(s, indent=1, sort_keys=True))
        return
    click.echo(_format_summary(s) + _compensation_text(s))


# -- compensated figures (summary --compensate) --
def _add_compensation(s: dict, trace, compensate: bool, calibration, recorder, launch=None) -> None:
    """With --compensate: the summary's ``compensation`` (fa4trace.analysis.compensate, per
    launch), with the bundle's own calibration, else the file's entry for its recorder."""
    if not compensate:
        return
    from .analysis import compensate as C

    cals = C.load_calibrations(calibration) if calibration else None
    s["compensation"] = C.summary_by_launch(trace, C.calibration_for(trace, cals, recorder=recorder), launch)


def _compensation_text(s: dict) -> str:
    from .analysis.compensate import lines

    return "".join("\n" + line for line in lines(s["compensation"])) if "compensation" in s else ""


# -- a bundle recorded with passes (instrument(passes=...), record --passes) --
def _passes_of(trace, roles: dict, launch):
    """(the bundle's main recording, per call shown: each figure from its lightest pass) where
    the bundle was recorded with passes (fa4trace.analysis.passes), else (the bundle, None).
    ``launch`` (--launch, an index among the main recording's launches): its call only."""
    from .analysis.passes import DENSE, calls, has_passes, pass_traces, sourced_figures

    if not has_passes(trace):
        return trace, None
    dense = pass_traces(trace).get(DENSE, trace)
    shown = calls(trace)
    main_launches = dense.meta.get("launches") or []
    if launch is not None and 0 <= launch < len(main_launches):
        shown = [int(main_launches[launch].get("call") or 0)]
    return dense, [sourced_figures(trace, roles, c) for c in shown]


def _pass_lines(by_pass) -> list:
    from .analysis.passes import figures_lines

    return [line for sourced in by_pass or [] for line in figures_lines(sourced)]


def _parse_roles(values) -> dict:
    """('producer=4', 'mma=0-3,8') -> {'producer': [4], 'mma': [0, 1, 2, 3, 8]}."""
    out: dict = {}
    for v in values:
        role, sep, warps = v.partition("=")
        role = role.strip()
        if not sep or not role or not warps.strip():
            raise click.BadParameter(f"--roles takes ROLE=WARPS (e.g. producer=4 or mma=0-3), got {v!r}")
        try:
            for part in warps.split(","):
                a, _, b = part.strip().partition("-")
                out.setdefault(role, []).extend(range(int(a), int(b or a) + 1))
        except ValueError:
            raise click.BadParameter(f"--roles {v!r}: warps must be indices or ranges like 0-3") from None
    return out


def _pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _ns(x):
    return "n/a" if x is None else (f"{x / 1e3:.2f} µs" if x >= 1e4 else f"{x:.0f} ns")


def _tbps(x):
    return "n/a" if x is None else f"{x:.2f} TB/s"


def _subset_note(s: dict) -> str:
    """What part of the launch was recorded, when not all of it."""
    parts = []
    if s.get("cta_subset"):
        parts.append("a subset of the grid's CTAs")
    if s.get("warp_subset"):
        parts.append("warps " + ",".join(str(w) for w in s["warp_subset"]) + " of each CTA")
    return ("; recorded: " + ", ".join(parts)) if parts else ""


def _traced_note(s: dict) -> str:
    """The recorded (traced) launch's own time against the untraced kernel on the same inputs,
    where the bundle measured them."""
    t, k = s.get("traced_time_ns"), s.get("recorded_kernel_time_ns")
    if not t:
        return ""
    if not k:
        return f"\n                 recorded launch (traced) {_ns(t)}, the launch these events come from"
    same = "" if s.get("kernel_time_kind") == "recorded_inputs" else f"untraced {_ns(k)}, "
    return (f"\n                 on the recorded inputs: {same}traced {_ns(t)} ({100 * (t - k) / k:+.1f}%), "
            "the launch these events come from")


# The attention lines of a summary: (label, key, format, what follows the value). A bundle
# without the events behind one (the marker or calibration kernel) shows no line for it.
ATTENTION_LINES = (("bandwidth     ", "bandwidth_tbps", _tbps, ""),
                   ("QK ∥ SOFTMAX  ", "qk_softmax_overlap", _pct, ""),
                   ("PV ∥ SOFTMAX  ", "pv_softmax_overlap", _pct, ""),
                   ("hidden softmax", "hidden_softmax_ns", _ns, " per iteration (median)"),
                   ("period        ", "period_ns", _ns, " per KV block (median)"),
                   ("tensor cores  ", "tensor_core_busy", _pct, " busy"))


def _format_summary(s: dict) -> str:
    from .analysis.text import dropped_text, format_launches, launch_text, other_launches_lines, perturbation_text

    if s.get("per_launch"):
        return format_launches(s, _format_summary)
    cfg = s.get("config") or {}
    shape = " ".join(f"{k}={v}" for k, v in cfg.items())
    lines = [
        f"{s['name']}{'  (SYNTHETIC)' if s.get('synthetic') else ''}",
        f"  gpu            {s.get('gpu') or 'n/a'}",
        f"  config         {shape or 'n/a'}",
        f"  rows           {s['rows']} ({s['ctas']} CTAs, {s['warps']} warps, {launch_text(s)})"
        + _subset_note(s),
        *other_launches_lines(s),
        f"  kernel time    {_ns(s.get('kernel_time_ns'))} [{s.get('kernel_time_source')}]" + _traced_note(s),
        *(f"  {label} {fmt(s[key])}{tail}" for label, key, fmt, tail in ATTENTION_LINES if s.get(key) is not None),
        f"  dropped        {dropped_text(s)}",
        *perturbation_text(s.get("perturbation")),
    ]
    ends = s.get("mainloop_end_ns")
    if ends:
        lines.append(f"  mainloop ends  {_ns(ends['min'])} / {_ns(ends['median'])} / {_ns(ends['max'])} "
                     f"(first / median / last CTA); {_pct(s.get('mainloop_idle_share'))} of CTA time idle "
                     "waiting for the last")
    if s.get("stream_tbps") is not None:
        lines.append(f"  KV stream      {_tbps(s['stream_tbps'])} steady (middle half of the blocks); beyond that "
                     f"pace: start {_ns(s['stream_start_loss_ns'])}, end {_ns(s['stream_end_loss_ns'])}, "
                     f"after the last block {_ns(s['after_stream_ns'])}")
    names = {"startup_first_load_ns": "first KV load issued", "startup_q_ready_ns": "Q in smem",
             "startup_first_qk_ns": "first QK", "startup_first_pv_ns": "first PV"}
    st = [f"{label} {_ns(s[k])}" for k, label in names.items() if s.get(k) is not None]
    if st:
        lines.append("  startup        " + ", ".join(st) + " (median CTA, from the launch's first warp)")
    fast = s.get("fast_sms")
    if fast:
        lines.append(f"  fast SMs       {len(fast)} SMs stream {s['fast_sm_rate_ratio']:.2f}x the median rate: "
                     + ",".join(map(str, fast)))
    med = s.get("median_ns") or {}
    if med:
        lines.append("  median ns      " + "  ".join(f"{k}={v:.0f}" for k, v in med.items()))
    return "\n".join(lines)


@main.command()
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--roles", "roles", multiple=True, metavar="ROLE=WARPS", help=ROLES_HELP)
@click.option("--launch", "launch", default=None, type=click.IntRange(0), metavar="N",
              help="Compare launch N of A with launch N of B (bundles of several launches).")
@click.option("--launch-a", "launch_a", default=None, type=click.IntRange(0), metavar="N", help="Launch N of A.")
@click.option("--launch-b", "launch_b", default=None, type=click.IntRange(0), metavar="N", help="Launch N of B.")
def compare(a, b, as_json, roles, launch, launch_a, launch_b):
    """Compare two bundles (B against A): overlap, period, kernel time; for two
    bundles of one automatically traced kernel: roles' busy/waiting/idle, lag, wait chain.
    One launch of A against one of B: bundles of as many launches each are compared launch by
    launch; otherwise choose with --launch / --launch-a / --launch-b."""
    from .analysis.autoevents import is_automatic
    from .analysis.overlap import compare as cmp
    from .trace.bundle import load

    launch_a = launch if launch_a is None else launch_a
    launch_b = launch if launch_b is None else launch_b
    ta, tb = load(a), load(b)
    auto = (is_automatic(ta), is_automatic(tb))
    if any(auto):
        if not all(auto):
            which = "A" if auto[0] else "B"
            raise Fa4traceError(f"{which} is a bundle of an automatically traced kernel and the other is not: "
                                "compare needs two bundles of the same kernel")
        from .analysis.kernel import compare_kernels
        from .analysis.text import format_kernel_compare

        c = compare_kernels(ta, tb, _parse_roles(roles), launch_a, launch_b)
        click.echo(json.dumps(c, indent=1, sort_keys=True) if as_json else format_kernel_compare(c))
        return
    if roles:
        raise click.UsageError("--roles applies to bundles of automatically traced kernels (meta 'instrument')")
    c = cmp(ta, tb, launch_a, launch_b)
    if as_json:
        click.echo(json.dumps(c, indent=1, sort_keys=True))
        return
    from .analysis.text import pairs_text

    click.echo(pairs_text(c, _format_compare) if c.get("pairs") else _format_compare(c))


def _format_compare(c: dict) -> str:
    """The text of `fa4trace compare` for bundles of our attention kernels (one launch pair)."""
    from .analysis.text import pair_line, perturbation_text

    out = [pair_line(c)] if pair_line(c) else []
    rows = [("kernel time", "kernel_time_ns", _ns), ("bandwidth", "bandwidth_tbps", _tbps),
            ("QK ∥ SOFTMAX", "qk_softmax_overlap", _pct), ("PV ∥ SOFTMAX", "pv_softmax_overlap", _pct),
            ("hidden softmax", "hidden_softmax_ns", _ns), ("period", "period_ns", _ns),
            ("tensor cores busy", "tensor_core_busy", _pct),
            ("mainloop idle share", "mainloop_idle_share", _pct), ("KV stream steady", "stream_tbps", _tbps),
            ("stream start loss", "stream_start_loss_ns", _ns), ("after the stream", "after_stream_ns", _ns),
            ("dropped", "dropped", str)]
    short = {"cold_l2_bench": "cold-L2 bench", "recorded_inputs": "recorded inputs", "trace_span": "trace span"}
    rows.insert(1, ("kernel time from", "kernel_time_kind", lambda k: short.get(k, "n/a")))
    out.append(f"{'':20s}{'A: ' + c['a']['name']:>36s}  {'B: ' + c['b']['name']:>36s}")
    for label, key, fmt in rows:
        out.append(f"{label:20s}{fmt(c['a'].get(key)):>36s}  {fmt(c['b'].get(key)):>36s}")
    for which in ("a", "b"):
        out += perturbation_text(c[which].get("perturbation"), f"{which.upper()} perturbation")
    out += [line for line in (c.get("headline"), *_differs_notes(c), c.get("speed")) if line]
    return "\n".join(out)


def _differs_notes(c: dict) -> list[str]:
    """What a comparison's ``differs`` says beyond its speed line: other kernels, and other
    shapes where no speed line names them."""
    from .analysis.overlap import diff_text

    d = c.get("differs") or {}
    notes = []
    if d.get("kernel"):
        notes.append(f"note: A is kernel {d['kernel'][0]}, B is kernel {d['kernel'][1]}")
    if d.get("config") and not c.get("speed"):
        notes.append(f"note: A and B ran different shapes ({diff_text(d['config'])})")
    return notes


# ---- convert -------------------------------------------------------------------------------
@main.command()
@click.argument("bundle", type=click.Path(dir_okay=False))
@click.option("--to", "fmt", type=click.Choice(["perfetto", "chrome"]), required=True, help="Output format.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output file.")
@click.option("--compress", is_flag=True, help="Perfetto: zlib-compressed packets (smaller file).")
@click.option("--force", is_flag=True, help="Overwrite the output file if it exists.")
def convert(bundle, fmt, output, compress, force):
    """Export a bundle to Perfetto (.pftrace, TrackEvent protobuf) or Chrome JSON."""
    from .trace.bundle import load

    if compress and fmt != "perfetto":
        raise click.UsageError("--compress applies to --to perfetto only")
    out = _check_out(output, force)
    from .analysis.kernel import export_inputs

    shown, occupancy = export_inputs(load(bundle))  # roles and stage occupancy: analysis before export
    if fmt == "perfetto":
        from .export.perfetto import to_perfetto

        stats = to_perfetto(shown, out, compress=compress, occupancy=occupancy)
    else:
        from .export.chrome import to_chrome

        stats = to_chrome(shown, out)
    click.echo(f"wrote {out} ({out.stat().st_size} bytes){_stats_suffix(stats)}")


def _stats_suffix(stats) -> str:
    if hasattr(stats, "as_dict"):
        stats = stats.as_dict()
    if isinstance(stats, dict):
        bits = [f"{k}={v}" for k, v in stats.items() if isinstance(v, (int, float, str)) and k != "path"]
        return (": " + ", ".join(bits[:6])) if bits else ""
    return ""


# ---- merge -----------------------------------------------------------------------------------
@main.command()
@click.argument("profile", type=click.Path())
@click.argument("bundles", nargs=-1, type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="The merged Perfetto trace (.pftrace).")
@click.option("--ranks", "several", is_flag=True,
              help="Several ranks of a distributed program: the arguments are every rank's torch.profiler trace and "
                   "bundles, and folders holding them (which file is which rank's: docs/profiler.md).")
@click.option("--rank-clock", default="nccl", type=click.Choice(["nccl", "epoch"]), show_default=True,
              help="With --ranks: nccl takes out each rank's clock offset, read from its NCCL kernels' ends (gloo "
                   "calls' where there are none); epoch keeps each profiler's Unix-epoch clock. Both measure it.")
@click.option("--align", default="start", type=click.Choice(["start", "clock"]), show_default=True,
              help="start: each launch's first warp starts with its kernel slice; clock: one offset for every "
                   "launch (the median kernel-start minus first-warp-start), keeping %globaltimer's spacing.")
@click.option("--max-launches", default=None, type=click.IntRange(0), metavar="N",
              help="Draw the warps of the first N traced launches of each bundle only (default: all).")
@click.option("--compress", is_flag=True, help="zlib-compress the warps' packets (smaller file).")
@click.option("--max-clock-offset", default=1.0, type=click.FloatRange(0), show_default=True, metavar="SECONDS",
              help="Without host times in the bundles, refuse kernels further than this from the warps' "
                   "%globaltimer times (a bundle recorded at another time).")
@click.option("--allow-unmatched", is_flag=True, help="Write the merge even if a bundle has no launch in the trace.")
@click.option("--no-numbers", is_flag=True, help="Skip the per-launch busy / waiting / overlap numbers.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--force", is_flag=True, help="Overwrite the output file if it exists.")
def merge(profile, bundles, output, several, rank_clock, align, max_launches, compress, max_clock_offset,
          allow_unmatched, no_numbers, as_json, force):
    """One Perfetto trace of a torch.profiler trace (prof.export_chrome_trace's JSON) and fa4trace
    bundles: host ops, CUDA streams and, under each traced kernel, its SMs, CTAs and warps. With
    --ranks, several ranks' traces and bundles on one clock, a process track per rank.

    Example: fa4trace merge prof.json fa4.parquet rmsnorm.parquet -o one.pftrace

    Several ranks: fa4trace merge --ranks prof_rank0.json step_rank0_*.parquet prof_rank1.json
    step_rank1_*.parquet -o all.pftrace (or: fa4trace merge --ranks run/ -o all.pftrace)"""
    from .profiler import merge as merge_traces

    out = _check_out(output, force)
    opts = dict(align=align, max_launches=max_launches, compress=compress, force=force, analysis=not no_numbers,
                max_clock_offset_ns=int(max_clock_offset * 1e9), allow_unmatched=allow_unmatched)
    if several:
        from .profiler import merge_ranks, rank_inputs

        report = merge_ranks(rank_inputs([profile, *bundles]), out, rank_clock=rank_clock, **opts)
    else:
        if not bundles:
            raise click.UsageError("Missing argument 'BUNDLES...': name at least one fa4trace bundle after the "
                                   "profiler trace (several ranks' traces: add --ranks)", click.get_current_context())
        report = merge_traces(profile, list(bundles), out, **opts)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=1, default=str))
        return
    for line in report.lines():
        click.echo(line)
    w = report.written
    click.echo(f"wrote {out} ({w['bytes']:,} bytes, {w['slices']:,} slices, {w['seconds']:.1f} s); "
               f"open it in ui.perfetto.dev or: fa4trace view --merged {out}")


# ---- build ---------------------------------------------------------------------------------
@main.command()
@click.option("--arch", default="sm_90a", type=click.Choice(["sm_90a", "sm_100a"]), show_default=True,
              help="GPU target (no GPU needed to build).")
@click.option("-o", "--output", default="build/kernels", show_default=True, type=click.Path(file_okay=False),
              help="Build folder (shared library + manifest.json).")
@click.option("--only", default=None, help="Comma-separated kernel kinds (calibration,markers,attention).")
@click.option("--force", is_flag=True, help="Replace an existing build folder.")
def build(arch, output, only, force):
    """AOT-compile the instrumented kernels (tvm-ffi export + link) into a folder with a manifest."""
    from . import kernels
    from .run.aot import build_library

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


# ---- record --------------------------------------------------------------------------------
# The modes of `record`, one function each, and the options each takes (besides -o and --force).
RECORD_OPTIONS = {
    "ours": ("kind", "impl", "schedule", "d", "hq", "hkv", "sk", "b", "sq", "dtype", "num_splits", "ctas", "warps",
             "events", "capacity", "build_dir"),
    "fa4": ("kind", "impl", "schedule", "d", "hq", "hkv", "sk", "b", "sq", "dtype", "ctas", "warps", "capacity",
            "build_dir", "families"),
    "calibration": ("kind", "timebase", "build_dir"),
    "markers": ("kind", "variant", "ctas", "warps", "capacity", "build_dir"),
    "script": ("script", "script_args", "families", "capacity", "ctas", "warps", "passes"),
}
RECORD_MODE_NAMES = {"ours": "our decode attention", "fa4": "--impl fa4", "calibration": "--kernel calibration",
                     "markers": "--kernel markers", "script": "--script"}
# Why an option does not go with a mode, where more can be said than "does not apply".
RECORD_NOT_FOR = {
    ("warps", "calibration"): "--warps: the calibration kernel records every warp (its checks need them)",
    ("events", None): "--events picks the event set of our decode attention kernels only",
    ("families", None): "--families goes with --script or --impl fa4 (our kernels place their events by hand)",
    ("passes", None): "--passes goes with --script (kernels traced by fa4trace.instrument)",
}


@main.command()
@click.option("--kernel", "kind", default="attention", type=click.Choice(["attention", "calibration", "markers"]),
              show_default=True, help="What to run.")
@click.option("--impl", default="ours", type=click.Choice(["ours", "fa4"]), show_default=True,
              help="Attention implementation: our CuTe DSL kernels or upstream FlashAttention-4.")
@click.option("--schedule", default="pingpong", type=click.Choice(list(dict.fromkeys(SCHEDULES + FA4_SCHEDULES))),
              show_default=True,
              help="Ours: base, pingpong (QK(i+1) overlaps softmax(i)) or intrawg (FA3's intra-warpgroup "
                   "overlap: softmax(i) overlaps PV(i-1)). --impl fa4: pingpong or base (sm100), fa3 (sm90).")
@click.option("--d", "d", default=128, type=int, show_default=True, help="Head dim.")
@click.option("--hq", default=16, type=int, show_default=True, help="Query heads.")
@click.option("--hkv", default=1, type=int, show_default=True, help="KV heads.")
@click.option("--sk", default=32768, type=int, show_default=True, help="KV length.")
@click.option("--b", "b", default=1, type=int, show_default=True, help="Batch.")
@click.option("--sq", default=1, type=int, show_default=True, help="Query tokens per sequence (multi-token decode).")
@click.option("--dtype", default="bf16", type=click.Choice(["bf16", "fp16"]), show_default=True)
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
    out = _check_out(output, force)
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
        if p.name in takes or ctx.get_parameter_source(p.name) is not ParameterSource.COMMANDLINE:
            continue
        flag = max([o for o in p.opts if o.startswith("--")] or p.opts, key=len)
        why = RECORD_NOT_FOR.get((p.name, mode)) or RECORD_NOT_FOR.get((p.name, None))
        raise click.UsageError(why or f"{flag} does not apply to {RECORD_MODE_NAMES[mode]}")


def _require_kernels(purpose: str) -> None:
    """torch, and the CuTe DSL to compile fa4trace's kernels here or tvm-ffi to load a build."""
    deps.require(purpose, "torch")
    deps.require_route(purpose, jit=("cutlass",), aot=("tvm_ffi",))


def _save(trace, out: Path, force: bool) -> None:
    trace.save(out, overwrite=force)
    click.echo(f"wrote {out}: {len(trace)} rows, {trace.meta.get('total_dropped', 0)} dropped")


def _record_ours(out: Path, force: bool, *, schedule, d, hq, hkv, sk, b, sq, dtype, num_splits, ctas, warps, events,
                 capacity, build_dir):
    """Our decode attention: one traced launch on random inputs."""
    _check_attention_args("ours", schedule, d=d, hq=hq, hkv=hkv, sk=sk, b=b, sq=sq, num_splits=num_splits)
    _check_capacity(capacity)
    subset = _parse_ctas(ctas)
    if warps is not None:
        subset["warps"] = _parse_warps(warps, lead=True, max_warps=WARPS_PER_CTA)
    _require_kernels("fa4trace record")
    from .attention.record import record_attention

    _save(record_attention(schedule=schedule, d=d, hq=hq, hkv=hkv, sk=sk, b=b, sq=sq, dtype=dtype,
                           num_splits=num_splits, capacity=capacity, build=build_dir,
                           trace_events=events or "core", **subset), out, force)


def _record_fa4(out: Path, force: bool, *, schedule, d, hq, hkv, sk, b, sq, dtype, ctas, warps, capacity, build_dir,
                families):
    """Upstream FlashAttention-4: one traced launch, with the generic families asked for."""
    _check_attention_args("fa4", schedule, d=d, hq=hq, hkv=hkv, sk=sk, b=b, sq=sq, num_splits=None)
    _check_capacity(capacity)
    fams = _parse_families(families)
    subset = _parse_ctas(ctas)
    if warps is not None:
        subset["warps"] = _parse_warps(warps)
    deps.require("fa4trace record --impl fa4", "torch")
    deps.require_route("fa4trace record --impl fa4", jit=("cutlass", "flash_attn"), aot=("tvm_ffi",), what="FA4")
    from . import fa4

    _save(fa4.record(schedule=schedule, d=d, hq=hq, hkv=hkv, sk=sk, b=b, sq=sq, dtype=dtype, capacity=capacity,
                     build=build_dir, families=fams, **subset), out, force)


def _record_calibration(out: Path, force: bool, *, timebase, build_dir):
    """The calibration kernel: its trace and the timer checks (tick, agreement with globaltimer)."""
    _require_kernels("fa4trace record --kernel calibration")
    from .probes.calibration import record_calibration

    trace, checks = record_calibration(timebase=timebase, build=build_dir)
    click.echo(f"tick {checks['tick_ns']} ns; decoded vs globaltimer bracket: median "
               f"{checks['err_vs_bracket_mid_ns_median']} ns, worst {checks['outside_ns_max']} ns outside; "
               f"{checks['warps_within_one_tick']}/{checks['warps']} warps within one tick")
    _save(trace, out, force)


def _record_markers(out: Path, force: bool, *, variant, ctas, warps, capacity, build_dir):
    """The marker-dense microbenchmark: one traced launch of a recording variant."""
    _check_capacity(capacity)
    subset = _parse_ctas(ctas)
    if warps is not None:
        subset["warps"] = _parse_warps(warps)
    _require_kernels("fa4trace record --kernel markers")
    from .probes.markers import record_markers

    _save(record_markers(variant=variant, build=build_dir, capacity=capacity, **subset), out, force)


def _record_script(out: Path, force: bool, *, script, script_args, families, capacity, ctas, warps, passes=False):
    """``--script``: the user's script runs under ``fa4trace.instrument``; every kernel it
    launched is written as a bundle (-o, then -o's stem + _1, _2...). ``passes``: every launch
    is replayed with lighter recordings too (``instrument(passes=True)``)."""
    import runpy

    _check_capacity(capacity)
    fams = _parse_families(families)
    subset = _parse_ctas(ctas)
    if subset.get("cta_first"):
        raise click.BadParameter("--ctas with --script: FIRST must be 0 (FIRST:COUNT[:STRIDE])")
    deps.require("fa4trace record --script", "torch", "cutlass")
    from .auto.api import instrument
    from .auto.events import FAMILIES

    opts = dict(families=fams or FAMILIES, warps=_parse_warps(warps) if warps else None,
                ctas=subset.get("max_ctas", 256), cta_stride=subset.get("cta_stride", 1), passes=bool(passes))
    if capacity:
        opts["capacity"] = capacity
    argv = sys.argv
    sys.argv = [script, *script_args]
    try:
        with instrument(**opts) as recording:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            _fail(f"{script} exited with {e.code}", EXIT_FAIL)
    except Fa4traceError:
        raise
    except ImportError as e:  # the script imports a package that is not here
        _fail(f"{script}: {deps.explain(e) or _first_line(e)}", EXIT_FAIL)
    except Exception as e:  # noqa: BLE001 - the user's script failed: say where, in one line
        _fail(f"{script} raised {type(e).__name__}: {_first_line(e)}", EXIT_FAIL)
    finally:
        sys.argv = argv
    launched = recording.launched
    if not recording.kernels:
        _fail(f"{script} compiled no CuTe DSL kernel (cute.compile) while it ran: nothing to trace", EXIT_FAIL)
    if not launched:
        _fail(f"{script} compiled {len(recording.kernels)} kernel(s) but launched none of them", EXIT_FAIL)
    paths = [out] + [out.with_name(f"{out.stem}_{i}{out.suffix}") for i in range(1, len(launched))]
    for p in paths[1:]:
        _check_out(str(p), force)
    for k, p in zip(launched, paths):
        t = k.trace()
        t.save(p, overwrite=force)
        missing = t.meta["instrument"].get("missing") or []
        ran = [x["pass"] for x in t.meta["instrument"].get("passes") or []]
        click.echo(f"wrote {p}: {t.meta['kernel']}, {len(t)} rows"
                   + (f"; no {', '.join(missing)} events found in this kernel" if missing else "")
                   + (f"; passes {', '.join(ran)}" if ran else ""))


RECORDERS = {"ours": _record_ours, "fa4": _record_fa4, "calibration": _record_calibration,
             "markers": _record_markers, "script": _record_script}


def _parse_families(families: str | None) -> tuple:
    """``--families a,b``: the generic event families named (empty for None)."""
    from .auto.events import FAMILIES

    fams = tuple(f.strip() for f in (families or "").split(",") if f.strip())
    bad = set(fams) - set(FAMILIES)
    if bad:
        raise click.BadParameter(f"--families: unknown {', '.join(sorted(bad))}; families are {', '.join(FAMILIES)}")
    return fams


def _check_capacity(capacity) -> None:
    if capacity is not None and capacity < 1:
        raise click.BadParameter(f"--capacity must be >= 1, got {capacity}")


def _check_attention_args(impl, schedule, *, d, hq, hkv, sk, b, sq, num_splits):
    """The shape flags, checked before anything looks for a GPU (``attention.shape_problem``:
    the rules of ``fa4trace.decode_attention``; for FA4 only the general ones, it checks its
    own head dims)."""
    from .attention import shape_problem

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


def _parse_ctas(spec: str | None) -> dict:
    if not spec:
        return {}
    try:
        parts = [int(x) for x in spec.split(":")]
    except ValueError:
        raise click.BadParameter(f"--ctas must be FIRST:COUNT[:STRIDE], got {spec!r}") from None
    if len(parts) not in (2, 3) or parts[0] < 0 or parts[1] < 1 or (len(parts) == 3 and parts[2] < 1):
        raise click.BadParameter(f"--ctas must be FIRST:COUNT[:STRIDE] with COUNT, STRIDE >= 1, got {spec!r}")
    return {"cta_first": parts[0], "max_ctas": parts[1], "cta_stride": parts[2] if len(parts) == 3 else 1}


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


# ---- check ---------------------------------------------------------------------------------
@main.command()
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
    from .check import run as C
    from .check.report import exit_code, render
    from .check.rows import detect_gpu

    C.prepare_out_dir(out, force, create=False)
    try:
        deps.require("fa4trace check", "torch")
    except MissingDependency as e:
        _fail(str(e), C.EXIT_NO_GPU)
    if detect_gpu() is None:
        _fail(C.NO_GPU_MESSAGE, C.EXIT_NO_GPU)
    report = C.run_checks(out, build=build_dir, fa4_build=fa4_build, quick=quick, force=force,
                          log=lambda m: click.echo(m, err=True))
    click.echo(report.to_json() if as_json else render(report))
    return exit_code(report.verdict)


# ---- view / bench --------------------------------------------------------------------------
VIEW_ADDRESS = "127.0.0.1"


def _port_free(address: str, port: int) -> bool:
    """Whether a server could listen on address:port now (what Streamlit will try)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: TIME_WAIT is no obstacle
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


@main.command()
@click.argument("bundles", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--port", default=8501, type=click.IntRange(1, 65535), show_default=True)
@click.option("--headless", is_flag=True, help="Do not open a browser.")
@click.option("--sweep", "sweep", default=None, type=click.Path(file_okay=False, exists=True),
              help="A sweep dataset folder: its figures in the Sweep tab, its points' bundles open as A and B.")
@click.option("--merged", "merged", default=None, type=click.Path(dir_okay=False),
              help="A trace written by fa4trace merge: its traced kernels and their warps in the Profiler tab.")
def view(bundles, port, headless, sweep, merged):
    """Open the Streamlit viewer on 127.0.0.1 only: the BUNDLES given, the trace bundles in
    ./traces (a source checkout opens its own traces/), and uploads; --merged adds a merged
    torch.profiler trace's Profiler tab.
    Every bundle (the sweep folder, the merged file) is checked before the server starts."""
    import subprocess

    deps.require("fa4trace view", "streamlit", "plotly", "pandas", "viztracer")
    from . import viewer
    from .sweep.dataset import find_dataset
    from .trace.bundle import load

    server = Path(viewer.__file__).resolve().with_name("server.py")
    for bnd in bundles:
        load(bnd)  # every column read: no bundle, a damaged page, 0 rows fail here, not in a page later
    if sweep and find_dataset(sweep) is None:
        raise Fa4traceError(f"{sweep}: not a sweep dataset (no results/ or sweeps/ folder in it)")
    if merged:
        from .profiler.report import read_report

        read_report(merged)  # a file that is not a merged trace fails here, in one line
    if not _port_free(VIEW_ADDRESS, port):
        raise Fa4traceError(f"port {port} on {VIEW_ADDRESS} is in use (another viewer?): "
                            f"pick another with --port, e.g. fa4trace view --port {port + 1}")
    # server.py: st.App serving main.py and the Perfetto UI. Local only, and no request leaves the
    # machine: no usage statistics, and with server.address set Streamlit looks up no external IP.
    # -P: the current directory stays off sys.path, so a source checkout there cannot shadow the
    # installed package
    cmd = [sys.executable, "-P", "-m", "streamlit", "run", str(server), "--server.port", str(port),
           "--server.address", VIEW_ADDRESS, "--browser.gatherUsageStats", "false",
           "--client.toolbarMode", "minimal"]
    if headless:
        cmd += ["--server.headless", "true"]
    cmd += ["--", *[str(Path(b).resolve()) for b in bundles]]
    if sweep:
        os.environ["FA4TRACE_SWEEP"] = str(Path(sweep).resolve())  # read by the page (viewer.page.SWEEP_ENV)
    if merged:
        os.environ["FA4TRACE_MERGED"] = str(Path(merged).resolve())  # read by the page (viewer.page.MERGED_ENV)
    if os.name == "posix":
        # become the server: signals (SIGTERM from a supervisor, not only Ctrl-C) reach it directly
        # and no orphaned server survives this command
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, cmd)
    return subprocess.call(cmd)


@main.command()
@click.argument("dataset", type=click.Path(file_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="fig.html, fig.png or fig.svg.")
@click.option("--figure", "which", default="9", type=click.Choice(["9", "10", "overlap"]), show_default=True,
              help="9: TB/s over KV length; 10: TB/s over query length at the longest KV length; overlap: "
                   "QK/PV ∥ SOFTMAX per point.")
@click.option("--b", "b", default=None, type=click.IntRange(min=1),
              help="Batch of the points shown (default: 1 when measured).")
@click.option("--kernels", default=None, help="Comma list of kernels to draw (default: every kernel in the dataset).")
@click.option("--force", is_flag=True, help="Overwrite the output file if it exists.")
def plot(dataset, output, which, b, kernels, force):
    """Draw a sweep dataset's figure (results/kernel=*/d=*/hkv=*/*.parquet) to HTML, PNG or SVG.
    A selection with no point to draw (a batch, kernels not in the dataset) is an error."""
    from .sweep.dataset import require_folder

    require_folder(dataset)
    out = _check_out(output, force)
    ext = out.suffix.lower()
    if ext not in PLOT_FORMATS:
        raise click.BadParameter(f"{out}: unknown figure format {ext or '(none)'}: use .html, .png or .svg",
                                 param_hint="-o")
    if kernels is not None and which == "overlap":
        raise click.BadParameter("the overlap figure shows the ping-pong and intrawg rows; --kernels is for "
                                 "figures 9 and 10")
    deps.require("fa4trace plot", "plotly", "pandas", *(("kaleido",) if ext != ".html" else ()))
    from .sweep import figures as F

    df = F.load(dataset)
    ks = _plot_kernels(F.kernels_in(df), kernels)
    b = _plot_batch(F.batches(df), F.default_b(df) if b is None else b)
    if _plot_points(df, which, ks, b, F.OVERLAP) == 0:
        what = {"9": "q_len 1", "10": "any query length", "overlap": "ping-pong or intrawg rows at q_len 1"}[which]
        raise Fa4traceError(f"figure {which}: no point at batch {b} with {what} for {', '.join(ks)}: nothing to draw")
    click.echo(f"wrote {F.save(F.figure(df, which, ks, b=b), out)}")


PLOT_FORMATS = (".html", ".png", ".svg")


def _plot_kernels(have: list, asked: str | None) -> list:
    """--kernels: the comma list asked for, each in the dataset (default: all it has)."""
    if asked is None:
        return have
    ks = [k.strip() for k in asked.split(",") if k.strip()]
    unknown = [k for k in ks if k not in have]
    if not ks or unknown:
        raise click.BadParameter(f"{', '.join(unknown) or repr(asked)} not in the dataset; it has "
                                 f"{', '.join(have)}", param_hint="--kernels")
    return ks


def _plot_batch(have: list, b: int) -> int:
    if b not in have:
        raise click.BadParameter(f"no points at batch {b}; the dataset has batch {', '.join(map(str, have))}",
                                 param_hint="--b")
    return b


def _plot_points(df, which: str, kernels: list, b: int, overlap_kernels) -> int:
    """The rows the figure draws (the selection ``sweep.figures.figure`` makes): batch ``b``
    and, but for figure 10, q_len 1; figures 9 and 10 the kernels asked for, the overlap figure
    its own two."""
    rows = df[df["b"] == b]
    if which != "10":
        rows = rows[rows["sq"] == 1]
    return int(rows["kernel"].isin(list(overlap_kernels) if which == "overlap" else kernels).sum())


@main.command()
@click.option("--quick", is_flag=True, help="Only the sk 131072 shapes of the matrix.")
@click.option("--kernels", default="base,pingpong,intrawg,cudnn,flash,fa4", show_default=True,
              help="Comma list: base, pingpong, intrawg (options after @: r<rows per CTA>, s<splits>, p for "
                   "programmatic dependent launch, e.g. pingpong@p), cudnn, flash, fa4 (FlashAttention-4 SM90 "
                   "from its AOT build; a missing build shows as '-').")
@click.option("--replays", default=15, type=click.IntRange(min=1), show_default=True,
              help="Timed CUDA-graph replays per kernel and pass.")
@click.option("--rounds", default=5, type=click.IntRange(min=1), show_default=True,
              help="Interleaved passes over all kernels; reported: the last of 1-2, else the median of all but "
                   "the first.")
@click.option("--no-trace-overhead", is_flag=True, help="Skip the traced variants.")
@click.option("--trace-at", type=click.Choice(TRACE_AT), default="long", show_default=True,
              help="Where the traced variants are timed: long (the sk 131072, sq 1 shapes) or all (every shape).")
@click.option("--traced", default=",".join(DEFAULT_TRACED), show_default=True,
              help=f"Comma list of traced variants, each timed next to the untraced '+ref' twin: "
                   f"{', '.join(TRACED_VARIANTS)} (every warp; lead warps store; every warp with the stall "
                   "events; only the first CTA stores).")
@click.option("--only", default="", help="Filter the matrix, e.g. 'd=128,hkv=1,sk=131072'.")
@click.option("--out", default=lambda: os.environ.get("OUT", "artifacts/bench"), show_default="$OUT or artifacts/bench",
              type=click.Path(file_okay=False), help="Folder for bench.json and bench.md.")
def bench(quick, kernels, replays, rounds, no_trace_overhead, trace_at, traced, only, out):
    """Decode attention on this GPU: ours (base, pingpong, intrawg) vs cuDNN, FLASH and FA4 SM90.

    CUDA-graph replay with a cold L2, every kernel on the same inputs, interleaved passes; the
    GPU's clock and power state are logged per shape. Writes bench.json (the format
    benchmarks/report.py renders) and bench.md."""
    from .bench.decode import run, select_shapes

    try:
        select_shapes(quick=quick, only=only)
    except Fa4traceError as e:
        raise click.BadParameter(str(e), param_hint="--only") from None
    variants = tuple(t for t in traced.split(",") if t)
    bad = [t for t in variants if t not in TRACED_VARIANTS]
    if bad:
        raise click.BadParameter(f"unknown traced variant {bad[0]!r}: want {', '.join(TRACED_VARIANTS)}",
                                 param_hint="--traced")
    _require_kernels("fa4trace bench")

    run(quick=quick, kernels=kernels, replays=replays, rounds=rounds, trace_overhead=not no_trace_overhead,
        only=only, out=out, command=" ".join(["fa4trace", *sys.argv[1:]]),
        log=lambda m: click.echo(m), trace_at=trace_at, traced=variants)


# ---- sass (begin) ----------------------------------------------------------------------------
@main.command()
@click.argument("kernels", nargs=-1, metavar="[KERNEL]...")
@click.option("--arch", "archs", default="sm_90a,sm_100a", show_default=True,
              help="FILE.py:FUNCTION kernels: the architectures to compile them for, comma list (decode and "
                   "fa4-* have their own).")
@click.option("--d", "d", default="128", type=click.Choice(["64", "128"]), show_default=True,
              help="Head dim (decode, fa4-*).")
@click.option("--hq", default=16, type=click.IntRange(min=1), show_default=True, help="Query heads (fa4-*).")
@click.option("--hkv", default=1, type=click.IntRange(min=1), show_default=True, help="KV heads (fa4-*).")
@click.option("--families", default=None,
              help="Generic event families of the traced build, comma list (fa4-*: FA4's own events plus these, "
                   "default none; FILE.py:FUNCTION: default every family).")
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False), help="Write the report (JSON) here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--keep-sass", default=None, type=click.Path(file_okay=False),
              help="Also write every build's SASS listing into this folder.")
@click.option("--force", is_flag=True, help="Overwrite the output file if it exists.")
def sass(kernels, archs, d, hq, hkv, families, output, as_json, keep_sass, force):
    """The static footprint of tracing, per warp role, on any machine (no GPU): each KERNEL
    compiled plain and traced for its architecture on the CPU, its SASS read per role
    (instructions per main-loop iteration, registers, spills, shared memory), traced minus plain.

    KERNEL: decode (ours, sm_90a), decode-base, decode-intrawg, fa4-sm100-pingpong,
    fa4-sm100-base (FlashAttention-4, sm_100a), fa4-sm90, or FILE.py:FUNCTION (FUNCTION()
    returns what cute.compile takes: (function, args[, kwargs])). Default: decode,
    fa4-sm100-pingpong, fa4-sm100-base. Compare two reports with fa4trace diff A.json B.json."""
    from .bench import static
    from .bench.sass import find_tool
    from .bench.staticbuild import ARCHS, DEFAULT_TARGETS, TARGETS, parse_target

    arch_list = [a.strip() for a in archs.split(",") if a.strip()]
    bad = [a for a in arch_list if a not in ARCHS]
    if bad or not arch_list:
        raise click.BadParameter(f"unknown arch {bad[0] if bad else archs!r}: want {', '.join(ARCHS)}",
                                 param_hint="--arch")
    fams = _parse_families(families) if families is not None else None
    names = kernels or DEFAULT_TARGETS
    targets = [t for n in names for t in parse_target(n, arch_list, d=int(d), hq=hq, hkv=hkv, families=fams)]
    if fams and all(t.kind == "decode" for t in targets):
        raise click.UsageError("--families: our decode kernel records its own events; give it with fa4-* or FILE.py:FUNCTION")
    out = str(_check_out(output, force)) if output else None
    deps.require("fa4trace sass", "cutlass", *(("tvm_ffi",) if any(n in TARGETS for n in names) else ()))
    if any(t.kind == "fa4" for t in targets):
        deps.require("fa4trace sass (FlashAttention-4)", "torch", "flash_attn")
    if not find_tool("nvdisasm"):
        raise Fa4traceError("fa4trace sass needs nvdisasm (the CUDA toolkit; it also ships with Triton): not found")
    doc = static.run(targets, out=out, keep=keep_sass, command=" ".join(["fa4trace", *sys.argv[1:]]),
                     log=lambda m: click.echo(m, err=True))
    click.echo(json.dumps(doc, indent=1) if as_json else static.text(doc))
    if out:
        click.echo(f"wrote {out}", err=True)


def _diff_static_reports(base: str, new: str, as_json: bool, fail_above) -> None:
    """``fa4trace diff`` of two static reports (fa4trace sass -o): per kernel, build and role,
    what changed; --fail-above PCT exits 1 when a figure grew by more (spills from none always)."""
    from .bench import static

    try:
        a, b = static.load(base), static.load(new)
    except Fa4traceError as e:  # inputs that cannot be diffed
        _fail(_first_line(e), EXIT_USAGE)
    d = static.diff_static(a, b, threshold_pct=fail_above or 0.0)
    click.echo(json.dumps(d, indent=1) if as_json else static.diff_text(d))
    if fail_above is not None and d["beyond"]:
        sys.exit(EXIT_FAIL)
# ---- sass (end) ------------------------------------------------------------------------------


# ---- sweep / compact / query -------------------------------------------------------------
@main.command()
@click.option("--grid", "grid_file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="A TOML grid (kernels, d, heads, sk, b, sq or q_len, dtype; [[product]] tables for unions).")
@click.option("--seed-grid", is_flag=True,
              help="Colfax's decode grid: d {64,128} x {16:1,16:2} x sk 1024..131072 at b 1 q_len 1, plus "
                   "q_len {1,2,4,8} at sk 131072 (44 points).")
@click.option("--kernels", default=None,
              help="Comma list of base, pingpong, intrawg (ours) and cudnn, flash, fa4 (peers) [default: all six].")
@click.option("--d", "d", default=None, help="Head dims, comma list [default: 128].")
@click.option("--heads", default=None, help="hq:hkv pairs, comma list, e.g. 16:1,16:2 [default: 16:1].")
@click.option("--sk", default=None, help="KV lengths, comma list [default: 131072].")
@click.option("--b", "b", default=None, help="Batch sizes, comma list [default: 1].")
@click.option("--sq", "--q-len", "sq", default=None, help="Query tokens per sequence, comma list [default: 1].")
@click.option("--dtype", default=None, help="bf16 and/or fp16, comma list [default: bf16].")
@click.option("--replay", "replay", default=None, type=click.Path(file_okay=False),
              help="Instead of a grid: a folder of recorded raw trace buffers (NAME.bin + NAME.json), each "
                   "decoded, converted and analysed on the CPU into the dataset (kernel 'replay'; no timings).")
@click.option("-o", "--out", "out", required=True, type=click.Path(file_okay=False),
              help="Dataset folder (made if missing; points already in it are skipped).")
@click.option("--gpus", default=None,
              help="GPUs of this host, one worker process each: all, or comma indices (0,1; 0,0 = two workers "
                   "sharing GPU 0) [default: all]. One GPU runs in this process.")
@click.option("--workers", default=1, type=click.IntRange(min=1), show_default=True,
              help="--replay: worker processes (CPU).")
@click.option("--executor", default="local", type=click.Choice(["local", "ray"]), show_default=True,
              help="local: this host's GPUs (--gpus); ray: one Ray task per point on a Ray cluster (--address).")
@click.option("--address", default="auto", show_default=True,
              help="--executor ray: the cluster (auto: the one this node belongs to; HOST:PORT; ray://HOST:10001).")
@click.option("--point-timeout", default=None, type=click.FloatRange(min=0, min_open=True),
              help="Seconds a point may take before its worker process is killed (the point is retried once).")
@click.option("--no-compact", is_flag=True, help="Leave one result file per point (no merge at the end).")
@click.option("--force", is_flag=True, help="Re-run points whose results are already in the dataset.")
@click.option("--no-bundles", is_flag=True, help="Time only: record no trace bundles.")
@click.option("--rounds", default=2, type=click.IntRange(min=1), show_default=True,
              help="Interleaved timing passes over the kernels of a point (see fa4trace bench).")
@click.option("--replays", default=15, type=click.IntRange(min=1), show_default=True,
              help="Timed CUDA-graph replays per kernel and pass.")
def sweep(grid_file, seed_grid, kernels, d, heads, sk, b, sq, dtype, replay, out, gpus, workers, executor, address,
          point_timeout, no_compact, force, no_bundles, rounds, replays):
    """Time every kernel over a grid of decode shapes into a Parquet dataset (one result file
    per point and kernel, merged per partition at the end; one trace bundle per point and
    schedule of ours); query it with fa4trace query. Resumable: an interrupted sweep picks up
    where it stopped. Every GPU of the host by default (--gpus), or a Ray cluster (--executor ray)."""
    from .sweep import grid as G

    axes = {"d": d, "heads": heads, "sk": sk, "b": b, "sq": sq, "dtype": dtype}
    if replay and (grid_file or seed_grid or kernels or any(v is not None for v in axes.values())):
        raise click.UsageError("--replay takes its points from its folder: give no grid options with it")
    if grid_file and seed_grid:
        raise click.UsageError("give --grid or --seed-grid, not both")
    if (grid_file or seed_grid) and any(v is not None for v in axes.values()):
        raise click.UsageError("shape flags (--d, --heads, --sk, --b, --sq, --dtype) go without --grid / --seed-grid")
    if replay and gpus is not None:
        raise click.UsageError("--gpus is for GPU sweeps; replay points run on the CPU (--workers N)")
    if not replay and workers != 1:
        raise click.UsageError("--workers is for --replay; GPU sweeps take one worker per --gpus entry (0,0: two on GPU 0)")
    if executor == "ray" and (gpus is not None or workers != 1):
        raise click.UsageError("--executor ray places tasks on the cluster's GPUs: give no --gpus or --workers")
    if executor == "ray" and point_timeout is not None:
        raise click.UsageError("--point-timeout is for --executor local")
    kernels = kernels or ",".join(G.KERNELS)
    if replay:
        from .sweep.replay import ReplayGrid

        g = ReplayGrid(replay)
    elif grid_file:
        g = G.from_toml(grid_file)
    elif seed_grid:
        g = G.seed_grid(kernels)
    else:
        g = G.from_flags(kernels=kernels, **axes)
    if not out.strip():
        raise Fa4traceError("the dataset path (-o) is empty: give a folder")
    if Path(out).exists() and not Path(out).is_dir():
        raise Fa4traceError(f"{out} is a file, not a dataset folder")
    from .sweep import pool as P
    from .sweep.cuda import CudaJob, CudaRunner
    from .sweep.run import InProcess, run_sweep

    picked = None if replay or executor == "ray" else _gpus_option(P.parse_gpus, gpus)
    if executor == "ray":
        deps.require("fa4trace sweep --executor ray", "ray")
    elif not replay:
        deps.require("fa4trace sweep", "torch")
    runner = None
    if executor == "ray":
        from .sweep.ray_executor import RayExecutor
        from .sweep.replay import ReplayJob

        ex = RayExecutor(ReplayJob() if replay else CudaJob(rounds=rounds, replays=replays), address)
        ex.start(lambda m: click.echo(m, err=True))  # unreachable: one line before anything is written
    elif replay:
        from .sweep.replay import ReplayJob, ReplayRunner

        if workers > 1 or point_timeout is not None:
            ex = P.Pool(ReplayJob(), [None] * workers, point_timeout=point_timeout)
        else:
            runner = ReplayRunner()
            ex = InProcess(runner)
    else:
        visible = P.visible_gpus()
        if visible < 1:
            _fail("no CUDA GPU here: fa4trace sweep needs one (fa4trace query reads a dataset on any machine)", EXIT_USAGE)
        idx = _gpus_option(P.pick_gpus, picked, visible)
        if idx == [0] and point_timeout is None:
            runner = CudaRunner(rounds=rounds, replays=replays)
            ex = InProcess(runner)
        else:
            ex = P.Pool(CudaJob(rounds=rounds, replays=replays), [P.device_id(i) for i in idx],
                        point_timeout=point_timeout)
    try:
        doc = run_sweep(g, out, executor=ex, force=force, bundles=not no_bundles, compact=not no_compact,
                        command=" ".join(["fa4trace", *sys.argv[1:]]), log=lambda m: click.echo(m, err=True))
    finally:
        ex.close()
        if runner is not None:
            runner.close()
    lost = f", {len(doc['lost'])} lost to dead workers (retried)" if doc.get("lost") else ""
    click.echo(f"sweep {doc['sweep_id']}: {doc['points_run']} points run, {doc['error_rows']} error rows{lost}; "
               f"dataset {out}")


def _gpus_option(parse, *args):
    """``parse(*args)`` (the pool's reading of --gpus), its error named after the flag."""
    try:
        return parse(*args)
    except Fa4traceError as e:
        raise Fa4traceError(f"--gpus: {e}") from None


@main.command()
@click.argument("dataset", type=click.Path(file_okay=False))
def compact(dataset):
    """Merge a sweep dataset's result files into one file per partition (kernel / d / hkv), so
    that queries open a few files instead of one per point. fa4trace sweep does it at the end
    (unless --no-compact). Safe to re-run; a crash in the middle loses no row (readers keep
    the newest row per point and kernel)."""
    from .sweep.compact import compact as compact_dataset
    from .sweep.dataset import find_dataset, require_folder

    if find_dataset(require_folder(dataset)) is None:
        raise Fa4traceError(f"{dataset}: not a sweep dataset (no results/ or sweeps/ folder in it)")
    st = compact_dataset(dataset)
    if not st["merged"]:
        click.echo(f"{dataset}: nothing to compact ({st['partitions']} partitions, each one file already)")
        return
    click.echo(f"compacted {dataset}: {st['merged']} result files into {st['written']} "
               f"({st['rows']} rows; {st['partitions']} partitions)")


@main.command()
@click.argument("dataset", type=click.Path(file_okay=False))
@click.argument("sql")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as a JSON list of objects.")
@click.option("--csv", "as_csv", is_flag=True, help="Print the rows as CSV.")
@click.option("--force", is_flag=True,
              help="Run a statement that may write (COPY ... TO a file, even over one that exists; EXPORT, ATTACH, "
                   "CREATE, SET, ...). Without it only queries run.")
def query(dataset, sql, as_json, as_csv, force):
    """One SQL statement (DuckDB) over a sweep dataset in place: views results and sweeps.
    Read-only: a query (SELECT, WITH, DESCRIBE, SUMMARIZE, PIVOT) runs; anything that may write
    runs with --force only. Several statements are refused (chain steps with WITH).

    Example: fa4trace query runs/h200 "SELECT kernel, median(tbps) FROM results WHERE error IS NULL GROUP BY kernel"
    """
    from .sweep.query import format_table, query as run_query, to_csv, to_json

    if as_json and as_csv:
        raise click.UsageError("give --json or --csv, not both")
    t = run_query(dataset, sql, force=force)
    click.echo(to_json(t) if as_json else to_csv(t).rstrip("\n") if as_csv else format_table(t))


# ---- diff (begin) ----------------------------------------------------------------------------
# `fa4trace diff BASE NEW`: what moved beyond noise, per role and stage; --fail-above is a CI gate.
# Exit status: 0 (nothing regressed past the gate), 1 (the gate failed), 2 (inputs that cannot be
# diffed: not bundles, other kernels; and usage errors). docs/diff.md.
@main.command()
@click.argument("base", type=click.Path(dir_okay=False))
@click.argument("new", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print every figure, its change, band and status as JSON.")
@click.option("--all", "show_all", is_flag=True, help="Show every figure, not only those that moved beyond noise.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), metavar="N",
              help="How many of the figures that moved most the text names.")
@click.option("--fail-above", "fail_above", default=None, type=click.FloatRange(min=0), metavar="PCT",
              help="CI gate: exit 1 when a figure regressed beyond noise by more than PCT (% for times, points "
                   "for shares).")
@click.option("--min-ns", "min_ns", default=0.0, show_default=True, type=click.FloatRange(min=0), metavar="NS",
              help="--fail-above: a time figure fails only if it also grew by more than NS ns.")
@click.option("--ignore", "ignore", multiple=True, metavar="GLOB",
              help="--fail-above: leave out figures whose id matches (e.g. 'producer/*'); repeat for more.")
@click.option("--repeats", is_flag=True,
              help="Each bundle's launches repeat one launch (a loop around the same call): pool them, so that "
                   "the noise band holds the launch-to-launch noise. Default: launch i of BASE vs launch i of NEW.")
@click.option("--confidence", default=0.95, show_default=True, type=click.FloatRange(0.5, 0.999),
              help="Family-wise level of the noise bands (all figures together).")
@click.option("--min-change", "min_change", default=1.0, show_default=True, type=click.FloatRange(min=0),
              metavar="PCT", help="A change beyond its noise band but below PCT (% for times, points for shares) is "
                                  "negligible: the SM clock drifts about that much between two recordings.")
@click.option("--roles", "roles", multiple=True, metavar="ROLE=WARPS", help=ROLES_HELP)
def diff(base, new, as_json, show_all, top, fail_above, min_ns, ignore, repeats, confidence, min_change, roles):
    """What moved from BASE to NEW, two bundles of one kernel: per role and stage (spans, waits,
    producer -> consumer lags, overlaps, busy/waiting/idle, CTA duration), the change with its
    noise band from the CTAs (or launches) of each bundle; names the figures that moved beyond
    noise, the most first. Exit status: 0, 1 when --fail-above fails, 2 when the inputs cannot be
    diffed."""
    if diff_input_kind(base) == diff_input_kind(new) == "JSON":  # two static reports (fa4trace sass -o)
        return _diff_static_reports(base, new, as_json, fail_above)
    if (min_ns or ignore) and fail_above is None:
        raise click.UsageError("--min-ns and --ignore shape the gate: give --fail-above PCT with them")
    try:
        for which, path in (("BASE", base), ("NEW", new)):
            kind = diff_input_kind(path)
            if kind == "missing":
                raise Fa4traceError(f"{path}: no such file")
            if kind == "another file":  # as fa4trace summary says it
                raise Fa4traceError(f"{path} is not a Parquet trace bundle")
            if kind != "bundle":
                raise Fa4traceError(f"{which} ({path}) is {kind}, not a trace bundle: fa4trace diff compares two "
                                    "bundles of one kernel")
        result = _diff_bundles(base, new, roles=_parse_roles(roles), repeats=repeats, confidence=confidence,
                               min_change=min_change)
    except Fa4traceError as e:  # inputs that cannot be diffed: not the gate's failure
        _fail(_first_line(e), EXIT_USAGE)
    from .analysis.diff import format_diff, regressions_above

    failed = [] if fail_above is None else regressions_above(result, fail_above, min_ns=min_ns, ignore=ignore)
    if fail_above is not None:
        result["gate"] = {"fail_above": fail_above, "min_ns": min_ns, "ignore": list(ignore),
                          "failed": [f["id"] for f in failed]}
    click.echo(json.dumps(result, indent=1, sort_keys=True) if as_json
               else format_diff(result, show_all=show_all, top=top))
    if failed:
        from .analysis.diff import change_text

        what = ", ".join(f"{f['id']} {change_text(f)}" for f in failed[:3]) + (", ..." if len(failed) > 3 else "")
        unit = "% (points for shares)" + (f" and {min_ns:g} ns" if min_ns else "")
        click.echo(f"fa4trace: diff: {len(failed)} figure(s) regressed beyond noise by more than {fail_above:g}"
                   f"{unit}: {what}", err=True)
        sys.exit(EXIT_FAIL)


def diff_input_kind(path: str) -> str:
    """What a diff input is, from its first bytes: "bundle" (Parquet: a trace bundle), "JSON",
    "a folder", "missing" or "another file". The command dispatches on it (another kind of
    input gets its branch there)."""
    p = Path(path)
    if not p.exists():
        return "missing"
    if p.is_dir():
        return "a folder"
    with open(p, "rb") as f:
        head = f.read(64)
    if head[:4] == b"PAR1":
        return "bundle"
    if head.lstrip()[:1] in (b"{", b"["):
        return "JSON"
    return "another file"


def _diff_bundles(base: str, new: str, **kw) -> dict:
    """analysis.diff of two bundle files, with the files' paths in its answer."""
    from .analysis.diff import diff as diff_traces
    from .trace.bundle import load

    result = diff_traces(load(base), load(new), **kw)
    result["base"]["path"], result["new"]["path"] = str(base), str(new)
    return result
# ---- diff (end) ------------------------------------------------------------------------------

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
