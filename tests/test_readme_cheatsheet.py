"""README's cheat sheet runs as shown: every command of its "On any machine" block, on the
bundled traces, exits 0 with output and no traceback or error.

Each line runs in bash (the README's brace expansion and ``$(...)`` included) with ``fa4trace``
and ``python`` standing for this checkout's, in a scratch folder that sees the repository's
traces/ (what the commands write stays there). The one line left out is ``view A.parquet
B.parquet``: it names the reader's own files and starts a server (tests/test_install.py serves
the viewer from the wheel).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NOT_RUN = {"view"}  # see the module docstring


def cheat_sheet() -> list[str]:
    """The command lines of the first bash block under '## Cheat sheet', comments stripped."""
    text = README.read_text()
    section = text.split("## Cheat sheet", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = []
    for line in block.splitlines():
        # a comment starts at '  #' after the command (a '#' inside quotes would need more care)
        cmd = re.split(r"\s{2,}#", line, maxsplit=1)[0].strip()
        if cmd:
            lines.append(cmd)
    return lines


def verb(line: str) -> str:
    return line.split()[1]


LINES = cheat_sheet()
RUN = [ln for ln in LINES if verb(ln) not in NOT_RUN]


def test_the_cheat_sheet_is_read_and_leaves_out_only_view():
    assert all(ln.startswith("fa4trace ") for ln in LINES), LINES
    assert {verb(ln) for ln in LINES} - {verb(ln) for ln in RUN} == NOT_RUN
    assert {"summary", "compare", "convert", "plot", "query"} <= {verb(ln) for ln in RUN}


@pytest.mark.parametrize("line", RUN, ids=[f"{i}-{verb(ln)}" for i, ln in enumerate(RUN)])
def test_cheat_sheet_line_runs_as_shown(line, tmp_path):
    if verb(line) == "plot":
        pytest.importorskip("plotly")
        pytest.importorskip("pandas")
    (tmp_path / "traces").symlink_to(ROOT / "traces")
    r = bash(line, tmp_path)
    assert r.returncode == 0, f"{line}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr and "fa4trace: error" not in r.stderr, r.stderr
    assert r.stdout.strip(), line
    if verb(line) == "query":  # each row's labels (the columns that are not measurements) tell it apart
        rows = json.loads(bash(line + " --json", tmp_path).stdout)
        labels = [tuple(v for v in row.values() if not isinstance(v, float)) for row in rows]
        repeated = sorted({x for x in labels if labels.count(x) > 1})
        assert rows and not repeated, f"rows alike but for their numbers: {repeated[:3]}; select what sets them apart"


def bash(line: str, cwd: Path) -> subprocess.CompletedProcess:
    """``line`` in bash, ``fa4trace`` and ``python`` being this checkout's."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    py = sys.executable
    script = f'fa4trace() {{ "{py}" -m fa4trace "$@"; }}\npython() {{ "{py}" "$@"; }}\n{line}\n'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)
