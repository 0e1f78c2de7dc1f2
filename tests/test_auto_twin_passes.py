"""What an instrumented call runs besides its traced launch, without a GPU: Python functions on
CPU tensors stand in for the plain and traced builds, and a stand-in for
fa4trace.run.timing.twin_times runs them as the real timing would (many launches on the
program's arguments). The device side: tests/gpu/test_twin_passes_gpu.py.

- the plain twin is timed once per shape of the arguments, after the traced launch (and any
  recompile), and what its launches change is put back: a kernel that accumulates into its
  output leaves the result of one launch;
- a timing that fails costs the program nothing but one line;
- passes replay the launch from the bytes before it, one build each (compiled once), tagged in
  the launch records; a pass that does not compile or launch is left out with its reason.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from fa4trace.auto import run as R  # noqa: E402
from fa4trace.format.options import Sampling  # noqa: E402
from fa4trace.run import timing  # noqa: E402

META = {"kernel": "acc", "warps_per_cta": 4, "params": ["x", "out"], "cursor": "smem",
        "families": ["pipeline", "tma", "mma", "barrier"], "missing": ["tma"], "spans": [], "spans_missing": []}


@pytest.fixture
def cpu(monkeypatch):
    """The GPU calls of fa4trace.auto.run made harmless on the CPU; ``log`` says what ran, in order."""
    log = []
    monkeypatch.setattr(R, "new_trace_tensor", lambda spec: torch.zeros(8, dtype=torch.int64))
    monkeypatch.setattr(R, "_sync", lambda: None)
    monkeypatch.setattr(R, "_capturing", lambda args: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    from fa4trace.run import l2

    monkeypatch.setattr(l2, "scratch", lambda device=None: "scratch")  # a flush does nothing on the CPU
    monkeypatch.setattr(l2, "flush", lambda buf: l2.FLUSHED)

    def fake_twin(plain, traced, **kw):  # what twin_times does to memory: many launches of both
        log.append("twin")
        for _ in range(7):
            plain()
            traced()
        return {"plain_ns": 1000.0, "traced_ns": 1100.0, "rel": 0.1, "noise_pct": 0.2, "same_pct": 0.1,
                "method": "graph", "launches_per_replay": 100, "rounds": 15, "l2": "warm"}

    monkeypatch.setattr(timing, "twin_times", fake_twin)
    return log


def accumulate(log, name):
    """A build of ``out += x`` (the traced ones take the buffer last), logging each launch."""
    def fn(x, out, buf=None):
        log.append(name)
        out.add_(x)
    return fn


def test_the_twin_is_timed_once_per_shape_and_an_accumulated_output_is_kept(cpu):
    k = R.Instrumented(accumulate(cpu, "traced"), None, META, plain=accumulate(cpu, "plain"),
                       options=R.RecordOptions(Sampling(ctas=1)))
    x, out = torch.arange(8.0), torch.full((8,), 100.0)
    k(x, out)
    assert torch.equal(out, 100.0 + x)  # one launch's result, after 2 plain + 1 traced + 14 timing launches
    assert cpu[:4] == ["plain", "plain", "traced", "twin"]
    assert k._launches[0].twin["method"] == "graph" and k._launches[0].twin["rel"] == 0.1
    k(x, out)  # same shapes: not timed again
    assert torch.equal(out, 100.0 + 2 * x) and cpu.count("twin") == 1
    assert k._launches[1].twin == k._launches[0].twin
    k(torch.arange(16.0), torch.zeros(16))  # another shape: timed
    assert cpu.count("twin") == 2 and len(k.twins) == 2


def test_a_failed_timing_costs_the_program_one_line_and_the_bundle_says_why(cpu, monkeypatch, capsys):
    def broken(plain, traced, **kw):
        plain()
        traced()
        raise timing.TwinTimingError("graph: capture refused; batch: CUDA_ERROR_LAUNCH_FAILED")

    monkeypatch.setattr(timing, "twin_times", broken)
    k = R.Instrumented(accumulate(cpu, "traced"), None, META, plain=accumulate(cpu, "plain"),
                       options=R.RecordOptions(Sampling(ctas=1)))
    x, out = torch.arange(8.0), torch.full((8,), 100.0)
    k(x, out)
    k(torch.arange(4.0), torch.zeros(4))
    assert torch.equal(out, 100.0 + x)
    twin = k._launches[0].twin
    assert twin["method"] is None and twin["reason"].startswith("the timing failed: graph: capture refused")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "plain twin could not be timed" in err[0]


def test_the_twin_times_the_recompiled_build_never_the_recompile(cpu, monkeypatch):
    """A shared-memory build the GPU refuses is compiled again with the global cursor inside the
    traced launch; the timing starts after it and times the build that launched."""
    def refused(*a):
        cpu.append("refused")
        raise RuntimeError("CUDA_ERROR_INVALID_VALUE: too much shared memory")

    def recompile(cursor, **kw):
        cpu.append(f"recompile {cursor}")
        return SimpleNamespace(fn=accumulate(cpu, "gmem"), vocab=None, meta={"kernel": "acc", "cursor": cursor})

    k = R.Instrumented(refused, None, META, plain=accumulate(cpu, "plain"),
                       options=R.RecordOptions(Sampling(ctas=1)),
                       recompile=recompile)
    x, out = torch.arange(8.0), torch.full((8,), 100.0)
    k(x, out)
    assert cpu[:6] == ["plain", "plain", "refused", "recompile gmem", "gmem", "twin"]
    assert "refused" not in cpu[6:] and cpu[6:].count("gmem") == 7  # the timing launched the gmem build
    assert torch.equal(out, 100.0 + x) and k.meta["cursor"] == "gmem"


def test_no_twin_without_the_check_and_each_launch_says_why(cpu):
    k = R.Instrumented(accumulate(cpu, "traced"), None, META, plain=accumulate(cpu, "plain"),
                       options=R.RecordOptions(Sampling(ctas=1), check=False))
    x, out = torch.arange(8.0), torch.full((8,), 100.0)
    k(x, out)
    assert cpu == ["traced"] and torch.equal(out, 100.0 + x)
    assert k._launches[0].twin == {"method": None, "reason": "check=False: nothing but the traced launch ran"}


def pass_builds(log, wrong=(), no_compile=(), no_launch=()):
    """recompile(cursor, families=, spans=) of a kernel whose pass builds log what they saw."""
    compiled = []

    def recompile(cursor, families=None, spans=None):
        name = families[0] if families else "spans" if spans is None else "lifetimes"
        compiled.append((name, cursor, tuple(families), spans))
        if name in no_compile:
            raise RuntimeError("ptxas: too many resources requested")

        def fn(x, out, buf=None):
            log.append((name, float(out[0])))  # what the pass started from
            if name in no_launch:
                raise RuntimeError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES")
            out.add_(x * (2 if name in wrong else 1))

        return SimpleNamespace(fn=fn, vocab=None, meta={})

    return recompile, compiled


def test_passes_replay_the_launch_from_the_bytes_before_it_one_build_each(cpu):
    recompile, compiled = pass_builds(cpu)
    k = R.Instrumented(accumulate(cpu, "traced"), None, META, plain=accumulate(cpu, "plain"),
                       options=R.RecordOptions(Sampling(ctas=1), passes=R.PASSES, twin=False), recompile=recompile)
    x, out = torch.arange(8.0) + 1, torch.full((8,), 100.0)
    k(x, out)
    k(x, out)
    ran = [e for e in cpu if isinstance(e, tuple)]
    # tma is missing in the kernel, no span was named: four passes, each from the memory before its call
    assert [n for n, _ in ran] == ["lifetimes", "pipeline", "mma", "barrier"] * 2
    assert [v for _, v in ran] == [100.0] * 4 + [101.0] * 4
    assert torch.equal(out, 100.0 + 2 * x)  # as two launches leave it
    assert [c[:3] for c in compiled] == [("lifetimes", "smem", ()), ("pipeline", "smem", ("pipeline",)),
                                         ("mma", "smem", ("mma",)), ("barrier", "smem", ("barrier",))]
    assert [c[3] for c in compiled] == [{}] * 4  # the family passes record no named span
    tags = [(r.info.get("pass"), r.info["call"], r.info.get("checked")) for r in k._launches]
    assert tags == [("dense", 0, None), ("lifetimes", 0, True), ("pipeline", 0, True), ("mma", 0, True),
                    ("barrier", 0, True), ("dense", 1, None), ("lifetimes", 1, True), ("pipeline", 1, True),
                    ("mma", 1, True), ("barrier", 1, True)]
    assert all(r.twin["method"] is None for r in k._launches)
    pm = k.passes_meta()
    assert [p["pass"] for p in pm["passes"]] == ["dense", "lifetimes", "pipeline", "mma", "barrier"]
    assert pm["passes_skipped"] == {"tma": "the kernel has no tma events", "spans": "no named span was placed"}


def test_a_pass_that_fails_is_left_out_and_a_wrong_one_is_named(cpu, capsys):
    recompile, compiled = pass_builds(cpu, wrong=("pipeline",), no_compile=("mma",), no_launch=("barrier",))
    k = R.Instrumented(accumulate(cpu, "traced"), None, META, plain=accumulate(cpu, "plain"),
                       options=R.RecordOptions(Sampling(ctas=1), passes=R.PASSES, twin=False), recompile=recompile)
    x, out = torch.arange(8.0) + 1, torch.full((8,), 100.0)
    k(x, out)
    k(x, out)
    assert torch.equal(out, 100.0 + 2 * x)
    assert [c[0] for c in compiled] == ["lifetimes", "pipeline", "mma", "barrier"]  # each compiled once
    tags = [(r.info.get("pass"), r.info.get("checked")) for r in k._launches]
    assert tags == [("dense", None), ("lifetimes", True), ("pipeline", False)] * 2
    skipped = k.passes_meta()["passes_skipped"]
    assert skipped["mma"] == "did not compile: ptxas: too many resources requested"
    assert skipped["barrier"] == "did not launch: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
    err = capsys.readouterr().err
    assert err.count("pass mma did not compile") == 1 and err.count("pass barrier did not launch") == 1
    assert err.count("pass pipeline's out differ") == 2


def test_each_pass_replays_the_call_pass_launches_times_from_the_same_bytes(cpu):
    recompile, compiled = pass_builds(cpu, no_launch=("barrier",))
    opts = R.RecordOptions(Sampling(ctas=1), passes=("lifetimes", "pipeline", "barrier"), twin=False, pass_launches=3)
    k = R.Instrumented(accumulate(cpu, "traced"), None, META, plain=accumulate(cpu, "plain"), options=opts,
                       recompile=recompile)
    x, out = torch.arange(8.0) + 1, torch.full((8,), 100.0)
    k(x, out)
    ran = [e for e in cpu if isinstance(e, tuple)]
    # three launches of each pass, each from the memory before the call; a pass that does not
    # launch is tried once and left out
    assert ran == [("lifetimes", 100.0)] * 3 + [("pipeline", 100.0)] * 3 + [("barrier", 100.0)]
    assert torch.equal(out, 100.0 + x)
    assert [c[0] for c in compiled] == ["lifetimes", "pipeline", "barrier"]  # one compile per pass
    assert [r.info.get("pass") for r in k._launches] == ["dense"] + ["lifetimes"] * 3 + ["pipeline"] * 3
    assert all(r.info["call"] == 0 and r.info.get("checked") in (None, True) for r in k._launches)
    pm = k.passes_meta()
    assert [(p["pass"], p["launches"]) for p in pm["passes"]] == [("dense", 1), ("lifetimes", 3), ("pipeline", 3)]
    assert pm["passes_skipped"]["barrier"].startswith("did not launch")


@pytest.mark.parametrize("bad", [0, 65, True, 2.0, "2"])
def test_pass_launches_is_a_whole_number_from_1_to_64_with_passes(bad):
    with pytest.raises(ValueError, match=r"pass_launches must be a whole number from 1 to 64; got"):
        R.RecordOptions(passes=R.PASSES, pass_launches=bad)
    with pytest.raises(ValueError, match="pass_launches goes with passes"):
        R.RecordOptions(pass_launches=2)
    assert R.RecordOptions(passes=R.PASSES, pass_launches=64).pass_launches == 64


def test_pass_names_and_plans():
    assert R.passes_asked(None) == () and R.passes_asked(False) == ()
    assert R.passes_asked(True) == R.PASSES and R.passes_asked("mma, lifetimes") == ("mma", "lifetimes")
    with pytest.raises(ValueError, match="passes must be True or names from lifetimes, pipeline"):
        R.passes_asked(["lifetimes", "stalls"])
    spans_meta = dict(META, families=["pipeline"], missing=[], spans=["softmax", "rescale"], spans_missing=["rescale"])
    plan, skipped = R.pass_plan(spans_meta, R.PASSES)
    assert plan == [("lifetimes", (), {}), ("pipeline", ("pipeline",), {}), ("spans", (), None)]
    assert skipped == {f: "not a family of this recording" for f in ("tma", "mma", "barrier")}
    alone = dict(META, families=["pipeline"], missing=[])
    assert R.pass_plan(alone, R.PASSES)[1]["pipeline"] == "the main recording records this family alone"


def test_the_shape_signature_tells_shapes_apart_not_values():
    a, b = torch.zeros(4, 8), torch.ones(4, 8)
    assert R.shape_signature((a, 3, 0.5), {}) == R.shape_signature((b, 3, 0.7), {})
    assert R.shape_signature((a, 3), {}) != R.shape_signature((a, 4), {})  # an integer may be a size
    assert R.shape_signature((a,), {}) != R.shape_signature((a.t(),), {})  # strides
    assert R.shape_signature((a,), {}) != R.shape_signature((a.half(),), {})


def test_launches_of_passes_decode_with_one_vocabulary():
    from fa4trace.format.vocab import VOCAB

    dense, light = VOCAB.copy(), VOCAB.copy()
    dense.register("ab.wait", 32, family="pipeline", op="wait", resource="ab")
    dense.register("mma.wait", 33, family="mma", op="wait")
    light.register("mma.wait", 32, family="mma", op="wait")  # the same event under its own id
    light.register("barrier.sync", 33, family="barrier", op="sync")  # one the main build lacks
    v = R.merged_vocab([dense, None, light])
    assert v.event("ab.wait").id == 32 and v.event("mma.wait").id == 33
    assert v.event("barrier.sync").family == "barrier" and v.event("barrier.sync").id not in (32, 33)


def test_a_refused_shared_memory_build_is_recorded_with_a_global_cursor_and_one_line_says_so(cpu, capsys):
    def refused(*a):
        raise RuntimeError("CUDA_ERROR_INVALID_VALUE: too much shared memory")

    k = R.Instrumented(refused, None, META, plain=accumulate(cpu, "plain"),
                       options=R.RecordOptions(Sampling(ctas=1)),
                       recompile=lambda cursor, **kw: SimpleNamespace(fn=accumulate(cpu, "gmem"), vocab=None,
                                                                      meta={"cursor": cursor}))
    x, out = torch.arange(8.0), torch.zeros(8)
    k(x, out)
    k(x, out)  # the second call runs the global-memory build at once: no second line
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0] == ("fa4trace: acc: the shared-memory cursor did not launch: CUDA_ERROR_INVALID_VALUE: "
                                        "too much shared memory; recorded with the cursor in global memory instead")
    assert k.meta["cursor"] == "gmem" and k.meta["cursor_reason"].startswith("the shared-memory cursor did not launch")
    assert not k.not_traced and len(k._launches) == 2 and torch.equal(out, 2 * x)


@pytest.mark.parametrize("recompile_fails", [False, True])
def test_where_no_traced_build_launches_the_plain_kernel_runs_and_one_line_names_it(cpu, capsys, recompile_fails):
    """The last fallback: the global-memory build is refused too (or does not even compile): the
    plain kernel gives the program its result, the kernel runs plain from then on, one line."""
    def refused(*a):
        cpu.append("refused")
        raise RuntimeError("CUDA_ERROR_INVALID_VALUE: refused")

    def recompile(cursor, **kw):
        if recompile_fails:
            raise RuntimeError("ptxas error: out of registers")
        return SimpleNamespace(fn=refused, vocab=None, meta={"cursor": cursor})

    k = R.Instrumented(refused, None, META, plain=accumulate(cpu, "plain"),
                       options=R.RecordOptions(Sampling(ctas=1)),
                       recompile=recompile)
    x, out = torch.arange(8.0), torch.zeros(8)
    k(x, out)
    assert torch.equal(out, x)  # the plain result, once
    assert k.not_traced.startswith("CUDA_ERROR_INVALID_VALUE: refused") and not k._launches
    if recompile_fails:
        assert "its global-memory build did not compile: ptxas error" in k.not_traced
    k(x, out)  # from then on the plain kernel, not the refused build
    assert torch.equal(out, 2 * x) and cpu.count("refused") == (1 if recompile_fails else 2)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("fa4trace: acc runs untraced: its traced build did not launch")


def test_the_passes_run_right_after_the_dense_launch_and_the_twin_after_them(cpu):
    """The twin's many back-to-back launches can lower the GPU's clock: the passes, whose
    figures are set beside the dense launch's, run before it."""
    recompile, _compiled = pass_builds(cpu)
    k = R.Instrumented(accumulate(cpu, "traced"), None, META, plain=accumulate(cpu, "plain"),
                       options=R.RecordOptions(Sampling(ctas=1), passes=R.PASSES), recompile=recompile)
    k(torch.arange(8.0), torch.zeros(8))
    events = [e if isinstance(e, str) else "pass" for e in cpu]
    first_twin = events.index("twin")
    assert "pass" in events and max(i for i, e in enumerate(events) if e == "pass") < first_twin
    assert events[first_twin - 1] == "pass" and "traced" in events[:events.index("pass")]


def test_with_passes_l2_is_flushed_right_before_the_main_launch_and_each_pass(cpu, monkeypatch):
    """What L2 holds when a pass starts must not depend on what ran before it (the output
    check reads every argument back): each launch starts from a flushed L2, and says so."""
    from fa4trace.run import l2

    monkeypatch.setattr(l2, "scratch", lambda device=None: "scratch")
    monkeypatch.setattr(l2, "flush", lambda buf: cpu.append("flush") or l2.FLUSHED)
    recompile, _compiled = pass_builds(cpu)
    k = R.Instrumented(accumulate(cpu, "traced"), None, META, plain=accumulate(cpu, "plain"),
                       options=R.RecordOptions(Sampling(ctas=1), passes=R.PASSES, twin=False), recompile=recompile)
    k(torch.arange(8.0), torch.zeros(8))
    events = [e if isinstance(e, str) else "pass" for e in cpu]
    launches = [i for i, e in enumerate(events) if e in ("traced", "pass")]
    assert len(launches) == 5 and all(events[i - 1] == "flush" for i in launches)
    assert events.count("flush") == 5  # the plain runs of the check are not flushed
    assert [r.info.get("l2") for r in k._launches] == [l2.FLUSHED] * 5


def test_without_passes_l2_is_flushed_only_where_asked_and_a_missing_buffer_is_said(cpu, monkeypatch):
    from fa4trace.run import l2

    monkeypatch.setattr(l2, "flush", lambda buf: cpu.append("flush") or (buf if isinstance(buf, str) else l2.FLUSHED))
    monkeypatch.setattr(l2, "scratch", lambda device=None: "not flushed: no memory for a 100 MiB scratch buffer")
    plain = R.Instrumented(accumulate(cpu, "traced"), None, META, plain=accumulate(cpu, "plain"),
                           options=R.RecordOptions(Sampling(ctas=1), check=False))
    plain(torch.arange(8.0), torch.zeros(8))
    assert "flush" not in cpu and "l2" not in plain._launches[0].info
    asked = R.Instrumented(accumulate(cpu, "traced"), None, META, plain=accumulate(cpu, "plain"),
                           options=R.RecordOptions(Sampling(ctas=1), check=False, flush_l2=True))
    asked(torch.arange(8.0), torch.zeros(8))
    assert cpu[-2:] == ["flush", "traced"]
    assert asked._launches[0].info["l2"].startswith("not flushed: no memory")
    off = R.RecordOptions(passes=R.PASSES, flush_l2=False)
    assert not off.flushes(True) and R.RecordOptions().flushes(True) and not R.RecordOptions().flushes(False)


def test_a_flush_that_cannot_be_made_says_why_and_never_raises():
    """Without a usable GPU (here: torch built without CUDA) the scratch buffer is a reason, and
    a launch's record carries it instead of ``flushed``."""
    from fa4trace.run import l2

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the scratch buffer would be made")
    why = l2.scratch()
    assert isinstance(why, str) and why.startswith("not flushed: ")
    assert l2.flush(why) == why
