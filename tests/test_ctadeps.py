"""fa4trace.auto.ctadeps: whether a kernel's CTAs wait on one another, read from its PTX.

PTX snippets with known answers (no DSL needed), then real kernels compiled on the CPU
(CUTE_DSL_ARCH=sm_90a, each compile in a fresh process): small kernels with and without a
ticket, a spin wait, a reduction, a cluster barrier; our decode kernel's split-KV variant (its
in-launch combine takes a ticket from a counter and polls it); quack's persistent GEMM with its
static and its dynamic tile scheduler. fa4trace's own instrumentation (the CTA-lifetime stamps)
must not count.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from fa4trace.auto.ctadeps import cta_dependencies, dependencies_of, describe, keep_ptx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = os.path.join(ROOT, "tests", "tools", "ctadeps_probe.py")
sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))

HEAD = """.version 9.4
.target sm_90a
.address_size 64
.visible .entry k(
\t.param .u64 k_param_0
)
{
\t.reg .b32 %r<20>;
\t.reg .b64 %rd<9>;
\tld.param.u64 %rd1, [k_param_0];
"""


def ptx(*body: str) -> str:
    return HEAD + "".join(f"\t{b}\n" for b in body) + "\tret;\n}\n"


def whats(d: dict, cls: str) -> list[str]:
    return [it["what"] for it in d[cls]]


def test_a_plain_kernel_has_no_dependency():
    d = cta_dependencies(ptx("ld.global.b32 %r1, [%rd1];", "st.global.b32 [%rd1+4], %r1;",
                             "atom.shared::cta.add.u32 %r2, [%r1], 1;", "ld.volatile.shared.b32 %r3, [%r1];",
                             "st.global.b32 [%rd1+8], %r2;", "add.s32 %r4, %r3, 1;"))
    assert d["verdict"] == "none" and d["found"] == "" and d["entries"] == 1
    assert all(d[c] == [] for c in ("waits_on_ctas", "waits_on_previous_grid", "cluster_only", "fire_and_forget"))


def test_a_returning_atomic_whose_value_is_used_is_a_wait():
    d = cta_dependencies(ptx("atom.global.acq_rel.add.u32 %r7, [%rd1], 1;", "setp.eq.s32 %p1, %r7, 3;"))
    assert d["verdict"] == "waits_on_ctas"
    assert d["waits_on_ctas"][0]["ops"] == {"atom.global.acq_rel.add.u32": 1}
    assert "returning atomics" in d["found"] and "atom.global.acq_rel.add.u32 x1" in d["found"]


def test_an_atomic_whose_value_is_never_read_is_fire_and_forget():
    d = cta_dependencies(ptx("atom.global.add.u32 %r7, [%rd1], 1;", "atom.global.add.u32 %r17, [%rd1], 1;",
                             "add.s32 %r8, %r1, %r17;"))
    assert d["verdict"] == "waits_on_ctas"  # %r17 is read
    assert d["waits_on_ctas"][0]["ops"] == {"atom.global.add.u32": 1}  # %r7 is not: %r17 does not count for it
    assert whats(d, "fire_and_forget") == ["atomics on global memory whose result is unused"]


def test_spin_loads_of_global_memory_are_waits_but_not_those_of_the_cta():
    for load in ("ld.acquire.gpu.global.b32 %r3, [%rd1];", "ld.volatile.global.u32 %r3, [%rd1];",
                 "ld.relaxed.sys.b32 %r3, [%rd1];", "@%p2 ld.relaxed.gpu.global.b32 %r3, [%rd1+4];"):
        assert cta_dependencies(ptx(load))["verdict"] == "waits_on_ctas", load
    for load in ("ld.acquire.cta.shared::cta.b32 %r3, [%r1];", "ld.relaxed.cta.global.b32 %r3, [%rd1];",
                 "ld.global.nc.b32 %r3, [%rd1];", "ld.param.u64 %rd2, [k_param_0];"):
        assert cta_dependencies(ptx(load))["verdict"] == "none", load


def test_cluster_communication_is_cluster_only():
    d = cta_dependencies(ptx("barrier.cluster.arrive.relaxed;", "barrier.cluster.wait;",
                             "mapa.shared::cluster.u32 %r4, %r1, %r2;",
                             "mbarrier.arrive.shared::cluster.b64 _, [%r4];",
                             "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                             ".multicast::cluster [%r1], [%rd1, {%r2, %r3}], [%r4], %rs1;"))
    assert d["verdict"] == "cluster_only"
    assert set(whats(d, "cluster_only")) == {"cluster barriers", "distributed shared memory (mapa)",
                                              "mbarrier arrivals on another CTA of the cluster",
                                              "multicast copies to the cluster"}
    # a plain TMA load names shared::cluster as its destination without any multicast: not counted
    assert cta_dependencies(ptx("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                                "[%r1], [%rd1, {%r2, %r3}], [%r4];"))["verdict"] == "none"


def test_reductions_fences_and_release_stores_wait_for_nothing():
    d = cta_dependencies(ptx("red.relaxed.gpu.global.add.s32 [%rd1], %r6;", "fence.acq_rel.gpu;", "membar.gl;",
                             "st.release.gpu.global.b32 [%rd1], %r1;", "griddepcontrol.launch_dependents;",
                             "fence.proxy.async.shared::cta;", "fence.mbarrier_init.release.cluster;"))
    assert d["verdict"] == "fire_and_forget"
    assert set(whats(d, "fire_and_forget")) == {"reductions to global memory", "gpu-scope fences",
                                                "release / volatile stores to global memory (flags other CTAs may read)",
                                                "griddepcontrol.launch_dependents"}


def test_griddepcontrol_wait_is_its_own_class():
    d = cta_dependencies(ptx("griddepcontrol.wait;", "barrier.cluster.wait;"))
    assert d["verdict"] == "waits_on_previous_grid" and d["waits_on_ctas"] == []
    assert "PDL" in d["found"]


def test_inline_asm_blocks_are_read():
    d = cta_dependencies(ptx("{ .reg .b32 t; atom.global.cas.b32 %r9, [%rd1], 0, 1; }", "add.s32 %r10, %r9, 1;"))
    assert d["verdict"] == "waits_on_ctas"


def test_a_traced_build_leaves_out_fa4traces_two_stamps_per_entry():
    stamps = ["red.relaxed.gpu.global.max.u64 [%rd2], %rd3;", "red.relaxed.gpu.global.max.u64 [%rd4], %rd5;"]
    assert cta_dependencies(ptx(*stamps), traced=True)["verdict"] == "none"
    assert cta_dependencies(ptx(*stamps), traced=True)["fa4trace_own"] == 2
    assert cta_dependencies(ptx(*stamps))["verdict"] == "fire_and_forget"  # a plain build's are the kernel's own
    # a third one is the kernel's
    d = cta_dependencies(ptx(*stamps, "red.relaxed.gpu.global.max.u64 [%rd6], %rd7;"), traced=True)
    assert d["verdict"] == "fire_and_forget" and d["fire_and_forget"][0]["ops"] == {
        "red.relaxed.gpu.global.max.u64": 1}


def test_dependencies_of_prefers_the_plain_build():
    plain = ptx("atom.global.add.u32 %r7, [%rd1], 1;", "add.s32 %r8, %r7, 1;")
    assert dependencies_of(plain, None)["source"] == "plain build"
    assert dependencies_of(None, plain)["source"] == "traced build"
    assert dependencies_of(None, None) == {"verdict": "unknown", "reason": "no PTX kept for this build"}
    assert describe({"verdict": "none"}) == ""


def test_keep_ptx_touches_string_options_only():
    assert keep_ptx({"options": "--enable-tvm-ffi"}, "/x")["options"] == "--enable-tvm-ffi --keep-ptx --dump-dir=/x"
    assert keep_ptx({"options": ""}, "/x")["options"] == "--keep-ptx --dump-dir=/x"
    assert keep_ptx({"options": "--keep-ptx"}, "/x") == {"options": "--keep-ptx"}  # the user's own dump
    assert keep_ptx({}, "/x") == {}
    obj = object()
    assert keep_ptx({"options": obj}, "/x")["options"] is obj


# ---- real kernels, compiled on the CPU --------------------------------------------------------
def probe(*args) -> dict:
    """What tests/tools/ctadeps_probe.py reports of its kernels compiled for sm_90a (in a process
    of its own, kept in the PTX cache until a source or version it reads changes)."""
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (pip install 'fa4trace[dsl]')")
    from compile_pool import probe_json
    from conftest import PTX_CACHE

    return probe_json(PROBE, ("sm_90a", *args), PTX_CACHE)


SMALL = ("plain", "ticket", "spin", "reduce", "cluster")
VERDICTS = {"plain": "none", "ticket": "waits_on_ctas", "spin": "waits_on_ctas", "reduce": "fire_and_forget",
            "cluster": "cluster_only"}


def test_small_kernels_compiled_on_the_cpu_read_right_from_the_plain_build():
    got = probe(*SMALL)
    for name in SMALL:
        d = got[name]["deps"]
        assert got[name]["plain_ptx"] and d["source"] == "plain build" and d["fa4trace_own"] == 0
        assert d["verdict"] == VERDICTS[name], (name, d)
    assert "atom.global.acq_rel.add.u32" in got["ticket"]["deps"]["found"]
    assert "ld.acquire.gpu.global" in got["spin"]["deps"]["found"]


def test_without_a_plain_build_the_traced_ptx_is_read_less_fa4traces_stamps():
    got = probe(*SMALL, "--no-check")
    for name in SMALL:
        d = got[name]["deps"]
        assert d["source"] == "traced build" and d["fa4trace_own"] == 2, (name, d)  # the lifetime stamps
        assert d["verdict"] == VERDICTS[name], (name, d)  # the plain copy stays "none": the stamps are not its own


def test_a_compile_without_options_keeps_its_ptx_and_one_with_its_own_options_is_left_alone():
    plain = probe("ticket", "plain", "--options", "none")  # cute.compile(fn, *args): options added
    assert plain["ticket"]["deps"]["verdict"] == "waits_on_ctas" and plain["plain"]["deps"]["verdict"] == "none"
    assert plain["ticket"]["deps"]["source"] == "plain build"
    # cute.compile[EnableTVMFFI] holds options a string would replace: nothing is added, nothing is read
    bracket = probe("ticket", "--options", "bracket")
    assert bracket["ticket"]["deps"] == {"verdict": "unknown", "reason": "no PTX kept for this build"}
    assert not bracket["ticket"]["plain_ptx"] and not bracket["ticket"]["traced_ptx"]


def test_our_split_kv_decode_and_quacks_gemm_schedulers():
    try:
        import quack.gemm_sm90  # noqa: F401
    except ImportError as e:
        pytest.skip(f"quack-kernels does not import: {e}")
    got = probe("decode", "quack_static", "quack_dynamic")
    dec = got["decode"]["deps"]
    assert dec["verdict"] == "waits_on_ctas" and dec["source"] == "plain build"
    # the combine: a ticket from the arrival counter, then combiners poll it
    assert "atom.global.acq_rel.add.u32" in dec["found"] and "ld.acquire.gpu.global" in dec["found"]
    st, dyn = got["quack_static"]["deps"], got["quack_dynamic"]["deps"]
    assert st["waits_on_ctas"] == []  # the static persistent scheduler: every CTA's tiles are fixed
    assert st["verdict"] == "waits_on_previous_grid" and st["cluster_only"]  # PDL, and its 2x1 clusters
    assert dyn["verdict"] == "waits_on_ctas" and "atom.global.inc.u32" in dyn["found"]  # the tile counter


def test_the_blocks_compile_wrapper_lets_the_ptx_be_kept():
    """Inside ``instrument()`` fa4trace compiles through the block's wrapper of ``cute.compile``:
    a plain ``cute.compile`` under it still gets its PTX kept, ``cute.compile[options]`` not."""
    cute = pytest.importorskip("cutlass.cute", reason="needs nvidia-cutlass-dsl (pip install 'fa4trace[dsl]')")
    from cutlass.base_dsl.compiler import EnableTVMFFI

    from fa4trace.auto.block import PlainCompile

    def call(cc, *args, **kwargs):
        return cc(*args, **kwargs)

    wrapped = PlainCompile(call, cute.compile)
    assert keep_ptx({}, "/x", wrapped) == {"options": "--keep-ptx --dump-dir=/x"}
    assert keep_ptx({}, "/x", wrapped[EnableTVMFFI]) == {}
