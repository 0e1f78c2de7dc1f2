"""The options objects on a real GPU: a recording made with a ``Sampling`` / ``Shape`` /
``Placement`` records exactly what the same recording made with the keywords records (the
entry points build one object from either), and what the objects say reaches the bundle.

Run where a GPU is: ``pytest -m gpu tests/gpu/test_options_gpu.py`` (our kernels JIT with the
CuTe DSL, or from an AOT build: ``fa4trace build``; the instrument() test needs the CuTe DSL and
quack's RMSNorm where the GPU is).
"""

from __future__ import annotations

import pytest

from fa4trace.format.options import Placement, Sampling
from fa4trace.format.shape import Shape

pytestmark = pytest.mark.gpu


def _recorded(trace) -> tuple:
    """(CTAs, warp indices) that have events in the bundle."""
    ev = trace.events
    return sorted(set(ev["cta"].to_pylist())), sorted(set(ev["warp"].to_pylist()))


def test_markers_sampling_object_and_keywords_record_the_same_ctas_and_warps(kernels_available):
    from fa4trace.probes.markers import record_markers

    who = Sampling(cta_first=3, cta_stride=7, ctas=10, warps=(0, 2))
    by_object = record_markers(variant="fa4trace", n_ctas=264, iters=20, chain=2, sampling=who)
    by_keywords = record_markers(variant="fa4trace", n_ctas=264, iters=20, chain=2, cta_first=3, cta_stride=7,
                                 max_ctas=10, warps=[2, 0])
    assert _recorded(by_object) == _recorded(by_keywords) == ([3 + 7 * i for i in range(10)], [0, 2])
    for t in (by_object, by_keywords):
        ln = t.info.launches[0]
        assert ln.recorded_ctas == "3:73:7" and ln.warp_subset == [0, 2] and t.info.cta_subset is True
        assert ln.capacity == 2 * 20 + 8 and t.info.total_dropped == 0  # the recording's own slot size


def test_attention_shape_and_sampling_reach_the_bundle(kernels_available):
    from fa4trace.attention import LEAD_WARPS
    from fa4trace.attention.record import record_attention

    shape = Shape(b=2, sq=2, hq=16, hkv=2, sk=4096, d=64)
    t = record_attention("pingpong", shape, sampling=Sampling(warps=LEAD_WARPS, capacity=512))
    cfg = t.info.config
    assert {k: cfg[k] for k in shape.config()} == shape.config() and cfg["schedule"] == "pingpong"
    assert t.info.warp_subset == list(LEAD_WARPS) and t.info.launches[0].capacity == 512
    assert _recorded(t)[1] == list(LEAD_WARPS)
    same = record_attention("pingpong", b=2, sq=2, hq=16, hkv=2, sk=4096, d=64, warps=LEAD_WARPS, capacity=512)
    assert {k: same.info.config[k] for k in shape.config()} == shape.config()
    assert same.info.launches[0].grid == t.info.launches[0].grid


def test_instrument_sampling_and_placement_objects_and_keywords_agree():
    torch = pytest.importorskip("torch")
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl where the GPU is (pip install 'fa4trace[dsl]')")
    qr = pytest.importorskip("quack.rmsnorm", reason="needs quack-kernels (pip install 'fa4trace[fa4]')")
    import fa4trace

    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.float32)
    plain = qr.rmsnorm(x, w)
    bundles = []
    for kw in ({"sampling": Sampling(ctas=4, cta_stride=8), "placement": Placement(cursor="gmem", l2="last")},
               {"ctas": 4, "cta_stride": 8, "cursor": "gmem", "l2": "last"}):
        with fa4trace.instrument(**kw) as rec:
            out = qr.rmsnorm(x, w)
        assert torch.equal(out, plain)
        bundles.append(rec.traces()[-1])
    for t in bundles:
        inst = t.info.instrument
        assert inst.cursor == "gmem" and inst.l2 == "last"
        assert t.info.launches[0].recorded_ctas == "0:32:8"
    # CTAs 0, 8, 16, 24 of the grid, each with its cluster, where the grid has them
    assert _recorded(bundles[0]) == _recorded(bundles[1]) and _recorded(bundles[0])[0]
