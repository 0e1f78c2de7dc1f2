"""Kernels a program compiled before a capture window: traced inside it, plain after it.

Libraries keep what ``cute.compile`` returned and serve it again without compiling (FA4's
``compile_cache``, quack's ``jit_cache`` and GEMM plans, a user's own dict): inside the
window nothing would be compiled, so nothing traced. ``Reach`` makes those caches miss for
the length of the window, without knowing the library: the caches are the dicts
``fa4trace.auto.registry`` knows (found where kernels were compiled or loaded, no heap walk),
and only the kernels' own entries move (``fa4trace.auto.plans``: a compiled kernel, or a plan
the library builds again from the key). The library then compiles again, through
fa4trace's ``cute.compile``, and keeps an ``Instrumented`` kernel; a kernel traced in an
earlier window is put in its entry's place instead, so it is not compiled twice
(``fa4trace.auto.reuse``).

When the window closes every cache is as it was: the entries taken out or replaced are put
back in their places (the dict's order as before, so LRU and FIFO caches evict what they
would have), an ``Instrumented`` a cache got inside the window is replaced by the plain
kernel compiled beside it, and a plan around one is dropped (the library plans again,
plain). One kept anywhere else runs that plain kernel from then on.

Calls of kernels fa4trace could not reach (held in an attribute, a list, a model, a
``functools.lru_cache``, a cache it does not know) are counted while the window records
(``CallSpy``) and named in one line. The on-disk caches of quack and FA4 are switched to
memory for the window (``DISK_SWITCHES``, FA4's ``JITPersistentCache``), in a library
imported inside the window too, so nothing traced reaches the disk. A ``tvm_ffi.Function``
loaded from an object file and held outside a cache cannot be counted: its call is C code
with no hook; the load itself is, when it happens inside the window.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from typing import Callable

from . import registry
from .patches import Patches, Undo, subclasses
from .plans import plan_of

# (module, attribute, value for the window): a library's on-disk kernel cache, switched off
# while a window is open (when the module is imported, before the window or inside it)
DISK_SWITCHES = (
    ("quack.cache", "CACHE_ENABLED", False),  # quack.cache.jit.jit_cache reads it on every call
)
FA4_CACHE = "flash_attn.cute.cache_utils"  # JITPersistentCache: object files on every lookup and store

_OWN = threading.local()
_MISSING = object()


class own:
    """A context in which the compiled kernels called are fa4trace's own (not counted), on
    this thread: an Instrumented running its builds."""

    def __enter__(self):
        _OWN.depth = getattr(_OWN, "depth", 0) + 1

    def __exit__(self, *exc):
        _OWN.depth -= 1


def switch_disk_caches(undo: Undo) -> None:
    """quack's and FA4's on-disk caches in memory only until ``undo`` runs, in modules
    imported now or later (until then)."""
    patches = Patches()
    undo.push("the on-disk cache switches", patches.restore)
    for module, name, value in DISK_SWITCHES:
        def switch(mod, name=name, value=value):
            if hasattr(mod, name):
                patches.set(mod, name, value)

        undo.push(f"the import hook of {module}", registry.when_imported(module, switch))

    def fa4(mod):
        persistent, memory = getattr(mod, "JITPersistentCache", None), getattr(mod, "JITCache", None)
        if persistent is None or memory is None:
            return
        for cls in subclasses(persistent):  # every instance, made before the window or in it
            for name in ("__setitem__", "__getitem__", "__contains__"):
                if name in vars(cls):
                    patches.set(cls, name, getattr(memory, name))

    undo.push(f"the import hook of {FA4_CACHE}", registry.when_imported(FA4_CACHE, fa4))


class _Touched:
    """A cache whose entries a window took out or replaced: its order before, and what it held."""

    def __init__(self, d: dict):
        self.d = d
        self.order = list(d)
        self.held: dict = {}  # key -> the program's value (taken out or replaced)


class Reach:
    """One window's hold on the program's caches: ``hide`` at its start, ``restore`` at its end.

    ``kept``: the traced builds kept for the block's options (``reuse.TracedBuilds``);
    ``plans``: the block's plan -> (plan, the plan made again around its Instrumented, those
    Instrumented); ``make(traced)``: what makes another Instrumented around ``traced``'s builds."""

    def __init__(self, kept, plans: dict, make: Callable):
        self.kept, self.plans, self.make = kept, plans, make
        self.touched: list[_Touched] = []
        self.taken = 0  # entries taken out (the library compiles them again)
        self.reused: list = []  # Instrumented put in place of the program's kernels

    def hide(self, caches: list, mine: list) -> int:
        """Take the kernels' own entries out of ``caches``, or put their traced build in their
        place where one is kept (``mine``: the block's Instrumented so far); the number of
        entries moved."""
        is_kernel = registry.is_kernel
        for d in caches:
            try:
                items = list(d.items())
            except RuntimeError:  # another thread changed it while read: once more
                items = list(d.items())
            t = None
            for k, v in items:
                kernel = is_kernel(v)
                if not kernel and not plan_of(v, is_kernel):
                    continue
                if t is None:
                    t = _Touched(d)
                    self.touched.append(t)
                if kernel:
                    traced = self.kept.traced(v, mine)
                    swap, inside = (traced, (traced,)) if traced is not None else (None, ())
                else:
                    got = self.plans.get(id(v))
                    swap, inside = (got[1], got[2]) if got is not None and got[0] is v else (None, ())
                t.held[k] = v  # recorded first: an interrupt after it leaves nothing unknown
                if swap is not None:
                    d[k] = swap
                    self.reused += [x for x in inside if x not in self.reused]
                else:
                    del d[k]
                    self.taken += 1
        return sum(len(t.held) for t in self.touched)

    def restore(self, traced: dict, caches: list) -> None:
        """Every cache as before the window (module doc). ``traced``: id -> the Instrumented
        of this block; ``caches``: every cache known now (some were made inside the window).
        Learns the traced builds the next window reuses. Each cache is put back whatever
        another one raised; the first error is raised after all."""
        def own_traced(x):
            return id(x) in traced and traced[id(x)] is x

        first = None
        done = set()
        for t in self.touched:
            done.add(id(t.d))
            try:
                self._restore_touched(t, own_traced)
            except BaseException as exc:  # noqa: BLE001 (the other caches still go back)
                first = first if first is not None else exc
        self.touched = []
        for d in caches:
            if id(d) in done:
                continue
            try:
                self._clean(d, own_traced)
            except BaseException as exc:  # noqa: BLE001
                first = first if first is not None else exc
        if first is not None:
            raise first

    def _fix(self, v, own_traced):
        """What a value the program's cache got inside the window becomes after it: a traced
        kernel its plain build (kept as that build's traced twin), a plan around one nothing."""
        if own_traced(v):
            if v.plain is None:
                return _MISSING
            self.kept.learn(v.plain, v, self.make(v))
            return v.plain
        return _MISSING if plan_of(v, own_traced) else v

    def _restore_touched(self, t: _Touched, own_traced) -> None:
        try:
            final = self._final(t, own_traced)
        except BaseException:  # the program's entries at least, if not in their places
            for k, v in t.held.items():
                t.d[k] = v
            raise
        _rewrite(t.d, final)

    def _final(self, t: _Touched, own_traced) -> list:
        """(key, value) of ``t``'s cache after the window, in order (module doc)."""
        d = t.d
        now = dict(d.items())
        final = []
        for k in t.order:
            if k in t.held:
                orig, cur = t.held[k], now.get(k, _MISSING)
                if cur is not _MISSING and cur is not orig:
                    if own_traced(cur) and registry.is_kernel(orig):
                        self.kept.learn(orig, cur, self.make(cur))
                    elif not registry.is_kernel(orig) and plan_of(cur, own_traced):
                        self.plans[id(orig)] = (orig, cur, _traced_in(cur, own_traced))
                final.append((k, orig))
            elif k in now:
                v = self._fix(now[k], own_traced)
                if v is not _MISSING:
                    final.append((k, v))
        known = set(t.order)
        for k, v in now.items():
            if k not in known:
                v = self._fix(v, own_traced)
                if v is not _MISSING:
                    final.append((k, v))
        return final

    def _clean(self, d: dict, own_traced) -> None:
        """A cache the window did not take from: its traced kernels become plain, in place."""
        for k, v in list(d.items()):
            fixed = self._fix(v, own_traced)
            if fixed is _MISSING:
                d.pop(k, None)
            elif fixed is not v:
                d[k] = fixed


def _traced_in(plan, own_traced, depth: int = 3) -> tuple:
    """The Instrumented inside ``plan`` (its items, or a record's fields)."""
    from .plans import record_fields

    items = plan if isinstance(plan, tuple) else (record_fields(plan) or [])
    out = []
    for x in items:
        if own_traced(x):
            out.append(x)
        elif depth > 1 and (isinstance(x, tuple) or record_fields(x)):
            out += _traced_in(x, own_traced, depth - 1)
    return tuple(out)


def _rewrite(d: dict, final: list) -> None:
    """``d`` holds ``final`` (key, value) in that order: values set in place where the order of
    the keys is already that, else the dict rebuilt (an OrderedDict and other subclasses
    through their own methods). An interrupt between emptying and filling still fills it."""
    if [k for k, _ in final] == list(d):
        for k, v in final:
            if d[k] is not v:
                d[k] = v
        return
    if type(d) is dict:
        try:
            dict.clear(d)
        finally:
            dict.update(d, final)
        return
    try:
        d.clear()
    finally:
        if isinstance(d, OrderedDict):
            for k, v in final:
                d[k] = v
        else:
            d.update(final)


class CallSpy:
    """Counts, by name, the calls of compiled kernels fa4trace did not compile (they ran from
    a place it could not reach) while ``counting``, and the object files loaded.

    ``__call__`` of the DSL's compiled-function classes is wrapped from ``install`` to
    ``restore``; calls made by fa4trace itself (``own``) are not counted, on any thread."""

    def __init__(self, ignored: set | None = None):
        self.calls: Counter = Counter()
        self.counting = False
        self._patches = Patches()
        self._ignored: set[int] = ignored if ignored is not None else set()  # ids of host code compiled in the block
        self._lock = threading.Lock()
        self._off_loads: Callable = lambda: None

    def ignore(self, compiled) -> None:
        """Calls of ``compiled`` (host code with no kernel in it) are not counted."""
        self._ignored.add(id(compiled))

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] += 1

    def _counting(self, real: Callable) -> Callable:
        spy = self

        def call(fn_self, *args, **kwargs):
            if spy.counting and not getattr(_OWN, "depth", 0) and id(fn_self) not in spy._ignored:
                spy._count(getattr(fn_self, "function_name", None) or type(fn_self).__name__)
            return real(fn_self, *args, **kwargs)

        call.__wrapped__ = real
        return call

    def install(self) -> None:
        from cutlass.base_dsl.jit_executor import JitCompiledFunction

        classes = subclasses(JitCompiledFunction)
        try:
            from cutlass.cutlass_dsl.cutlass_function import CutlassCallJitCompiledFunction

            classes.append(CutlassCallJitCompiledFunction)
        except ImportError:
            pass
        for c in classes:
            if "__call__" in vars(c):
                self._patches.set(c, "__call__", self._counting(vars(c)["__call__"]))

        def loaded(path):
            if self.counting:
                self._count(f"object file {path}")

        self._off_loads = registry.on_load(loaded)

    def restore(self) -> None:
        self.counting = False
        try:
            self._off_loads()
        finally:
            self._patches.restore()


def unreached_line(calls: dict) -> str:
    """One line naming what ran from a place fa4trace could not reach, or ''."""
    if not calls:
        return ""
    n = sum(calls.values())
    top = Counter(calls).most_common()
    names = ", ".join(f"{k} ({v})" for k, v in top[:4])
    more = f" and {len(top) - 4} more" if len(top) > 4 else ""
    return (f"fa4trace: {n} kernel call(s) inside instrument() ran from a cache fa4trace could not reach "
            f"and were not traced: {names}{more} (a dict of kernels: instrument(caches=[it]))")
