"""fa4trace inside a torch.profiler trace: one timeline from Python op to warp.

    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with fa4trace.instrument() as recording:
            out = model(x)                       # CuTe DSL kernels compile and run traced
    fa4trace.profiler.attach(prof, recording, "one.pftrace")   # host ops, streams, warps

or, from files: ``fa4trace merge prof.json A.parquet B.parquet -o one.pftrace``.

Modules: :mod:`.kineto` reads the profiler's Chrome JSON into columns, :mod:`.match` pairs each
traced launch with its CUDA kernel activity, :mod:`.merge` writes the one Perfetto trace,
:mod:`.report` says what was matched and how well the clocks agree (and reads that back from
a merged file), :mod:`.synthetic` makes profiler traces around bundles on any machine. Host-only:
nothing here imports torch or the CuTe DSL.
"""

from .kineto import KinetoTrace, load_kineto
from .match import LAUNCH_FIELDS, match_launches, traced_launches
from .merge import ALIGN_MODES, attach, merge
from .report import MergeReport, read_report

__all__ = ["attach", "merge", "load_kineto", "KinetoTrace", "match_launches", "traced_launches", "MergeReport",
           "read_report", "LAUNCH_FIELDS", "ALIGN_MODES"]
