"""The rows of `fa4trace check`, its verdict and its text and JSON reports (no GPU needed).

Each check is one ``Row``: a verdict (ok / warn / fail / skip), what it measured (with units),
a one-line detail and, when not ok, what to do next.

Verdict rules (``final_verdict``), in order:
1. not usable: a row of a core group failed (``CORE_GROUPS``: the setup, the timer
   calibration, the recorder, our decode kernel), or no timer or recorder row passed
   (nothing showed that the recorder works here);
2. usable with warnings: any other row failed (FlashAttention-4's rows, the cost of tracing)
   or any row warned (FA4 not available here counts as a warning);
3. usable: everything that ran passed (skips, such as no decode kernel for this architecture,
   are neutral).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

VERDICTS = ("ok", "warn", "fail", "skip")
# Groups whose failure makes fa4trace not usable on the GPU (its own kernels and recorder).
CORE_GROUPS = ("setup", "timer", "recorder", "decode")
GROUPS = CORE_GROUPS + ("fa4", "cost")
USABLE, WARNINGS, NOT_USABLE = "usable", "usable with warnings", "not usable"
EXIT_CODES = {USABLE: 0, WARNINGS: 3, NOT_USABLE: 1}


@dataclass
class Row:
    """One check's result: ``measured`` is what a person reads (units included); ``values``
    the same numbers for the JSON report."""

    group: str
    name: str
    verdict: str
    measured: str = ""
    detail: str = ""
    next: str = ""
    values: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if self.group not in GROUPS:
            raise ValueError(f"group must be one of {GROUPS}, got {self.group!r}")
        if self.verdict in ("warn", "fail") and not self.next:
            raise ValueError(f"row {self.name!r} is {self.verdict} and says nothing to do next")


def failed(group: str, name: str, err: BaseException, next_: str) -> Row:
    """The row of a check whose kernel (or anything else) raised: its one-line error."""
    msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return Row(group, name, "fail", "", f"{type(err).__name__}: {msg}", next_)


def final_verdict(rows: list[Row]) -> str:
    """usable / usable with warnings / not usable (the rules in the module docstring)."""
    if any(r.verdict == "fail" and r.group in CORE_GROUPS for r in rows):
        return NOT_USABLE
    for g in ("timer", "recorder"):
        if not any(r.group == g and r.verdict == "ok" for r in rows):
            return NOT_USABLE
    if any(r.verdict in ("fail", "warn") for r in rows):
        return WARNINGS
    return USABLE


def exit_code(verdict: str) -> int:
    return EXIT_CODES[verdict]


@dataclass
class Report:
    """Everything a check found: the GPU, how kernels are loaded, the rows, the files written."""

    gpu: dict
    route: dict
    rows: list
    out_dir: str
    files: list = field(default_factory=list)
    options: dict = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return final_verdict(self.rows)

    def as_dict(self) -> dict:
        v = self.verdict
        return {"verdict": v, "exit_code": exit_code(v), "gpu": self.gpu, "route": self.route,
                "options": self.options, "rows": [asdict(r) for r in self.rows],
                "counts": {k: sum(r.verdict == k for r in self.rows) for k in VERDICTS},
                "out_dir": self.out_dir, "files": self.files}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=1, sort_keys=True, default=_json_default)


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    return str(o)


_MARK = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def render(report: Report) -> str:
    """The text report: GPU and route, one line per row (a second line saying what to do next
    for each warn / fail row), the files written, then the one-line verdict last."""
    g = report.gpu
    lines = [f"GPU    {g.get('name', '?')} ({g.get('arch', '?')}, {g.get('sm_count', '?')} SMs, "
             f"driver {g.get('driver') or 'n/a'}, torch {g.get('torch', 'n/a')}, CUDA {g.get('cuda_runtime') or 'n/a'})",
             "route  " + "; ".join(f"{k}: {v}" for k, v in report.route.items()), ""]
    width = max([len(r.name) for r in report.rows] + [10])
    mwidth = min(max([len(r.measured) for r in report.rows] + [8]), 48)
    group = None
    for r in report.rows:
        if r.group != group:
            group = r.group
            lines.append(f"[{group}]")
        line = f"  {_MARK[r.verdict]:4s}  {r.name:{width}s}  {r.measured:{mwidth}s}  {r.detail}".rstrip()
        lines.append(line)
        if r.verdict in ("warn", "fail") and r.next:
            lines.append(f"  {'':4s}  {'':{width}s}  next: {r.next}")
    if report.files:
        lines += ["", f"wrote {len(report.files)} files to {report.out_dir} (attach them to a bug report)"]
    c = {k: sum(r.verdict == k for r in report.rows) for k in VERDICTS}
    lines += ["", f"verdict: {report.verdict} ({c['ok']} ok, {c['warn']} warnings, {c['fail']} failed, {c['skip']} skipped)"]
    return "\n".join(lines)
