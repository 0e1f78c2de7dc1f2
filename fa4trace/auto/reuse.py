"""Traced builds kept for the process, so that a later capture window (or a later
``instrument()`` block with the same options) compiles nothing again.

When a window closes, each cache entry the window took out tells what the library made of
it: the program's kernel ``k`` and the ``Instrumented`` the library compiled in its place,
a plan and the plan made again around the Instrumented, a plain build put back into a
cache and the Instrumented it was compiled beside. The next window puts the Instrumented
(or the plan) in place of the program's entry instead of taking the entry out: the library
finds it, no compile. Kept per set of options (``key``): a build traced with other families
or another cursor is another build.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Optional


class TracedBuilds:
    """kernel -> its Instrumented, plan -> the plan around its Instrumented (and those
    Instrumented), for one set of options."""

    def __init__(self):
        self._kernels: dict[int, tuple[Any, Any]] = {}  # id(kernel) -> (weak ref or kernel, Instrumented)
        self._plans: dict[int, tuple[Any, Any, tuple]] = {}  # id(plan) -> (plan, its traced twin, Instrumented in it)
        self._lock = threading.Lock()

    def learn(self, kernel, traced) -> None:
        """``traced`` (an Instrumented) stands for ``kernel`` in the next windows. Held weakly
        where the kernel takes weak references: when it goes, so does its traced build."""
        key = id(kernel)
        try:
            ref = weakref.ref(kernel, lambda _r, key=key: self._drop(key))
        except TypeError:  # a tvm_ffi.Function loaded from an object file: kept while this is
            ref = kernel
        with self._lock:
            self._kernels[key] = (ref, traced)

    def learn_plan(self, plan, twin, traced: tuple) -> None:
        """``twin`` (the plan the library made again around ``traced``) stands for ``plan``."""
        with self._lock:
            self._plans[id(plan)] = (plan, twin, tuple(traced))

    def holds(self, traced) -> bool:
        """``traced`` is kept here (a later window may run it again)."""
        with self._lock:
            return (any(e[1] is traced for e in self._kernels.values())
                    or any(traced in e[2] for e in self._plans.values()))

    def traced(self, kernel) -> Optional[Any]:
        """The Instrumented kept for ``kernel``, or None."""
        e = self._kernels.get(id(kernel))
        if e is None:
            return None
        held = e[0]() if isinstance(e[0], weakref.ref) else e[0]
        return e[1] if held is kernel else None

    def plan(self, plan) -> Optional[tuple]:
        """(the plan's traced twin, the Instrumented in it) kept for ``plan``, or None."""
        e = self._plans.get(id(plan))
        return (e[1], e[2]) if e is not None and e[0] is plan else None

    def _drop(self, key: int, _ref=weakref.ref) -> None:  # _ref: still there at interpreter exit
        with self._lock:
            e = self._kernels.get(key)
            if e is not None and isinstance(e[0], _ref) and e[0]() is None:
                del self._kernels[key]

    def __len__(self) -> int:
        return len(self._kernels) + len(self._plans)


_BY_OPTIONS: dict[str, TracedBuilds] = {}


def builds(key: str) -> TracedBuilds:
    """The traced builds kept for the options ``key`` (``instrument``'s, as a string)."""
    return _BY_OPTIONS.setdefault(key, TracedBuilds())
