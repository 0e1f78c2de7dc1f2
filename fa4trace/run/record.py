"""Run instrumented kernels on the GPU and turn their buffers into bundles.

kernel (launch with a trace buffer) -> buffer (torch tensor) -> decode -> Trace
The launch itself is the caller's (a closure taking the trace tensor): ``record`` owns the
buffer's life, the decode and the metadata, for every kernel alike. The recordings of
fa4trace's own kernels are built on it: ``record_attention`` (our decode attention, through
its public API, timed as ``fa4trace bench`` times it), ``record_calibration`` and
``record_markers``.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from ..format import layout as L
from ..format.errors import Fa4traceError
from ..format.vocab import VOCAB
from ..kernels.marker_spec import L2_TABLE, RECORDING_VARIANTS
from ..kernels.marker_spec import WARPS_PER_CTA as MARKER_WARPS
from ..trace.bundle import Trace
from ..trace.decode import decode_buffer
from .gpu import gpu_facts, require_cuda


@dataclass
class TracedLaunch:
    """One kernel launch to record: how to run it given a trace tensor, and what it is."""

    kernel: str
    grid_ctas: int
    warps_per_cta: int
    run: Callable  # run(trace_tensor) launches the kernel once (asynchronously is fine)
    grid: tuple = (1, 1, 1)
    block: tuple = (1, 1, 1)
    capacity: int = 1024
    cta_first: int = 0
    cta_stride: int = 1
    max_ctas: int | None = None
    warps: tuple | None = None  # warp indices that record (None: every warp of the CTA)
    extra: dict = field(default_factory=dict)

    def spec(self) -> L.BufferSpec:
        return L.BufferSpec.for_grid(self.grid_ctas, self.warps_per_cta, self.capacity,
                                     cta_first=self.cta_first, cta_stride=self.cta_stride,
                                     max_ctas=self.max_ctas, warps=self.warps)


def new_trace_tensor(spec: L.BufferSpec, device="cuda"):
    torch = require_cuda()
    return torch.from_numpy(spec.new_buffer().view(np.int64)).to(device)


def record(launches: list[TracedLaunch], *, kernel: str, config: dict, timing: dict | None = None,
           notes: str | None = None, vocab=None) -> Trace:
    """Launch each (in order, one buffer each), wait, decode, and join into one Trace.
    ``vocab``: the kernel's event vocabulary where it records more than the attention one."""
    torch = require_cuda()
    vocab = vocab or VOCAB
    bufs = []
    for ln in launches:
        buf = new_trace_tensor(ln.spec())
        ln.run(buf)
        bufs.append(buf)
    torch.cuda.synchronize()
    decoded = [decode_buffer(b.cpu().numpy(), launch_index=i, grid_ctas=ln.grid_ctas, vocab=vocab)
               for i, (ln, b) in enumerate(zip(launches, bufs))]
    launch_meta = []
    for ln in launches:
        spec = ln.spec()
        subset = spec.n_cta_slots < ln.grid_ctas
        launch_meta.append({
            "kernel": ln.kernel, "grid": list(ln.grid), "block": list(ln.block),
            "grid_ctas": ln.grid_ctas, "recorded_ctas": f"{spec.cta_first}:{spec.cta_first + spec.n_cta_slots * spec.cta_stride}:{spec.cta_stride}",
            "cta_subset": subset, "warp_subset": spec.warp_subset,
            **ln.extra,
        })
    meta = {
        "kernel": kernel,
        "config": config,
        "gpu": gpu_facts(),
        "launches": launch_meta,
        "recorded_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "clock": {"globaltimer_tick_ns_expected": 32},
        "cta_subset": any(m["cta_subset"] for m in launch_meta),
        "warp_subset": next((m["warp_subset"] for m in launch_meta if m["warp_subset"]), None),
    }
    if timing:
        meta["timing"] = timing
    if notes:
        meta["notes"] = notes
    return Trace.from_launches(decoded, meta, vocab=vocab)


# ---- our decode attention ----------------------------------------------------------------------
def record_attention(schedule: str = "pingpong", d: int = 128, hq: int = 16, hkv: int = 1, sk: int = 32768,
                     b: int = 1, sq: int = 1, dtype: str = "bf16", out_path: Optional[str] = None, *,
                     num_splits: Optional[int] = None, cta_first: int = 0, cta_stride: int = 1,
                     max_ctas: Optional[int] = None, capacity: Optional[int] = None, build=None,
                     seed: int = 0, overwrite: bool = False, warps=None, trace_events: str = "core"):
    """One traced launch on random inputs, decoded into a bundle (returns the Trace; saves it
    when ``out_path`` is given). ``trace_events``: "core" or "stalls" (``EVENT_SETS``).

    The uninstrumented kernel runs on the same inputs first: the traced output must equal it
    bit for bit (else Fa4traceError). ``meta['timing']`` holds three CUDA-graph times:
    ``kernel_us`` (untraced) and ``traced_us`` on the recorded inputs, where L2 holds what of
    the KV fits, and ``bench_us``, the untraced kernel as ``fa4trace bench`` times it (fresh
    inputs per launch, cold L2), which ``fa4trace summary`` reports as the kernel's time.
    """
    from ..attention import (EVENT_SETS, TILE_M, WARPS_PER_CTA, decode_attention, launch_plan, trace_buffer,
                             trace_capacity, validate, variant_for)
    from .timing import cold_l2_inputs, graph_time

    torch = require_cuda()
    if dtype not in ("bf16", "fp16"):
        raise ValueError(f"dtype must be bf16 or fp16, got {dtype!r}")
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, hq, d, dtype=tdt, device="cuda", generator=g)
    k = torch.randn(b, sk, hkv, d, dtype=tdt, device="cuda", generator=g)
    v = torch.randn(b, sk, hkv, d, dtype=tdt, device="cuda", generator=g)
    shape = validate(q, k, v, schedule=schedule, num_splits=num_splits)
    variant = variant_for(shape, schedule, events=trace_events)
    _, plan = launch_plan(shape, variant, q.device, num_splits, build)
    cap = capacity or trace_capacity(plan)
    kw = dict(schedule=schedule, num_splits=num_splits, build=build)
    tkw = dict(kw, trace_events=trace_events)

    scratch = trace_buffer(q, k, v, capacity=cap, cta_first=cta_first, cta_stride=cta_stride,
                           max_ctas=max_ctas, warps=warps, **tkw)[0]
    o_plain = torch.empty_like(q)
    # 10 launches per graph: one launch per replay would add the graph's own launch latency.
    us_plain, _ = graph_time(lambda i: decode_attention(q, k, v, out=o_plain, **kw), 1, 20, 10)
    us_traced, _ = graph_time(lambda i: decode_attention(q, k, v, trace=scratch, **tkw), 1, 20, 10)
    torch.cuda.synchronize()
    outs = []

    def run(tr):
        outs.append(decode_attention(q, k, v, trace=tr, **tkw))

    launch = TracedLaunch(kernel="decode_attention_sm90", grid_ctas=plan.n_ctas, warps_per_cta=WARPS_PER_CTA,
                          run=run, grid=plan.grid, block=(32 * WARPS_PER_CTA, 1, 1), capacity=cap,
                          cta_first=cta_first, cta_stride=cta_stride, max_ctas=max_ctas, warps=warps,
                          extra={"n_splits": plan.n_splits, "n_comb": plan.n_comb})
    config = {"schedule": schedule, "head_dim": d, "d": d, "hq": hq, "hkv": hkv, "sk": sk, "b": b, "sq": sq,
              "dtype": dtype, "tile_m": TILE_M, "block_rows": plan.block_rows, "tile_n": variant.tile_n,
              "trace_events": trace_events, "events_compiled": list(EVENT_SETS[trace_events]),
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


# ---- the calibration kernel ------------------------------------------------------------------
def record_calibration(*, timebase: str = "clock64", n_ctas: int = 264, samples: int = 48,
                       n_ticks: int = 64, spin: int = 4000, build=None) -> tuple[Trace, dict]:
    """Run the calibration kernel; return its trace and the timer checks (tick, agreement)."""
    torch = require_cuda()
    from . import loader

    kern = loader.load("calibration", build=build, timebase=timebase)
    fn, how = kern.fn, kern.how
    warps = 4
    n_warps = n_ctas * warps
    truth = torch.zeros(n_warps * samples * 2, dtype=torch.int64, device="cuda")
    ticks = torch.zeros(n_warps * n_ticks, dtype=torch.int64, device="cuda")
    launch = TracedLaunch(
        kernel=f"calibration_{timebase}", grid_ctas=n_ctas, warps_per_cta=warps,
        run=lambda tr: fn(truth, ticks, tr, n_ctas, samples, n_ticks, spin),
        grid=(n_ctas, 1, 1), block=(32 * warps, 1, 1), capacity=2 * samples + 8, extra={"how": how})
    trace = record([launch], kernel=f"calibration_{timebase}",
                   config={"timebase": timebase, "n_ctas": n_ctas, "samples": samples, "spin_cycles": spin})
    checks = calibration_checks(trace, truth.cpu().numpy().reshape(n_warps, samples, 2),
                                ticks.cpu().numpy().reshape(n_warps, n_ticks), warps)
    trace.meta["clock"].update({"globaltimer_tick_ns": checks["tick_ns"],
                                "clock_ghz_median": trace.meta["launches"][0].get("clock_ghz_median")})
    trace.meta["calibration"] = checks
    return trace, checks


# How far a decoded time may fall outside its bracket widened by one tick and still count as
# "within one tick": the anchors that turn cycles into ns are (globaltimer, clock64) pairs
# caught at a timer edge, each as precise as one trip of the spin loop that catches it (a few
# ns, Recorder._edge_anchor). Seen on the H200: 5 of 1056 warps 1-3 ns outside, once in four runs.
ANCHOR_SLACK_NS = 8


def calibration_checks(trace: Trace, truth: np.ndarray, ticks: np.ndarray, warps_per_cta: int) -> dict:
    """Tick of %globaltimer; where each decoded sample time lies against its bracket.

    truth[w, k] = (globaltimer read just before the event, just after). The event happened
    in [before, after + tick); ``outside_ns`` is how far a decoded time falls outside that
    interval widened by one tick on each side (0 = within one tick). A warp is within one tick
    when none of its samples is more than ANCHOR_SLACK_NS outside (``outside_ns_max`` reports
    the largest miss as is). ``sm_skew_ns``: how far apart the SMs' median errors are (max -
    min over SMs): events on different SMs share one time axis only as well as that.
    """
    import pyarrow.compute as pc

    steps = np.diff(ticks, axis=1)
    pos = steps[steps > 0]
    tick = int(pos.min()) if pos.size else 32
    cal = trace.events.filter(pc.equal(trace.events["name"].cast("string"), "CALIB"))
    gw = cal["cta"].to_numpy().astype(np.int64) * warps_per_cta + cal["warp"].to_numpy()
    k = cal["iter"].to_numpy()
    t_abs = cal["start_ns"].to_numpy() + trace.meta["t0_globaltimer_ns"] + trace.meta["launches"][0]["t0_offset_ns"]
    before, after = truth[gw, k, 0], truth[gw, k, 1]
    lo, hi = before - tick, after + 2 * tick
    outside = np.maximum(lo - t_abs, 0) + np.maximum(t_abs - hi, 0)
    per_warp = np.zeros(truth.shape[0])
    np.maximum.at(per_warp, gw, outside)
    mid = (before + after + tick) / 2  # centre of the interval the event lies in
    err = t_abs - mid
    sm = cal["sm"].to_numpy().astype(np.int64)
    sm_median = [float(np.median(err[sm == s])) for s in np.unique(sm)]
    return {
        "tick_ns": tick,
        "repeat_fraction": float((steps == 0).mean()) if steps.size else None,
        "samples": int(t_abs.size),
        "bracket_ns_median": float(np.median(after - before)) if t_abs.size else None,
        "err_vs_bracket_mid_ns_median": float(np.median(err)) if err.size else None,
        "err_vs_bracket_mid_ns_p99_abs": float(np.percentile(np.abs(err), 99)) if err.size else None,
        "outside_ns_max": float(outside.max()) if outside.size else None,
        "warps_within_one_tick": int((per_warp <= ANCHOR_SLACK_NS).sum()),
        "warps": int(truth.shape[0]),
        "sms": len(sm_median),
        "sm_skew_ns": float(max(sm_median) - min(sm_median)) if sm_median else None,
    }


# ---- the marker microbenchmark ---------------------------------------------------------------
def chase_table(n: int = L2_TABLE, seed: int = 0) -> np.ndarray:
    """A random single-cycle permutation for the marker kernel's L2 pointer chase."""
    order = np.random.default_rng(seed).permutation(n)
    nxt = np.empty(n, np.int32)
    nxt[order] = np.roll(order, -1)
    return nxt


def marker_inputs(n_ctas: int):
    """(out, table) device tensors for the marker kernel: output poisoned with NaN."""
    torch = require_cuda()
    out = torch.full((n_ctas * 32 * MARKER_WARPS,), float("nan"), dtype=torch.float32, device="cuda")
    table = torch.from_numpy(chase_table()).cuda()
    return out, table


def record_markers(*, variant: str = "fa4trace", work: str = "l2", n_ctas: int = 1056, iters: int = 200,
                   chain: int = 1, capacity: int | None = None, cta_first: int = 0, cta_stride: int = 1,
                   max_ctas: int | None = None, warps=None, build=None) -> Trace:
    """One traced launch of the marker-dense microbenchmark (2 events per iteration per warp)."""
    from . import loader

    if variant not in RECORDING_VARIANTS:
        raise ValueError(f"marker variant {variant!r} records nothing; the recording variants are "
                         f"{', '.join(RECORDING_VARIANTS)}")
    kern = loader.load("markers", build=build, variant=variant, work=work)
    fn, how = kern.fn, kern.how
    out, table = marker_inputs(n_ctas)
    cap = capacity or 2 * iters + 8
    launch = TracedLaunch(
        kernel=f"markers_{work}_{variant}", grid_ctas=n_ctas, warps_per_cta=MARKER_WARPS,
        run=lambda tr: fn(out, table, tr, n_ctas, iters, chain), grid=(n_ctas, 1, 1),
        block=(32 * MARKER_WARPS, 1, 1), capacity=cap, cta_first=cta_first, cta_stride=cta_stride,
        max_ctas=max_ctas, warps=warps, extra={"how": how})
    return record([launch], kernel=f"markers_{work}_{variant}",
                  config={"variant": variant, "work": work, "n_ctas": n_ctas, "iters": iters, "chain": chain})
