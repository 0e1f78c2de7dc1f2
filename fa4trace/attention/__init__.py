"""Decode attention on Hopper: the torch-facing API of the kernels in ``kernels/attention_sm90.py``.

One module per job: ``shapes`` (the problem and argument checks), ``planner`` (the split-KV
launch plan), ``api`` (variant choice, workspaces, launch), ``reference`` (fp32). A traced
launch decoded into a bundle is ``fa4trace.attention.record.record_attention``.

    o = fa4trace.attention.decode_attention(q, k, v, schedule="pingpong")
    o, lse = decode_attention(q, k, v, num_splits=32, return_lse=True)

q ``[b, sq, hq, d]``, k and v ``[b, sk, hkv, d]`` (FA layout, contiguous), bf16 or fp16, on one
CUDA device; d in {64, 128}; hq % hkv == 0 with hq/hkv <= 16; sq 1..8; sk >= 1.
Returns o ``[b, sq, hq, d]`` (and lse ``[b, hq, sq]``, fp32, natural log).

Kernels come from the CuTe DSL (compiled here, JIT) where ``cutlass`` imports and a GPU is
present, otherwise from an AOT build folder (``fa4trace build``; ``$FA4TRACE_BUILD`` or
``./build/kernels``; see ``fa4trace.run.loader``). Validation runs first and needs neither: a bad argument raises a
one-line ``ValueError`` naming it.

Variants (``fa4trace.kernels.decode_spec.Variant``): when all packed query rows of a KV head
fit in 32 (sq * hq/hkv <= 32) a CTA serves 32 rows, one per consumer thread
(``default_block_rows``), else 64; ``block_rows=`` forces one (the results are bitwise equal).

Split-KV: the KV of each (batch, kv head) is cut into ``num_splits`` ranges so that all SMs
stream; partial results are combined inside the same launch (see the kernel's docstring).
The combine's counters are cached per device and left consistent by every launch (no memset
between graph replays); two launches that share them must not run concurrently (one stream
at a time).
"""

from __future__ import annotations

from ..kernels.decode_spec import (EVENT_SETS, HEAD_DIMS, LEAD_WARPS, MAX_RATIO, MAX_SQ, SCHEDULES, TILE_M,
                                   WARPS_PER_CTA, Variant)
from .api import decode_attention, launch_plan, trace_buffer, variant_for, workspaces
from .planner import Plan, combine_cuts, default_block_rows, plan_splits, trace_capacity
from .reference import reference, rel_error
from .shapes import SHAPE_NAMES, Shape, groups, m_blocks, shape_problem, validate

__all__ = ["EVENT_SETS", "HEAD_DIMS", "LEAD_WARPS", "MAX_RATIO", "MAX_SQ", "SCHEDULES", "TILE_M", "WARPS_PER_CTA",
           "Variant", "decode_attention", "launch_plan", "trace_buffer", "variant_for",
           "workspaces", "Plan", "combine_cuts", "default_block_rows", "plan_splits", "trace_capacity",
           "reference", "rel_error", "SHAPE_NAMES", "Shape", "groups", "m_blocks", "shape_problem", "validate"]
