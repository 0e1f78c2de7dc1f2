"""The docs stay true to the repository: README.md is a five-minute read (<= 12 KB), every number
in its cost table is the value in the results file its row names, and every repository path and
relative link in README.md, BENCHMARKS.md, benchmarks/README.md and docs/*.md exists; a page under docs/
with a numbers table is held to its results files the same way.

The cost table sits between ``<!-- numbers-table`` and ``<!-- /numbers-table -->`` in README.md.
Each row names one results file in its last cell (a link to ``benchmarks/results/NAME.json``);
each number in the row's measured cells is followed by an HTML comment holding a JSON path into
that file, e.g. ``20.8<!-- rows[kernel=pingpong&d=128].us -->``. A path is dot-separated keys,
each optionally followed by ``[N]`` (an index) or ``[k=v&k=v]`` (the one list item whose fields
read so). A number equals its value when they agree at the number's shown precision.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [README, ROOT / "BENCHMARKS.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_BYTES = 12 * 1024

TABLE = re.compile(r"<!-- numbers-table.*?-->\n(.*?)<!-- /numbers-table -->", re.S)
SOURCED = re.compile(r"([+-]?\d+(?:\.\d+)?)<!--(.*?)-->")
FILE_LINK = re.compile(r"\]\((?:\.\./)?(benchmarks/results/[\w.-]+\.json)\)")  # from README or docs/
COMMENT = re.compile(r"<!--.*?-->", re.S)
REPO_PATH = re.compile(r"(?<![\w/.-])((?:benchmarks|tests|docs)/[\w./-]*\w)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
SEGMENT = re.compile(r"([^.\[\]]+)((?:\[[^\]]*\])*)")


def value_at(doc, path: str):
    """The value at ``path`` in a parsed JSON document (see the module docstring for the form).
    KeyError or IndexError names the part of the path that does not resolve."""
    node = doc
    for key, selectors in SEGMENT.findall(path.strip()):
        if key not in node:
            raise KeyError(f"{path}: no key {key!r}")
        node = node[key]
        for sel in re.findall(r"\[([^\]]*)\]", selectors):
            if sel.isdigit():
                node = node[int(sel)]
                continue
            want = dict(part.split("=", 1) for part in sel.split("&"))
            hits = [item for item in node if all(str(item.get(k)) == v for k, v in want.items())]
            if len(hits) != 1:
                raise KeyError(f"{path}: [{sel}] selects {len(hits)} items, not one")
            node = hits[0]
    return node


def agrees(shown: str, value) -> bool:
    """Whether the number as written (``"20.8"``, ``"+4.5"``) is ``value`` at its shown precision."""
    decimals = len(shown.partition(".")[2])
    return isinstance(value, (int, float)) and abs(float(shown) - value) <= 0.5 * 10 ** -decimals + 1e-9


def table_numbers(text: str) -> list[tuple[str, str, str]]:
    """(results file, number as written, JSON path) for every number of the numbers table in
    ``text``. ValueError if there is no table, a row names no single results file, or a measured
    cell holds a number without a path."""
    m = TABLE.search(text)
    if m is None:
        raise ValueError("no <!-- numbers-table --> ... <!-- /numbers-table --> in the text")
    out = []
    rows = [ln for ln in m.group(1).splitlines() if ln.startswith("|")][2:]  # after the header and |---|
    if not rows:
        raise ValueError("the numbers table has no rows")
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        files = FILE_LINK.findall(cells[-1])
        if len(files) != 1:
            raise ValueError(f"row names {len(files)} results files, not one: {row[:80]}")
        for cell in cells[1:-1]:
            found = SOURCED.findall(cell)
            if re.search(r"\d", SOURCED.sub("", cell)):
                raise ValueError(f"a number without its JSON path: {cell[:80]}")
            out += [(files[0], num, path.strip()) for num, path in found]
    return out


def test_readme_is_a_five_minute_read():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail to a page under docs/"


def test_readme_numbers_are_the_results_files_values():
    numbers = table_numbers(README.read_text())
    assert len(numbers) >= 10
    wrong = []
    for name, shown, path in numbers:
        value = value_at(json.loads((ROOT / name).read_text()), path)
        if not agrees(shown, value):
            wrong.append(f"{shown} in README, {value!r} at {name}: {path}")
    assert not wrong, wrong


@pytest.mark.parametrize("doc", [p for p in DOCS[1:] if TABLE.search(p.read_text())],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_numbers_tables_of_docs_pages_are_the_results_files_values(doc):
    """A page under docs/ with a numbers table (README's form; links to the results files from
    docs/ start with ../) shows each number as its results file holds it."""
    wrong = []
    for name, shown, path in table_numbers(doc.read_text()):
        value = value_at(json.loads((ROOT / name).read_text()), path)
        if not agrees(shown, value):
            wrong.append(f"{shown} in {doc.name}, {value!r} at {name}: {path}")
    assert not wrong, wrong


def test_value_at_selects_exactly_one_item():
    doc = {"rows": [{"kernel": "a", "b": 1, "us": 2.5}, {"kernel": "a", "b": 8, "us": 9.0}]}
    assert value_at(doc, "rows[kernel=a&b=8].us") == 9.0
    assert value_at(doc, "rows[0].us") == 2.5
    with pytest.raises(KeyError, match="selects 2 items"):
        value_at(doc, "rows[kernel=a].us")
    with pytest.raises(KeyError, match="selects 0 items"):
        value_at(doc, "rows[kernel=b].us")
    with pytest.raises(KeyError, match="no key 'ms'"):
        value_at(doc, "rows[b=1].ms")


def test_agrees_at_the_shown_precision():
    assert agrees("20.8", 20.795) and agrees("+4.5", 4.54) and agrees("0.133", 0.133)
    assert not agrees("20.8", 20.9) and not agrees("4.5", 4.56) and not agrees("1", "1")


def test_table_numbers_refuses_a_number_without_its_path():
    good = ("<!-- numbers-table -->\n| what | measured | from |\n|---|---|---|\n"
            "| x | 1.5<!-- rows[0].us --> µs | [f](benchmarks/results/f.json) |\n<!-- /numbers-table -->")
    assert table_numbers(good) == [("benchmarks/results/f.json", "1.5", "rows[0].us")]
    with pytest.raises(ValueError, match="without its JSON path"):
        table_numbers(good.replace("1.5<!-- rows[0].us -->", "1.5"))
    with pytest.raises(ValueError, match="names 0 results files"):
        table_numbers(good.replace("[f](benchmarks/results/f.json)", "f.json"))
    with pytest.raises(ValueError, match="no <!-- numbers-table"):
        table_numbers("| x | 1 |")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_paths_exist(doc):
    """Every benchmarks/..., tests/... and docs/... path the page names (outside HTML comments)."""
    text = COMMENT.sub("", doc.read_text())
    missing = sorted({p for p in REPO_PATH.findall(text) if not (ROOT / p).exists()})
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    """Every link to a file of the repository (README's docs/ links among them) reaches one."""
    text = COMMENT.sub("", doc.read_text())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (doc.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to missing files: {broken}"


def test_readme_links_every_docs_page():
    """A page under docs/ that README does not link is a page no newcomer finds."""
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)\)", COMMENT.sub("", README.read_text())))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"README.md links no {sorted(pages - linked)}"
