"""``fa4trace check``: ``run`` (the runner: the plan of checks, the report folder), ``rows``
(one check each, on the GPU), ``report`` (rows, verdicts and their text; no GPU) and
``probes`` (guard words around a buffer, a Perfetto trace read back; no GPU).
"""
