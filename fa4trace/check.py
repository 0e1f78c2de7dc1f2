"""`fa4trace check`: can fa4trace be trusted on this GPU? The rows, the verdict, the report.

Each check is one ``Row``: a verdict (ok / warn / fail / skip), what it measured (with units),
a one-line detail and, when not ok, what to do next. The GPU work lives in
``fa4trace.check_rows`` (one small function per check); this module holds what needs no GPU,
so it is tested on any machine: the verdict rules, the text and JSON reports, the guard words
around a trace buffer, the Perfetto slice count and the output folder rules.

Verdict rules (``final_verdict``), in order:
1. not usable: a row of a core group failed (``CORE_GROUPS``: the setup, the timer
   calibration, the recorder, our decode kernel), or no timer or recorder row passed
   (nothing showed that the recorder works here);
2. usable with warnings: any other row failed (FlashAttention-4's rows, the cost of tracing)
   or any row warned (FA4 not available here counts as a warning);
3. usable: everything that ran passed (skips, such as no decode kernel for this architecture,
   are neutral).

Exit codes of the command: 0 usable, 3 usable with warnings, 1 not usable, 2 no CUDA GPU here
(or bad arguments, as for every fa4trace command).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .errors import DeviceUnavailable, Fa4traceError

VERDICTS = ("ok", "warn", "fail", "skip")
# Groups whose failure makes fa4trace not usable on the GPU (its own kernels and recorder).
CORE_GROUPS = ("setup", "timer", "recorder", "decode")
GROUPS = CORE_GROUPS + ("fa4", "cost")
USABLE, WARNINGS, NOT_USABLE = "usable", "usable with warnings", "not usable"
EXIT_CODES = {USABLE: 0, WARNINGS: 3, NOT_USABLE: 1}
EXIT_NO_GPU = 2
NO_GPU_MESSAGE = "no CUDA GPU here: fa4trace check needs one"
REPORT_NAME = "check.json"
# What a check writes into its folder; an existing one of these is not replaced without --force.
WRITES = ("*.parquet", "*.pftrace", REPORT_NAME)


@dataclass
class Row:
    """One check's result: ``measured`` is what a person reads (units included); ``values``
    the same numbers for the JSON report."""

    group: str
    name: str
    verdict: str
    measured: str = ""
    detail: str = ""
    next: str = ""
    values: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if self.group not in GROUPS:
            raise ValueError(f"group must be one of {GROUPS}, got {self.group!r}")
        if self.verdict in ("warn", "fail") and not self.next:
            raise ValueError(f"row {self.name!r} is {self.verdict} and says nothing to do next")


def failed(group: str, name: str, err: BaseException, next_: str) -> Row:
    """The row of a check whose kernel (or anything else) raised: its one-line error."""
    msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return Row(group, name, "fail", "", f"{type(err).__name__}: {msg}", next_)


def final_verdict(rows: list[Row]) -> str:
    """usable / usable with warnings / not usable (the rules in the module docstring)."""
    if any(r.verdict == "fail" and r.group in CORE_GROUPS for r in rows):
        return NOT_USABLE
    for g in ("timer", "recorder"):
        if not any(r.group == g and r.verdict == "ok" for r in rows):
            return NOT_USABLE
    if any(r.verdict in ("fail", "warn") for r in rows):
        return WARNINGS
    return USABLE


def exit_code(verdict: str) -> int:
    return EXIT_CODES[verdict]


@dataclass
class Report:
    """Everything a check found: the GPU, how kernels are loaded, the rows, the files written."""

    gpu: dict
    route: dict
    rows: list
    out_dir: str
    files: list = field(default_factory=list)
    options: dict = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return final_verdict(self.rows)

    def as_dict(self) -> dict:
        v = self.verdict
        return {"verdict": v, "exit_code": exit_code(v), "gpu": self.gpu, "route": self.route,
                "options": self.options, "rows": [asdict(r) for r in self.rows],
                "counts": {k: sum(r.verdict == k for r in self.rows) for k in VERDICTS},
                "out_dir": self.out_dir, "files": self.files}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=1, sort_keys=True, default=_json_default)


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    return str(o)


_MARK = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def render(report: Report) -> str:
    """The text report: GPU and route, one line per row (a second line saying what to do next
    for each warn / fail row), the files written, then the one-line verdict last."""
    g = report.gpu
    lines = [f"GPU    {g.get('name', '?')} ({g.get('arch', '?')}, {g.get('sm_count', '?')} SMs, "
             f"driver {g.get('driver') or 'n/a'}, torch {g.get('torch', 'n/a')}, CUDA {g.get('cuda_runtime') or 'n/a'})",
             "route  " + "; ".join(f"{k}: {v}" for k, v in report.route.items()), ""]
    width = max([len(r.name) for r in report.rows] + [10])
    mwidth = min(max([len(r.measured) for r in report.rows] + [8]), 48)
    group = None
    for r in report.rows:
        if r.group != group:
            group = r.group
            lines.append(f"[{group}]")
        line = f"  {_MARK[r.verdict]:4s}  {r.name:{width}s}  {r.measured:{mwidth}s}  {r.detail}".rstrip()
        lines.append(line)
        if r.verdict in ("warn", "fail") and r.next:
            lines.append(f"  {'':4s}  {'':{width}s}  next: {r.next}")
    if report.files:
        lines += ["", f"wrote {len(report.files)} files to {report.out_dir} (attach them to a bug report)"]
    c = {k: sum(r.verdict == k for r in report.rows) for k in VERDICTS}
    lines += ["", f"verdict: {report.verdict} ({c['ok']} ok, {c['warn']} warnings, {c['fail']} failed, {c['skip']} skipped)"]
    return "\n".join(lines)


# ---- the output folder -----------------------------------------------------------------------
def prepare_out_dir(path, force: bool, *, create: bool = True) -> Path:
    """The folder the bundles go to: created if missing (unless ``create`` is False: only
    checked); one holding a file a check writes (bundles, Perfetto traces, check.json) is
    refused unless ``force``."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise Fa4traceError(f"{p} exists and is not a folder")
    if p.is_dir() and not force:
        for pattern in WRITES:
            hit = sorted(p.glob(pattern))
            if hit:
                raise Fa4traceError(f"{hit[0]} exists; refusing to overwrite the bundles in {p} (add --force)")
    if create:
        p.mkdir(parents=True, exist_ok=True)
    return p


# ---- running ----------------------------------------------------------------------------------
class NoGpu(DeviceUnavailable):
    """No CUDA GPU (or no torch with CUDA) here: nothing to check."""


STEP_FAILED = "a check stopped with an error: rerun it; if it repeats, report it with the check folder attached"


def run_step(group: str, name: str, fn, ctx, log=None) -> list[Row]:
    """Run one check function; whatever it raises becomes one fail row, so the rest still run."""
    if log:
        log(f"checking {name} ...")
    try:
        rows = list(fn(ctx))
    except Exception as e:  # noqa: BLE001 - the point: one failing check never stops the others
        return [failed(group, name, e, STEP_FAILED)]
    return rows


def plan(ctx, route: dict) -> tuple[list[Row], list]:
    """(rows known without running anything, steps to run: (group, name, function of ctx)).

    Timer and recorder always; our decode kernel on Hopper (each schedule; --quick: ping-pong);
    FA4's paths for the architecture (SM100: ping-pong and base; SM90: FA3's; --quick: the
    first), the first also timed for the cost of tracing."""
    from functools import partial

    from . import check_rows as R
    from .kernels.decode_spec import SCHEDULES

    rows = R.route_rows(ctx, route)
    steps = []
    if route["kernels"] == "none":
        rows += [Row(g, n, "skip", "", "no kernels to run (see the kernels row)")
                 for g, n in (("timer", "calibration kernel"), ("recorder", "marker kernel"))]
    else:
        steps += [("timer", "timer calibration", R.timer_rows), ("recorder", "recorder", R.recorder_rows)]
    if ctx.major != 9:
        rows.append(Row("decode", "ours", "skip", "", f"no decode kernel for this architecture "
                                                       f"({ctx.gpu.get('arch')}; ours is Hopper's, sm_90a)"))
    elif route["kernels"] != "none":
        for s in (("pingpong",) if ctx.quick else SCHEDULES):
            steps.append(("decode", f"ours {s}", partial(R.decode_rows, schedule=s)))
    fa4 = R.fa4_schedules(ctx.major)
    if not fa4:
        rows.append(Row("fa4", "FA4", "skip", "", "FA4 tracing supports SM90 (H100/H200) and SM100 (B200)"))
    elif route["fa4"] == "none":
        rows.append(R.fa4_missing_row(ctx))
    else:
        for i, s in enumerate(fa4[:1] if ctx.quick else fa4):
            steps.append(("fa4", f"FA4 {s}", partial(R.fa4_rows, schedule=s, cost=i == 0)))
    return rows, steps


def run_checks(out_dir, *, build=None, fa4_build=None, quick: bool = False, force: bool = False, log=None,
               seed: int = 0, **shape) -> Report:
    """Detect the GPU and the route, run every check it can (a failing one becomes a fail row,
    the others still run), write the bundles and check.json into ``out_dir``, return the
    Report. Raises NoGpu where there is no CUDA GPU. ``shape``: d, hq, hkv, sk, b, sq of the
    attention rows (the overlap ranges hold for the default, d128 16:1 sk 32768 b 1)."""
    from . import check_rows as R

    gpu = R.detect_gpu()
    if gpu is None:
        raise NoGpu(NO_GPU_MESSAGE)
    out = prepare_out_dir(out_dir, force)
    ctx = R.Context(out=out, gpu=gpu, build=build, fa4_build=fa4_build, quick=quick, force=force, seed=seed)
    ctx.shape.update(shape)
    route = R.detect_route(ctx)
    rows, steps = plan(ctx, route)
    for group, name, fn in steps:
        rows += run_step(group, name, fn, ctx, log)
    rows.sort(key=lambda r: GROUPS.index(r.group))
    files = [f for f in dict.fromkeys(ctx.files) if Path(f).exists()]
    report = Report(gpu=gpu, route=route, rows=rows, out_dir=str(out), files=files,
                    options={"quick": quick, "build": build, "fa4_build": fa4_build, "seed": seed, "shape": ctx.shape})
    dest = out / REPORT_NAME
    report.files.append(str(dest))
    dest.write_text(report.to_json() + "\n")
    return report


# ---- guard words around a trace buffer -------------------------------------------------------
GUARD_WORD = 0xDEADBEEFCAFEF00D
# 64 words (512 bytes) each side: a stray write just past either end lands in a guard, and the
# buffer between them keeps the 16-byte alignment the kernels assume.
GUARD_WORDS = 64


def guarded_buffer(spec, guard: int = GUARD_WORDS) -> np.ndarray:
    """Host words: ``guard`` sentinel words, the buffer of ``spec`` (header written, slots
    zeroed), ``guard`` sentinel words. Launch with ``buffer_view`` of its device copy."""
    if guard < 2 or guard % 2:
        raise ValueError(f"guard must be an even number >= 2 of words (16-byte alignment), got {guard}")
    g = np.full(guard, GUARD_WORD, np.uint64)
    return np.concatenate([g, spec.new_buffer(), g])


def buffer_view(words, spec, guard: int = GUARD_WORDS):
    """The trace buffer between the guards (numpy or torch: a contiguous slice, no copy)."""
    return words[guard:guard + spec.words]


def guard_damage(words, spec, guard: int = GUARD_WORDS) -> dict:
    """How many sentinel words changed before and after the buffer (0 and 0: nothing was
    written out of bounds), from the host copy of a guarded buffer after the launch."""
    w = np.asarray(words).reshape(-1).view(np.uint64)
    if w.size != spec.words + 2 * guard:
        raise ValueError(f"guarded buffer has {w.size} words, expected {spec.words + 2 * guard}")
    sentinel = np.uint64(GUARD_WORD)
    return {"before": int((w[:guard] != sentinel).sum()), "after": int((w[guard + spec.words:] != sentinel).sum())}


# ---- Perfetto ---------------------------------------------------------------------------------
def perfetto_slices(path) -> dict:
    """Read a Perfetto trace back and count its track events: ``slices`` (slice begins +
    instants, what the UI shows as slices), ``ends`` and ``counters``. A bundle converts
    correctly when slices == its rows and ends == begins."""
    import zlib

    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    te = pb.TrackEvent
    n = {"begins": 0, "ends": 0, "instants": 0, "counters": 0}
    key = {te.TYPE_SLICE_BEGIN: "begins", te.TYPE_SLICE_END: "ends", te.TYPE_INSTANT: "instants",
           te.TYPE_COUNTER: "counters"}

    def walk(data: bytes):
        for p in pb.Trace.FromString(data).packet:
            if p.HasField("compressed_packets"):
                walk(zlib.decompress(p.compressed_packets))
            elif p.HasField("track_event") and p.track_event.type in key:
                n[key[p.track_event.type]] += 1

    walk(Path(path).read_bytes())
    n["slices"] = n["begins"] + n["instants"]
    return n
