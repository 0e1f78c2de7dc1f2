"""The package's import structure, read from the source with ``ast`` (nothing is imported):

* no import circle between fa4trace's modules (every import counts, a function's lazy import
  too: a circle that only runs late is still two modules that cannot be understood apart);
* no private name (``_x``) imported from another module;
* the kernels (``kernels/``, installed as ``fa4trace.kernels``) import only what a kernel is
  built from (the buffer layout, the event vocabulary, the device recorder, errors and the AOT
  build's entry description), never the host side that runs them (record, loader, cli, ...).

``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of
``pkg``; a module importing one of its own ancestor packages is not an edge (Python has
already run them).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "fa4trace"
KERNELS = f"{PACKAGE}.kernels"
# What a kernel may import from fa4trace (besides fa4trace.kernels itself).
KERNEL_MAY_IMPORT = {PACKAGE, f"{PACKAGE}.format", f"{PACKAGE}.format.layout", f"{PACKAGE}.format.vocab",
                     f"{PACKAGE}.format.errors", f"{PACKAGE}.device",
                     f"{PACKAGE}.device.recorder", f"{PACKAGE}.format.entry"}

# Known breaks of the rules in modules whose fixes are pending: (importing module, imported
# module, private name). Each entry is a defect to fix, not a permission; empty it as they go.
PRIVATE_IMPORTS_PENDING: set[tuple] = set()
CIRCLES_PENDING: set[frozenset] = set()


def source_modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for fa4trace/ and kernels/ (a checkout's links inside fa4trace/, such
    as fa4trace/kernels to kernels/, are not followed)."""
    mods = {}
    pkg = root / PACKAGE
    files = [p for p in pkg.rglob("*.py") if not (pkg / p.relative_to(pkg).parts[0]).is_symlink()]
    files += sorted((root / "kernels").rglob("*.py"))
    for p in files:
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[0] == "kernels":
            parts = [PACKAGE, *parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def imports(mods: dict[str, Path]) -> list[tuple[str, str, str, int]]:
    """Every import of a package module: (importer, imported module, name or "", line)."""
    out = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out += [(mod, a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == PACKAGE]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - (node.level - 1)] + ([node.module] if node.module else [])
                    target = ".".join(base)
                else:
                    target = node.module or ""
                if target.split(".")[0] != PACKAGE:
                    continue
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    out.append((mod, sub if sub in mods else target, a.name, node.lineno))
    return out


def edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    g: dict[str, set[str]] = {m: set() for m in mods}
    for src, dst, _name, _line in imports(mods):
        if dst in mods and dst != src and not src.startswith(dst + "."):
            g[src].add(dst)
    return g


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


@pytest.fixture(scope="module")
def mods():
    return source_modules(ROOT)


def test_the_scan_sees_the_package(mods):
    """The checks below read real imports: the scan finds modules and edges known to exist."""
    g = edges(mods)
    assert {"fa4trace.cli", "fa4trace.run.record", "fa4trace.kernels.markers", "fa4trace.sweep.run"} <= set(mods)
    assert "fa4trace.trace.bundle" in g["fa4trace.run.record"]  # from .bundle import Trace
    assert "fa4trace.device" in g["fa4trace.kernels.markers"]  # from fa4trace.device import Recorder
    assert "fa4trace.format.layout" in g["fa4trace.kernels.markers"]  # from fa4trace import layout as L


def test_no_import_circles(mods):
    found = [c for c in circles(edges(mods)) if frozenset(c) not in CIRCLES_PENDING]
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_private_names_imported_across_modules(mods):
    bad = sorted({(src, dst, name, line) for src, dst, name, line in imports(mods)
                  if name.startswith("_") and not name.startswith("__") and dst != src
                  and (src, dst, name) not in PRIVATE_IMPORTS_PENDING})
    assert not bad, "private names imported: " + "; ".join(f"{s}:{ln} takes {d}.{n}" for s, d, n, ln in bad)


def test_pending_entries_are_still_real(mods):
    """An allow-list entry whose import is gone must leave the list (so it only shrinks)."""
    seen = {(src, dst, name) for src, dst, name, _line in imports(mods)}
    assert PRIVATE_IMPORTS_PENDING <= seen, PRIVATE_IMPORTS_PENDING - seen
    comps = {frozenset(c) for c in circles(edges(mods))}
    assert CIRCLES_PENDING <= comps, CIRCLES_PENDING - comps


def test_kernels_import_no_host_module(mods):
    bad = sorted({(src, dst, line) for src, dst, _name, line in imports(mods)
                  if src.startswith(KERNELS) and not (dst == KERNELS or dst.startswith(KERNELS + "."))
                  and dst not in KERNEL_MAY_IMPORT})
    assert not bad, "kernels importing host modules: " + "; ".join(f"{s}:{ln} imports {d}" for s, d, ln in bad)


def test_the_checks_catch_what_they_look_for(tmp_path):
    """A made-up package with one circle, one private import and a kernel importing the
    recorder's host side: each rule reports it."""
    pkg, kern = tmp_path / PACKAGE, tmp_path / "kernels"
    pkg.mkdir()
    kern.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from .a import f\nfrom .c import _helper\n")
    (pkg / "c.py").write_text("def _helper():\n    pass\n")
    (pkg / "record.py").write_text("")
    (kern / "__init__.py").write_text("")
    (kern / "k.py").write_text("from fa4trace.run.record import X\nfrom fa4trace import layout\n")
    m = source_modules(tmp_path)
    assert circles(edges(m)) == [["fa4trace.a", "fa4trace.b"]]
    assert [(s, d, n) for s, d, n, _ in imports(m) if n.startswith("_")] == [("fa4trace.b", "fa4trace.c", "_helper")]
    host = [(s, d) for s, d, _n, _ in imports(m) if s.startswith(KERNELS) and d not in KERNEL_MAY_IMPORT]
    assert host == [("fa4trace.kernels.k", "fa4trace.run.record")]
