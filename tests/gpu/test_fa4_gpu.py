"""FA4's forward with fa4trace hooks on a real GPU (H100/H200: SM90 AOT build; B200: SM100).

Needs an FA4 build folder ($FA4TRACE_FA4_BUILD, default build/fa4_sm90, written on any machine by
``python -m fa4trace.fa4.buildtool``) or the CuTe DSL + flash-attn-4 here to compile in process.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

BUILD = Path(os.environ.get("FA4TRACE_FA4_BUILD", "build/fa4_sm90"))


@pytest.fixture(scope="module")
def arch():

    from fa4trace.fa4.run import fa4_arch
    from fa4trace.run import loader

    a = fa4_arch()
    if not (BUILD / "manifest.json").is_file() and not loader.can_jit("fa4"):
        pytest.skip(f"no FA4 build at {BUILD} and no CuTe DSL to compile one")
    return a


def _build():
    """The AOT build folder where one exists, else None: the kernels JIT-compile here."""
    return BUILD if (BUILD / "manifest.json").is_file() else None


def _inputs(b, sk, hq, hkv, d, seed):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v


def _fns(arch, variant="default", d=128, hq=16, hkv=1):
    from fa4trace.fa4.run import load_fn

    build = _build()
    kw = dict(schedule="pingpong", d=d, hq=hq, hkv=hkv, sq=1, dtype="bf16", build=build)
    plain = load_fn(arch, traced=False, **kw)
    traced = load_fn(arch, traced=True, variant=variant, **kw)
    return plain, traced


def _run_pair(arch, b, sk, seed, variant="default", cta_first=0, cta_stride=1):
    import torch

    from fa4trace.fa4.run import call_args, capacity_for
    from fa4trace.format import layout as L
    from fa4trace.format.vocab import VOCAB, Vocabulary
    from fa4trace.trace.decode import decode_buffer

    plain, traced = _fns(arch, variant)
    pf, pp = plain.fn, plain.params
    tf, tp, tcfg = traced.fn, traced.params, traced.config
    q, k, v = _inputs(b, sk, 16, 1, 128, seed)
    scale = 1 / math.sqrt(128)
    o_plain = torch.full_like(q, float("nan"))
    o_traced = torch.full_like(q, float("nan"))
    pf(*call_args(pp, q=q, k=k, v=v, out=o_plain, softmax_scale=scale))
    ctas = b  # hkv = 1, 16 packed query heads fit one 128-row tile
    generic = bool(tcfg.get("families"))
    spec = L.BufferSpec.for_grid(ctas, tcfg["warps_per_cta"], capacity_for(arch, sk, generic=generic),
                                 cta_first=cta_first, cta_stride=cta_stride)
    buf = torch.from_numpy(spec.new_buffer().view(np.int64)).cuda()
    tf(*call_args(tp, q=q, k=k, v=v, out=o_traced, softmax_scale=scale, trace=buf))
    torch.cuda.synchronize()
    vocab = Vocabulary.from_json(tcfg["vocab"]) if generic else VOCAB
    return q, k, v, o_plain, o_traced, decode_buffer(buf.cpu().numpy(), grid_ctas=ctas, vocab=vocab)


@pytest.mark.parametrize("b,sk", [(1, 4096), (4, 32768), (1, 131072)])
def test_traced_output_is_bitwise_fa4s(arch, b, sk):
    import torch

    q, k, v, o_plain, o_traced, dec = _run_pair(arch, b, sk, seed=b * 7 + sk)
    assert not torch.isnan(o_plain).any() and not torch.isnan(o_traced).any()
    assert torch.equal(o_plain, o_traced), "markers changed FA4's output"
    # and FA4 computes attention (bf16 inputs, fp32 reference)
    qf, kf, vf = (t.float().permute(0, 2, 1, 3) for t in (q, k, v))
    s = qf @ kf.transpose(-1, -2) / math.sqrt(128)  # one KV head broadcasts over the 16 query heads
    ref = (torch.softmax(s, -1) @ vf).permute(0, 2, 1, 3)
    rel = float((o_plain.float() - ref).norm() / ref.norm())
    assert rel < 1e-2, rel
    assert dec.summary["dropped"] == 0 and dec.summary["ctas_recorded"] == b


def test_ctas_not_recording_run_fa4_untouched(arch):
    """A subset of CTAs records (1 and 3 of 4): on SM90 the others run FA4's body without hooks
    (fa4trace.auto.split). The output still equals FA4's bit for bit, and only those CTAs recorded."""
    import torch

    _q, _k, _v, o_plain, o_traced, dec = _run_pair(arch, 4, 8192, seed=11, cta_first=1, cta_stride=2)
    assert not torch.isnan(o_traced).any() and torch.equal(o_plain, o_traced)
    ctas = sorted(set(dec.table.column("cta").to_pylist()))
    assert ctas == [1, 3] and dec.summary["dropped"] == 0


def test_sm90_trace_structure(arch):
    if arch != "sm90":
        pytest.skip("SM90 event structure")
    sk = 32768
    *_, dec = _run_pair(arch, 1, sk, seed=3)
    df = dec.table.to_pandas()
    n = sk // 128
    spans = df[df.kind == "span"]
    cons = spans[spans.role == "consumer"]
    prod = spans[spans.role == "producer"]
    # every consumer warp (2 warpgroups x 4) sees every KV block once in QK, SOFTMAX and PV
    for name in ("QK", "SOFTMAX", "PV"):
        per = cons[cons.name == name].groupby("warp").iter.agg(["count", "min", "max", "nunique"])
        assert len(per) == 8, (name, per)
        assert (per["count"] == n).all() and (per["nunique"] == n).all(), (name, per)
        assert (per["min"] == 0).all() and (per["max"] == n - 1).all(), (name, per)
    # the producer loads each K and V block once, in FA4's order (last block first)
    for name in ("LOAD_K", "LOAD_V"):
        it = prod[prod.name == name].sort_values("start_ns").iter.to_numpy()
        assert sorted(it) == list(range(n)) and it[0] == n - 1, name
    # per warp and block: QK retires before its softmax starts; PV(i+1) is issued before QK(i)
    # retires (FA4's intra-warpgroup overlap)
    w = cons[cons.warp == cons.warp.min()].set_index(["name", "iter"])
    for i in range(1, n - 1):
        assert w.loc[("QK", i), "end_ns"] <= w.loc[("SOFTMAX", i), "start_ns"]
        assert w.loc[("PV", i + 1), "start_ns"] < w.loc[("QK", i), "end_ns"]
        assert w.loc[("PV", i + 1), "end_ns"] <= w.loc[("SOFTMAX", i), "end_ns"] + 2000


def test_generic_families_join_fa4s_events(arch):
    """Build variant "generic": FA4's hooks and every generic family. The output is still FA4's
    bit for bit, FA4's events are all there, and the consumers' K and V waits (FA4's pipelines,
    seen by the generic layer) are recorded inside the segments FA4's hooks open per KV block:
    once per block and warp."""
    import json

    import torch

    if arch != "sm90":
        pytest.skip("SM90 event structure")
    mf = BUILD / "manifest.json"
    if mf.is_file() and not any(f["config"].get("variant") == "generic"
                                for f in json.loads(mf.read_text())["functions"].values()):
        pytest.skip("no generic variant in the build (python -m fa4trace.fa4.buildtool)")
    sk = 16384
    n = sk // 128
    _q, _k, _v, o_plain, o_traced, dec = _run_pair(arch, 1, sk, seed=5, variant="generic")
    assert torch.equal(o_plain, o_traced) and dec.summary["dropped"] == 0
    df = dec.table.to_pandas()
    cons = df[(df.kind == "span") & (df.role == "consumer")]
    for name in ("QK", "PV", "SOFTMAX", "k.wait", "v.wait"):
        per = cons[cons.name == name].groupby("warp").size()
        assert len(per) == 8 and (per == n).all(), (name, per.to_dict())
    prod = df[df.role == "producer"]
    assert {"LOAD_K", "LOAD_V"} <= set(prod.name), sorted(set(prod.name))


def test_other_traced_variants_match(arch):
    """Every other traced build of the shape (cursor placement, per-role events) is exact too."""
    import json

    import torch

    mf = BUILD / "manifest.json"
    if not mf.is_file():
        pytest.skip("variants exist only in AOT builds")
    variants = sorted({f["config"]["variant"] for f in json.loads(mf.read_text())["functions"].values()
                       if f["config"]["traced"] and f["config"]["variant"] != "default"})
    if not variants:
        pytest.skip("no traced variants in the build (buildtool --overhead-variants)")
    for var in variants:
        _q, _k, _v, o_plain, o_traced, dec = _run_pair(arch, 2, 16384, seed=11, variant=var)
        assert torch.equal(o_plain, o_traced), var
        assert dec.summary["dropped"] == 0 and dec.table.num_rows > 0, var


def test_record_writes_a_bundle(arch, tmp_path):
    from fa4trace.fa4.run import record
    from fa4trace.trace.bundle import load

    build = _build()
    trace = record(schedule="pingpong", d=128, hq=16, hkv=1, sk=8192, b=2, sq=1, build=build)
    assert trace.meta["check"] == {"bitwise_equal_to_untraced": True, "nan_free": True}
    assert trace.meta["fa4"]["version"] == "4.0.0b36"
    back = load(trace.save(tmp_path / "fa4.parquet"))
    assert len(back) == len(trace) > 0
    assert back.meta["config"]["impl"] == "fa4"


def test_record_a_warp_subset_and_refuse_a_build_of_another_version(arch, tmp_path):
    """FA4 with --warps: only those warps record, the output is unchanged; a build written by
    another fa4trace version (here: its recorder ABI missing) is refused before anything runs."""
    import json

    from fa4trace.fa4.run import record
    from fa4trace.format.errors import Fa4traceError

    if not (BUILD / "manifest.json").is_file():
        pytest.skip("the ABI check concerns AOT builds")
    trace = record(schedule="pingpong", d=128, hq=16, hkv=1, sk=8192, b=2, sq=1, build=BUILD, warps=[0, 4])
    assert trace.meta["check"] == {"bitwise_equal_to_untraced": True, "nan_free": True}
    assert trace.meta["warp_subset"] == [0, 4]
    warps = set(trace.events.column("warp").to_pylist())
    assert warps == {0, 4}, warps  # the load warp (0) and the first consumer warp (4)

    old = tmp_path / "old_build"
    old.mkdir()
    manifest = json.loads((BUILD / "manifest.json").read_text())
    manifest.pop("recorder_abi", None)
    (old / "manifest.json").write_text(json.dumps(manifest))
    (old / manifest.get("library", "fa4trace_kernels.so")).symlink_to(
        (BUILD / manifest.get("library", "fa4trace_kernels.so")).resolve())
    with pytest.raises(Fa4traceError, match="built by another fa4trace version.*rebuild"):
        record(schedule="pingpong", d=128, hq=16, hkv=1, sk=8192, b=2, sq=1, build=old, warps=[0, 4])


def test_bench_hook_runs_fa4(arch):
    if arch != "sm90":
        pytest.skip("the bench hook runs FA4's SM90 kernel")
    import torch

    from fa4trace.fa4 import sm90_runner

    q, k, v = _inputs(2, 8192, 16, 2, 128, seed=5)
    out = sm90_runner(q, k, v, build=_build())()
    torch.cuda.synchronize()
    qf = q.float().permute(0, 2, 1, 3)
    kf = k.float().permute(0, 2, 1, 3).repeat_interleave(8, 1)
    vf = v.float().permute(0, 2, 1, 3).repeat_interleave(8, 1)
    ref = (torch.softmax(qf @ kf.transpose(-1, -2) / math.sqrt(128), -1) @ vf).permute(0, 2, 1, 3)
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2
