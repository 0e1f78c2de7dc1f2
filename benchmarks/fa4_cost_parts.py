"""Where fa4trace.instrument's cost goes in FA4's SM90 prefill: one build per part, timed together.

    python benchmarks/fa4_cost_parts.py build -o build/fa4_parts      # CPU with the CuTe DSL + flash-attn-4
    python benchmarks/fa4_cost_parts.py run build/fa4_parts --json benchmarks/results/fa4_cost_parts_h200.json  # GPU
    python benchmarks/fa4_cost_parts.py build -o build/fa4_parts --sass benchmarks/results/fa4_cost_parts_sass.json

FA4's SM90 forward at b2 s8192 h16 d128 (benchmarks/auto_kernels.py's prefill shape), every warp of
every CTA recording, each build timed against the plain build right before it in every round
(CUDA-graph replay, cold L2; auto_kernels.run_fa4, fa4trace.run.timing.paired_costs); with
``--sass`` the build also counts each part's SASS (fa4trace.bench.sass). The parts (``PARTS``): the recorder alone
(warp lifetimes, with and without the CTA-lifetime stamps), the two named spans (softmax,
rescale) alone and together, each family alone, spans + pipeline + barrier, every family; with
records in global memory (smem cursor) or in the shared-memory ring, and with span begins held
in registers across the wrapped call or stored before it (``families.STORE_AT_BEGIN``: the
user's spans by default, none, or every family's); ``VARIANTS``: the same events with some timer
reads taken out (the records stay), to tell what the reads cost.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fa4trace.bench.buildrun import build_run_parser  # noqa: E402  (after the path)

BASE = "fa4_sm90_prefill_full"
SOFTMAX, RESCALE = "softmax", "rescale"
ALL_SPAN_FAMILIES = ("user", "pipeline", "barrier", "mma", "tma")
# what a part's row adds where its spans' begins are stored otherwise than by default
HELD, FIRST = ", begins held across the call", ", the spans' begins stored before the call"
TARGET_PARTS = ("every family + spans", "spans + pipeline + barrier")  # the cost targets' configurations
# suffix -> (families (None: every one), spans, cursor, families whose spans store their begin
# before the call (None: fa4trace's default), CTA-lifetime stamps, what the row says)
PARTS = {
    "": (None, (SOFTMAX, RESCALE), "smem", None, True, "every family + spans"),
    "_life": ((), (), "smem", None, True, "warp lifetimes (recorder start and finish) + CTA stamps"),
    "_life_nostamps": ((), (), "smem", None, False, "warp lifetimes, no CTA stamps"),
    "_spans": ((), (SOFTMAX, RESCALE), "smem", None, True, "spans"),
    "_spans_ring": ((), (SOFTMAX, RESCALE), "ring", None, True, "spans"),
    "_spans_held": ((), (SOFTMAX, RESCALE), "ring", (), True, "spans" + HELD),
    "_softmax": ((), (SOFTMAX,), "ring", None, True, "softmax span"),
    "_rescale": ((), (RESCALE,), "ring", None, True, "rescale span"),
    "_pipeline": (("pipeline",), (), "ring", None, True, "pipeline"),
    "_barrier": (("barrier",), (), "ring", None, True, "barrier"),
    "_mma": (("mma",), (), "ring", None, True, "mma"),
    "_tma": (("tma",), (), "ring", None, True, "tma"),
    "_spb": (("pipeline", "barrier"), (SOFTMAX, RESCALE), "smem", None, True, "spans + pipeline + barrier"),
    "_spb_ring": (("pipeline", "barrier"), (SOFTMAX, RESCALE), "ring", None, True, "spans + pipeline + barrier"),
    "_spb_held": (("pipeline", "barrier"), (SOFTMAX, RESCALE), "ring", (), True, "spans + pipeline + barrier" + HELD),
    "_spb_allbegin": (("pipeline", "barrier"), (SOFTMAX, RESCALE), "ring", ALL_SPAN_FAMILIES, True,
                      "spans + pipeline + barrier, every family's begins stored first"),
    "_all_ring": (None, (SOFTMAX, RESCALE), "ring", None, True, "every family + spans"),
    "_all_held": (None, (SOFTMAX, RESCALE), "ring", (), True, "every family + spans" + HELD),
}
# suffix -> (the part it repeats, the timer reads taken out of it (``ablated``), what the row
# adds): the same events compiled another way, to tell one cost from the rest
VARIANTS = {
    "_spans_ring_notimer": ("_spans_ring", "no-timer", "no timer reads"),
    "_spb_ring_notimer": ("_spb_ring", "no-timer", "no timer reads"),
    "_all_ring_notimer": ("_all_ring", "no-timer", "no timer reads"),
    "_spb_ring_notimer_instants": ("_spb_ring", "no-timer-instants", "no timer reads for instants"),
    "_spb_ring_notimer_spans": ("_spb_ring", "no-timer-spans", "no timer reads for span begins and ends"),
}


NOTES = ("Every warp of every CTA records; each build against the plain build timed right before it, "
         "in every round (median of the rounds' ratios; the builds' order rotates by one each round; "
         "CUDA-graph replay, cold L2). records: smem = each record stored to global memory (the cursor in "
         "shared memory); ring = each record a shared-memory store, the newest 128 per warp copied out at "
         "the warp's exit. no timer reads: a constant recorded where the timer was read (the records and "
         "their stores stay; the bundle does not decode). Between runs on different days the same build "
         "moved by up to 3 points: compare rows of one file.")


def configuration(row: dict):
    """The cost target configuration a result row is (one of ``TARGET_PARTS``), whichever way its
    spans' begins were stored (the row's ``begins_first`` says), or None: a family alone, a
    part with timer reads taken out, anything else."""
    text = row.get("part") or ""
    for clause in (HELD, FIRST):
        text = text[:-len(clause)] if text.endswith(clause) else text
    return text if text in TARGET_PARTS else None


def part(sfx: str) -> tuple:
    """(families, spans, cursor, begins first, CTA stamps, what the row says, the timer reads
    taken out (``ablated``; None: none)) of a part."""
    base, ablation, more = VARIANTS.get(sfx, (sfx, None, ""))
    *cfg, what = PARTS[base]
    return (*cfg, what + (", " + more if more else ""), ablation)


@contextlib.contextmanager
def ablated(ablation):
    """Compile fa4trace.instrument's kernels inside this block with timer reads taken out (None:
    as shipped), by replacing a method of the segment recorder for the block only: "no-timer"
    (``SegmentRecorder.read_timer``: every record takes the constant 0 where it read the timer),
    "no-timer-instants" / "no-timer-spans" (``Segment.instant`` / ``Segment.begin`` and ``end``
    given the time 0: only those records). The records and their stores stay. The shipped
    recorder has no switch for any of them; a build outside the block is the product's."""
    from unittest import mock

    from cutlass import Int64

    from fa4trace.device.segment import Segment, SegmentRecorder

    def at_zero(method):  # the event, recorded with the time 0 where no time was given
        return lambda self, event, payload=None, t=None: method(self, event, payload, Int64(0) if t is None else t)

    replaced = {None: {}, "no-timer": {(SegmentRecorder, "read_timer"): lambda self: Int64(0)},
                "no-timer-instants": {(Segment, "instant"): at_zero(Segment.instant)},
                "no-timer-spans": {(Segment, "begin"): at_zero(Segment.begin), (Segment, "end"): at_zero(Segment.end)}}
    if ablation not in replaced:
        raise ValueError(f"unknown timer ablation {ablation!r}: one of {sorted(a for a in replaced if a)} or None")
    with contextlib.ExitStack() as stack:
        for (owner, name), new in replaced[ablation].items():
            stack.enter_context(mock.patch.object(owner, name, new))
        yield


def build(out: str, force: bool, only=None, sass_json=None) -> None:
    """Compile every part (sm_90a; ``only``: those suffixes, plus the full build every run needs)
    into one AOT library. ``sass_json``: also count each part's SASS against the plain kernel's
    (``fa4trace.bench.sass``: needs ptxas and nvdisasm, no GPU) into that result file."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import auto_kernels as ak
    import fa4trace.auto.compiler as compiler
    import fa4trace.auto.families as families
    from fa4trace.auto.build import entries
    from fa4trace.bench.sass import footprint, sass_of
    from fa4trace.run.aot import build_library

    all_spans, compile_traced, default_begin = dict(ak.FA4_SPANS), compiler.compile_traced, families.STORE_AT_BEGIN
    t, ents, counted = time.time(), {}, {}
    try:
        for sfx in [x for x in (*PARTS, *VARIANTS) if not x or only is None or x in only]:
            fams, spans, cursor, begin, stamps, what, ablation = part(sfx)
            families.STORE_AT_BEGIN = default_begin if begin is None else frozenset(begin)
            ak.FA4_SPANS = {k: all_spans[k] for k in spans}
            compiler.compile_traced = (lambda *a, _s=stamps, **k: compile_traced(*a, cta_lifetimes=_s, **k))
            with ablated(ablation):
                c, cfg = ak.compile_fa4_prefill(causal=False, families=fams, spans=bool(spans), check=not sfx,
                                                cursor=cursor, keep_ptx=sass_json is not None)
            if sass_json is not None:
                if not sfx:
                    counted["plain"] = ("FA4's kernel, untraced", footprint(sass_of(c.plain.__ptx__)))
                counted[sfx] = (what, footprint(sass_of(c.ptx)))
            ents.update(entries(BASE + sfx, c, dict(
                cfg, kernel="FA4 prefill", cursor=cursor, ring=c.meta.get("ring"), l2=c.meta["l2"],
                families=sorted(c.meta["families"]), spans=sorted(spans),
                begins_first=sorted(families.STORE_AT_BEGIN), cta_lifetimes=stamps,
                recorder={"ablation": ablation} if ablation else {})))
            print(f"{BASE + sfx}: compiled", flush=True)
    finally:
        ak.FA4_SPANS, compiler.compile_traced, families.STORE_AT_BEGIN = all_spans, compile_traced, default_begin
    build_library(ents, out, arch="sm_90a", overwrite=force)
    print(f"built {len(ents)} entries into {out} in {time.time() - t:.0f} s")
    if sass_json is not None:
        write_sass(sass_json, counted)


SASS_NOTES = ("Counts of the whole kernel as ptxas -O3 builds it: a traced build holds its body twice (the CTAs "
              "that do not record run the untraced copy), so 'added' is what the traced copy and the recorder's "
              "start and finish add. Timer reads include the warps' %globaltimer anchors. The same parts' costs "
              "on the H200: fa4_cost_parts_h200.json.")


def write_sass(path: str, counted: dict) -> None:
    """The SASS counts of every part, and what each adds to the plain kernel, as a result file."""
    from fa4trace.bench import results, sass

    named = [({"part": what, "build": BASE + sfx if sfx != "plain" else "plain"}, fp)
             for sfx, (what, fp) in counted.items()]
    results.write(path, sass.envelope("fa4-cost-parts-sass", "What each part of FA4's cost adds in SASS (sm_90a)",
                                      named, counted["plain"][1], [["part", "part"], ["build", "build"]], SASS_NOTES))
    print(f"wrote {path}")


def run(build_dir: str, json_path: str | None, rounds: int, replays: int) -> list:
    """Time every part against the plain build (auto_kernels.run_fa4, rounds interleaved)."""
    import tempfile

    import auto_kernels as ak
    from fa4trace.bench import results
    from fa4trace.run.aot import BuildDir

    funcs = BuildDir(build_dir).functions
    ak.FA4_VARIANTS = [(sfx, None, True, "") for sfx in (*PARTS, *VARIANTS) if sfx and BASE + sfx in funcs]
    with tempfile.TemporaryDirectory() as tmp:
        raw = ak.run_fa4(build_dir, tmp, rounds, replays)
    rows = []
    for r in raw:
        if "lead warps" in r.get("families", "") or r["build"] not in funcs:
            continue
        sfx = r["build"][len(BASE):]
        cfg = funcs[r["build"]]["config"]
        rows.append({"part": part(sfx)[5], "build": r["build"], "cursor": r.get("cursor"),
                     "begins_first": ", ".join(cfg.get("begins_first") or []) or "none",
                     "plain_us": r["plain_us"], "traced_us": r.get("traced_us"), "cost_pct": r.get("cost_pct"),
                     "refused": r.get("refused")})
        print(json.dumps(rows[-1]), flush=True)
    if json_path:
        results.write(json_path, results.envelope(
            "fa4-cost-parts", "Where the cost goes: FA4 SM90 prefill b2 s8192 h16 d128, one build per part", rows,
            columns=[["part", "part"], ["cursor", "records"], ["begins_first", "span begins stored before the call"],
                     ["plain_us", "plain µs"], ["traced_us", "traced µs"], ["cost_pct", "cost %"]],
            notes=NOTES))
    return rows


def main(argv=None) -> None:
    ap, b, r = build_run_parser(__doc__, "build/fa4_parts", build_help="compile every part (CPU, the CuTe DSL)",
                                 run_help="time every part on this GPU")
    b.add_argument("--only", help="comma-separated part suffixes to build (default: every part)")
    b.add_argument("--sass", metavar="JSON", help="also write each part's SASS counts to this result file "
                                                  "(needs ptxas and nvdisasm)")
    r.add_argument("--rounds", type=int, default=7)
    r.add_argument("--replays", type=int, default=10)
    a = ap.parse_args(argv)
    if a.cmd == "build":
        build(a.out, a.force, a.only.split(",") if a.only else None, a.sass)
    else:
        run(a.build, a.json, a.rounds, a.replays)


if __name__ == "__main__":
    main()
