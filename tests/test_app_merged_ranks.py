"""The viewer's Profiler tab on a merge of several ranks (fa4trace merge --ranks), headless: the
ranks' table (process, GPU, clock offset, launches), the rank of each traced launch, the
cross-rank alignment error in the summary line, and a launch's facts against its rank's clock."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.testing.v1 import AppTest  # noqa: E402

from fa4trace.profiler import RankInput, merge_ranks, read_report  # noqa: E402
from fa4trace.testing.profiler import profiled_ranks  # noqa: E402
from fa4trace.viewer import merged, perfetto_ui  # noqa: E402
from test_profiler import auto_bundle  # noqa: E402

MAIN = str(Path(perfetto_ui.__file__).with_name("main.py"))
OFFSETS = [0, 25_000]


@pytest.fixture(scope="module")
def ranks_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("merged_ranks")
    runs = profiled_ranks([auto_bundle(2)], 2, host_clock_offsets_ns=OFFSETS, steps=2, layers=4)
    inputs = []
    for run in runs:
        prof = run.write(d / f"prof_rank{run.rank}.json")
        inputs.append(RankInput(run.rank, prof, [run.traces[0].save(d / f"fa4_rank{run.rank}.parquet")]))
    out = d / "all.pftrace"
    merge_ranks(inputs, out)
    return out


def test_rank_rows_and_kernel_rows_name_the_ranks(ranks_file):
    rep = read_report(ranks_file)
    ranks = merged.rank_rows(rep)
    assert [r["rank"] for r in ranks] == [0, 1] and [r["GPU"] for r in ranks] == ["0", "1"]
    assert ranks[0]["clock offset µs"] == 0 and abs(ranks[1]["clock offset µs"] - OFFSETS[1] / 1e3) < 2
    assert all(r["taken out"] for r in ranks) and ranks[1]["paired collectives"] == 8
    rows = merged.kernel_rows(rep)
    assert len(rows) == 4 and list(rows[0])[:2] == ["rank", "launch"] and {r["rank"] for r in rows} == {0, 1}
    line = merged.summary_line(ranks_file.name, rep)
    assert "2 ranks" in line and "across the ranks" in line and "nccl" in line
    e = merged.entry_of(rep, rows[-1]["launch"])
    assert f"median over the rank {e['rank']}" in merged.facts(e, rep)[1]
    # a merge of one process has no ranks' table
    assert merged.rank_rows(type(rep)(profiler_trace="p", output="o", align="start")) == []


def test_profiler_tab_lists_the_ranks(app_env, ranks_file):
    app_env.setenv("FA4TRACE_MERGED", str(ranks_file))
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(h.value == "Ranks" for h in at.subheader)
    table = next(f for f in at.dataframe if "profiler trace" in f.value.columns)
    assert list(table.value["rank"]) == [0, 1] and list(table.value["profiler trace"]) == ["prof_rank0.json",
                                                                                          "prof_rank1.json"]
    kernels = next(f for f in at.dataframe if "launch" in f.value.columns)
    assert sorted(set(kernels.value["rank"])) == [0, 1]
    assert any("2 ranks" in c.value for c in at.caption)
