"""The device code has no measurement switch: the benchmarks that build the recorder with a part
taken out (decode_recorder_parts.py, fa4_cost_parts.py) replace that part's method for the build
(their ``ablated``) and put it back; nothing in fa4trace/device or kernels/ reads a setting that
only a benchmark sets. The PTX side (each part taken out changes the build, the product build is
the kernel as shipped) is in test_recorder_ptx.py and test_fa4_segment_recorder.py."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEVICE_CODE = sorted((ROOT / "fa4trace" / "device").glob("*.py")) + sorted((ROOT / "kernels").glob("*.py"))
RECORDER_CLASSES = {"Recorder", "SegmentRecorder", "Segment"}


def _names(tree: ast.AST) -> set[str]:
    """Every identifier a module defines or reads (names, attributes, arguments), not its text."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
    return out


def _recorder_attributes_set(tree: ast.AST) -> list[tuple[str, int]]:
    """``Recorder.x = ...`` / ``setattr(SegmentRecorder, ...)``: a recorder class's attribute set
    from outside (a switch), with its line."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in RECORDER_CLASSES:
                found.append((f"{t.value.id}.{t.attr}", node.lineno))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in RECORDER_CLASSES):
            found.append((f"setattr({node.args[0].id}, ...)", node.lineno))
    return found


def test_device_code_names_no_ablation():
    assert DEVICE_CODE, "no device code found"
    bad = [p.relative_to(ROOT).as_posix() for p in DEVICE_CODE
           if any("ablation" in n.lower() for n in _names(ast.parse(p.read_text())))]
    assert not bad, f"a measurement switch in device code: {bad}"


def test_nothing_outside_the_device_code_sets_a_recorder_switch():
    """Benchmarks and the package build variants through ``ablated`` (methods replaced for one
    build), never by setting a class attribute the recorder reads while a kernel compiles."""
    files = [p for top in ("fa4trace", "kernels", "benchmarks") for p in sorted((ROOT / top).rglob("*.py"))
             if "device" not in p.relative_to(ROOT).parts[:2]]
    bad = [f"{p.relative_to(ROOT).as_posix()}:{ln} sets {what}" for p in files
           for what, ln in _recorder_attributes_set(ast.parse(p.read_text()))]
    assert not bad, "; ".join(bad)


def test_the_switch_scan_sees_a_switch():
    tree = ast.parse("Recorder.ablation = 'no-timer'\nsetattr(SegmentRecorder, 'ablation', None)\nx.y = 1\n")
    assert _recorder_attributes_set(tree) == [("Recorder.ablation", 1), ("setattr(SegmentRecorder, ...)", 2)]
    assert "ablation" in _names(ast.parse("if Recorder.ablation == 'no-timer': pass"))


def _benchmark(name: str):
    path = ROOT / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _recorder_methods():
    """Every attribute an ``ablated`` may replace, as it is now."""
    from fa4trace.device import clock
    from fa4trace.device.recorder import Recorder
    from fa4trace.device.segment import Segment, SegmentRecorder

    owners = {"Recorder": Recorder, "SegmentRecorder": SegmentRecorder, "Segment": Segment, "clock": clock}
    return {f"{o}.{n}": getattr(owner, n) for o, owner in owners.items() for n in dir(owner) if not n.startswith("__")}


@pytest.mark.parametrize("bench, parts", [
    ("decode_recorder_parts", lambda m: [a for a, _what in m.PARTS.values()]),
    ("fa4_cost_parts", lambda m: [None] + [a for _base, a, _what in m.VARIANTS.values()]),
])
def test_each_part_replaces_public_recorder_methods_for_the_block_only(bench, parts):
    """Entering a benchmark's ``ablated`` for each part it builds replaces only public methods
    that exist (a renamed method fails here, not in a GPU run), at least one for a part taken
    out and none for the shipped build; leaving it puts every one back."""
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (pip install 'fa4trace[dsl]')")
    mod = _benchmark(bench)
    shipped = _recorder_methods()
    for part in parts(mod):
        with mod.ablated(part):
            now = _recorder_methods()
        assert set(now) == set(shipped), part  # nothing added or taken away
        replaced = sorted(k for k in shipped if now[k] is not shipped[k])
        assert all(not k.split(".")[1].startswith("_") for k in replaced), (part, replaced)
        assert bool(replaced) == (part is not None), (part, replaced)
        assert all(_recorder_methods()[k] is shipped[k] for k in shipped), part  # put back
    with pytest.raises(ValueError, match="unknown"):
        with mod.ablated("no-such-part"):
            pass
