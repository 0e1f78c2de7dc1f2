"""Kernels instrumented with fa4trace, in the CuTe DSL (import name ``fa4trace.kernels``).

Every kernel module offers ``aot_variants(arch)``: the list of (name, compile thunk, Entry)
that ``fa4trace build`` compiles ahead of time and that the loader JIT-compiles where the DSL
and a GPU are present. Importing this package does not import cutlass; its modules do.
"""

from __future__ import annotations

import importlib

# Module names under fa4trace.kernels that define aot_variants(arch).
MODULES = ("calibration", "markers", "known_answer", "attention_sm90")
# The kinds their entries have (``fa4trace.format.entry.Entry.kind``): what ``fa4trace build --only`` and the loader name.
KINDS = ("calibration", "markers", "known_answer", "attention")


def available_modules() -> list[str]:
    """Kernel modules present in this checkout (attention may be absent in a partial install)."""
    out = []
    for m in MODULES:
        spec = importlib.util.find_spec(f"{__name__}.{m}")
        if spec is not None:
            out.append(m)
    return out


def aot_variants(arch: str, only: tuple[str, ...] | None = None):
    """All (name, thunk, Entry) of the selected kernel kinds, for `fa4trace build`."""
    for m in available_modules():
        mod = importlib.import_module(f"{__name__}.{m}")
        for name, thunk, entry in mod.aot_variants(arch):
            if only is None or entry.kind in only:
                yield name, thunk, entry
