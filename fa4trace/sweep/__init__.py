"""Sweeps: time every kernel over a grid of decode shapes and keep the results, and one trace
bundle per (shape, schedule of ours), as a hive-partitioned Parquet dataset that DuckDB queries
in place.

    grid          the points (from flags, a TOML file or the seed grid), checked up front
    dataset       the on-disk layout, atomic writes, resume, the newest row per (point, kernel)
    job           what goes to a worker (``Task``) and comes back (``PointResult``: rows, bundle bytes)
    cuda          the GPU job: ``Runner`` (time, record), ``CudaRunner``, ``CudaJob``
    replay        the CPU job: recorded raw buffers decoded, converted and analysed
    run           the sweep loop (the driver writes every file) and the in-process executor
    pool          one worker process per GPU of this host
    ray_executor  one Ray task per point on a Ray cluster
    compact       one result file per partition, for fast queries
    query         SQL over a dataset (``results`` and ``sweeps`` views)
    figures       the dataset's figures (``fa4trace plot``, the viewer's Sweep tab; pandas and plotly)
"""

from .dataset import RESULT_SCHEMA, Dataset, point_id
from .grid import KERNELS, OURS, PEERS, Grid, Point, seed_grid

__all__ = ["RESULT_SCHEMA", "Dataset", "point_id", "KERNELS", "OURS", "PEERS", "Grid", "Point", "seed_grid"]
