"""Run an instrumented kernel and turn its buffers into a bundle (torch + a GPU; no cutlass).

Works the same for a kernel compiled here (``compiler.CompiledTraced``) and for one loaded
from an AOT build: all it needs is the compiled function, its vocabulary and what the
compile found (``meta``). Each call gets a fresh buffer appended to its arguments; with
``check`` the plain build runs twice first on the same inputs, and every tensor argument that
two plain runs agree on must come out bit-identical from the traced run (instrumentation never
changes what a kernel computes); those they disagree on (atomics) are named in the bundle.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..format import layout as L
from ..format.errors import Fa4traceError
from ..run.record import new_trace_tensor
from .outcheck import OutputCheck, named_tensors

DEFAULT_CTAS = 256  # the first CTAs of the grid record (a launch's grid is often known only at run time)
# recorder placements that take static shared memory (a launch may be refused for them), as a
# bundle's cursor_reason names them
SHARED_MEMORY_CURSORS = {"smem": "shared-memory cursor", "ring": "shared-memory ring"}
DEFAULT_CAPACITY = 4096  # records per warp

# Trace buffers of launches captured into a CUDA graph: the graph writes into its buffer at
# every replay, for as long as the graph lives, and fa4trace cannot see when that ends (a
# graph's memory pool may be shared with later captures), so these stay allocated while the
# process runs. The bundle of such a launch holds what its last replay recorded.
GRAPH_BUFFERS: list = []


@dataclass
class RecordOptions:
    """Which warps record and how much: the first ``ctas`` CTAs (or every ``cta_stride``-th
    from ``cta_first``), ``warps`` (warp indices; None = all), ``capacity`` records each."""

    ctas: int = DEFAULT_CTAS
    capacity: int = DEFAULT_CAPACITY
    cta_first: int = 0
    cta_stride: int = 1
    warps: Optional[tuple] = None
    check: bool = True

    def spec(self, warps_per_cta: int) -> L.BufferSpec:
        n = self.cta_first + self.ctas * self.cta_stride
        return L.BufferSpec.for_grid(n, warps_per_cta, self.capacity, cta_first=self.cta_first,
                                     cta_stride=self.cta_stride, max_ctas=self.ctas, warps=self.warps)


def _symbols(fn) -> list[str]:
    """The CUDA symbol names of the kernels a compiled function launches (as CUPTI names
    them), where the DSL's compiled function says."""
    info = getattr(fn, "kernel_info", None)
    return sorted(str(k) for k in info) if isinstance(info, dict) else []


def _capturing(args) -> bool:
    """Whether the launch is being captured into a CUDA graph (nothing may synchronise then):
    torch's current stream, or a CUDA driver stream among the arguments (CUTLASS's examples
    pass their own ``CUstream``)."""
    import torch

    if torch.cuda.is_current_stream_capturing():
        return True
    for a in args:
        if type(a).__name__ == "CUstream":
            from cuda.bindings import driver

            err, status = driver.cuStreamIsCapturing(a)
            if err == driver.CUresult.CUDA_SUCCESS and status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE:
                return True
    return False


def _launch_failure(exc: BaseException) -> str:
    """The first line of what a failed launch said."""
    msg = str(exc).strip().splitlines()
    return msg[0][:200] if msg else type(exc).__name__


class Instrumented:
    """Callable like the kernel it wraps; ``trace()`` gives the bundle of its launches so far.

    While its ``instrument()`` block is open a call runs the traced kernel (with ``check``,
    next to the plain one); once the block has ended (``close``) a call runs the plain kernel
    only, so a library cache that kept it serves the program's own kernel again."""

    def __init__(self, fn: Callable, vocab, meta: dict, *, plain: Optional[Callable] = None,
                 options: Optional[RecordOptions] = None, to_arg: Callable = lambda t: t,
                 recompile: Optional[Callable] = None, own: Optional[Callable] = None):
        self.fn, self.vocab, self.meta, self.plain = fn, vocab, dict(meta), plain
        self.options = options or RecordOptions()
        self.to_arg = to_arg  # torch trace tensor -> what the compiled function takes
        self._recompile = recompile  # (cursor) -> CompiledTraced: the same compile, recorder elsewhere
        self._own = own or contextlib.nullcontext  # calls made here are fa4trace's own
        # (buffer, its spec, the launch call's host times / device / CUDA symbols): the last
        # let fa4trace.profiler match a launch to its kernel in a torch.profiler trace
        self._launches: list[tuple[Any, L.BufferSpec, dict]] = []
        self.checked: list[bool] = []
        self.nondeterministic: set[str] = set()
        self.twin: list[dict] = []  # plain vs traced time of checked launches
        self.not_traced = ""  # why this kernel runs plain inside the block ('' while it traces)
        self.active = True
        self.launched_ok = False  # a traced launch ran eagerly: its build is known to launch
        self.captured_plain = 0  # launches captured into a CUDA graph before that: they ran plain

    @property
    def warps_per_cta(self) -> int:
        w = self.meta.get("warps_per_cta")
        if not w:
            raise Fa4traceError("the kernel's block size was not a constant at compile time: "
                                "pass warps_per_cta to fa4trace.instrument")
        return int(w)

    @property
    def launched(self) -> bool:
        return bool(self._launches)

    def close(self) -> None:
        """The block has ended: from now on a call runs the plain kernel."""
        self.active = False
        self._recompile = None

    def __call__(self, *args, **kwargs):
        if (not self.active or self.not_traced) and self.plain is not None:
            with self._own():
                return self.plain(*args, **kwargs)
        with self._own():
            return self._traced_call(args, kwargs)

    def _traced_call(self, args, kwargs):
        import torch

        capturing = _capturing(args)
        if capturing and not self.launched_ok and self.plain is not None:
            # a launch that fails while a stream captures would break the user's capture: only a
            # build that has launched eagerly goes into a graph
            self.captured_plain += 1
            return self.plain(*args, **kwargs)
        check = self.options.check and self.plain is not None and not capturing
        if check:
            oc = OutputCheck(named_tensors(args, kwargs, self.meta.get("params") or []), torch.cuda.synchronize)
            plain_ns = self._plain_twice(args, kwargs, oc)
        spec = self.options.spec(self.warps_per_cta)
        buf = new_trace_tensor(spec)  # device operations only: capturable
        start = end = None
        if check:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        host = {"host_launch_ns": time.time_ns()}
        ret = self._launch(args, kwargs, buf)
        host.update(host_return_ns=time.time_ns(), device=torch.cuda.current_device(),
                    cuda_symbols=_symbols(self.fn))
        if self.not_traced:  # it could not run traced: the plain kernel ran instead
            return ret
        self.launched_ok = self.launched_ok or not capturing
        if capturing:  # nothing ran yet: the graph's replays fill buf, for as long as the graph lives
            GRAPH_BUFFERS.append(buf)
            # the host times are the capture's, not a launch's: a profiler trace must not match them
            host = {"captured": True, "captured_at_ns": host["host_launch_ns"],
                    **{k: v for k, v in host.items() if not k.startswith("host_")}}
        if check:
            end.record()
            torch.cuda.synchronize()
            self._compare(oc)
            self.twin.append({"plain_ns": plain_ns, "traced_ns": int(start.elapsed_time(end) * 1e6)})
        self._launches.append((buf, spec, host))
        return ret

    def _plain_twice(self, args, kwargs, oc: OutputCheck) -> int:
        """Run the plain kernel twice from the same memory (``OutputCheck.plain_twice``); the
        second run's time (ns). Arguments whose memory two plain runs leave different
        (atomics, races) are named non-deterministic."""
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def run(i):
            if i:
                start.record()
            self.plain(*args, **kwargs)
            if i:
                end.record()

        oc.plain_twice(run)
        self.nondeterministic |= oc.nondeterministic
        return int(start.elapsed_time(end) * 1e6)

    def _compare(self, oc: OutputCheck) -> None:
        """Traced outputs against the plain ones where plain is reproducible. A difference is
        fa4trace's bug, not the program's: the plain result is put back and one line says so."""
        differ = oc.compare()
        self.checked.append(not differ)
        if differ and self.checked.count(False) == 1:
            print(f"fa4trace: {self.meta.get('kernel', 'kernel')}: the traced kernel's {', '.join(differ)} "
                  "differ from the plain kernel's (bitwise; plain is reproducible there): the plain result "
                  "is kept and the trace marked unchecked; please report this kernel", file=sys.stderr)

    def _launch(self, args, kwargs, buf):
        """The traced launch; a launch the GPU refuses (shared memory, registers) is compiled
        again with the recorder's cursor (and, from a ring build, its records) in global memory,
        and if that is refused too the plain kernel runs and one line says why (the program
        never fails for being traced)."""
        targs = self.to_arg(buf)
        try:
            return self.fn(*args, targs, **kwargs) if not kwargs else self.fn(*args, **kwargs, fa4trace_buf=targs)
        except Exception as exc:  # noqa: BLE001 (the DSL and tvm-ffi raise their own types)
            first = _launch_failure(exc)
        was = self.meta.get("cursor")
        if self._recompile is not None and was in SHARED_MEMORY_CURSORS:
            c = self._recompile("gmem")
            self.fn, self.vocab = c.fn, c.vocab
            for k in ("ring", "ring_cta_warps", "ring_smem_bytes"):  # a ring build's: gone with it
                self.meta.pop(k, None)
            self.meta.update(c.meta, cursor="gmem",
                             cursor_reason=f"the {SHARED_MEMORY_CURSORS[was]} did not launch: {first}")
            try:
                return self.fn(*args, targs, **kwargs) if not kwargs else self.fn(*args, **kwargs, fa4trace_buf=targs)
            except Exception as exc:  # noqa: BLE001
                first = _launch_failure(exc)
        self.not_traced = first
        print(f"fa4trace: {self.meta.get('kernel', 'kernel')} runs untraced: its traced build did not launch "
              f"({first})", file=sys.stderr)
        if self.plain is None:
            raise Fa4traceError(f"{self.meta.get('kernel', 'kernel')}: the traced kernel did not launch ({first}) "
                                "and no plain build is at hand")
        return self.plain(*args, **kwargs)

    def trace(self, *, config: Optional[dict] = None):
        """Decode every launch so far into one ``Trace`` (and forget them)."""
        import torch

        from ..run.gpu import gpu_facts
        from ..trace.bundle import Trace
        from ..trace.decode import decode_buffer

        if not self._launches:
            raise Fa4traceError("nothing recorded yet: call the instrumented kernel first")
        torch.cuda.synchronize()
        decoded = [decode_buffer(b.cpu().numpy(), launch_index=i, vocab=self.vocab)
                   for i, (b, _s, _h) in enumerate(self._launches)]
        launches = [{"kernel": self.meta.get("kernel"), "recorded_ctas":
                     f"{s.cta_first}:{s.cta_first + s.n_cta_slots * s.cta_stride}:{s.cta_stride}",
                     "warp_subset": s.warp_subset, **h} for _b, s, h in self._launches]
        instrument = dict(self.meta, checked=list(self.checked), nondeterministic=sorted(self.nondeterministic))
        if self.twin:
            instrument["plain_twin"] = {"plain_ns": sorted(t["plain_ns"] for t in self.twin)[len(self.twin) // 2],
                                        "traced_ns": sorted(t["traced_ns"] for t in self.twin)[len(self.twin) // 2],
                                        "launches": len(self.twin)}
        meta = {"kernel": self.meta.get("kernel", "kernel"), "config": dict(config or {}),
                "gpu": gpu_facts(), "launches": launches, "instrument": instrument,
                "cta_subset": True, "warp_subset": launches[0]["warp_subset"]}
        self._launches = []
        self.twin = []
        return Trace.from_launches(decoded, meta, vocab=self.vocab)

