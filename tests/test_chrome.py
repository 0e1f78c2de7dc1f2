"""Chrome trace-event JSON export: loads, one event per row, µs units, nesting per tid."""

from __future__ import annotations

import io
import json
import re
from collections import Counter, defaultdict

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

from fa4trace.export.chrome import to_chrome
from fa4trace.format.vocab import VOCAB
from fa4trace.trace.bundle import Trace
from fa4trace.trace.decode import SCHEMA, decode_buffer
from fa4trace.testing.bundles import attention_like

from trace_strategies import random_traces

SETTINGS = settings(max_examples=50, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def export(trace) -> tuple[dict, object, str]:
    f = io.BytesIO()
    stats = to_chrome(trace, f)
    text = f.getvalue().decode("utf-8")
    assert stats.bytes == len(f.getvalue())
    return json.loads(text), stats, text


def ns(us: float) -> int:
    """µs double -> ns; our decimals have exactly 3 places, so rounding recovers the integer."""
    return int(round(us * 1000))


def check(doc: dict, events: pa.Table):
    evs = doc["traceEvents"]
    df = events.to_pandas()
    data = [e for e in evs if e["ph"] in ("X", "i")]
    assert len(data) == len(df), "X + i events != Arrow rows"
    assert all(e["ph"] in ("X", "i", "M") for e in evs)
    # metadata: every pid is an SM with a process_name, every tid has a thread_name
    pnames = {e["pid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    tnames = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    multi = df["launch"].nunique() > 1
    t0 = int(df["start_ns"].min()) if len(df) else 0
    got, want = Counter(), Counter()
    for e in data:
        assert pnames[e["pid"]] == f"SM {e['pid']}"
        m = re.fullmatch(r"(?:launch (\d+) · )?CTA (\d+) · warp (\d+) · (\w+)(?: · .*)?", tnames[(e["pid"], e["tid"])])
        assert m, tnames[(e["pid"], e["tid"])]
        assert (m[1] is not None) == multi
        dur = ns(e["dur"]) if e["ph"] == "X" else 0
        if e["ph"] == "i":
            assert e["s"] == "t" and "dur" not in e
        it = e.get("args", {}).get("iter", -1)
        got[(int(m[1] or 0), e["pid"], int(m[2]), int(m[3]), m[4], e["name"], ns(e["ts"]), dur, it, e["ph"])] += 1
    for r in df.itertuples():
        want[(int(r.launch) if multi else 0, int(r.sm), int(r.cta), int(r.warp), str(r.role), str(r.name),
              int(r.start_ns) - t0, int(r.end_ns) - int(r.start_ns), int(r.iter), "i" if r.kind == "instant" else "X")] += 1
    assert got == want
    if len(df):
        assert min(e["ts"] for e in data) == 0  # rebased
    # X events on one tid never overlap without nesting; async spans never share the warp's tid
    by_tid = defaultdict(list)
    for e in data:
        if e["ph"] == "X":
            by_tid[(e["pid"], e["tid"])].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])))
    for iv in by_tid.values():
        iv = [x for x in iv if x[1] > x[0]]
        for i, (s1, e1) in enumerate(iv):
            for s2, e2 in iv[i + 1:]:
                assert e1 <= s2 or e2 <= s1 or (s1 <= s2 and e2 <= e1) or (s2 <= s1 and e1 <= e2)
    for e in data:
        if e["name"] in VOCAB.async_names():
            assert "in flight" in tnames[(e["pid"], e["tid"])]


@pytest.mark.parametrize("schedule", ["base", "pingpong"])
def test_synthetic_attention(schedule):
    buf, meta = attention_like(schedule, n_ctas=3, n_blocks=4)
    tr = Trace.from_launches([decode_buffer(buf)], meta)
    doc, stats, text = export(tr)
    check(doc, tr.events)
    assert stats.events == tr.events.num_rows and stats.processes == 3
    assert doc["otherData"]["kernel"] == meta["kernel"]
    # units: µs with ns precision, written as exact 3-decimal numbers
    assert re.search(r'"ts":\d+\.\d{3},"dur":\d+\.\d{3}', text)
    df = tr.events.to_pandas()
    qk = df[df["name"] == "QK"].iloc[0]
    e = next(e for e in doc["traceEvents"] if e.get("name") == "QK" and e.get("args", {}).get("iter") == qk["iter"]
             and ns(e["ts"]) == qk["start_ns"] - df["start_ns"].min())
    assert e["dur"] == pytest.approx((qk["end_ns"] - qk["start_ns"]) / 1000.0, abs=1e-9)


def test_path_output_and_multi_launch(tmp_path):
    b0, meta = attention_like("base", n_ctas=2, n_blocks=2, seed=1)
    b1, _ = attention_like("pingpong", n_ctas=2, n_blocks=2, seed=2)
    tr = Trace.from_launches([decode_buffer(b0, launch_index=0), decode_buffer(b1, launch_index=1)], meta)
    path = tmp_path / "t.json"
    stats = to_chrome(tr, path)
    doc = json.loads(path.read_text())
    check(doc, tr.events)
    assert stats.bytes == path.stat().st_size
    tids = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert len(tids) == stats.threads


def table(cols: dict) -> pa.Table:
    """A decode.SCHEMA table from plain lists (strings for the dictionary columns)."""
    return pa.table({f.name: (pa.array(cols[f.name]).dictionary_encode().cast(f.type)
                              if pa.types.is_dictionary(f.type) else pa.array(cols[f.name], f.type))
                     for f in SCHEMA}, schema=SCHEMA)


def test_overflowed_warp_row_carries_dropped():
    t = table({"launch": [0, 0], "cta": [0, 0], "sm": [5, 5], "warp": [0, 0], "role": ["consumer"] * 2,
               "name": ["WARP", "MARK"], "kind": ["warp", "instant"], "iter": [-1, 7], "start_ns": [100, 150],
               "end_ns": [900, 150], "start_cycles": [0, 0], "end_cycles": [0, 0], "dropped": [12, 0]})
    doc, stats, _ = export(Trace(t, {"kernel": "hand"}))
    check(doc, t)
    warp = next(e for e in doc["traceEvents"] if e.get("name") == "WARP")
    inst = next(e for e in doc["traceEvents"] if e.get("name") == "MARK")
    assert warp["args"] == {"dropped": 12} and warp["ts"] == 0 and warp["dur"] == 0.8
    assert inst["ph"] == "i" and inst["ts"] == 0.05 and inst["args"] == {"iter": 7}


def test_empty_trace_is_valid_json():
    doc, stats, _ = export(Trace(SCHEMA.empty_table(), {"kernel": "empty"}))
    assert doc["traceEvents"] == [] and stats.events == 0


@SETTINGS
@given(random_traces())
def test_random_traces(tr):
    doc, stats, _ = export(tr)
    check(doc, tr.events)
