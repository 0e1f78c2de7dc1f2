"""Hypothesis strategies shared by the exporter tests: small random multi-launch traces."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from fa4trace.format import layout as L
from fa4trace.format.vocab import EV, ROLE
from fa4trace.trace.bundle import Trace
from fa4trace.trace.decode import decode_buffer
from fa4trace.testing.bundles import WarpEvents, write_buffer

EVENTS = [EV.QK, EV.PV, EV.SOFTMAX, EV.CORRECTION, EV.LOAD_K, EV.MARK]
ROLES = [ROLE.PRODUCER, ROLE.CONSUMER, ROLE.MMA, ROLE.UNKNOWN]


@st.composite
def random_traces(draw):
    """1-2 launches of random warps: overlapping, crossing, zero-length spans and instants."""
    launches = []
    for li in range(draw(st.integers(1, 2))):
        wpc, n_cta = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        spec = L.BufferSpec(wpc, n_cta, 48)
        ws = []
        for c in range(n_cta):
            sm = draw(st.integers(0, 3))
            for w in range(wpc):
                recs = []
                for _ in range(draw(st.integers(0, 10))):
                    ev = draw(st.sampled_from(EVENTS))
                    s, d = draw(st.integers(0, 400)), draw(st.integers(0, 150))
                    pay = draw(st.sampled_from([-1, 0, 1, 2, 3]))
                    if draw(st.integers(0, 5)) == 0:
                        recs.append((s, 1, L.KIND_INSTANT, ev, pay))
                    else:
                        recs += [(s, 0, L.KIND_BEGIN, ev, pay), (s + d, 2, L.KIND_END, ev, pay)]
                recs.sort(key=lambda x: (x[0], x[1]))
                a = np.array(recs, np.int64).reshape(-1, 5)
                clk0 = 10**9 + 1000 * c
                ws.append(WarpEvents(c, w, sm, draw(st.sampled_from(ROLES)), clk0, clk0 + 3000,
                                     5 * 10**14 + 1000 * c, 5 * 10**14 + 1000 * c + 3000,
                                     a[:, 2], a[:, 3], a[:, 4], clk0 + a[:, 0]))
        launches.append(decode_buffer(write_buffer(spec, ws), launch_index=li))
    return Trace.from_launches(launches, {"kernel": "hypothesis", "gpu": {"name": "TestGPU"}})
