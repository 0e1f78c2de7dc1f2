"""The host side of fa4trace.instrument: event naming, patches, bad input (no GPU, no compile)."""

from __future__ import annotations

import pytest

from fa4trace.auto.events import FIRST_ID, EventTable
from fa4trace.auto.patches import Patches
from fa4trace.format.errors import Fa4traceError


def test_event_table_names_ids_and_vocabulary():
    t = EventTable()
    a = t.event("pipeline", "wait", "ab", 4)
    assert a == FIRST_ID
    assert t.event("pipeline", "wait", "ab", 4) == a  # same call site kind: same id
    b = t.event("tma", "load")
    assert b == FIRST_ID + 1
    e = t.vocab.event("ab.wait")
    assert (e.family, e.op, e.resource, e.stages, e.is_wait) == ("pipeline", "wait", "ab", 4, True)
    assert not t.vocab.event("tma.load").is_wait
    assert t.placed == {"ab.wait": 2, "tma.load": 1}
    assert t.families_found() == {"pipeline", "tma"}
    # the vocabulary round-trips through a bundle's JSON with the new fields
    from fa4trace.format.vocab import Vocabulary

    back = Vocabulary.from_json(t.vocab.to_json())
    assert back.event("ab.wait") == e


def test_event_names_are_identifiers():
    t = EventTable()
    t.event("pipeline", "acquire", "my-pipe[0]", 2)
    assert "my_pipe_0.acquire" in {e.name for e in t.vocab.events}


def test_patches_restore_exactly():
    class A:
        x = 1

    p = Patches()
    p.set(A, "x", 2)
    p.set(A, "y", 3)
    assert (A.x, A.y) == (2, 3)
    p.restore()
    assert A.x == 1 and not hasattr(A, "y") and not p


def test_old_bundle_vocabulary_still_reads():
    from fa4trace.format.vocab import Vocabulary

    v = Vocabulary.from_json({"events": [{"name": "QK", "id": 4, "role": "consumer", "is_async": True,
                                          "color": "#000000", "description": ""}], "roles": []})
    assert v.event("QK").family == "" and not v.event("QK").is_wait


def test_unsupported_dsl_version_is_one_line(monkeypatch):
    pytest.importorskip("cutlass")
    from fa4trace.auto import compiler

    monkeypatch.setattr(compiler, "dsl_version", lambda: "9.9.9")
    with pytest.raises(Fa4traceError, match="supports nvidia-cutlass-dsl 4.8.x; this environment has 9.9.9"):
        compiler.require_dsl()


def test_not_a_jit_function_is_one_line():
    pytest.importorskip("cutlass")
    from fa4trace.auto.compiler import compile_traced

    with pytest.raises(Fa4traceError, match="compiles a @cute.jit function"):
        compile_traced(lambda x: x, 1)


def test_unknown_family_is_refused():
    pytest.importorskip("cutlass")
    from fa4trace.auto.families import install

    with pytest.raises(ValueError, match="unknown event families"):
        install(Patches(), ["pipeline", "dma"])


def test_set_everywhere_replaces_every_alias_and_restores():
    import types
    import sys as _sys

    def f():
        return 1

    def g():
        return 2

    mod = types.ModuleType("fa4trace_test_alias")
    mod.f, mod.alias = f, f
    _sys.modules[mod.__name__] = mod
    try:
        p = Patches()
        p.set_everywhere({id(f): (f, g)})
        assert mod.f is g and mod.alias is g
        p.restore()
        assert mod.f is f and mod.alias is f
    finally:
        del _sys.modules[mod.__name__]


def test_span_spec_forms_and_bad_entries():
    import json

    from fa4trace.auto.families import span_spec

    assert span_spec("a", "json:dumps") == (json, "dumps", None)
    assert span_spec("a", {"target": "json:dumps", "payload": "obj"}) == (json, "dumps", "obj")
    assert span_spec("a", {"target": (json, "dumps")}) == (json, "dumps", None)
    for bad, words in (({"payload": "x"}, "takes 'target'"), ({"target": "json:dumps", "extra": 1}, "takes 'target'"),
                       ({"target": "json:dumps", "payload": 3}, "names an argument"),
                       ("json:nothing_here", "not found"), ("no_colon", "'module:Class.method'")):
        with pytest.raises(ValueError, match=words):
            span_spec("a", bad)


def test_patches_set_env_restores_set_and_unset_variables(monkeypatch):
    import os

    monkeypatch.setenv("FA4TRACE_TEST_SET", "before")
    monkeypatch.delenv("FA4TRACE_TEST_UNSET", raising=False)
    p = Patches()
    p.set_env("FA4TRACE_TEST_SET", "during")
    p.set_env("FA4TRACE_TEST_UNSET", "during")
    assert os.environ["FA4TRACE_TEST_SET"] == os.environ["FA4TRACE_TEST_UNSET"] == "during"
    p.restore()
    assert os.environ["FA4TRACE_TEST_SET"] == "before" and "FA4TRACE_TEST_UNSET" not in os.environ
    assert not p


def test_fa4_aot_build_takes_no_family_or_all_of_them(tmp_path, monkeypatch):
    """FA4's AOT build holds FA4's events alone and, as variant "generic", with every family: a
    subset of the families is refused in one line before any build is opened."""
    from fa4trace.fa4.run import load_fn
    from fa4trace.run import loader

    monkeypatch.setattr(loader, "use_jit", lambda build=None, kind="attention": False)
    with pytest.raises(Fa4traceError) as e:
        load_fn("sm90", schedule="fa3", d=128, hq=16, hkv=1, sq=1, dtype="bf16", traced=True,
                build=tmp_path, families=("barrier",))
    assert "pipeline,tma,mma,barrier" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(Fa4traceError, match="traced builds only"):
        load_fn("sm90", schedule="fa3", d=128, hq=16, hkv=1, sq=1, dtype="bf16", traced=False,
                build=tmp_path, families=("barrier",))


@pytest.mark.parametrize("cursor, what", [("smem", "shared-memory cursor"), ("ring", "shared-memory ring")])
def test_a_refused_shared_memory_build_is_compiled_again_with_the_global_cursor(cursor, what):
    """A traced launch the GPU refuses for its shared memory (the "smem" cursor's 128 B or a
    ring's rings) is compiled again with "gmem" and launched; the bundle's meta says why, and
    a ring build's ring fields go with it (no GPU: the launch is a stand-in)."""
    from types import SimpleNamespace

    from fa4trace.auto.run import Instrumented

    calls = []

    def refused(*args, **kwargs):
        raise RuntimeError("CUDA_ERROR_INVALID_VALUE: too much shared memory\nmore")

    def gmem(*args, **kwargs):
        calls.append(args)
        return "ran"

    meta = {"kernel": "k", "cursor": cursor, **({"ring": 128, "ring_cta_warps": 12, "ring_smem_bytes": 12416}
                                                 if cursor == "ring" else {})}
    k = Instrumented(refused, None, meta, plain=None, recompile=lambda c: SimpleNamespace(
        fn=gmem, vocab="v", meta={"kernel": "k", "cursor": c}))
    assert k._launch((1, 2), {}, "buf") == "ran" and calls == [(1, 2, "buf")]
    assert k.meta["cursor"] == "gmem" and k.not_traced == ""
    assert k.meta["cursor_reason"] == f"the {what} did not launch: CUDA_ERROR_INVALID_VALUE: too much shared memory"
    assert not {"ring", "ring_cta_warps", "ring_smem_bytes"} & set(k.meta)


def test_bad_cursor_or_ring_is_one_line():
    pytest.importorskip("cutlass")
    import fa4trace
    from fa4trace.auto.compiler import compile_traced, dsl_version

    if not dsl_version().startswith("4.8"):
        pytest.skip("needs nvidia-cutlass-dsl 4.8")
    for kw, match in (({"cursor": "regs"}, "cursor must be one of 'gmem', 'smem', 'ring'"),
                      ({"cursor": "ring", "ring": 100}, "ring must be a power of two")):
        with pytest.raises(ValueError, match=match):
            compile_traced(lambda: None, **kw)
        with pytest.raises(ValueError, match=match):
            with fa4trace.instrument(**kw):
                pass
