"""Device-side code (CuTe DSL). Importing this package needs nvidia-cutlass-dsl; host modules never do."""

from .recorder import Recorder

__all__ = ["Recorder"]
