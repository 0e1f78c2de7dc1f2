"""Writing exported byte chunks to a path or an open binary file (shared by the exporters)."""

from __future__ import annotations

import os
from typing import Iterable


def write_parts(path_or_file, parts: Iterable) -> int:
    """Write each bytes-like part in order; return the total byte count."""
    if isinstance(path_or_file, (str, os.PathLike)):
        with open(path_or_file, "wb") as f:
            return write_parts(f, parts)
    total = 0
    for p in parts:
        path_or_file.write(p)
        total += len(p)
    return total
