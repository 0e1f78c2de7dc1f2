"""fa4trace inside a torch.profiler trace: one timeline from Python op to warp.

    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with fa4trace.instrument() as recording:
            out = model(x)                       # CuTe DSL kernels compile and run traced
    fa4trace.profiler.attach(prof, recording, "one.pftrace")   # host ops, streams, warps

or, from files: ``fa4trace merge prof.json A.parquet B.parquet -o one.pftrace``; several ranks of a
distributed program (one profiler trace each) on one clock: ``fa4trace merge --ranks run/ -o all.pftrace``.

Modules: :mod:`.kineto` reads the profiler's Chrome JSON into columns, :mod:`.match` pairs each
traced launch with its CUDA kernel activity, :mod:`.merge` writes the one Perfetto trace
(:mod:`.host`: the profiler's events as tracks; :mod:`.render`: a traced launch's tracks;
:mod:`.packets`: ids, descriptors, the report slice), :mod:`.ranks` writes several ranks into one
(:mod:`.groups`: which files are which rank's; :mod:`.collectives`: the ranks' clocks from their
collectives), :mod:`.options` holds how a merge places and writes
(``MergeOptions``), :mod:`.report` says what was matched and how well the clocks agree (and reads that
back from a merged file). Synthetic profiler traces around bundles, on any machine:
``fa4trace.testing.profiler``.
Host-only: nothing here imports torch or the CuTe DSL.
"""

from .kineto import KinetoTrace, load_kineto
from .match import LAUNCH_FIELDS, match_launches, traced_launches
from .merge import attach, merge
from .options import ALIGN_MODES, MergeOptions
from .collectives import RANK_CLOCKS
from .groups import rank_inputs
from .ranks import RankInput, merge_ranks
from .report import MergeReport, read_report

__all__ = ["attach", "merge", "merge_ranks", "MergeOptions", "RankInput", "rank_inputs", "load_kineto", "KinetoTrace",
           "match_launches", "traced_launches", "MergeReport", "read_report", "LAUNCH_FIELDS", "ALIGN_MODES",
           "RANK_CLOCKS"]
