"""Where the decode-attention tracing cost goes: one traced kernel, recorder buffers that choose
who stores records.

    python benchmarks/trace_cost.py [--shapes d:hq:hkv:sk:b,...] [--schedule pingpong,base] [--json out.json]

The kernel reads the selection from the buffer header, so every traced variant executes the
same instructions; what differs is the records stored:

- ``plain``      the uninstrumented kernel (the reference);
- ``all``        every warp of every CTA records (``fa4trace bench``'s ``+trace``);
- ``consumers``  only warps 0-3 (the consumer warpgroup), not the producer warp;
- ``lead``       only ``LEAD_WARPS`` (warp 0 and the producer; ``fa4trace record --warps lead``);
- ``warp0``      only warp 0 of every CTA;
- ``cap32``      every warp keeps its first 32 records and drops the rest: headers and one
                 flush per warp, no main-loop record traffic;
- ``first``      only CTA 0 records (``+trace1``: the recorder's instruction cost alone).

Timed like ``fa4trace bench`` (``fa4trace.run.timing``: CUDA-graph replay, cold L2), all
buffers on the same inputs in one process; ``--rounds`` passes over the list, rotated by one
place per pass (where a variant sits in a pass moves it by a few percent at the power cap),
reported by ``reported_us``. ``--json`` writes the "trace-cost" area (docs/tracing-cost.md).
``--once VARIANTS`` launches each once at the first shape, untimed (for ``ncu``).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

VARIANTS = ("plain", "all", "consumers", "lead", "warp0", "cap32", "first")


def buffer_for(variant: str, plan, device, events: str):
    """The recorder buffer of ``variant`` for one launch of ``plan`` (None for plain)."""
    import numpy as np
    import torch

    from fa4trace.attention import LEAD_WARPS, WARPS_PER_CTA, trace_capacity
    from fa4trace.format.layout import BufferSpec

    if variant == "plain":
        return None
    cap, n = trace_capacity(plan), plan.n_ctas
    spec = {"all": lambda: BufferSpec.for_grid(n, WARPS_PER_CTA, cap),
            "consumers": lambda: BufferSpec.for_grid(n, WARPS_PER_CTA - 1, cap),  # the producer is the last warp
            "lead": lambda: BufferSpec.for_grid(n, WARPS_PER_CTA, cap, warps=LEAD_WARPS),
            "warp0": lambda: BufferSpec.for_grid(n, 1, cap),
            "cap32": lambda: BufferSpec.for_grid(n, WARPS_PER_CTA, 32),
            "first": lambda: BufferSpec.for_grid(n, WARPS_PER_CTA, cap, max_ctas=1)}[variant]()
    return torch.from_numpy(spec.new_buffer().view(np.int64)).to(device)


def _plan(shape, schedule: str, events: str, device):
    from fa4trace.attention import launch_plan, variant_for

    return launch_plan(shape, variant_for(shape, schedule, events=events), device)[1]


def run_shape(shape, schedule: str, variants, *, replays: int, rounds: int, events: str) -> dict:
    import torch

    from fa4trace.attention import decode_attention
    from fa4trace.run.timing import cold_l2_inputs
    from fa4trace.run.timing import graph_time, reported_us

    sets, per_graph = cold_l2_inputs(shape)
    plan = _plan(shape, schedule, events, sets[0][0].device)
    bufs = {v: buffer_for(v, plan, "cuda", events) for v in variants}
    row = {"shape": f"d{shape.d} {shape.hq}:{shape.hkv} sk {shape.sk} b {shape.b}", "schedule": schedule,
           "events": events, "ctas": plan.n_ctas}
    names = list(variants)
    for rnd in range(rounds):
        for v in names[rnd % len(names):] + names[:rnd % len(names)]:
            def launch(i, buf=bufs[v]):
                q, k, v_, o = sets[i]
                return decode_attention(q, k, v_, schedule=schedule, out=o, trace=buf, trace_events=events)

            row.setdefault(v + "_rounds", []).append(round(graph_time(launch, len(sets), replays, per_graph)[0], 2))
    for v in names:
        row[v + "_us"] = round(reported_us(row[v + "_rounds"]), 2)
        if v != "plain":
            row[v + "_pct"] = round(100 * (row[v + "_us"] / row["plain_us"] - 1), 1)
    sets.clear()
    torch.cuda.empty_cache()
    return row


def launch_once(shape, schedule: str, variants, events: str) -> None:
    import torch

    from fa4trace.attention import decode_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(shape.b, 1, shape.hq, shape.d, dtype=torch.bfloat16, device="cuda", generator=g)
    k = torch.randn(shape.b, shape.sk, shape.hkv, shape.d, dtype=torch.bfloat16, device="cuda", generator=g)
    v = torch.randn(shape.b, shape.sk, shape.hkv, shape.d, dtype=torch.bfloat16, device="cuda", generator=g)
    plan = _plan(shape, schedule, events, q.device)
    for variant in variants:
        print(f"launch {variant} d{shape.d} {shape.hq}:{shape.hkv} sk {shape.sk} b {shape.b} {schedule}", flush=True)
        decode_attention(q, k, v, schedule=schedule, trace=buffer_for(variant, plan, "cuda", events),
                         trace_events=events)
        torch.cuda.synchronize()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="128:16:1:131072:1,128:16:1:131072:8,128:16:2:131072:8,"
                                        "64:16:1:131072:1,64:16:1:131072:8", help="d:hq:hkv:sk:b,... (sq 1, bf16)")
    ap.add_argument("--schedule", default="pingpong,base", help="comma list of schedules")
    ap.add_argument("--variants", default=",".join(VARIANTS[1:]),
                    help=f"comma list of {','.join(VARIANTS[1:])} (plain is always timed)")
    ap.add_argument("--events", default="core", choices=("core", "stalls"), help="the traced kernel's event set")
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3, help="passes over the variants, reported as fa4trace bench does")
    ap.add_argument("--once", help="comma list of variants: one untimed launch each at the first shape (for ncu)")
    ap.add_argument("--json", help="write the 'trace-cost' result file here")
    args = ap.parse_args(argv)
    picked = [v for v in (args.once or args.variants).split(",") if v]
    bad = [v for v in picked if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {','.join(bad)}; known: {','.join(VARIANTS)}")

    from fa4trace.attention import Shape
    from fa4trace.bench.results import envelope, write

    shapes = []
    for spec in args.shapes.split(","):
        d, hq, hkv, sk, b = (int(x) for x in spec.split(":"))
        shapes.append(Shape(b, 1, hq, hkv, sk, d, "bf16"))
    schedules = [s for s in args.schedule.split(",") if s]
    if args.once:
        launch_once(shapes[0], schedules[0], picked, args.events)
        return 0
    variants = ["plain"] + [v for v in picked if v != "plain"]
    rows = []
    print("| shape | schedule | " + " | ".join(f"{v} µs" for v in variants) + " | "
          + " | ".join(f"{v} %" for v in variants[1:]) + " |", flush=True)
    print("|---|---|" + "---|" * (2 * len(variants) - 1), flush=True)
    for shape in shapes:
        for sched in schedules:
            r = run_shape(shape, sched, variants, replays=args.replays, rounds=args.rounds, events=args.events)
            rows.append(r)
            print(f"| {r['shape']} | {sched} | " + " | ".join(f"{r[v + '_us']:.1f}" for v in variants) + " | "
                  + " | ".join(f"{r[v + '_pct']:+.1f}%" for v in variants[1:]) + " |", flush=True)
    if args.json:
        cols = [("shape", "shape"), ("schedule", "schedule"), ("plain_us", "untraced µs")] + \
            [(v + "_pct", f"{v} %") for v in variants[1:]]
        doc = envelope("trace-cost", f"Tracing cost by who stores records ({args.events} events)", rows, columns=cols,
                       notes="Overhead of the traced kernel against the untraced one, per recorder buffer (same "
                             "instructions, different records stored). CUDA-graph replay, cold L2, "
                             f"{args.rounds} rotated passes.")
        print(f"wrote {write(args.json, doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
