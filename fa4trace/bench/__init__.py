"""Benchmark helpers apart from the library's API: ``timing`` (CUDA-graph replay with a cold L2,
shared by every script in ``benchmarks/``), ``results`` (the result-file envelope of
BENCHMARKS.md) and ``decode`` (the decode-attention matrix behind
``fa4trace bench``). Needs torch and a GPU; importing the package needs neither."""
