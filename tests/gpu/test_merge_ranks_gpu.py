"""fa4trace merge --ranks on a real GPU: two processes of a torch.distributed program, each
running quack's RMSNorm (and an all-reduce) under torch.profiler and fa4trace.instrument(),
merged into one Perfetto trace (fa4trace.profiler.merge_ranks).

* One GPU, two processes sharing it: the gloo backend (NCCL refuses two ranks on one device),
  the all-reduce on a CPU tensor; the ranks' clocks are read from the gloo calls.
* Two GPUs (skipped unless ``torch.cuda.device_count() >= 2``): the NCCL backend, the
  all-reduce on the GPU; the ranks' clocks are read from the NCCL kernels.

Needs a CUDA GPU (Hopper: quack's SM90 path), the CuTe DSL and quack-kernels; skips otherwise.
Run it with

    python -m pytest -q tests/gpu/test_merge_ranks_gpu.py -p no:cacheprovider -s

It asserts both ranks ran and every traced launch is matched; each rank's profiler events and
traced launches lie under that rank's process track; each rank's warps sit within 1 µs of one
clock offset against its kernels, with no event outside its kernel; the ranks' clock offset and
the cross-rank alignment error are measured (bounds below); and that ``instrument()`` named
and tagged the bundles by rank (``Recording.save`` / ``Instrumented.trace`` calling
``fa4trace.trace.ranks``). The numbers are printed and written to
``$FA4TRACE_GPU_OUT/merge_ranks_gpu_<case>.json`` (default artifacts/).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
WARPS_ALIGNMENT_NS = 1000  # each rank's warps against its kernels, as in test_profiler_gpu.py
# One host: the ranks' profilers share the system clock, so what the collectives measure is small.
# gloo calls end when the last message arrives over the loopback, milliseconds apart on a busy
# host (they scattered by 1.3 ms between two CPU processes on a loaded 2-core machine); NCCL
# kernels end microseconds apart.
MAX_OFFSET_NS = {"gloo": 5_000_000, "nccl": 200_000}
MAX_ERROR_NS = {"gloo": 5_000_000, "nccl": 50_000}  # median over the collectives

WORKER = textwrap.dedent('''
    """One rank: RMSNorm and an all-reduce per step, under torch.profiler and fa4trace.instrument()."""
    import json, os, sys
    from pathlib import Path
    sys.path.insert(0, os.environ["FA4TRACE_REPO"])
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend, device = os.environ["FA4TRACE_TEST_BACKEND"], int(os.environ["FA4TRACE_TEST_DEVICE"])
    steps = int(os.environ["FA4TRACE_TEST_STEPS"])
    out = Path(os.environ["FA4TRACE_TEST_OUT"]) / f"rank{rank}"
    out.mkdir(parents=True, exist_ok=True)
    torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    import fa4trace
    from quack.rmsnorm import rmsnorm
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(rank)
    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    comm = torch.ones(1 << 16, device="cuda" if backend == "nccl" else "cpu")

    def step():
        y = rmsnorm(x, w)
        dist.all_reduce(comm)
        return y

    with fa4trace.instrument(check=False) as rec:
        step()  # compiles and runs once: not profiled
        torch.cuda.synchronize()
        for k in rec.kernels:
            try:
                k.trace()  # drop the warm-up launch
            except fa4trace.Fa4traceError:
                pass
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
            dist.barrier()
    prof.export_chrome_trace(str(out / f"prof_rank{rank}.json"))
    paths = rec.save(out / "step.parquet")
    json.dump({"bundles": [str(p) for p in paths]}, open(out / "saved.txt", "w"))
    dist.destroy_process_group()
''')


def _need(module: str) -> None:
    if importlib.util.find_spec(module.split(".")[0]) is None:
        pytest.skip(f"{module} is not installed (pip install 'fa4trace[fa4]')")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(tmp: Path, backend: str, devices: list[int]) -> None:
    """Both ranks' processes, each to completion; fails with their stderr where one fails."""
    script = tmp / "rank_worker.py"
    script.write_text(WORKER)
    port = _free_port()
    procs = []
    for r, dev in enumerate(devices):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(len(devices)), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), FA4TRACE_REPO=str(REPO),
                   FA4TRACE_TEST_BACKEND=backend, FA4TRACE_TEST_DEVICE=str(dev), FA4TRACE_TEST_STEPS=str(STEPS),
                   FA4TRACE_TEST_OUT=str(tmp))
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, cwd=str(REPO),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    failed = []
    for r, p in enumerate(procs):
        try:
            _out, err = p.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"rank {r} did not finish in 900 s")
        if p.returncode != 0:
            failed.append(f"rank {r} exited {p.returncode}: {err.strip()[-2000:]}")
    if failed:
        pytest.fail("\n".join(failed))


def _merged(tmp_path_factory, case: str, backend: str, devices: list[int]) -> dict:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("quack's RMSNorm here is its SM90 path: run on Hopper (H100 / H200)")
    if len(set(devices)) > torch.cuda.device_count():
        pytest.skip(f"{len(set(devices))} GPUs needed, {torch.cuda.device_count()} here")
    if not torch.distributed.is_available() or (backend == "nccl" and not torch.distributed.is_nccl_available()):
        pytest.skip(f"torch.distributed with {backend} is not available here")
    for m in ("cutlass.cute", "quack.rmsnorm"):
        _need(m)
    from fa4trace.profiler import merge_ranks, rank_inputs

    tmp = tmp_path_factory.mktemp(f"merge_ranks_{case}")
    _run_ranks(tmp, backend, devices)
    groups = rank_inputs([tmp])
    out = tmp / "all.pftrace"
    report = merge_ranks(groups, out)
    return {"report": report, "out": out, "tmp": tmp, "groups": groups, "backend": backend, "devices": devices,
            "case": case}


@pytest.fixture(scope="module")
def one_gpu(tmp_path_factory):
    """Two ranks sharing GPU 0 (gloo)."""
    return _merged(tmp_path_factory, "one_gpu", "gloo", [0, 0])


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory):
    """Two ranks on GPUs 0 and 1 (NCCL)."""
    return _merged(tmp_path_factory, "two_gpus", "nccl", [0, 1])


def _record(m: dict) -> dict:
    rep = m["report"]
    summary = {"case": m["case"], "backend": m["backend"], "devices": m["devices"], "rank_clock": rep.rank_clock,
               "ranks": [{k: r.get(k) for k in ("rank", "pid", "devices", "offset_ns", "shift_ns", "pairs", "mad_ns",
                                                 "se_ns", "significant", "kind", "clock", "launches")}
                         for r in rep.ranks],
               "launches": [{k: e[k] for k in ("rank", "bundle", "launch", "kernel", "method", "delta_ns", "residual_ns",
                                                "kernel_dur_ns", "span_ns", "end_slack_ns", "outside")}
                            for e in rep.launches]}
    out_dir = Path(os.environ.get("FA4TRACE_GPU_OUT") or REPO / "artifacts")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"merge_ranks_gpu_{m['case']}.json").write_text(json.dumps(summary, indent=1, default=str))
    print("\n".join(rep.lines()))
    return summary


def _check(m: dict) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from test_profiler import parse, traced_roots
    from test_profiler_ranks import rank_of_track

    from fa4trace.profiler import load_kineto

    rep = m["report"]
    _record(m)
    backend = m["backend"]
    assert [r["rank"] for r in rep.ranks] == [0, 1]
    assert [r["devices"] for r in rep.ranks] == [[d] for d in m["devices"]]
    assert not rep.unmatched, rep.unmatched
    for r in rep.ranks:
        assert r["launches"] >= STEPS, r  # RMSNorm every step
        c = r["clock"]
        assert c["spread_ns"] <= WARPS_ALIGNMENT_NS, (r["rank"], c)
    for e in rep.launches:
        assert e["outside"] == 0 and e["end_slack_ns"] >= 0 and not e["ambiguous"], e
        assert "RMSNorm" in e["kernel"] and e["method"] == "host-time", e
    rc = rep.rank_clock
    kind = "nccl kernels" if backend == "nccl" else "host collectives"
    assert rc.get("anchor_kind") == kind and rc.get("collectives", 0) >= STEPS, rc
    r1 = rep.ranks[1]
    assert abs(r1["offset_ns"]) <= MAX_OFFSET_NS[backend], r1
    assert r1["shift_ns"] == (r1["offset_ns"] if r1["significant"] else 0), r1  # taken out only where established
    assert rc["error_ns"] <= MAX_ERROR_NS[backend], rc
    # the file: every profiler event of a rank under its process track, every traced launch too
    M = parse(m["out"].read_bytes())
    roots = traced_roots(M)
    per_rank = Counter()
    for s in M.slices:
        if s.name == "fa4trace merge":
            continue
        r = rank_of_track(M, s.track)
        assert r is not None, s.name
        if not any(a.uuid in roots for a in M.ancestors(s.track)):
            per_rank[r] += 1
    for g in m["groups"]:
        assert per_rank[g.rank] == load_kineto(g.profile).n, g.rank
    entries = {(e["bundle"], e["launch"]): e for e in rep.launches}
    for u, key in roots.items():
        assert rank_of_track(M, u) == entries[key]["rank"]
    if backend == "nccl":
        names = {s.name for s in M.slices if s.name.lower().startswith("nccl")}
        assert any("AllReduce" in n for n in names), names


def _check_rank_names(m: dict) -> None:
    """instrument() in a distributed program: the bundles' names and metadata say the rank."""
    from fa4trace.trace.bundle import read_meta

    for r in (0, 1):
        saved = json.loads((m["tmp"] / f"rank{r}" / "saved.txt").read_text())["bundles"]
        assert saved
        for p in saved:
            assert re.search(rf"rank{r}(?![0-9])", Path(p).name), (
                f"{p}: Recording.save should put the rank in the name (fa4trace.trace.ranks.rank_path)")
            meta = read_meta(p)
            assert (meta.get("distributed") or {}).get("rank") == r, (
                f"{p}: Instrumented.trace should write meta['distributed'] (fa4trace.trace.ranks.rank_meta)")


def test_two_processes_on_one_gpu(one_gpu):
    _check(one_gpu)


def test_two_processes_on_one_gpu_name_their_bundles_by_rank(one_gpu):
    _check_rank_names(one_gpu)


def test_two_gpus(two_gpus):
    _check(two_gpus)


def test_two_gpus_name_their_bundles_by_rank(two_gpus):
    _check_rank_names(two_gpus)
