"""The GPU side of `fa4trace check`: one small function per check, each returning Rows.

Every function catches what its kernels raise and turns it into a fail row with the one-line
error, so one broken kernel never stops the others (``fa4trace.check.run.run_checks`` also
guards each function as a whole). Thresholds are the ones the GPU tests assert on the H200
(tests/gpu/): a row that passes here is what those tests call correct.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from ..analysis.fidelity import WARN as PERTURBATION_WARN
from ..analysis.fidelity import headline, perturbation, perturbation_lines
from ..format.shape import Shape
from .report import Row, failed

REPORT_BUG = "report it with the check folder (--out) attached"
# What each of our schedules overlaps in its own trace, at the check's shape (d128 16:1 sk 32768
# b 1, 8 splits): (QK ∥ SOFTMAX range, PV ∥ SOFTMAX range). tests/gpu/test_attention_gpu.py
# asserts the same table.
OUR_OVERLAPS = {"base": ((0.0, 0.1), (0.0, 0.1)), "pingpong": ((0.5, 1.0), (0.5, 1.0)),
                "intrawg": ((0.0, 0.1), (0.5, 1.0))}
# FA4's: SM100 ping-pong keeps QK in flight during most of SOFTMAX, its base path does not; on
# SM90 FA4 runs FA3's intra-warpgroup overlap, PV(i+1) issued before QK(i) retires (its QK ∥
# SOFTMAX is reported, not judged). None: not judged.
FA4_OVERLAPS = {"pingpong": ((0.5, 1.0), None), "base": ((0.0, 0.1), None), "fa3": (None, (0.5, 1.0))}
REL_TOL = 1e-2  # bf16 output vs the fp32 reference (tests/gpu: TOL["bf16"])
# tracing slower than this (fraction) is a warning: the trace's timings are then off by as much
COST_WARN = PERTURBATION_WARN
# The attention rows' shape unless the command says another (the overlap ranges above hold here);
# our decode kernel's tracing cost is timed here, ping-pong only (``decode_rows``).
DEFAULT_SHAPE = Shape(d=128, hq=16, hkv=1, sk=32768, b=1, sq=1, dtype="bf16")


def decode_splits(shape: Shape) -> int:
    """The split count our decode kernel runs with in the check: the one the GPU test of the
    schedules' overlaps uses (its ranges hold there), not the launch planner's."""
    return max(1, shape.sk // 128 // 32)


@dataclass
class Context:
    """What every check needs: where to write, how to load kernels, the shape, the GPU."""

    out: Path
    gpu: dict
    build: Optional[str] = None
    fa4_build: Optional[str] = None
    quick: bool = False
    force: bool = False
    shape: Shape = DEFAULT_SHAPE
    seed: int = 0
    files: list = field(default_factory=list)

    @property
    def major(self) -> int:
        return int(str(self.gpu.get("compute_capability", "0.0")).split(".")[0])

    def path(self, name: str) -> Path:
        p = self.out / name
        self.files.append(str(p))
        return p


def detect_gpu() -> Optional[dict]:
    """``gpu_facts()`` of device 0, or None where torch with a CUDA GPU is not here."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from ..run.gpu import gpu_facts

    return gpu_facts()


def detect_route(ctx: Context) -> dict:
    """How kernels get here: "jit" (compiled with the CuTe DSL), "aot:<folder>" (an AOT build)
    or "none", for fa4trace's kernels and for FlashAttention-4."""
    from ..run import loader

    def one(kind, build):
        if loader.use_jit(build, kind):
            return "jit"
        path = loader.build_dir(build, kind)
        return f"aot:{path}" if (path / "manifest.json").is_file() else "none"

    return {"kernels": one("attention", ctx.build), "fa4": one("fa4", ctx.fa4_build)}


def route_rows(ctx: Context, route: dict) -> list[Row]:
    k = route["kernels"]
    if k == "none":
        return [Row("setup", "kernels", "fail", "none", "no CuTe DSL to compile them and no AOT build folder",
                    "pip install 'fa4trace[dsl]' here, or run `fa4trace build -o build/kernels` on any machine "
                    "with it and pass --build build/kernels")]
    return [Row("setup", "kernels", "ok", k, "compiled here with the CuTe DSL" if k == "jit" else "AOT build",
                values={"route": k})]


# ---- the timer calibration kernel ------------------------------------------------------------
def timer_rows(ctx: Context) -> list[Row]:
    """globaltimer tick, clock64 rate, skew across SMs, cycles→ns error per warp."""
    from ..probes.calibration import ANCHOR_SLACK_NS, record_calibration

    nxt = f"timestamps on this GPU are not trustworthy; {REPORT_BUG}"
    try:
        trace, c = record_calibration(timebase="clock64", build=ctx.build)
        trace.save(ctx.path("calibration.parquet"), overwrite=True)
    except Exception as e:  # noqa: BLE001 - every failure becomes a row
        return [failed("timer", "calibration kernel", e, "check the route row; " + nxt)]
    rows = []
    tick = c["tick_ns"]
    if c["repeat_fraction"] is None or not tick:
        rows.append(Row("timer", "globaltimer tick", "fail", "no step", "the global timer never advanced", nxt))
    else:
        rows.append(Row("timer", "globaltimer tick", "ok" if tick <= 64 else "warn", f"{tick} ns",
                        "32 ns on Hopper" if tick <= 64 else "coarser than Hopper's 32 ns: anchors are coarser",
                        "durations inside a warp stay exact (clock64); compare across SMs with care",
                        {"tick_ns": tick}))
    df = trace.events.to_pandas()
    w = df[df["name"] == "WARP"]
    ghz = ((w["end_cycles"] - w["start_cycles"]) / (w["end_ns"] - w["start_ns"]).clip(lower=1)).to_numpy()
    if ghz.size and np.isfinite(ghz).all() and (ghz > 0).all():
        spread = float(ghz.max() / ghz.min() - 1)
        rows.append(Row("timer", "clock64 rate", "ok" if spread <= 0.05 else "warn",
                        f"{np.median(ghz):.3f} GHz ({ghz.min():.3f}-{ghz.max():.3f} over {ghz.size} warps)",
                        "SM clock over each warp's life" + ("" if spread <= 0.05 else
                                                            f": varies {100 * spread:.0f}% between warps"),
                        "the SM clock changed during the run (boost or throttling): check "
                        "`nvidia-smi -q -d PERFORMANCE`; per-warp anchors absorb it",
                        {"clock_ghz_median": float(np.median(ghz)), "clock_ghz_min": float(ghz.min()),
                         "clock_ghz_max": float(ghz.max())}))
    else:
        rows.append(Row("timer", "clock64 rate", "fail", "n/a", "a warp's clock64 did not advance", nxt))
    skew = c.get("sm_skew_ns")
    lim_ok, lim_warn = 2 * (tick or 32), 8 * (tick or 32)
    if skew is None:
        rows.append(Row("timer", "skew across SMs", "fail", "n/a", "no calibration samples", nxt))
    else:
        v = "ok" if skew <= lim_ok else "warn" if skew <= lim_warn else "fail"
        rows.append(Row("timer", "skew across SMs", v, f"{skew:.0f} ns over {c['sms']} SMs",
                        f"spread of the SMs' median error vs globaltimer (ok <= {lim_ok} ns)",
                        "events on different SMs are misplaced against each other: compare within an SM; "
                        + REPORT_BUG, {"sm_skew_ns": skew, "sms": c["sms"]}))
    n, good = c["warps"], c["warps_within_one_tick"]
    med, worst = c["err_vs_bracket_mid_ns_median"], c["outside_ns_max"]
    v = "ok" if good == n and med is not None and abs(med) <= (tick or 32) / 2 else \
        "warn" if n and good >= 0.99 * n else "fail"
    rows.append(Row("timer", "cycles→ns per warp", v,
                    f"{good}/{n} warps within 1 tick, median {_num(med)} ns, worst {_num(worst)} ns",
                    f"decoded sample times vs globaltimer reads around them (slack {ANCHOR_SLACK_NS} ns)",
                    "rerun; if warps stay off, durations across warps are off by that much: " + REPORT_BUG,
                    {k: c[k] for k in ("warps", "warps_within_one_tick", "err_vs_bracket_mid_ns_median",
                                       "outside_ns_max", "samples")}))
    if trace.info.total_dropped:
        rows.append(Row("timer", "calibration records", "fail", f"{trace.info.total_dropped} dropped",
                        "the calibration buffer is sized for every record", nxt))
    return rows


# ---- the recorder: marker kernel -------------------------------------------------------------
MARKER_CTAS, MARKER_ITERS, MARKER_CHAIN, SMALL_CAPACITY = 264, 100, 4, 37


def recorder_rows(ctx: Context) -> list[Row]:
    """The marker kernel three ways: untraced, traced with room for every record, traced into
    a deliberately small buffer between guard words."""
    import torch

    from ..format import layout as L
    from ..probes.markers import MARKER_WARPS, marker_inputs
    from ..run import loader
    from ..run.record import TracedLaunch, record
    from ..trace.decode import decode_buffer
    from .probes import buffer_view, guard_damage, guarded_buffer

    n, iters, chain, cap = MARKER_CTAS, MARKER_ITERS, MARKER_CHAIN, SMALL_CAPACITY
    warps = n * MARKER_WARPS
    nxt = f"do not record on this GPU; {REPORT_BUG}"
    rows, outs = [], {}
    try:
        plain = loader.load("markers", build=ctx.build, variant="plain", work="l2").fn
        traced = loader.load("markers", build=ctx.build, variant="fa4trace", work="l2").fn
        outs["plain"], table = marker_inputs(n)
        plain(outs["plain"], table, None, n, iters, chain)
    except Exception as e:  # noqa: BLE001
        return [failed("recorder", "marker kernel", e, "check the route row; " + nxt)]

    try:  # room for every record
        outs["full"] = marker_inputs(n)[0]
        launch = TracedLaunch(kernel="markers_l2_fa4trace", grid_ctas=n, warps_per_cta=MARKER_WARPS,
                              run=lambda tr: traced(outs["full"], table, tr, n, iters, chain), grid=(n, 1, 1),
                              block=(32 * MARKER_WARPS, 1, 1), capacity=2 * iters + 8)
        trace = record([launch], kernel="markers_l2_fa4trace",
                       config={"variant": "fa4trace", "work": "l2", "n_ctas": n, "iters": iters, "chain": chain})
        trace.save(ctx.path("markers.parquet"), overwrite=True)
        spans = int((trace.events.to_pandas()["name"] == "BENCH").sum())
        dropped = trace.info.total_dropped
        ok = spans == warps * iters and dropped == 0
        rows.append(Row("recorder", "every event recorded", "ok" if ok else "fail",
                        f"{spans}/{warps * iters} spans, {dropped} dropped",
                        f"marker kernel, {n} CTAs x {MARKER_WARPS} warps x {iters} begin/end pairs",
                        "events are lost on this GPU: " + nxt, {"spans": spans, "expected": warps * iters}))
    except Exception as e:  # noqa: BLE001
        rows.append(failed("recorder", "every event recorded", e, nxt))

    spec = L.BufferSpec.for_grid(n, MARKER_WARPS, cap)
    try:  # a small buffer between guard words
        outs["small"] = marker_inputs(n)[0]
        host = guarded_buffer(spec)
        dev = torch.from_numpy(host.view(np.int64)).cuda()
        buf = buffer_view(dev, spec)
        if buf.data_ptr() % 16 or not buf.is_contiguous():
            raise RuntimeError("the guarded trace buffer is not 16-byte aligned and contiguous")
        traced(outs["small"], table, buf, n, iters, chain)
        torch.cuda.synchronize()
        back = dev.cpu().numpy().view(np.uint64)
        dmg = guard_damage(back, spec)
        rows.append(Row("recorder", "nothing out of bounds", "ok" if dmg["before"] == dmg["after"] == 0 else "fail",
                        f"{dmg['before']} + {dmg['after']} guard words changed",
                        "64 sentinel words before and after an overflowing buffer",
                        "the recorder writes outside its buffer on this GPU: " + nxt, dmg))
        d = decode_buffer(buffer_view(back, spec), grid_ctas=n).summary
        want = warps * (2 * iters - cap)
        ok = d["dropped"] == want and d["records"] == warps * cap and d["overflowed_warps"] == warps
        rows.append(Row("recorder", "overflow counted", "ok" if ok else "fail",
                        f"{d['dropped']}/{want} dropped, {d['records']}/{warps * cap} kept",
                        f"room for {cap} of {2 * iters} records per warp",
                        "dropped counts are wrong on this GPU: do not trust total_dropped; " + REPORT_BUG,
                        {"dropped": d["dropped"], "expected_dropped": want, "records": d["records"]}))
    except Exception as e:  # noqa: BLE001
        rows.append(failed("recorder", "small buffer", e, nxt))

    try:
        torch.cuda.synchronize()
        same = {k: bool(torch.equal(outs["plain"], o)) for k, o in outs.items() if k != "plain"}
        nan = bool(torch.isnan(outs["plain"]).any())
        ok = same and all(same.values()) and not nan
        rows.append(Row("recorder", "traced == untraced", "ok" if ok else "fail",
                        ", ".join(f"{k} buffer: {'equal' if s else 'DIFFERENT'}" for k, s in same.items()),
                        "marker kernel output, bit for bit" + ("; untraced output has NaN" if nan else ""),
                        "the recorder changes kernel results on this GPU: " + nxt, same))
    except Exception as e:  # noqa: BLE001
        rows.append(failed("recorder", "traced == untraced", e, nxt))
    return rows


# ---- shared by our decode kernel and FA4 -----------------------------------------------------
def _inputs(shape: Shape, seed: int):
    """q, k, v as ``record_attention`` and ``fa4.record`` draw them for ``seed`` (same order)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    s = shape
    dtype = torch.bfloat16 if s.dtype == "bf16" else torch.float16
    q = torch.randn(s.b, s.sq, s.hq, s.d, dtype=dtype, device="cuda", generator=g)
    k = torch.randn(s.b, s.sk, s.hkv, s.d, dtype=dtype, device="cuda", generator=g)
    v = torch.randn(s.b, s.sk, s.hkv, s.d, dtype=dtype, device="cuda", generator=g)
    return q, k, v


def _ref_row(group: str, label: str, q, k, v, out, nxt: str) -> Row:
    import torch

    from ..attention import reference, rel_error

    torch.cuda.synchronize()
    err = rel_error(out, reference(q, k, v)[0])
    ok = math.isfinite(err) and err <= REL_TOL
    return Row(group, f"{label}: vs fp32", "ok" if ok else "fail", f"rel err {err:.1e}",
               f"bf16 output vs an fp32 reference (ok <= {REL_TOL:g})", nxt, {"rel_error": err})


def _bundle_rows(group: str, label: str, trace, ctx: Context, stem: str, overlaps, nxt: str) -> list[Row]:
    """Save the bundle, read it back, convert it to Perfetto (slices == rows, nothing
    dropped), and judge the overlap the schedule should show."""
    from ..analysis.kernel import export_inputs
    from ..analysis.overlap import summarize
    from ..export.perfetto import to_perfetto
    from ..trace.bundle import load
    from .probes import perfetto_slices

    rows = []
    try:
        back = load(trace.save(ctx.path(f"{stem}.parquet"), overwrite=True))
        pf = ctx.path(f"{stem}.pftrace")
        if pf.exists():
            pf.unlink()
        shown, occupancy = export_inputs(back)
        to_perfetto(shown, pf, occupancy=occupancy)
        n = perfetto_slices(pf)
        dropped = back.info.total_dropped or 0
        ok = n["slices"] == len(back) > 0 and n["ends"] == n["begins"] and dropped == 0
        rows.append(Row(group, f"{label}: bundle → Perfetto", "ok" if ok else "fail",
                        f"{n['slices']} slices / {len(back)} rows, {dropped} dropped",
                        f"{Path(pf).name}: every row one slice, every begin ended",
                        "convert the bundle with `fa4trace convert` and " + REPORT_BUG
                        if dropped == 0 else "records were dropped: the buffer sizing is wrong here; " + REPORT_BUG,
                        {**n, "rows": len(back), "dropped": dropped}))
    except Exception as e:  # noqa: BLE001
        rows.append(failed(group, f"{label}: bundle → Perfetto", e, nxt))
        back = trace
    try:
        s = summarize(back)
        qk, pv = s.get("qk_softmax_overlap"), s.get("pv_softmax_overlap")
        judged, ok = [], True
        for what, got, rng in (("QK∥SOFTMAX", qk, overlaps[0]), ("PV∥SOFTMAX", pv, overlaps[1])):
            if rng is None:
                continue
            judged.append(f"{what} in [{rng[0]:.0%}, {rng[1]:.0%}]")
            ok &= got is not None and rng[0] <= got <= rng[1]
        fmt = lambda x: "n/a" if x is None else f"{x:.0%}"  # noqa: E731
        rows.append(Row(group, f"{label}: overlap", "ok" if ok else "fail",
                        f"QK∥SOFTMAX {fmt(qk)}, PV∥SOFTMAX {fmt(pv)}", "expected " + ", ".join(judged),
                        "the trace does not show the schedule's overlap: check the GPU is not throttled "
                        "(`nvidia-smi -q -d PERFORMANCE`) and rerun; if it stays, " + REPORT_BUG,
                        {"qk_softmax_overlap": qk, "pv_softmax_overlap": pv}))
    except Exception as e:  # noqa: BLE001
        rows.append(failed(group, f"{label}: overlap", e, nxt))
    return rows


# What to do about a cost row that warns: our decode kernel runs the recorder's instructions in
# every warp of every CTA whether it stores or not (at the check's 8-CTA shape the lead warps
# alone cost as much as every warp: docs/recorder.md), so fewer warps would not help there; FA4's
# families can be left out.
COST_HINT = {"ours": "compare traced with traced (base vs ping-pong): at a launch of few long CTAs every warp runs "
                     "the recorder's instructions, so recording fewer warps is no cheaper",
             "fa4": "compare traced with traced, or record fewer event families (fa4trace record --families)"}


def _cost_row(label: str, plain_us: float, traced_us: float, how: str, hint: str) -> Row:
    over = traced_us / plain_us - 1
    return Row("cost", f"tracing cost, {label}", "ok" if over <= COST_WARN else "warn",
               f"{plain_us:.1f} → {traced_us:.1f} µs ({100 * over:+.1f}%)", how,
               f"tracing costs more than {COST_WARN:.0%} here: {hint}",
               {"untraced_us": plain_us, "traced_us": traced_us, "overhead": over})


def perturbation_row(label: str, trace) -> Row:
    """What the bundle measured of its own perturbation (fa4trace.analysis.fidelity), per launch:
    the figure to go by (its recorded CTAs against the untraced ones of the launch where that
    comparison holds, else its plain twin). Warns above COST_WARN as the cost rows do, and
    wherever the figure cannot be trusted (CTAs that wait on each other with no twin to go by,
    recorded CTAs faster than untraced ones, a twin timed from the host): never "ok" then.
    Skips where nothing was measured."""
    p = perturbation(trace)
    name = f"perturbation, {label}"
    judged = [(q.get("launch"), q) for q in p["per_launch"]] if p.get("per_launch") else [(None, p)]
    verdicts, measured, why = [], [], []
    for launch, q in judged:
        verdict, text, reason = _judge_perturbation(q)
        tag = "" if launch is None else f"launch {launch}: "
        verdicts.append(verdict)
        if text:
            measured.append(tag + text)
        if reason:
            why.append(tag + reason)
    lines = perturbation_lines(p)
    if all(v == "skip" for v in verdicts):
        return Row("cost", name, "skip", "", lines[0] if lines else "not measured")
    verdict = "warn" if "warn" in verdicts else "ok"
    return Row("cost", name, verdict, "; ".join(measured), "; ".join(lines),
               "; ".join(why) if verdict == "warn" else "", {"perturbation": p})


def _judge_perturbation(p: dict) -> tuple[str, str, str]:
    """(verdict, the figure as the row shows it, why it warns) of one launch's perturbation."""
    rel = headline(p)
    source = {"in_launch": "recorded vs untraced CTAs", "plain_twin": "traced vs plain twin"}.get(p.get("headline_source"))
    if rel is None:
        if not p.get("measured"):
            return "skip", "", ""
        why = (f"the in-launch figure is not valid for this kernel ({p['invalid']}) and no plain twin was timed"
               if p.get("valid") is False else "the in-launch figure is unreliable: " + "; ".join(p.get("unreliable") or [])
               + " (and no plain twin was timed)")
        return "warn", "n/a (unreliable)", why + ": record with a plain twin (instrument() times one) or a sample " \
                                                 "spread over the grid (cta_stride)"
    text = f"{100 * rel:+.1f}% ({source})"
    if p.get("status") == "unreliable":
        reasons = p.get("twin_unreliable") if p.get("headline_source") == "plain_twin" else p.get("unreliable")
        return "warn", text + ", unreliable", ("this figure cannot be trusted: " + "; ".join(reasons or [])
                                               + ": read the trace's durations with care")
    if rel > COST_WARN:
        return "warn", text, (f"the trace's durations run more than {COST_WARN:.0%} slow here: record fewer families "
                              "or fewer warps, and read its durations as upper bounds")
    return "ok", text, ""


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.0f}"


def _shape_text(s: Shape) -> str:
    return f"d{s.d} {s.hq}:{s.hkv} sk {s.sk} b {s.b}"


# ---- our decode kernel (Hopper) ---------------------------------------------------------------
def decode_rows(ctx: Context, schedule: str) -> list[Row]:
    """Our decode kernel, one schedule: vs fp32, traced == untraced, bundle → Perfetto, overlap."""
    import torch

    from .. import attention as A
    from ..attention.record import record_attention

    label = f"ours {schedule}"
    nxt = f"do not trust our decode kernel on this GPU; {REPORT_BUG}"
    s = ctx.shape
    splits = decode_splits(s)
    rows = []
    try:
        q, k, v = _inputs(s, ctx.seed)
        plain = A.decode_attention(q, k, v, schedule=schedule, num_splits=splits, build=ctx.build)
        rows.append(_ref_row("decode", label, q, k, v, plain, nxt))
        buf, _spec, _plan = A.trace_buffer(q, k, v, schedule=schedule, num_splits=splits, build=ctx.build)
        traced = A.decode_attention(q, k, v, schedule=schedule, num_splits=splits, trace=buf, build=ctx.build)
        torch.cuda.synchronize()
        same = bool(torch.equal(plain, traced))
        rows.append(Row("decode", f"{label}: traced == untraced", "ok" if same else "fail",
                        "equal" if same else "DIFFERENT", f"{_shape_text(s)}, {splits} splits, bit for bit",
                        "the recorder changes our kernel's output here: " + nxt))
    except Exception as e:  # noqa: BLE001
        rows.append(failed("decode", f"{label}: run", e, nxt))
    try:
        trace = record_attention(schedule, s, num_splits=splits, build=ctx.build, seed=ctx.seed)
    except Exception as e:  # noqa: BLE001
        return rows + [failed("decode", f"{label}: record", e, nxt)]
    rows += _bundle_rows("decode", label, trace, ctx, f"decode_{schedule}", OUR_OVERLAPS[schedule], nxt)
    t = trace.info.timing
    if schedule == "pingpong" and t is not None and t.kernel_us and t.traced_us:
        rows.append(_cost_row(label, t.kernel_us, t.traced_us,
                              f"{_shape_text(s)}, CUDA-graph replay (10 launches per graph), median of 20",
                              COST_HINT["ours"]))
    return rows


# ---- FlashAttention-4 -------------------------------------------------------------------------
def fa4_schedules(major: int) -> tuple:
    """FA4's decode paths for this architecture: SM100 ping-pong and base, SM90 FA3's."""
    return ("pingpong", "base") if major in (10, 11) else ("fa3",) if major == 9 else ()


def fa4_missing_row(ctx: Context) -> Row:
    return Row("fa4", "FA4", "warn", "not available",
               "no flash-attn-4 with the CuTe DSL to compile it and no FA4 build folder",
               "pip install flash-attn-4==4.0.0b36 quack-kernels==0.6.5 einops --no-deps (docs/fa4-on-b200.md), "
               "or build with `python -m fa4trace.fa4.buildtool -o build/fa4_sm90` and pass --fa4-build")


def fa4_rows(ctx: Context, schedule: str, *, cost: bool = False) -> list[Row]:
    """FA4's forward, one path: vs fp32, traced == untraced, bundle → Perfetto, overlap (and,
    with ``cost``, what tracing costs it)."""
    import torch

    from ..fa4.run import call_args, fa4_arch, load_fn, record

    label = f"FA4 {schedule}"
    nxt = f"do not trust FA4 traces on this GPU (our own rows still hold); {REPORT_BUG}"
    s = ctx.shape
    scale = 1.0 / math.sqrt(s.d)
    rows = []
    try:
        arch = fa4_arch()
        kw = dict(schedule=schedule, d=s.d, hq=s.hq, hkv=s.hkv, sq=s.sq, dtype=s.dtype, build=ctx.fa4_build)
        plain = load_fn(arch, traced=False, **kw)
        q, k, v = _inputs(s, ctx.seed)
        out = torch.full_like(q, float("nan"))
        plain_args = call_args(plain.params, q=q, k=k, v=v, out=out, softmax_scale=scale)
        plain.fn(*plain_args)
        rows.append(_ref_row("fa4", label, q, k, v, out, nxt))
    except Exception as e:  # noqa: BLE001
        return [failed("fa4", f"{label}: run", e, nxt)]
    try:
        trace = record(s, schedule=schedule, build=ctx.fa4_build, seed=ctx.seed)
        chk = trace.info.check or {}
        ok = bool(chk.get("bitwise_equal_to_untraced")) and bool(chk.get("nan_free"))
        rows.append(Row("fa4", f"{label}: traced == untraced", "ok" if ok else "fail",
                        "equal" if chk.get("bitwise_equal_to_untraced") else "DIFFERENT",
                        f"{_shape_text(s)}, bit for bit" + ("" if chk.get("nan_free", True) else "; NaN in output"),
                        "FA4's hooks change its output here: " + nxt, chk))
    except Exception as e:  # noqa: BLE001
        return rows + [failed("fa4", f"{label}: record", e, nxt)]
    rows += _bundle_rows("fa4", label, trace, ctx, f"fa4_{schedule}", FA4_OVERLAPS[schedule], nxt)
    rows.append(perturbation_row(label, trace))
    if cost:
        try:
            rows.append(_fa4_cost(ctx, arch, kw, trace, q, k, v, scale, plain_args, plain, label))
        except Exception as e:  # noqa: BLE001
            rows.append(failed("cost", f"tracing cost, {label}", e, nxt))
    return rows


def _fa4_cost(ctx, arch, kw, trace, q, k, v, scale, plain_args, plain, label) -> Row:
    import torch

    from ..fa4.run import call_args, load_fn
    from ..format import layout as L
    from ..run.record import new_trace_tensor
    from ..run.timing import graph_time

    traced = load_fn(arch, traced=True, **kw)
    ln = trace.info.launches[0]
    spec = L.BufferSpec.for_grid(ln.grid_ctas, ln.warps_per_cta, ln.capacity)
    buf = new_trace_tensor(spec)
    out = torch.empty_like(q)
    targs = call_args(traced.params, q=q, k=k, v=v, out=out, softmax_scale=scale, trace=buf)
    us_plain, _ = graph_time(lambda i: plain.fn(*plain_args), 1, 20, 10)
    us_traced, _ = graph_time(lambda i: traced.fn(*targs), 1, 20, 10)
    return _cost_row(label, us_plain, us_traced,
                     f"{_shape_text(ctx.shape)}, CUDA-graph replay (10 launches per graph), median of 20",
                     COST_HINT["fa4"])
