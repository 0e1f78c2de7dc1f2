"""`fa4trace bench` and `sass`: what kernels and tracing cost, timed on this machine's GPU (the
decode matrix) or counted in the SASS of builds compiled on the CPU (the static footprint per
warp role); the work is ``fa4trace.bench``'s."""

from __future__ import annotations

import json
import os
import sys

import click

from ..bench.options import DEFAULT_TRACED, TRACE_AT, TRACED_VARIANTS
from ..format.errors import Fa4traceError
from ..run import deps
from .common import check_out, parse_families, require_kernels


# ---- bench ---------------------------------------------------------------------------------
@click.command()
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
    from ..bench.decode import run, select_shapes

    try:
        select_shapes(quick=quick, only=only)
    except Fa4traceError as e:
        raise click.BadParameter(str(e), param_hint="--only") from None
    variants = tuple(t for t in traced.split(",") if t)
    bad = [t for t in variants if t not in TRACED_VARIANTS]
    if bad:
        raise click.BadParameter(f"unknown traced variant {bad[0]!r}: want {', '.join(TRACED_VARIANTS)}",
                                 param_hint="--traced")
    require_kernels("fa4trace bench")

    run(quick=quick, kernels=kernels, replays=replays, rounds=rounds, trace_overhead=not no_trace_overhead,
        only=only, out=out, command=" ".join(["fa4trace", *sys.argv[1:]]),
        log=lambda m: click.echo(m), trace_at=trace_at, traced=variants)


# ---- sass ----------------------------------------------------------------------------------
@click.command()
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
    from ..bench import static
    from ..bench.sass import find_tool
    from ..bench.staticbuild import ARCHS, DEFAULT_TARGETS, TARGETS, parse_target

    arch_list = [a.strip() for a in archs.split(",") if a.strip()]
    bad = [a for a in arch_list if a not in ARCHS]
    if bad or not arch_list:
        raise click.BadParameter(f"unknown arch {bad[0] if bad else archs!r}: want {', '.join(ARCHS)}",
                                 param_hint="--arch")
    fams = parse_families(families) if families is not None else None
    names = kernels or DEFAULT_TARGETS
    targets = [t for n in names for t in parse_target(n, arch_list, d=int(d), hq=hq, hkv=hkv, families=fams)]
    if fams and all(t.kind == "decode" for t in targets):
        raise click.UsageError("--families: our decode kernel records its own events; give it with fa4-* or FILE.py:FUNCTION")
    out = str(check_out(output, force)) if output else None
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
