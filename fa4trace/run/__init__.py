"""Running kernels: the kernel registry and ``loader`` (JIT here, else an AOT build: ``aot``),
``record`` (launches into a bundle), ``timing`` (CUDA-graph replay, cold L2), ``gpu`` (the GPU's
facts), ``power_log`` (its clocks and power while benchmarks run), ``deps`` (the optional
dependencies and the extras that bring them). Imports ``fa4trace.trace`` and ``fa4trace.format``.
"""
