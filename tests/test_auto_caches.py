"""Which caches ``fa4trace.instrument()`` reaches and what it takes out of them (CPU: tiny kernels
compiled for sm_90a, nothing launched).

The caches are found where kernels are compiled or loaded (``fa4trace.auto.registry``: the
frames above the compile, the modules they ran in), and for kernels compiled before fa4trace
was imported by one pass over the heap at that import. Only the kernels' own entries move
(``fa4trace.auto.plans``): a dict of models keeps its models, and the calls of the kernels
inside them are counted as not traced.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import weakref

import pytest

pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (pip install 'fa4trace[dsl]')")

import fa4trace  # noqa: E402
from fa4trace.auto import registry  # noqa: E402
from fa4trace.auto.run import Instrumented  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
from tiny_kernels import Copy  # noqa: E402


@pytest.fixture(autouse=True)
def sm90(monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")


@pytest.fixture(scope="module")
def copy():
    return Copy()


class Layer:
    def __init__(self, kern):
        self.kern = kern


class Model:
    def __init__(self, kern):
        self.layer = Layer(kern)


def test_a_dict_of_models_keeps_its_entries_and_their_kernel_calls_are_counted(copy, capfd):
    model_cache = {"m": Model(copy.compile())}  # named like a cache, holds a kernel 2 levels down
    kernel_cache = {"k": copy.compile()}
    m = model_cache["m"]
    with fa4trace.instrument(families=()) as rec:
        assert model_cache == {"m": m}  # left in place: the program may expect it
        assert "k" not in kernel_cache  # a kernel itself: taken out
        try:  # the model's kernel runs from where fa4trace cannot trace it (no GPU: the call fails)
            model_cache["m"].layer.kern(None, None)
        except Exception:  # noqa: BLE001,S110
            pass
    assert model_cache["m"] is m and "k" in kernel_cache
    assert sum(rec.unreached.values()) == 1
    assert "1 kernel call(s) inside instrument() ran from a cache fa4trace could not reach" in capfd.readouterr().err


LIBRARY = textwrap.dedent('''
    """Caches kept the ways libraries keep them."""
    import functools
    from typing import NamedTuple

    _kernel_cache = {}          # a module-level dict named like a cache
    registry = {}               # a dict not named like one: a registry filled once, left alone


    def jit_cache(fn):          # quack's decorator: the dict in the wrapper's closure
        cache = {}

        @functools.wraps(fn)
        def wrapper(*args):
            if args not in cache:
                cache[args] = fn(*args)
            return cache[args]
        return wrapper


    class JITCache:             # FA4's: an object whose dict is its .cache
        def __init__(self):
            self.cache = {}


    def fwd(compile, key):      # FA4's: fwd.compile_cache[key] = cute.compile(...)
        if key not in fwd.compile_cache.cache:
            fwd.compile_cache.cache[key] = compile()
        return fwd.compile_cache.cache[key]


    fwd.compile_cache = JITCache()


    class Plan(NamedTuple):
        compiled_fn: object
        tile: int


    class Frontend:             # quack's epilogue frontend: plans in an attribute of self
        def __init__(self):
            self._plan_cache = {}

        def plan(self, compile, key):
            if key not in self._plan_cache:
                self._plan_cache[key] = Plan(compile(), 128)
            return self._plan_cache[key]


    def module_level(compile, key):
        if key not in _kernel_cache:
            _kernel_cache[key] = compile()
        return _kernel_cache[key]


    @jit_cache
    def quack_style(compile, key):
        return compile()
    ''')


def test_caches_are_found_where_their_kernels_were_compiled(copy, tmp_path, monkeypatch):
    (tmp_path / "kernel_library.py").write_text(LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import kernel_library as lib

    local_cache = {}

    def local(key):  # a local dict a closure keeps, as a user's own code does
        if key not in local_cache:
            local_cache[key] = copy.compile()
        return local_cache[key]

    front = lib.Frontend()
    got = {"module": lib.module_level(copy.compile, 1), "quack": lib.quack_style(copy.compile, 1),
           "fa4": lib.fwd(copy.compile, 1), "plan": front.plan(copy.compile, 1), "local": local(1)}
    lib.registry["k"] = got["module"]
    with fa4trace.instrument(families=()) as rec:
        assert not lib._kernel_cache and not front._plan_cache and not local_cache
        assert not lib.fwd.compile_cache.cache
        assert lib.registry == {"k": got["module"]}  # not named like a cache: left alone
        inside = {"module": lib.module_level(copy.compile, 1), "quack": lib.quack_style(copy.compile, 1),
                  "fa4": lib.fwd(copy.compile, 1), "plan": front.plan(copy.compile, 1).compiled_fn,
                  "local": local(1)}
        assert all(isinstance(v, Instrumented) for v in inside.values()), inside
    assert rec.hidden >= 5
    after = {"module": lib.module_level(copy.compile, 1), "quack": lib.quack_style(copy.compile, 1),
             "fa4": lib.fwd(copy.compile, 1), "plan": front.plan(copy.compile, 1), "local": local(1)}
    assert all(after[k] is got[k] for k in got), {k: type(v).__name__ for k, v in after.items()}


def test_a_local_cache_is_let_go_once_its_function_has_returned(copy):
    class Dict(dict):  # a dict that takes a weak reference, to see it go
        pass

    def run():
        kernel_cache = Dict()
        kernel_cache["k"] = copy.compile()
        assert any(d is kernel_cache for d in registry.caches())
        return weakref.ref(kernel_cache)

    gone = run()
    gc.collect()  # what held it in a cycle (the finished frame and its locals) goes
    registry.caches()  # lets go of the dicts only the registry holds
    assert gone() is None


def test_no_local_of_a_running_function_is_kept_alive(copy):
    """Reading a running function's variables (where kernels are compiled, when a window
    opens) leaves no snapshot behind that would keep what the function let go of."""
    class Batch:
        pass

    def step():
        batch = Batch()
        gone = weakref.ref(batch)
        kernel_cache = {"k": copy.compile()}  # the compile reads this frame's variables
        with fa4trace.instrument(families=()):  # so does the window's opening and closing
            assert "k" not in kernel_cache
        del batch
        return gone() is None  # while the function still runs

    assert step()


def test_a_kernel_loaded_from_an_object_file_is_taken_out_of_its_cache(copy, tmp_path):
    import cutlass.cute as cute

    compiled = copy.compile()
    path = str(tmp_path / "copy.o")
    compiled.export_to_c(path, function_name="copy")
    loads = []
    off = registry.on_load(loads.append)

    def load():
        object_cache = {}
        module = cute.runtime.load_module(path, enable_tvm_ffi=True)
        object_cache["copy"] = module["copy"]
        return object_cache

    try:
        object_cache = load()
    finally:
        off()
    assert loads == [path] and registry.is_kernel(object_cache["copy"])
    loaded = object_cache["copy"]
    with fa4trace.instrument(families=()):
        assert "copy" not in object_cache
    assert object_cache["copy"] is loaded


def test_when_imported_runs_right_after_the_first_import(tmp_path, monkeypatch):
    (tmp_path / "imported_later.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "imported_later", raising=False)
    seen, cancelled = [], []
    registry.when_imported("imported_later", lambda m: seen.append(m.VALUE))
    cancel = registry.when_imported("imported_later", cancelled.append)
    cancel()
    assert not seen
    import imported_later

    assert seen == [1] and not cancelled
    assert type(imported_later.__loader__).__name__ == "SourceFileLoader"  # its own loader kept
    assert not any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)  # nothing left waiting
    registry.when_imported("imported_later", lambda m: seen.append(2))  # imported: runs now
    assert seen == [1, 2]


BEFORE_IMPORT = textwrap.dedent('''
    import json, os, sys
    os.environ["CUTE_DSL_ARCH"] = "sm_90a"
    sys.path.insert(0, os.path.join(sys.argv[1], "tests", "tools"))
    import cutlass
    from tiny_kernels import Copy

    copy = Copy()
    _kernel_cache = {"k": copy.compile()}          # compiled before fa4trace is imported


    def main():
        local_cache = {"k": copy.compile(), "plan": (copy.compile(), 128)}
        registry = {"k": copy.compile()}           # not named like a cache
        import fa4trace
        from fa4trace.auto import registry as reg

        found = reg.caches()
        known = {"module": any(d is _kernel_cache for d in found), "local": any(d is local_cache for d in found),
                 "registry": any(d is registry for d in found)}
        with fa4trace.instrument(families=()) as rec:
            inside = {"module": len(_kernel_cache), "local": len(local_cache), "registry": len(registry)}
        print(json.dumps({"known": known, "inside": inside, "hidden": rec.hidden,
                          "after": [len(_kernel_cache), len(local_cache), len(registry)]}))


    main()
    ''')


def test_kernels_compiled_before_fa4trace_was_imported_are_found_at_its_import(tmp_path):
    script = tmp_path / "before_import.py"
    script.write_text(BEFORE_IMPORT)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(script), ROOT], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["known"] == {"module": True, "local": True, "registry": False}
    assert out["inside"] == {"module": 0, "local": 0, "registry": 1} and out["hidden"] == 3
    assert out["after"] == [1, 2, 1]
