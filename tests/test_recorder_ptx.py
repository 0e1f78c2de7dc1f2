"""The device recorder compiles for Hopper and Blackwell, and costs nothing when off.

CPU only: CuTe DSL compiles without a GPU when CUTE_DSL_ARCH names the target.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (pip install 'fa4trace[dsl]')")

# Each compile runs in a fresh interpreter: CUTE_DSL_ARCH is read once per process.
KERNELS = textwrap.dedent('''
    import os, sys, json
    import cutlass, cutlass.cute as cute
    from cutlass import Int32, Float32, const_expr
    from typing import Optional
    from fa4trace.device import Recorder
    from fa4trace.format.vocab import EV, ROLE
    from fa4trace.format import layout as L

    def configure(env):
        """The build a request names (the kernels read these globals when they are traced)."""
        global TB, STAGED, STAGE, ABLATION, BLOCK, WHEN, SETTLE, SHARE, EVENTS
        TB = int(env.get("TB", "0"))
        STAGED = env.get("STAGED", "1") == "1"
        STAGE = env.get("STAGE", "lanes")  # where staged records wait: lanes | smem
        ABLATION = env.get("ABLATION") or None  # a part taken out (benchmarks/decode_recorder_parts.py)
        BLOCK = int(env.get("BLOCK", "0"))  # events reserved per iteration (0: no blocks)
        WHEN = env.get("WHEN", "0") == "1"  # the MARK outside its if, predicated (when=)
        SETTLE = env.get("SETTLE", "now")  # now | later (start(settle=False) ... settle()) | never
        SHARE = env.get("SHARE", "0") == "1"  # SOFTMAX's end takes its begin's timer read (t=)
        # EVENTS: comma names of the events that record ("" = none); unset = all
        EVENTS = None if "EVENTS" not in env else [getattr(EV, n) for n in env["EVENTS"].split(",") if n]

    @cute.kernel
    def traced(x: cute.Tensor, trace: Optional[cute.Tensor], n: Int32):
        rec = Recorder.start(trace, ROLE.BENCH, timebase=TB, staged=STAGED, events=EVENTS,
                             settle=SETTLE == "now", stage=STAGE, stage_warps=4)
        tid, _, _ = cute.arch.thread_idx()
        if const_expr(SETTLE != "now"):
            rec.begin(EV.LOAD_Q, 0)
            x[tid] = x[tid] + Float32(1.0)  # the warp's first work, before it claims its slot
            rec.end(EV.LOAD_Q, 0)
        if const_expr(SETTLE == "later"):
            rec = rec.settle()
        acc = Float32(0)
        for i in cutlass.range(n):
            if const_expr(BLOCK > 0):
                rec = rec.open_block(BLOCK)
            t = rec.timer() if const_expr(SHARE) else None
            rec.begin(EV.SOFTMAX, i, t=t)
            acc = acc * Float32(0.5) + x[tid + i]
            if const_expr(WHEN):
                rec.instant(EV.MARK, i, when=acc > Float32(3.0))
            else:
                if acc > Float32(3.0):
                    rec.instant(EV.MARK, i)
            rec.end(EV.SOFTMAX, i, t=t)
            if const_expr(BLOCK > 0):
                rec = rec.close_block()
        rec.finish()
        x[tid] = acc

    @cute.kernel
    def plain(x: cute.Tensor, trace: Optional[cute.Tensor], n: Int32):
        tid, _, _ = cute.arch.thread_idx()
        acc = Float32(0)
        for i in cutlass.range(n):
            acc = acc * Float32(0.5) + x[tid + i]
        x[tid] = acc

    @cute.jit
    def run_traced(x: cute.Tensor, trace: Optional[cute.Tensor], n: Int32):
        traced(x, trace, n).launch(grid=(4, 1, 1), block=(128, 1, 1))

    @cute.jit
    def run_plain(x: cute.Tensor, trace: Optional[cute.Tensor], n: Int32):
        plain(x, trace, n).launch(grid=(4, 1, 1), block=(128, 1, 1))

    def build(which, env):
        """The PTX of one request: ``which`` kernel, built as ``env`` says."""
        configure(env)
        x = cute.runtime.make_fake_compact_tensor(Float32, (cute.sym_int(),))
        t = cute.runtime.make_fake_compact_tensor(cutlass.Int64, (cute.sym_int(),))
        fn = {"traced": run_traced, "off": run_traced, "plain": run_plain}[which]
        if ABLATION:  # the benchmark's build of the recorder without that part
            sys.path.insert(0, os.environ["BENCHMARKS"])
            from decode_recorder_parts import ablated
            with ablated(ABLATION):
                c = cute.compile(fn, x, t if which == "traced" else None, Int32(3), options="--keep-ptx")
        else:  # the product's build: nothing of the benchmarks imported
            c = cute.compile(fn, x, t if which == "traced" else None, Int32(3), options="--keep-ptx")
        return c.__ptx__

    if sys.argv[1] == "--batch":  # [[which, env], ...] in argv[2]: one result each into argv[3]
        import traceback
        out = []
        for which, env in json.load(open(sys.argv[2])):
            try:
                out.append({"returncode": 0, "stdout": build(which, {**os.environ, **env}), "stderr": ""})
            except Exception:
                out.append({"returncode": 1, "stdout": "", "stderr": traceback.format_exc()})
        json.dump(out, open(sys.argv[3], "w"))
    else:
        sys.stdout.write(build(sys.argv[1], os.environ))
''')


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))  # compile_pool
ABLATED = os.path.join(ROOT, "benchmarks", "decode_recorder_parts.py")  # its ``ablated``: a part taken out


# Every build the tests below ask for, compiled together in one interpreter per target before
# they run (``_compiled_together``): the imports and the DSL's first compile paid once, not per
# build. A build not listed here, or one that fails together, compiles alone when a test asks.
_SMEM = {"STAGE": "smem"}
REQUESTS = {
    "sm_100a": [("traced", {}), ("off", {}), ("plain", {}), ("traced", _SMEM)],
    "sm_90a": [("traced", {}), ("off", {}), ("plain", {}), ("traced", _SMEM), ("traced", {"TB": "0"}),
               ("traced", {"TB": "1"}), ("traced", {"STAGED": "1"}), ("traced", {"STAGED": "0"}),
               *[("traced", {**_SMEM, **e}) for e in ({"BLOCK": "3"}, {"WHEN": "1"}, {"WHEN": "1", "BLOCK": "3"},
                                                     {"SETTLE": "later"}, {"SHARE": "1"})],
               *[("traced", {**_SMEM, "ABLATION": a}) for a in ("no-timer", "no-store", "no-events", "no-edge")],
               ("traced", {"BLOCK": "3"}), ("traced", {"EVENTS": "SOFTMAX"}), ("traced", {"EVENTS": ""}),
               ("traced", {"WHEN": "1"}), ("traced", {"WHEN": "1", "BLOCK": "3"}), ("traced", {"SETTLE": "later"}),
               ("traced", {"STAGE": "lanes"}), ("traced", {"STAGE": "lanes", "SHARE": "1"}), ("off", {"SHARE": "1"})],
}


def _cache_path(arch: str, which: str, env: dict) -> str:
    """Where the PTX cache (conftest.PTX_CACHE) keeps a build's (returncode, stdout, stderr): under
    a key of the kernel's text, the request and every source the recorder is built from
    (tests/tools/compile_pool.source_key), with the benchmark whose ``ablated`` builds the
    ``ABLATION`` requests."""
    import json

    from compile_pool import SOURCES, source_key
    from conftest import PTX_CACHE

    key = source_key(arch, (*SOURCES, os.path.relpath(ABLATED, ROOT)),
                     extra=json.dumps([KERNELS, which, sorted(env.items())]))
    return os.path.join(PTX_CACHE, "recorder", key + ".json")


def _env(arch: str, **env) -> dict:
    return dict(os.environ, CUTE_DSL_ARCH=arch, BENCHMARKS=os.path.dirname(ABLATED), **env)


@pytest.fixture(scope="module", autouse=True)
def _compiled_together(tmp_path_factory):
    """Compile every ``REQUESTS`` build not yet in the PTX cache, one interpreter per target, and
    keep each that compiled under the key a build alone uses (the DSL's JIT cache off: each build
    is traced and compiled afresh, as alone)."""
    import json

    from compile_pool import cached_json

    tmp = tmp_path_factory.mktemp("recorder_ptx")
    (tmp / "k.py").write_text(KERNELS)
    for arch, reqs in REQUESTS.items():
        todo = [(w, e) for w, e in reqs if not os.path.isfile(_cache_path(arch, w, e))]
        if len(todo) < 2:
            continue
        (tmp / f"{arch}.json").write_text(json.dumps(todo))
        try:
            subprocess.run([sys.executable, str(tmp / "k.py"), "--batch", str(tmp / f"{arch}.json"),
                            str(tmp / f"{arch}_out.json")], capture_output=True, text=True, cwd=tmp, timeout=900,
                           env=_env(arch, CUTE_DSL_NO_CACHE="1"))
            results = json.loads((tmp / f"{arch}_out.json").read_text())
        except (subprocess.TimeoutExpired, OSError, ValueError):
            continue  # each build compiles alone when its test asks
        for (w, e), r in zip(todo, results):
            if r["returncode"] == 0:
                cached_json(_cache_path(arch, w, e), lambda r=r: r)


def _run(arch: str, which: str, tmp_path, **env):
    """The test kernel's build: from the PTX cache, else compiled alone in a fresh interpreter
    (CUTE_DSL_ARCH is read once per process); its (returncode, stdout, stderr)."""
    import types

    from compile_pool import cached_json

    def compile_():
        script = tmp_path / "k.py"
        script.write_text(KERNELS)
        r = subprocess.run([sys.executable, str(script), which], capture_output=True, text=True,
                           env=_env(arch, **env), cwd=tmp_path, timeout=300)
        return {"returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr}

    return types.SimpleNamespace(**cached_json(_cache_path(arch, which, env), compile_))


def _ptx(arch: str, which: str, tmp_path, **env) -> str:
    r = _run(arch, which, tmp_path, **env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _body(ptx: str) -> str:
    """The kernel's PTX with its (name-dependent) symbols normalized."""
    body = ptx[ptx.index(".entry"):]
    return re.sub(r"kernel_cutlass_\w+", "KERNEL", body)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_tracing_on_emits_timer_reads_and_stores(arch, tmp_path):
    ptx = _body(_ptx(arch, "traced", tmp_path))
    assert ptx.count("%clock64") >= 3  # start anchor, events, finish anchor
    assert ptx.count("%globaltimer") >= 2  # anchors
    assert "st.global.b64" in ptx  # the warp header
    # records keep the L2 policy evict_last (they stay in L2 until the launch ends)
    assert "st.global.L2::cache_hint.b64" in ptx
    assert "%smid" in ptx


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_tracing_off_is_the_uninstrumented_kernel(arch, tmp_path):
    off = _body(_ptx(arch, "off", tmp_path))
    plain = _body(_ptx(arch, "plain", tmp_path))
    assert "%clock64" not in off and "%globaltimer" not in off
    assert off == plain


def test_globaltimer_timebase_reads_globaltimer_per_event(tmp_path):
    clock = _body(_ptx("sm_90a", "traced", tmp_path, TB="0"))
    gt = _body(_ptx("sm_90a", "traced", tmp_path, TB="1"))
    assert gt.count("%globaltimer") > clock.count("%globaltimer")
    assert gt.count("%clock64") < clock.count("%clock64")


def test_lane_mode_stores_per_event(tmp_path):
    staged = _body(_ptx("sm_90a", "traced", tmp_path, STAGED="1"))
    lane = _body(_ptx("sm_90a", "traced", tmp_path, STAGED="0"))
    # Staged mode selects records into registers (selp); lane mode has no selects for it.
    assert staged.count("selp.b32") > lane.count("selp.b32")
    assert "st.global.L2::cache_hint.b64" in lane


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_smem_staging_stores_each_record_into_shared_memory(arch, tmp_path):
    """stage="smem": each event is one st.shared.v2.b32 (time, tag | payload) from every lane,
    no select into lane registers; the flush loads a lane's own slot back and stores it with
    the records' L2 policy, bounds-checked as in lane staging."""
    lanes = _body(_ptx(arch, "traced", tmp_path))
    smem = _body(_ptx(arch, "traced", tmp_path, STAGE="smem"))
    assert smem.count("%clock") == lanes.count("%clock")  # the same events (and anchors)
    # one shared store per event's timer read (%clock; the anchors read %clock64), at least the
    # loop's three (SOFTMAX begin, MARK, SOFTMAX end; the loop may be unrolled)
    event_reads = len(re.findall(r"%clock\b(?!64)", smem))
    assert smem.count("st.shared.v2.b32") == event_reads >= 3
    assert "st.shared.v2.b32" not in lanes
    assert smem.count("selp.b32") < lanes.count("selp.b32")
    assert "ld.shared.b64" in smem and "st.global.L2::cache_hint.b64" in smem


@pytest.mark.parametrize("env", [{"BLOCK": "3"}, {"WHEN": "1"}, {"WHEN": "1", "BLOCK": "3"}, {"SETTLE": "later"}],
                         ids=["block", "when", "when-in-block", "settle-later"])
def test_smem_staging_compiles_with_blocks_when_and_settle(env, tmp_path):
    """Blocks, predicated events and a late settle work with shared-memory staging: one shared
    store per event there too, nothing selected into lane registers."""
    smem = _body(_ptx("sm_90a", "traced", tmp_path, STAGE="smem", **env))
    assert smem.count("st.shared.v2.b32") == len(re.findall(r"%clock\b(?!64)", smem)) >= 3
    assert "selp.b64" not in smem and "st.global.L2::cache_hint.b64" in smem


def test_ablations_take_out_the_timer_reads_or_the_record_stores(tmp_path):
    """benchmarks/decode_recorder_parts.py's ``ablated``: "no-timer" events read no timer (the
    anchors still do), "no-store" events store nothing into the staging buffer."""
    full = _body(_ptx("sm_90a", "traced", tmp_path, STAGE="smem"))
    no_timer = _body(_ptx("sm_90a", "traced", tmp_path, STAGE="smem", ABLATION="no-timer"))
    no_store = _body(_ptx("sm_90a", "traced", tmp_path, STAGE="smem", ABLATION="no-store"))
    events = re.compile(r"%clock\b(?!64)")
    assert len(events.findall(full)) >= 3 and not events.findall(no_timer)
    assert "%clock64" in no_timer and full.count("st.shared.v2.b32") >= 3
    # (the compiler unrolls the loop its own way once the stores are gone: at least the three reads)
    assert len(events.findall(no_store)) >= 3 and "st.shared.v2.b32" not in no_store
    # "no-events": the warp's start and finish only; "no-edge": each anchor one plain read
    no_events = _body(_ptx("sm_90a", "traced", tmp_path, STAGE="smem", ABLATION="no-events"))
    assert not events.findall(no_events) and "st.shared.v2.b32" not in no_events
    assert "%globaltimer" in no_events and "%clock64" in no_events
    no_edge = _body(_ptx("sm_90a", "traced", tmp_path, STAGE="smem", ABLATION="no-edge"))
    assert no_edge.count("%globaltimer") == 2 < full.count("%globaltimer")
    assert len(events.findall(no_edge)) == len(events.findall(full))


def test_smem_staging_refuses_lane_mode_and_unknown_stages(tmp_path):
    r = _run("sm_90a", "traced", tmp_path, STAGE="smem", STAGED="0")
    assert r.returncode != 0 and 'stage="smem" needs the staged mode' in r.stderr
    r = _run("sm_90a", "traced", tmp_path, STAGE="registers")
    assert r.returncode != 0 and "stage must be one of 'lanes', 'smem'" in r.stderr


@pytest.mark.parametrize("kind", ["calibration", "markers"])
def test_core_kernels_compile_for_hopper(kind):
    """Every calibration / marker variant ``fa4trace build`` exports compiles for sm_90a; the
    calibration and fa4trace-traced ones read the timers, the plain ones do not (compile_pool:
    two processes, kept in the PTX cache)."""
    from compile_pool import compile_all, variant_names
    from conftest import PTX_CACHE

    names = variant_names("sm_90a", kinds=(kind,))
    assert len(names) >= 2
    for name, r in compile_all("sm_90a", names, jobs=2, cache=PTX_CACHE).items():
        assert ".target sm_90a" in r["ptx"], name
        reads_timer = "%clock64" in r["ptx"] or "%globaltimer" in r["ptx"]
        if name.endswith("_plain"):
            assert not reads_timer, name  # the uninstrumented twin
        elif kind == "calibration" or r["config"].get("traced"):
            assert reads_timer, name


def test_blocks_drop_the_per_event_check(tmp_path):
    """open_block(3): one room check per iteration instead of a full-staging check per event."""
    plain = _body(_ptx("sm_90a", "traced", tmp_path))
    blocked = _body(_ptx("sm_90a", "traced", tmp_path, BLOCK="3"))
    assert blocked.count("%clock64") == plain.count("%clock64")  # same events
    # the per-event "pos == 31" compares and "& 31" wraps are gone from the loop
    assert blocked.count("and.b32") < plain.count("and.b32")
    assert len(blocked.splitlines()) < len(plain.splitlines())


def test_a_block_with_more_events_than_reserved_fails_the_compile(tmp_path):
    r = _run("sm_90a", "traced", tmp_path, BLOCK="2")  # begin + (instant) + end = 3
    assert r.returncode != 0
    assert "more events in a block than open_block(n) reserved" in r.stderr


def test_an_event_subset_compiles_the_other_events_away(tmp_path):
    """Recorder.start(events=...): events outside the set cost nothing (no timer read, no
    staging); the warp's start and finish anchors stay."""
    full = _body(_ptx("sm_90a", "traced", tmp_path))
    softmax_only = _body(_ptx("sm_90a", "traced", tmp_path, EVENTS="SOFTMAX"))
    none = _body(_ptx("sm_90a", "traced", tmp_path, EVENTS=""))
    # per-event timer reads: full = anchors + SOFTMAX begin/end + MARK; then fewer, then only the anchors
    assert full.count("%clock64") > softmax_only.count("%clock64") > none.count("%clock64") >= 2
    assert none.count("selp.b32") < softmax_only.count("selp.b32") < full.count("selp.b32")
    assert "%globaltimer" in none and "st.global.b64" in none  # anchors and the header


def test_when_records_without_a_branch_around_the_record(tmp_path):
    """when=: the same events, the record predicated (selp) instead of branched around. Inside
    a block too: there the predicated event takes its lane from the run-time position (a block's
    other events find theirs by count), so the block has no branch around the record either."""
    branched = _body(_ptx("sm_90a", "traced", tmp_path))
    predicated = _body(_ptx("sm_90a", "traced", tmp_path, WHEN="1"))
    assert predicated.count("%clock64") == branched.count("%clock64")
    assert predicated.count("selp.b32") > branched.count("selp.b32")
    in_block = _body(_ptx("sm_90a", "traced", tmp_path, WHEN="1", BLOCK="3"))
    branched_block = _body(_ptx("sm_90a", "traced", tmp_path, BLOCK="3"))
    assert in_block.count("%clock64") == branched_block.count("%clock64")
    assert in_block.count("selp.b32") > branched_block.count("selp.b32")
    # one branch fewer: the MARK's if is gone (the loop and the flush branches stay)
    assert in_block.count("bra") < branched_block.count("bra")


def test_settle_later_issues_the_header_loads_before_the_first_work(tmp_path):
    """start(settle=False): the anchor and the header loads first, the warp's own first work,
    then the slot (settle). Without settle the compile fails and says why."""
    ptx = _body(_ptx("sm_90a", "traced", tmp_path, SETTLE="later"))
    anchor = ptx.index("%globaltimer")
    header_loads = [m.start() for m in re.finditer(r"ld\.global\.b64", ptx)][:3]  # g1..g3
    first_work = ptx.index("add.f32")
    header_store = ptx.index("st.global.b64")
    assert len(header_loads) == 3 and anchor < header_loads[0] and header_loads[-1] < first_work < header_store
    r = _run("sm_90a", "traced", tmp_path, SETTLE="never")
    assert r.returncode != 0 and "needs rec = rec.settle() first" in r.stderr


@pytest.mark.parametrize("stage", ["lanes", "smem"])
def test_an_event_given_a_timer_read_stages_it_and_reads_no_other(stage, tmp_path):
    """``rec.timer()`` then ``begin``/``end`` with ``t=``: one read serves both records (the
    decode kernel's softmax takes QK's read so that ptxas may interleave the two)."""
    own = _body(_ptx("sm_90a", "traced", tmp_path, STAGE=stage))
    shared = _body(_ptx("sm_90a", "traced", tmp_path, STAGE=stage, SHARE="1"))
    reads = re.compile(r"%clock\b(?!64)" if stage == "smem" else r"%clock64")
    bodies = own.count("0f3F000000")  # acc * 0.5: one per copy of the loop body the compiler made
    assert bodies >= 1 and len(reads.findall(shared)) == len(reads.findall(own)) - bodies
    stores = "st.shared.v2.b32" if stage == "smem" else "selp.b32"  # each record staged
    assert shared.count(stores) == own.count(stores) > 0  # the same records
    off = _body(_ptx("sm_90a", "off", tmp_path, SHARE="1"))
    assert "%clock" not in off  # tracing off: timer() is nothing
