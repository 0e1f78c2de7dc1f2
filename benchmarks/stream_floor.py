"""What a decode shape can reach at all: the launch floor and a plain read of its KV.

    python benchmarks/stream_floor.py [--shapes d:hq:hkv:sk:b,...] [--json out.json]

Timed like ``fa4trace bench`` (``fa4trace.run.timing``: CUDA-graph replay cycling through
input sets that rotate L2, median of replays, passes reported by ``reported_us``), in one
process on the same inputs:

- ``noop``       an empty kernel, one block: what one launch inside a graph costs;
- ``read``       a plain streaming read of the shape's K and V (16-byte loads, grid-stride, one
                 word written per block), the best of several grid sizes: the fastest any kernel
                 can consume this KV in one launch, with no compute, no Q, no combine;
- ``bulk``       the same bytes through shared memory with 1-D TMA bulk copies
                 (``cp.async.bulk``, one CTA per SM, one issuing thread, ~192 KB in flight), the
                 best of ``BULK_CONFIGS``: the floor for a kernel fed by TMA, as ours is;
- ``pingpong``   ours and ``cudnn``, through ``fa4trace.bench.decode.bench_shape``.

The read kernels are compiled by CuPy (NVRTC) on the GPU machine; they need nothing from the
CuTe DSL. Prints a table; ``--json`` writes the "floors" area of BENCHMARKS.md (every number in
the rows).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

_SRC = r"""
extern "C" __global__ void noop() {}

// Read n16 16-byte words of a and of b; fold them so the loads cannot be dropped.
extern "C" __global__ void read2(const uint4* __restrict__ a, const uint4* __restrict__ b,
                                 long long n16, unsigned* __restrict__ out) {
    unsigned acc = 0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += stride) {
        uint4 x = __ldg(a + i);
        uint4 y = __ldg(b + i);
        acc ^= x.x ^ x.y ^ x.z ^ x.w ^ y.x ^ y.y ^ y.z ^ y.w;
    }
    if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;  // practically never: keeps the loads live
}
"""

_BULK_SRC = r"""
// Stream [a | b] through shared memory with 1-D TMA bulk copies (cp.async.bulk), one issuing
// thread per CTA, `stages` buffers of `stage_bytes` in flight: the floor for a kernel that
// feeds its KV through TMA into shared memory (as the decode kernel does), with no compute.
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

extern "C" __global__ void read_bulk(const char* __restrict__ a, const char* __restrict__ b,
                                     long long n_each, int stage_bytes, int stages) {
    extern __shared__ __align__(128) unsigned char buf[];
    __shared__ __align__(8) unsigned long long bars[16];
    const long long pieces = 2 * n_each / stage_bytes;  // the host makes stage_bytes divide n_each
    const long long per = (pieces + gridDim.x - 1) / gridDim.x;
    const long long p0 = blockIdx.x * per;
    const long long p1 = p0 + per < pieces ? p0 + per : pieces;
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; ++s)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(&bars[s])));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x != 0 || p0 >= p1) return;
    auto issue = [&](long long p, int s) {
        const long long off = p * stage_bytes;
        const char* src = off < n_each ? a + off : b + (off - n_each);
        const unsigned bar = smem_u32(&bars[s]);
        const unsigned dst = smem_u32(buf + static_cast<long long>(s) * stage_bytes);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(stage_bytes) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     :: "r"(dst), "l"(src), "r"(stage_bytes), "r"(bar) : "memory");
    };
    for (long long p = p0; p < p1 && p - p0 < stages; ++p) issue(p, static_cast<int>(p - p0));
    unsigned parity = 0;  // bit s: the phase stage s waits for next
    int s = 0;
    for (long long p = p0; p < p1; ++p, s = (s + 1 == stages) ? 0 : s + 1) {
        const unsigned bar = smem_u32(&bars[s]);
        const unsigned ph = (parity >> s) & 1u;
        unsigned done = 0;
        while (!done) {
            asm volatile("{\n .reg .pred q;\n mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2;\n"
                         " selp.u32 %0, 1, 0, q;\n}" : "=r"(done) : "r"(bar), "r"(ph) : "memory");
        }
        parity ^= 1u << s;
        if (p + stages < p1) issue(p + stages, s);
    }
}
"""
# (stage bytes, stages) of the bulk read: ~192 KB in flight per SM, as the decode kernel keeps
# (d128 ping-pong: 6 x 32 KB), in three granularities.
BULK_CONFIGS = ((16 << 10, 12), (32 << 10, 6), (64 << 10, 3))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="128:16:1:131072:1,128:16:1:131072:8,128:16:2:131072:8,64:16:1:131072:8,"
                                        "64:16:2:131072:8,64:16:1:131072:32", help="d:hq:hkv:sk:b,... (sq 1, bf16)")
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=2, help="timing passes; reported as fa4trace bench does (the last of 2, "
                    "else the median of all but the first)")
    ap.add_argument("--json", help="write the 'floors' result file here")
    args = ap.parse_args(argv)

    import cupy as cp
    import torch

    from fa4trace.attention import Shape
    from fa4trace.bench.decode import bench_shape
    from fa4trace.bench.results import envelope, write
    from fa4trace.run.timing import cold_l2_inputs
    from fa4trace.run.timing import graph_time, reported_us

    mod = cp.RawModule(code=_SRC)
    noop, read2 = mod.get_function("noop"), mod.get_function("read2")
    try:  # its own module: if NVRTC or the driver refuses it, the other columns still come
        read_bulk = cp.RawModule(code=_BULK_SRC, options=("-std=c++17",)).get_function("read_bulk")
    except Exception as exc:  # noqa: BLE001 - reported, and the bulk column shows '-'
        read_bulk = None
        print(f"bulk read not available: {str(exc).strip().splitlines()[-1][:200]}", file=sys.stderr, flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = cp.zeros(sms * 64, dtype=cp.uint32)
    grids = [(sms * k, t) for k in (1, 2, 4, 8) for t in (256, 512, 1024) if k * t <= 2048]

    def on_torch_stream(fn):
        def run(i):
            with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                fn(i)
        return run

    rows = []
    print("| shape | KV MB | noop µs | read µs (TB/s, grid) | bulk read µs (TB/s, stages) | pingpong µs (TB/s) "
          "| cudnn µs (TB/s) |", flush=True)
    print("|---|---|---|---|---|---|---|", flush=True)
    for spec in args.shapes.split(","):
        d, hq, hkv, sk, b = (int(x) for x in spec.split(":"))
        shape = Shape(b, 1, hq, hkv, sk, d, "bf16")
        sets, per_graph = cold_l2_inputs(shape)
        n_sets = len(sets)
        n16 = sets[0][1].numel() * 2 // 16
        kv = [(cp.from_dlpack(st[1].view(torch.int32)), cp.from_dlpack(st[2].view(torch.int32))) for st in sets]

        def t(fn):
            passes = [graph_time(fn, n_sets, args.replays, per_graph)[0] for _ in range(args.rounds)]
            return reported_us(passes)  # as fa4trace bench reports its rounds

        r = {"shape": f"d{d} {hq}:{hkv} sk{sk} b{b}", "kv_bytes": shape.kv_bytes(), "io_bytes": shape.io_bytes()}
        r["noop_us"] = t(on_torch_stream(lambda i: noop((1,), (32,), ())))
        reads = {}
        for g, th in grids:
            reads[f"{g}x{th}"] = t(on_torch_stream(
                lambda i, g=g, th=th: read2((g,), (th,), (kv[i][0], kv[i][1], cp.int64(n16), out))))
        best = min(reads, key=reads.get)
        r["read_us"], r["read_grid"], r["read_all"] = reads[best], best, reads
        n_each = sets[0][1].numel() * 2  # bytes of K (and of V)
        bulks = {}
        for stage, stages in BULK_CONFIGS:
            if read_bulk is None or n_each % stage:
                continue
            smem = stage * stages
            try:
                read_bulk.max_dynamic_shared_size_bytes = smem
                bulks[f"{stage >> 10}KBx{stages}"] = t(on_torch_stream(
                    lambda i, stage=stage, stages=stages, smem=smem: read_bulk(
                        (sms,), (32,), (kv[i][0], kv[i][1], cp.int64(n_each), cp.int32(stage), cp.int32(stages)),
                        shared_mem=smem)))
            except Exception as exc:  # noqa: BLE001 - reported; the other configurations still run
                print(f"bulk read {stage >> 10} KB x {stages}: {str(exc).strip().splitlines()[-1][:200]}",
                      file=sys.stderr, flush=True)
        bbest = min(bulks, key=bulks.get) if bulks else None
        r["bulk_us"], r["bulk_cfg"], r["bulk_all"] = (bulks[bbest] if bbest else None), bbest, bulks
        kv.clear()
        sets.clear()
        torch.cuda.empty_cache()
        # ours and cuDNN through the benchmark itself (its own input sets, same harness)
        for br in bench_shape(shape, ["pingpong", "cudnn"], replays=args.replays, rounds=args.rounds):
            r[f"{br.kernel}_us"] = None if br.us != br.us else br.us
            if "error" in br.extra:  # a '-' cell: say why
                r[f"{br.kernel}_error"] = br.extra["error"]
                print(f"{r['shape']} {br.kernel}: {br.extra['error']}", file=sys.stderr, flush=True)
        def tbps(us, nbytes):
            return None if us is None else round(nbytes / us / 1e6, 2)

        r["bulk_read_us"] = r["bulk_us"]
        r["read_tbps"] = tbps(r["read_us"], r["kv_bytes"])
        r["bulk_read_tbps"] = tbps(r["bulk_us"], r["kv_bytes"])
        r["pingpong_tbps"] = tbps(r.get("pingpong_us"), r["io_bytes"])
        r["cudnn_tbps"] = tbps(r.get("cudnn_us"), r["io_bytes"])
        rows.append(r)

        def cell(us, nbytes):
            return "-" if us is None else f"{us:.1f} ({nbytes / us / 1e6:.2f})"

        print(f"| {r['shape']} | {r['kv_bytes'] / 2**20:.0f} | {r['noop_us']:.2f} | "
              f"{r['read_us']:.1f} ({r['kv_bytes'] / r['read_us'] / 1e6:.2f}, {best}) | "
              + ("-" if r["bulk_us"] is None else
                 f"{r['bulk_us']:.1f} ({r['kv_bytes'] / r['bulk_us'] / 1e6:.2f}, {r['bulk_cfg']})") + " | "
              f"{cell(r['pingpong_us'], r['io_bytes'])} | {cell(r['cudnn_us'], r['io_bytes'])} |", flush=True)
    if args.json:
        cols = [("shape", "shape"), ("read_us", "read µs"), ("read_tbps", "TB/s"), ("bulk_read_us", "bulk read µs"),
                ("bulk_read_tbps", "TB/s"), ("pingpong_us", "pingpong µs"), ("pingpong_tbps", "TB/s"),
                ("cudnn_us", "cuDNN µs"), ("cudnn_tbps", "TB/s"), ("noop_us", "empty launch µs")]
        doc = envelope("floors", "Bandwidth floors: plain streaming reads of the same KV bytes", rows, columns=cols,
                       notes="read and bulk read: TB/s of K+V bytes; pingpong and cuDNN: TB/s of Q+K+V+O bytes. "
                             f"CUDA-graph replay, cold L2, {args.rounds} passes of {args.replays} replays.")
        print(f"wrote {write(args.json, doc)}")


if __name__ == "__main__":
    main()
