"""Record our decode attention: one traced launch on random inputs, through the public API,
timed as ``fa4trace bench`` times it, decoded into a bundle.
"""

from __future__ import annotations

from typing import Optional

from ..format.errors import Fa4traceError
from ..format.options import Sampling, options
from ..format.shape import Shape
from ..run.gpu import require_cuda
from ..run.record import TracedLaunch, record


# ---- our decode attention ----------------------------------------------------------------------
def record_attention(schedule: str = "pingpong", shape: Optional[Shape] = None, out_path: Optional[str] = None, *,
                     sampling: Optional[Sampling] = None, num_splits: Optional[int] = None, build=None,
                     seed: int = 0, overwrite: bool = False, trace_events: str = "core",
                     d: Optional[int] = None, hq: Optional[int] = None, hkv: Optional[int] = None,
                     sk: Optional[int] = None, b: Optional[int] = None, sq: Optional[int] = None,
                     dtype: Optional[str] = None, cta_first: Optional[int] = None, cta_stride: Optional[int] = None,
                     max_ctas: Optional[int] = None, capacity: Optional[int] = None, warps=None):
    """One traced launch on random inputs, decoded into a bundle (returns the Trace; saves it
    when ``out_path`` is given). ``trace_events``: "core" or "stalls" (``EVENT_SETS``).

    ``shape`` (``fa4trace.format.shape.Shape``; its defaults unless given, or made of the ``d``,
    ``hq``, ``hkv``, ``sk``, ``b``, ``sq``, ``dtype`` keywords): the problem. ``sampling``
    (``Sampling``, or its fields as the ``cta_first``, ``cta_stride``, ``max_ctas`` (its
    ``ctas``), ``capacity``, ``warps`` keywords): who records; every CTA and warp unless told,
    slots sized for the launch's KV blocks (``trace_capacity``).

    The uninstrumented kernel runs on the same inputs first: the traced output must equal it
    bit for bit (else Fa4traceError). The bundle's ``timing`` holds three CUDA-graph times:
    ``kernel_us`` (untraced) and ``traced_us`` on the recorded inputs, where L2 holds what of
    the KV fits, and ``bench_us``, the untraced kernel as ``fa4trace bench`` times it (fresh
    inputs per launch, cold L2), which ``fa4trace summary`` reports as the kernel's time.
    """
    from ..run.timing import cold_l2_inputs, graph_time
    from . import (EVENT_SETS, TILE_M, WARPS_PER_CTA, decode_attention, launch_plan, trace_buffer, trace_capacity,
                   validate, variant_for)

    shape = options(Shape, shape, "record_attention", d=d, hq=hq, hkv=hkv, sk=sk, b=b, sq=sq, dtype=dtype)
    sampling = options(Sampling, sampling, "record_attention", ctas=max_ctas, cta_first=cta_first,
                       cta_stride=cta_stride, capacity=capacity, warps=warps)
    torch = require_cuda()
    tdt = torch.bfloat16 if shape.dtype == "bf16" else torch.float16
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(shape.b, shape.sq, shape.hq, shape.d, dtype=tdt, device="cuda", generator=g)
    k = torch.randn(shape.b, shape.sk, shape.hkv, shape.d, dtype=tdt, device="cuda", generator=g)
    v = torch.randn(shape.b, shape.sk, shape.hkv, shape.d, dtype=tdt, device="cuda", generator=g)
    validate(q, k, v, schedule=schedule, num_splits=num_splits)  # the schedule, the split count, our limits
    variant = variant_for(shape, schedule, events=trace_events)
    _, plan = launch_plan(shape, variant, q.device, num_splits, build)
    kw = dict(schedule=schedule, num_splits=num_splits, build=build)
    tkw = dict(kw, trace_events=trace_events)

    scratch = trace_buffer(q, k, v, sampling=sampling, **tkw)[0]
    o_plain = torch.empty_like(q)
    # 10 launches per graph: one launch per replay would add the graph's own launch latency.
    us_plain, _ = graph_time(lambda i: decode_attention(q, k, v, out=o_plain, **kw), 1, 20, 10)
    us_traced, _ = graph_time(lambda i: decode_attention(q, k, v, trace=scratch, **tkw), 1, 20, 10)
    torch.cuda.synchronize()
    outs = []

    def run(tr):
        outs.append(decode_attention(q, k, v, trace=tr, **tkw))

    launch = TracedLaunch(kernel="decode_attention_sm90", grid_ctas=plan.n_ctas, warps_per_cta=WARPS_PER_CTA,
                          run=run, grid=plan.grid, block=(32 * WARPS_PER_CTA, 1, 1), capacity=trace_capacity(plan),
                          sampling=sampling, extra={"n_splits": plan.n_splits, "n_comb": plan.n_comb})
    config = {"schedule": schedule, "head_dim": shape.d, **shape.config(), "tile_m": TILE_M,
              "block_rows": plan.block_rows, "tile_n": variant.tile_n, "trace_events": trace_events, "events_compiled": list(EVENT_SETS[trace_events]),
              "n_blocks": plan.n_blocks,
              "n_splits": plan.n_splits, "n_comb": plan.n_comb, "comb_nc4": plan.comb_nc4,
              "comb_parts": plan.comb_parts, "io_bytes": shape.io_bytes(), "kv_bytes": shape.kv_bytes()}
    sets, per_graph = cold_l2_inputs(shape, seed=seed + 1)
    us_bench, _ = graph_time(lambda i: decode_attention(*sets[i][:3], out=sets[i][3], **kw), len(sets), 15,
                             per_graph)
    sets.clear()  # up to 256 MB of KV
    trace = record([launch], kernel="decode_attention_sm90", config=config,
                   timing={"kernel_us": us_plain, "traced_us": us_traced, "bench_us": us_bench,
                           "method": "CUDA graph replay (10 launches per graph), median of 20, the recorded inputs",
                           "bench_method": "fa4trace bench's: CUDA graph replay over input sets that rotate "
                                           ">= 256 MB of KV (cold L2), median of 15 replays"})
    if not torch.equal(o_plain, outs[0]):
        raise Fa4traceError("traced and untraced outputs differ: the recorder changed the kernel's result")
    if out_path is not None:
        trace.save(out_path, overwrite=overwrite)
    return trace
