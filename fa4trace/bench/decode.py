"""The decode-attention benchmark behind ``fa4trace bench``: ours (base, pingpong, intrawg)
against cuDNN and FLASH SDPA and FA4's SM90 kernel, on the same inputs, timed by
``fa4trace.run.timing`` (CUDA graphs, cold L2, interleaved passes)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..attention import (SCHEDULES, LEAD_WARPS, Shape, decode_attention, launch_plan, reference, rel_error,
                         trace_buffer, variant_for)
from ..format.errors import Fa4traceError
from ..format.options import Sampling
from .options import DEFAULT_TRACED, TRACE_AT, TRACED_VARIANTS
from ..run.timing import cold_l2_inputs, graph_time, reported_us

PEAK_TBPS = 4.8  # H200 HBM3e, spec


@dataclass
class BenchRow:
    shape: Shape
    kernel: str
    us: float  # median per launch
    us_spread: float  # (p90 - p10) / 2 over replays
    rel_err: float
    extra: dict

    @property
    def tbps(self) -> float:
        return self.shape.io_bytes() / (self.us * 1e-6) / 1e12


def _variant_option(name: str, opt: str) -> tuple:
    """``r64`` / ``s512`` / ``p`` (any of them, in this order) after the ``@`` of a kernel name:
    query rows per CTA, splits per (batch, kv head), and programmatic dependent launch
    (``decode_attention(pdl=True)``). Returns (rows or None, splits or None, pdl)."""
    import re

    m = re.fullmatch(r"(?:r(\d+))?(?:s(\d+))?(p)?", opt)
    if m is None:
        raise ValueError(f"unknown kernel option {opt!r} in {name!r}: want r<rows per CTA>, s<splits>, "
                         "p (programmatic dependent launch), in that order")
    rows, splits, pdl = m.groups()
    return (int(rows) if rows else None, int(splits) if splits else None, pdl is not None)


def bench_shape(shape: Shape, kernels: list[str], *, replays: int = 15, seed: int = 0,
                check: bool = True, device: str = "cuda", rounds: int = 2) -> list[BenchRow]:
    """Time each kernel on the same random inputs. Kernel names: ``base``, ``pingpong``,
    ``intrawg``, with ``@r32`` / ``@s64`` / ``@p`` options (``_variant_option``), ``pingpong+trace`` (core
    event set, every CTA recorded), ``pingpong+tracelead`` (the same, only ``LEAD_WARPS`` store
    records), ``pingpong+trace1`` (only the first CTA stores records), ``pingpong+tracestalls``
    (every CTA, the "stalls" event set: core plus WAIT_K / WAIT_V), ``pingpong+ref`` (the
    untraced kernel again, under another name: the reference timed next to the traced ones),
    ``cudnn``, ``flash``."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sets, per_graph = cold_l2_inputs(shape, seed=seed, device=device)
    n_sets = len(sets)
    ref = reference(*sets[0][:3])[0] if check else None
    rows: list[BenchRow] = []
    timed = []  # (row index, launch) of the kernels that passed the check
    for name in kernels:
        base_name, _, opt = name.partition("@")
        sched, _, tr = base_name.partition("+")
        if tr not in ("", "ref", "trace", "tracelead", "trace1", "tracestalls"):
            raise ValueError(f"unknown kernel suffix +{tr} in {name!r}: want +ref, +trace, +tracelead, +trace1 "
                             "or +tracestalls")
        traced = tr.startswith("trace")
        events = "stalls" if tr == "tracestalls" else "core"
        extra: dict = {}
        if sched in SCHEDULES:
            brows, splits, pdl = _variant_option(name, opt)
            try:
                variant = variant_for(shape, sched, events=events if traced else None, pdl=pdl, block_rows=brows)
                _, plan = launch_plan(shape, variant, device, splits)
            except (Fa4traceError, ValueError) as exc:  # a variant this build lacks or refuses: a '-' cell
                rows.append(BenchRow(shape, name, float("nan"), float("nan"), float("nan"),
                                     {"error": str(exc)[:200]}))
                continue
            bufs = None
            if traced:
                # +trace1: every CTA runs the recorder's instructions, only the first stores
                # records (isolates the instruction cost from the record traffic).
                who = Sampling(ctas=1 if tr == "trace1" else None, warps=LEAD_WARPS if tr == "tracelead" else None)
                bufs = [trace_buffer(*st[:3], schedule=sched, num_splits=splits, block_rows=brows, sampling=who,
                                     trace_events=events)[0] for st in sets[:1]]

            def launch(i, sched=sched, brows=brows, splits=splits, bufs=bufs, events=events, pdl=pdl):
                q, k, v, o = sets[i]
                return decode_attention(q, k, v, schedule=sched, out=o, block_rows=brows, num_splits=splits,
                                        trace=bufs[0] if bufs else None, trace_events=events, pdl=pdl)

            extra = {"tile_n": variant.tile_n, "block_rows": variant.block_rows,
                     "splits": plan.n_splits, "ctas": plan.n_ctas, "n_comb": plan.n_comb}
        elif sched == "fa4":
            # Upstream FlashAttention-4's SM90 forward (AOT build, see fa4trace.fa4): no split-KV
            # on Hopper, so it launches b x hkv CTAs.
            from ..fa4 import sm90_runner

            try:
                runners = [sm90_runner(*st[:3], out=st[3]) for st in sets]
            except Exception as exc:  # noqa: BLE001 - no FA4 build for this shape: a '-' cell
                rows.append(BenchRow(shape, name, float("nan"), float("nan"), float("nan"),
                                     {"error": str(exc)[:200]}))
                continue

            def launch(i, runners=runners):
                return runners[i]()

            extra = {"note": "FA4 4.0.0b36 SM90, no split-KV"}
        elif sched in ("cudnn", "flash"):
            backend = SDPBackend.CUDNN_ATTENTION if sched == "cudnn" else SDPBackend.FLASH_ATTENTION

            def launch(i, backend=backend):
                q, k, v, _ = sets[i]
                with sdpa_kernel([backend]):
                    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                         v.transpose(1, 2), enable_gqa=True)
                return out.transpose(1, 2)
        else:
            raise ValueError(f"unknown kernel {name!r}")
        err = float("nan")
        try:
            if check:
                sets[0][3].fill_(float("nan"))  # poison: unwritten elements fail the check
                out = launch(0)
                torch.cuda.synchronize()
                err = rel_error(out, ref)
        except Exception as exc:  # noqa: BLE001 - a backend that refuses a shape is a table entry
            rows.append(BenchRow(shape, name, float("nan"), float("nan"), err, {"error": str(exc)[:200]}))
            continue
        rows.append(BenchRow(shape, name, float("nan"), float("nan"), err, extra))
        timed.append((len(rows) - 1, launch))
    # Timing: ``rounds`` passes over all kernels in the same order (interleaved), every pass kept
    # in extra["rounds_us"]. Reported: the last pass with 2 rounds, else the median of all passes
    # but the first: the first pass after a shape's inputs were allocated runs slow (warm-up),
    # and long shapes drift by a few percent from pass to pass under the GPU's power cap.
    for rnd in range(rounds):
        for idx, launch in timed:
            row = rows[idx]
            if "error" in row.extra:
                continue
            try:
                us, spread = graph_time(launch, n_sets, replays, per_graph)
            except Exception as exc:  # noqa: BLE001 - a backend that fails while timing is a table entry
                rows[idx] = BenchRow(shape, row.kernel, float("nan"), float("nan"), row.rel_err,
                                     {**row.extra, "error": str(exc)[:200]})
                continue
            hist = row.extra.get("rounds_us", []) + [us]
            rows[idx] = BenchRow(shape, row.kernel, reported_us(hist), spread, row.rel_err,
                                 {**row.extra, "rounds_us": [round(x, 2) for x in hist]})
    sets.clear()
    torch.cuda.empty_cache()
    return rows


def bench_matrix(*, quick: bool = False) -> list[Shape]:
    """The issue's matrix: d {64,128} x hq:hkv {16:1,16:2} x sk {4096,32768,131072} x b {1,8,32},
    sq 1, plus sq 4 at sk 131072."""
    shapes = []
    for d in (128, 64):
        for hq, hkv in ((16, 1), (16, 2)):
            for sk in ((131072,) if quick else (4096, 32768, 131072)):
                for b in (1, 8, 32):
                    shapes.append(Shape(b, 1, hq, hkv, sk, d, "bf16"))
            for b in (1, 8, 32):
                shapes.append(Shape(b, 4, hq, hkv, 131072, d, "bf16"))
    return shapes


def traces_shape(shape: Shape, trace_at: str) -> bool:
    """Whether `fa4trace bench` times the traced variants at ``shape`` (``TRACE_AT``)."""
    return trace_at == "all" or (shape.sk == 131072 and shape.sq == 1)


def bench_run(shapes, kernels, *, replays: int = 15, trace_overhead: bool = True, rounds: int = 2,
              log=print, power=None, trace_at: str = "long",
              traced: tuple = DEFAULT_TRACED) -> list[BenchRow]:
    """bench_shape over shapes; adds the traced variants ``traced`` (``TRACED_VARIANTS``) and the
    untraced "+ref" twin at the shapes ``trace_at`` names (``TRACE_AT``: tracing overhead).
    ``power``: a running ``fa4trace.run.power_log.PowerLog``; each row then carries the GPU's clock
    and power state during its shape (``extra["gpu_state"]``)."""
    import time

    if trace_at not in TRACE_AT:
        raise Fa4traceError(f"trace_at must be one of {', '.join(TRACE_AT)}, got {trace_at!r}")
    unknown = [t for t in traced if t not in TRACED_VARIANTS]
    if unknown:
        raise Fa4traceError(f"unknown traced variant {unknown[0]!r}: want {', '.join(TRACED_VARIANTS)}")
    rows = []
    for i, shape in enumerate(shapes):
        ks = list(kernels)
        if trace_overhead and traced and traces_shape(shape, trace_at):
            # The kernels and peers first, in the usual order; then each of ours again as "+ref"
            # with its traced variants right after it. An overhead is the ratio of two timings,
            # so they are taken next to each other (where in a pass a long kernel is timed moves
            # it by a few percent).
            for k in kernels:
                sched, at, opt = k.partition("@")
                if sched in SCHEDULES and not _variant_option(k, opt)[-1]:  # @p has no traced twin
                    ks += [sched + sfx + at + opt for sfx in ("+ref", *("+" + t for t in traced))]
        t = time.time()
        t0 = power.now() if power is not None else None
        r = bench_shape(shape, ks, replays=replays, seed=i, rounds=rounds)
        state = power.summary(t0, power.now()) if power is not None else None
        if state is not None:
            for x in r:
                x.extra["gpu_state"] = state
        rows += r
        cells = " ".join(f"{x.kernel}={x.us:.1f}" for x in r)
        note = "" if state is None else (f"; SM {state['sm_mhz_min']}-{state['sm_mhz_max']} MHz, power cap "
                                         f"{100 * state['power_cap_share']:.0f}% of samples")
        log(f"[{i + 1}/{len(shapes)}] d{shape.d} {shape.hq}:{shape.hkv} sk={shape.sk} b={shape.b} sq={shape.sq}: "
            f"{cells} ({time.time() - t:.1f} s{note})")
    return rows


def bench_json(rows: list[BenchRow]) -> list[dict]:
    return [{"d": r.shape.d, "hq": r.shape.hq, "hkv": r.shape.hkv, "sk": r.shape.sk, "b": r.shape.b,
             "sq": r.shape.sq, "dtype": r.shape.dtype, "kernel": r.kernel, "us": r.us,
             "us_spread": r.us_spread, "tbps": r.tbps, "rel_err": r.rel_err, **r.extra} for r in rows]


_SHORT = {"pingpong": "pp", "intrawg": "iw"}


def bench_table(rows: list[BenchRow], peak: float = PEAK_TBPS) -> str:
    """Markdown, one row per shape: every kernel's µs (TB/s), pingpong's % of peak, ratios,
    tracing overhead (core event set: every warp, lead warps; stalls event set: every warp;
    against the "+ref" timing where there is one) and the worst relative error of the checked
    outputs."""
    by_shape: dict = {}
    for r in rows:
        by_shape.setdefault(r.shape, {})[r.kernel] = r
    kernels = []
    for r in rows:
        if r.kernel not in kernels and "+" not in r.kernel.partition("@")[0]:
            kernels.append(r.kernel)
    # our schedules with traced timings, in SCHEDULES order (short names in the header)
    ours = [s for s in SCHEDULES if any(r.kernel.partition("@")[0] == s + "+trace" for r in rows)] \
        or ["base", "pingpong"]
    who = "/".join(_SHORT.get(s, s) for s in ours)
    head = ["d", "hq:hkv", "sk", "b", "sq"] + [f"{k} µs (TB/s)" for k in kernels] + \
        [f"pp % of {peak:g}", "pp vs base", "pp vs cuDNN", f"trace ovh {who}", f"lead-warp ovh {who}",
         f"stalls ovh {who}", "max rel err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def ok(x):
        return x is not None and x.us == x.us

    for shape, ks in by_shape.items():
        cells = [str(shape.d), f"{shape.hq}:{shape.hkv}", str(shape.sk), str(shape.b), str(shape.sq)]
        for k in kernels:
            r = ks.get(k)
            cells.append("-" if not ok(r) else f"{r.us:.1f} ({r.tbps:.2f})")
        pp, base, cud = ks.get("pingpong"), ks.get("base"), ks.get("cudnn")
        cells.append(f"{100 * pp.tbps / peak:.0f}%" if ok(pp) else "-")
        cells.append(f"{100 * (base.us / pp.us - 1):+.1f}%" if ok(pp) and ok(base) else "-")
        cells.append(f"{cud.us / pp.us:.2f}x" if ok(pp) and ok(cud) else "-")
        for suffix in ("+trace", "+tracelead", "+tracestalls"):
            ov = []
            for sname in ours:
                # the reference timed next to the traced variants, where there is one
                a = ks.get(sname + "+ref") if ok(ks.get(sname + "+ref")) else ks.get(sname)
                b = ks.get(sname + suffix)
                ov.append(f"{100 * (b.us / a.us - 1):+.1f}%" if ok(a) and ok(b) else "-")
            cells.append(" / ".join(ov))
        errs = [r.rel_err for r in ks.values() if r.rel_err == r.rel_err]
        cells.append(f"{max(errs):.1e}" if errs else "-")
        lines.append("| " + " | ".join(cells) + " |")
    capped = []
    for shape, ks in by_shape.items():
        st = next((r.extra["gpu_state"] for r in ks.values() if "gpu_state" in r.extra), None)
        if st is not None and (st["power_cap_share"] >= 0.1 or st["thermal_share"] > 0):
            capped.append(f"d{shape.d} {shape.hq}:{shape.hkv} sk {shape.sk} b {shape.b} sq {shape.sq} "
                          f"({100 * st['power_cap_share']:.0f}% power cap, {100 * st['thermal_share']:.0f}% "
                          f"thermal, SM {st['sm_mhz_min']}-{st['sm_mhz_max']} MHz)")
    if capped:
        lines += ["", "GPU clock lowered by its power or thermal limit during: " + "; ".join(capped)
                  + " (nvidia-smi samples; `gpu_state` in bench.json)."]
    return "\n".join(lines)


SHAPE_FILTER_KEYS = ("d", "hq", "hkv", "sk", "b", "sq")


def select_shapes(*, quick: bool = False, only: str = "") -> list[Shape]:
    """The matrix (``bench_matrix``) narrowed by ``only``, comma KEY=VALUE conditions on
    SHAPE_FILTER_KEYS (e.g. "d=128,hkv=1"); a filter that leaves nothing is an error."""
    shapes = bench_matrix(quick=quick)
    for cond in filter(None, only.split(",")):
        key, _, val = cond.partition("=")
        if key not in SHAPE_FILTER_KEYS:
            raise Fa4traceError(f"unknown shape key {key!r} in {only!r} (use {', '.join(SHAPE_FILTER_KEYS)})")
        shapes = [s for s in shapes if str(getattr(s, key)) == val]
    if not shapes:
        raise Fa4traceError(f"{only!r} leaves no shape of the matrix")
    return shapes


def run(*, quick: bool = False, kernels: str = "base,pingpong,intrawg,cudnn,flash,fa4", replays: int = 15,
        rounds: int = 5, trace_overhead: bool = True, only: str = "", out: str = "artifacts/bench",
        command: str = "fa4trace bench", log=print, trace_at: str = "long",
        traced: tuple = DEFAULT_TRACED) -> list[BenchRow]:
    """The matrix on this GPU; writes ``bench.json`` (``benchmarks/report.py``'s format, area
    "decode", or "decode-traced" with ``trace_at="all"``) and ``bench.md`` into ``out`` and returns
    the rows."""
    import datetime as dt
    import json

    from .results import envelope, gpu_name

    if rounds < 1 or replays < 1:
        raise Fa4traceError(f"rounds and replays must be >= 1, got {rounds} and {replays}")
    from ..run.gpu import gpu_facts, require_cuda
    from ..run.power_log import PowerLog

    shapes = select_shapes(quick=quick, only=only)
    require_cuda()
    dev = gpu_facts(0)
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    log(f"{dev['name']} ({dev['sm_count']} SMs, driver {dev['driver']}, torch {dev['torch']}) {date}")
    with PowerLog() as power:
        if not power.enabled:
            log(f"(no clock/power log: {power.why_off})")
        rows = bench_run(shapes, [k for k in kernels.split(",") if k], replays=replays,
                         trace_overhead=trace_overhead, rounds=rounds, log=log,
                         power=power if power.enabled else None, trace_at=trace_at, traced=tuple(traced))
    md = bench_table(rows)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "bench.json"), "w") as f:
        # traced at every shape: the tracing-cost area (BENCHMARKS' decode table keeps the peers' run)
        area, title = (("decode-traced", "Our decode kernel traced at every shape (cold L2)") if trace_at == "all"
                       else ("decode", "Decode attention: ours vs cuDNN, FLASH and FA4 (cold L2)"))
        json.dump(envelope(area, title, bench_json(rows), gpu=gpu_name(), command=command, device=dev), f, indent=1)
    with open(os.path.join(out, "bench.md"), "w") as f:
        f.write(md + "\n")
    log(md)
    return rows
