"""Traces on the host: ``decode`` (a buffer into an Arrow table), ``bundle`` (the Parquet file
and ``Trace``), ``synthetic`` (buffers made on the CPU, for tests and benchmarks).

Imports only ``fa4trace.format``.
"""
