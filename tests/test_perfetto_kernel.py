"""Perfetto export of automatically traced kernels: role-named warp tracks and stage-occupancy counters.

Parsed back with the perfetto protos by the reader of tests/test_perfetto.py.
"""

from __future__ import annotations

import re

import numpy as np

from fa4trace.analysis.kernel import export_inputs, occupancy_series
from fa4trace.analysis.roles import assign_roles
from fa4trace.trace.bundle import Trace
from fa4trace.trace.decode import decode_buffer
from fa4trace.testing.bundles import attention_like, pipelined_like

import test_perfetto
from test_perfetto import check_against_rows, check_tree, parse


def bundle(**kw) -> Trace:
    buf, meta, vocab = pipelined_like(**kw)
    return Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab)


def export(trace: Trace, **kw):
    """What `fa4trace convert --to perfetto` writes: roles and occupancy first, then the export."""
    shown, occupancy = export_inputs(trace)
    return test_perfetto.export(shown, occupancy=occupancy, **kw)


def counters_by_cta(P, name: str) -> dict:
    out = {}
    for u, td in P.tracks.items():
        if td.name == name:
            parent = P.tracks[td.parent_uuid].name
            assert re.fullmatch(r"CTA \d+", parent) and td.HasField("counter")
            out[int(parent.split()[1])] = P.counters[u]
    return out


def test_tiny_counter_is_the_hand_worked_series():
    tr = bundle(n_ctas=1, k_tiles=4, stages=2, consumer_warps=1, idle_warps=0, load_ns=100, mma_ns=50, store_ns=100)
    data, _ = export(tr)
    P = parse(data)
    (series,) = counters_by_cta(P, "ab stages held").values()
    assert series == [(70, 1), (100, 2), (260, 1), (280, 2), (360, 1), (380, 2), (470, 1), (570, 0)]
    lanes = sorted(td.name for td in P.tracks.values() if td.name.startswith("warp "))
    assert lanes == ["warp 0 · mma", "warp 1 · producer", "warp 2 · epilogue"]


def test_round_trip_with_roles_and_one_counter_per_cta_and_pipeline():
    rng = np.random.default_rng(3)
    tr = bundle(n_ctas=3, k_tiles=10, stages=3, load_ns=rng.integers(50, 1500, (3, 10)), straggler_ns=100)
    data, stats = export(tr)
    P = parse(data)
    check_tree(P)
    assigned = assign_roles(tr)
    check_against_rows(P, assigned.events)  # every row one slice, under a warp track named by its role
    roles = {td.name for td in P.tracks.values() if td.name.startswith("warp ")}
    assert {"warp 4 · producer", "warp 0 · mma", "warp 3 · mma", "warp 5 · idle", "warp 7 · epilogue"} <= roles
    got = counters_by_cta(P, "ab stages held")
    occ = occupancy_series(assigned).to_pandas()
    assert sorted(got) == [0, 1, 2]
    for cta, pts in got.items():
        want = occ[occ.cta == cta]
        assert pts == list(zip(want.t_ns.tolist(), want.stages_full.tolist()))
        assert max(v for _, v in pts) <= 3 and pts[-1][1] == 0
    assert stats.counter_points == sum(len(v) for v in P.counters.values())


def test_attention_bundles_get_no_occupancy_counters():
    buf, meta = attention_like("pingpong", n_ctas=2, n_blocks=4)
    P = parse(export(Trace.from_launches([decode_buffer(buf)], meta))[0])
    assert not any("stages held" in td.name for td in P.tracks.values())
    P = parse(export(bundle(n_ctas=1, k_tiles=3), counters=False)[0])
    assert not P.counters


def test_chrome_threads_are_named_by_role_too():
    import io
    import json

    from fa4trace.export.chrome import to_chrome

    f = io.BytesIO()
    to_chrome(export_inputs(bundle(n_ctas=1, k_tiles=3))[0], f)
    names = {e["args"]["name"] for e in json.loads(f.getvalue())["traceEvents"] if e.get("name") == "thread_name"}
    assert "CTA 0 · warp 4 · producer" in names and "CTA 0 · warp 7 · epilogue" in names


def test_the_exporters_draw_what_they_are_given():
    """No analysis inside the exporters: without export_inputs the warps keep the role the
    decoder gave them and no occupancy counter appears; export_inputs leaves other bundles as
    they are."""
    import io
    import json

    from fa4trace.export.chrome import to_chrome

    tr = bundle(n_ctas=1, k_tiles=3)
    P = parse(test_perfetto.export(tr)[0])
    assert {td.name for td in P.tracks.values() if td.name.startswith("warp ")} == {
        f"warp {w} · unknown" for w in tr.events["warp"].unique().to_pylist()}
    assert not any("stages held" in td.name for td in P.tracks.values())
    f = io.BytesIO()
    to_chrome(tr, f)
    names = {e["args"]["name"] for e in json.loads(f.getvalue())["traceEvents"] if e.get("name") == "thread_name"}
    assert names and all(n.endswith("· unknown") for n in names)
    buf, meta = attention_like("pingpong", n_ctas=2, n_blocks=4)
    att = Trace.from_launches([decode_buffer(buf)], meta)
    assert export_inputs(att) == (att, None)
