"""The outputs the docs show are what the commands print: every `$ fa4trace ...` block of a docs
page whose input files the repository holds (and analysis.md's synthetic GEMM, made by the
snippet the page shows) is run, and each line the page shows must be a line of the real output
(a line the page cuts with "..." a prefix of one; a lone "..." skips lines)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from fa4trace.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("analysis.md", "diff.md", "fidelity.md", "static-footprint.md")
# files a page makes with a snippet of its own before its command runs
MADE = {"gemm.parquet": ("from fa4trace.testing.bundles import pipelined_like",)}


def shown_blocks(page: str) -> list[tuple[list[str], list[str]]]:
    """(argv after `fa4trace`, the lines shown under it) for each ``$ fa4trace`` block."""
    out = []
    text = (ROOT / "docs" / page).read_text()
    for block in re.findall(r"```(?:text)?\n(\$ fa4trace .*?)```", text, flags=re.S):
        cmd, *lines = block.rstrip("\n").split("\n")
        argv = shlex.split(cmd[2:], comments=True)[1:]
        shown = []
        for ln in lines:
            if ln.startswith("$ "):  # the next command ($ echo $?): not fa4trace's output
                break
            shown.append(ln)
        out.append((argv, shown))
    return out


def python_snippet(page: str, marker: str) -> str:
    """The page's ```python block holding ``marker``."""
    return next(b for b in re.findall(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), flags=re.S)
                if marker in b)


def runnable(page: str):
    for argv, lines in shown_blocks(page):
        files = [a for a in argv if a.endswith((".parquet", ".json"))]
        if all((ROOT / f).is_file() or f in MADE for f in files):
            yield pytest.param(page, argv, lines, id=f"{page}:{' '.join(argv)[:60]}")


CASES = [c for page in PAGES for c in runnable(page)]


def missing_lines(shown: list[str], real: list[str]) -> list[str]:
    """The shown lines that are not lines of the real output."""
    real = [r.rstrip() for r in real]
    bad = []
    for ln in (s.rstrip() for s in shown):
        if not ln.strip() or ln.strip() == "...":
            continue
        if ln.endswith("..."):
            if not any(r.startswith(ln[:-3].rstrip()) for r in real):
                bad.append(ln)
        elif ln not in real:
            bad.append(ln)
    return bad


def test_the_pages_show_commands_that_run_here():
    assert len(CASES) >= 8, [c.id for c in CASES]


@pytest.mark.parametrize("page, argv, lines", CASES)
def test_a_shown_output_is_what_runs(page, argv, lines, tmp_path, monkeypatch):
    made = [name for name in MADE if name in argv]
    monkeypatch.chdir(tmp_path if made else ROOT)
    for name in made:
        exec(python_snippet(page, MADE[name][0]), {})  # the page's own snippet writes it here
    r = CliRunner().invoke(main, argv)
    assert missing_lines(lines, r.output.splitlines()) == [], r.output
