"""Analysis: numbers computed from a trace, and their text; it writes no trace format.

``overlap`` (attention: QK / SOFTMAX / PV overlap, period, tensor-core busy, compare),
``autoevents``, ``roles``, ``kernel`` (any kernel's bundle: busy / waiting / idle, stage
occupancy, lag), ``wait_chain``, ``mma_flight``, ``fidelity`` (the recorder's perturbation),
``launches`` (one launch of a bundle at a time: every figure is one launch's) and ``text`` (their
printed form). Imports ``fa4trace.trace`` and ``fa4trace.format``.
"""
