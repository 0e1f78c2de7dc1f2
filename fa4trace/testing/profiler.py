"""A synthetic torch.profiler run around fa4trace bundles, for tests and benchmarks (no GPU).

:func:`profiled_run` writes what ``torch.profiler.profile(activities=[CPU, CUDA])`` followed by
``prof.export_chrome_trace`` would hold for a small transformer-like loop: a ``ProfilerStep#n``
per step; per layer ``aten::linear`` (cuBLAS GEMM through ``cudaLaunchKernel``), one custom op
per bundle (its CuTe DSL kernel through ``cuLaunchKernelEx``, as the DSL launches) and an
``aten::add_``; a backward pass on the autograd thread; copies, a memset and a synchronize —
in Kineto's layout (``baseTimeNanoseconds``, ``deviceProperties``, ``ac2g`` flows, process and
thread metadata, µs times with three decimals).

Each launch of each given bundle takes the next call of its op: the bundle is re-timed so the
launch's first warp starts ``lead_ns`` after its kernel slice begins, on a GPU clock that is
``clock_offset_ns`` behind the profiler's (plus ``jitter_ns`` of noise per launch), and the
slice lasts ``lead_ns + span + tail_ns``. Calls after a bundle's launches run the plain build
(another symbol, or the same one with ``untraced_same_symbol``). What the generator did is in
:attr:`ProfiledRun.truth`, so tests can check a merge against it. Everything is marked
synthetic; nothing here is a measurement.

Several ranks (:func:`profiled_ranks`): one run per rank of a tensor-parallel program, each
layer ending in an NCCL all-reduce on a stream of its own. The ranks share one timeline (one
seed: the same ops at the same true times); what differs per rank is drawn from a generator of
its own: when its NCCL kernel starts (the rank arrives up to ``arrival_ns`` late) and how far its
end is off the collective's common end (``end_skew_ns``). Each rank's trace is then written on a
clock ``host_clock_offset_ns`` off the true one (its profiler's times and its bundles' host
launch times alike): what a merge of the ranks has to find (:attr:`ProfiledRun.collectives`
holds the true times).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..trace.bundle import Trace

__all__ = ["ProfiledRun", "profiled_run", "profiled_ranks", "profiled_rank", "cute_symbol", "retime"]

BASE_NS = 1_790_857_026_000_000_000  # a Kineto base time (Unix epoch ns)
START_NS = BASE_NS + 5_334_264_772_000_000  # where the run starts (epoch ns)
STREAM = 7
NCCL_STREAM = 21
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
       "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)")
MEMSET = "Memset (Device)"
MEMCPY = "Memcpy HtoD (Pageable -> Device)"
DEVICE = {"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150031466496, "computeMajor": 9, "computeMinor": 0,
          "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536,
          "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132, "regsPerMultiprocessor": 65536,
          "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472}
SHAPE_ARGS = ('"Input Dims": [[8, 1024, 4096], [4096, 4096], [4096]], "Input type": ["c10::BFloat16", '
              '"c10::BFloat16", "c10::BFloat16"], "Input Strides": [[4194304, 4096, 1], [4096, 1], [1]], '
              '"Concrete Inputs": ["", "", ""]')


@dataclass
class ProfiledRun:
    """The Chrome trace text, the re-timed bundles and what was placed where."""

    text: str
    traces: list
    truth: list = field(default_factory=list)  # per traced launch: bundle, launch, name, ts_ns, dur_ns, correlation
    collectives: list = field(default_factory=list)  # per NCCL kernel: start_ns, end_ns on the true clock
    rank: int | None = None
    host_clock_offset_ns: int = 0  # this rank's clock minus the true one

    def write(self, path) -> Path:
        path = Path(path)
        path.write_text(self.text)
        return path

    @property
    def doc(self) -> dict:
        return json.loads(self.text)


def cute_symbol(qualname: str, *, module: str = "synthetic.kernels", traced: bool = True) -> str:
    """The CUDA symbol the CuTe DSL gives a ``@cute.kernel`` (``kernel_cutlass_<function>_<args>_0``):
    a method's ``self`` appears as ``<module><Class>_object_at_`` (addresses dropped)."""
    parts = [p for p in re.split(r"[.:]", qualname) if p]
    func = parts[-1] if parts else "kernel"
    owner = parts[-2] if len(parts) > 1 else ""
    args = "tensorptrbf16gmemalign16o1_tensorptrbf16gmemalign16o1"
    if traced:
        args += "_tensorptri64gmemalign16o1"  # the trace buffer fa4trace appends
    self_part = f"{module.replace('.', '')}{owner}_object_at__" if owner else ""
    return re.sub(r"[^A-Za-z0-9_]", "", f"kernel_cutlass_{func}_{self_part}{args}_0")


def _qualname(trace: Trace) -> str:
    info = trace.info
    ks = (info.instrument.kernels if info.instrument is not None else None) or []
    if ks:
        return str(ks[0])
    return re.sub(r"[^A-Za-z0-9_.]", "_", str(info.kernel or "kernel"))


def retime(trace: Trace, first_ns: list[int], meta_updates: list[dict] | None = None) -> Trace:
    """The bundle with launch k's first warp start moved to globaltimer ``first_ns[k]`` (epoch ns)."""
    ev = trace.events
    launch = ev["launch"].to_numpy().astype(np.int64)
    start = ev["start_ns"].to_numpy()
    ids = np.unique(launch)
    if len(first_ns) != ids.size:
        raise ValueError(f"{ids.size} launches in the bundle, {len(first_ns)} start times given")
    first_rel = np.array([start[launch == k].min() for k in ids], np.int64)
    t0 = int(min(first_ns))
    new_rel = np.asarray(first_ns, np.int64) - t0
    shift = np.zeros(int(ids.max()) + 1, np.int64)
    shift[ids] = new_rel - first_rel
    s = shift[launch]
    ev = ev.set_column(ev.schema.get_field_index("start_ns"), "start_ns", pa.array(start + s))
    ev = ev.set_column(ev.schema.get_field_index("end_ns"), "end_ns", pa.array(ev["end_ns"].to_numpy() + s))
    meta = json.loads(json.dumps(trace.meta, default=str))
    meta["t0_globaltimer_ns"] = t0
    launches = meta.setdefault("launches", [])
    while len(launches) < ids.size:
        launches.append({})
    for i, k in enumerate(ids.tolist()):
        launches[k]["t0_offset_ns"] = int(new_rel[i])
        if meta_updates:
            launches[k].update(meta_updates[i])
    meta["synthetic"] = True
    return Trace(ev, meta)


class _Writer:
    """Kineto's event layout, written as text (exact three-decimal µs, like Kineto)."""

    def __init__(self, base_ns: int, shift_ns: int = 0):
        self.base = base_ns
        self.shift = shift_ns  # every time is written this far off (a clock that is off)
        self.parts: list[str] = []
        self.names: dict = {}
        self.size = 0

    def _t(self, ns: int) -> str:
        rel = ns + self.shift - self.base
        return f"{rel // 1000}.{rel % 1000:03d}"

    def _q(self, s: str) -> str:
        q = self.names.get(s)
        if q is None:
            q = self.names[s] = json.dumps(s)
        return q

    def add(self, text: str) -> None:
        self.parts.append(text)
        self.size += len(text)

    def x(self, cat: str, name: str, pid, tid, ts: int, dur: int, args: str = "") -> None:
        a = f',\n    "args": {{\n      {args}\n    }}' if args else ""
        self.add(f'\n  {{\n    "ph": "X", "cat": "{cat}", "name": {self._q(name)}, "pid": {pid}, "tid": {tid},\n'
                 f'    "ts": {self._t(ts)}, "dur": {max(dur, 0) // 1000}.{max(dur, 0) % 1000:03d}{a}\n  }},')

    def flow(self, ph: str, fid: int, pid, tid, ts: int) -> None:
        bp = ', "bp": "e"' if ph == "f" else ""
        self.add(f'\n  {{\n    "ph": "{ph}", "id": {fid}, "pid": {pid}, "tid": {tid}, "ts": {self._t(ts)},\n'
                 f'    "cat": "ac2g", "name": "ac2g"{bp}\n  }},')

    def meta(self, what: str, pid, tid, ts: int, key: str, value) -> None:
        v = json.dumps(value)
        self.add(f'\n  {{\n    "name": "{what}", "ph": "M", "ts": {self._t(ts)}, "pid": {pid}, "tid": {tid},\n'
                 f'    "args": {{\n      "{key}": {v}\n    }}\n  }},')

    def instant(self, name: str, pid: str, tid: str, ts: int) -> None:
        self.add(f'\n  {{\n    "name": {self._q(name)}, "ph": "i", "s": "g",\n'
                 f'    "pid": "{pid}", "tid": "{tid}", "ts": {self._t(ts)}\n  }},')


def profiled_run(traces: list[Trace], *, steps: int = 2, layers: int = 2, clock_offset_ns: int = 800_000,
                 lead_ns: int = 700, tail_ns: int = 900, jitter_ns: int = 200, symbols: bool = True,
                 host_times: bool = True, plain_before: bool = False, untraced_same_symbol: bool = False,
                 min_bytes: int = 0, seed: int = 0, pid: int = 4242, device: int = 0, rank: int | None = None,
                 world_size: int | None = None, collectives: bool = False, host_clock_offset_ns: int = 0,
                 rank_seed: int | None = None, arrival_ns: int = 30_000, end_skew_ns: int = 300) -> ProfiledRun:
    """A torch.profiler trace of a loop that calls each bundle's kernel (module docstring).

    ``symbols`` / ``host_times``: write the per-launch metadata a recording under a profiler
    adds (``cuda_symbols``; ``host_launch_ns`` / ``host_return_ns``) into the re-timed bundles.
    ``plain_before``: each traced launch is preceded by its plain build on the same inputs
    (``fa4trace.instrument(check=True)``). ``min_bytes``: add untraced steps until the trace
    text is at least this long (benchmarks). ``device``: the CUDA device index.

    One rank of several (module docstring): ``rank`` / ``world_size`` (the trace's
    ``distributedInfo``, the bundles' ``distributed`` metadata), ``collectives`` (an NCCL
    all-reduce per layer), ``host_clock_offset_ns``, ``rank_seed`` (the rank's own draws),
    ``arrival_ns``, ``end_skew_ns``."""
    rng = np.random.default_rng(seed)
    rank_rng = np.random.default_rng(rank_seed if rank_seed is not None else (rank or 0) + 1)
    w = _Writer(BASE_NS, host_clock_offset_ns)
    coll_truth: list = []
    n_launch = [int(np.unique(t.events["launch"].to_numpy()).size) for t in traces]
    if sum(n_launch) and steps * layers < max(n_launch):
        raise ValueError(f"{steps} steps x {layers} layers call each op {steps * layers} times: "
                         f"too few for a bundle of {max(n_launch)} launches")
    spans = []
    for t in traces:
        ev = t.events
        la, st, en = (ev[c].to_numpy().astype(np.int64) for c in ("launch", "start_ns", "end_ns"))
        spans.append([int(en[la == k].max() - st[la == k].min()) for k in np.unique(la)])
    quals = [_qualname(t) for t in traces]
    sym_traced = [cute_symbol(q) for q in quals]
    sym_plain = [s if untraced_same_symbol else cute_symbol(q, traced=False) for s, q in zip(sym_traced, quals)]
    op_names = [re.sub(r"[^A-Za-z0-9]", "", q.split(".")[0]) + "Function" for q in quals]
    blocks = [int((t.info.instrument.warps_per_cta if t.info.instrument is not None else None) or _warps_per_cta(t))
              * 32 for t in traces]
    grids = [int(t.events["cta"].to_numpy().max()) + 1 if t.events.num_rows else 1 for t in traces]
    next_launch = [0] * len(traces)
    placed: list[list] = [[None] * n for n in n_launch]
    truth = []
    tid_main, tid_bwd = pid, pid + 1
    state = {"host": START_NS + 200_000, "gpu": START_NS, "nccl": START_NS, "corr": 1, "ext": 1}

    def dur(mean_ns: float) -> int:
        return max(200, int(rng.normal(mean_ns, mean_ns * 0.1)))

    def cpu_op(name: str, tid: int, d: int, args: str = "") -> int:
        ts = state["host"]
        ext = state["ext"]
        state["ext"] += 1
        a = f'"External id": {ext},"Record function id": 0, ' + (args or '"Ev Idx": 0')
        w.x("cpu_op", name, pid, tid, ts, d, a)
        return ts

    def launch(tid: int, kernel: str, k_dur: int, *, grid: int = 132, block: int = 128, driver: bool = False,
               cat: str = "kernel", fixed_start: int | None = None) -> tuple:
        """A host launch call and its kernel on the stream; returns (kernel ts, correlation, call ts, call end)."""
        corr = state["corr"]
        state["corr"] += 1
        call_ts = state["host"]
        call_dur = dur(4500 if driver else 3500)
        api = ("cuLaunchKernelEx", "cuda_driver", 0) if driver else ("cudaLaunchKernel", "cuda_runtime", 211)
        if cat != "kernel":
            api = ("cudaMemcpyAsync", "cuda_runtime", 41) if cat == "gpu_memcpy" else ("cudaMemsetAsync", "cuda_runtime", 51)
        w.x(api[1], api[0], pid, tid, call_ts, call_dur, f'"External id": {state["ext"] - 1}, "cbid": {api[2]}, "correlation": {corr}')
        w.flow("s", corr, pid, tid, call_ts)
        start = fixed_start if fixed_start is not None else max(call_ts + dur(5000), state["gpu"])
        reg = "" if cat != "kernel" else (f', "registers per thread": 168, "shared memory": 0, "blocks per SM": '
                                          f'{grid / 132:.6f}, "warps per SM": {grid * block / 32 / 132:.6f}, '
                                          f'"grid": [{grid}, 1, 1], "block": [{block}, 1, 1], "est. achieved occupancy %": 12')
        w.x(cat, kernel, device, STREAM, start, k_dur,
            f'"External id": {state["ext"] - 1}, "queued": 0, "device": {device}, "context": 1, "stream": {STREAM}, '
            f'"correlation": {corr}{reg}')
        w.flow("f", corr, device, STREAM, start)
        state["gpu"] = start + k_dur + 1000
        state["host"] = call_ts + call_dur + dur(1500)
        return start, corr, call_ts, call_ts + call_dur

    def custom_op(b: int) -> None:
        op_ts = state["host"]
        state["host"] += dur(8000)
        cpu_op("aten::empty_like", tid_main, dur(3000))
        state["host"] += dur(4000)
        k = next_launch[b]
        traced = k < n_launch[b]
        if traced and plain_before:
            launch(tid_main, sym_plain[b], int(spans[b][k] * 0.8) + 1000, grid=grids[b], block=blocks[b], driver=True)
            sync_ts = state["host"]
            state["host"] = max(state["host"], state["gpu"]) + 2000
            w.x("cuda_runtime", "cudaDeviceSynchronize", pid, tid_main, sync_ts, state["host"] - sync_ts,
                f'"cbid": 165, "correlation": {state["corr"]}')
            state["corr"] += 1
            launch(tid_main, "Memcpy DtoD (Device -> Device)", dur(20000), cat="gpu_memcpy")
        if traced:
            span = spans[b][k]
            h0 = state["host"] - 1500
            ks, corr, c0, c1 = launch(tid_main, sym_traced[b], lead_ns + span + tail_ns, grid=grids[b],
                                      block=blocks[b], driver=True)
            first = ks + lead_ns - clock_offset_ns + int(rng.integers(-jitter_ns, jitter_ns + 1)) if jitter_ns else \
                ks + lead_ns - clock_offset_ns
            upd = {}
            if symbols:
                upd["cuda_symbols"] = [sym_traced[b]]
            if host_times:  # time.time_ns() of the rank's host: its clock
                upd["host_launch_ns"] = int(h0) + host_clock_offset_ns
                upd["host_return_ns"] = int(c1 + 800) + host_clock_offset_ns
            upd["device"] = device
            placed[b][k] = (first, upd)
            truth.append({"bundle": b, "launch": k, "name": sym_traced[b], "ts_ns": int(ks),
                          "dur_ns": int(lead_ns + span + tail_ns), "correlation": int(corr), "first_warp_ns": int(first)})
            next_launch[b] += 1
        else:
            launch(tid_main, sym_plain[b], dur(60_000), grid=grids[b], block=blocks[b], driver=True)
        end = state["host"] + dur(2000)
        ext = state["ext"]
        state["ext"] += 1
        w.x("cpu_op", op_names[b], pid, tid_main, op_ts, end - op_ts, f'"External id": {ext},"Sequence number": {ext}, '
            f'"Fwd thread id": 0, "Record function id": 0, "Ev Idx": {ext}')
        state["host"] = end + dur(1000)

    def layer(l: int) -> None:
        t_layer = state["host"]
        g_layer = max(state["gpu"], t_layer)
        ext = state["ext"]
        state["ext"] += 1
        state["host"] += 1000
        lin = state["host"]
        state["host"] += dur(3000)
        for nm in ("aten::t", "aten::transpose", "aten::as_strided"):
            cpu_op(nm, tid_main, dur(2000), SHAPE_ARGS)
            state["host"] += dur(1500)
        mm = state["host"]
        state["host"] += dur(2500)
        launch(tid_main, GEMM, dur(45_000))
        w.x("cpu_op", "aten::addmm", pid, tid_main, mm, state["host"] - mm, f'"External id": {state["ext"]}, {SHAPE_ARGS}')
        state["ext"] += 1
        w.x("cpu_op", "aten::linear", pid, tid_main, lin, state["host"] - lin + 500, f'"External id": {state["ext"]}, {SHAPE_ARGS}')
        state["ext"] += 1
        state["host"] += dur(3000)
        for b in range(len(traces)):
            custom_op(b)
        add = state["host"]
        state["host"] += dur(2000)
        launch(tid_main, ADD, dur(9000))
        w.x("cpu_op", "aten::add_", pid, tid_main, add, state["host"] - add, f'"External id": {state["ext"]}, {SHAPE_ARGS}')
        state["ext"] += 1
        w.x("user_annotation", f"layer {l}", pid, tid_main, t_layer, state["host"] - t_layer + 500,
            f'"External id": {ext},"Record function id": 0, "Ev Idx": {ext}')
        w.x("gpu_user_annotation", f"layer {l}", device, STREAM, g_layer, state["gpu"] - g_layer,
            f'"External id": {ext}, "device": {device}, "stream": {STREAM}, "correlation": {ext}')
        state["host"] += dur(2000)
        if collectives:
            all_reduce()

    def all_reduce() -> None:
        """nccl:all_reduce on the host, its kernel on the NCCL stream: it starts when this rank
        arrives and ends with the collective (module docstring); the compute stream waits for it."""
        t0 = state["host"]
        ext = state["ext"]
        state["ext"] += 2
        state["host"] += dur(3000)
        corr = state["corr"]
        state["corr"] += 1
        call_ts = state["host"]
        call_dur = dur(3500)
        w.x("cuda_runtime", "cudaLaunchKernel", pid, tid_main, call_ts, call_dur,
            f'"External id": {ext + 1}, "cbid": 211, "correlation": {corr}')
        w.flow("s", corr, pid, tid_main, call_ts)
        s0 = max(call_ts + dur(5000), state["gpu"], state["nccl"])
        d = max(dur(60_000), 2 * arrival_ns + 2000)
        ks = s0 + int(rank_rng.integers(0, arrival_ns + 1))
        ke = s0 + d + int(rank_rng.integers(-end_skew_ns, end_skew_ns + 1))
        w.x("kernel", NCCL, device, NCCL_STREAM, ks, ke - ks,
            f'"External id": {ext + 1}, "queued": 0, "device": {device}, "context": 1, "stream": {NCCL_STREAM}, '
            f'"correlation": {corr}, "registers per thread": 96, "shared memory": 0, "grid": [2, 1, 1], '
            f'"block": [640, 1, 1]')
        w.flow("f", corr, device, NCCL_STREAM, ks)
        coll_truth.append({"start_ns": int(ks), "end_ns": int(ke)})
        state["nccl"] = s0 + d + 1000
        state["gpu"] = max(state["gpu"], state["nccl"])
        state["host"] = call_ts + call_dur + dur(1500)
        w.x("cpu_op", "record_param_comms", pid, tid_main, t0 + 500, state["host"] - t0 - 600,
            f'"External id": {ext + 1}, "Collective name": "allreduce", "dtype": "BFloat16", "Group size": '
            f'{world_size or 1}, "Process Group Name": "0"')
        w.x("user_annotation", "nccl:all_reduce", pid, tid_main, t0, state["host"] - t0,
            f'"External id": {ext},"Record function id": 0, "Ev Idx": {ext}')
        state["host"] += dur(2000)

    def backward() -> None:
        saved = state["host"]
        state["host"] = max(state["host"], state["gpu"] - 200_000)
        for l in reversed(range(layers)):
            t0 = state["host"]
            state["host"] += dur(4000)
            inner = state["host"]
            state["host"] += dur(2000)
            for _ in range(2):
                launch(tid_bwd, GEMM, dur(40_000))
            w.x("cpu_op", "AddmmBackward0", pid, tid_bwd, inner, state["host"] - inner, f'"External id": {state["ext"]}')
            state["ext"] += 1
            w.x("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", pid, tid_bwd, t0,
                state["host"] - t0 + 800, f'"External id": {state["ext"]}')
            state["ext"] += 1
            state["host"] += dur(3000)
        state["host"] = max(saved, state["host"])

    s = 0
    while s < steps or (min_bytes and w.size < min_bytes):
        t_step = state["host"]
        ext = state["ext"]
        state["ext"] += 1
        state["host"] += 2000
        launch(tid_main, MEMCPY, dur(30_000), cat="gpu_memcpy")
        launch(tid_main, MEMSET, dur(2_000), cat="gpu_memset")
        for l in range(layers):
            layer(l)
        backward()
        sync = state["host"]
        state["host"] = max(state["host"], state["gpu"]) + 3000
        w.x("cuda_runtime", "cudaDeviceSynchronize", pid, tid_main, sync, state["host"] - sync,
            f'"cbid": 165, "correlation": {state["corr"]}')
        state["corr"] += 1
        w.x("user_annotation", f"ProfilerStep#{s}", pid, tid_main, t_step, state["host"] - t_step,
            f'"External id": {ext},"Record function id": 0, "Ev Idx": {ext}')
        state["host"] += 20_000
        s += 1
    end = state["host"]

    dist = ""
    if rank is not None:
        dist = ('\n  "distributedInfo": ' + json.dumps({"backend": "nccl", "rank": rank, "world_size": world_size,
                                                       "pg_count": 1, "nccl_version": "2.27.5"}) + ","
                '\n  "host_name": "synthetic-host",')
    head = [
        '{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    ' + json.dumps(dict(DEVICE, id=device)) + '\n  ],'
        + dist,
        f'\n  "cupti_version": 24,\n  "cuda_runtime_version": 12080,\n  "cuda_driver_version": 13000,'
        f'\n  "trace_id": "0123456789ABCDEF0123456789ABCDEF",\n  "synthetic": true,'
        f'\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": {BASE_NS},\n  "traceEvents": [']
    m = _Writer(BASE_NS, host_clock_offset_ns)
    for p, label, name, sort in ((pid, "CPU", "python", pid), (device, f"GPU {device}", "python", 0x1000000 + device)):
        m.meta("process_name", p, 0, START_NS, "name", name)
        m.meta("process_labels", p, 0, START_NS, "labels", label)
        m.meta("process_sort_index", p, 0, START_NS, "sort_index", sort)
    m.meta("thread_name", pid, tid_main, START_NS, "name", f"thread {tid_main} (python)")
    m.meta("thread_name", pid, tid_bwd, START_NS, "name", f"thread {tid_bwd} (pt_autograd_0)")
    m.meta("thread_name", device, STREAM, START_NS, "name", f"stream {STREAM} ")
    if collectives:
        m.meta("thread_name", device, NCCL_STREAM, START_NS, "name", f"stream {NCCL_STREAM} ")
    m.x("Trace", "PyTorch Profiler (0)", '"Spans"', '"PyTorch Profiler"', START_NS, end - START_NS, '"Op count": 0')
    m.instant("Iteration Start: PyTorch Profiler", "Traces", "Trace PyTorch Profiler", START_NS)
    tail = (f'\n  {{\n    "name": "Record Window End", "ph": "i", "s": "g",\n    "pid": "", "tid": "", '
            f'"ts": {w._t(end)}\n  }}\n  ],\n  "traceName": "synthetic"\n}}')
    text = "".join(head + m.parts + w.parts) + tail

    out = []
    for b, t in enumerate(traces):
        if n_launch[b] and any(p is None for p in placed[b]):
            raise ValueError(f"bundle {b}: not every launch was placed")
        t = retime(t, [p[0] for p in placed[b]], [p[1] for p in placed[b]]) if n_launch[b] else t
        if rank is not None:
            t = Trace(t.events, dict(t.meta, distributed={"rank": rank, "world_size": world_size, "local_rank": rank,
                                                          "host": "synthetic", "pid": pid, "source": "synthetic"}))
        out.append(t)
    return ProfiledRun(text, out, truth, coll_truth, rank, host_clock_offset_ns)


def profiled_ranks(traces: list[Trace], world_size: int, *, host_clock_offsets_ns=None, devices=None,
                   pids=None, seed: int = 0, **kw) -> list[ProfiledRun]:
    """One :func:`profiled_run` per rank of a tensor-parallel program (module docstring): the
    same ``traces`` (each rank's re-timed copy), an NCCL all-reduce per layer, rank r on
    ``devices[r]`` (default r) with pid ``pids[r]`` (default 4242 + 100 r), its clock
    ``host_clock_offsets_ns[r]`` off the true one (default 0). ``kw`` goes to every run."""
    offs = list(host_clock_offsets_ns) if host_clock_offsets_ns is not None else [0] * world_size
    devs = list(devices) if devices is not None else list(range(world_size))
    pids_ = list(pids) if pids is not None else [4242 + 100 * r for r in range(world_size)]
    if not len(offs) == len(devs) == len(pids_) == world_size:
        raise ValueError(f"{world_size} ranks: give one clock offset, device and pid per rank")
    return [profiled_rank(traces, r, world_size, host_clock_offset_ns=offs[r], device=devs[r], pid=pids_[r],
                          seed=seed, **kw) for r in range(world_size)]


def profiled_rank(traces: list[Trace], rank: int, world_size: int, *, host_clock_offset_ns: int = 0,
                  device: int | None = None, pid: int | None = None, seed: int = 0, **kw) -> ProfiledRun:
    """Rank ``rank`` of :func:`profiled_ranks`, made alone (a benchmark makes one rank at a time)."""
    return profiled_run(traces, seed=seed, rank=rank, world_size=world_size, collectives=True,
                        device=rank if device is None else device, pid=4242 + 100 * rank if pid is None else pid,
                        host_clock_offset_ns=host_clock_offset_ns, rank_seed=10_000 + rank, **kw)


def _warps_per_cta(t: Trace) -> int:
    return int(t.events["warp"].to_numpy().max()) + 1 if t.events.num_rows else 1
