"""fa4trace: per-warp event traces of GPU attention kernels, and the tools to read them.

Data path, one module per arrow:
    kernel (fa4trace.device.Recorder) -> buffer (layout) -> decode -> bundle -> {perfetto, chrome, analysis, app}

Host modules import without cutlass, torch or a GPU.
"""

from .format.version import __version__
from .format.errors import DeviceUnavailable, Fa4traceError, TraceFormatError  # noqa: E402
from .format.vocab import EV, ROLE, VOCAB, Vocabulary  # noqa: E402
from .trace.bundle import Trace, load  # noqa: E402
from . import kinds  # noqa: E402

kinds.register_shipped()  # the kernel kinds fa4trace ships, known to the loader (fa4trace.run.loader)

from .auto.registry import install as _watch_kernels  # noqa: E402

_watch_kernels()  # every CuTe DSL kernel compiled from now on is known to instrument() (no cutlass imported here)

__all__ = ["__version__", "EV", "ROLE", "VOCAB", "Vocabulary", "Fa4traceError", "TraceFormatError",
           "DeviceUnavailable", "Trace", "load", "decode_attention", "instrument"]


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
