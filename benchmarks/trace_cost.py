"""Where the decode-attention tracing overhead goes (run on the GPU machine).

    python benchmarks/trace_cost.py [--shapes d:hq:hkv:sk:b,...] [--schedule pingpong] [--json out.json]

One traced kernel, several recorder buffers that select who stores records (the kernel reads
the selection from the buffer header, so the instructions executed are the same in all of them):

- ``plain``      the uninstrumented kernel (the reference);
- ``all``        every warp of every CTA records (what ``fa4trace bench`` calls ``+trace``);
- ``consumers``  only warps 0-3 (the consumer warpgroup) record, the producer warp does not;
- ``cap32``      every warp records its first 32 records, then drops the rest (bounds check):
                 headers and one flush per warp, no mainloop record traffic;
- ``first``      only CTA 0 records (``+trace1``: the recorder's instruction cost);
- ``warp0``      only warp 0 of every CTA records (a quarter of the consumer records, none of
                 the producer's: how the cost scales with the records stored);
- ``lead``       only ``LEAD_WARPS`` (warp 0 and the producer) record (``fa4trace record --warps lead``);
- ``all2x``, ``all+32``  as ``all`` with twice / 32 more records of room per warp (the same
                 stores at other addresses: does the slot stride matter?);
- ``allz``       as ``all``, its record words filled with a non-zero pattern (is writing over
                 zeroed memory what costs?);
- ``host``, ``hostlead``  as ``all`` / ``lead`` with the buffer in mapped pinned host memory
                 (CuPy's ``hostAlloc``): the records cross the host link instead of going to
                 HBM among the KV reads (experiment);
- ``--repeat-all n``: the ``all`` buffer timed n more times (``all.1`` ...), then n fresh
  buffers like it, all kept alive so each lands elsewhere (``new1`` ...): how much of a
  variant's number is where its buffer happens to sit in memory;
- ``--extra-pads``, ``--offsets``, ``--slabs``: ``all`` with more room per warp
  (``all+<n>``), placed <k> KiB into a 64 MiB allocation (``all@<k>k``), or at the start of
  an <m> MiB allocation (``all#<m>m``).

Timing as in the benchmark: CUDA-graph replay, L2 cold (KV sets rotated, >= 256 MB), median of
``--replays``; all buffers on the same inputs, in one process. ``--rounds`` (default 3) times
the whole list again and reports what ``fa4trace bench`` reports (``attention.reported_us``:
the median of all rounds but the first): the first traced kernel timed after a shape's inputs
are allocated runs up to 7% slow on the H200, whatever its buffer (BENCHMARKS.md, fourth
session), so a single pass misleads. Prints a table; ``--json`` keeps every round.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ALL_VARIANTS = ("plain", "allz", "all", "consumers", "cap32", "first", "all2x", "all+32", "warp0", "lead",
                "host", "hostlead")
_HOST_BUFFERS = []  # mapped host allocations of the host* variants, alive until the process ends
VARIANTS = ALL_VARIANTS  # --variants picks a subset (plain always first)
EXTRA = []  # --extra-pads: more ``all+<n>`` variants (n more records of room per warp)
EVENTS = "core"  # --events: the traced kernel's event set (fa4trace.attention.TRACE_EVENTS)


def buffer_for(variant, plan, device):
    import numpy as np
    import torch

    from fa4trace import attention as A
    from fa4trace.layout import BufferSpec

    cap = A.trace_capacity(plan)
    warps = A.WARPS_PER_CTA

    def in_allocation(spec, offset_words, total_words):
        """spec's buffer at offset_words into one zeroed allocation of total_words."""
        slab = torch.zeros(total_words, dtype=torch.int64, device=device)
        buf = slab[offset_words:offset_words + spec.words]
        buf.copy_(torch.from_numpy(spec.new_buffer().view(np.int64)))
        return buf

    if variant.startswith("all@"):
        # the ``all`` buffer placed <k> KiB into one 64 MiB allocation: does its address matter?
        spec = BufferSpec.for_grid(plan.n_ctas, warps, cap)
        off = int(variant[4:-1]) * 1024 // 8
        return in_allocation(spec, off, off + spec.words + (8 << 20))
    if variant == "allz":
        # as ``all``, but the record words hold a non-zero pattern instead of zeros (headers stay 0)
        spec = BufferSpec.for_grid(plan.n_ctas, warps, cap)
        host = spec.new_buffer()
        from fa4trace import layout as L

        slots = host[L.GLOBAL_HEADER_WORDS:].reshape(spec.n_slots, spec.slot_words)
        slots[:, L.WARP_HEADER_WORDS:] = np.uint64(0x5A5A5A5A5A5A5A5A)
        return torch.from_numpy(host.view(np.int64)).to(device)
    if variant.startswith("all#"):
        # the ``all`` buffer at the start of one allocation of <m> MiB (at least its own size)
        spec = BufferSpec.for_grid(plan.n_ctas, warps, cap)
        return in_allocation(spec, 0, max(spec.words, int(variant[4:-1]) << 17))
    if variant in ("host", "hostlead"):
        lead = A.LEAD_WARPS if variant == "hostlead" else None
        return _host_mapped(BufferSpec.for_grid(plan.n_ctas, warps, cap, warps=lead).new_buffer())
    if variant == "all":
        spec = BufferSpec.for_grid(plan.n_ctas, warps, cap)
    elif variant == "consumers":
        spec = BufferSpec.for_grid(plan.n_ctas, warps - 1, cap)  # the producer is the last warp
    elif variant == "cap32":
        spec = BufferSpec.for_grid(plan.n_ctas, warps, 32)
    elif variant == "all2x":
        spec = BufferSpec.for_grid(plan.n_ctas, warps, 2 * cap)
    elif variant.startswith("all+"):
        spec = BufferSpec.for_grid(plan.n_ctas, warps, cap + int(variant[4:]))
    elif variant == "lead":
        spec = BufferSpec.for_grid(plan.n_ctas, warps, cap, warps=A.LEAD_WARPS)
    elif variant == "warp0":
        spec = BufferSpec.for_grid(plan.n_ctas, 1, cap)
    elif variant == "first":
        spec = BufferSpec.for_grid(plan.n_ctas, warps, cap, max_ctas=1)
    elif variant.startswith("new"):  # another fresh buffer like ``all`` (kept alive: a new place)
        spec = BufferSpec.for_grid(plan.n_ctas, warps, cap)
    else:
        raise ValueError(variant)
    return torch.from_numpy(spec.new_buffer().view(np.int64)).to(device)


def _host_mapped(words):
    """A CUDA tensor over mapped pinned host memory holding ``words`` (uint64): the kernel's
    stores to it cross the host link (with UVA the host address is the device address)."""
    import ctypes

    import cupy
    import torch

    n = words.nbytes
    ptr = cupy.cuda.runtime.hostAlloc(n, 2)  # cudaHostAllocMapped
    ctypes.memmove(ptr, words.ctypes.data, n)
    mem = cupy.cuda.UnownedMemory(ptr, n, None, 0)
    arr = cupy.ndarray((words.size,), dtype=cupy.int64, memptr=cupy.cuda.MemoryPointer(mem, 0))
    _HOST_BUFFERS.append((ptr, arr))
    return torch.from_dlpack(arr)


def run_shape(d, hq, hkv, sk, b, schedule, replays, rounds=1):
    import torch

    from fa4trace import attention as A

    shape = A.Shape(b, 1, hq, hkv, sk, d, "bf16")
    sets, per_graph = A.cold_l2_inputs(shape)
    n_sets = len(sets)
    _, plan = A._resolve(shape, schedule, True, None, sets[0][0].device, trace_events=EVENTS)
    row = {"shape": f"d{d} {hq}:{hkv} sk{sk} b{b}", "schedule": schedule, "ctas": plan.n_ctas}
    keep = {}
    names = list(VARIANTS + tuple(EXTRA))
    for rnd in range(rounds):  # every round times every variant again, same buffers
        # Rotated by one place per round: on the H200 (at its power cap) where a variant sits in
        # a pass moved it by up to 5-9% at d64 b 8 (eighth session), a fixed order biased the
        # later columns.
        for variant in names[rnd % len(names):] + names[:rnd % len(names)]:
            if variant in keep:
                buf = keep[variant]
            elif variant.startswith("all."):  # the all buffer again (made here if rotation put it first)
                if "all" not in keep:
                    keep["all"] = buffer_for("all", plan, "cuda")
                buf = keep["all"]
            else:
                buf = None if variant == "plain" else buffer_for(variant, plan, "cuda")
            keep[variant] = buf

            def launch(i, buf=buf):
                q, k, v, o = sets[i]
                return A.decode_attention(q, k, v, schedule=schedule, out=o, trace=buf, trace_events=EVENTS)

            us, spread = A._graph_time(launch, n_sets, replays, per_graph)
            row.setdefault(variant + "_rounds", []).append(round(us, 2))
    for variant in VARIANTS + tuple(EXTRA):
        times = row[variant + "_rounds"]
        row[variant] = A.reported_us(times)  # the benchmark's rule: warm-up pass left out
    sets.clear()
    torch.cuda.empty_cache()
    return row


def launch_once(spec, schedule, variants):
    import torch

    from fa4trace import attention as A

    d, hq, hkv, sk, b = (int(x) for x in spec.split(":"))
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, 1, hq, d, dtype=torch.bfloat16, device="cuda", generator=g)
    k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda", generator=g)
    v = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16, device="cuda", generator=g)
    _, plan = A._resolve(A.validate(q, k, v), schedule, True, None, q.device, trace_events=EVENTS)
    for variant in variants:
        buf = None if variant == "plain" else buffer_for(variant, plan, "cuda")
        print(f"launch {variant} {spec} {schedule}", flush=True)
        A.decode_attention(q, k, v, schedule=schedule, trace=buf, trace_events=EVENTS)
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="128:16:1:131072:1,128:16:1:131072:8,128:16:2:131072:8,"
                                        "64:16:1:131072:1,64:16:1:131072:8")
    ap.add_argument("--schedule", default="pingpong")
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--json")
    ap.add_argument("--extra-pads", default="", help="comma list of n: also time all+<n> buffers")
    ap.add_argument("--offsets", default="", help="comma list of k: also time the all buffer k KiB into "
                                                  "a 64 MiB allocation (all@<k>k)")
    ap.add_argument("--slabs", default="", help="comma list of m: also time the all buffer at the start of "
                                                "an m MiB allocation (all#<m>m)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="time the whole list of variants this many times; report as fa4trace bench does "
                         "(the last of 2, the median of all but the first of 3 or more), every round in the JSON")
    ap.add_argument("--events", default="core",
                    help="the traced kernel's event set: core, stalls (core plus WAIT_K / WAIT_V), or the "
                         "comma event list of an experiment build (attn_build.py --trace-events; none: no event)")
    ap.add_argument("--repeat-all", type=int, default=0, help="time the all buffer n more times, then n fresh ones")
    ap.add_argument("--variants", default="", help="comma list: time only these of " + ",".join(ALL_VARIANTS))
    ap.add_argument("--once", help="comma list of variants: one launch each at the first shape "
                                   "(for ncu), no timing")
    args = ap.parse_args()
    global VARIANTS, EVENTS
    EVENTS = args.events
    if args.variants:
        picked = [v for v in args.variants.split(",") if v]
        bad = [v for v in picked if v not in ALL_VARIANTS]
        if bad:
            raise SystemExit(f"trace_cost: unknown variant(s) {bad}; known: {','.join(ALL_VARIANTS)}")
        VARIANTS = ("plain",) + tuple(v for v in picked if v != "plain")
    if args.once:
        return launch_once(args.shapes.split(",")[0], args.schedule, args.once.split(","))
    EXTRA.extend(f"all+{n}" for n in args.extra_pads.split(",") if n)
    EXTRA.extend(f"all@{k}k" for k in args.offsets.split(",") if k)
    EXTRA.extend(f"all#{m}m" for m in args.slabs.split(",") if m)
    EXTRA.extend([f"all.{i}" for i in range(1, args.repeat_all + 1)] + [f"new{i}" for i in range(1, args.repeat_all + 1)])
    names = VARIANTS + tuple(EXTRA)
    rows = []
    head = "| shape | " + " | ".join(names) + " | " + " | ".join(f"{v} ovh" for v in names[1:]) + " |"
    print(head, flush=True)
    for spec in args.shapes.split(","):
        d, hq, hkv, sk, b = (int(x) for x in spec.split(":"))
        for sched in args.schedule.split(","):
            r = run_shape(d, hq, hkv, sk, b, sched, args.replays, args.rounds)
            rows.append(r)
            ovh = [f"{100 * (r[v] / r['plain'] - 1):+.1f}%" for v in names[1:]]
            print(f"| {r['shape']} {sched} | " + " | ".join(f"{r[v]:.1f}" for v in names) + " | "
                  + " | ".join(ovh) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
