"""Generators of synthetic bundles and torch.profiler runs, for tests, benchmarks and demos.

Nothing in this package is a measurement: the bundles and traces it makes are marked synthetic
(a bundle's ``synthetic`` metadata, a profiler trace's ``"synthetic": true``). ``bundles``: raw trace buffers
laid out as the device recorder writes them, and plausible attention / pipelined / sampled
launches; ``profiler``: a torch.profiler trace (one process or several ranks) around such
bundles; ``replay``: a folder of replay points for ``fa4trace sweep --replay``; ``samples``: the
small profiler samples in ``traces/profiler/`` (``python -m fa4trace.testing.samples``).

It sits above the product (it imports ``trace``, ``profiler`` and ``sweep``); no product module
imports it.
"""
