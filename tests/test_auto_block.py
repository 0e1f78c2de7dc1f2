"""Nothing of ``fa4trace.instrument()`` outlives its block, whatever is imported, compiled,
raised or interrupted inside it (CPU: tiny kernels compiled for sm_90a, nothing launched).

After the block: ``cute.compile`` is the DSL's own again under every name (a module imported
inside the block included) and compiles plain; the caches hold the very objects they held, in
the same order; no Instrumented is left in them; the DSL's classes and the on-disk switches
are as they were; and a step that fails to put something back does not keep the others from
running.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections import OrderedDict

import pytest

pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (pip install 'fa4trace[dsl]')")

import fa4trace  # noqa: E402
from fa4trace.auto import block as auto_block  # noqa: E402
from fa4trace.auto import reach  # noqa: E402
from fa4trace.auto.run import Instrumented  # noqa: E402
from fa4trace.format.errors import Fa4traceError  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools"))
from tiny_kernels import Copy  # noqa: E402


@pytest.fixture(autouse=True)
def sm90(monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")


def dsl_state() -> dict:
    """What a block may change in the DSL's classes and the libraries' switches."""
    from cutlass.base_dsl.compiler import CompileCallable
    from cutlass.base_dsl.jit_executor import JitCompiledFunction

    from fa4trace.auto.patches import subclasses

    state = {"compile_call": vars(CompileCallable)["__call__"],
             "calls": {c: vars(c).get("__call__") for c in subclasses(JitCompiledFunction)}}
    try:
        import quack.cache as qcache

        state["quack_disk"] = qcache.CACHE_ENABLED
    except ImportError:
        pass
    try:
        from flash_attn.cute import cache_utils

        state["fa4_disk"] = {n: vars(cache_utils.JITPersistentCache).get(n)
                             for n in ("__setitem__", "__getitem__", "__contains__")}
    except ImportError:
        pass
    return state


def test_a_module_imported_inside_the_block_keeps_nothing_of_it(tmp_path, monkeypatch):
    """The module binds ``compile`` by name at import, as quack's and FA4's cute_dsl_utils do
    (``cute_compile_og = cute.compile``): inside the block both names compile traced, after it
    both are the DSL's own object and compile plain."""
    import cutlass.cute as cute

    (tmp_path / "late_kernels.py").write_text(textwrap.dedent("""
        import cutlass.cute as cute
        from cutlass.cute import compile
        cute_compile_og = cute.compile
        grab = None
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "late_kernels", raising=False)
    copy = Copy()
    real = cute.compile
    before = dsl_state()
    with fa4trace.instrument(families=()) as rec:
        import late_kernels

        late_kernels.grab = late_kernels.compile.__call__  # a bound method taken inside the block
        inside = [late_kernels.compile(copy.entry, *copy_args()), late_kernels.cute_compile_og(copy.entry, *copy_args())]
    assert [type(k).__name__ for k in inside] == ["Instrumented", "Instrumented"]
    assert all(any(k is x for x in rec.kernels) for k in inside)
    assert late_kernels.compile is real and late_kernels.cute_compile_og is real and cute.compile is real
    after = [late_kernels.compile(copy.entry, *copy_args()), late_kernels.cute_compile_og(copy.entry, *copy_args()),
             late_kernels.grab(copy.entry, *copy_args())]
    assert not any(isinstance(k, Instrumented) for k in after), [type(k).__name__ for k in after]
    assert dsl_state() == before
    assert all(not k.active for k in inside)  # kept by the test: they run their plain build


def copy_args():
    from tiny_kernels import fake

    return fake(), fake()


def _cache_with_kernels():
    copy = Copy()
    cache = {"a": copy.compile(), "x": "not a kernel", "b": copy.compile(), "y": 3}
    return copy, cache


@pytest.mark.parametrize("raised", [ValueError, KeyboardInterrupt])
def test_an_exception_inside_the_block_puts_everything_back(raised):
    copy, cache = _cache_with_kernels()
    before_items = list(cache.items())
    before = dsl_state()
    with pytest.raises(raised):
        with fa4trace.instrument(families=(), caches=[cache]) as rec:
            assert "a" not in cache and "b" not in cache  # taken out: the library compiles again
            cache["a"] = copy.compile()  # what a library does on the miss
            assert isinstance(cache["a"], Instrumented)
            raise raised("inside")
    assert [(k, v) for k, v in cache.items()] == before_items  # same objects, same order
    assert dsl_state() == before
    assert auto_block.open_block() is None
    assert rec.kernels and not any(k.active for k in rec.kernels)
    with fa4trace.instrument(families=()):  # the next block opens
        pass


def test_an_interrupt_while_the_caches_are_taken_out_still_puts_them_back(monkeypatch):
    """KeyboardInterrupt raised by fa4trace itself half-way through taking entries out (the
    user's Ctrl-C at the worst moment): the block never opens, everything is put back, and
    the interrupt reaches the program."""
    copy, cache = _cache_with_kernels()
    last = cache["y"] = object()  # looked at after both kernels were taken out
    before_items = list(cache.items())
    before = dsl_state()
    real_plan_of = reach.plan_of

    def interrupted(v, leaf, *a):
        if v is last and not pressed:  # one Ctrl-C
            pressed.append(1)
            raise KeyboardInterrupt
        return real_plan_of(v, leaf, *a)

    pressed = []

    monkeypatch.setattr(reach, "plan_of", interrupted)
    body = []
    with pytest.raises(KeyboardInterrupt):
        with fa4trace.instrument(families=(), caches=[cache]):
            body.append(1)
    assert not body
    assert list(cache.items()) == before_items
    assert dsl_state() == before and auto_block.open_block() is None


def test_a_restore_step_that_fails_does_not_skip_the_others(monkeypatch, capsys):
    copy, cache = _cache_with_kernels()
    before = dsl_state()

    def broken(self, *a, **k):
        raise RuntimeError("cannot put the caches back")

    monkeypatch.setattr(reach.Reach, "restore", broken)
    with fa4trace.instrument(families=(), caches=[cache]):
        pass
    err = capsys.readouterr().err
    assert "could not put back 1 thing(s)" in err and "cannot put the caches back" in err
    assert err.count("\n") == 1  # one line
    assert dsl_state() == before and auto_block.open_block() is None


def test_an_interrupt_in_a_restore_step_is_raised_after_every_other_step(monkeypatch):
    copy, cache = _cache_with_kernels()
    before_items = list(cache.items())
    before = dsl_state()
    real = reach.CallSpy.restore

    def interrupted(self):
        real(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(reach.CallSpy, "restore", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with fa4trace.instrument(families=(), caches=[cache]):
            pass
    assert list(cache.items()) == before_items
    assert dsl_state() == before and auto_block.open_block() is None


@pytest.mark.parametrize("kind", [dict, OrderedDict])
def test_the_caches_order_is_kept(kind):
    """An LRU or FIFO cache evicts by its order: every entry goes back where it was; an entry
    the program added inside the block comes after them, as its plain build."""
    copy = Copy()
    a, b = copy.compile(), copy.compile()
    cache = kind([("a", a), ("x", "value"), ("b", b), ("y", 3)])
    with fa4trace.instrument(families=(), caches=[cache]) as rec:
        assert list(cache) == ["x", "y"]
        cache["b"] = copy.compile()  # the library refills b, then a, then adds c
        cache["a"] = copy.compile()
        cache["c"] = copy.compile()
        assert list(cache) == ["x", "y", "b", "a", "c"]
        c = cache["c"]
    assert type(cache) is kind and list(cache) == ["a", "x", "b", "y", "c"]
    assert cache["a"] is a and cache["b"] is b and cache["x"] == "value" and cache["y"] == 3
    assert cache["c"] is c.plain and not isinstance(cache["c"], Instrumented)
    assert rec.hidden >= 2  # (other tests' caches may still be alive in this process)
    if kind is OrderedDict:  # its own bookkeeping still right
        cache.move_to_end("a")
        assert list(cache) == ["x", "b", "y", "c", "a"]


def test_blocks_do_not_nest():
    with fa4trace.instrument(families=()):
        with pytest.raises(Fa4traceError, match="already open"):
            with fa4trace.instrument(families=()):
                pass
    assert auto_block.open_block() is None


def test_a_traced_build_that_does_not_compile_runs_plain_and_says_so(monkeypatch, capsys):
    """fa4trace's own compile failing (a hook the DSL rejects, say) must not fail the program:
    the library gets its plain compile, one line names the kernel and why."""
    from fa4trace.auto import compiler

    def broken(*a, **kw):
        raise RuntimeError("MLIR verification failed: fa4trace hook (forced by the test)")

    monkeypatch.setattr(compiler, "compile_traced", broken)
    copy = Copy()
    with fa4trace.instrument() as rec:
        compiled = copy.compile()
    assert not isinstance(compiled, Instrumented) and not rec.kernels
    (name, why), = rec.untraced.items()
    assert why.startswith("MLIR verification failed")
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == [f"fa4trace: {name} runs untraced: its traced build did not compile (MLIR verification failed: "
                   "fa4trace hook (forced by the test))"]
