"""One ``instrument()`` block: what it changes in the process while it is open, its capture
windows, and how everything is put back, whatever happens inside it.

While the block is open:

* ``cute.compile`` of the whole process (every ``CompileCallable``: ``cute.compile``,
  ``cute.compile[options]``, under any name a module bound it to, before the block or inside
  it) goes through the block: one compile at a time (``state.COMPILE_LOCK``: the hooks of a
  traced compile are process-wide), traced while a capture window is open, plain otherwise.
  The hook is on the class, so nothing is left in any module when the block ends; a bound
  method taken from it inside the block compiles plain once the block has ended.
* A **capture window** (``schedule``; without one the whole block is one window) opens at its
  first warm-up or active step: the caches' kernels are taken out or replaced by their traced
  builds (``reach.Reach``), the disk caches switch to memory and unreachable calls are
  counted; it closes after its last active step and puts every cache back.

Threads: the block is the process's. A kernel another thread compiles while a window is open
is traced into the same recording (its compile waits for the lock), and one it launches runs
as the caches and the window say (traced in active steps, counted if unreachable); the block
ends only after a compile in flight on another thread has finished.

Every change is undone by a step pushed before it is made (``patches.Undo``): the block's
end runs them all, each whatever another raised, then re-raises a KeyboardInterrupt (or
SystemExit) met on the way, or names any other failure in one line.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable, Optional

from ..format.errors import Fa4traceError
from . import registry
from .patches import Patches, Undo
from .reach import CallSpy, Reach, switch_disk_caches, unreached_line
from .reuse import TracedBuilds
from .schedule import Action, Steps
from .state import COMPILE_LOCK

_OPEN: list = [None]  # the block open in this process
_OPEN_LOCK = threading.Lock()


def open_block():
    """The block open in this process, or None."""
    return _OPEN[0]


class PlainCompile:
    """The DSL's own ``cute.compile`` (one ``CompileCallable``), as fa4trace's compiles call it
    while the hook is in: same call, same ``[options]``, its options readable."""

    def __init__(self, call: Callable, compile_callable):
        self._call, self._cc = call, compile_callable

    def __call__(self, *args, **kwargs):
        return self._call(self._cc, *args, **kwargs)

    def __getitem__(self, options):
        return PlainCompile(self._call, self._cc[options])

    @property
    def compile_options(self):
        return getattr(self._cc, "_compile_options", "")


class Block:
    """The process-wide side of one ``instrument()`` block (module doc)."""

    def __init__(self, recording, *, kept: TracedBuilds, make: Callable, caches=(), schedule=None,
                 on_trace_ready: Optional[Callable] = None):
        self.recording = recording
        self.kept = kept  # the traced builds kept for the block's options (fa4trace.auto.reuse)
        self.make = make  # Instrumented -> what makes another around its builds, for a later block
        self.plans: dict = {}  # plans made again around this block's Instrumented, for its next windows
        self.extra = tuple(caches)
        self.steps = Steps(schedule)
        self.on_trace_ready = on_trace_ready
        self.undo = Undo()
        self.live = False  # the hook compiles through this block (False once it has ended)
        self.compiling = False  # a window is open: compiles are traced
        self._window: Optional[tuple] = None  # (Undo, Reach, CallSpy, recorded) of the open window
        self.failures: list = []

    # ---- the block ------------------------------------------------------------------------

    def open(self) -> None:
        with _OPEN_LOCK:
            if _OPEN[0] is not None:
                raise Fa4traceError("fa4trace.instrument() is already open in this process (blocks do not nest, "
                                    "and one block covers every thread)")
            _OPEN[0] = self
        self.undo.push("the open block", self._forget)
        self._hook_compile()
        if self.steps.profile is not None:
            self._join(self.steps.profile)
        self._go(self.steps.action())

    def _forget(self) -> None:
        with _OPEN_LOCK:
            if _OPEN[0] is self:
                _OPEN[0] = None

    def close(self) -> None:
        """End the block: the open window closed, every change undone (module doc), the
        report lines; a KeyboardInterrupt met on the way raised after all of it."""
        saved = False  # whether the window closed here had active steps
        if self._window is not None:
            saved = self._close_window()
        self.failures += self.undo.run()
        self.extra = ()  # the program's dicts are not held past the block
        self._finish_kernels()
        self._report()
        try:
            if saved and self.on_trace_ready is not None:
                self.on_trace_ready(self.recording)
        finally:
            _raise_or_say(self.failures)

    def _hook_compile(self) -> None:
        """``CompileCallable.__call__`` through the block until its end (module doc)."""
        from cutlass.base_dsl.compiler import CompileCallable

        real = vars(CompileCallable)["__call__"]
        block = self

        def __call__(cc, *args, **kwargs):
            if not block.live:
                return real(cc, *args, **kwargs)
            with COMPILE_LOCK:
                if not (block.live and block.compiling and args):
                    return real(cc, *args, **kwargs)
                return block.recording.compile(PlainCompile(real, cc), *args, **kwargs)

        __call__.__wrapped__ = real
        patches = Patches()

        def unhook():
            with COMPILE_LOCK:  # a compile in flight on another thread finishes first
                block.live = False
                block.compiling = False
            patches.restore()

        self.undo.push("cute.compile", unhook)
        self.live = True
        patches.set(CompileCallable, "__call__", __call__)

    def _join(self, profile) -> None:
        """``profile.step()`` steps this block too, until the block ends."""
        real = profile.step
        block = self

        def step(*args, **kwargs):
            was = block.steps.action()
            out = real(*args, **kwargs)
            if block.live:
                block._after(was)
            return out

        patches = Patches()
        self.undo.push("torch.profiler's step", patches.restore)
        patches.set(profile, "step", step)

    # ---- steps and windows ----------------------------------------------------------------

    def step(self) -> None:
        """The step just run has ended (``recording.step()``)."""
        if not self.live:
            raise Fa4traceError("recording.step(): the instrument() block has ended")
        if self.steps.profile is not None:
            raise Fa4traceError("this block follows a torch.profiler.profile: call its step(), which steps both")
        was = self.steps.action()
        self.steps.advance()
        self._after(was)

    def _after(self, was: Action) -> None:
        if was is Action.RECORD_AND_SAVE and self._window is not None:
            self._end_window()
        self._go(self.steps.action())

    def _end_window(self) -> None:
        """Close the open window, hand the recording to ``on_trace_ready`` where it saved
        anything, then raise (or name) what failed while closing."""
        saved = self._close_window()
        try:
            if saved and self.on_trace_ready is not None:
                self.on_trace_ready(self.recording)
        finally:
            _raise_or_say(self._take_failures())

    def _go(self, action: Action) -> None:
        if action is Action.NONE:
            if self._window is not None:
                self._end_window()
            return
        if self._window is None:
            self._open_window()
        record = action in (Action.RECORD, Action.RECORD_AND_SAVE)
        u, reach, spy, recorded = self._window
        self._window = (u, reach, spy, recorded or record)
        self.recording.tracing = record
        spy.counting = record
        for k in self.recording.kernels:
            k.active = record

    def _open_window(self) -> None:
        u, spy, reach = Undo(), CallSpy(self.recording.ignored), Reach(self.kept, self.plans, self.make)
        self._window = (u, reach, spy, False)
        u.push("the kernels' calls watched", lambda: self._keep_counts(spy))
        spy.install()
        switch_disk_caches(u)
        u.push("the program's caches", lambda: reach.restore(self._traced(), registry.caches(self.extra)))
        u.push("the traced kernels", self._kernels_off)
        with COMPILE_LOCK:  # no compile runs while the caches change
            self.recording.hidden = reach.hide(registry.caches(self.extra), self.recording.kernels)
            for k in reach.reused:
                if not any(k is x for x in self.recording.kernels):
                    self.recording.kernels.append(k)
            self.compiling = True

    def _close_window(self) -> bool:
        """Close the open window (its undo steps); whether it had active steps."""
        u, _reach, _spy, recorded = self._window
        with COMPILE_LOCK:  # a traced compile in flight finishes inside the window
            self.compiling = False
        self._window = None
        self.recording.tracing = False
        self.failures += u.run()
        self.recording.windows += 1 if recorded else 0
        return recorded

    def _take_failures(self) -> list:
        out, self.failures = self.failures, []
        return out

    def _kernels_off(self) -> None:
        for k in self.recording.kernels:
            k.active = False

    def _keep_counts(self, spy: CallSpy) -> None:
        try:
            spy.restore()
        finally:
            for name, n in spy.calls.items():
                self.recording.unreached[name] = self.recording.unreached.get(name, 0) + n

    def _traced(self) -> dict:
        return {id(k): k for k in self.recording.kernels}

    def _finish_kernels(self) -> None:
        """Every kernel of the block runs plain from now on (a later block that reuses a
        traced build gets an Instrumented of its own); the plans kept for the windows go."""
        self.plans = {}
        for k in self.recording.kernels:
            k.close()

    def _report(self) -> None:
        line = unreached_line(self.recording.unreached)
        if line:
            print(line, file=sys.stderr)
        plain = sum(k.captured_plain for k in self.recording.kernels)
        if plain:
            print(f"fa4trace: {plain} launch(es) captured into a CUDA graph ran plain: their kernel had not run "
                  "once inside instrument() before the capture (run it once first, as torch.cuda.graph's "
                  "warm-up does)", file=sys.stderr)


def _raise_or_say(failures: list) -> None:
    """A KeyboardInterrupt or SystemExit met while putting things back is raised (after
    everything was put back); any other failure is named in one line, the program goes on."""
    if not failures:
        return
    for _what, exc in failures:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise exc
    what = "; ".join(f"{w}: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                     for w, e in failures[:3])
    more = f" and {len(failures) - 3} more" if len(failures) > 3 else ""
    print(f"fa4trace: instrument() could not put back {len(failures)} thing(s) ({what}{more}); "
          "everything else was put back", file=sys.stderr)
