"""The result-file envelope every benchmark writes: one JSON object per measured area, in the
schema ``benchmarks/report.py`` renders into BENCHMARKS.md (area, title, date, commit, gpu,
command, optional notes and columns, rows). A script's ``--json benchmarks/results/<area>.json``
followed by ``python benchmarks/report.py`` re-measures that area."""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Optional


def current_commit() -> str:
    """$FA4TRACE_COMMIT when set (a copy of a checkout whose .git is not the tree's own, as on a
    machine the sources were copied to), else the short hash of the checkout fa4trace runs
    from, else "not recorded"."""
    if os.environ.get("FA4TRACE_COMMIT"):
        return os.environ["FA4TRACE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not recorded"


def gpu_name() -> str:
    """The GPU with driver and torch versions, as the result files name it."""
    from ..run.gpu import gpu_facts

    f = gpu_facts(0)
    return f"{f['name']} (driver {f['driver'] or 'unknown'}, torch {f['torch']})"


def command_line(argv: Optional[list] = None) -> str:
    """How this process was started, for the "command" field."""
    argv = sys.argv if argv is None else argv
    script = Path(argv[0]).resolve()
    root = Path(__file__).resolve().parents[2]  # the checkout holding fa4trace/ and benchmarks/
    if script.is_relative_to(root):
        script = script.relative_to(root)
    return "python " + " ".join(shlex.quote(str(a)) for a in [script, *argv[1:]])


def envelope(area: str, title: str, rows: list, *, gpu: Optional[str] = None, command: Optional[str] = None,
             columns: Optional[list] = None, notes: Optional[str] = None, **extra) -> dict:
    """A result file's content. ``gpu``: default the visible GPU (``gpu_name``); host-only runs pass
    "none: <machine>". ``columns``: [[row key, header], ...] for report.py's generic table.
    ``extra``: more top-level keys (report.py ignores them; they keep the raw detail)."""
    doc = {"area": area, "title": title,
           "date": dt.datetime.now(dt.timezone.utc).date().isoformat(),
           "commit": current_commit(), "gpu": gpu if gpu is not None else gpu_name(),
           "command": command or command_line()}
    if notes:
        doc["notes"] = notes
    if columns:
        doc["columns"] = [list(c) for c in columns]
    doc.update(extra)
    doc["rows"] = rows
    return doc


def write(path: str | os.PathLike, doc: dict) -> Path:
    """Write ``doc`` (an ``envelope``) to ``path``, making its folder."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return p
