"""`fa4trace merge`: a torch.profiler trace and fa4trace bundles in one Perfetto trace (with
--ranks, every rank's on one clock); the work is ``fa4trace.profiler``'s."""

from __future__ import annotations

import json

import click

from .common import check_out


@click.command()
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
    from ..profiler import MergeOptions
    from ..profiler import merge as merge_traces

    out = check_out(output, force)
    opts = MergeOptions(align=align, rank_clock=rank_clock, max_launches=max_launches, compress=compress,
                        analysis=not no_numbers, max_clock_offset_ns=int(max_clock_offset * 1e9),
                        allow_unmatched=allow_unmatched)
    if several:
        from ..profiler import merge_ranks, rank_inputs

        report = merge_ranks(rank_inputs([profile, *bundles]), out, options=opts, force=force)
    else:
        if not bundles:
            raise click.UsageError("Missing argument 'BUNDLES...': name at least one fa4trace bundle after the "
                                   "profiler trace (several ranks' traces: add --ranks)", click.get_current_context())
        report = merge_traces(profile, list(bundles), out, options=opts, force=force)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=1, default=str))
        return
    for line in report.lines():
        click.echo(line)
    w = report.written
    click.echo(f"wrote {out} ({w['bytes']:,} bytes, {w['slices']:,} slices, {w['seconds']:.1f} s); "
               f"open it in ui.perfetto.dev or: fa4trace view --merged {out}")
