"""Where our decode kernel's tracing cost goes: the recorder with its timer reads or its record
stores taken out, one build each, timed at the shapes where tracing costs the most.

    python benchmarks/decode_recorder_parts.py build -o build/decode_parts    # CPU with the CuTe DSL
    python benchmarks/decode_recorder_parts.py run build/decode_parts --json benchmarks/results/decode_recorder_parts_h200.json

Parts (``PARTS``, built inside ``ablated``, which replaces one part of ``Recorder`` for the
build): "full" (the recorder as shipped), "no timer reads" (events stage a constant), "no record
stores" (events stage nothing, and ptxas then drops their timer reads as well, whose values go
nowhere: the SASS of this build has the timer reads of the warp anchors only; the flushes still
run), "no events" (the warps' start and finish only: the recorder's fixed cost), "no tick edge"
(the start and end anchors one plain read each instead of a spin to the global timer's next
tick). Each part is its own AOT build of the untraced and the traced (core events)
kernels; ``fa4trace bench`` times every traced kernel against its untraced twin timed next to it
(CUDA-graph replay, cold L2), one process per part and shape, the parts in turn within each round.
A part that leaves the cost where it was did not hold it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fa4trace.bench.buildrun import build_run_parser  # noqa: E402  (after the path)

# part -> (the part of Recorder taken out, as ``ablated`` names it; what the row says)
PARTS = {"full": (None, "the recorder as shipped"),
         "no-timer": ("no-timer", "no timer reads (events stage a constant)"),
         "no-store": ("no-store", "no record stores, hence no timer reads (nothing staged; the compiler drops the unused reads)"),
         "no-events": ("no-events", "no events: the warps' start and finish only"),
         "no-edge": ("no-edge", "start and end anchors not caught at a timer tick edge")}
# (bench --only filter, kernels): fa4trace check's shape at its 8 splits and as the planner splits it;
# the matrix's costliest shapes (H200, traced_decode_h200.json)
SHAPES = [("d=128,hq=16,hkv=1,sk=32768,b=1,sq=1", "pingpong@s8,pingpong"),
          ("d=64,hq=16,hkv=1,sk=131072,b=1,sq=1", "base,pingpong"),
          ("d=64,hq=16,hkv=1,sk=4096,b=1,sq=1", "base,pingpong")]
BUILT = [(128, "pingpong"), (64, "pingpong"), (64, "base")]  # each with 32- and 64-row CTAs


SASS_VARIANT = (128, "pingpong", 32)  # fa4trace check's kernel (d128 ping-pong, 32-row CTAs): --sass counts it


@contextlib.contextmanager
def ablated(part):
    """Compile ``Recorder``'s kernels inside this block with one part taken out (None: as shipped),
    by replacing that part's method for the block only: "no-timer" (``Recorder.read_timer``: events
    record the constant 0), "no-store" (``Recorder.keep_in_lanes`` / ``keep_in_smem``: events keep no
    record), "no-events" (``Recorder.records``: no event compiles in), "no-edge"
    (``fa4trace.device.clock.edge_anchor``: the start and end anchors one plain read of each timer).
    The shipped recorder has no switch for any of them; a build outside the block is the product's."""
    from unittest import mock

    import cutlass.cute as cute
    from cutlass import Int32

    from fa4trace.device import Recorder, clock

    @cute.jit
    def plain_anchor():
        return cute.arch.globaltimer(), cute.arch.clock64()

    replaced = {None: {}, "no-timer": {(Recorder, "read_timer"): lambda self: Int32(0)},
                "no-store": {(Recorder, "keep_in_lanes"): lambda self, mine, t, hi, st_lo, st_hi: (st_lo, st_hi),
                             (Recorder, "keep_in_smem"): lambda self, slot, t, hi: None},
                "no-events": {(Recorder, "records"): lambda self, event: False},
                "no-edge": {(clock, "edge_anchor"): plain_anchor}}
    if part not in replaced:
        raise ValueError(f"unknown recorder part {part!r}: one of {sorted(p for p in replaced if p)} or None")
    with contextlib.ExitStack() as stack:
        for (owner, name), new in replaced[part].items():
            stack.enter_context(mock.patch.object(owner, name, new))
        yield


def build(out: str, force: bool, only=None, sass_json=None) -> None:
    """One AOT build per part (``only``: those parts): the untraced and core-traced kernels of
    ``BUILT`` (sm_90a). ``sass_json``: also count the SASS of ``SASS_VARIANT`` in each part
    (``fa4trace.bench.sass``: needs ptxas and nvdisasm, no GPU) into that result file."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from fa4trace.bench.sass import footprint, sass_of
    from fa4trace.format.entry import Entry
    from fa4trace.run.aot import build_library
    from kernels.attention_sm90 import PTXAS_OPTIONS, compile_variant
    from kernels.decode_spec import BLOCK_ROWS, Variant

    ptxas_args = tuple(PTXAS_OPTIONS.split("=", 1)[1].split())  # what the DSL gives ptxas for these kernels
    options = "--enable-tvm-ffi" + (" --keep-ptx" if sass_json else "")
    counted = {}
    for part, (ablation, what) in PARTS.items():
        if only is not None and part not in only:
            continue
        with ablated(ablation):
            compiled = {}
            for (d, sched), rows in itertools.product(BUILT, BLOCK_ROWS):
                for v in (Variant(d, sched, block_rows=rows), Variant(d, sched, block_rows=rows, events="core")):
                    fn = compile_variant(v, options=options)[0]
                    compiled[v.name] = (fn, Entry(v.name, "attention", {**v.config(), "arch": "sm_90a"}))
                    if sass_json and (d, sched, rows) == SASS_VARIANT and (v.traced or "plain" not in counted):
                        key = part if v.traced else "plain"
                        counted[key] = (what if v.traced else "the kernel, untraced", v.name,
                                        footprint(sass_of(fn.__ptx__, ptxas_args=ptxas_args)))
        print(build_library(compiled, os.path.join(out, part), arch="sm_90a", overwrite=force), flush=True)
    if sass_json:
        write_sass(sass_json, counted)


SASS_NOTES = ("fa4trace check's kernel (d128 ping-pong, 32-row CTAs) as ptxas -O3 --fmad=false builds it, the "
              "whole kernel. Timer reads include the warps' %globaltimer anchors. The same parts' costs on the "
              "H200: decode_recorder_parts_h200.json.")


def write_sass(path: str, counted: dict) -> None:
    """Each part's SASS counts of fa4trace check's kernel, and what each adds to the untraced one."""
    from fa4trace.bench import results, sass

    named = [({"part": what, "kernel": name}, fp) for what, name, fp in counted.values()]
    results.write(path, sass.envelope(
        "decode-recorder-parts-sass", "What each part of our decode kernel's recorder adds in SASS (sm_90a)", named,
        counted["plain"][2], [["part", "recorder"], ["kernel", "kernel"]], SASS_NOTES))
    print(f"wrote {path}")


def overheads(bench_json: str) -> dict:
    """{kernel (with its @option): traced vs untraced %} of one ``fa4trace bench`` file."""
    rows = json.load(open(bench_json))["rows"]
    us = {r["kernel"]: r["us"] for r in rows}
    out = {}
    for k, v in us.items():
        name, at, opt = k.partition("@")
        if name.endswith("+trace"):
            ref = us.get(name[:-len("+trace")] + "+ref" + at + opt)
            if ref and v == v and ref == ref:
                out[name[:-len("+trace")] + at + opt] = 100 * (v / ref - 1)
    return out


def run(build_dir: str, json_path: str | None, rounds: int, shapes=SHAPES, before: str | None = None) -> list:
    """Every part built (a folder of ``build_dir``) at every shape of ``shapes``, ``rounds``
    times, the parts in turn. ``before``: a build folder of the same parts made at an earlier
    commit, timed in the same rounds (the two folders take turns going first); its rows' part
    says "(before)". A shape the build cannot run (no traced timing) stops the run with its
    error."""
    from fa4trace.bench import results

    got: dict = {}
    builds = ([(before, " (before)")] if before else []) + [(build_dir, "")]
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(rounds):
            for folder, label in (builds if rnd % 2 == 0 else builds[::-1]):
                for part in [p for p in PARTS if os.path.isdir(os.path.join(folder, p))]:
                    for only, kernels in shapes:
                        pct = _time_part(os.path.join(folder, part), only, kernels, os.path.join(tmp, str(len(got))))
                        for kernel, v in pct.items():
                            got.setdefault((only, kernel, PARTS[part][1] + label), []).append(v)
                            print(f"round {rnd + 1} {part + label:18s} {only} {kernel}: {v:+.1f}%", flush=True)
    rows = [{"shape": only.replace(",", " "), "schedule": kernel, "part": part,
             "cost_pct": round(statistics.median(v), 2), "rounds_pct": [round(x, 2) for x in v]}
            for (only, kernel, part), v in got.items()]
    if json_path:
        results.write(json_path, results.envelope(
            "decode-recorder-parts", "Where our decode kernel's tracing cost goes", rows,
            columns=[["shape", "shape"], ["schedule", "schedule"], ["part", "recorder"], ["cost_pct", "cost %"]],
            notes=f"Every warp of every CTA records the core events; each traced kernel against its untraced "
                  f"twin timed next to it (fa4trace bench: CUDA-graph replay, cold L2, 5 passes); the median of "
                  f"{rounds} rounds, the parts in turn within each round."))
    return rows


def _time_part(build: str, only: str, kernels: str, out: str) -> dict:
    """{kernel: cost %} of one part's build at one shape (one ``fa4trace bench`` process)."""
    env = dict(os.environ, FA4TRACE_BUILD=build)
    subprocess.run([sys.executable, "-m", "fa4trace", "bench", "--only", only, "--kernels", kernels,
                    "--trace-at", "all", "--traced", "trace", "--out", out],
                   env=env, check=True, capture_output=True, text=True)
    found = overheads(os.path.join(out, "bench.json"))
    if not found:
        errors = [r.get("error") for r in json.load(open(os.path.join(out, "bench.json")))["rows"]]
        raise SystemExit(f"{build} at {only}: no traced timing ({next(filter(None, errors), '?')})")
    return found


def main(argv=None) -> None:
    ap, b, r = build_run_parser(__doc__, "build/decode_parts", build_help="compile every part (CPU, the CuTe DSL)",
                                run_help="time every part built on this GPU")
    b.add_argument("--only", help="comma-separated parts to build (default: every part)")
    b.add_argument("--sass", metavar="JSON", help="also write the SASS counts of fa4trace check's kernel in each part "
                                                  "to this result file (needs ptxas and nvdisasm)")
    r.add_argument("--rounds", type=int, default=2)
    r.add_argument("--shapes", type=int, default=len(SHAPES), help="the first N of SHAPES")
    r.add_argument("--before", metavar="DIR", help="a build folder of the same parts at an earlier commit, timed "
                                                   "in the same rounds (its rows say \"(before)\")")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        build(a.out, a.force, a.only.split(",") if a.only else None, a.sass)
    else:
        run(a.build, a.json, a.rounds, SHAPES[:a.shapes], a.before)


if __name__ == "__main__":
    main()
