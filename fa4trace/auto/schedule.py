"""Which steps of a long run ``instrument()`` traces: torch.profiler's schedule, for a block
entered once around the whole loop (``instrument(schedule=...)`` and ``recording.step()``).

    sched = fa4trace.auto.schedule.schedule(wait=1, warmup=1, active=2, repeat=1)

Steps count from 0, as in ``torch.profiler.schedule``: the first ``skip_first`` steps, then
cycles of ``wait`` steps that run the program's plain kernels, ``warmup`` steps that get the
traced builds ready (the caches miss and the libraries compile them, but every kernel still
runs plain) and ``active`` steps that run traced; ``repeat`` cycles (0: for as long as the
block runs). ``torch.profiler.schedule(...)`` itself is taken too (its actions by name), and so
is a running ``torch.profiler.profile``: its ``step()`` then steps the block (``Steps``).
"""

from __future__ import annotations

import enum
from typing import Callable

from ..format.errors import Fa4traceError


class Action(enum.Enum):
    """What a step does (torch.profiler's ``ProfilerAction`` names)."""

    NONE = "none"  # plain kernels, at plain speed: nothing of fa4trace in the caches
    WARMUP = "warmup"  # traced builds made ready, kernels run plain
    RECORD = "record"  # kernels run traced
    RECORD_AND_SAVE = "record_and_save"  # the last traced step of a window: it closes after it


def schedule(*, wait: int, warmup: int, active: int, repeat: int = 0, skip_first: int = 0) -> Callable[[int], Action]:
    """step -> Action, as ``torch.profiler.schedule(wait=, warmup=, active=, repeat=, skip_first=)``."""
    for name, v, low in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1), ("repeat", repeat, 0),
                         ("skip_first", skip_first, 0)):
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise Fa4traceError(f"schedule: {name} must be an integer >= {low}, got {v!r}")
    cycle = wait + warmup + active

    def action(step: int) -> Action:
        if step < skip_first:
            return Action.NONE
        step -= skip_first
        if repeat > 0 and step >= repeat * cycle:
            return Action.NONE
        at = step % cycle
        if at < wait:
            return Action.NONE
        if at < wait + warmup:
            return Action.WARMUP
        return Action.RECORD if at < cycle - 1 else Action.RECORD_AND_SAVE

    action.cycle = cycle
    return action


def as_action(x) -> Action:
    """An Action from ours or torch's ProfilerAction (by name; DEVICE_STOPPED, torch's "the
    device stopped collecting inside a cycle", counts as RECORD)."""
    if isinstance(x, Action):
        return x
    name = getattr(x, "name", None)
    if name == "DEVICE_STOPPED":
        return Action.RECORD
    try:
        return Action[name]
    except KeyError:
        raise Fa4traceError(f"a schedule returned {x!r}: expected one of "
                            f"{', '.join(a.name for a in Action)} (fa4trace.auto.schedule.Action or "
                            "torch.profiler.ProfilerAction)") from None


def is_profile(x) -> bool:
    """``x`` is a torch.profiler.profile (its schedule and step count are followed)."""
    return callable(getattr(x, "step", None)) and callable(getattr(x, "schedule", None)) and hasattr(x, "step_num")


class Steps:
    """The step a block is at and what it does: every step RECORD (no schedule), a schedule's
    (``advance`` moves on), or a running torch.profiler.profile's (its own step count)."""

    def __init__(self, schedule=None):
        self.profile = schedule if schedule is not None and is_profile(schedule) else None
        if schedule is not None and self.profile is None and not callable(schedule):
            raise Fa4traceError(f"schedule must be fa4trace.auto.schedule.schedule(...), torch.profiler.schedule(...) "
                                f"or a running torch.profiler.profile, got {type(schedule).__name__}")
        self._fn = schedule if self.profile is None else None
        self.scheduled = schedule is not None
        self._n = 0

    @property
    def number(self) -> int:
        return int(self.profile.step_num) if self.profile is not None else self._n

    def action(self) -> Action:
        if self.profile is not None:
            return as_action(self.profile.schedule(self.number))
        return Action.RECORD if self._fn is None else as_action(self._fn(self._n))

    def advance(self) -> None:
        """The next step (a joined profile has already counted it in its own ``step()``)."""
        if self.profile is None:
            self._n += 1
