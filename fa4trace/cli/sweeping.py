"""`fa4trace sweep`, `compact`, `query` and `plot`: time kernels over a grid of shapes into a
Parquet dataset, merge its result files, ask it SQL, draw its figures; the work is
``fa4trace.sweep``'s."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..format.errors import Fa4traceError
from ..run import deps
from .common import EXIT_USAGE, check_out, fail


# ---- sweep ---------------------------------------------------------------------------------
@click.command()
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
    from ..sweep import grid as G

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
        from ..sweep.replay import ReplayGrid

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
    from ..sweep import pool as P
    from ..sweep.cuda import CudaJob, CudaRunner
    from ..sweep.run import InProcess, run_sweep

    picked = None if replay or executor == "ray" else _gpus_option(P.parse_gpus, gpus)
    if executor == "ray":
        deps.require("fa4trace sweep --executor ray", "ray")
    elif not replay:
        deps.require("fa4trace sweep", "torch")
    runner = None
    if executor == "ray":
        from ..sweep.ray_executor import RayExecutor
        from ..sweep.replay import ReplayJob

        ex = RayExecutor(ReplayJob() if replay else CudaJob(rounds=rounds, replays=replays), address)
        ex.start(lambda m: click.echo(m, err=True))  # unreachable: one line before anything is written
    elif replay:
        from ..sweep.replay import ReplayJob, ReplayRunner

        if workers > 1 or point_timeout is not None:
            ex = P.Pool(ReplayJob(), [None] * workers, point_timeout=point_timeout)
        else:
            runner = ReplayRunner()
            ex = InProcess(runner)
    else:
        visible = P.visible_gpus()
        if visible < 1:
            fail("no CUDA GPU here: fa4trace sweep needs one (fa4trace query reads a dataset on any machine)", EXIT_USAGE)
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


# ---- compact / query -----------------------------------------------------------------------
@click.command()
@click.argument("dataset", type=click.Path(file_okay=False))
def compact(dataset):
    """Merge a sweep dataset's result files into one file per partition (kernel / d / hkv), so
    that queries open a few files instead of one per point. fa4trace sweep does it at the end
    (unless --no-compact). Safe to re-run; a crash in the middle loses no row (readers keep
    the newest row per point and kernel)."""
    from ..sweep.compact import compact as compact_dataset
    from ..sweep.dataset import find_dataset, require_folder

    if find_dataset(require_folder(dataset)) is None:
        raise Fa4traceError(f"{dataset}: not a sweep dataset (no results/ or sweeps/ folder in it)")
    st = compact_dataset(dataset)
    if not st["merged"]:
        click.echo(f"{dataset}: nothing to compact ({st['partitions']} partitions, each one file already)")
        return
    click.echo(f"compacted {dataset}: {st['merged']} result files into {st['written']} "
               f"({st['rows']} rows; {st['partitions']} partitions)")


@click.command()
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
    from ..sweep.query import format_table, query as run_query, to_csv, to_json

    if as_json and as_csv:
        raise click.UsageError("give --json or --csv, not both")
    t = run_query(dataset, sql, force=force)
    click.echo(to_json(t) if as_json else to_csv(t).rstrip("\n") if as_csv else format_table(t))


# ---- plot ----------------------------------------------------------------------------------
@click.command()
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
    from ..sweep.dataset import require_folder

    require_folder(dataset)
    out = check_out(output, force)
    ext = out.suffix.lower()
    if ext not in PLOT_FORMATS:
        raise click.BadParameter(f"{out}: unknown figure format {ext or '(none)'}: use .html, .png or .svg",
                                 param_hint="-o")
    if kernels is not None and which == "overlap":
        raise click.BadParameter("the overlap figure shows the ping-pong and intrawg rows; --kernels is for "
                                 "figures 9 and 10")
    deps.require("fa4trace plot", "plotly", "pandas", *(("kaleido",) if ext != ".html" else ()))
    from ..sweep import figures as F

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
