"""The Ray executor on a local Ray instance (2 CPUs) over replay points: the same rows as the
serial path, written by the driver; a task whose worker dies is retried once, then error rows;
and one-line errors where Ray is not installed or the cluster cannot be reached."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fa4trace.sweep import Dataset
from fa4trace.sweep.replay import ReplayGrid, ReplayJob, ReplayRunner
from fa4trace.testing.replay import make_synthetic
from fa4trace.sweep.run import run_sweep
from fa4trace.trace.bundle import load
from tests.tools.sweep_jobs import TestJob

ROOT = Path(__file__).resolve().parent.parent
N = 6
SAME = ("point_id", "kernel", "d", "hq", "hkv", "sk", "b", "sq", "dtype", "us", "tbps", "error",
        "qk_softmax_overlap", "pv_softmax_overlap", "bundle", "job", "gpu")


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("replay")
    make_synthetic(folder, N)
    return folder


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})  # the workers import tests.tools
    yield ray
    ray.shutdown()


def rows(root) -> dict:
    return {r["point_id"]: r for r in Dataset(root).read_results().to_pylist()}


def quiet(m):
    pass


def test_ray_tasks_write_the_same_rows_as_the_serial_path(local_ray, src, tmp_path):
    from fa4trace.sweep.ray_executor import RayExecutor

    logs = []
    doc = run_sweep(ReplayGrid(src), tmp_path / "ray", executor=RayExecutor(ReplayJob(), address=None, window=3),
                    log=logs.append, compact=True)
    assert doc["status"] == "finished" and doc["executor"] == "ray" and doc["points_run"] == N and not doc["lost"]
    run_sweep(ReplayGrid(src), tmp_path / "serial", ReplayRunner(), log=quiet)
    a, b = rows(tmp_path / "ray"), rows(tmp_path / "serial")
    assert {k: [a[k][c] for c in SAME] for k in a} == {k: [b[k][c] for c in SAME] for k in b}
    assert all(r["worker"].endswith("/cpu") and r["point_s"] > 0 for r in a.values())
    assert sum(w["points"] for w in doc["workers"]) == N and doc["workers"][0]["gpu"] == "none (replay on the CPU)"
    for r in a.values():  # the bundles came back as bytes and were written here
        assert len(load(tmp_path / "ray" / r["bundle"])) == len(load(tmp_path / "serial" / r["bundle"])) > 100
    assert any(m.startswith("Ray cluster: 2 CPUs, 0 GPUs") for m in logs)
    assert not [p for p in (tmp_path / "ray").rglob(".*") if p.is_file()]
    again = run_sweep(ReplayGrid(src), tmp_path / "ray", executor=RayExecutor(ReplayJob(), address=None), log=quiet)
    assert again["points_run"] == 0  # resume over the compacted result files


def test_a_ray_task_whose_worker_dies_is_retried_once_then_error_rows(local_ray, src, tmp_path):
    from fa4trace.sweep.ray_executor import RayExecutor

    victim = "d64_h16kv1_sk1024_pingpong"
    doc = run_sweep(ReplayGrid(src), tmp_path, executor=RayExecutor(TestJob(die=victim), address=None), log=quiet)
    got = rows(tmp_path)
    assert doc["status"] == "finished" and len(got) == N and doc["error_rows"] == 1
    assert got[victim]["error"].startswith("its Ray task failed (") and got[victim]["bundle"] is None
    assert [x["point_id"] for x in doc["lost"]] == [victim]
    assert all(r["error"] is None for k, r in got.items() if k != victim)


def fa4trace(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fa4trace", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def test_no_ray_installed_is_one_line(src, tmp_path):
    blocker = tmp_path / "blocker" / "ray"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('ray is not installed (test)')\n")
    env = {**os.environ, "PYTHONPATH": str(blocker.parent)}
    r = fa4trace("sweep", "--replay", str(src), "-o", str(tmp_path / "ds"), "--executor", "ray", env=env)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "needs ray" in r.stderr and "pip install 'fa4trace[ray]'" in r.stderr and not (tmp_path / "ds").exists()


@pytest.mark.parametrize("address", ["ray://127.0.0.1:1", "127.0.0.1:1", "nohost"])
def test_an_unreachable_cluster_is_one_line(src, tmp_path, address):
    pytest.importorskip("ray")
    r = fa4trace("sweep", "--replay", str(src), "-o", str(tmp_path / "ds"), "--executor", "ray", "--address", address)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    want = "want auto, HOST:PORT or ray://HOST:PORT" if address == "nohost" else f"cannot reach the Ray cluster at {address}"
    assert want in r.stderr and not (tmp_path / "ds").exists()


def test_sweep_command_joins_a_running_cluster(local_ray, src, tmp_path):
    address = local_ray.get_runtime_context().gcs_address  # the cluster the local_ray fixture started
    r = fa4trace("sweep", "--replay", str(src), "-o", str(tmp_path / "ds"), "--executor", "ray", "--address", address)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().endswith(f"{N} points run, 0 error rows; dataset {tmp_path / 'ds'}")
    (sweep,) = Dataset(tmp_path / "ds").sweeps()
    assert sweep["executor"] == "ray" and sweep["status"] == "finished" and sweep["compacted"]["rows"] == N
    assert len(rows(tmp_path / "ds")) == N
