"""Sweeps: time every kernel over a grid of decode shapes and keep the results, and one trace
bundle per (shape, schedule of ours), as a hive-partitioned Parquet dataset that DuckDB queries
in place.

    grid     the points (from flags, a TOML file or the seed grid), checked up front
    dataset  the on-disk layout, atomic writes, resume
    run      the runner (GPU work behind the ``Runner`` interface) and the sweep loop
    query    SQL over a dataset (``results`` and ``sweeps`` views)
"""

from .dataset import RESULT_SCHEMA, Dataset, point_id
from .grid import KERNELS, OURS, PEERS, Grid, Point, seed_grid

__all__ = ["RESULT_SCHEMA", "Dataset", "point_id", "KERNELS", "OURS", "PEERS", "Grid", "Point", "seed_grid"]
