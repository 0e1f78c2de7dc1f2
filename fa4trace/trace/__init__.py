"""Traces on the host: ``decode`` (a buffer into an Arrow table), ``bundle`` (the Parquet file
and ``Trace``), ``meta`` (its metadata, typed), ``files``, ``ranks``. Synthetic buffers for tests
and benchmarks are in ``fa4trace.testing``.

Imports only ``fa4trace.format``.
"""
