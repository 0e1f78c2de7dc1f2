"""The synthetic torch.profiler samples of ``traces/profiler/``: something to try ``fa4trace merge``,
``fa4trace merge --ranks``, ``fa4trace view --merged`` and the viewer's Profiler tab on, on a
machine without a GPU. Nothing in them is a measurement (every file is marked synthetic)::

    python -m fa4trace.testing.samples traces/profiler --force     # writes them again, the same

``single/``: one process's profiler trace (``synthetic_prof.json``: 2 steps of a 2-layer loop)
with two bundles of its kernels, a GEMM-like kernel traced by automatic events (2 launches) and an
attention kernel with hand-placed events (1 launch). ``ranks/``: two ranks of a tensor-parallel
run, each its profiler trace (an NCCL all-reduce per layer, 8 in all) and its bundle of the
GEMM-like kernel; rank 1's clock is written ``RANK1_CLOCK_OFFSET_NS`` off rank 0's, which the
merge's clock alignment finds. Every input is seeded: the same fa4trace writes the same files.
"""

from __future__ import annotations

from pathlib import Path

from ..format.errors import Fa4traceError
from ..trace import decode
from ..trace.bundle import Trace
from .bundles import attention_like, pipelined_like
from .profiler import ProfiledRun, profiled_ranks, profiled_run

SINGLE = "single"
RANKS = "ranks"
RANK1_CLOCK_OFFSET_NS = 150_000  # rank 1's profiler clock and bundles, this far off rank 0's
GEMM_KERNEL = "SyntheticGemm.kernel"  # the qualname the GEMM-like bundle's kernel goes by


def gemm_bundle(n_launches: int = 2) -> Trace:
    """A GEMM-like kernel traced by automatic events (``pipelined_like``): ``n_launches`` launches
    of 4 CTAs and 8 k-tiles (the profiler run places each at its own time)."""
    launches, meta, vocab = [], None, None
    for i in range(n_launches):
        buf, meta, vocab = pipelined_like(n_ctas=4, k_tiles=8)
        launches.append(decode.decode_buffer(buf, launch_index=i, vocab=vocab))
    meta["instrument"]["kernels"] = [GEMM_KERNEL]
    meta["kernel"] = GEMM_KERNEL.split(".")[0]
    return Trace.from_launches(launches, _unstamped(meta), vocab=vocab)


def attention_bundle() -> Trace:
    """Our decode schedule "pingpong" with hand-placed events (``attention_like``): 6 CTAs, 6 KV blocks."""
    buf, meta = attention_like("pingpong", n_ctas=6, n_blocks=6)
    return Trace.from_launches([decode.decode_buffer(buf)], _unstamped(meta))


def _unstamped(meta: dict) -> dict:
    """No recording time: a synthetic bundle was recorded at none (and the files stay the same)."""
    return dict(meta, recorded_at=None)


def single_run() -> ProfiledRun:
    """One process: the profiler trace and its two bundles, re-timed into it."""
    return profiled_run([gemm_bundle(), attention_bundle()], steps=2, layers=2, seed=0)


def rank_runs() -> list[ProfiledRun]:
    """Two ranks, one GEMM-like bundle each; rank 1 ``RANK1_CLOCK_OFFSET_NS`` off."""
    return profiled_ranks([gemm_bundle()], 2, host_clock_offsets_ns=[0, RANK1_CLOCK_OFFSET_NS],
                          steps=2, layers=4, seed=0)


def sample_files() -> dict[str, str | Trace]:
    """Every sample file, by its path under the samples folder: a profiler trace's text or a bundle."""
    run = single_run()
    files: dict[str, str | Trace] = {f"{SINGLE}/synthetic_prof.json": run.text,
                                     f"{SINGLE}/synthetic_gemm.parquet": run.traces[0],
                                     f"{SINGLE}/synthetic_attention.parquet": run.traces[1]}
    for r in rank_runs():
        files[f"{RANKS}/synthetic_prof_rank{r.rank}.json"] = r.text
        files[f"{RANKS}/synthetic_step_rank{r.rank}_gemm.parquet"] = r.traces[0]
    return files


def write_samples(folder, *, force: bool = False) -> list[Path]:
    """Write :func:`sample_files` under ``folder``; an existing file is replaced only with ``force``
    (else Fa4traceError, and nothing is written)."""
    folder = Path(folder)
    files = sample_files()
    there = [rel for rel in files if (folder / rel).exists()]
    if there and not force:
        raise Fa4traceError(f"{folder / there[0]} exists; refusing to overwrite the samples (add --force)")
    out = []
    for rel, what in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(what, Trace):
            what.save(path, overwrite=True)
        else:
            path.write_text(what)
        out.append(path)
    return out


def main(argv=None) -> int:
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m fa4trace.testing.samples",
                                 description="Write the synthetic torch.profiler samples (traces/profiler/).")
    ap.add_argument("folder", help="where to write them (traces/profiler in the source tree)")
    ap.add_argument("--force", action="store_true", help="replace sample files that are there")
    args = ap.parse_args(argv)
    try:
        paths = write_samples(args.folder, force=args.force)
    except Fa4traceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(paths)} synthetic sample files under {args.folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
