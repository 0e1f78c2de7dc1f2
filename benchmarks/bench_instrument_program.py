"""What ``fa4trace.instrument()`` costs a PyTorch program (GPU, the CuTe DSL, FA4 and quack
installed where the GPU is; JIT, as a user runs it).

For FA4's forward and backward (through ``flash_attn_func``) and quack's RMSNorm and GEMM
(``quack.rmsnorm.rmsnorm``, ``quack.linear.linear_func``), each in a fresh process:

- compile: the first call of a plain process (compile + run) vs the first call inside
  ``instrument()`` after a warm-up (the library's cache is warm: fa4trace takes the kernel out,
  compiles it traced, and the plain build again for the check; the DSL's own cache serves the
  plain one), and the time to take the caches apart and put them back (block entry + exit);
- after the block: the plain call before the block vs after it, host wall time of each call
  (the library call as the program makes it; the median and p90 over rounds of calls, the GPU
  synchronised after each round) and the kernels under CUDA-graph replay with a cold L2 (a graph
  captured before the block and one after it, replayed in turns after the block: clock drift over
  the run moves both); target: within 2% of before.
- a control: the same process schedule with an empty block in place of ``instrument()`` (every
  case is run both ways, in turns, each in a fresh process), so the drift a host timing shows
  between the start and the end of a process is not read as the block's.

    python benchmarks/bench_instrument_program.py -o benchmarks/results/instrument_program_h100.json   # name the GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CASES = ("fa4_fwd", "fa4_fwd_bwd", "quack_rmsnorm", "quack_linear")


def _setup(case: str):
    """(a zero-argument call of the library's torch API, a description)."""
    import torch

    torch.manual_seed(0)
    if case.startswith("fa4"):
        from flash_attn.cute import flash_attn_func

        q, k, v = (torch.randn(2, 2048, 16, 128, device="cuda", dtype=torch.bfloat16,
                               requires_grad=case == "fa4_fwd_bwd") for _ in range(3))
        if case == "fa4_fwd":
            return (lambda: flash_attn_func(q, k, v, causal=True)), "FA4 forward b2 s2048 h16 d128 causal"
        do = torch.randn(2, 2048, 16, 128, device="cuda", dtype=torch.bfloat16)

        def fwd_bwd():
            o = flash_attn_func(q, k, v, causal=True)
            (o[0] if isinstance(o, tuple) else o).backward(do)

        return fwd_bwd, "FA4 forward + backward b2 s2048 h16 d128 causal"
    if case == "quack_rmsnorm":
        from quack.rmsnorm import rmsnorm

        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(8192, device="cuda", dtype=torch.float32)
        return (lambda: rmsnorm(x, w)), "quack rmsnorm 8192x8192 bf16"
    from quack.linear import linear_func

    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    return (lambda: linear_func(x, w, tuned=False)), "quack linear 4096^3 bf16 (untuned)"


def _sync_s(fn) -> float:
    import torch

    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def _host_us(fn, calls: int) -> list:
    """Host wall time of each of ``calls`` back-to-back calls (µs), the GPU synchronised after
    them (the calls queue work as the program's do; a call that waits for the GPU shows it)."""
    import torch

    torch.cuda.synchronize()
    out = []
    for _ in range(calls):
        t = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t) / 1e3)
    torch.cuda.synchronize()
    return out


def _pct(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _graph(fn):
    """The call's kernels captured in a CUDA graph (after one run on a side stream, as torch asks)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def _replays_us(graphs: list, rounds: int = 7, replays: int = 10) -> list:
    """Median µs per replay of each graph, L2 flushed before every replay, the graphs taking turns
    round by round (a clock that drifts during the run moves them all alike)."""
    import torch

    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    times: list = [[] for _ in graphs]
    for _ in range(rounds):
        for i, g in enumerate(graphs):
            for _ in range(replays):
                flush.zero_()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                g.replay()
                b.record()
                torch.cuda.synchronize()
                times[i].append(a.elapsed_time(b) * 1e3)
    return [statistics.median(t) for t in times]


def _python_calls(fn, calls: int = 20) -> float:
    """Python function calls per library call (cProfile's count): what the call runs on the host,
    free of the timing noise of a shared machine; the same before and after the block means
    nothing of fa4trace stayed in the call's path."""
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    return pstats.Stats(pr).total_calls / calls


def one(case: str, control: bool = False) -> dict:
    """Everything for one case, in this (fresh) process; ``control``: an empty block in place of
    ``instrument()`` (the same schedule, nothing traced)."""
    import contextlib
    import gc

    import fa4trace

    fn, what = _setup(case)
    cold_s = _sync_s(fn)  # compile + run, plain
    fn()
    rounds, calls = 7, 50
    graphable = case != "fa4_fwd_bwd"  # autograd's backward is not captured here
    before = [_host_us(fn, calls) for _ in range(rounds)]
    objects_before = len(gc.get_objects())
    py_before = _python_calls(fn)
    g_before = _graph(fn) if graphable else None  # the kernels the program launched before the block
    graph_before = _replays_us([g_before])[0] if graphable else None
    t0 = time.perf_counter()
    with (contextlib.nullcontext() if control else fa4trace.instrument()) as rec:
        entered_s = time.perf_counter() - t0
        first_traced_s = _sync_s(fn)
        t1 = time.perf_counter()
    exit_s = time.perf_counter() - t1
    traced = [k.meta.get("kernel") for k in rec.launched] if rec is not None else []
    hidden, unreached = (rec.hidden, rec.unreached) if rec is not None else (0, {})
    del rec  # the program drops its recording (saved or not): what stays is what fa4trace leaves behind
    gc.collect()
    objects_after = len(gc.get_objects())
    after = [_host_us(fn, calls) for _ in range(rounds)]
    py_after = _python_calls(fn)
    graph_after = graph_pair = None
    if graphable:
        g_after = _graph(fn)  # the kernels the program launches after the block
        graph_after = _replays_us([g_after])[0]
        graph_pair = _replays_us([g_before, g_after])  # both, after the block, taking turns
    flat_before, flat_after = [x for r in before for x in r], [x for r in after for x in r]
    alternating, heads, tails = _alternating(fn, control)
    return {
        "case": case + (" (control)" if control else ""), "what": what, "control": control,
        "first_call_plain_s": round(cold_s, 3),
        "first_call_instrumented_s": round(first_traced_s, 3),
        "block_entry_s": round(entered_s, 4), "block_exit_s": round(exit_s, 4),
        "kernels_taken_out": hidden, "kernels_traced": traced, "unreached": unreached,
        "host_us_per_call_before": round(statistics.median(flat_before), 2),
        "host_us_per_call_after": round(statistics.median(flat_after), 2),
        "host_us_p90_before": round(_pct(flat_before, 0.9), 2), "host_us_p90_after": round(_pct(flat_after, 0.9), 2),
        "host_us_rounds_before": [round(statistics.median(r), 2) for r in before],
        "host_us_rounds_after": [round(statistics.median(r), 2) for r in after],
        "python_objects_before": objects_before, "python_objects_after": objects_after,
        "graph_us_before": None if graph_before is None else round(graph_before, 2),
        "graph_us_after": None if graph_after is None else round(graph_after, 2),
        "graph_us_pair_after_block": None if graph_pair is None else [round(x, 2) for x in graph_pair],
        "python_calls_per_call_before": round(py_before, 1), "python_calls_per_call_after": round(py_after, 1),
        "host_alternating_pct": alternating, "host_alternating_head_pct": heads,
        "host_alternating_tail_pct": tails,
    }


def _alternating(fn, control: bool, rounds: int = 25, calls: int = 30, head: int = 5) -> tuple[list, list, list]:
    """Host time of a plain call right after a block against right before it, per round (%):
    each round times 2 x ``calls`` calls, opens and closes a block with one call inside (the
    traced builds are kept from the first block: nothing compiles), then times 2 x ``calls``
    calls again; the first ``calls`` of each side are compared. The two sides of a round are
    seconds apart, so the process's drift over a run, which a before / after split of the whole
    run reads as the block's, cancels. Also per round: the first ``head`` calls of each side (a
    cost that fades within a few calls, cold CPU caches, shows there) and the second ``calls``
    of each side (steady state on both)."""
    import contextlib

    import fa4trace

    def pct(post, pre):
        return round(100 * (statistics.median(post) / statistics.median(pre) - 1), 2)

    out, heads, tails = [], [], []
    for _ in range(rounds):
        pre = _host_us(fn, 2 * calls)
        with (contextlib.nullcontext() if control else fa4trace.instrument()):
            fn()
        post = _host_us(fn, 2 * calls)
        out.append(pct(post[:calls], pre[:calls]))
        heads.append(pct(post[:head], pre[:head]))
        tails.append(pct(post[calls:], pre[calls:]))
    return out, heads, tails


def median_ci(xs: list, level: float = 0.95, draws: int = 4000, seed: int = 0) -> tuple[float, float]:
    """A bootstrap interval (percentile, ``level``) of the median of ``xs``: how far the median
    of rounds could move with other rounds like these (seeded: the same rows give the same
    interval)."""
    import random

    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(draws))
    lo = meds[int((1 - level) / 2 * draws)]
    hi = meds[min(draws - 1, int((1 + level) / 2 * draws))]
    return lo, hi


def _rounds_figures(name: str, xs: list) -> dict:
    """``<name>_pct`` (the median of the rounds' %), ``<name>_ci`` (its bootstrap 95% interval)
    and ``<name>_within_2pct``: within the target only where the whole interval is (the median
    alone could be luck)."""
    lo, hi = median_ci(xs)
    return {f"{name}_pct": round(statistics.median(xs), 2), f"{name}_ci": [round(lo, 2), round(hi, 2)],
            f"{name}_within_2pct": -2.0 <= lo and hi <= 2.0}


def gpu_text() -> str:
    """The GPU as the other result files name it: device, driver and torch versions."""
    import subprocess as sp

    import torch

    drv = sp.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                 text=True).stdout.strip().splitlines()
    return f"{torch.cuda.get_device_name()} (driver {drv[0] if drv else '?'}, torch {torch.__version__})"


def summarise(rows: list, output: str, note: str = "", gpu: str | None = None) -> None:
    """The per-case rows (``one``'s) with their percentages, written as a result file (``gpu``:
    default the visible one)."""
    from fa4trace.bench.results import current_commit

    for r in rows:
        if "error" in r:
            continue
        r["kernels_traced_n"] = len(r["kernels_traced"])
        r["block_s"] = round(r["block_entry_s"] + r["block_exit_s"], 2)
        r["after_host_pct"] = round(100 * (r["host_us_per_call_after"] / r["host_us_per_call_before"] - 1), 2)
        r["after_host_p90_pct"] = round(100 * (r["host_us_p90_after"] / r["host_us_p90_before"] - 1), 2)
        if r.get("host_alternating_pct"):
            alt = sorted(r["host_alternating_pct"])
            r["after_host_alt_range"] = f"{alt[0]:+.1f}..{alt[-1]:+.1f}"
            r.update(_rounds_figures("after_host_alt", alt))
        if r.get("host_alternating_head_pct"):
            r["after_host_alt_head_pct"] = round(statistics.median(r["host_alternating_head_pct"]), 2)
        if r.get("host_alternating_tail_pct"):
            r.update(_rounds_figures("after_host_alt_tail", r["host_alternating_tail_pct"]))
        if r.get("graph_us_before"):
            r["after_graph_seq_pct"] = round(100 * (r["graph_us_after"] / r["graph_us_before"] - 1), 2)
            pre, post = r["graph_us_pair_after_block"]
            r["after_graph_pct"] = round(100 * (post / pre - 1), 2)
    out = {"area": "instrument-program",
           "title": "instrument() in a PyTorch program: compile time; a plain call after the block",
           "date": time.strftime("%Y-%m-%d"), "commit": os.environ.get("FA4TRACE_COMMIT") or current_commit(),
           "gpu": gpu or gpu_text(),
           "command": f"python benchmarks/bench_instrument_program.py -o {output}",
           "notes": "Fresh process per case and arm, JIT, the cases and their control (an empty block instead of "
                    "instrument(): the same schedule) run in turns; in instrument(): first call after a warm-up "
                    "(cached kernel taken out, compiled traced + plain). After vs before the block: host time of "
                    "each call, median and p90 over 7 rounds of 50 calls; right after a block vs right before "
                    "it: 25 rounds of (60 calls, a block with one call, 60 calls), the first 30 of each side compared, the median of the rounds' "
                    "ratios (the process's drift cancels within a round) with its bootstrap 95% interval, "
                    "the first 5 calls of each side alone, and calls 31-60 of each side (steady state); "
                    "CUDA-graph replay, cold L2: a graph captured before the block and one captured "
                    "after it, replayed in turns after the block (sequential: each replayed alone, "
                    "before and after the block)." + note,
           "columns": [["what", "case"], ["first_call_plain_s", "first call plain (s)"],
                       ["first_call_instrumented_s", "in instrument() (s)"], ["block_s", "block entry + exit (s)"],
                       ["python_calls_per_call_before", "Python calls per call before"],
                       ["python_calls_per_call_after", "... after"],
                       ["after_host_pct", "host call after vs before % (median)"],
                       ["after_host_p90_pct", "... p90 %"],
                       ["after_host_alt_pct", "host call right after a block vs right before % (median of rounds)"],
                       ["after_host_alt_range", "... range over rounds"],
                       ["after_host_alt_ci", "... 95% interval of the median"],
                       ["after_host_alt_within_2pct", "... interval within 2%"],
                       ["after_host_alt_head_pct", "first 5 calls after vs before % (median of rounds)"],
                       ["after_host_alt_tail_pct", "calls 31-60 after vs before % (median of rounds)"],
                       ["after_host_alt_tail_ci", "... 95% interval"],
                       ["after_host_alt_tail_within_2pct", "... within 2%"],
                       ["after_graph_pct", "graph replay after vs before % (in turns)"],
                       ["after_graph_seq_pct", "... sequential %"],
                       ["python_objects_before", "Python objects before"],
                       ["python_objects_after", "... after (recording dropped)"]],
           "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {output}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", default="benchmarks/results/instrument_program.json",
                    help="result file (name the GPU in it: instrument_program_h100.json)")
    ap.add_argument("--case", choices=CASES, help="one case in this process (the driver runs each in its own)")
    ap.add_argument("--control", action="store_true", help="with --case: an empty block instead of instrument()")
    ap.add_argument("--rows", help="summarise the per-case JSON lines a run printed (a log) instead of running")
    ap.add_argument("--note", default="", help="a sentence added to the notes")
    ap.add_argument("--gpu", help="the GPU the rows were measured on (with --rows on another machine)")
    a = ap.parse_args()
    if a.case:
        print(json.dumps(one(a.case, a.control)))
        return
    if a.rows:
        with open(a.rows) as f:
            rows = [json.loads(ln) for ln in f if ln.startswith("{")]
        summarise(rows, a.output, a.note, a.gpu)
        return
    rows = []
    for case in CASES:
        for control in (False, True):
            argv = [sys.executable, __file__, "--case", case] + (["--control"] if control else [])
            r = subprocess.run(argv, capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                rows.append({"case": case, "control": control,
                             "error": (r.stderr.strip().splitlines() or ["?"])[-1][:300]})
            else:
                rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    summarise(rows, a.output, a.note)


if __name__ == "__main__":
    main()
