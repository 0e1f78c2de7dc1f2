"""The loader knows no kernel kind itself: kinds register (fa4trace.run.registry) and the
loader asks them where their builds live, what a JIT compile needs and how to compile."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fa4trace.format.errors import DeviceUnavailable, Fa4traceError
from fa4trace.run import loader, registry


@pytest.fixture
def toy_kind():
    """A kind registered for the test (removed after it)."""
    calls = []

    def compile_toy(arch, name, config):
        calls.append((arch, name, config))
        return registry.Loaded(lambda: "ran", name or "toy", dict(config), "jit")

    kind = registry.register(registry.KernelKind(
        "toy", compile_toy, build_env="TOY_BUILD", default_build="build/toy", jit_needs=("no_such_module_here",),
        build_command="make-toy --out {path}"))
    yield kind, calls
    registry.unregister("toy")
    assert "toy" not in registry.names()


def test_the_shipped_kinds_are_registered_on_import(monkeypatch):
    assert {"attention", "calibration", "markers", "fa4"} <= set(registry.names())
    monkeypatch.delenv("FA4TRACE_FA4_BUILD", raising=False)
    monkeypatch.delenv("FA4TRACE_BUILD", raising=False)
    assert loader.build_dir(None, "fa4") == Path("build/fa4_sm90")
    assert loader.build_dir(None, "markers") == Path("build/kernels")
    monkeypatch.setenv("FA4TRACE_FA4_BUILD", "elsewhere")
    assert loader.build_dir(None, "fa4") == Path("elsewhere") and loader.build_dir("given", "fa4") == Path("given")


def test_a_registered_kind_is_loaded_its_own_way(toy_kind, tmp_path, monkeypatch):
    kind, _calls = toy_kind
    monkeypatch.delenv("TOY_BUILD", raising=False)
    assert loader.build_dir(None, "toy") == Path("build/toy")
    monkeypatch.setenv("TOY_BUILD", str(tmp_path / "env"))
    assert loader.build_dir(None, "toy") == tmp_path / "env"
    assert not loader.can_jit("toy")  # its JIT needs a module that is not here
    with pytest.raises(DeviceUnavailable, match=r"no toy kernel build at .*missing.*`make-toy --out .*missing`"):
        loader.load("toy", build=tmp_path / "missing")


def test_a_kind_that_can_jit_compiles_through_its_own_function(toy_kind, monkeypatch):
    kind, calls = toy_kind
    monkeypatch.setattr(loader, "use_jit", lambda build=None, k="attention": True)
    monkeypatch.setattr(loader, "gpu_arch", lambda device=0: "sm_90a")
    got = loader.load("toy", size=3)
    assert got.fn() == "ran" and got.how == "jit" and calls == [("sm_90a", None, {"size": 3})]
    assert loader.load("toy", size=3) is got and len(calls) == 1  # compiled once per process


def test_an_unknown_kind_names_the_registered_ones():
    with pytest.raises(Fa4traceError, match=r"no kernel kind 'nope'; registered kinds: .*attention.*fa4"):
        loader.load("nope")


def test_the_loader_names_no_kernel_kind():
    """No kind's name, package or build folder is written in the loader's code (its module
    docstring, which points to where the kinds are, aside)."""
    import re

    tree = ast.parse(Path(loader.__file__).read_text())
    doc = tree.body[0].value
    text = " ".join(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                    and n is not doc)
    names = " ".join(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))
    for word in (r"\bfa4\b", "flash", "FA4TRACE_BUILD", "build/", "attention", "calibration", "markers"):
        assert not re.search(word, text + " " + names, re.IGNORECASE), word


def test_the_shipped_kinds_jit_compile_here_for_a_named_target():
    """fa4trace's own kinds compile through the registry as a JIT load does (a B200 or H200 box
    with the CuTe DSL): by variant name, by config, and an unknown name is a one-line error.
    In a fresh process: the CuTe DSL reads its target (CUTE_DSL_ARCH) once."""
    pytest.importorskip("cutlass")
    import json
    import os
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[1])
    code = (
        "import json\n"
        "import fa4trace\n"
        "from fa4trace.format.errors import Fa4traceError\n"
        "from fa4trace.run import registry\n"
        "kind = registry.get('calibration')\n"
        "a = kind.compile('sm_90a', 'calibration_globaltimer', {})\n"
        "b = kind.compile('sm_90a', None, {'timebase': 'clock64'})\n"
        "try:\n"
        "    kind.compile('sm_90a', 'calibration_nope', {})\n"
        "    err = None\n"
        "except Fa4traceError as e:\n"
        "    err = str(e)\n"
        "print(json.dumps({'a': [a.name, a.how, a.config['timebase'], callable(a.fn)],\n"
        "                  'b': [b.name, b.how, b.config['timebase']], 'err': err}))\n")
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["a"] == ["calibration_globaltimer", "jit", "globaltimer", True]
    assert got["b"] == ["calibration_clock64", "jit", "clock64"]
    assert got["err"] == "no calibration kernel calibration_nope for sm_90a"
