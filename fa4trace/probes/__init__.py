"""fa4trace's probes of the recorder on a GPU: ``calibration`` (the timers: tick, agreement of
clock64 and globaltimer) and ``markers`` (what an event costs, on a marker-dense kernel).
Imports ``fa4trace.kernels`` and ``fa4trace.run``.
"""
