"""The known-answer kernels (kernels/known_answer.py) compile for Hopper and Blackwell, and their
PTX holds the spins, the events and nothing else.

CPU only: every variant of both tests, and every recorder variant without a buffer ("off"),
compiled in one fresh interpreter per target (CUTE_DSL_ARCH is read once per process), kept in
the PTX cache (conftest.PTX_CACHE) under a key of every source the kernels are built from.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (pip install 'fa4trace[dsl]')")

from fa4trace.kernels import known_answer_spec as S  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))  # compile_pool, barrier_reads

ARCHS = ("sm_90a", "sm_100a")
COMPILE = textwrap.dedent('''
    import json, sys
    from fa4trace.kernels.known_answer import compile_variant
    from fa4trace.kernels.known_answer_spec import RECORDERS, TESTS, VARIANTS
    out = {}
    for t in TESTS:
        for v in VARIANTS:
            out[f"{t}_{v}"] = compile_variant(v, t, keep_ptx=True, tvm_ffi=False).__ptx__
        for v in RECORDERS:
            out[f"{t}_{v}_off"] = compile_variant(v, t, keep_ptx=True, tvm_ffi=False, traced=False).__ptx__
    json.dump(out, sys.stdout)
''')
# A spin: read %clock64, subtract the spin's start, compare, branch back to the read.
SPIN = re.compile(r"\$L__BB(\d+)_(\d+):\s*\n(?:\s*\.pragma[^\n]*\n)?\s*mov\.u64\s+%rd\d+, %clock64;\s*\n\s*sub\.s64[^\n]*\n"
                  r"\s*setp\.lt\.s64[^\n]*\n\s*@%p\d+ bra\s+\$L__BB\1_\2;")
EVENT_SITES = {"spans": 2 + 2 + (S.CAL_EVENTS + 2) + 3, "handoff": 5}  # the timer reads the source places
# The segments a segment recorder opens: one per event, but one for the two of a held span
# (spans: the calibration's held span; handoff: the wait)
SEGMENT_SITES = {"spans": EVENT_SITES["spans"] - 1, "handoff": EVENT_SITES["handoff"] - 1}


def _raw_ptx(arch: str, tmp_path_factory) -> dict:
    """{build: its whole PTX} for one target, compiled once (or read from the PTX cache)."""
    from compile_pool import SOURCES, cached_json, source_key
    from conftest import PTX_CACHE

    def compile_():
        env = dict(os.environ, CUTE_DSL_ARCH=arch)
        r = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=900,
                           cwd=tmp_path_factory.mktemp("ka"))
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout)

    key = source_key(arch, SOURCES, extra=COMPILE)
    return cached_json(os.path.join(PTX_CACHE, "known_answer", key + ".json"), compile_)


@pytest.fixture(scope="module", params=ARCHS)
def ptx(request, tmp_path_factory):
    arch = request.param
    raw = _raw_ptx(arch, tmp_path_factory)
    assert all(f".target {arch}" in text for text in raw.values())
    return arch, {name: _body(text) for name, text in raw.items()}


def _body(ptx: str) -> str:
    """The kernel's PTX without its (name-dependent) symbols, comments and line info."""
    body = ptx[ptx.index(".entry"):]
    body = re.sub(r"kernel_cutlass_\w+", "KERNEL", body)
    return "\n".join(ln for ln in body.splitlines() if ln.strip() and not ln.strip().startswith(("//", ".loc")))


def _reads(body: str) -> int:
    """Timer reads: %clock64, and the 32-bit %clock a shared-memory-staged Recorder reads."""
    return body.count("%clock64") + len(re.findall(r"%clock\b(?!64)", body))


def test_every_variant_compiles_for_its_target(ptx):
    """Both tests, every variant and every recorder variant off (the fixture checks the target)."""
    _, p = ptx
    assert len(p) == len(S.TESTS) * (len(S.VARIANTS) + len(S.RECORDERS))


@pytest.mark.parametrize("test", S.TESTS)
def test_without_a_buffer_every_recorder_variant_is_the_same_kernel(ptx, test):
    """The recorder compiles to nothing without a buffer: every recorder variant, off, is the
    same PTX (the spins and, for the handoff, its barriers), with no timer read but the spins'."""
    _, p = ptx
    off = {p[f"{test}_{v}_off"] for v in S.RECORDERS}
    assert len(off) == 1
    body = off.pop()
    assert "%globaltimer" not in body and "st.global" not in body
    assert body.count("%clock64") == 2 * len(SPIN.findall(body)) >= 2  # each spin: its start and its loop


@pytest.mark.parametrize("test", S.TESTS)
def test_the_untraced_twin_adds_only_its_own_timings(ptx, test):
    """The twin is the off kernel plus two %clock64 reads around each region, every one stored to
    the output array: no recorder, no other load or store."""
    _, p = ptx
    off, twin = p[f"{test}_recorder_lanes_off"], p[f"{test}_untraced"]
    assert len(SPIN.findall(twin)) == len(SPIN.findall(off))
    extra = _reads(twin) - _reads(off)
    assert extra >= (6 + 2 if test == "spans" else 4)
    assert twin.count("st.global.b64") == extra  # each extra read is a timing the host reads back
    for absent in ("%globaltimer", "ld.global", "ld.shared", "st.shared", "cache_hint"):
        assert absent not in twin, absent
    for op in ("mbarrier.", "bar.sync"):
        assert twin.count(op) == off.count(op)


@pytest.mark.parametrize("test", S.TESTS)
@pytest.mark.parametrize("variant", S.RECORDERS)
def test_each_recorder_records_its_events_the_way_the_product_does(ptx, test, variant):
    """Each traced variant keeps the off kernel's spins and barriers and adds the recorder: the
    anchors (%globaltimer), a timer read per event the source places (the compiler may copy a
    read into both sides of a branch it splits, never drop one), and its own record path."""
    _, p = ptx
    off, body = p[f"{test}_{variant}_off"], p[f"{test}_{variant}"]
    assert len(SPIN.findall(body)) == len(SPIN.findall(off))
    for op in ("mbarrier.", "bar.sync"):
        assert body.count(op) == off.count(op)
    gt = body.count("%globaltimer")
    assert gt >= 6 and gt % 3 == 0  # start and finish anchors, each caught at a timer edge
    events = _reads(body) - _reads(off) - 2 * gt // 3  # an edge anchor reads %clock64 twice
    assert EVENT_SITES[test] <= events <= EVENT_SITES[test] + 2, events
    stores_l2 = body.count("st.global.L2::cache_hint.b64")
    if variant == "recorder_lanes":
        assert "st.shared" not in body and "selp.b32" in body and stores_l2 >= 1
    elif variant == "recorder_smem":
        assert body.count("st.shared.v2.b32") == len(re.findall(r"%clock\b(?!64)", body)) >= EVENT_SITES[test]
    # segment recorders: a cursor load per segment (the compiler may forward one across a loop's
    # back edge, where the cursor was stored with nothing between), a store per record
    segments = SEGMENT_SITES[test] - 1
    if variant == "segment_gmem":
        assert "st.shared" not in body and "ld.shared" not in body
        assert body.count("ld.global") >= segments and stores_l2 >= EVENT_SITES[test]
    elif variant == "segment_smem":
        assert body.count("ld.shared.b32") >= segments and stores_l2 >= EVENT_SITES[test]
    elif variant == "segment_ring":  # records go to the ring; the slot is written once, by finish's copy
        assert body.count("ld.shared.b32") >= segments and body.count("st.shared.b64") >= EVENT_SITES[test]
        assert stores_l2 == 1


def test_the_kind_is_registered_and_compiles_by_config():
    """``known_answer`` is one of fa4trace's kinds; its JIT compile finds a variant by config."""
    from fa4trace import kernels
    from fa4trace.run import registry

    assert "known_answer" in kernels.KINDS and "known_answer" in registry.names()
    names = [n for n, _t, e in kernels.aot_variants("sm_90a", only=("known_answer",))]
    assert names == [f"known_answer_{t}_{v}" for t in S.TESTS for v in S.VARIANTS]


@pytest.mark.parametrize("variant", S.VARIANTS)
def test_each_round_barrier_is_left_before_the_next_timer_read(ptx, variant):
    """After the handoff's round barrier, every variant (the twin too) branches on %nsmid
    (clock.after_barrier) before its next timer read: bar.sync lets the warp that gets there
    first issue on until a branch, so a read right after it would run before the release."""
    _, p = ptx
    _each_round_barrier_waits(p[f"handoff_{variant}"])


def _each_round_barrier_waits(code: str, **patterns) -> None:
    """In ``code`` (PTX, or SASS with its ``patterns``), every barrier but the first (the one
    after the mbarrier init) is left before the next timer read (barrier_reads)."""
    from barrier_reads import waits_after_barriers

    rounds = waits_after_barriers(code, **patterns)[1:]
    assert rounds and all(rounds), rounds


def _sass_tools() -> bool:
    from fa4trace.bench.sass import find_tool

    return bool(find_tool("ptxas") and find_tool("nvdisasm"))


@pytest.mark.skipif(not _sass_tools(), reason="needs ptxas and nvdisasm")
@pytest.mark.parametrize("variant", ("recorder_lanes", "segment_gmem"))
def test_in_sass_a_branch_parts_each_round_barrier_from_the_next_clock_read(tmp_path_factory, variant):
    """What the PTX test above is for, in the machine code: ptxas keeps clock.after_barrier's
    branch between BAR.SYNC and the next clock read, in the variants whose span-ending read
    (a CS2R) came right after the barrier without it (the twin's round start follows the
    producer/consumer branch anyway)."""
    from fa4trace.bench.sass import sass_of

    sass = sass_of(_raw_ptx("sm_90a", tmp_path_factory)[f"handoff_{variant}"])
    _each_round_barrier_waits(sass, barrier=r"BAR\.SYNC", read=r"(CS2R|S2UR|S2R)\S*\s+\S+,\s*SR_CLOCK",
                              wait=r"\bBRA\b")
