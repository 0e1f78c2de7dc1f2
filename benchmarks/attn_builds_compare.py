"""Compare decode-attention builds on the GPU machine, in one process (run there).

    python benchmarks/attn_builds_compare.py --builds build/kernels,build/c21 \
        [--shapes d:hq:hkv:sk:b,...] [--schedule pingpong] [--rounds 3] [--traced] [--warm] [--blocked]
        [--json out.json]

For experiment builds made with ``benchmarks/attn_build.py --option ...`` (same function names,
another folder). Per build and shape: correctness first (output against the float32 reference,
on the shapes given and on ``--check-shapes`` with odd sizes; traced output bit-equal to the
untraced one with ``--traced``), then the time as the benchmark takes it (CUDA-graph replay, L2
cold, median of ``--replays``; ``--warm``: the same inputs every launch), every round timing every
build again in the same order (``--blocked``: all rounds of a build, then the next); the
table reports what `fa4trace bench` would (`attention.reported_us`: the median of all rounds
but the first) and each build's change against the first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

DEFAULT_SHAPES = ("64:16:1:131072:1,64:16:1:131072:8,64:16:1:131072:32,64:16:2:131072:8,"
                  "64:16:2:131072:32,64:16:2:32768:8")
# Odd sizes: a masked last block, sq > 1, one key, few splits.
DEFAULT_CHECKS = "64:16:1:77:2:1,64:16:2:65537:3:2,64:16:1:1000:1:2,64:8:1:1:1:4,64:4:1:4097:2:8"


def _shapes(text, with_sq=False):
    out = []
    for item in (x for x in text.split(",") if x):
        parts = [int(p) for p in item.split(":")]
        if with_sq:
            d, hq, hkv, sk, b, sq = parts
        else:
            (d, hq, hkv, sk, b), sq = parts, 1
        out.append((d, hq, hkv, sk, b, sq))
    return out


def check(builds, shapes, schedule, traced):
    """Relative error against float32 per build and shape; traced == untraced bit for bit."""
    import torch

    from fa4trace import attention as A

    rows = []
    for d, hq, hkv, sk, b, sq in shapes:
        g = torch.Generator(device="cuda").manual_seed(sk + 7 * b)
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        ref = A.reference(q, k, v)[0]
        row = {"shape": f"d{d} {hq}:{hkv} sk{sk} b{b} sq{sq}"}
        first = None
        for bd in builds:
            o = torch.full_like(q, float("nan"))
            A.decode_attention(q, k, v, schedule=schedule, out=o, build=bd)
            err = A.rel_error(o, ref)
            ok = err <= 1e-2 and not torch.isnan(o).any()
            # same bits as the first build? (reported, not required: a change may round differently)
            first = o if first is None else first
            row[bd + " ==first"] = bool(torch.equal(o, first))
            if traced:
                ot = torch.full_like(q, float("nan"))
                buf = A.trace_buffer(q, k, v, schedule=schedule, build=bd)[0]
                A.decode_attention(q, k, v, schedule=schedule, out=ot, trace=buf, build=bd)
                row[bd + " traced==untraced"] = bool(torch.equal(o, ot))
                ok = ok and row[bd + " traced==untraced"]
            row[bd] = err
            row[bd + " ok"] = bool(ok)
        rows.append(row)
    return rows


def time_shapes(builds, shapes, schedule, rounds, replays, traced, blocked=False, warm=False):
    import torch

    from fa4trace import attention as A

    rows = []
    for d, hq, hkv, sk, b, sq in shapes:
        shape = A.Shape(b, sq, hq, hkv, sk, d, "bf16")
        sets, per_graph = A.cold_l2_inputs(shape)
        if warm:  # every launch on the same inputs: what fits of the KV stays in L2
            del sets[1:]
        bufs = {}
        if traced:
            for bd in builds:
                q, k, v, _ = sets[0]
                bufs[bd] = A.trace_buffer(q, k, v, schedule=schedule, build=bd)[0]
        row = {"shape": f"d{d} {hq}:{hkv} sk{sk} b{b}", "bytes": shape.io_bytes()}
        # interleaved: every round times every build; blocked: all rounds of a build, then the next
        order = ([bd for bd in builds for _ in range(rounds)] if blocked
                 else [bd for _ in range(rounds) for bd in builds])
        for bd in order:
            for tr in ([None, bufs[bd]] if traced else [None]):
                def launch(i, bd=bd, tr=tr):
                    q, k, v, o = sets[i]
                    return A.decode_attention(q, k, v, schedule=schedule, out=o, trace=tr, build=bd)

                us, _ = A._graph_time(launch, len(sets), replays, per_graph)
                row.setdefault(bd + ("+trace" if tr is not None else ""), []).append(round(us, 2))
        for key in list(row):
            if isinstance(row[key], list):
                row[key + " rounds"] = row[key]
                row[key] = A.reported_us(row[key])  # as fa4trace bench: warm-up pass left out
        rows.append(row)
        sets.clear()
        torch.cuda.empty_cache()
    return rows


def table(rows, builds, traced):
    base = builds[0]
    cols = []
    for bd in builds:
        cols.append(bd)
        if traced:
            cols.append(bd + "+trace")
    out = ["| shape | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for r in rows:
        cells = []
        for c in cols:
            us = r[c]
            tb = r["bytes"] / us / 1e6
            if c == base:
                cells.append(f"{us:.1f} ({tb:.2f})")
            elif c.endswith("+trace"):
                cells.append(f"{us:.1f} ({100 * (us / r[c[:-6]] - 1):+.1f}% vs untraced)")
            else:
                cells.append(f"{us:.1f} ({tb:.2f}, {100 * (us / r[base] - 1):+.1f}%)")
        out.append(f"| {r['shape']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--builds", required=True, help="comma build folders; the first is the reference")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="d:hq:hkv:sk:b,... (q_len 1)")
    ap.add_argument("--check-shapes", default=DEFAULT_CHECKS, help="d:hq:hkv:sk:b:sq,... checked, not timed")
    ap.add_argument("--schedule", default="pingpong")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--traced", action="store_true", help="also the traced kernels (all warps record)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--warm", action="store_true",
                    help="every launch reads the same KV (warm L2 where it fits) instead of rotating sets")
    ap.add_argument("--blocked", action="store_true",
                    help="time all rounds of one build before the next (default: interleaved rounds): shows "
                         "whether a build leaves the GPU slower for the next one")
    args = ap.parse_args(argv)
    builds = [b for b in args.builds.split(",") if b]
    timed = _shapes(args.shapes)
    # the timed shapes are checked too, up to 1M keys in all (the float32 reference's cost)
    checked = _shapes(args.check_shapes, with_sq=True) + [s for s in timed if s[3] * s[4] <= 1 << 20]
    checks = check(builds, checked, args.schedule, args.traced)
    bad = [(r["shape"], bd) for r in checks for bd in builds if not r[bd + " ok"]]
    for r in checks:
        print(r["shape"], " ".join(f"{bd}={r[bd]:.1e}{'' if r[bd + ' ok'] else ' FAIL'}"
                                   f"{'' if r[bd + ' ==first'] else ' (bits differ from the first build)'}"
                                   for bd in builds))
    rows = time_shapes(builds, timed, args.schedule, args.rounds, args.replays, args.traced, args.blocked, args.warm)
    print(table(rows, builds, args.traced))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"checks": checks, "rows": rows, "builds": builds}, f, indent=1)
    if bad:
        print("FAILED checks:", bad)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
