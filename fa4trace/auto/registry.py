"""The compiled kernels of this process and the caches that may hold them, known when an
``instrument()`` block opens without walking the heap.

From ``import fa4trace`` on (``install``), every compiled CuTe DSL function registers as it is
made (``JitCompiledFunction.__init__`` and CUTLASS's call wrapper, wrapped once for the
process) and every object file as it is loaded (``cutlass.runtime.load_module``); at that
moment the frames that asked for it show where it is about to be kept. Where a cache is looked
for (``caches``):

1. in the frames above a compile or a load (the first ``FRAMES`` outside the DSL and
   fa4trace), and in every frame running when ``caches`` is asked (a block's
   window opens): their variables whose name says *cache* (``cache``, ``kernel_cache``), the
   attributes that say so of their other variables (``self._plan_cache``, a function's
   ``compile_cache``), and of an object held under such a name;
2. in every module of quack and FA4 (``LIBRARIES``) and every module such a frame ran in:
   globals whose name says *cache*, and the closure variables and attributes that say so of
   the module's functions, classes and objects (quack's ``jit_cache`` dicts, FA4's
   ``compile_cache`` objects), read again whenever the module's namespace changed size;
3. for kernels compiled before fa4trace was imported: one pass over ``gc.get_objects()`` at
   that import, and at most ``PLAN_DEPTH + 1`` ``gc.get_referrers`` walks for all of them
   together (``sweep_heap``), never again.

A dict found is a cache; an object found (FA4's ``JITCache``) stands for its attributes that
are dicts and say cache. Dicts found in frames are kept until nothing but this registry holds
them; objects are held weakly. ``when_imported`` runs code right after a module's first
import (the hooks above, and the block's switches of a library imported inside it).
"""

from __future__ import annotations

import functools
import gc
import importlib.abc
import sys
import threading
import types
import weakref
from typing import Callable

from .plans import plan_of

LIBRARIES = ("quack", "flash_attn")  # packages whose modules are always searched for caches
FRAMES = 6  # frames above a compile or a load whose variables are looked at
PLAN_DEPTH = 3  # plans inside plans followed (quack keeps GEMM plans in interface plans)
_SKIPPED = ("cutlass", "tvm_ffi", "fa4trace.", "importlib", "contextlib", "functools", "threading")

# the compiled functions made since install (those that take weak references)
KERNELS: "weakref.WeakSet" = weakref.WeakSet()
_LOCK = threading.RLock()
_FOUND: dict[int, object] = {}  # id -> a dict (held) or a weak reference to an object, found in frames or the heap
_WATCHED: set[str] = set()  # modules a compile or load was asked from
_MODULES: dict[int, tuple] = {}  # id(module) -> (module, size of its namespace when read, paths)
_LOADS: list[Callable] = []  # load listeners: f(path)
_INSTALLED = False
_KINDS: tuple = ()


def says_cache(name) -> bool:
    """A name under which a library keeps what it looks up before it compiles."""
    return isinstance(name, str) and "cache" in name.lower()


def is_kernel(v) -> bool:
    """``v`` is a compiled CuTe DSL function (needs cutlass imported)."""
    t = type(v)
    k = _IS_KERNEL.get(t)
    if k is None:
        k = _IS_KERNEL[t] = issubclass(t, compiled_kinds())
    return k


_IS_KERNEL: dict = {}


def compiled_kinds() -> tuple:
    """The classes of what ``cute.compile`` returns and of what CuTe DSL object files load as
    (needs cutlass)."""
    global _KINDS
    if _KINDS:
        return _KINDS
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
    _KINDS = tuple(kinds)
    return _KINDS


# ---- code run right after a module's first import ----------------------------------------

_HOOKS: dict[str, list] = {}


class _ThenRun(importlib.abc.Loader):
    """A module's own loader, then the hooks registered for it."""

    def __init__(self, loader, name: str):
        self._loader, self._name = loader, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        try:
            self._loader.exec_module(module)
        finally:  # the module keeps its own loader
            module.__loader__ = self._loader
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self._loader
        _run_hooks(self._name, module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module with hooks it asks the finders after it and wraps
    the loader they found (``_ThenRun``)."""

    def __init__(self):
        self._busy: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        if name not in _HOOKS or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _ThenRun(spec.loader, name)
        return spec


_FINDER = _AfterImport()


def _run_hooks(name: str, module) -> None:
    with _LOCK:
        hooks = _HOOKS.pop(name, [])
        if not _HOOKS and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
    for hook in hooks:
        try:
            hook(module)
        except Exception as exc:  # noqa: BLE001 (a hook of fa4trace never fails the program's import)
            print(f"fa4trace: after importing {name}: {type(exc).__name__}: {exc}", file=sys.stderr)


def when_imported(name: str, hook: Callable) -> Callable[[], None]:
    """``hook(module)`` now if ``name`` is imported, else right after its first import; returns
    a function that cancels a hook that has not run yet."""
    with _LOCK:
        module = sys.modules.get(name)
        if module is None:
            _HOOKS.setdefault(name, []).append(hook)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
    if module is not None:
        hook(module)
        return lambda: None

    def cancel():
        with _LOCK:
            hooks = _HOOKS.get(name, [])
            if hook in hooks:
                hooks.remove(hook)
            if not hooks:
                _HOOKS.pop(name, None)
            if not _HOOKS and _FINDER in sys.meta_path:
                sys.meta_path.remove(_FINDER)

    return cancel


# ---- registration ---------------------------------------------------------------------------

def install() -> None:
    """Register every compiled kernel from now on (``import fa4trace`` calls it; cutlass is not
    imported here). Kernels that exist already are found once, by ``sweep_heap``."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        _INSTALLED = True
    before = "cutlass.base_dsl.jit_executor" in sys.modules
    when_imported("cutlass.base_dsl.jit_executor", lambda m: _register_made(m.JitCompiledFunction))
    when_imported("cutlass.cutlass_dsl.cutlass_function",
                  lambda m: _register_made(getattr(m, "CutlassCallJitCompiledFunction", None)))
    when_imported("cutlass.runtime", _register_loads)
    when_imported("cutlass.cute.runtime", _register_loads)
    if before:
        try:
            sweep_heap()
        except Exception as exc:  # noqa: BLE001 (never fail `import fa4trace`)
            print(f"fa4trace: the kernels compiled before fa4trace was imported were not looked for "
                  f"({type(exc).__name__}: {exc})", file=sys.stderr)


def installed() -> bool:
    return _INSTALLED


def _register_made(cls) -> None:
    """Wrap ``cls.__init__`` once: each object made registers (``_made``)."""
    real = vars(cls).get("__init__") if cls is not None else None
    if real is None or getattr(real, "__fa4trace_registry__", False):
        return

    @functools.wraps(real)
    def __init__(self, *args, **kwargs):
        real(self, *args, **kwargs)
        _made(self)

    __init__.__fa4trace_registry__ = True
    cls.__init__ = __init__


def _made(obj) -> None:
    try:
        try:
            KERNELS.add(obj)
        except TypeError:
            pass
        _note_frames(sys._getframe(2))
    except Exception:  # noqa: BLE001,S110 (registering never fails a compile)
        pass


def _register_loads(module) -> None:
    """Wrap ``load_module`` of ``module`` (cutlass.runtime, and its re-export in
    cutlass.cute.runtime): a load tells the load listeners and notes its frames."""
    real = vars(module).get("load_module")
    if real is None:
        return
    if getattr(real, "__fa4trace_registry__", False):
        return
    base = sys.modules.get("cutlass.runtime")
    wrapped = vars(base).get("load_module") if base is not None else None
    if module is not base and getattr(wrapped, "__wrapped__", None) is real:
        module.load_module = wrapped  # the re-export of an original already wrapped
        return

    @functools.wraps(real)
    def load_module(*args, **kwargs):
        loaded = real(*args, **kwargs)
        try:
            path = args[0] if args else kwargs.get("file_path")
            for listener in list(_LOADS):
                listener(path)
            _note_frames(sys._getframe(1))
        except Exception:  # noqa: BLE001,S110 (never fail the program's load)
            pass
        return loaded

    load_module.__fa4trace_registry__ = True
    module.load_module = load_module


def on_load(listener: Callable) -> Callable[[], None]:
    """``listener(path)`` at every object file loaded from now on; returns its remover."""
    _LOADS.append(listener)
    return lambda: _LOADS.remove(listener) if listener in _LOADS else None


def _skipped(module_name: str) -> bool:
    return module_name.startswith(_SKIPPED)


def _note_frames(frame) -> None:
    """The first ``FRAMES`` frames above a compile or load outside the DSL and fa4trace: their
    modules are watched, their variables named like a cache kept (``_keep``)."""
    n = 0
    with _LOCK:
        while frame is not None and n < FRAMES:
            name = frame.f_globals.get("__name__", "") or ""
            if not _skipped(name):
                n += 1
                _WATCHED.add(name)
                for var, value in read_locals(frame):
                    if says_cache(var):
                        _keep(value)
                    else:  # self, a function (FA4's fwd.compile_cache), any object
                        for attr, x in _attributes(value):
                            if says_cache(attr):
                                _keep(x)
            frame = frame.f_back
        if len(_FOUND) > 64 and len(_FOUND) > 2 * _SWEPT[0]:
            _sweep()
    del frame


def read_locals(frame) -> list:
    """(name, value) of a frame's variables, leaving nothing behind: in a running function,
    reading ``f_locals`` makes a snapshot dict the frame keeps until it returns, which would
    keep every value it held then alive (a training loop's batch, long after the loop let go
    of it); that snapshot is emptied again unless someone else holds it (a ``locals()`` kept
    by the program) or a Python tracer may write it back into the frame (``f_trace``)."""
    loc = frame.f_locals
    items = list(loc.items())
    if (type(loc) is dict and frame.f_code.co_flags & _CO_OPTIMIZED and frame.f_trace is None
            and sys.getrefcount(loc) <= 3):  # the frame, ``loc`` and the call's argument
        loc.clear()
    return items


_CO_OPTIMIZED = 0x1  # a function's frame (its locals are a snapshot; a module's or a class body's are its namespace)


def _attributes(obj) -> list:
    d = getattr(obj, "__dict__", None)
    if not isinstance(d, dict) or isinstance(obj, (type, types.ModuleType)):
        return []
    try:
        return list(d.items())
    except RuntimeError:  # changed by another thread while read
        return []


def _keep(obj) -> None:
    if isinstance(obj, dict):
        _FOUND[id(obj)] = obj
    elif _attributes(obj):
        try:
            _FOUND[id(obj)] = weakref.ref(obj, functools.partial(_forget, id(obj)))
        except TypeError:  # an object that takes no weak reference: its dicts as they are now
            for attr, x in _attributes(obj):
                if says_cache(attr) and isinstance(x, dict):
                    _FOUND[id(x)] = x


def _forget(key: int, _dead=None, _ref=weakref.ref, _lock=_LOCK, _found=_FOUND) -> None:
    # (defaults: still there while the interpreter exits)
    with _lock:
        entry = _found.get(key)
        if isinstance(entry, _ref) and entry() is None:
            del _found[key]


_SWEPT = [0]  # how many were kept at the last sweep


def _sweep() -> None:
    """Let go of the dicts nothing but this registry holds any more (the function that
    held a local cache has returned and nothing kept it)."""
    for key in list(_FOUND):
        if not isinstance(_FOUND[key], weakref.ref) and sys.getrefcount(_FOUND[key]) <= 2:
            del _FOUND[key]
    _SWEPT[0] = len(_FOUND)


def _dicts_of(obj) -> list:
    """The cache dicts ``obj`` stands for: itself if a dict, else its attributes that say
    cache and are dicts."""
    if isinstance(obj, dict):
        return [obj]
    if obj is None or isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
        return []
    return [x for attr, x in _attributes(obj) if says_cache(attr) and isinstance(x, dict)]


# ---- modules --------------------------------------------------------------------------------

def _module_paths(module) -> list:
    """Where a module keeps caches: (global name, step) with step None (the global), ("cell",
    i) (a closure variable of a global function) or ("attr", name) (an attribute of a global
    function, of a class defined here, or of a module-level object)."""
    ns = vars(module)
    out = []
    for name, v in list(ns.items()):
        if says_cache(name):
            out.append((name, None))
        if isinstance(v, types.FunctionType):
            if v.__closure__:
                out += [(name, ("cell", i)) for i, var in enumerate(v.__code__.co_freevars) if says_cache(var)]
            out += [(name, ("attr", a)) for a in getattr(v, "__dict__", {}) if says_cache(a)]
        elif isinstance(v, type):
            if getattr(v, "__module__", None) == module.__name__:
                out += [(name, ("attr", a)) for a in list(vars(v)) if says_cache(a)]
        elif not isinstance(v, types.ModuleType):
            out += [(name, ("attr", a)) for a, _x in _attributes(v) if says_cache(a)]
    return out


def _resolve(ns: dict, name: str, step) -> object:
    v = ns.get(name)
    if step is None or v is None:
        return v
    if step[0] == "cell":
        try:
            return v.__closure__[step[1]].cell_contents
        except (AttributeError, IndexError, TypeError, ValueError):
            return None
    d = getattr(v, "__dict__", None)
    return d.get(step[1]) if hasattr(d, "get") else None


def _module_dicts(module) -> list:
    ns = getattr(module, "__dict__", None)
    if not isinstance(ns, dict):
        return []
    memo = _MODULES.get(id(module))
    if memo is None or memo[0] is not module or memo[1] != len(ns):
        memo = (module, len(ns), _module_paths(module))
        _MODULES[id(module)] = memo
    out = []
    for name, step in memo[2]:
        out += _dicts_of(_resolve(ns, name, step))
    return out


_LIBRARY_PREFIXES = tuple(p + "." for p in LIBRARIES)


def _searched(name: str) -> bool:
    return name in _WATCHED or name in LIBRARIES or name.startswith(_LIBRARY_PREFIXES)


_SEARCHED: list = [None, None, []]  # (number of modules, of watched modules) when listed, the modules


def _searched_modules() -> list:
    """The modules searched for caches, listed again only when a module was imported or
    watched since."""
    if _SEARCHED[0] != len(sys.modules) or _SEARCHED[1] != len(_WATCHED):
        _SEARCHED[:] = [len(sys.modules), len(_WATCHED),
                        [m for name, m in list(sys.modules.items()) if _searched(name)]]
    return _SEARCHED[2]


def _on_the_stacks() -> list:
    """What the running functions of every thread hold under a name that says cache (and
    their ``self``'s attributes that do): caches made after their kernels."""
    out = []
    for top in list(sys._current_frames().values()):
        frame = top
        while frame is not None:
            if not _skipped(frame.f_globals.get("__name__", "") or ""):
                for var, value in read_locals(frame):
                    if says_cache(var):
                        out.append(value)
                    else:
                        out += [x for attr, x in _attributes(value) if says_cache(attr)]
            frame = frame.f_back
    return out


def caches(extra=()) -> list[dict]:
    """Every dict that may hold compiled kernels (the module doc's places, and the variables
    named like a cache of the functions running now), and ``extra``; each once."""
    out: dict[int, dict] = {}
    with _LOCK:
        _sweep()
        for entry in list(_FOUND.values()):
            obj = entry() if isinstance(entry, weakref.ref) else entry
            for d in _dicts_of(obj):
                out[id(d)] = d
        for obj in _on_the_stacks():
            for d in _dicts_of(obj):
                out[id(d)] = d
        for module in _searched_modules():
            for d in _module_dicts(module):
                out[id(d)] = d
    for d in extra:
        out[id(d)] = d
    return list(out.values())


# ---- kernels made before fa4trace was imported -----------------------------------------------

def sweep_heap() -> int:
    """Find, once, the caches of kernels compiled before ``install``: one pass over the heap
    for the DSL's compiled functions, one ``gc.get_referrers`` walk per level of plans around
    them (up to ``PLAN_DEPTH``) and one to name the dicts that hold them (a closure's name
    read from the functions of the same pass, a running function's locals from its frame);
    the dicts held under a name that says cache are kept. The number of kernels found."""
    from .patches import subclasses

    # the DSL's compiled functions (a bare tvm_ffi.Function may be anything tvm-ffi registers;
    # those loaded from object files sit in quack's and FA4's caches, which are searched anyway)
    made = set()
    for kind in compiled_kinds():
        if kind.__module__.split(".")[0] != "tvm_ffi":
            made.update(subclasses(kind))
    objs = gc.get_objects()
    kernels = [o for o in objs if type(o) in made]
    if not kernels:
        return 0
    for k in kernels:
        try:
            KERNELS.add(k)
        except TypeError:
            pass
    mine = {id(kernels), id(objs)}
    holding: dict[int, dict] = {}
    level = kernels
    for _ in range(PLAN_DEPTH):
        mine.add(id(level))
        up = []
        for r in gc.get_referrers(*level):
            if id(r) in mine:
                continue
            if isinstance(r, dict):
                if any(is_kernel(v) or plan_of(v, is_kernel) for v in list(r.values())):
                    holding[id(r)] = r
            elif isinstance(r, tuple) or plan_of(r, is_kernel):
                up.append(r)
        if not up:
            break
        level = up
    named = _names(list(holding.values()), objs, mine | {id(holding)})
    del objs
    with _LOCK:
        for key, d in holding.items():
            if any(says_cache(n) for n in named.get(key, ())):
                _FOUND[key] = d
    return len(kernels)


def _names(dicts: list, objs: list, skip: set) -> dict[int, set]:
    """id(dict) -> the names it is held under (a global, an attribute, a closure variable, a
    local variable of a running function), in one ``gc.get_referrers`` walk."""
    ids = {id(d) for d in dicts}
    names: dict[int, set] = {}
    cells = set()
    skip = skip | {id(dicts)}
    for r in gc.get_referrers(*dicts) if dicts else ():
        if id(r) in skip:
            continue
        if isinstance(r, dict):
            for k, v in list(r.items()):
                if id(v) in ids:
                    names.setdefault(id(v), set()).add(k)
        elif isinstance(r, types.CellType):
            cells.add(id(r))
        else:
            for k, v in _attributes(r):
                if id(v) in ids:
                    names.setdefault(id(v), set()).add(k)
    for top in list(sys._current_frames().values()):  # locals of running functions (no heap object holds them)
        frame = top
        while frame is not None:
            for var, v in read_locals(frame):
                if id(v) in ids:
                    names.setdefault(id(v), set()).add(var)
            frame = frame.f_back
    del top, frame
    if cells:  # the functions whose closure holds them, from the heap pass already made
        for f in [o for o in objs if type(o) is types.FunctionType and o.__closure__ is not None]:
            for var, cell in zip(f.__code__.co_freevars, f.__closure__):
                if id(cell) in cells:
                    try:
                        names.setdefault(id(cell.cell_contents), set()).add(var)
                    except ValueError:
                        pass
    return names
