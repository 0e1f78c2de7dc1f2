"""`fa4trace` command line: the command group and its commands, one module per group of verbs.

- ``reading``: summary, compare, convert (one bundle, two bundles, an export)
- ``viewing``: view (the Streamlit viewer)
- ``recording``: record, build, check (on this machine's GPU)
- ``measuring``: bench, sass (what kernels and tracing cost)
- ``merging``: merge (torch.profiler traces and bundles on one timeline)
- ``diffing``: diff (what moved between two bundles or two static reports)
- ``sweeping``: sweep, compact, query, plot (a sweep dataset)
- ``common``: what they share: one-line errors, the output-file check, shared options

Every failure prints one line (``fa4trace: error: ...``) and exits non-zero; nothing a user
recorded is overwritten without --force. Commands import what they run inside their function,
so that the command line starts fast and a host command imports no torch or cutlass.
"""

from __future__ import annotations

import click

from . import diffing, measuring, merging, reading, recording, sweeping, viewing
from .common import OneLineErrors


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fa4trace", prog_name="fa4trace")
def main():
    """Per-warp timelines of GPU kernels written in NVIDIA's CuTe DSL: record, inspect, compare, view."""


for _command in (reading.summary, reading.compare, reading.convert, viewing.view,
                 recording.record, recording.build, recording.check, measuring.bench, measuring.sass,
                 merging.merge, diffing.diff,
                 sweeping.sweep, sweeping.compact, sweeping.query, sweeping.plot):
    main.add_command(_command)
