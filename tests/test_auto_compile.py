"""``fa4trace.instrument`` compiles kernels it was never fitted to, here on the CPU.

quack-kernels' GEMM (SM90 and SM100 paths) gets every automatic family with nothing of quack
edited; a kernel with no pipeline still gets warp lifetimes and says which families it lacks;
every hook is removed after the compile; with cursor="ring" each record is a shared-memory
store and the records reach global memory only in the copy at the warp's exit. Each compile
runs in a fresh process (the CuTe DSL fixes its target arch once per process); what it reports
is kept in the PTX cache until a source or a version it reads changes.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (pip install 'fa4trace[dsl]')")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = os.path.join(ROOT, "tests", "tools", "auto_probe.py")
sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))


# Every compile the tests below read, by target. The first probe() of a run compiles those the
# PTX cache lacks in one process per target (auto_probe.py --batch: the imports and the DSL's
# first compile paid once per target, not once per compile); a compile not listed here, or one
# that failed in its batch, runs in a process of its own.
PROBES = {
    "sm_90a": [
        ("quack_gemm",), ("quack_gemm", "--families", "pipeline"), ("quack_gemm", "--no-split"),
        ("quack_gemm", "--cursor", "ring"),
        ("plain_copy",), ("plain_copy", "--families", ""), ("plain_copy", "--families", "", "--no-split"),
        ("plain_copy", "--families", "", "--no-lifetimes"),
        ("plain_copy", "--families", "", "--no-lifetimes", "--no-split"),
        ("plain_copy", "--cursor", "gmem"), ("plain_copy", "--cursor", "ring", "--ring", "16"),
        ("static_smem",), ("static_smem", "--no-split"), ("stateful",), ("stateful", "--no-split"),
        ("global_state",), ("span_loop",), ("span_loop", "--payload", "i"), ("span_loop", "--payload", "dst"),
        ("span_loop", "--payload", "nope"), ("span_barrier",), ("span_barrier", "--hold-begins"),
        ("fa4_prefill",), ("fa4_prefill", "--cursor", "ring"),
    ],
    "sm_100a": [("quack_gemm",), ("quack_gemm", "--cursor", "ring"), ("fa4_prefill",),
                ("fa4_prefill", "--cursor", "ring")],
}


def probe(*args) -> dict:
    """What tests/tools/auto_probe.py reports of one compile (compiled with the rest of
    ``PROBES``' target, or alone, and kept in the PTX cache until a source or version it reads
    changes); a compile two tests read (the smem build beside a ring build) is read once per test
    module."""
    _compile_probes()
    return json.loads(_probe_json(args))


@functools.lru_cache(maxsize=None)
def _compile_probes() -> None:
    """``PROBES`` the PTX cache lacks, one batch per target, the two targets side by side."""
    from concurrent.futures import ThreadPoolExecutor

    from compile_pool import probe_batch
    from conftest import PTX_CACHE

    def batch(arch: str) -> None:
        # the kernel, then the target, then the options: the argument order of auto_probe.py
        probe_batch(PROBE, [(k[0], arch, *k[1:]) for k in PROBES[arch]], PTX_CACHE)

    with ThreadPoolExecutor(len(PROBES)) as pool:
        list(pool.map(batch, PROBES))


def test_every_batched_probe_is_one_auto_probe_accepts(tmp_path):
    """A typo in ``PROBES`` would only compile something no test reads: each entry parses as
    auto_probe.py's arguments, and a batch of two targets is refused."""
    import subprocess

    import auto_probe

    for arch, probes in PROBES.items():
        for k in probes:
            assert auto_probe.parser().parse_args([k[0], arch, *k[1:]]).arch == arch
    batch = tmp_path / "two_targets.json"
    batch.write_text(json.dumps([["plain_copy", "sm_90a"], ["plain_copy", "sm_100a"]]))
    r = subprocess.run([sys.executable, PROBE, "--batch", str(batch)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "one target per batch" in r.stderr


@functools.lru_cache(maxsize=None)
def _probe_json(args: tuple) -> str:
    from compile_pool import probe_json
    from conftest import PTX_CACHE

    return json.dumps(probe_json(PROBE, args, PTX_CACHE))


def _needs_quack():
    try:
        import quack.gemm_sm90  # noqa: F401
    except ImportError as e:
        pytest.skip(f"quack-kernels does not import: {e}")


@pytest.fixture(scope="module")
def gemm90():
    _needs_quack()
    return probe("quack_gemm", "sm_90a")


def test_quack_gemm_sm90_every_family_found(gemm90):
    m = gemm90["meta"]
    assert m["missing"] == []
    assert set(m["found"]) == {"pipeline", "tma", "mma", "barrier"}
    assert m["warps_per_cta"] == 12  # 2 MMA warpgroups + the producer warpgroup
    assert m["pipelines"]["ab"] == {"class": "PipelineTmaAsync", "stages": 4}
    assert {"ab.acquire", "ab.commit", "ab.wait", "ab.release", "tma.load", "tma.store", "mma.commit",
            "mma.wait", "barrier.sync"} <= set(gemm90["vocab"])
    assert gemm90["params"][-1] == "fa4trace_buf"
    assert gemm90["restored"]


def test_quack_gemm_sm90_events_are_in_the_ptx(gemm90):
    # every placed call site stores at least one record; the compiler may duplicate, never drop
    assert gemm90["ptx_record_stores"] >= sum(gemm90["meta"]["placed"].values())
    assert gemm90["ptx_clock64"] >= sum(gemm90["meta"]["placed"].values())


def test_quack_gemm_sm90_fewer_families_fewer_markers(gemm90):
    _needs_quack()
    only = probe("quack_gemm", "sm_90a", "--families", "pipeline")
    assert set(only["meta"]["found"]) == {"pipeline"}
    assert only["meta"]["families"] == ["pipeline"] and only["meta"]["missing"] == []
    assert 0 < only["ptx_record_stores"] < gemm90["ptx_record_stores"]


def test_ctas_that_do_not_record_run_an_untouched_copy(gemm90):
    """split (the default): the kernel holds its body twice, every wgmma twice, but the
    records once: the copy the unselected CTAs run has no fa4trace instruction in it. The
    CTA-lifetime stamps (a timer read and a reduction at the top and at the end) sit outside
    both copies, once: every CTA runs them."""
    one = probe("quack_gemm", "sm_90a", "--no-split")
    assert one["ptx_mma"] > 0 and gemm90["ptx_mma"] == 2 * one["ptx_mma"]
    assert gemm90["ptx_record_stores"] == one["ptx_record_stores"] > 0
    assert gemm90["ptx_clock64"] == one["ptx_clock64"]
    assert gemm90["ptx_globaltimer"] == one["ptx_globaltimer"]
    assert gemm90["ptx_red_max_u64"] == one["ptx_red_max_u64"] == 2
    assert gemm90["ptx_atomics"] - gemm90["ptx_red_max_u64"] == 2 * (one["ptx_atomics"] - one["ptx_red_max_u64"])
    assert gemm90["meta"]["placed"] == one["meta"]["placed"]


@pytest.mark.parametrize("split", [True, False])
def test_untraced_ctas_carry_the_lifetime_stamps_and_nothing_else(split):
    """A copy kernel with every family off: the stamps add exactly two %globaltimer reads and
    two red.global.max.u64 to the traced build (the start and the end of every warp, outside
    the body), and the copy the unselected CTAs run adds no fa4trace instruction to them: the
    split build holds the same timer reads, reductions and stores as the one-body build."""
    flag = () if split else ("--no-split",)
    timed = probe("plain_copy", "sm_90a", "--families", "", *flag)
    untimed = probe("plain_copy", "sm_90a", "--families", "", "--no-lifetimes", *flag)
    assert timed["meta"]["cta_lifetimes"] is True and untimed["meta"]["cta_lifetimes"] is False
    assert timed["ptx_globaltimer"] - untimed["ptx_globaltimer"] == 2
    assert timed["ptx_red_max_u64"] == timed["ptx_atomics"] == 2 and untimed["ptx_atomics"] == 0
    assert timed["ptx_clock64"] == untimed["ptx_clock64"] and timed["ptx_record_stores"] == untimed["ptx_record_stores"]
    assert timed["plain_globaltimer"] == 0  # the plain build: no stamp at all
    if split:
        one = probe("plain_copy", "sm_90a", "--families", "", "--no-split")
        for k in ("ptx_globaltimer", "ptx_clock64", "ptx_red_max_u64", "ptx_record_stores", "ptx_atomics"):
            assert timed[k] == one[k], k


def test_the_start_stamp_waits_on_no_load_of_its_own():
    """The start stamp's header load is issued with the CTA selection's, right after the timer
    read, before anything waits: the warp pays one L2 round trip at the top, as without it. The
    end stamp needs no load (its entry's index stays in a register)."""
    r = probe("plain_copy", "sm_90a", "--families", "")
    top, end = r["ptx_top"], r["ptx_tail"]
    assert top[0] == "timer" and top[1:4] == ["load", "load", "red"], top
    assert "load" not in end and end[-2:] == ["timer", "red"], end


def test_both_copies_share_static_shared_memory():
    """A body that takes 32 KB with cute.arch.alloc_smem: the split kernel holds the body twice
    but the 32 KB once (plus the 128 B of warp cursors)."""
    two = probe("static_smem", "sm_90a")
    one = probe("static_smem", "sm_90a", "--no-split")
    assert two["meta"]["split"] is True and one["meta"]["split"] is False
    assert two["ptx_barriers"] == 2 * one["ptx_barriers"] > 0
    assert two["ptx_static_smem"] == one["ptx_static_smem"] == 32768 + 128


def test_a_body_that_changes_state_compiles_twice():
    """A kernel that sets a runtime field of its TiledMma argument and replaces an attribute of
    its object while traced (as CUTLASS's Hopper GEMM examples do): each copy of the split body
    starts from the same state, else the second uses values made inside the first."""
    two = probe("stateful", "sm_90a")
    one = probe("stateful", "sm_90a", "--no-split")
    assert two["meta"]["split"] is True and one["meta"]["split"] is False
    assert two["ptx_globaltimer"] == one["ptx_globaltimer"] > 0 and two["restored"]


def test_state_the_split_cannot_separate_falls_back_to_one_body():
    """A body that keeps a traced value in a module global: its two copies would share it, so the
    kernel is compiled with one body and its metadata says why."""
    r = probe("global_state", "sm_90a")
    assert r["meta"]["split"] is False and "outside its arguments" in r["meta"]["split_refused"]
    assert r["ptx_globaltimer"] > 0 and r["restored"]


def test_quack_gemm_sm100_compile_checked():
    """Blackwell: compile-checked only (no B200 here); the UMMA pipelines and tcgen05 issue are seen."""
    _needs_quack()
    r = probe("quack_gemm", "sm_100a")
    m = r["meta"]
    assert m["missing"] == []
    assert {"PipelineTmaUmma", "PipelineUmmaAsync"} <= {p["class"] for p in m["pipelines"].values()}
    assert "mma.issue" in r["vocab"]
    assert r["ptx_record_stores"] >= sum(m["placed"].values())
    assert m["split"] is True and r["ptx_mma"] > 0  # its body compiles twice (unlike FA4's SM100 one)
    assert r["restored"]


def test_kernel_without_pipeline_records_lifetimes_and_says_what_it_lacks():
    r = probe("plain_copy", "sm_90a")
    m = r["meta"]
    assert m["found"] == {} and m["missing"] == ["barrier", "mma", "pipeline", "tma"]
    assert m["warps_per_cta"] == 4
    assert r["vocab"] == []
    # the warp's start and finish anchors read %globaltimer; the plain kernel never does
    assert r["ptx_globaltimer"] >= 2 and r["plain_globaltimer"] == 0
    assert r["restored"]
    # CTAs are chosen in cluster order (a sampled CTA brings its whole cluster): the selection
    # reads the cluster's index, the grid's cluster count, the cluster size and the CTA's rank
    assert r["ptx_cluster_sregs"] == ["cluster_ctarank", "cluster_nctarank", "clusterid", "nclusterid"]


def test_span_payload_is_the_named_argument():
    """spans={"step": {"target": ..., "payload": "i"}}: each call's loop index is the span's
    payload, read at run time (the plain span folds "no payload" into a constant instead)."""
    plain = probe("span_loop", "sm_90a")
    assert plain["vocab"] == ["step"] and plain["meta"]["placed"] == {"step": 1}
    assert plain["ptx_payload_ops"] == 0
    with_payload = probe("span_loop", "sm_90a", "--payload", "i")
    assert with_payload["vocab"] == ["step"] and with_payload["ptx_record_stores"] == plain["ptx_record_stores"]
    assert with_payload["ptx_payload_ops"] >= 1
    assert with_payload["restored"]


def test_a_users_span_keeps_the_hooked_calls_inside_it():
    """A span the user names stores its begin before the call (families.STORE_AT_BEGIN), so a
    named barrier synced inside the spanned helper is still an event of its own; a span held
    open across the call would bracket it and it would record nothing."""
    r = probe("span_barrier", "sm_90a")
    assert r["meta"]["placed"] == {"step": 1, "barrier.sync": 1} and r["vocab"] == ["step", "barrier.sync"]
    # the barrier's own span ends after the release (clock.after_barrier), not at the first
    # timer read the warp can issue past bar.sync
    assert r["ptx_barriers_settled"] == 1
    held = probe("span_barrier", "sm_90a", "--hold-begins")
    assert held["meta"]["placed"] == {"step": 1} and held["ptx_clock64"] < r["ptx_clock64"]
    assert held["ptx_barriers_settled"] == 0  # no barrier event of its own: nothing emitted
    assert r["restored"] and held["restored"]


@pytest.mark.parametrize("arg, error, words", [
    ("dst", "Fa4traceError", ["argument 'dst' is a", "not an integer"]),
    ("nope", "ValueError", ["has no parameter 'nope'", "dst, i, scale"]),
])
def test_bad_span_payload_is_one_line(arg, error, words):
    r = probe("span_loop", "sm_90a", "--payload", arg)
    assert r["error"] == error and "\n" not in r["message"]
    assert all(w in r["message"] for w in words), r["message"]


def test_gmem_cursor_compiles_too():
    r = probe("plain_copy", "sm_90a", "--cursor", "gmem")
    assert r["meta"]["cursor"] == "gmem" and r["ptx_globaltimer"] >= 2


def test_instrument_context_intercepts_cute_compile():
    """fa4trace.instrument() turns a cute.compile inside the block into an instrumented compile
    and restores cute.compile afterwards (running it needs a GPU: see tests/gpu)."""
    code = (
        "import os, json; os.environ['CUTE_DSL_ARCH'] = 'sm_90a'\n"
        "import sys; sys.path.insert(0, 'tests/tools')\n"
        "import auto_probe, cutlass, cutlass.cute as cute, fa4trace\n"
        "from cutlass.cute.runtime import make_fake_compact_tensor\n"
        "entry, kern = auto_probe.copy_kernel()\n"
        "t = make_fake_compact_tensor(cutlass.Float32, (cute.sym_int(),), assumed_align=16)\n"
        "real = cute.compile\n"
        "with fa4trace.instrument(kernels=[kern], families=('barrier',), roles={'copy': [0, 1, 2, 3]}) as s:\n"
        "    k = cute.compile(entry, t, t)\n"
        "print(json.dumps({'type': type(k).__name__, 'restored': cute.compile is real, 'n': len(s.kernels),\n"
        "                  'families': k.meta['families'], 'roles': k.meta['roles'], 'params': k.meta['params'],\n"
        "                  'plain': k.plain is not None}))\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"type": "Instrumented", "restored": True, "n": 1, "families": ["barrier"],
                   "roles": {"copy": [0, 1, 2, 3]}, "params": ["src", "dst", "fa4trace_buf"], "plain": True}


def _needs_fa4():
    try:
        from fa4trace.fa4 import FA4_VERSIONS, fa4_version
    except ImportError as e:  # pragma: no cover
        pytest.skip(f"fa4trace.fa4 does not import: {e}")
    if fa4_version() not in FA4_VERSIONS:
        pytest.skip(f"flash-attn-4 {FA4_VERSIONS} is not installed")


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_fa4_prefill_through_the_generic_layer(arch):
    """FA4's forward (prefill) with nothing but the generic layer and one named span; sm_100a is
    compile-checked only (no B200 here)."""
    _needs_fa4()
    r = probe("fa4_prefill", arch)
    m = r["meta"]
    assert r["restored"] and m["spans_missing"] == [] and "softmax" in r["vocab"]
    assert {"pipeline", "tma", "barrier"} <= set(m["found"])
    classes = {p["class"] for p in m["pipelines"].values()}
    if arch == "sm_90a":
        assert m["missing"] == [] and classes == {"PipelineTmaAsync"} and m["warps_per_cta"] == 12
        assert set(m["pipelines"]) == {"q", "k", "v"}
        assert m["split"] is True and r["ptx_mma"] > 0
    else:  # FA4 issues its tcgen05 MMAs through its own PTX helpers: no mma events to find
        assert m["missing"] == ["mma"] and {"PipelineTmaUmma", "PipelineUmmaAsync"} <= classes
        # those helpers declare PTX registers by name: a second copy of the body cannot be
        # compiled, so every CTA runs the instrumented one, and the bundle's metadata says why
        assert m["split"] is False and "inline PTX" in m["split_refused"]
    assert r["ptx_record_stores"] >= sum(m["placed"].values())


def _ring_matches_smem(ring: dict, smem: dict) -> None:
    """A ring build against the smem-cursor build of the same kernel: the same records, each one
    st.shared.b64 instead of a bounds-checked global store; one global record store left, the
    copy at the warp's exit; the rings (CTA's warps x 128 records x 8 B) and the cursors in
    static shared memory; the CTA-lifetime stamps as before."""
    m = ring["meta"]
    assert m["cursor"] == "ring" and m["ring"] == 128 and m["ring_cta_warps"] == m["warps_per_cta"]
    assert m["ring_smem_bytes"] == 128 + 8 * 128 * m["warps_per_cta"] == ring["ptx_static_smem"]
    assert smem["ptx_static_smem"] == 128 and smem["ptx_shared_b64_stores"] == 0
    assert ring["ptx_shared_b64_stores"] == smem["ptx_record_stores"] >= sum(m["placed"].values()) > 0
    assert ring["ptx_record_stores"] == ring["ptx_exit_record_stores"] == 1
    assert ring["ptx_clock64"] == smem["ptx_clock64"] and ring["meta"]["placed"] == smem["meta"]["placed"]
    # each slot record store sits behind its bounds branch; the ring's exit copy adds two
    assert ring["ptx_branches"] <= smem["ptx_branches"] - smem["ptx_record_stores"] + 4
    assert ring["ptx_red_max_u64"] == smem["ptx_red_max_u64"] == 2
    assert ring["restored"]


def test_quack_gemm_sm90_ring_build(gemm90):
    """cursor="ring" on quack's SM90 GEMM (split: the CTAs that do not record run the plain copy,
    which stores nothing into the ring: its st.shared.b64 count is the smem build's record count,
    not twice it)."""
    ring = probe("quack_gemm", "sm_90a", "--cursor", "ring")
    assert ring["meta"]["split"] is True and ring["ptx_mma"] == gemm90["ptx_mma"] > 0
    _ring_matches_smem(ring, gemm90)


def test_quack_gemm_sm100_ring_build():
    _needs_quack()
    _ring_matches_smem(probe("quack_gemm", "sm_100a", "--cursor", "ring"), probe("quack_gemm", "sm_100a"))


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_fa4_prefill_ring_build(arch):
    _needs_fa4()
    ring, smem = probe("fa4_prefill", arch, "--cursor", "ring"), probe("fa4_prefill", arch)
    _ring_matches_smem(ring, smem)
    assert "softmax" in ring["vocab"]


def test_ring_size_and_a_kernel_without_events():
    """--ring 16: 16 records a warp. A kernel that records nothing keeps no ring (the compiler
    sees the cursor stay 0 and drops it), whatever its size."""
    r = probe("plain_copy", "sm_90a", "--cursor", "ring", "--ring", "16")
    assert r["meta"]["ring"] == 16 and r["meta"]["ring_cta_warps"] == 4
    assert r["meta"]["ring_smem_bytes"] == 128 + 4 * 16 * 8
    assert r["ptx_static_smem"] == 128 and r["ptx_globaltimer"] >= 2
