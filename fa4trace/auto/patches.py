"""Swap attributes of other people's modules and classes while a kernel compiles, then put
them back exactly as they were.

The CuTe DSL traces Python: a function replaced for the length of a compile is what the
compiled kernel runs, and nothing of the original source is edited or copied. ``Patches`` is
the one place that swaps and restores (the automatic event families and the FA4 hooks use it;
``set_env`` does the same for environment variables).
"""

from __future__ import annotations

import os
import sys
from types import CellType
from typing import Any


class Patches:
    """``set(owner, name, new)`` swaps an attribute; ``restore()`` undoes every swap in reverse."""

    def __init__(self):
        self._saved: list[tuple[Any, str, Any, bool]] = []

    def set(self, owner, name: str, new) -> None:
        if isinstance(owner, CellType):  # a closure variable of a function (name: "cell_contents")
            self._saved.append((owner, name, owner.cell_contents, True))
            owner.cell_contents = new
            return
        had = name in vars(owner)
        self._saved.append((owner, name, vars(owner)[name] if had else None, had))
        setattr(owner, name, new)

    def set_env(self, name: str, value: str) -> None:
        """``os.environ[name] = value`` until ``restore()`` (which unsets it if it was unset)."""
        had = name in os.environ
        self._saved.append((os.environ, name, os.environ.get(name), had))
        os.environ[name] = value

    def set_everywhere(self, swaps: dict) -> None:
        """``swaps``: {id(original): (original, replacement)}. Replace each original under every
        module-level name that holds it (``import x`` and ``from x import f`` alike)."""
        for mod in list(sys.modules.values()):
            d = getattr(mod, "__dict__", None)
            if not isinstance(d, dict):
                continue
            for k, v in list(d.items()):
                hit = swaps.get(id(v))
                if hit is not None and hit[0] is v:
                    self.set(mod, k, hit[1])

    def restore(self) -> None:
        """Undo every swap, last first. One that fails does not stop the others: each is tried,
        then the first failure is raised (a KeyboardInterrupt among them included)."""
        first = None
        while self._saved:
            owner, name, old, had = self._saved.pop()
            try:
                if isinstance(owner, CellType):
                    owner.cell_contents = old
                elif owner is os.environ:
                    if had:
                        os.environ[name] = old
                    else:
                        os.environ.pop(name, None)
                elif had:
                    setattr(owner, name, old)
                else:
                    delattr(owner, name)
            except BaseException as exc:  # noqa: BLE001 (restore the rest, then raise it)
                first = first if first is not None else exc
        if first is not None:
            raise first

    def __bool__(self) -> bool:
        return bool(self._saved)

    def __len__(self) -> int:
        return len(self._saved)


class Undo:
    """Steps that put things back, run last first by ``run``, each whatever the others did: a
    step that raises (a KeyboardInterrupt included) is recorded and the next one runs.

    A step is pushed before the change it undoes is made, so an interrupt between the two
    leaves nothing behind that no step knows about (undoing what was not yet done is a no-op
    for every step fa4trace pushes)."""

    def __init__(self):
        self._steps: list[tuple[str, Any]] = []

    def push(self, what: str, step) -> None:
        """``step()`` undoes one change; ``what`` names it in a failure."""
        self._steps.append((what, step))

    def run(self) -> list[tuple[str, BaseException]]:
        """Run every step, last pushed first; (what, exception) of each that failed."""
        failed = []
        while self._steps:
            what, step = self._steps.pop()
            try:
                step()
            except BaseException as exc:  # noqa: BLE001 (every other step must still run)
                failed.append((what, exc))
        return failed

    def __len__(self) -> int:
        return len(self._steps)


def subclasses(cls) -> list:
    """``cls`` and every class below it, each once (classes a patch must cover: a method
    defined again in a subclass is not reached through the base)."""
    out, todo = [], [cls]
    while todo:
        c = todo.pop()
        if c not in out:
            out.append(c)
            todo.extend(c.__subclasses__())
    return out
