"""fa4trace.instrument's runtime on a real GPU, through the AOT build of benchmarks/auto_kernels.py
($FA4TRACE_AUTO_BUILD, default build/auto; make it on any machine with the CuTe DSL:
``python benchmarks/auto_kernels.py build -o build/auto``).

quack's GEMM traced by the generic layer: the output equals the plain build's bit for bit, the
bundle holds every family the compile found, on the warps the roles say, with nothing dropped.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.gpu

BUILD = os.environ.get("FA4TRACE_AUTO_BUILD", "build/auto")


# Sampling(ctas=4, cta_stride=8) on a grid of 2x1 clusters: every 8th cluster, whole, until 4 CTAs
# (cluster order is the linear CTA index here: clusters run along x, the grid's x is even)
SAMPLED = {0, 1, 16, 17}


@pytest.fixture(scope="module")
def gemm():
    if not os.path.isfile(os.path.join(BUILD, "manifest.json")):
        pytest.skip(f"no instrumented build at {BUILD} (python benchmarks/auto_kernels.py build -o {BUILD})")
    from fa4trace.auto.build import load
    from fa4trace.auto.run import RecordOptions
    from fa4trace.format.options import Sampling

    return load(BUILD, "quack_gemm_sm90", options=RecordOptions(Sampling(ctas=4, cta_stride=8, capacity=8192)))


def test_quack_gemm_traced_equals_plain_and_decodes(gemm):
    import torch

    torch.manual_seed(0)
    m, n, k = 1024, 2048, 4096
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    gemm(a, b, d)
    assert gemm.checked == [True]
    ref = a.float() @ b.float().T
    assert float(((d.float() - ref).norm() / ref.norm()).item()) < 1e-2
    t = gemm.trace(config={"m": m, "n": n, "k": k})
    ev = t.events
    names = set(ev.column("name").to_pylist())
    assert {"ab.acquire", "ab.commit", "ab.wait", "ab.release", "tma.load", "mma.commit", "mma.wait"} <= names
    assert int(ev.column("dropped").to_numpy().max()) == 0
    # the CTAs asked for and no other (the rest ran the uninstrumented copy): 4 CTAs, the stride
    # stepping over whole clusters, so quack's 2x1 clusters 0 and 8 record both their CTAs
    assert set(ev.column("cta").to_pylist()) == SAMPLED
    from fa4trace.analysis.kernel import summarize_kernel

    s = summarize_kernel(t)
    assert s["roles"]["producer"]["warps"] == [8] and s["roles"]["mma"]["warps"] == list(range(8))
    # every k-tile the producer filled, the consumers waited for and released (per CTA, same counts)
    k_tiles = k // 64
    per_cta = {}
    for cta, name in zip(ev.column("cta").to_pylist(), ev.column("name").to_pylist()):
        if name in ("ab.commit", "ab.release"):
            per_cta.setdefault((cta, name), 0)
            per_cta[(cta, name)] += 1
    for (cta, name), cnt in per_cta.items():
        assert cnt % k_tiles == 0, (cta, name, cnt)


def test_every_cta_is_timed_and_the_bundle_measures_its_perturbation(gemm):
    """Every CTA of the launch, recording or not, stamps its lifetime: the bundle holds one per
    CTA of the grid (0..n-1), the recorded ones are those asked for, each recorded warp lies
    within its CTA's lifetime, and the bundle compares the recorded CTAs with the others."""
    if not gemm.meta.get("cta_lifetimes"):
        pytest.skip(f"{BUILD} was built before CTAs were timed: rebuild it (benchmarks/auto_kernels.py build)")
    import torch

    from fa4trace.analysis.fidelity import cta_lifetimes, perturbation

    m, n, k = 4096, 4096, 4096
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    gemm(a, b, d)
    t = gemm.trace(config={"m": m, "n": n, "k": k})
    life = cta_lifetimes(t).to_pandas()
    assert life["cta"].tolist() == list(range(len(life))) and len(life) > 8
    assert set(life.loc[life["recorded"], "cta"]) == SAMPLED
    assert (life["dur_ns"] > 0).all()
    assert t.meta["launches"][0]["ctas_outside_lifetime"] == 0
    p = perturbation(t)
    assert p["measured"] and p["timed"]["recorded"] == 4 and p["timed"]["untraced"] == len(life) - 4
    assert -0.05 < p["rel"] < 0.5  # every family on: a few % to a few tens of %
    assert any(c.startswith("one wave") for c in p["caveats"])  # quack's GEMM is persistent


def test_the_ring_build_keeps_each_warps_newest_records(gemm):
    """The ring build (cursor="ring", benchmarks/auto_kernels.py GEMM_RING records a warp): its
    output equals the plain build's bit for bit, every recorded warp kept at most the ring's
    records, and what a warp kept is the end of what the slot build recorded on the same
    inputs: its rows (in record order) are the last rows of that warp in the slot build's bundle."""
    from fa4trace.auto.build import load
    from fa4trace.auto.run import RecordOptions
    from fa4trace.format.options import Sampling
    from fa4trace.run.aot import BuildDir

    if "quack_gemm_sm90_ring" not in BuildDir(BUILD).functions:
        pytest.skip(f"{BUILD} has no ring build: rebuild it (benchmarks/auto_kernels.py build)")
    import torch

    ring = load(BUILD, "quack_gemm_sm90_ring", options=RecordOptions(Sampling(ctas=4, cta_stride=8, capacity=8192)))
    ring.plain = gemm.plain
    torch.manual_seed(0)
    m, n, k = 1024, 2048, 4096
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    gemm(a, b, d)
    full = gemm.trace(config={"m": m, "n": n, "k": k})
    ring(a, b, d)
    assert ring.checked == [True] and ring.meta["cursor"] == "ring"
    t = ring.trace(config={"m": m, "n": n, "k": k})
    size = ring.meta["ring"]
    launch = t.meta["launches"][0]
    assert launch["ring"] == size and launch["ring_warps"] == launch["warps_recorded"]
    assert launch["overwritten_warps"] > 0 and t.meta["total_overwritten"] == launch["overwritten"] > 0
    assert launch["records"] <= size * launch["warps_recorded"]

    def rows(trace):
        out: dict = {}
        for r in trace.events.select(["cta", "warp", "name", "iter", "kind"]).to_pylist():
            if r["kind"] != "warp":
                out.setdefault((r["cta"], r["warp"]), []).append((r["name"], r["iter"], r["kind"]))
        return out

    kept, slot = rows(t), rows(full)
    assert kept and set(kept) <= set(slot)
    for w, mine in kept.items():
        assert slot[w][len(slot[w]) - len(mine):] == mine, w
