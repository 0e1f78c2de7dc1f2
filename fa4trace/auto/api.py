"""``fa4trace.instrument``: per-warp timelines of any CuTe DSL kernel, without editing it.

    with fa4trace.instrument() as recording:       # around the program's own code
        loss = model(x).sum(); loss.backward()      # FA4, quack, any CuTe DSL kernel in it
    recording.save("step.parquet")                  # one bundle per kernel that ran traced

Inside the block ``cute.compile`` (under every name, on every thread: ``fa4trace.auto.block``)
compiles with automatic events (``fa4trace.auto.compiler``) and returns an ``Instrumented``
callable that takes the same arguments as the plain compiled function; kernels compiled
before the block are taken out of their caches so that they compile again
(``fa4trace.auto.reach``, the caches known through ``fa4trace.auto.registry``). With a
``schedule`` only the active steps of a long run trace, and a traced build is compiled once
per process (``fa4trace.auto.schedule``, ``fa4trace.auto.reuse``). Everything is put back
when the block ends, and the program runs its plain kernels again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import weakref
from pathlib import Path
from typing import Callable, Optional

from ..format.errors import Fa4traceError
from ..format.options import Placement, Sampling, options
from ..trace.ranks import rank_path
from .block import Block
from .reach import own
from .reuse import builds
from .run import Instrumented, RecordOptions, passes_asked


class Recording:
    """What one ``instrument`` block traced: ``kernels``, its Instrumented (those compiled in
    it in compile order, and the traced builds kept from an earlier block with the same
    options that its windows put back in the program's caches). ``placement``: how every
    kernel of the block is compiled traced; ``options``: what each call runs and records."""

    def __init__(self, *, placement: Placement, options: RecordOptions, kernels=(), roles=None,
                 warps_per_cta: Optional[int] = None):
        self.placement = placement
        self.extra_kernels = tuple(kernels)
        self.roles = dict(roles) if roles else None
        self.options = options
        self.warps_per_cta = warps_per_cta
        self.kernels: list[Instrumented] = []
        self.unreached: dict[str, int] = {}  # kernel calls inside the block fa4trace could not trace
        self.hidden = 0  # cache entries taken out or replaced by a traced build when the last window opened
        self.tracing = False  # an active step: kernels run traced
        self.windows = 0  # capture windows closed that had active steps
        self.ignored: set[int] = set()  # ids of host code compiled in the block (its calls are not counted)
        self.untraced: dict[str, str] = {}  # kernels whose traced build did not compile: why (they ran plain)
        self._block: Optional[Block] = None

    def compile(self, real_compile, fn, *args, **kwargs):
        """``cute.compile`` inside the block: an Instrumented kernel, or the plain compile for
        a jit function that launches no kernel (host code the DSL compiles, such as CUTLASS's
        ``HardwareInfo`` queries): nothing to trace there."""
        from .compiler import find_kernels

        if not find_kernels(fn, self.extra_kernels):
            compiled = real_compile(fn, *args, **kwargs)
            self.ignored.add(id(compiled))
            return compiled
        try:
            c = _compile_traced(self._settings(), real_compile, fn, args, kwargs)
        except Fa4traceError:
            raise  # the user's own options (an unknown span target...): their one line
        except Exception as exc:  # noqa: BLE001 (the program must not fail because it is traced)
            name = getattr(fn, "__qualname__", None) or type(fn).__name__
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            print(f"fa4trace: {name} runs untraced: its traced build did not compile ({first})", file=sys.stderr)
            self.untraced[name] = first
            return real_compile(fn, *args, **kwargs)
        meta = dict(c.meta, roles=self.roles, params=c.params)
        if self.warps_per_cta:
            meta["warps_per_cta"] = int(self.warps_per_cta)
        tvm_ffi = "enable-tvm-ffi" in str(kwargs.get("options", "")) or "enable-tvm-ffi" in str(
            getattr(real_compile, "compile_options", ""))
        settings = self._settings()
        def recompile(cursor, **kw):
            return _locked_compile(settings, real_compile, fn, args, kwargs, cursor, check=False, **kw)

        k = Instrumented(c.fn, c.vocab, meta, plain=c.plain, options=self.options,
                         to_arg=(lambda t: t) if tvm_ffi else _from_dlpack, recompile=recompile, own=own)
        _RECOMPILE[k] = recompile
        k.compiled = c
        k.active = self.tracing  # a warm-up step compiles it; the active steps run it traced
        self.kernels.append(k)
        return k

    @staticmethod
    def kept_build(k: Instrumented) -> Callable[[], Instrumented]:
        """What makes another Instrumented around ``k``'s builds, for a later block
        (``fa4trace.auto.reuse``): it holds the builds, nothing ``k`` launched."""
        fn, vocab, meta, plain, options, to_arg = k.fn, k.vocab, dict(k.meta), k.plain, k.options, k.to_arg
        compiled, passes, launched_ok = k.compiled, dict(k.pass_builds), k.launched_ok
        recompile = _RECOMPILE.get(k)

        def make() -> Instrumented:
            # a build known to launch eagerly stays known (it may go into a CUDA graph); one that
            # did not launch is tried again (what refused it may have been passing)
            new = Instrumented(fn, vocab, meta, plain=plain, options=options, to_arg=to_arg, recompile=recompile,
                               own=own)
            new.compiled, new.pass_builds, new.launched_ok = compiled, dict(passes), launched_ok
            if recompile is not None:
                _RECOMPILE[new] = recompile
            return new

        return make

    def _settings(self) -> tuple:
        """What a traced compile of this block takes (a recompile holds this, not the recording)."""
        return (self.placement, self.extra_kernels)

    def step(self) -> None:
        """The step just run has ended: the block moves to the next step of its ``schedule``
        (the torch.profiler.profile it follows steps it by itself)."""
        if self._block is None:
            raise Fa4traceError("recording.step(): this recording's instrument() block has not started")
        self._block.step()

    @property
    def step_num(self) -> int:
        """The step the block is at (counted from 0, as torch.profiler counts)."""
        return self._block.steps.number if self._block is not None else 0

    @property
    def launched(self) -> list[Instrumented]:
        """The kernels compiled in the block that ran traced at least once."""
        return [k for k in self.kernels if k.launched]

    def trace(self, index: int = -1, **kw):
        """The bundle of the ``index``-th compiled kernel's launches (default: the last)."""
        if not self.kernels:
            why = (f"; {sum(self.unreached.values())} kernel call(s) ran from a cache fa4trace could not reach"
                   if self.unreached else "")
            raise Fa4traceError(f"nothing was compiled inside fa4trace.instrument(){why}")
        return self.kernels[index].trace(**kw)

    def traces(self, **kw) -> list:
        """One bundle per kernel that ran traced in the block (in compile order)."""
        return [k.trace(**kw) for k in self.launched]

    def save(self, path, *, overwrite: bool = False) -> list[Path]:
        """Write ``traces()``: one kernel to ``path``, several to ``path``'s stem + ``_<kernel>``
        (checked for existing files before anything is written, unless ``overwrite``). In a
        distributed program the name says the rank (``fa4trace.trace.ranks.rank_path``)."""
        path = rank_path(path)
        kernels = self.launched
        if not kernels:
            raise Fa4traceError("no kernel ran traced inside fa4trace.instrument(): nothing to save")
        names = [_short_name(k.name) for k in kernels]
        if len(kernels) == 1:
            paths = [path]
        else:
            seen: dict[str, int] = {}
            paths = []
            for n in names:
                seen[n] = seen.get(n, 0) + 1
                tag = n if seen[n] == 1 else f"{n}_{seen[n]}"
                paths.append(path.with_name(f"{path.stem}_{tag}{path.suffix or '.parquet'}"))
        if not overwrite:
            there = [p for p in paths if p.exists()]
            if there:
                raise Fa4traceError(f"{there[0]} exists (pass overwrite=True to replace it)")
        return [k.trace().save(p, overwrite=overwrite) for k, p in zip(kernels, paths)]


def _short_name(kernel: str) -> str:
    """A kernel's name for a file: the last part of its qualified name that is not a dunder
    (``quack.rmsnorm.RMSNorm.__call__`` -> ``RMSNorm``)."""
    parts = [p for p in kernel.split(".") if p and not (p.startswith("__") and p.endswith("__"))]
    return parts[-1] if parts else "kernel"


def _from_dlpack(t):
    from cutlass.cute.runtime import from_dlpack

    return from_dlpack(t, assumed_align=16)


def _compile_traced(settings: tuple, real_compile, fn, args, kwargs, cursor=None, check=None, families=None,
                    spans=None):
    """The block's traced compile of ``fn``; ``cursor`` / ``families`` / ``spans`` (None: the
    block's placement's) place the recorder elsewhere or record less (a recompile to the
    global-memory cursor, a pass's lighter recording: fa4trace.auto.run)."""
    from .compiler import compile_traced

    placement, extra_kernels = settings
    changes = {k: v for k, v in (("cursor", cursor), ("families", families), ("spans", spans)) if v is not None}
    # the plain build is always compiled beside the traced one: the output check runs it,
    # and once the block has ended the program runs it wherever the Instrumented was kept
    return compile_traced(fn, *args, placement=dataclasses.replace(placement, **changes), kernels=extra_kernels,
                          check=True if check is None else check, compile_fn=real_compile, **kwargs)


_RECOMPILE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # Instrumented -> its recompile


def _locked_compile(*args, **kwargs):
    """A traced compile made while a kernel runs (a recompile, a pass's build): one compile at
    a time in the process, as inside the block (``state.COMPILE_LOCK``)."""
    from .state import COMPILE_LOCK

    with COMPILE_LOCK:
        return _compile_traced(*args, **kwargs)


@contextlib.contextmanager
def instrument(*, sampling: Optional[Sampling] = None, placement: Optional[Placement] = None, kernels=(),
               roles: Optional[dict] = None, check: bool = True, warps_per_cta: Optional[int] = None, caches=(),
               passes=None, schedule=None, on_trace_ready: Optional[Callable] = None, families=None,
               spans: Optional[dict] = None, cursor: Optional[str] = None, ring: Optional[int] = None,
               l2: Optional[str] = None, split: Optional[bool] = None, ctas: Optional[int] = None,
               capacity: Optional[int] = None, cta_stride: Optional[int] = None, warps=None,
               pass_launches: int = 1):
    """Trace every CuTe DSL kernel that runs inside the block, with automatic events.

    Kernels the program compiled before the block (kept in FA4's or quack's caches, or any
    dict named like a cache) are compiled again inside it, traced; ``caches``: more dicts of
    compiled kernels to treat so. After the block the program runs its plain kernels again,
    from the same caches (``fa4trace.auto.reach``). The block covers every thread of the
    process, and one block is open at a time (``fa4trace.auto.block``).

    ``sampling`` (``fa4trace.Sampling``): who records and how much, or its fields as keywords:
    ``ctas`` (default: the first 256 CTAs, counted in cluster order: a sampled CTA brings its
    cluster), ``cta_stride``, ``warps`` (warp indices in the CTA; default all), ``capacity``
    (records per warp, default 4096). ``placement`` (``fa4trace.Placement``): how the recorder
    is compiled in, or its fields as keywords: ``families``, which of pipeline, tma, mma,
    barrier to record (default all; fewer cost less; warp lifetimes always record);
    ``spans``, {"softmax": "module:Class.method", ...}: every call of those functions becomes a
    span of that name (what no generic hook can know); {"step": {"target":
    "module:Class.method", "payload": "n_block"}} also records that integer argument of each
    call as the span's iteration; ``l2``, the record stores' L2 policy, "first" (default:
    records leave L2 before reused data) or "last"; ``split``, CTAs that do not record run a
    copy of the kernel body with no instrumentation in it (default True; a sampled launch
    then slows only the CTAs it records), False compiles one body; ``cursor``, "smem"
    (default), "gmem", or "ring": each warp keeps its last ``ring`` records (a power of two,
    default 128) in shared memory, one shared-memory store per record, and copies them into
    the buffer when it exits; the bundle says how many older records the rings overwrote. A
    kernel whose traced build cannot launch with the shared-memory cursor or ring is compiled
    again with "gmem". An object and its fields as keywords together are refused in one line.

    ``schedule``: trace only some steps of a long run, the block entered once around the
    loop and ``recording.step()`` called at the end of each step:
    ``fa4trace.auto.schedule.schedule(wait=, warmup=, active=, repeat=, skip_first=)`` or
    ``torch.profiler.schedule(...)`` (steps outside the active ones run the plain kernels), or
    a running ``torch.profiler.profile`` (its ``step()`` steps the block; its active steps are
    the traced ones). ``on_trace_ready(recording)``: called when a window's active steps end
    (``recording.save`` there keeps one file per window). A traced build is compiled once per
    process and serves every later window and block with the same options.

    ``kernels``: classes or ``@cute.kernel`` functions to instrument beyond those of the
    compiled entry. ``roles``: {"producer": [8, 9, 10, 11], ...} names warps by index in the
    CTA (else inferred from what they record). ``check``: each launch also runs the plain
    kernel twice and the traced outputs must match it bit for bit where the two plain runs
    agree. ``passes``: True (or names of fa4trace.auto.run.PASSES): each call also replays
    its launch with lighter recordings, lifetimes only, then one family at a time, memory
    restored between them; the bundle holds every pass and fa4trace.analysis.passes takes each
    figure from the lightest that reports it. ``pass_launches``: each pass replays the call that
    many times (1..64; its figures are read over them together: more samples per figure).
    """
    from .compiler import require_dsl

    sampling = options(Sampling, sampling, "fa4trace.instrument", ctas=ctas, capacity=capacity,
                       cta_stride=cta_stride, warps=warps)
    placement = options(Placement, placement, "fa4trace.instrument", families=families, spans=spans, cursor=cursor,
                        ring=ring, l2=l2, split=split)
    require_dsl()
    recording = Recording(placement=placement, kernels=kernels, roles=roles, warps_per_cta=warps_per_cta,
                          options=RecordOptions(sampling, check=check, passes=passes_asked(passes),
                                                pass_launches=pass_launches))
    # how many times a pass replays a call changes no build: not part of the key of the kept builds
    key = repr((recording.placement, recording.extra_kernels, recording.roles,
                dataclasses.replace(recording.options, pass_launches=1), warps_per_cta))
    block = Block(recording, kept=builds(key), make=Recording.kept_build, caches=caches, schedule=schedule,
                  on_trace_ready=on_trace_ready)
    recording._block = block
    try:
        block.open()
        yield recording
    finally:
        block.close()
