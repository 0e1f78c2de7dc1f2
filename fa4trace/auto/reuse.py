"""Traced builds kept for the process, so that a later capture window (or a later
``instrument()`` block with the same options) compiles nothing again.

When a window closes, each cache entry the window took out tells what the library made of
it: the program's kernel ``k`` and the ``Instrumented`` the library compiled in its place,
or a plain build put back into a cache and the Instrumented it was compiled beside. The next
window puts an Instrumented in place of the program's entry instead of taking the entry out:
the library finds it, no compile. Within one block that is the same Instrumented (its
launches add up in the recording); a later block gets a new one around the same builds
(``make``), so what a finished recording launched is never held here: only the compiled
builds are, for as long as the kernel they stand for lives (or for the process, for a
``tvm_ffi.Function`` loaded from an object file, which takes no weak reference). Kept per set
of options (``builds(key)``): a build traced with other families or another cursor is
another build. ``forget()`` lets every kept build go.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Optional


class TracedBuilds:
    """kernel -> its traced build, for one set of options."""

    def __init__(self):
        # id(kernel) -> (weak ref to the kernel or the kernel, weak ref to its Instrumented now, make)
        self._kernels: dict[int, tuple[Any, Any, Callable]] = {}
        self._lock = threading.Lock()

    def learn(self, kernel, traced, make: Callable[[], Any]) -> None:
        """``traced`` (an Instrumented) stands for ``kernel`` from the next window on;
        ``make()`` gives another around the same builds for another block."""
        key = id(kernel)
        try:
            ref = weakref.ref(kernel, lambda _r, key=key: self._drop(key))
        except TypeError:  # a tvm_ffi.Function loaded from an object file
            ref = kernel
        with self._lock:
            self._kernels[key] = (ref, weakref.ref(traced), make)

    def traced(self, kernel, mine: list) -> Optional[Any]:
        """The Instrumented that stands for ``kernel`` in a block whose kernels are ``mine``:
        the one it already has, else a new one around the kept builds; None if none is kept."""
        with self._lock:
            e = self._kernels.get(id(kernel))
            if e is None:
                return None
            held = e[0]() if isinstance(e[0], weakref.ref) else e[0]
            if held is not kernel:
                return None
            now = e[1]()
            if now is not None and any(now is k for k in mine):
                return now
            fresh = e[2]()
            self._kernels[id(kernel)] = (e[0], weakref.ref(fresh), e[2])
            return fresh

    def _drop(self, key: int, _ref=weakref.ref) -> None:  # _ref: still there at interpreter exit
        with self._lock:
            e = self._kernels.get(key)
            if e is not None and isinstance(e[0], _ref) and e[0]() is None:
                del self._kernels[key]

    def __len__(self) -> int:
        return len(self._kernels)


_BY_OPTIONS: dict[str, TracedBuilds] = {}


def builds(key: str) -> TracedBuilds:
    """The traced builds kept for the options ``key`` (``instrument``'s, as a string)."""
    return _BY_OPTIONS.setdefault(key, TracedBuilds())


def forget() -> int:
    """Let every kept traced build go (the next window compiles again); how many there were."""
    n = sum(len(b) for b in _BY_OPTIONS.values())
    _BY_OPTIONS.clear()
    return n
