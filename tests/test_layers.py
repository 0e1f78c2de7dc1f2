"""The package's import structure, read from the source with ``ast`` (nothing is imported):

* the floor plan of docs/architecture.md ("The layers"): each folder of fa4trace imports only
  the folders its row names and what those import in turn, nothing above or beside it, and
  every module sits in a folder of the table (or is one of the top's modules);
* no import circle between fa4trace's modules (every import counts, a function's lazy import
  too: a circle that only runs late is still two modules that cannot be understood apart);
* no private name (``_x``) imported from another module;
* device code (``fa4trace.device``; ``kernels/``, installed as ``fa4trace.kernels``) imports
  only the format and device code, never the host side that runs it.

The viewer (``app/``, installed as ``fa4trace.viewer``) is read with the package.
``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of
``pkg``; a module importing one of its own ancestor packages is not an edge (Python has
already run them).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "fa4trace"
# Folders of the repository installed as subpackages of fa4trace (pyproject.toml's package-dir).
MAPPED = {"kernels": "kernels", "app": "viewer"}
TOP = "top"  # the package's own modules, the table's top row:
TOP_MODULES = {PACKAGE, f"{PACKAGE}.kinds", f"{PACKAGE}.__main__"}
TOP_FOLDERS = {"cli"}  # ... and the folders of the top row (`cli/`): their modules are the top's too
DEVICE_LAYERS = {"format", "device", "kernels"}
DOC = ROOT / "docs" / "architecture.md"

# Known breaks of the rules in modules whose fixes are pending: (importing module, imported
# module, private name). Each entry is a defect to fix, not a permission; empty it as they go.
PRIVATE_IMPORTS_PENDING: set[tuple] = set()
CIRCLES_PENDING: set[frozenset] = set()
FLOOR_BREAKS_PENDING: set[tuple] = set()  # (importing module, imported module)


def source_modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for fa4trace/, kernels/ and app/ (a checkout's links inside
    fa4trace/, such as fa4trace/kernels to kernels/, are not followed)."""
    mods = {}
    pkg = root / PACKAGE
    files = [p for p in pkg.rglob("*.py") if not (pkg / p.relative_to(pkg).parts[0]).is_symlink()]
    for folder in MAPPED:
        files += sorted((root / folder).rglob("*.py"))
    for p in files:
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[0] in MAPPED:
            parts = [PACKAGE, MAPPED[parts[0]], *parts[1:]]
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


def floor_table(text: str) -> dict[str, set[str]]:
    """The table of docs/architecture.md's "The layers": folder -> the folders it imports
    directly (``TOP`` for the row of the package's own modules, which import anything)."""
    table = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].isdigit():
            continue
        package = re.findall(r"`([^`]+)`", cells[1])[0]
        name = TOP if package == PACKAGE else package.removeprefix(PACKAGE + ".")
        table[name] = {"*"} if "anything" in cells[4] else set(re.findall(r"`([^`]+)`", cells[4]))
    return table


def reach(table: dict[str, set[str]]) -> dict[str, set[str]]:
    """Folder -> every folder it may import: the table's, and what those may import in turn."""
    out = {}
    for name in table:
        seen, todo = set(), list(table[name])
        while todo:
            d = todo.pop()
            if d == "*":
                seen |= set(table) - {name}
            elif d not in seen:
                seen.add(d)
                todo += table.get(d, ())
        out[name] = seen
    return out


def layer_of(mod: str, table: dict[str, set[str]]) -> str | None:
    """The folder (a row of the table) ``mod`` sits in; ``TOP`` for the package's own modules
    and folders that the table's top row names; None for a module the table does not place."""
    parts = mod.split(".")
    if len(parts) >= 2 and parts[1] in table and parts[1] != TOP:
        return parts[1]
    if mod in TOP_MODULES or (len(parts) >= 2 and parts[1] in TOP_FOLDERS):
        return TOP
    return None


@pytest.fixture(scope="module")
def mods():
    return source_modules(ROOT)


@pytest.fixture(scope="module")
def table():
    return floor_table(DOC.read_text())


def floor_breaks(mods, table) -> list[tuple[str, str, int]]:
    """Imports from one folder into another that the table does not let it reach."""
    may = reach(table)
    out = []
    for src, dst, _name, line in imports(mods):
        if dst not in mods or dst == src or src.startswith(dst + "."):
            continue
        a, b = layer_of(src, table), layer_of(dst, table)
        if a != b and b not in may.get(a, set()):
            out.append((src, dst, line))
    return sorted(set(out))


def test_the_scan_sees_the_package(mods):
    """The checks below read real imports: the scan finds modules and edges known to exist."""
    g = edges(mods)
    assert {"fa4trace.cli", "fa4trace.cli.reading", "fa4trace.run.record", "fa4trace.kernels.markers",
            "fa4trace.sweep.run", "fa4trace.viewer.page"} <= set(mods)
    assert "fa4trace.trace.bundle" in g["fa4trace.run.record"]  # from ..trace.bundle import Trace
    assert "fa4trace.device" in g["fa4trace.kernels.markers"]  # from fa4trace.device import Recorder
    assert "fa4trace.format.layout" in g["fa4trace.kernels.markers"]  # from fa4trace.format import layout as L
    assert "fa4trace.analysis.text" in g["fa4trace.viewer.kernel_view"]


def test_the_floor_table_is_read(table):
    """docs/architecture.md's table names every folder of fa4trace once (a row each, or in the
    top row's folders), and the leaf imports nothing."""
    folders = {p.name for p in (ROOT / PACKAGE).iterdir()
               if p.is_dir() and not p.is_symlink() and (p / "__init__.py").exists()} | set(MAPPED.values())
    assert set(table) == (folders - TOP_FOLDERS) | {TOP}, set(table) ^ ((folders - TOP_FOLDERS) | {TOP})
    top_row = next(line for line in DOC.read_text().splitlines() if f"| `{PACKAGE}` (top) |" in line)
    assert {f"`{d}/`" for d in TOP_FOLDERS} <= set(re.findall(r"`[^`]+`", top_row.split("|")[3])), top_row
    assert table["format"] == set() and table[TOP] == {"*"}
    assert reach(table)["trace"] == {"format"}


def test_every_module_sits_on_a_floor(mods, table):
    """No flat module outside the table: each is in a folder of it, or one of the top's."""
    loose = sorted(m for m in mods if layer_of(m, table) is None)
    assert not loose, f"modules the floor table does not place: {loose}"


def test_each_floor_imports_only_what_the_table_lets_it(mods, table):
    bad = [b for b in floor_breaks(mods, table) if b[:2] not in FLOOR_BREAKS_PENDING]
    assert not bad, "imports across floors the table does not allow: " + "; ".join(
        f"{s}:{ln} imports {d}" for s, d, ln in bad)


def test_no_import_circles(mods):
    found = [c for c in circles(edges(mods)) if frozenset(c) not in CIRCLES_PENDING]
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_private_names_imported_across_modules(mods):
    bad = sorted({(src, dst, name, line) for src, dst, name, line in imports(mods)
                  if name.startswith("_") and not name.startswith("__") and dst != src
                  and (src, dst, name) not in PRIVATE_IMPORTS_PENDING})
    assert not bad, "private names imported: " + "; ".join(f"{s}:{ln} takes {d}.{n}" for s, d, n, ln in bad)


def test_pending_entries_are_still_real(mods, table):
    """An allow-list entry whose import is gone must leave the list (so it only shrinks)."""
    seen = {(src, dst, name) for src, dst, name, _line in imports(mods)}
    assert PRIVATE_IMPORTS_PENDING <= seen, PRIVATE_IMPORTS_PENDING - seen
    comps = {frozenset(c) for c in circles(edges(mods))}
    assert CIRCLES_PENDING <= comps, CIRCLES_PENDING - comps
    breaks = {b[:2] for b in floor_breaks(mods, table)}
    assert FLOOR_BREAKS_PENDING <= breaks, FLOOR_BREAKS_PENDING - breaks


def device_host_imports(mods, table) -> list[tuple[str, str, int]]:
    """Imports from device code (device/, kernels/) of anything but the format and device code."""
    return sorted({(src, dst, line) for src, dst, _name, line in imports(mods)
                   if layer_of(src, table) in {"device", "kernels"} and dst != PACKAGE
                   and layer_of(dst, table) not in DEVICE_LAYERS})


def test_device_code_imports_no_host_module(mods, table):
    bad = device_host_imports(mods, table)
    assert not bad, "device code importing host modules: " + "; ".join(f"{s}:{ln} imports {d}" for s, d, ln in bad)


def test_the_checks_catch_what_they_look_for(tmp_path):
    """A made-up package with one circle, one private import, a floor importing one above it,
    a loose module and a kernel importing the host's recorder: each rule reports it (and a
    module of a top folder, importing any floor, breaks none)."""
    pkg, kern = tmp_path / PACKAGE, tmp_path / "kernels"
    for d in (pkg, kern, pkg / "format", pkg / "trace", pkg / "run", pkg / "cli"):
        d.mkdir(exist_ok=True)
        (d / "__init__.py").write_text("")
    (pkg / "format" / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "format" / "b.py").write_text("from .a import f\nfrom .c import _helper\n")
    (pkg / "format" / "c.py").write_text("def _helper():\n    pass\n")
    (pkg / "trace" / "t.py").write_text("from ..run import record\nfrom ..format import c\n")
    (pkg / "run" / "record.py").write_text("from fa4trace.trace import t\n")
    (pkg / "loose.py").write_text("")
    (pkg / "cli" / "verbs.py").write_text("from ..run.record import X\nfrom ..format import c\n")
    (kern / "k.py").write_text("from fa4trace.run.record import X\nfrom fa4trace.format import a\n")
    table = floor_table("| 1 | `fa4trace.format` | | | nothing |\n| 2 | `fa4trace.trace` | | | `format` |\n"
                        "| 2 | `fa4trace.device` | | | `format` |\n| 3 | `fa4trace.kernels` | | | `device` |\n"
                        "| 3 | `fa4trace.run` | | | `trace` |\n| 4 | `fa4trace` (top) | | | anything below |\n")
    m = source_modules(tmp_path)
    assert sorted(circles(edges(m))) == [["fa4trace.format.a", "fa4trace.format.b"], ["fa4trace.run.record", "fa4trace.trace.t"]]
    assert [(s, d, n) for s, d, n, _ in imports(m) if n.startswith("_")] == [
        ("fa4trace.format.b", "fa4trace.format.c", "_helper")]
    assert [b[:2] for b in floor_breaks(m, table)] == [("fa4trace.kernels.k", "fa4trace.run.record"),
                                                       ("fa4trace.trace.t", "fa4trace.run.record")]
    assert [mod for mod in m if layer_of(mod, table) is None] == ["fa4trace.loose"]
    assert layer_of("fa4trace.cli.verbs", table) == TOP and "fa4trace.run.record" in edges(m)["fa4trace.cli.verbs"]
    assert [d[:2] for d in device_host_imports(m, table)] == [("fa4trace.kernels.k", "fa4trace.run.record")]
