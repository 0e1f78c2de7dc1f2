"""Build the decode-attention variants for an H200 run (CPU machine, nvidia-cutlass-dsl 4.8.1).

    CUTE_DSL_ARCH=sm_90a python benchmarks/attn_build.py -o build/attn [--tiles 64,128] \
        [--extra 64:pingpong:64:2:32,128:base:32:2:64] [--jobs 2]

Writes one .so + manifest.json (fa4trace.aot.build_library). Besides the default variants of
``fa4trace build`` (every head dim, schedule, dtype, traced or not) it adds the other KV tile
sizes (``--tiles``) and the ``--extra`` variants (d:schedule:tile_n:ctas_per_sm:block_rows) in bf16,
untraced and traced, so that one device run can compare them (bench names ``pingpong@n64o2``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _specs(tiles, extra=()):
    """(d, schedule, dtype, traced, tile_n, ctas_per_sm, block_rows) of every variant to build."""
    from fa4trace.attention import DEFAULT_CTAS_PER_SM, DEFAULT_TILE_N, HEAD_DIMS, SCHEDULES

    specs = []
    for d in HEAD_DIMS:
        for sched in SCHEDULES:
            occ = DEFAULT_CTAS_PER_SM[(d, sched)]
            for dtype in ("bf16", "fp16"):
                for traced in (False, True):
                    for rows in (64, 32):
                        specs.append((d, sched, dtype, traced, DEFAULT_TILE_N[(d, sched)], occ, rows))
            for tn in tiles:
                if tn != DEFAULT_TILE_N[(d, sched)]:
                    for traced in (False, True):
                        specs.append((d, sched, "bf16", traced, tn, occ, 32))
    for d, sched, tn, occ, rows in extra:
        for traced in (False, True):
            spec = (d, sched, "bf16", traced, tn, occ, rows)
            if spec not in specs:
                specs.append(spec)
    return specs


def _name(spec):
    from fa4trace.kernels.attention_sm90 import variant_name

    d, sched, dtype, traced, tn, occ, rows = spec
    return variant_name(d, sched, dtype, traced, rows, tile_n=tn, ctas_per_sm=occ)


def _compile_export(spec, obj_dir, options):
    """Compile one variant in a worker and export its object file (compiled objects do not pickle)."""
    from fa4trace.kernels.attention_sm90 import compile_variant

    d, sched, dtype, traced, tn, occ, rows = spec
    t = time.time()
    fn, kern = compile_variant(d, sched, dtype, traced, tile_n=tn, ctas_per_sm=occ, block_rows=rows, **options)
    name = _name(spec)
    fn.export_to_c(os.path.join(obj_dir, name + ".o"), function_name=name)
    cfg = {**kern.config(), "dtype": dtype, "traced": traced}
    return name, cfg, time.time() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--out", default="build/attn")
    ap.add_argument("--tiles", default="64,128")
    ap.add_argument("--extra", default="", help="d:schedule:tile_n:ctas_per_sm:block_rows,...")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="", help="build only the variants whose name contains one of "
                                              "these comma-separated strings (all of them by default)")
    ap.add_argument("--trace-events", default=None,
                    help="experiment builds: the events traced variants record (core, stalls, comma names, "
                         "or 'none'); "
                         "default the full set. The functions keep their names: build into another folder")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=INT",
                    help="experiment builds: a DecodeAttentionSm90 argument for every variant built "
                         "(e.g. qk_chains=2); the functions keep their names: build into another folder")
    args = ap.parse_args()
    import shutil
    import subprocess

    from fa4trace import aot

    extra = []
    for item in (x for x in args.extra.split(",") if x):
        d, sched, tn, occ, rows = item.split(":")
        extra.append((int(d), sched, int(tn), int(occ), int(rows)))
    specs = _specs([int(x) for x in args.tiles.split(",") if x], extra)
    if args.only:
        keys = args.only.split(",")
        specs = [sp for sp in specs if any(key in _name(sp) for key in keys)]
    out = os.path.abspath(args.out)
    if os.path.exists(out):
        shutil.rmtree(out)
    obj_dir = os.path.join(out, "obj")
    os.makedirs(obj_dir)
    options = {}
    for item in args.option:
        key, _, value = item.partition("=")
        options[key] = int(value)
    if args.trace_events is not None:
        from fa4trace.attention import trace_event_ids

        options["trace_events"] = trace_event_ids(args.trace_events)
    with ProcessPoolExecutor(args.jobs) as ex:
        results = list(ex.map(_compile_export, specs, [obj_dir] * len(specs), [options] * len(specs)))
    funcs = {}
    for name, cfg, dt in results:
        print(f"{name:48s} {dt:5.1f} s  tile_n={cfg['tile_n']} stages={cfg['num_stages']} "
              f"ctas/SM={cfg['ctas_per_sm']} rows={cfg['block_rows']}")
        funcs[name] = {"kind": "attention", "config": {**cfg, "arch": "sm_90a"}}
    so = os.path.join(out, aot.LIBRARY)
    objs = sorted(os.path.join(obj_dir, f) for f in os.listdir(obj_dir))
    flags = aot._link_flags()
    subprocess.run([os.environ.get("CXX", "g++"), "-shared", "-o", so, *objs, *flags], check=True)
    shutil.rmtree(obj_dir)
    aot.write_manifest(out, "sm_90a", funcs, runtime=aot.runtime_of(flags))
    print(f"{len(funcs)} functions -> {so} ({os.path.getsize(so) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
