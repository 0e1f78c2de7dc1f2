"""Track names in the Perfetto export: the Perfetto UI cuts a long or deeply nested track name
short on screen, so every track the export describes carries its name in full, and where it
ran, in its description (the UI's help popup of the track): the GPU > launch > SM > CTA > warp
tree, the warps' in-flight lanes and the counters."""

from __future__ import annotations

import io

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from fa4trace.analysis.kernel import export_inputs
from fa4trace.export.perfetto import to_perfetto
from fa4trace.export.tracks import layout_tracks, vocab_of
from fa4trace.trace.bundle import Trace
from fa4trace.trace.decode import decode_buffer
from fa4trace.testing.bundles import T0_NS, attention_like, pipelined_like

KERNEL = "some.module.with.a.rather.Long.KernelName.__call__"


def descriptors(trace: Trace) -> dict[int, pb.TrackDescriptor]:
    shown, occupancy = export_inputs(trace)
    buf = io.BytesIO()
    to_perfetto(shown, buf, occupancy=occupancy)
    t = pb.Trace()
    t.ParseFromString(buf.getvalue())
    return {p.track_descriptor.uuid: p.track_descriptor for p in t.packet if p.HasField("track_descriptor")}


def kernel_trace(n_launches: int = 1) -> Trace:
    parts = [pipelined_like(n_ctas=2, k_tiles=4, stages=2, kernel=KERNEL, t0_ns=T0_NS + i * 10**9)
             for i in range(n_launches)]
    meta, vocab = parts[0][1], parts[0][2]
    meta["gpu"] = {"name": "NVIDIA H200"}
    return Trace.from_launches([decode_buffer(b, vocab=vocab, launch_index=i) for i, (b, _m, _v) in enumerate(parts)],
                               meta, vocab=vocab)


def test_every_track_is_described_in_full():
    tr = kernel_trace()
    tds = descriptors(tr)
    assert tds and all(td.description for td in tds.values()), [td.name for td in tds.values() if not td.description]
    root = next(td for td in tds.values() if td.HasField("process"))
    assert root.name == f"GPU NVIDIA H200 · {KERNEL}" and root.description == f"kernel {KERNEL} on NVIDIA H200"
    shown = export_inputs(tr)[0]
    lay = layout_tracks(shown.events, vocab_of(shown.meta))
    by_name = {}
    for td in tds.values():
        by_name.setdefault(td.name, []).append(td.description)
    for t in range(lay.n_tracks):  # each warp track: which warp of which CTA on which SM, and its role
        w = int(lay.track_warp[t])
        want = (f"warp {int(lay.warp_index[w])} of CTA {int(lay.warp_cta[w])} on SM {int(lay.warp_sm[w])}, "
                f"launch {int(lay.warp_launch[w])}; role {lay.warp_role[w]}")
        assert lay.track_description(t).endswith(want) or lay.track_description(t).startswith(want)
        assert lay.track_description(t) in by_name[lay.track_label(t)]
    ctas = [td for td in tds.values() if td.name.startswith("CTA ")]
    assert ctas and all(td.description.startswith(f"{td.name} on SM ") for td in ctas)
    counters = [td for td in tds.values() if td.HasField("counter")]
    assert counters and all(td.description.startswith(td.name + " in ") for td in counters)


def test_launch_tracks_and_in_flight_lanes_are_described():
    tds = descriptors(kernel_trace(n_launches=2))
    launches = [td for td in tds.values() if td.name.startswith("launch ")]
    assert len(launches) == 2 and all(td.description == td.name for td in launches)
    buf, meta = attention_like("pingpong", n_ctas=2, n_blocks=4)
    att = Trace.from_launches([decode_buffer(buf)], meta)
    lanes = [td for td in descriptors(att).values() if " in flight" in td.name]
    assert lanes
    for td in lanes:
        name = td.name.split(" (")[0]
        assert td.description.startswith(f"{name} (issue to retire)") and " of warp " in td.description
        assert " of CTA " in td.description and " on SM " in td.description
