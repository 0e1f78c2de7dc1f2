"""`fa4trace check` on a real GPU: the whole check runs and finds fa4trace usable (H100/H200).

Kernels come as for the other GPU tests: JIT where the CuTe DSL is installed, else the AOT
builds named by $FA4TRACE_BUILD and $FA4TRACE_FA4_BUILD (defaults build/kernels, build/fa4_sm90).
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.gpu


def test_check_finds_this_gpu_usable(kernels_available, tmp_path):
    from fa4trace.check import report as CR
    from fa4trace.check import run as C

    rep = C.run_checks(tmp_path / "check", log=print)
    print(CR.render(rep))
    core = [r for r in rep.rows if r.group in CR.CORE_GROUPS]
    assert all(r.verdict in ("ok", "skip") for r in core), [r for r in core if r.verdict not in ("ok", "skip")]
    assert rep.verdict in (CR.USABLE, CR.WARNINGS)
    if rep.route["fa4"] != "none":
        assert all(r.verdict == "ok" for r in rep.rows if r.group == "fa4"), rep.rows
    if rep.gpu["arch"] == "sm_90a":
        names = {r.name for r in rep.rows}
        assert {"ours pingpong: overlap", "ours base: overlap", "ours intrawg: overlap"} <= names
    saved = json.loads((tmp_path / "check" / C.REPORT_NAME).read_text())
    assert saved["verdict"] == rep.verdict
    for f in saved["files"]:
        assert (tmp_path / "check" / f.rsplit("/", 1)[-1]).is_file(), f
