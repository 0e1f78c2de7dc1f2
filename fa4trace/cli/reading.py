"""`fa4trace summary`, `compare` and `convert`: what one bundle holds, how two bundles differ,
and a bundle exported to Perfetto or Chrome JSON; with the text of the summary and comparison
of our attention kernels (bundles of automatically traced kernels get theirs from
``fa4trace.analysis.text``)."""

from __future__ import annotations

import json

import click

from ..format.errors import Fa4traceError
from .common import ROLES_HELP, check_out, parse_roles


# ---- summary -------------------------------------------------------------------------------
@click.command()
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
    from ..analysis.autoevents import is_automatic
    from ..trace.bundle import load

    if (calibration or recorder) and not compensate:
        raise click.UsageError("--calibration and --recorder go with --compensate")
    trace = load(bundle)
    if is_automatic(trace):
        from ..analysis.kernel import summarize_kernel
        from ..analysis.text import format_kernel_summary

        trace, by_pass = _passes_of(trace, parse_roles(roles), launch)
        s = summarize_kernel(trace, parse_roles(roles), launch)
        if by_pass:
            s["passes"] = by_pass
        _add_compensation(s, trace, compensate, calibration, recorder, launch)
        click.echo(json.dumps(s, indent=1, sort_keys=True) if as_json else format_kernel_summary(s)
                   + "".join("\n" + line for line in _pass_lines(by_pass)) + _compensation_text(s))
        return
    if roles:
        raise click.UsageError("--roles applies to bundles of automatically traced kernels (meta 'instrument')")
    from ..analysis.overlap import summarize

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
    from ..analysis import compensate as C

    cals = C.load_calibrations(calibration) if calibration else None
    s["compensation"] = C.summary_by_launch(trace, C.calibration_for(trace, cals, recorder=recorder), launch)


def _compensation_text(s: dict) -> str:
    from ..analysis.compensate import lines

    return "".join("\n" + line for line in lines(s["compensation"])) if "compensation" in s else ""


# -- a bundle recorded with passes (instrument(passes=...), record --passes) --
def _passes_of(trace, roles: dict, launch):
    """(the bundle's main recording, per call shown: each figure from its lightest pass) where
    the bundle was recorded with passes (fa4trace.analysis.passes), else (the bundle, None).
    ``launch`` (--launch, an index among the main recording's launches): its call only."""
    from ..analysis.passes import DENSE, calls, has_passes, pass_traces, sourced_figures

    if not has_passes(trace):
        return trace, None
    dense = pass_traces(trace).get(DENSE, trace)
    shown = calls(trace)
    main_launches = dense.info.launches
    if launch is not None and 0 <= launch < len(main_launches):
        shown = [int(main_launches[launch].call or 0)]
    return dense, [sourced_figures(trace, roles, c) for c in shown]


def _pass_lines(by_pass) -> list:
    from ..analysis.passes import figures_lines

    return [line for sourced in by_pass or [] for line in figures_lines(sourced)]


# -- the text of a summary and a comparison --
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
    from ..analysis.text import dropped_text, format_launches, launch_text, other_launches_lines, perturbation_text
    from ..analysis.words import config_value

    if s.get("per_launch"):
        return format_launches(s, _format_summary)
    cfg = s.get("config") or {}
    shape = " ".join(f"{k}={config_value(v)}" for k, v in cfg.items())
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


# ---- compare -------------------------------------------------------------------------------
@click.command()
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
    from ..analysis.autoevents import is_automatic
    from ..analysis.overlap import compare as cmp
    from ..trace.bundle import load

    launch_a = launch if launch_a is None else launch_a
    launch_b = launch if launch_b is None else launch_b
    ta, tb = load(a), load(b)
    auto = (is_automatic(ta), is_automatic(tb))
    if any(auto):
        if not all(auto):
            which = "A" if auto[0] else "B"
            raise Fa4traceError(f"{which} is a bundle of an automatically traced kernel and the other is not: "
                                "compare needs two bundles of the same kernel")
        from ..analysis.kernel import compare_kernels
        from ..analysis.text import format_kernel_compare

        c = compare_kernels(ta, tb, parse_roles(roles), launch_a, launch_b)
        click.echo(json.dumps(c, indent=1, sort_keys=True) if as_json else format_kernel_compare(c))
        return
    if roles:
        raise click.UsageError("--roles applies to bundles of automatically traced kernels (meta 'instrument')")
    c = cmp(ta, tb, launch_a, launch_b)
    if as_json:
        click.echo(json.dumps(c, indent=1, sort_keys=True))
        return
    from ..analysis.text import pairs_text

    click.echo(pairs_text(c, _format_compare) if c.get("pairs") else _format_compare(c))


def _format_compare(c: dict) -> str:
    """The text of `fa4trace compare` for bundles of our attention kernels (one launch pair)."""
    from ..analysis.text import pair_line, perturbation_text

    out = [pair_line(c)] if pair_line(c) else []
    rows = [("kernel time", "kernel_time_ns", _ns), ("bandwidth", "bandwidth_tbps", _tbps),
            ("QK ∥ SOFTMAX", "qk_softmax_overlap", _pct), ("PV ∥ SOFTMAX", "pv_softmax_overlap", _pct),
            ("hidden softmax", "hidden_softmax_ns", _ns), ("period", "period_ns", _ns),
            ("tensor cores busy", "tensor_core_busy", _pct),
            ("mainloop idle share", "mainloop_idle_share", _pct), ("KV stream steady", "stream_tbps", _tbps),
            ("stream start loss", "stream_start_loss_ns", _ns), ("after the stream", "after_stream_ns", _ns),
            ("dropped", "dropped", str)]
    short = {"cold_l2_bench": "cold-L2 bench", "recorded_inputs": "recorded inputs", "plain_twin": "plain twin",
             "launch_span": "launch span", "trace_span": "trace span"}
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
    from ..analysis.overlap import diff_text

    d = c.get("differs") or {}
    notes = []
    if d.get("kernel"):
        notes.append(f"note: A is kernel {d['kernel'][0]}, B is kernel {d['kernel'][1]}")
    if d.get("config") and not c.get("speed"):
        notes.append(f"note: A and B ran different shapes ({diff_text(d['config'])})")
    return notes


# ---- convert -------------------------------------------------------------------------------
@click.command()
@click.argument("bundle", type=click.Path(dir_okay=False))
@click.option("--to", "fmt", type=click.Choice(["perfetto", "chrome"]), required=True, help="Output format.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output file.")
@click.option("--compress", is_flag=True, help="Perfetto: zlib-compressed packets (smaller file).")
@click.option("--force", is_flag=True, help="Overwrite the output file if it exists.")
def convert(bundle, fmt, output, compress, force):
    """Export a bundle to Perfetto (.pftrace, TrackEvent protobuf) or Chrome JSON."""
    from ..trace.bundle import load

    if compress and fmt != "perfetto":
        raise click.UsageError("--compress applies to --to perfetto only")
    out = check_out(output, force)
    from ..analysis.kernel import export_inputs

    shown, occupancy = export_inputs(load(bundle))  # roles and stage occupancy: analysis before export
    if fmt == "perfetto":
        from ..export.perfetto import to_perfetto

        stats = to_perfetto(shown, out, compress=compress, occupancy=occupancy)
    else:
        from ..export.chrome import to_chrome

        stats = to_chrome(shown, out)
    click.echo(f"wrote {out} ({out.stat().st_size} bytes){_stats_suffix(stats)}")


def _stats_suffix(stats) -> str:
    if hasattr(stats, "as_dict"):
        stats = stats.as_dict()
    if isinstance(stats, dict):
        bits = [f"{k}={v}" for k, v in stats.items() if isinstance(v, (int, float, str)) and k != "path"]
        return (": " + ", ".join(bits[:6])) if bits else ""
    return ""
