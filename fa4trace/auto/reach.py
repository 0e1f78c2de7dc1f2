"""Kernels a program compiled before ``instrument()``: traced inside the block, plain after it.

Libraries keep what ``cute.compile`` returned and serve it again without compiling (FA4's
``compile_cache``, quack's ``jit_cache`` and GEMM plans, a user's own dict): inside the block
nothing would be compiled, so nothing traced. ``Reach`` makes every such cache miss for the
length of the block, without knowing the library: it finds, through the garbage collector,
every dict held under a name that says cache (``cache``, ``compile_cache``, ``_plan_cache``...;
``instrument(caches=[d])`` names others) whose entry holds a compiled CuTe DSL function,
directly or inside a plan (a tuple, a list, an object), and takes those entries out. The
library then compiles again, through fa4trace's ``cute.compile``, and keeps an
``Instrumented`` kernel. When the block ends every entry taken out is put back, an
``Instrumented`` a cache got inside the block is replaced by the plain kernel compiled beside
it (a plan around one is dropped), and one kept anywhere else runs that plain kernel from
then on: the program runs exactly the kernels it ran before.

Caches fa4trace cannot reach this way (a dict named otherwise, a compiled function held in an
attribute, a ``functools.lru_cache``, an on-disk cache fa4trace does not know) are counted:
their calls inside the block are seen (``CallSpy``) and reported in one line. The on-disk
caches of quack and FA4 are known: their disk layer is switched off for the block
(``DISK_SWITCHES``, FA4's ``JITPersistentCache``), so they compile in memory and nothing
traced reaches the disk.
"""

from __future__ import annotations

import gc
import sys
import threading
import types
from collections import Counter
from typing import Any, Callable

from .patches import Patches, subclasses

# (module, attribute, value for the block): a library's on-disk kernel cache, switched off
# while the block runs (only where the module is already imported; nothing is imported here)
DISK_SWITCHES = (
    ("quack.cache", "CACHE_ENABLED", False),  # quack.cache.jit.jit_cache reads it on every call
)


def compiled_kinds() -> tuple:
    """The classes of what ``cute.compile`` returns and of what CuTe DSL object files load as."""
    from cutlass.base_dsl.jit_executor import JitCompiledFunction

    kinds = [JitCompiledFunction]
    try:
        from cutlass.cutlass_dsl.cutlass_function import CutlassCallJitCompiledFunction

        kinds.append(CutlassCallJitCompiledFunction)
    except ImportError:
        pass
    try:
        import tvm_ffi

        kinds.append(tvm_ffi.Function)
    except ImportError:
        pass
    return tuple(kinds)


def _names_of(d: dict) -> set[str]:
    """The names under which ``d`` is held: a module global, an object's attribute, a
    function's attribute or closure variable."""
    names = set()
    for r in gc.get_referrers(d):
        if isinstance(r, dict):
            names.update(k for k, v in r.items() if v is d and isinstance(k, str))
        elif isinstance(r, types.CellType):
            for closure in gc.get_referrers(r):
                if not isinstance(closure, tuple):
                    continue
                for f in gc.get_referrers(closure):
                    if isinstance(f, types.FunctionType) and f.__closure__ is closure:
                        names.add(f.__code__.co_freevars[closure.index(r)])
        elif hasattr(r, "__dict__") and not isinstance(r, (type, types.ModuleType)):
            try:
                names.update(k for k, v in vars(r).items() if v is d)
            except TypeError:
                pass
    return names


def is_cache(d: dict) -> bool:
    """A dict a library looks kernels up in before it compiles: held under a name that says
    so (``cache``, ``compile_cache``, ``_jit_cache``...). Other dicts that hold compiled
    kernels (a registry filled once, an object's attributes) are left alone: a missing entry
    there would be an error, not a compile."""
    return any("cache" in n.lower() for n in _names_of(d))


def _container(r) -> bool:
    """A tuple, list or plain object (a plan, a NamedTuple, a dataclass) that may hold a
    compiled kernel on a library's behalf; not a module, class, function or frame."""
    if isinstance(r, (tuple, list)):
        return True
    return (hasattr(r, "__dict__") and not isinstance(r, (type, types.ModuleType, types.FunctionType,
                                                           types.MethodType, types.FrameType)))


def cache_entries(objects: list, named: set, depth: int = 3, skip: tuple = ()) -> list[tuple[dict, Any, Any, bool]]:
    """(cache dict, key, value, direct) of every entry of a cache that holds one of
    ``objects``, directly (``direct``) or inside a plan the cache keeps (a tuple, a list, an
    object holding the kernel; followed up to ``depth`` levels: quack keeps compiled GEMMs in
    plan NamedTuples kept by other plans). A cache: a dict named like one (``is_cache``) or
    named by the user (``named``: ids). ``skip``: objects of the caller's own, never followed."""
    out, seen = [], set()
    ids = {id(o) for o in objects}
    skip_ids = {id(x) for x in skip} | {id(objects)}
    level, level_ids = list(objects), set(ids)
    for step in range(depth):
        if not level:
            break
        refs = [r for r in gc.get_referrers(*level) if id(r) not in skip_ids]
        up = []
        for r in refs:
            if isinstance(r, dict):
                hit = [(k, v) for k, v in r.items() if id(v) in level_ids]
                if hit and (id(r) in named or is_cache(r)):
                    for k, v in hit:
                        if (id(r), k) not in seen:
                            seen.add((id(r), k))
                            out.append((r, k, v, step == 0))
            elif _container(r):
                up.append(r)
        skip_ids.update((id(refs), id(level), id(up)))
        level, level_ids = up, {id(u) for u in up}
    return out


def _persistent_fa4() -> type | None:
    """FA4's ``JITPersistentCache`` (``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``), which loads
    and exports object files on every lookup and store, if FA4 is imported."""
    mod = sys.modules.get("flash_attn.cute.cache_utils")
    return getattr(mod, "JITPersistentCache", None)


class Reach:
    """Takes compiled kernels out of every cache it can reach (``hide``), and puts the
    program's kernels back (``restore``). A cache entry that holds a kernel inside a plan
    (quack keeps its GEMMs in plan NamedTuples) is taken out whole."""

    def __init__(self):
        self.hidden: list[tuple[dict, Any, Any]] = []
        self._named: set[int] = set()  # ids of the dicts the user named as caches
        self._classes: list[tuple[Any, type]] = []
        self._patches = Patches()

    def hide(self, extra: tuple = ()) -> int:
        """Take every cached compiled kernel out of its cache (and out of the dicts in
        ``extra``, the caches a user names); the number taken out."""
        for module, name, value in DISK_SWITCHES:
            mod = sys.modules.get(module)
            if mod is not None and hasattr(mod, name):
                self._patches.set(mod, name, value)
        kinds = compiled_kinds()
        persistent = _persistent_fa4()
        found = []
        for o in gc.get_objects():
            cls = type(o)  # not isinstance: it asks some objects for __class__, and deprecated ones warn
            if issubclass(cls, kinds):
                found.append(o)
            elif persistent is not None and issubclass(cls, persistent):
                # for the block it is its in-memory base class: no object file loaded or written
                self._classes.append((o, type(o)))
                o.__class__ = persistent.__mro__[1]
        self._named = {id(d) for d in extra}
        for d, k, v, _direct in cache_entries(found, self._named, skip=(found,)):
            if k in d and d[k] is v:
                self.hidden.append((d, k, v))
                del d[k]
        return len(self.hidden)

    def restore(self, instrumented: list) -> None:
        """Put back what ``hide`` took out; replace each of ``instrumented`` (kernels compiled
        inside the block) wherever a dict holds it by its plain kernel, or take it out."""
        for d, k, v in self.hidden:
            d[k] = v
        self.hidden = []
        by_id = {id(k): k for k in instrumented}
        for d, key, v, direct in cache_entries(list(instrumented), self._named, skip=(by_id, instrumented)):
            if key not in d or d[key] is not v:
                continue
            kern = by_id.get(id(v)) if direct else None
            if kern is not None and kern.plain is not None:
                d[key] = kern.plain  # a cache compiled inside the block keeps the plain kernel
            else:
                del d[key]  # a plan around a traced kernel: the library plans again, plain
        for o, cls in self._classes:
            o.__class__ = cls
        self._classes = []
        self._patches.restore()


class CallSpy:
    """Counts, by name, the calls of compiled kernels inside the block that fa4trace did not
    compile (they ran from a cache it could not reach), and the object files loaded.

    ``__call__`` of the DSL's compiled-function classes is wrapped for the block; calls made
    by fa4trace itself (``own()``) are not counted."""

    def __init__(self):
        self.calls: Counter = Counter()
        self._own = threading.local()
        self._patches = Patches()
        self._ignored: set[int] = set()

    def ignore(self, compiled) -> None:
        """Calls of ``compiled`` (host code with no kernel in it) are not counted."""
        self._ignored.add(id(compiled))

    def own(self):
        """A context in which compiled kernels called are fa4trace's own (not counted)."""
        spy = self

        class _Own:
            def __enter__(self):
                spy._own.depth = getattr(spy._own, "depth", 0) + 1

            def __exit__(self, *exc):
                spy._own.depth -= 1

        return _Own()

    def _counting(self, real: Callable) -> Callable:
        spy = self

        def call(fn_self, *args, **kwargs):
            if not getattr(spy._own, "depth", 0) and id(fn_self) not in spy._ignored:
                spy.calls[getattr(fn_self, "function_name", None) or type(fn_self).__name__] += 1
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
        self._spy_loads()

    def _spy_loads(self) -> None:
        """Object files loaded inside the block come from an on-disk cache fa4trace does not
        know (the known ones are switched off): each load counts."""
        import cutlass.cute.runtime as rt

        real = rt.load_module
        spy = self

        def load_module(file_path, *args, **kwargs):
            spy.calls[f"object file {file_path}"] += 1
            return real(file_path, *args, **kwargs)

        self._patches.set_everywhere({id(real): (real, load_module)})

    def restore(self) -> None:
        self._patches.restore()

    def report(self) -> str:
        """One line naming what ran from an unreachable cache, or ''."""
        if not self.calls:
            return ""
        n = sum(self.calls.values())
        names = ", ".join(f"{k} ({v})" for k, v in self.calls.most_common(4))
        more = f" and {len(self.calls) - 4} more" if len(self.calls) > 4 else ""
        return (f"fa4trace: {n} kernel call(s) inside instrument() ran from a cache fa4trace could not reach "
                f"and were not traced: {names}{more}")
