"""What a compiled kernel function is: its exported name, its kind and its config.

Kernels describe their variants with it (``aot_variants``), ``fa4trace build`` writes it into a
build's ``manifest.json`` and the loader looks functions up by it; device and host code both
stand on it, so it lives in the format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Entry:
    name: str  # exported symbol name (also the key in the manifest)
    kind: str  # e.g. "calibration", "markers", "attention", "combine"
    config: dict[str, Any] = field(default_factory=dict)
