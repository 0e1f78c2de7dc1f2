"""Run an instrumented kernel and turn its buffers into a bundle (torch + a GPU; no cutlass).

Works the same for a kernel compiled here (``compiler.CompiledTraced``) and for one loaded
from an AOT build: all it needs is the compiled function, its vocabulary and what the
compile found (``meta``). Each call gets a fresh buffer appended to its arguments; with
``check`` the plain build runs twice first on the same inputs, and every tensor argument that
two plain runs agree on must come out bit-identical from the traced run (instrumentation never
changes what a kernel computes); those they disagree on (atomics) are named in the bundle.

**Plain twin.** Once per distinct shape of the arguments (``shape_signature``), a checked
call also times the traced build against the plain one on the device
(``fa4trace.run.timing.twin_times``: CUDA graphs of n launches each, replayed interleaved over
rounds, warm L2; back-to-back launches behind a spin kernel where a kernel cannot be
captured), never across a host synchronize or a compile (the traced build is timed only once
it has launched, so a recompile to the global-memory cursor is behind it). The extra launches
run on the program's own arguments: what they change is put back afterwards (the output
check's regions, ``OutputCheck.snapshot`` / ``put_back``), so a kernel that accumulates into
its output leaves the result of one launch. The bundle's ``instrument.plain_twin`` is a list
with one entry per launch, in launch order: {"launch", "plain_ns", "traced_ns" (per launch,
medians), "rel" (median of the per-round ratios - 1), "noise_pct" (half the p10-p90 spread
of those ratios, points), "same_pct", "method" ("graph" or "batch"), "launches_per_replay",
"rounds", "l2" ("warm")}, or {"launch", "method": None, "reason"} where nothing was timed
(a timing that failed, a launch captured into a graph, check=False, a pass launch).

**Passes** (``RecordOptions.passes``): after the main recording ("dense": the families and
spans asked for) each call replays the same launch with lighter recordings, one each:
"lifetimes" (no family: warp and CTA lifetimes only), then one family at a time ("pipeline",
"tma", "mma", "barrier") and "spans" (the named spans alone). Their builds are compiled on
the first call, the same compile with other families (``recompile``). Before each pass the
argument memory is put back as it was before the call and after it the output is checked
like the main launch's; after the last, memory is as the main launch left it. L2 is flushed
right before the main launch and each pass (``fa4trace.run.l2``; ``RecordOptions.flush_l2``),
so none finds what the one before it, or the output check, left there. Each pass
records into its own buffer and becomes its own launch of the bundle, tagged
``meta["launches"][i]["pass"]`` (and ``"call"``: which call it replays);
fa4trace.analysis.passes takes each figure from the lightest pass that reports it.
``RecordOptions.pass_launches`` replays each pass that many times per call (each launch from
the same memory and a flushed L2): a pass's figures are then taken over all its launches of
the call together (more samples per figure; what separates launches of different kinds, such as
a different SM clock, stays).
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

from ..format import layout as L
from ..format.errors import Fa4traceError
from ..format.options import Sampling
from ..format.vocab import MAX_EVENT_ID
from ..run import l2
from ..run.record import new_trace_tensor
from ..trace.meta import InstrumentMeta
from ..trace.ranks import rank_meta
from .events import FAMILIES
from .outcheck import OutputCheck, named_tensors

# recorder placements that take static shared memory (a launch may be refused for them), as a
# bundle's cursor_reason names them
SHARED_MEMORY_CURSORS = {"smem": "shared-memory cursor", "ring": "shared-memory ring"}

# Trace buffers of launches captured into a CUDA graph: the graph writes into its buffer at
# every replay, for as long as the graph lives, and fa4trace cannot see when that ends (a
# graph's memory pool may be shared with later captures), so these stay allocated while the
# process runs. The bundle of such a launch holds what its last replay recorded.
GRAPH_BUFFERS: list = []

DENSE = "dense"  # the pass name of the main recording, where a call also replays passes
# the lighter recordings a call can replay, in the order they run (lightest by design first:
# fa4trace.analysis.passes measures it, as records per CTA)
PASSES = ("lifetimes", *FAMILIES, "spans")
MAX_PASS_LAUNCHES = 64  # launches of each pass per call (RecordOptions.pass_launches)


def passes_asked(passes) -> tuple:
    """``instrument(passes=...)``: None/False none, True every pass, else names of ``PASSES``
    (a list or a comma string); an unknown name is a one-line ValueError."""
    if passes is None or passes is False:
        return ()
    if passes is True:
        return PASSES
    names = [p.strip() for p in passes.split(",")] if isinstance(passes, str) else [str(p) for p in passes]
    names = [p for p in dict.fromkeys(names) if p]
    bad = [p for p in names if p not in PASSES]
    if bad:
        raise ValueError(f"passes must be True or names from {', '.join(PASSES)}; got {', '.join(bad)}")
    return tuple(names)


def pass_plan(meta: dict, asked) -> tuple[list, dict]:
    """([(pass, families, spans)], {pass: why skipped}) for a kernel whose main build's meta
    is ``meta``: a family the recording does not ask for or the kernel lacks, named spans that
    were not placed, or a pass that would record what the main build records, is skipped.
    ``spans``: {} none, None the recording's own."""
    inst = InstrumentMeta.from_meta(meta)
    fams = set(inst.families or ())
    found = fams - set(inst.missing or ())
    spans = set(inst.spans or ()) - set(inst.spans_missing or ())
    plan, skipped = [], {}
    for name in asked:
        if name == "lifetimes":
            plan.append((name, (), {}))
        elif name == "spans":
            if not spans:
                skipped[name] = "no named span was placed"
            elif not found:
                skipped[name] = "the main recording records the named spans alone"
            else:
                plan.append((name, (), None))
        elif name not in fams:
            skipped[name] = "not a family of this recording"
        elif name not in found:
            skipped[name] = f"the kernel has no {name} events"
        elif found == {name} and not spans:
            skipped[name] = "the main recording records this family alone"
        else:
            plan.append((name, (name,), {}))
    return plan, skipped


def shape_signature(args, kwargs) -> tuple:
    """What a launch's cost depends on, per argument: a tensor's shape, strides and dtype, an
    integer's value (sizes), the type of anything else. The plain twin is timed once per
    signature."""
    def one(a):
        if hasattr(a, "shape") and hasattr(a, "dtype"):
            stride = a.stride() if callable(getattr(a, "stride", None)) else None
            return ("tensor", tuple(int(x) for x in a.shape), tuple(stride) if stride is not None else None,
                    str(a.dtype))
        if isinstance(a, (bool, int)):
            return a
        return type(a).__name__

    return tuple(one(a) for a in args) + tuple((k, one(v)) for k, v in sorted(kwargs.items()))


def on_current_stream(args, kwargs) -> tuple:
    """The call's arguments with every CUDA driver stream (``CUstream``, as CUTLASS's examples
    pass) replaced by torch's current stream: a replay fa4trace captures or times runs where
    fa4trace queues it, not on the stream the program called with."""
    import torch

    def swap(a):
        return type(a)(torch.cuda.current_stream().cuda_stream) if type(a).__name__ == "CUstream" else a

    return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}


def call_traced(fn, args, kwargs, targs):
    """``fn`` with the trace buffer: last positional argument, or keyword where the call has keywords."""
    return fn(*args, targs, **kwargs) if not kwargs else fn(*args, **kwargs, fa4trace_buf=targs)


def merged_vocab(vocabs):
    """One vocabulary for launches decoded with several (a pass build numbers its events
    itself): the first, plus any event of the others it lacks by name, under a free id."""
    vocabs = [v for v in vocabs if v is not None]
    if not vocabs:
        return None
    out = vocabs[0].copy()
    for v in vocabs[1:]:
        for e in v.events:
            try:
                out.event(e.name)
                continue
            except KeyError:
                pass
            used = {x.id for x in out.events}
            free = next((i for i in range(MAX_EVENT_ID - 1, 0, -1) if i not in used), None)
            if free is None:
                continue
            d = asdict(e)
            d.pop("name"), d.pop("id")
            out.register(e.name, free, **d)
    return out


@dataclass(frozen=True)
class RecordOptions:
    """What each call of an instrumented kernel records and runs: ``sampling`` (who records:
    ``fa4trace.format.options.Sampling``; a launch's grid is known only when it runs, so
    unless the sampling names a count the first ``UNKNOWN_GRID_CTAS`` CTAs record), ``check``
    (the plain build runs beside it and the outputs must agree), ``passes`` (lighter recordings
    each call replays: ``passes_asked``), ``pass_launches`` (how many times each pass replays
    the call: a pass's figures are taken over all its launches together, more samples per
    figure), ``twin`` (with check: time the plain twin once per shape
    of the arguments) and ``flush_l2`` (``flushes``)."""

    sampling: Sampling = Sampling()
    check: bool = True
    passes: tuple = ()
    twin: bool = True
    flush_l2: bool | None = None  # L2 flushed right before each launch; None: where passes replay it
    pass_launches: int = 1

    def __post_init__(self):
        n = self.pass_launches
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PASS_LAUNCHES:
            raise ValueError(f"pass_launches must be a whole number from 1 to {MAX_PASS_LAUNCHES}; got {n!r}")
        if n > 1 and not self.passes:
            raise ValueError("pass_launches goes with passes (the launches of each pass)")

    def flushes(self, replay: bool) -> bool:
        """Whether a call's launches start from a flushed L2 (``fa4trace.run.l2``): asked, or
        by default where passes replay the launch (they and the main recording then compare
        like with like)."""
        return replay if self.flush_l2 is None else bool(self.flush_l2)

    def spec(self, warps_per_cta: int) -> L.BufferSpec:
        """The buffer of one launch of ``warps_per_cta`` warps per CTA."""
        return self.sampling.spec(warps_per_cta)


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


def _sync() -> None:
    import torch

    torch.cuda.synchronize()


@dataclass
class LaunchRecord:
    """One launch a bundle will hold: its buffer and spec, the vocabulary to decode it with,
    what its entry of the bundle's launches says (host times, device, pass, call) and its plain-twin
    entry (a timing, or why none)."""

    buf: Any
    spec: L.BufferSpec
    vocab: Any
    info: dict
    twin: dict = field(default_factory=dict)


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
        # the launches so far; their host times / device / CUDA symbols let fa4trace.profiler
        # match a launch to its kernel in a torch.profiler trace
        self._launches: list[LaunchRecord] = []
        self.checked: list[bool] = []
        self.nondeterministic: set[str] = set()
        self.twins: dict[tuple, dict] = {}  # shape signature -> the plain twin timed for it (or why not)
        self.calls = 0  # calls traced since the last trace(): each launch says which it belongs to
        self.pass_builds: dict[str, Any] = {}  # pass -> its CompiledTraced, or why it has none (str)
        self.not_traced = ""  # why this kernel runs plain inside the block ('' while it traces)
        self.active = True
        self.launched_ok = False  # a traced launch ran eagerly: its build is known to launch
        self.captured_plain = 0  # launches captured into a CUDA graph before that: they ran plain

    @property
    def info(self) -> InstrumentMeta:
        """What the compile found (``meta``, the bundle's ``instrument`` to be), as typed fields."""
        return InstrumentMeta.from_meta(self.meta)

    @property
    def name(self) -> str:
        """The kernel's name, for the lines it prints."""
        return str(self.info.kernel or "kernel")

    @property
    def warps_per_cta(self) -> int:
        w = self.info.warps_per_cta
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
        replay = bool(self.options.passes) and not capturing and self._recompile is not None
        oc = None
        if check or replay:
            oc = OutputCheck(named_tensors(args, kwargs, self.info.params or []), _sync)
        if check:
            self._plain_twice(args, kwargs, oc)
        spec = self.options.spec(self.warps_per_cta)
        buf = new_trace_tensor(spec)  # device operations only: capturable
        scratch = l2.scratch() if self.options.flushes(replay) and not capturing else None
        flushed = {} if scratch is None else {"l2": l2.flush(scratch)}
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
        info = dict(host, call=self.calls, **({"pass": DENSE} if self.options.passes else {}), **flushed)
        rec = LaunchRecord(buf, spec, self.vocab, info, _untimed(
            "captured into a CUDA graph: not checked or timed" if capturing else
            "check=False: nothing but the traced launch ran" if not self.options.check else
            "no plain build to time it against" if self.plain is None else
            "the plain twin is not timed (RecordOptions.twin=False)"))
        self.calls += 1
        if check:
            _sync()
            self._compare(oc)
        self._launches.append(rec)
        if oc is not None:
            after = oc.snapshot()  # what this call leaves in memory, whatever runs next
            try:
                # the passes first, right after the dense launch: the twin's second of back-to-back
                # launches can leave the GPU at a lower clock, and every figure of a pass run then
                # would be longer by the same factor than the dense launch's
                if replay:
                    self._run_passes(args, kwargs, spec, oc, info["call"], scratch)
                if check and self.options.twin:
                    rec.twin = self._twin(args, kwargs, spec)
            finally:
                oc.put_back(after)
        return ret

    def _plain_twice(self, args, kwargs, oc: OutputCheck) -> None:
        """Run the plain kernel twice from the same memory (``OutputCheck.plain_twice``).
        Arguments whose memory two plain runs leave different (atomics, races) are named
        non-deterministic."""
        oc.plain_twice(lambda i: self.plain(*args, **kwargs))
        self.nondeterministic |= oc.nondeterministic

    def _twin(self, args, kwargs, spec: L.BufferSpec) -> dict:
        """The plain twin of this shape of the arguments (module doc), timed at its first call;
        a timing that fails says why in the bundle and in one line, and never reaches the
        program."""
        sig = shape_signature(args, kwargs)
        if sig not in self.twins:
            try:
                self.twins[sig] = self._time_twin(args, kwargs, spec)
            except Exception as exc:  # noqa: BLE001 (timing is fa4trace's business, not the program's)
                why = _launch_failure(exc)
                self.twins[sig] = _untimed(f"the timing failed: {why}")
                if sum(1 for t in self.twins.values() if t.get("method") is None) == 1:
                    print(f"fa4trace: {self.name}: its plain twin could not be timed "
                          f"({why}); the bundle says so", file=sys.stderr)
        return dict(self.twins[sig])

    def _time_twin(self, args, kwargs, spec: L.BufferSpec) -> dict:
        """``twin_times`` of the plain build and the traced one (into a scratch buffer of the
        same spec) on this call's arguments."""
        from ..run.timing import twin_times

        fn, plain = self.fn, self.plain
        targs = self.to_arg(new_trace_tensor(spec))

        def plain_once():
            a, kw = on_current_stream(args, kwargs)
            plain(*a, **kw)

        def traced_once():
            a, kw = on_current_stream(args, kwargs)
            call_traced(fn, a, kw, targs)

        return twin_times(plain_once, traced_once)

    def _run_passes(self, args, kwargs, spec: L.BufferSpec, oc: OutputCheck, call: int, scratch=None) -> None:
        """Replay this call's launch ``pass_launches`` times per pass (module doc), each into its
        own buffer; ``scratch`` (``fa4trace.run.l2``): L2 is flushed right before each, after
        the memory is put back."""
        plan, _skipped = pass_plan(self.meta, self.options.passes)
        for name, families, spans in plan:
            for _ in range(self.options.pass_launches):
                if not self._replay_pass(name, families, spans, args, kwargs, spec, oc, call, scratch):
                    break

    def _replay_pass(self, name, families, spans, args, kwargs, spec, oc, call, scratch) -> bool:
        """One launch of pass ``name`` into a buffer of its own; False where the pass has no
        build or did not launch (then it is left out, said once)."""
        import torch

        build = self._pass_build(name, families, spans)
        if build is None:
            return False
        buf = new_trace_tensor(spec)
        host = {"host_launch_ns": time.time_ns()}
        flushed: dict = {}

        def launch():
            if scratch is not None:
                flushed["l2"] = l2.flush(scratch)
            call_traced(build.fn, args, kwargs, self.to_arg(buf))

        try:
            differ = oc.rerun(launch)
        except Exception as exc:  # noqa: BLE001 (the DSL and tvm-ffi raise their own types)
            self._pass_refused(name, f"did not launch: {_launch_failure(exc)}")
            return False
        host.update(host_return_ns=time.time_ns(), device=torch.cuda.current_device(),
                    cuda_symbols=_symbols(build.fn))
        if differ:
            print(f"fa4trace: {self.name}: pass {name}'s {', '.join(differ)} differ from "
                  "the plain kernel's (bitwise); the plain result is kept; please report this kernel",
                  file=sys.stderr)
        self._launches.append(LaunchRecord(buf, spec, build.vocab, dict(
            host, call=call, **{"pass": name}, checked=(not differ) if oc.want else None, **flushed),
            _untimed("a pass launch: only the main recording's plain twin is timed")))
        return True

    def _pass_build(self, name: str, families: tuple, spans):
        """The traced build of pass ``name`` (compiled at its first use, with the main build's
        cursor), or None where it could not be had (said once, and in the bundle)."""
        b = self.pass_builds.get(name)
        if b is None and self._recompile is not None:
            try:
                b = self._recompile(self.info.cursor or "smem", families=families, spans=spans)
            except Exception as exc:  # noqa: BLE001 (a compile error is the pass's, never the program's)
                b = self._pass_refused(name, f"did not compile: {_launch_failure(exc)}")
            self.pass_builds[name] = b
        return None if b is None or isinstance(b, str) else b

    def _pass_refused(self, name: str, why: str) -> str:
        self.pass_builds[name] = why
        print(f"fa4trace: {self.name}: pass {name} {why}; it is left out", file=sys.stderr)
        return why

    def _compare(self, oc: OutputCheck) -> None:
        """Traced outputs against the plain ones where plain is reproducible. A difference is
        fa4trace's bug, not the program's: the plain result is put back and one line says so."""
        differ = oc.compare()
        self.checked.append(not differ)
        if differ and self.checked.count(False) == 1:
            print(f"fa4trace: {self.name}: the traced kernel's {', '.join(differ)} "
                  "differ from the plain kernel's (bitwise; plain is reproducible there): the plain result "
                  "is kept and the trace marked unchecked; please report this kernel", file=sys.stderr)

    def _launch(self, args, kwargs, buf):
        """The traced launch; a launch the GPU refuses (shared memory, registers) is compiled
        again with the recorder's cursor (and, from a ring build, its records) in global memory,
        and if that is refused too the plain kernel runs and one line says why (the program
        never fails for being traced)."""
        targs = self.to_arg(buf)
        try:
            return call_traced(self.fn, args, kwargs, targs)
        except Exception as exc:  # noqa: BLE001 (the DSL and tvm-ffi raise their own types)
            first = _launch_failure(exc)
        was = self.info.cursor
        if self._recompile is not None and was in SHARED_MEMORY_CURSORS:
            try:
                c = self._recompile("gmem")
            except Exception as exc:  # noqa: BLE001 (a compile that fails must not fail the program)
                c, first = None, f"{first}; its global-memory build did not compile: {_launch_failure(exc)}"
        else:
            c = None
        if c is not None:
            self.fn, self.vocab = c.fn, c.vocab
            for k in ("ring", "ring_cta_warps", "ring_smem_bytes"):  # a ring build's: gone with it
                self.meta.pop(k, None)
            reason = f"the {SHARED_MEMORY_CURSORS[was]} did not launch: {first}"
            self.meta.update(c.meta, cursor="gmem", cursor_reason=reason)
            try:
                ret = call_traced(self.fn, args, kwargs, targs)
            except Exception as exc:  # noqa: BLE001
                first = _launch_failure(exc)
            else:
                print(f"fa4trace: {self.name}: {reason}; recorded with the cursor in "
                      "global memory instead", file=sys.stderr)
                return ret
        self.not_traced = first
        print(f"fa4trace: {self.name} runs untraced: its traced build did not launch "
              f"({first})", file=sys.stderr)
        if self.plain is None:
            raise Fa4traceError(f"{self.name}: the traced kernel did not launch ({first}) "
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
        decoded = [decode_buffer(r.buf.cpu().numpy(), launch_index=i, vocab=r.vocab)
                   for i, r in enumerate(self._launches)]
        launches = [{"kernel": self.info.kernel, "recorded_ctas": r.spec.recorded_ctas,
                     "warp_subset": r.spec.warp_subset, **r.info} for r in self._launches]
        instrument = dict(self.meta, checked=list(self.checked), nondeterministic=sorted(self.nondeterministic),
                          plain_twin=[dict(r.twin, launch=i) for i, r in enumerate(self._launches)])
        if self.options.passes:
            instrument.update(self.passes_meta())
        meta = {"kernel": self.name, "config": dict(config or {}),
                "gpu": gpu_facts(), "launches": launches, "instrument": instrument,
                "cta_subset": True, "warp_subset": launches[0]["warp_subset"]}
        meta.update(rank_meta())  # which process of a distributed program recorded it
        vocab = merged_vocab([r.vocab for r in self._launches])
        self._launches = []
        self.calls = 0
        return Trace.from_launches(decoded, meta, **({"vocab": vocab} if vocab is not None else {}))

    def passes_meta(self) -> dict:
        """What the bundle's ``instrument`` says of the passes: ``passes`` (the main recording
        and each pass that ran: its families, spans and launches per call) and
        ``passes_skipped`` ({pass: why})."""
        plan, skipped = pass_plan(self.meta, self.options.passes)
        info = self.info
        spans = list(info.spans or [])
        ran = [{"pass": DENSE, "families": list(info.families or []), "spans": spans, "launches": 1}]
        for name, families, sp in plan:
            b = self.pass_builds.get(name)
            if isinstance(b, str):
                skipped[name] = b
            elif b is None:
                skipped[name] = "its build was never made (no compile at hand: an AOT build)"
            else:
                ran.append({"pass": name, "families": list(families), "spans": spans if sp is None else [],
                            "launches": self.options.pass_launches})
        return {"passes": ran, "passes_skipped": skipped}


def _untimed(why: str) -> dict:
    """A plain-twin entry that holds no timing, and why."""
    return {"method": None, "reason": why}
