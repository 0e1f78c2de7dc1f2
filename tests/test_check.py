"""`fa4trace check` without a GPU: the verdict rules, the text and JSON reports, the guard words,
the Perfetto slice count, the output folder, the orchestration (with stand-in checks) and the
command's one-line errors and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fa4trace.check import probes as CP
from fa4trace.check import recorder_cost as RC
from fa4trace.check import report as CR
from fa4trace.check import rows as R
from fa4trace.check import run as C
from fa4trace.format import layout as L
from fa4trace.trace.bundle import Trace
from fa4trace.trace.decode import decode_buffer
from fa4trace.testing.bundles import attention_like

H200 = {"name": "NVIDIA H200", "arch": "sm_90a", "compute_capability": "9.0", "sm_count": 132,
        "driver": "580.159.04", "torch": "2.11.0+cu130", "cuda_runtime": "13.0"}
B200 = dict(H200, name="NVIDIA B200", arch="sm_100a", compute_capability="10.0", sm_count=148)


def ok(group, name="x"):
    return CR.Row(group, name, "ok", "1 ns", "fine")


def core_ok():
    return [ok("setup"), ok("timer"), ok("recorder"), ok("decode")]


# ---- rows and verdict rules -----------------------------------------------------------------
def test_row_rejects_unknown_verdicts_groups_and_a_failure_without_next():
    with pytest.raises(ValueError, match="verdict"):
        CR.Row("timer", "t", "maybe")
    with pytest.raises(ValueError, match="group"):
        CR.Row("nope", "t", "ok")
    with pytest.raises(ValueError, match="next"):
        CR.Row("timer", "t", "fail", "1", "broken")
    assert CR.Row("timer", "t", "fail", "1", "broken", "rerun").next == "rerun"


def test_failed_row_keeps_the_first_line_of_the_error():
    r = CR.failed("decode", "ours base", RuntimeError("CUDA error: illegal address\nstack..."), "report it")
    assert r.verdict == "fail" and r.detail == "RuntimeError: CUDA error: illegal address" and r.next == "report it"


@pytest.mark.parametrize("extra, want", [
    ([], CR.USABLE),
    ([CR.Row("decode", "ours", "skip", "", "no decode kernel for this architecture")], CR.USABLE),
    ([CR.Row("fa4", "FA4", "warn", "not available", "", "install it")], CR.WARNINGS),
    ([CR.Row("fa4", "FA4 pingpong: overlap", "fail", "10%", "", "rerun")], CR.WARNINGS),
    ([CR.Row("cost", "tracing cost", "warn", "+40%", "", "record fewer warps")], CR.WARNINGS),
    ([CR.Row("timer", "cycles→ns per warp", "warn", "1050/1056", "", "rerun")], CR.WARNINGS),
    ([CR.Row("decode", "ours base: vs fp32", "fail", "rel err 1", "", "report")], CR.NOT_USABLE),
    ([CR.Row("recorder", "nothing out of bounds", "fail", "3 + 0", "", "report")], CR.NOT_USABLE),
    ([CR.Row("timer", "skew", "fail", "900 ns", "", "report")], CR.NOT_USABLE),
    ([CR.Row("setup", "kernels", "fail", "none", "", "build them")], CR.NOT_USABLE),
])
def test_final_verdict_rules(extra, want):
    assert CR.final_verdict(core_ok() + extra) == want


def test_nothing_checked_the_recorder_is_not_usable():
    assert CR.final_verdict([ok("setup"), ok("timer"), ok("decode")]) == CR.NOT_USABLE
    skipped = CR.Row("recorder", "marker kernel", "skip", "", "no kernels")
    assert CR.final_verdict([ok("setup"), ok("timer"), skipped]) == CR.NOT_USABLE
    assert CR.final_verdict([]) == CR.NOT_USABLE


def test_exit_codes():
    assert [CR.exit_code(v) for v in (CR.USABLE, CR.WARNINGS, CR.NOT_USABLE)] == [0, 3, 1]
    assert C.EXIT_NO_GPU == 2


# ---- the report -------------------------------------------------------------------------------
def report(rows, gpu=H200):
    return CR.Report(gpu=gpu, route={"kernels": "aot:build/kernels", "fa4": "none"}, rows=rows, out_dir="out",
                    files=["out/calibration.parquet"])


def test_text_report_all_ok_ends_with_the_verdict():
    text = CR.render(report(core_ok()))
    lines = text.splitlines()
    assert lines[0].startswith("GPU    NVIDIA H200 (sm_90a, 132 SMs")
    assert "kernels: aot:build/kernels; fa4: none" in lines[1]
    assert "next:" not in text
    assert lines[-1] == "verdict: usable (4 ok, 0 warnings, 0 failed, 0 skipped)"
    assert "wrote 1 files to out" in text


def test_text_report_says_what_to_do_next_for_warnings_and_failures_only():
    rows = core_ok() + [CR.Row("fa4", "FA4", "warn", "not available", "no build", "pip install flash-attn-4"),
                        CR.Row("decode", "ours pingpong: overlap", "fail", "QK∥SOFTMAX 20%", "expected",
                              "check the GPU is not throttled")]
    lines = CR.render(report(rows)).splitlines()
    i = next(j for j, ln in enumerate(lines) if "ours pingpong: overlap" in ln)
    assert lines[i].lstrip().startswith("FAIL") and lines[i + 1].strip() == "next: check the GPU is not throttled"
    j = next(j for j, ln in enumerate(lines) if ln.lstrip().startswith("WARN"))
    assert lines[j + 1].strip() == "next: pip install flash-attn-4"
    assert sum("next:" in ln for ln in lines) == 2
    assert lines[-1].startswith("verdict: not usable (4 ok, 1 warnings, 1 failed")
    # rows are grouped under their group's heading, in order
    heads = [ln for ln in lines if ln.startswith("[")]
    assert heads[:4] == ["[setup]", "[timer]", "[recorder]", "[decode]"] and "[fa4]" in heads


def test_json_report_round_trips():
    rows = core_ok() + [CR.Row("fa4", "FA4", "warn", "not available", "", "install", {"n": np.int64(3)})]
    d = json.loads(report(rows).to_json())
    assert d["verdict"] == CR.WARNINGS and d["exit_code"] == 3
    assert d["counts"] == {"ok": 4, "warn": 1, "fail": 0, "skip": 0}
    assert d["gpu"]["name"] == "NVIDIA H200" and d["route"]["fa4"] == "none"
    assert d["rows"][-1] == {"group": "fa4", "name": "FA4", "verdict": "warn", "measured": "not available",
                             "detail": "", "next": "install", "values": {"n": 3}}


# ---- guard words -----------------------------------------------------------------------------
SPEC = L.BufferSpec.for_grid(3, 2, 5)


def test_guarded_buffer_layout_and_intact_guards():
    host = CP.guarded_buffer(SPEC)
    assert host.size == SPEC.words + 2 * CP.GUARD_WORDS
    view = CP.buffer_view(host, SPEC)
    assert np.array_equal(view, SPEC.new_buffer())
    assert CP.guard_damage(host, SPEC) == {"before": 0, "after": 0}
    assert (CP.GUARD_WORDS * 8) % 16 == 0  # the buffer between the guards stays 16-byte aligned
    with pytest.raises(ValueError, match="even"):
        CP.guarded_buffer(SPEC, guard=3)


def test_guard_damage_counts_writes_before_and_after():
    host = CP.guarded_buffer(SPEC)
    view = CP.buffer_view(host, SPEC)
    view[:] = 7  # everything inside is allowed
    assert CP.guard_damage(host, SPEC) == {"before": 0, "after": 0}
    host[CP.GUARD_WORDS + SPEC.words] = 0  # one word past the end
    host[CP.GUARD_WORDS - 1] = 1  # one word before the start
    host[0] = 2
    assert CP.guard_damage(host, SPEC) == {"before": 2, "after": 1}
    with pytest.raises(ValueError, match="words"):
        CP.guard_damage(host[:-1], SPEC)


def test_guarded_torch_buffer_slice_is_contiguous_aligned_and_decodes():
    torch = pytest.importorskip("torch")
    from fa4trace.format.vocab import EV, ROLE
    from fa4trace.testing.bundles import WarpEvents, write_buffer

    spec = L.BufferSpec.for_grid(1, 1, 4)
    host = CP.guarded_buffer(spec)
    dev = torch.from_numpy(host.view(np.int64))  # the GPU path does .cuda() on this
    buf = CP.buffer_view(dev, spec)
    assert buf.is_contiguous() and buf.numel() == spec.words
    assert (buf.data_ptr() - dev.data_ptr()) % 16 == 0 and buf.data_ptr() % 16 == dev.data_ptr() % 16
    w = WarpEvents(cta=0, warp=0, sm=0, role=ROLE.BENCH, clk0=1000, clk1=5000, gt0=10_000, gt1=12_000,
                   kind=np.array([L.KIND_BEGIN, L.KIND_END]), event=np.array([EV.BENCH, EV.BENCH]),
                   payload=np.array([0, 0]), t=np.array([2000, 3000]), attempted=9)
    buf.copy_(torch.from_numpy(write_buffer(spec, [w]).view(np.int64)))
    back = dev.numpy().view(np.uint64)
    assert CP.guard_damage(back, spec) == {"before": 0, "after": 0}
    d = decode_buffer(CP.buffer_view(back, spec)).summary
    assert d["records"] == 2 and d["dropped"] == 7


# ---- Perfetto and the bundle rows -------------------------------------------------------------
def synthetic(schedule="pingpong"):
    buf, meta = attention_like(schedule, n_ctas=4, n_blocks=12)
    return Trace.from_launches([decode_buffer(buf)], meta)


def test_perfetto_slices_equal_rows(tmp_path):
    from fa4trace.export.perfetto import to_perfetto

    tr = synthetic()
    for compress in (False, True):
        p = tmp_path / f"t{compress}.pftrace"
        to_perfetto(tr, p, compress=compress)
        n = CP.perfetto_slices(p)
        assert n["slices"] == len(tr) and n["ends"] == n["begins"] > 0


def ctx_for(tmp_path, gpu=H200, **kw):
    return R.Context(out=tmp_path, gpu=gpu, **kw)


def test_bundle_rows_pass_for_the_schedule_they_show_and_fail_otherwise(tmp_path):
    ctx = ctx_for(tmp_path)
    # the synthetic ping-pong overlaps QK with SOFTMAX (not PV): FA4's SM100 ping-pong range
    rows = R._bundle_rows("fa4", "FA4 pingpong", synthetic(), ctx, "fa4_pingpong",
                          R.FA4_OVERLAPS["pingpong"], "report")
    assert [r.verdict for r in rows] == ["ok", "ok"], rows
    assert (tmp_path / "fa4_pingpong.parquet").is_file() and (tmp_path / "fa4_pingpong.pftrace").is_file()
    assert rows[0].values["slices"] == rows[0].values["rows"]
    bad = R._bundle_rows("decode", "ours base", synthetic(), ctx, "decode_base", R.OUR_OVERLAPS["base"], "report")
    assert bad[1].verdict == "fail" and "throttled" in bad[1].next and "QK∥SOFTMAX in [0%, 10%]" in bad[1].detail


def test_timer_rows_from_a_calibration_result(tmp_path, monkeypatch):
    from fa4trace.probes import calibration

    checks = {"tick_ns": 32, "repeat_fraction": 0.3, "samples": 100, "err_vs_bracket_mid_ns_median": 0.0,
              "outside_ns_max": 0.0, "warps_within_one_tick": 20, "warps": 20, "sms": 4, "sm_skew_ns": 16.0}
    monkeypatch.setattr(calibration, "record_calibration", lambda **kw: (synthetic(), dict(checks)))
    rows = R.timer_rows(ctx_for(tmp_path))
    assert [r.name for r in rows] == ["globaltimer tick", "clock64 rate", "skew across SMs", "cycles→ns per warp"]
    assert all(r.verdict == "ok" for r in rows), rows
    assert rows[1].values["clock_ghz_median"] == pytest.approx(1.98, rel=0.02)
    monkeypatch.setattr(calibration, "record_calibration",
                        lambda **kw: (synthetic(), dict(checks, sm_skew_ns=900.0, warps_within_one_tick=10)))
    rows = {r.name: r for r in R.timer_rows(ctx_for(tmp_path))}
    assert rows["skew across SMs"].verdict == "fail" and rows["cycles→ns per warp"].verdict == "fail"


# ---- orchestration ----------------------------------------------------------------------------
def test_plan_per_architecture(tmp_path):
    route = {"kernels": "jit", "fa4": "jit"}
    rows, steps = C.plan(ctx_for(tmp_path), route)
    names = [s[1] for s in steps]
    assert names == ["timer calibration", "recorder", "recorder cost", "ours base", "ours pingpong", "ours intrawg",
                     "FA4 fa3"]
    rows, steps = C.plan(ctx_for(tmp_path, gpu=B200), route)
    assert [s[1] for s in steps] == ["timer calibration", "recorder", "recorder cost", "FA4 pingpong", "FA4 base"]
    skip = [r for r in rows if r.group == "decode"]
    assert skip[0].verdict == "skip" and "no decode kernel for this architecture" in skip[0].detail
    rows, steps = C.plan(ctx_for(tmp_path, gpu=B200, quick=True), {"kernels": "jit", "fa4": "none"})
    assert [s[1] for s in steps] == ["timer calibration", "recorder", "recorder cost"]
    assert any(r.group == "fa4" and r.verdict == "warn" and "flash-attn-4" in r.next for r in rows)
    rows, steps = C.plan(ctx_for(tmp_path, quick=True), {"kernels": "none", "fa4": "none"})
    assert steps == [] and rows[0].verdict == "fail" and "fa4trace build" in rows[0].next
    assert CR.final_verdict(rows) == CR.NOT_USABLE


def test_run_checks_survives_a_check_that_raises(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "detect_gpu", lambda: dict(H200))
    monkeypatch.setattr(R, "detect_route", lambda ctx: {"kernels": "jit", "fa4": "jit"})

    def timer(ctx):
        ctx.path("calibration.parquet").write_bytes(b"x")
        return [ok("timer", "globaltimer tick")]

    def boom(ctx, **kw):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    monkeypatch.setattr(R, "timer_rows", timer)
    monkeypatch.setattr(R, "recorder_rows", lambda ctx: [ok("recorder", "overflow counted")])
    monkeypatch.setattr(RC, "recorder_cost_rows", lambda ctx: [ok("cost", "recorder cost: segment_smem")])
    monkeypatch.setattr(R, "decode_rows", lambda ctx, schedule: [ok("decode", f"ours {schedule}")])
    monkeypatch.setattr(R, "fa4_rows", boom)
    seen = []
    rep = C.run_checks(tmp_path / "out", log=seen.append)
    names = [r.name for r in rep.rows]
    assert names[:3] == ["kernels", "globaltimer tick", "overflow counted"]
    assert "ours intrawg" in names  # the checks after the failing one still ran
    bad = [r for r in rep.rows if r.verdict == "fail"]
    assert len(bad) == 1 and bad[0].group == "fa4" and bad[0].detail.endswith("was encountered")
    assert rep.verdict == CR.WARNINGS
    assert "checking FA4 fa3 ..." in seen
    saved = json.loads((tmp_path / "out" / C.REPORT_NAME).read_text())
    assert saved["verdict"] == CR.WARNINGS and saved["files"][-1].endswith(C.REPORT_NAME)
    assert any(f.endswith("calibration.parquet") for f in saved["files"])
    with pytest.raises(Exception, match="refusing to overwrite"):
        C.run_checks(tmp_path / "out")
    assert C.run_checks(tmp_path / "out", force=True).verdict == CR.WARNINGS


def test_a_check_that_cannot_import_a_module_names_it_and_what_to_do(tmp_path, monkeypatch):
    """A check whose import fails (an environment without one of fa4trace's dependencies) is a
    fail row naming the module, with the install hint instead of "rerun it"."""
    monkeypatch.setattr(R, "detect_gpu", lambda: dict(H200))
    monkeypatch.setattr(R, "detect_route", lambda ctx: {"kernels": "jit", "fa4": "jit"})
    monkeypatch.setattr(R, "timer_rows", lambda ctx: [ok("timer", "globaltimer tick")])
    monkeypatch.setattr(R, "recorder_rows", lambda ctx: [ok("recorder", "overflow counted")])
    monkeypatch.setattr(RC, "recorder_cost_rows", lambda ctx: [ok("cost", "recorder cost: segment_smem")])
    monkeypatch.setattr(R, "fa4_rows", lambda ctx, **kw: [ok("fa4", "FA4 fa3")])

    def no_perfetto(ctx, schedule):
        import perfetto_not_here  # noqa: F401

    monkeypatch.setattr(R, "decode_rows", no_perfetto)
    rep = C.run_checks(tmp_path / "out")
    bad = [r for r in rep.rows if r.verdict == "fail"]
    assert {r.group for r in bad} == {"decode"} and len(bad) == 3
    assert all("the module perfetto_not_here is not installed here" in r.next and "pip check" in r.next for r in bad)
    assert all("rerun it" not in r.next for r in bad)


def test_run_checks_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "detect_gpu", lambda: None)
    with pytest.raises(C.NoGpu, match="no CUDA GPU here"):
        C.run_checks(tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---- the output folder ------------------------------------------------------------------------
def test_out_dir_rules(tmp_path):
    d = tmp_path / "d"
    assert C.prepare_out_dir(d, False, create=False) == d and not d.exists()
    assert C.prepare_out_dir(d, False).is_dir()
    (d / "notes.txt").write_text("mine")
    C.prepare_out_dir(d, False)  # other files are left alone
    for name in ("calibration.parquet", "x.pftrace", "check.json"):
        (d / name).write_text("")
        with pytest.raises(Exception, match=f"{name} exists; refusing"):
            C.prepare_out_dir(d, False)
        assert C.prepare_out_dir(d, True) == d
        (d / name).unlink()
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(Exception, match="not a folder"):
        C.prepare_out_dir(f, True)


# ---- the command ------------------------------------------------------------------------------
def cli(*args, cwd=None):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU, even on a GPU machine
    return subprocess.run([sys.executable, "-m", "fa4trace", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_cli_without_a_gpu_says_so_in_one_line_and_exits_2(tmp_path):
    for args in ((), ("--json",), ("--quick", "--out", "x")):
        r = cli("check", *args, cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert r.stderr == "fa4trace: error: no CUDA GPU here: fa4trace check needs one\n" and r.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_cli_bad_arguments_and_refusing_to_overwrite(tmp_path):
    r = cli("check", "--bogus", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "--bogus" in r.stderr
    (tmp_path / "f").write_text("")
    r = cli("check", "--out", "f", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    (tmp_path / "fa4trace-check").mkdir()
    (tmp_path / "fa4trace-check" / "decode_base.parquet").write_text("")
    r = cli("check", cwd=tmp_path)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and "refusing to overwrite" in r.stderr
    assert "add --force" in r.stderr
    r = cli("check", "--force", cwd=tmp_path)
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr


@pytest.mark.parametrize("rows, code", [
    (core_ok(), 0),
    (core_ok() + [CR.Row("fa4", "FA4", "warn", "not available", "", "install it")], 3),
    (core_ok() + [CR.Row("recorder", "nothing out of bounds", "fail", "1 + 0", "", "report")], 1),
])
def test_cli_prints_the_report_and_exits_by_verdict(rows, code, tmp_path, monkeypatch, capsys):
    from fa4trace.cli import main

    monkeypatch.setattr(R, "detect_gpu", lambda: dict(H200))
    monkeypatch.setattr(C, "run_checks", lambda out, **kw: report(list(rows)))
    assert main.main(args=["check", "--out", str(tmp_path / "o")]) == code
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1].startswith(f"verdict: {[CR.USABLE, CR.NOT_USABLE, '', CR.WARNINGS][code]}")
    assert main.main(args=["check", "--json", "--out", str(tmp_path / "o")]) == code
    assert json.loads(capsys.readouterr().out)["exit_code"] == code


# ---- the cost rows: tracing cost and each bundle's own perturbation ------------------------------
@pytest.mark.parametrize("traced_us, verdict", [(108.0, "ok"), (109.9, "ok"), (110.2, "warn"), (125.7, "warn")])
def test_tracing_cost_warns_above_ten_percent(traced_us, verdict):
    r = R._cost_row("FA4 fa3", 100.0, traced_us, "timed", R.COST_HINT["fa4"])
    assert r.verdict == verdict and r.group == "cost"
    assert r.values["overhead"] == pytest.approx(traced_us / 100 - 1)
    if verdict == "warn":
        assert "more than 10%" in r.next and "--families" in r.next


def test_our_decode_cost_hint_does_not_send_the_user_to_fewer_warps():
    """Lead warps only cost our decode kernel as much as every warp at the check's shape (H200):
    its hint says so instead of suggesting --warps lead."""
    r = R._cost_row("ours pingpong", 32.2, 40.4, "timed", R.COST_HINT["ours"])
    assert r.verdict == "warn" and "--warps lead" not in r.next and "no cheaper" in r.next


def _sampled(**kw) -> Trace:
    from fa4trace.testing.bundles import sampled_like

    extra = kw.pop("instrument", {})
    buf, meta, vocab = sampled_like(**kw)
    meta["instrument"].update(extra)
    return Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab)


def test_perturbation_row_judges_what_the_bundle_measured():
    slow = R.perturbation_row("FA4 fa3", _sampled(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, slowdown=0.25))
    assert slow.verdict == "warn" and slow.group == "cost" and slow.name == "perturbation, FA4 fa3"
    assert slow.measured.endswith("(recorded vs untraced CTAs)") and slow.measured.startswith("+2")
    assert slow.detail.startswith("recorded CTAs ran +2") and slow.next
    light = R.perturbation_row("FA4 fa3", _sampled(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, slowdown=0.03))
    assert light.verdict == "ok"
    twin = R.perturbation_row("x", _sampled(n_ctas=16, sms=16, n_recorded=16, instrument={"plain_twin": {
        "plain_ns": 100.0, "traced_ns": 105.0, "method": "graph", "noise_pct": 0.4}}))
    assert twin.verdict == "ok" and twin.measured == "+5.0% (traced vs plain twin)"
    assert "not measurable in this launch" in twin.detail


def test_perturbation_row_is_never_ok_where_the_figure_cannot_be_trusted():
    from fa4trace.testing.bundles import split_kv_like

    # a twin timed from the host (bundles made before the device timing)
    host = R.perturbation_row("x", _sampled(n_ctas=16, sms=16, n_recorded=16,
                                            instrument={"plain_twin": {"plain_ns": 100.0, "traced_ns": 105.0}}))
    assert host.verdict == "warn" and host.measured == "+5.0% (traced vs plain twin), unreliable"
    assert "timed from the host" in host.next
    # recorded CTAs faster than untraced ones, far beyond the noise: -10%, which a <= 10% rule called "ok"
    fast = R.perturbation_row("x", _sampled(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, slowdown=-0.1))
    assert fast.verdict == "warn" and "recording cannot speed a CTA up" in fast.next
    assert fast.measured == "n/a (unreliable)"
    # CTAs that wait on each other (split-KV combine): the in-launch figure reads ~0% and is refused
    buf, meta, vocab = split_kv_like(groups=32, splits=4, cta_stride=4, n_recorded=32)
    dep = R.perturbation_row("x", Trace.from_launches([decode_buffer(buf, vocab=vocab)], meta, vocab=vocab))
    assert dep.verdict == "warn" and "not valid for this kernel" in dep.next and "wait on each other" in dep.next
    assert CR.final_verdict(core_ok() + [dep]) == CR.WARNINGS


def test_perturbation_row_judges_each_launch():
    from fa4trace.testing.bundles import T0_NS, sampled_like

    parts = [sampled_like(n_ctas=128, sms=8, cta_stride=8, n_recorded=16, slowdown=s, seed=i, t0_ns=T0_NS + i * 10**9)
             for i, s in enumerate((0.02, 0.25))]
    meta, vocab = parts[0][1], parts[0][2]
    t = Trace.from_launches([decode_buffer(b, vocab=vocab, launch_index=i) for i, (b, _m, _v) in enumerate(parts)],
                            meta, vocab=vocab)
    r = R.perturbation_row("x", t)
    assert r.verdict == "warn" and r.measured.startswith("launch 0: +") and "; launch 1: +2" in r.measured
    assert r.next.startswith("launch 1: the trace's durations run more than 10% slow")


def test_perturbation_row_skips_bundles_that_did_not_measure_it():
    buf, meta = attention_like("base", n_ctas=2, n_blocks=4)
    r = R.perturbation_row("ours base", Trace.from_launches([decode_buffer(buf)], meta))
    assert r.verdict == "skip" and "no CTA lifetimes" in r.detail
    assert CR.final_verdict(core_ok() + [r]) == CR.USABLE
