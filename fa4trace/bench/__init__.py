"""Benchmark helpers apart from the library's API: ``results`` (the result-file envelope of
BENCHMARKS.md) and ``decode`` (the decode-attention matrix behind ``fa4trace bench``); the
timing method they share is ``fa4trace.run.timing``. Needs torch and a GPU; importing the
package needs neither."""
