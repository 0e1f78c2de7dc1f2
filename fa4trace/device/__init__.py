"""Device-side code (CuTe DSL). Importing this package needs nvidia-cutlass-dsl; host modules never do.

One job per module, leaves first (none imports a module listed after it):

* ``store``: how a record reaches memory (the L2-hinted record store, the shared-memory
  staging store, the word's packing).
* ``clock``: the timer reads both recorders share (the warp's anchor pair at a tick edge).
* ``insertion``: where the DSL's trace is inserting ops (trace time: code regions, whether
  anything was emitted between two events).
* ``slot``: a warp's slot in the buffer (which CTAs and warps record, the claim of the slot).
* ``lifetimes``: the CTA-lifetime stamps of kernels fa4trace.instrument compiles.
* ``recorder``: ``Recorder``, the hand-placed events of our own kernels.
* ``segment``: ``SegmentRecorder``, the events fa4trace.instrument places in other kernels.
"""

from .recorder import Recorder
from .segment import SegmentRecorder

__all__ = ["Recorder", "SegmentRecorder"]
