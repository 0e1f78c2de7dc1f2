"""Exporters: a trace (and what they are given: role names per warp, counter series) written as
Perfetto TrackEvent protobuf (``perfetto``) or Chrome JSON (``chrome``); ``tracks`` places the
async spans on tracks; ``packets`` writes every Perfetto packet, for this export and for the merge
with torch.profiler traces (fa4trace.profiler). They compute no analysis. Imports ``fa4trace.trace`` and
``fa4trace.format``.
"""
