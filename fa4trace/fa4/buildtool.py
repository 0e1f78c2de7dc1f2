"""Build FA4 kernels ahead of time for a GPU machine without the CuTe DSL (an H100/H200 with tvm-ffi only).

    python -m fa4trace.fa4.buildtool -o build/fa4_sm90            # SM90: traced + plain decode kernels

The traced kernels: FA4's events at the traced shapes, and variant "generic" (FA4's events plus
every generic family) at the first one.

Runs on any machine with nvidia-cutlass-dsl and flash-attn-4 (no GPU needed); the folder it
writes is loaded by ``fa4trace record --impl fa4 --build DIR`` and the bench hook with tvm-ffi only.
"""

from __future__ import annotations

import argparse

from ..auto.events import FAMILIES

# (d, hq, hkv): the decode shapes of `fa4trace bench` ...
BENCH_SHAPES = [(128, 16, 1), (128, 16, 2), (64, 16, 1), (64, 16, 2)]
# ... and the shapes traced by default
TRACED_SHAPES = [(128, 16, 1)]
# Overhead breakdown builds of the first traced shape: (variant, events, cursor). events None = all.
# (Their results are in benchmarks/results/fa4_sm90_h200.json, where "default" names the
# global-memory cursor and "smem" the shared-memory one, now SM90's default.)
OVERHEAD_VARIANTS = {
    "sm90": [("gmem", None, "gmem"), ("life", [], "smem"), ("producer", ["producer"], "smem"),
             ("consumer", ["consumer"], "smem"), ("consumer_gmem", ["consumer"], "gmem")],
    "sm100": [("smem", None, "smem"), ("life", [], "gmem")],
}


# FA4's events and every generic family (fa4trace.auto), for the first traced shape
GENERIC_VARIANT = ("generic", FAMILIES)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m fa4trace.fa4.buildtool", description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--arch", default="sm90", choices=["sm90", "sm100"])
    ap.add_argument("--schedule", default="pingpong", choices=["base", "pingpong"], help="SM100 only")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--sq", type=int, default=1)
    ap.add_argument("--overhead-variants", action="store_true",
                    help="also build traced variants that isolate the recorder's cost (per role, cursor placement)")
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)
    from .run import build_aot

    shapes = [dict(d=d, hq=hq, hkv=hkv, sq=a.sq, dtype=a.dtype, schedule=a.schedule, traced=False)
              for d, hq, hkv in BENCH_SHAPES]
    shapes += [dict(d=d, hq=hq, hkv=hkv, sq=a.sq, dtype=a.dtype, schedule=a.schedule, traced=True)
               for d, hq, hkv in TRACED_SHAPES]
    d, hq, hkv = TRACED_SHAPES[0]
    shapes.append(dict(d=d, hq=hq, hkv=hkv, sq=a.sq, dtype=a.dtype, schedule=a.schedule, traced=True,
                       variant=GENERIC_VARIANT[0], families=GENERIC_VARIANT[1]))
    if a.overhead_variants:
        shapes += [dict(d=d, hq=hq, hkv=hkv, sq=a.sq, dtype=a.dtype, schedule=a.schedule, traced=True,
                        variant=name, events=events, cursor=cursor)
                   for name, events, cursor in OVERHEAD_VARIANTS[a.arch]]
    out = build_aot(a.output, shapes, arch=a.arch, overwrite=a.force)
    print(f"built {len(shapes)} FA4 {a.arch} kernels into {out}")


if __name__ == "__main__":
    main()
