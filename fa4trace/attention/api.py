"""``decode_attention`` on torch CUDA tensors, traced or not: validate, pick the kernel variant,
plan the split-KV launch, allocate its workspaces (and a trace buffer) and launch it."""

from __future__ import annotations

import math
from typing import Optional

from ..format.options import Sampling, options
from ..kernels.decode_spec import COUNTER_WORDS, TILE_M, WARPS_PER_CTA, Variant, event_ids
from .planner import Plan, default_block_rows, plan_splits, trace_capacity
from .shapes import Shape, validate


def variant_for(shape: Shape, schedule: str, *, events: Optional[str] = None, pdl: bool = False,
                block_rows: Optional[int] = None) -> Variant:
    """The kernel variant that runs ``shape``: 32-row CTAs where the packed rows fit
    (``default_block_rows``) unless ``block_rows`` forces 64 or 32 (same results, bitwise)."""
    if block_rows not in (None, 32, TILE_M):
        raise ValueError(f"block_rows must be 32 or 64, got {block_rows!r}")
    return Variant(shape.d, schedule, shape.dtype, block_rows or default_block_rows(shape), events, pdl)


def launch_plan(shape: Shape, variant: Variant, device, num_splits: Optional[int] = None, build=None):
    """(loaded kernel, Plan): the variant from the loader and the split plan of its launch."""
    from ..run import loader

    kern = loader.load("attention", name=variant.name, build=build)
    return kern, plan_splits(shape, variant.tile_n, num_sms(device), num_splits, variant.block_rows)


def workspaces(shape: Shape, plan: Plan, device) -> tuple:
    """(lse, o_part, lse_part, count): the kernel's outputs and scratch besides o for one
    launch of ``plan`` (the counters are the device's cached ones, see ``_counters``)."""
    import torch

    n_o, n_l = plan.workspace_floats(shape)
    return (torch.empty((shape.b, shape.hq, shape.sq), dtype=torch.float32, device=device),
            torch.empty(n_o, dtype=torch.float32, device=device),
            torch.empty(n_l, dtype=torch.float32, device=device),
            _counters(device, COUNTER_WORDS * plan.groups))


_COUNTERS: dict = {}


def _counters(device, n: int):
    """Per-device int32 words of the in-launch combine, COUNTER_WORDS per group: an arrival
    count and its value at the start of the next launch (every launch leaves the two equal),
    two spare words. Zero once at allocation."""
    import torch

    cur = _COUNTERS.get(device)
    if cur is None or cur.numel() < n:
        cur = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _COUNTERS[device] = cur
    return cur


def num_sms(device) -> int:
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


def decode_attention(q, k, v, *, schedule: str = "pingpong", num_splits: Optional[int] = None,
                     softmax_scale: Optional[float] = None, trace=None, return_lse: bool = False,
                     out=None, build=None, block_rows: Optional[int] = None,
                     trace_events: str = "core", pdl: bool = False):
    """Multi-token decode attention (see the package docstring).

    ``schedule``: "pingpong" (QK(i+1) overlaps softmax(i)), "base" (no overlap) or "intrawg"
    (FA3's: softmax(i) overlaps PV(i-1)); same math, outputs within rounding of each other.
    ``trace``: a recorder buffer (``trace_buffer``) to run the instrumented kernel; None runs
    the uninstrumented one. ``trace_events``: what the instrumented kernel records, "core" or
    "stalls" (core plus the consumer's waits for K/V; costlier); the output is the same bits.
    ``block_rows``: force 64- or 32-row CTAs (bitwise equal results). ``pdl``: launch with
    programmatic dependent launch (uninstrumented only): the launch may begin while the
    stream's previous kernel ends, and waits for it before touching memory. It hides the gap
    between back-to-back kernels at short launches and costs at long ones (BENCHMARKS.md), so
    it is off by default. ``build``: an AOT build folder to load the kernel from.
    """
    event_ids(trace_events)  # a known set, or a one-line ValueError
    if pdl and trace is not None:
        raise ValueError("pdl=True runs the uninstrumented kernel only: pass trace=None")
    shape = validate(q, k, v, schedule=schedule, num_splits=num_splits, softmax_scale=softmax_scale,
                     trace=trace)
    import torch

    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device
                            or not out.is_contiguous()):
        raise ValueError("out must be a contiguous tensor with q's shape, dtype and device")
    variant = variant_for(shape, schedule, events=trace_events if trace is not None else None, pdl=pdl,
                          block_rows=block_rows)
    kern, plan = launch_plan(shape, variant, q.device, num_splits, build)
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(shape.d)
    o = out if out is not None else torch.empty_like(q)
    lse, o_part, lse_part, count = workspaces(shape, plan, q.device)
    kern.fn(q, k, v, o, lse, o_part, lse_part, count, *plan.kernel_args(scale), trace)
    return (o, lse) if return_lse else o


def trace_buffer(q, k, v, *, schedule: str = "pingpong", num_splits: Optional[int] = None,
                 sampling: Optional[Sampling] = None, build=None, block_rows: Optional[int] = None,
                 trace_events: str = "core", cta_first: Optional[int] = None, cta_stride: Optional[int] = None,
                 max_ctas: Optional[int] = None, capacity: Optional[int] = None, warps=None):
    """A zeroed recorder buffer on q's device sized for this launch; returns (tensor, BufferSpec, Plan).
    ``sampling`` (``fa4trace.format.options.Sampling``, or its fields as the ``cta_first``,
    ``cta_stride``, ``max_ctas`` (its ``ctas``), ``capacity``, ``warps`` keywords): who records;
    every CTA and warp unless told (``LEAD_WARPS``: one warp per role), slots sized for the
    launch's KV blocks (``trace_capacity``). ``trace_events``: the event set the launch will
    record (the variant must exist)."""
    from ..run.record import new_trace_tensor

    sampling = options(Sampling, sampling, "trace_buffer", ctas=max_ctas, cta_first=cta_first, cta_stride=cta_stride,
                       capacity=capacity, warps=warps)
    shape = validate(q, k, v, schedule=schedule, num_splits=num_splits)
    variant = variant_for(shape, schedule, events=trace_events, block_rows=block_rows)
    _, plan = launch_plan(shape, variant, q.device, num_splits, build)
    spec = sampling.spec(WARPS_PER_CTA, grid_ctas=plan.n_ctas, capacity=trace_capacity(plan))
    return new_trace_tensor(spec, q.device), spec, plan
