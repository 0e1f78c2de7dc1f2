"""Analysis: numbers computed from a trace, and their text; it writes no trace format.

``overlap`` (attention: QK / SOFTMAX / PV overlap, period, tensor-core busy, compare),
``autoevents``, ``roles``, ``kernel`` (any kernel's bundle: busy / waiting / idle, stage
occupancy, lag), ``wait_chain``, ``mma_flight``, ``fidelity`` (the recorder's perturbation) and
``text`` (their printed form). Imports ``fa4trace.trace`` and ``fa4trace.format``.
"""
