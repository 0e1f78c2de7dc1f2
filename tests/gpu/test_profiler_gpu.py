"""fa4trace inside torch.profiler on a real GPU: FA4 forward + backward and quack's RMSNorm,
traced by ``fa4trace.instrument()`` while ``torch.profiler.profile(activities=[CPU, CUDA])``
records, merged into one Perfetto trace (``fa4trace.profiler.attach``).

Needs a CUDA GPU (Hopper: FA4's SM90 paths), the CuTe DSL, flash-attn-4 and quack-kernels;
skips otherwise. Run it on the H200 with

    python -m pytest -q tests/gpu/test_profiler_gpu.py -p no:cacheprovider -s

It asserts every traced launch is matched to its kernel activity, the clocks' alignment error
(largest |kernel start - first warp start - median| over the launches) is at most 1 µs, and
every warp event lies inside its kernel's slice (start alignment; the clock alignment's count
is reported), and it parses the merged file back as the CPU tests do. The measured numbers
are printed and written to ``$FA4TRACE_GPU_OUT/profiler_gpu.json`` (default artifacts/).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
ALIGNMENT_TARGET_NS = 1000
STEPS = 3


def _need(module: str) -> None:
    if importlib.util.find_spec(module.split(".")[0]) is None:
        pytest.skip(f"{module} is not installed (pip install 'fa4trace[fa4]')")
    try:
        importlib.import_module(module)
    except Exception as exc:  # an import that fails on this machine (no GPU library, wrong arch)
        pytest.skip(f"{module} does not import here: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")



@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A small model's steps recorded by both profilers; the merged file and its report."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("FA4's forward and backward here are its SM90 paths: run on Hopper (H100 / H200)")
    for m in ("cutlass.cute", "flash_attn.cute", "quack.rmsnorm"):
        _need(m)
    import fa4trace
    from flash_attn.cute import flash_attn_func
    from quack.rmsnorm import rmsnorm
    from torch.profiler import ProfilerActivity, profile

    from fa4trace.profiler import attach

    torch.manual_seed(0)
    b, s, h, d = 1, 512, 4, 128
    x = torch.randn(b * s, h * d, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(h * d, device="cuda", dtype=torch.bfloat16)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def step():
        y = rmsnorm(x, w)
        o = flash_attn_func(q, k, v, causal=True)
        o = o[0] if isinstance(o, tuple) else o
        (o.float().sum() + y.float().sum()).backward()

    out = tmp_path_factory.mktemp("profiler_gpu") / "one.pftrace"
    with fa4trace.instrument(check=False) as rec:
        step()  # compiles every kernel (traced) and runs it once: not profiled
        torch.cuda.synchronize()
        for kern in rec.kernels:  # drop the warm-up launches
            try:
                kern.trace()
            except fa4trace.Fa4traceError:
                pass
        # acc_events: one cycle either way; without it torch 2.11 warns that a second profiler in
        # the process clears the first one's events at each cycle end
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], acc_events=True) as prof:
            for _ in range(STEPS):
                step()
            torch.cuda.synchronize()
    bundles = []
    for kern in rec.kernels:
        try:
            bundles.append(kern.trace())
        except fa4trace.Fa4traceError:
            continue
    if not bundles:
        pytest.fail("fa4trace.instrument traced no kernel of FA4 or quack")
    # torch exports a profile once ("Trace is already saved" on a second export_chrome_trace,
    # torch 2.11 on): attach exports it and keeps the file, which the clock-aligned merge reads
    prof_json = out.with_name("prof.json")
    report = attach(prof, bundles, out, chrome_trace=prof_json)
    clock_out = out.with_name("clock.pftrace")
    from fa4trace.profiler import merge

    clock = merge(prof_json, bundles, clock_out, align="clock")
    return {"report": report, "clock": clock, "out": out, "prof_json": prof_json, "bundles": bundles}


def test_every_traced_launch_is_matched(recorded):
    rep = recorded["report"]
    n = sum(len(set(t.events["launch"].to_pylist())) for t in recorded["bundles"])
    assert not rep.unmatched, rep.unmatched
    assert len(rep.launches) == n and n >= STEPS * 2  # at least RMSNorm and FA4's forward, every step
    kernels = {e["kernel"] for e in rep.launches}
    assert any("FlashAttention" in k for k in kernels) and any("RMSNorm" in k for k in kernels), kernels
    assert not any(e["ambiguous"] for e in rep.launches), [(e["launch"], e["method"]) for e in rep.launches]


def test_clocks_align_within_a_microsecond_and_warps_stay_in_their_kernel(recorded):
    rep, clock = recorded["report"], recorded["clock"]
    summary = {
        "median_delta_ns": rep.clock["median_delta_ns"], "spread_ns": rep.clock["spread_ns"],
        "launches": [{k: e[k] for k in ("bundle", "launch", "kernel", "method", "delta_ns", "residual_ns",
                                        "kernel_dur_ns", "span_ns", "end_slack_ns", "outside")} for e in rep.launches],
        "clock_alignment_outside": [e["outside"] for e in clock.launches]}
    out_dir = Path(os.environ.get("FA4TRACE_GPU_OUT") or REPO / "artifacts")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "profiler_gpu.json").write_text(json.dumps(summary, indent=1, default=str))
    print("\n".join(rep.lines()))
    print(f"clock alignment: events outside their kernel per launch {summary['clock_alignment_outside']}")
    assert rep.clock["spread_ns"] <= ALIGNMENT_TARGET_NS, rep.clock
    for e in rep.launches:
        assert e["outside"] == 0 and e["end_slack_ns"] >= 0, e


def test_the_merged_file_parses_back(recorded):
    sys.path.insert(0, str(REPO / "tests"))
    from test_profiler import check_merged, parse

    from fa4trace.profiler import load_kineto

    kt = load_kineto(recorded["prof_json"])
    M = parse(recorded["out"].read_bytes())
    check_merged(M, kt, recorded["bundles"], recorded["report"])
