"""The worker pool and the replay job, on the CPU: worker processes over replay points (recorded
buffers decoded, converted and analysed), each pinned with CUDA_VISIBLE_DEVICES, a queue, dead
workers, Ctrl-C; and `fa4trace sweep --replay` / `--gpus` from the command line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fa4trace.analysis.overlap import summarize
from fa4trace.format.errors import Fa4traceError
from fa4trace.sweep import Dataset
from fa4trace.sweep import pool as P
from fa4trace.sweep.replay import ReplayGrid, ReplayRunner, write_point
from fa4trace.testing.replay import make_synthetic
from fa4trace.sweep.run import run_sweep
from fa4trace.trace.bundle import Trace, load
from fa4trace.trace.decode import decode_buffer
from tests.tools.sweep_jobs import TestJob

ROOT = Path(__file__).resolve().parent.parent
N = 8


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("replay")
    make_synthetic(folder, N)
    return folder


def quiet(m):
    pass


def rows_by_point(root) -> dict:
    return {r["point_id"]: r for r in Dataset(root).read_results().to_pylist()}


def stored_rows(root) -> int:
    return Dataset(root).read_results(every_row=True).num_rows


def no_temp_files(root) -> bool:
    return not [p for p in Path(root).rglob(".*") if p.is_file()]


# ---- the replay job --------------------------------------------------------------------------
def test_a_replay_row_is_the_analysis_of_its_buffer(src, tmp_path):
    doc = run_sweep(ReplayGrid(src), tmp_path, ReplayRunner(), log=quiet)
    assert doc["status"] == "finished" and doc["points_run"] == N and doc["gpu"] == "none (replay on the CPU)"
    rows = rows_by_point(tmp_path)
    assert len(rows) == N
    name = "d128_h16kv1_sk1024_pingpong"
    meta = json.loads((src / f"{name}.json").read_text())
    want = summarize(Trace.from_launches([decode_buffer(np.fromfile(src / f"{name}.bin", dtype="<u8"))], meta))
    r = rows[name]
    assert r["kernel"] == "replay" and r["job"] == "replay" and (r["d"], r["hq"], r["hkv"]) == (128, 16, 1)
    assert r["qk_softmax_overlap"] == want["qk_softmax_overlap"] > 0.5  # the ping-pong's QK under SOFTMAX
    assert rows["d128_h16kv1_sk1024_base"]["qk_softmax_overlap"] < 0.1
    # a replay times nothing on a GPU: no timing columns, and no timing harness
    assert r["us"] is None and r["tbps"] is None and r["us_spread"] is None and r["time_s"] is None
    assert r["record_s"] > 0 and r["point_s"] >= r["record_s"] and r["error"] is None
    assert r["bundle"] == f"bundles/kernel=replay/d=128/{name}.parquet"
    b = load(tmp_path / r["bundle"])
    assert b.meta["synthetic"] is True and b.meta["config"]["schedule"] == "pingpong" and len(b) == want["rows"]


def test_a_buffer_that_does_not_decode_is_an_error_row(src, tmp_path):
    folder = tmp_path / "src"
    buf, meta = np.fromfile(src / "d64_h16kv1_sk1024_base.bin", dtype="<u8"), json.loads(
        (src / "d64_h16kv1_sk1024_base.json").read_text())
    write_point(folder, "good", buf, meta)
    bad = buf.copy()
    bad[40] = 0xDEADBEEF  # a warp header's magic
    write_point(folder, "bad", bad, meta)
    run_sweep(ReplayGrid(folder), tmp_path / "ds", ReplayRunner(), log=quiet)
    rows = rows_by_point(tmp_path / "ds")
    assert rows["good"]["error"] is None and rows["good"]["bundle"]
    assert rows["bad"]["error"].startswith("replay failed: TraceFormatError:") and rows["bad"]["bundle"] is None


@pytest.mark.parametrize("setup, message", [
    (lambda f: None, "no replay points"),
    (lambda f: (f / "x.bin").write_bytes(b"\0" * 8), "no x.json beside it"),
    (lambda f: ((f / "x.bin").write_bytes(b"\0" * 8), (f / "x.json").write_text("{")), "not valid JSON"),
    (lambda f: ((f / "x.bin").write_bytes(b"\0" * 8), (f / "x.json").write_text('{"config": {"d": 64}}')),
     "config lacks hq, hkv, sk, b, sq, dtype"),
    (lambda f: ((f / "compact-1.bin").write_bytes(b"\0" * 8),
                (f / "compact-1.json").write_text(json.dumps({"config": dict(d=64, hq=16, hkv=1, sk=1, b=1, sq=1,
                                                                             dtype="bf16")}))),
     "not starting with 'compact-'"),
])
def test_bad_replay_folders_are_one_line(tmp_path, setup, message):
    setup(tmp_path)
    with pytest.raises(Fa4traceError, match=message) as e:
        ReplayGrid(tmp_path)
    assert "\n" not in str(e.value)


# ---- the pool ----------------------------------------------------------------------------------
def test_two_workers_each_pinned_to_its_gpu_run_every_point_once(src, tmp_path):
    logs = []
    doc = run_sweep(ReplayGrid(src), tmp_path, executor=P.Pool(TestJob(sleep=0.2), ["0", "1"]), log=logs.append)
    assert doc["status"] == "finished" and doc["executor"] == "pool" and doc["points_run"] == N and not doc["lost"]
    assert stored_rows(tmp_path) == N and len(rows_by_point(tmp_path)) == N  # every point once, none twice
    workers = {w["worker"]: w for w in doc["workers"]}
    assert [w["cuda_visible_devices"] for w in doc["workers"]] == ["0", "1"]  # as each worker saw it
    assert len({w["pid"] for w in doc["workers"]} | {os.getpid()}) == 3  # two processes, not this one
    assert sum(w["points"] for w in doc["workers"]) == N and all(w["points"] >= 1 for w in doc["workers"])
    for r in rows_by_point(tmp_path).values():
        # the row came from a worker whose CUDA_VISIBLE_DEVICES is the one it was given
        assert r["gpu"] == f"CUDA_VISIBLE_DEVICES={workers[r['worker']]['gpu_index']}"
    assert any(line.startswith(f"[{N}/{N}] ") and " on " in line for line in logs)  # progress, with the worker
    assert no_temp_files(tmp_path)
    # the same rows as the serial path, but for where and when
    serial = tmp_path / "serial"
    run_sweep(ReplayGrid(src), serial, ReplayRunner(), log=quiet)
    same = ("kernel", "d", "hq", "hkv", "sk", "b", "sq", "dtype", "us", "tbps", "error", "qk_softmax_overlap",
            "pv_softmax_overlap", "bundle", "job")
    a, b = rows_by_point(tmp_path), rows_by_point(serial)
    assert {k: [a[k][c] for c in same] for k in a} == {k: [b[k][c] for c in same] for k in b}


def test_resume_skips_done_points_without_starting_workers(src, tmp_path):
    run_sweep(ReplayGrid(src), tmp_path, ReplayRunner(), log=quiet)
    gone = sorted((tmp_path / "results").rglob("*.parquet"))[:3]
    for f in gone:
        f.unlink()
    pool = P.Pool(TestJob(), [None, None])
    doc = run_sweep(ReplayGrid(src), tmp_path, executor=pool, log=quiet)
    assert doc["points_run"] == 3 and stored_rows(tmp_path) == N
    doc = run_sweep(ReplayGrid(src), tmp_path, executor=P.Pool(TestJob(fail_start="must not start"), [None]), log=quiet)
    assert doc["points_run"] == 0 and doc["workers"] == [] and doc["status"] == "finished"


def _kill_when_inflight(flags: Path, killed: list):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        hits = list(flags.glob("inflight-*"))
        if hits:
            (flags / "released").write_text("")  # the retry runs normally
            pid = int(hits[0].name.split("-")[1])
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            return
        time.sleep(0.05)


def test_a_worker_killed_mid_point_loses_only_that_point(src, tmp_path):
    flags = tmp_path / "flags"
    flags.mkdir()
    victim = "d64_h16kv2_sk1024_base"
    killed, logs = [], []
    t = threading.Thread(target=_kill_when_inflight, args=(flags, killed))
    t.start()
    try:
        doc = run_sweep(ReplayGrid(src), tmp_path / "ds", executor=P.Pool(TestJob(hang=victim, flags=str(flags)),
                                                                             [None, None]), log=logs.append)
    finally:
        t.join()
    assert len(killed) == 1
    assert doc["status"] == "finished" and doc["points_run"] == N
    assert doc["lost"] == [{"point_id": victim, "worker": doc["lost"][0]["worker"], "why": "killed by SIGKILL",
                            "attempt": 1}]
    rows = rows_by_point(tmp_path / "ds")
    assert len(rows) == N and stored_rows(tmp_path / "ds") == N and all(r["error"] is None for r in rows.values())
    assert rows[victim]["bundle"] and (tmp_path / "ds" / rows[victim]["bundle"]).is_file()
    assert any("killed by SIGKILL" in m and "goes back to the queue" in m for m in logs)
    assert sum(w["restarts"] for w in doc["workers"]) == 1 and killed[0] not in {w["pid"] for w in doc["workers"]}
    assert no_temp_files(tmp_path / "ds")


def test_a_point_that_kills_its_worker_twice_is_error_rows(src, tmp_path):
    victim = "d128_h16kv1_sk1024_base"
    doc = run_sweep(ReplayGrid(src), tmp_path, executor=P.Pool(TestJob(die=victim), [None, None]), log=quiet)
    assert doc["status"] == "finished" and doc["points_run"] == N and doc["error_rows"] == 1
    assert [x["attempt"] for x in doc["lost"]] == [1, 2]
    rows = rows_by_point(tmp_path)
    assert rows[victim]["error"] == "lost twice: its worker died (killed by SIGKILL)" and rows[victim]["bundle"] is None
    assert all(r["error"] is None for k, r in rows.items() if k != victim)


def test_a_hung_point_is_killed_after_the_point_timeout(src, tmp_path):
    victim = "d64_h16kv1_sk1024_pingpong"
    pool = P.Pool(TestJob(hang=victim), [None, None], point_timeout=3)
    doc = run_sweep(ReplayGrid(src), tmp_path, executor=pool, log=quiet)
    rows = rows_by_point(tmp_path)
    assert len(rows) == N and rows[victim]["error"] == "lost twice: its worker died (over the point timeout of 3 s)"
    assert doc["error_rows"] == 1


def test_a_restart_that_hangs_is_given_up_and_the_other_worker_goes_on(src, tmp_path):
    flags = tmp_path / "flags"
    flags.mkdir()
    victim = "d128_h16kv1_sk1024_pingpong"
    logs = []
    # a normal start takes a few seconds even on a loaded 2-core machine (12 s allowed); the points
    # (2.5 s each) keep the sweep going long enough for the hung restart to be given up
    pool = P.Pool(TestJob(sleep=2.5, die=victim, flags=str(flags), slow_restart=True), [None, None], max_restarts=1,
                  start_timeout=12)
    doc = run_sweep(ReplayGrid(src), tmp_path / "ds", executor=pool, log=logs.append)
    rows = rows_by_point(tmp_path / "ds")
    assert doc["status"] == "finished" and len(rows) == N and all(r["error"] is None for r in rows.values())
    assert [x["point_id"] for x in doc["lost"]] == [victim]
    assert any("not started within 12 s" in m for m in logs) and any("not restarted" in m for m in logs)


def test_a_worker_that_cannot_start_stops_the_sweep_in_one_line(src, tmp_path):
    with pytest.raises(Fa4traceError) as e:
        run_sweep(ReplayGrid(src), tmp_path, executor=P.Pool(TestJob(fail_start="no GPU here\nmore"), [None, None]),
                  log=quiet)
    msg = str(e.value)
    assert msg in {f"worker {P.host()}/cpu#{i} could not start: RuntimeError: no GPU here" for i in (0, 1)}, msg
    (sweep,) = Dataset(tmp_path).sweeps()
    assert sweep["status"] == "failed" and not (tmp_path / "results").exists()


SCRIPT = textwrap.dedent('''
    import signal
    import sys
    # a terminal's Ctrl-C raises KeyboardInterrupt; a shell's background job (how CI may run the
    # tests) starts with SIGINT ignored, and Python keeps it so: give the sweep a terminal's handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from fa4trace.sweep.pool import Pool
    from fa4trace.sweep.replay import ReplayGrid
    from fa4trace.sweep.run import run_sweep
    from tests.tools.sweep_jobs import TestJob

    if __name__ == "__main__":  # workers are spawned: they import this file too
        job = TestJob(sleep=0.5, hang=sys.argv[4], flags=sys.argv[3])
        try:
            run_sweep(ReplayGrid(sys.argv[1]), sys.argv[2], executor=Pool(job, [None, None]),
                      log=lambda m: print(m, flush=True))
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
''')


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")  # a zombie: exited
    except OSError:
        return True


def test_ctrl_c_stops_every_worker(src, tmp_path):
    flags = tmp_path / "flags"
    flags.mkdir()
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, str(script), str(src), str(tmp_path / "ds"), str(flags),
                          "d128_h16kv1_sk1024_pingpong"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list(flags.glob("inflight-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(flags.glob("inflight-*")), "no worker got to the hanging point"
        time.sleep(0.3)
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group, workers included
        out, _ = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and out.rstrip().endswith("interrupted"), out
    (sweep,) = Dataset(tmp_path / "ds").sweeps()
    assert sweep["status"] == "interrupted"
    pids = [w["pid"] for w in sweep["workers"]]
    assert len(pids) == 2
    deadline = time.monotonic() + 20
    while not all(_gone(x) for x in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(x) for x in pids)
    done = rows_by_point(tmp_path / "ds")
    assert "d128_h16kv1_sk1024_pingpong" not in done and len(done) < N  # the points in flight: nothing written
    assert no_temp_files(tmp_path / "ds")


# ---- GPUs of a host ----------------------------------------------------------------------------
def test_gpus_parse_pick_and_map_to_cuda_visible_devices():
    assert P.parse_gpus(None) == "all" and P.parse_gpus(" all ") == "all"
    assert P.parse_gpus("0,1") == [0, 1] and P.parse_gpus("0,0") == [0, 0]
    for bad in ("", "x", "0,,1", "-1", "0;1"):
        with pytest.raises(Fa4traceError, match="want all or comma GPU indices"):
            P.parse_gpus(bad)
    assert P.pick_gpus("all", 4) == [0, 1, 2, 3] and P.pick_gpus([0, 0], 1) == [0, 0]
    with pytest.raises(Fa4traceError, match=r"GPU 2 is not here \(this machine sees 2 GPUs: 0..1\)"):
        P.pick_gpus([0, 2], 2)
    assert P.device_id(1, None) == "1" and P.device_id(1, "") == "1"
    assert P.device_id(1, "4,6") == "6" and P.device_id(0, "GPU-abc") == "GPU-abc"
    assert P.worker_env("1", {}) == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert P.worker_env("6", {"CUDA_VISIBLE_DEVICES": "4,6"}) == {"CUDA_VISIBLE_DEVICES": "6"}
    assert P.worker_env(None, {}) == {"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert P.exit_reason(-9) == "killed by SIGKILL" and P.exit_reason(3) == "exit status 3"


def test_power_log_of_one_gpu_among_several(tmp_path):
    import stat

    from fa4trace.run.power_log import PowerLog

    calls = tmp_path / "calls"
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    f'echo "$@" >> {calls}\n'
                    'if [ "$1" = "-L" ]; then if [ "$2" = "-i" ]; then echo "GPU 3: H200 (UUID: GPU-x)"; else '
                    'echo "GPU 0: H200"; echo "GPU 3: H200"; fi; exit 0; fi\n'
                    "while true; do echo '1980, 650.00, 700.00, 0x0'; sleep 0.05; done\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with PowerLog(period_ms=50, exe=str(fake)) as both:
        assert not both.enabled and "lists 2 GPUs" in both.why_off
    with PowerLog(period_ms=50, exe=str(fake), gpu="3") as one:
        assert one.enabled
        time.sleep(0.3)
    assert calls.read_text().splitlines()[-1].startswith("-i 3 --query-gpu=")
    # a process killed with SIGKILL (a sweep worker) leaves no nvidia-smi behind: its next line
    # goes to a pipe nobody reads (SIGPIPE)
    pidfile = tmp_path / "smi.pid"
    fake.write_text("#!/bin/sh\n"
                    'if [ "$1" = "-L" ]; then echo "GPU 0: H200"; exit 0; fi\n'
                    f"echo $$ > {pidfile}\n"
                    "while true; do echo '1980, 650.00, 700.00, 0x0'; sleep 0.05; done\n")
    code = (f"import os, signal, time\nfrom fa4trace.run.power_log import PowerLog\n"
            f"log = PowerLog(period_ms=50, exe={str(fake)!r}).__enter__()\n"
            f"while not os.path.exists({str(pidfile)!r}): time.sleep(0.02)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert r.returncode == -signal.SIGKILL
    smi = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while not _gone(smi) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(smi)


# ---- the command line --------------------------------------------------------------------------
def fa4trace(*args, **kw):
    return subprocess.run([sys.executable, "-m", "fa4trace", *args], capture_output=True, text=True, timeout=300, **kw)


def test_sweep_replay_command_with_two_workers(src, tmp_path):
    r = fa4trace("sweep", "--replay", str(src), "-o", str(tmp_path / "ds"), "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith(f"{N} points run, 0 error rows; dataset {tmp_path / 'ds'}")
    assert "2 workers:" in r.stderr and f"compacted {N} result files into" in r.stderr
    files = list((tmp_path / "ds" / "results").rglob("*.parquet"))
    assert files and all(f.name.startswith("compact-") for f in files)  # compacted at the end
    assert len(rows_by_point(tmp_path / "ds")) == N
    r = fa4trace("query", str(tmp_path / "ds"), "SELECT executor, json_array_length(workers) AS n, "
                 "json_extract_string(workers, '$[1].worker') AS w FROM sweeps", "--csv")
    assert r.stdout.splitlines() == ["executor,n,w", f"pool,2,{P.host()}/cpu#1"]
    r = fa4trace("sweep", "--replay", str(src), "-o", str(tmp_path / "ds"), "--workers", "2")
    assert r.returncode == 0 and f"{N} done already, 0 to run" in r.stderr and "workers:" not in r.stderr


@pytest.mark.parametrize("args, message, code", [
    (["--replay", "SRC", "--gpus", "0"], "--gpus is for GPU sweeps", 2),
    (["--replay", "SRC", "--d", "64"], "--replay takes its points from its folder", 2),
    (["--workers", "2"], "--workers is for --replay", 2),
    (["--executor", "ray", "--gpus", "0,1"], "--executor ray places tasks", 2),
    (["--gpus", "x"], "--gpus: want all or comma GPU indices", 1),
    (["--gpus", "0", "--point-timeout", "0"], "--point-timeout", 2),
    (["--replay", "NOWHERE"], "no such replay folder", 1),
])
def test_sweep_option_errors_are_one_line(src, tmp_path, args, message, code):
    args = [str(src) if a == "SRC" else str(tmp_path / "nowhere") if a == "NOWHERE" else a for a in args]
    r = fa4trace("sweep", *args, "-o", str(tmp_path / "ds"))
    assert r.returncode == code and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_sweep_on_gpus_here_needs_a_gpu(tmp_path):
    if P.visible_gpus():
        pytest.skip("this machine has a GPU")
    for gpus in (["--gpus", "0,0"], []):
        r = fa4trace("sweep", "--d", "64", *gpus, "-o", str(tmp_path / "ds"))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no CUDA GPU here" in r.stderr
