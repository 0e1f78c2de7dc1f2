"""fa4trace: per-warp event traces of GPU kernels written in NVIDIA's CuTe DSL, and the tools
to read them.

Data path, one module per arrow:
    kernel (fa4trace.device.Recorder) -> buffer (layout) -> decode -> bundle -> {perfetto, chrome, analysis, app}

Host modules import without cutlass, torch or a GPU. ``example_bundle()``: a small bundled
trace to try every command on.
"""

from .format.version import __version__
from .format.errors import BadOption, DeviceUnavailable, Fa4traceError, TraceFormatError  # noqa: E402
from .format.options import Placement, Sampling  # noqa: E402
from .format.shape import Shape  # noqa: E402
from .format.vocab import EV, ROLE, VOCAB, Vocabulary  # noqa: E402
from .trace.bundle import Trace, load  # noqa: E402
from . import kinds  # noqa: E402

kinds.register_shipped()  # the kernel kinds fa4trace ships, known to the loader (fa4trace.run.loader)

from .auto.registry import install as _watch_kernels  # noqa: E402

_watch_kernels()  # every CuTe DSL kernel compiled from now on is known to instrument() (no cutlass imported here)

__all__ = ["__version__", "EV", "ROLE", "VOCAB", "Vocabulary", "Fa4traceError", "TraceFormatError",
           "DeviceUnavailable", "BadOption", "Sampling", "Placement", "Shape", "Trace", "load", "decode_attention",
           "instrument", "example_bundle"]

EXAMPLE_BUNDLE = "fa4_sm90_d128_h16kv1_sk32768_b1.parquet"  # fa4trace/examples/ (package data)


def example_bundle():
    """The path of a small trace bundle installed with fa4trace, to try the commands on:
    FlashAttention-4's SM90 forward at a decode shape (d 128, 16:1 heads, KV length 32768,
    batch 1) with FA4's own events, recorded on an H200; one of the source tree's traces/.
    From a shell:
    ``fa4trace summary "$(python -c 'import fa4trace; print(fa4trace.example_bundle())')"``."""
    from importlib.resources import files
    from pathlib import Path

    return Path(str(files(__name__) / "examples" / EXAMPLE_BUNDLE))


def __getattr__(name):
    # decode_attention pulls in torch (and cutlass where present) only when first used, so
    # `import fa4trace` stays host-only.
    if name == "decode_attention":
        from .attention import decode_attention

        return decode_attention
    if name == "instrument":  # needs the CuTe DSL only when a kernel compiles under it
        from .auto.api import instrument

        return instrument
    raise AttributeError(f"module 'fa4trace' has no attribute {name!r}")
