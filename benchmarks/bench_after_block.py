"""The first calls after an ``instrument()`` block: the block's, or any work's between calls?

    python benchmarks/bench_after_block.py run -o benchmarks/results/after_block_h100.json   # GPU, JIT
    python benchmarks/bench_after_block.py one fa4_fwd 45                                     # one case, a JSON line

bench_instrument_program.py finds the first 5 plain calls right after a block 13 to 19% slower
on host time than the 5 right before it, and calls 31-60 equal. This sets the block beside two
controls in the same process, rotated round by round: CPU work of the block's own wall time
(numpy over 256 MB and Python objects, no GPU, nothing of fa4trace), and nothing but one call.
Per round: 60 calls right before, the thing, 60 calls right after; the first 5 of each side
compared (median over the 5), and calls 11-60 (steady state; its 95% interval: a bootstrap over
the rounds). Two more kinds take the block
apart: the block entered and left with no call inside (its patches, cache swaps and heap walk,
no GPU work), and the GPU work a block adds without any of fa4trace (the call captured in a
CUDA graph, replayed 3 times, freed: the plain twin's timing does as much; not for the forward +
backward, which autograd runs outside a graph). Each case runs in a process of its
own (the library's torch API, caches warm, the traced builds kept from a first block: nothing
compiles).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CASES = ("fa4_fwd", "fa4_fwd_bwd", "quack_rmsnorm", "quack_linear")
CALLS = 60  # calls right before and right after the thing, per round
KINDS = ("block", "cpu", "call", "empty", "graph")  # rotated in this order, round by round


def one(case: str, rounds: int) -> dict:
    """One case: per kind, the rounds' first-5 and calls 11-60 host-time change (%)."""
    import numpy as np
    import torch

    import fa4trace
    from bench_instrument_program import _graph, _host_us, _setup, median_ci

    fn, what = _setup(case)
    for _ in range(20):
        fn()
    with fa4trace.instrument():  # compiles the traced builds; later blocks reuse them
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    with fa4trace.instrument():
        fn()
    block_s = time.perf_counter() - t
    big = np.ones(32 << 20)  # 256 MB

    def cpu_work():
        end = time.perf_counter() + block_s
        while time.perf_counter() < end:
            big.sum()
            [dict(a=i) for i in range(20000)]

    def block():
        with fa4trace.instrument():
            fn()

    def empty():
        with fa4trace.instrument():
            pass

    def graph():
        g = _graph(fn)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        del g

    run = {"block": block, "cpu": cpu_work, "call": fn, "empty": empty, "graph": graph}
    kinds = tuple(k for k in KINDS if k != "graph" or case != "fa4_fwd_bwd")
    res = {k: ([], [], []) for k in kinds}
    for r in range(rounds):
        kind = kinds[r % len(kinds)]
        pre = _host_us(fn, CALLS)
        run[kind]()
        post = _host_us(fn, CALLS)
        res[kind][0].append(100 * (statistics.median(post[:5]) / statistics.median(pre[:5]) - 1))
        res[kind][1].append(100 * (statistics.median(post[10:]) / statistics.median(pre[10:]) - 1))
        res[kind][2].append([100 * (post[i] / statistics.median(pre[10:]) - 1) for i in range(5)])
    return {"case": what, "block_s": round(block_s, 3),
            **{k: {"first5_pct_median": round(statistics.median(v[0]), 1), "first5_pct": [round(x, 1) for x in v[0]],
                   "steady_pct_median": round(statistics.median(v[1]), 1),
                   "steady_pct_ci95": [round(x, 1) for x in median_ci(v[1])],
                   "each_of_first5_pct_median": [round(statistics.median(c), 1) for c in zip(*v[2])]}
               for k, v in res.items()}}


def rows_of(results: list[dict]) -> list[dict]:
    """One row per case and kind."""
    names = {"block": "instrument() block, one call", "cpu": "CPU work of the block's wall time",
             "call": "one call (nothing else)", "empty": "instrument() block, no call inside",
             "graph": "the call captured in a CUDA graph, replayed 3 times (no fa4trace)"}
    return [{"case": r["case"], "between": names[k], "rounds": len(r[k]["first5_pct"]),
             "first5_pct": r[k]["first5_pct_median"],
             "first5_spread": f"{min(r[k]['first5_pct']):+.1f}..{max(r[k]['first5_pct']):+.1f}",
             "each_pct": " ".join(f"{x:+.0f}" for x in r[k].get("each_of_first5_pct_median", [])) or "-",
             "steady_pct": r[k]["steady_pct_median"],
             "steady_ci": "{:+.1f}..{:+.1f}".format(*r[k]["steady_pct_ci95"]) if "steady_pct_ci95" in r[k] else "-",
             "block_ms": round(1e3 * r["block_s"], 1)}
            for r in results for k in KINDS if k in r]


def write(results: list[dict], out: str, *, gpu: str | None = None, commit: str | None = None,
          command: str | None = None) -> None:
    """The result file (``fa4trace.bench.results``' envelope); ``gpu``, ``commit`` and
    ``command`` default to this machine's, this checkout's and this process's."""
    from fa4trace.bench import results as R

    doc = R.envelope(
        "instrument-program", "The first calls after a block: instrument() beside other pauses in a loop of calls",
        rows_of(results), gpu=gpu, command=command,
        notes=(" ".join(__doc__.split("\n\n")[2].split()) + " First 5 after vs before %: the median over the rounds "
               "of that kind (spread: min..max); calls 11-60: the same, steady state."),
        columns=[["case", "case"], ["between", f"between the {CALLS} calls before and after"], ["rounds", "rounds"],
                 ["first5_pct", "first 5 calls after vs before % (median)"], ["first5_spread", "rounds' spread"],
                 ["each_pct", "calls 1..5 after, each vs calls 11-60 before %"],
                 ["steady_pct", "calls 11-60 after vs before % (median)"], ["steady_ci", "its 95% interval"],
                 ["block_ms", "block wall time (ms)"]],
        raw=results)
    if commit:
        doc["commit"] = commit
    R.write(out, doc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("one", help="one case in this process: a JSON line")
    o.add_argument("case", choices=CASES)
    o.add_argument("rounds", type=int, nargs="?", default=100)
    r = sub.add_parser("run", help="every case, each in its own process, into a result file")
    r.add_argument("-o", "--output", required=True)
    r.add_argument("--rounds", type=int, default=100)
    r.add_argument("--gpu", default=None, help="the GPU's name for the file (default: torch's)")
    s = sub.add_parser("rows", help="a result file from JSON lines `one` printed (measured elsewhere)")
    s.add_argument("lines", nargs="+")
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--gpu", required=True)
    s.add_argument("--commit", required=True)
    s.add_argument("--command", required=True)
    a = ap.parse_args()
    if a.cmd == "one":
        print(json.dumps(one(a.case, a.rounds)))
        return
    if a.cmd == "rows":
        results = [json.loads(ln) for p in a.lines for ln in Path(p).read_text().splitlines() if ln.startswith("{")]
        write(results, a.output, gpu=a.gpu, commit=a.commit, command=a.command)
        return
    results = []
    for case in CASES:
        p = subprocess.run([sys.executable, __file__, "one", case, str(a.rounds)], capture_output=True, text=True,
                           check=True)
        results.append(json.loads(p.stdout.strip().splitlines()[-1]))
    write(results, a.output, gpu=a.gpu)


if __name__ == "__main__":
    main()
