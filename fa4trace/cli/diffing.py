"""`fa4trace diff BASE NEW`: what moved beyond noise between two bundles of one kernel, per role
and stage (``fa4trace.analysis.diff``), or between two static reports (`fa4trace sass -o`,
``fa4trace.bench.static``); --fail-above is a CI gate.

Exit status: 0 (nothing regressed past the gate), 1 (the gate failed), 2 (inputs that cannot be
diffed: not bundles, other kernels; and usage errors). docs/diff.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..format.errors import Fa4traceError
from .common import EXIT_FAIL, EXIT_USAGE, ROLES_HELP, fail, first_line, parse_roles


@click.command()
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
        result = _diff_bundles(base, new, roles=parse_roles(roles), repeats=repeats, confidence=confidence,
                               min_change=min_change)
    except Fa4traceError as e:  # inputs that cannot be diffed: not the gate's failure
        fail(first_line(e), EXIT_USAGE)
    from ..analysis.diff import format_diff, regressions_above

    failed = [] if fail_above is None else regressions_above(result, fail_above, min_ns=min_ns, ignore=ignore)
    if fail_above is not None:
        result["gate"] = {"fail_above": fail_above, "min_ns": min_ns, "ignore": list(ignore),
                          "failed": [f["id"] for f in failed]}
    click.echo(json.dumps(result, indent=1, sort_keys=True) if as_json
               else format_diff(result, show_all=show_all, top=top))
    if failed:
        from ..analysis.diff import change_text

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
    from ..analysis.diff import diff as diff_traces
    from ..trace.bundle import load

    result = diff_traces(load(base), load(new), **kw)
    result["base"]["path"], result["new"]["path"] = str(base), str(new)
    return result


def _diff_static_reports(base: str, new: str, as_json: bool, fail_above) -> None:
    """``fa4trace diff`` of two static reports (fa4trace sass -o): per kernel, build and role,
    what changed; --fail-above PCT exits 1 when a figure grew by more (spills from none always)."""
    from ..bench import static

    try:
        a, b = static.load(base), static.load(new)
    except Fa4traceError as e:  # inputs that cannot be diffed
        fail(first_line(e), EXIT_USAGE)
    d = static.diff_static(a, b, threshold_pct=fail_above or 0.0)
    click.echo(json.dumps(d, indent=1) if as_json else static.diff_text(d))
    if fail_above is not None and d["beyond"]:
        sys.exit(EXIT_FAIL)
