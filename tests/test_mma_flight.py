"""MMA groups in flight from commit / wait_group(k) events, on hand-made timelines with known answers."""

from __future__ import annotations

import pyarrow as pa

from fa4trace.analysis.mma_flight import mma_in_flight, overlap_share
from fa4trace.trace.bundle import Trace
from fa4trace.trace.decode import SCHEMA


def _trace(rows):
    cols = {f.name: [] for f in SCHEMA}
    for warp, name, kind, it, s, e in rows:
        vals = dict(launch=0, cta=0, sm=0, warp=warp, role="unknown", name=name, kind=kind, iter=it, start_ns=s,
                    end_ns=e, start_cycles=s, end_cycles=e, dropped=0)
        for k in cols:
            cols[k].append(vals[k])
    return Trace(pa.table(cols, schema=SCHEMA), {"kernel": "t"})


def test_wait_group_one_retires_all_but_the_newest():
    # commit A at 0, commit B at 100, wait_group(1) 150-200 (retires A), wait_group(0) 300-400 (retires B)
    t = _trace([(0, "mma.commit", "instant", -1, 0, 0), (0, "mma.commit", "instant", -1, 100, 100),
                (0, "mma.wait", "span", 1, 150, 200), (0, "mma.wait", "span", 0, 300, 400),
                (0, "softmax", "span", -1, 50, 250), (1, "softmax", "span", -1, 50, 250)])
    fl = mma_in_flight(t)
    assert list(zip(fl["start_ns"].to_pylist(), fl["end_ns"].to_pylist())) == [(0, 200), (100, 400)]
    # warp 0's softmax 50-250 is all inside [0, 400) in flight; warp 1 committed nothing
    assert overlap_share(t, "softmax", fl) == 200 / 400


def test_a_wait_before_any_commit_retires_nothing_and_unretired_groups_are_left_out():
    t = _trace([(0, "mma.wait", "span", 0, 0, 10), (0, "mma.commit", "instant", -1, 20, 20),
                (0, "mma.commit", "instant", -1, 30, 30), (0, "mma.wait", "span", 1, 40, 60)])
    fl = mma_in_flight(t)
    assert list(zip(fl["start_ns"].to_pylist(), fl["end_ns"].to_pylist())) == [(20, 60)]
