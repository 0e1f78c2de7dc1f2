"""torch.profiler merge benchmark: `fa4trace merge` of a ~200 MB profiler trace with 10 bundles.

    python benchmarks/bench_merge.py [--trace-mb 200] [--bundles 10] [--rows 1000000]
                                     [--repeat 3] [--json benchmarks/results/merge_cpu.json]

Makes, on the CPU, ``--bundles`` bundles of ~``--rows`` rows each (fa4trace.trace.synthetic.attention_like:
132 CTAs x 5 warps, clearly synthetic) and a torch.profiler Chrome trace of at least
``--trace-mb`` MB around them (fa4trace.profiler.synthetic.profiled_run: Kineto's layout, each
bundle's launch placed in it), then times the ``fa4trace merge`` command on them: the whole
command line (a fresh process: imports, reading, matching, writing), after one cold run,
``--repeat`` times, with and without the per-launch numbers (--no-numbers), its wall time and
the CPU time of it and its worker processes (on a shared machine the CPU time over the cores
is what an idle one would come near, where the work spreads evenly). The merge's own
stage times (read, match, host events, warps, waiting for the numbers, write) come from its
report (``--json`` output of the command). The machine is shared: the load average is
recorded. Target: <= 20 s on 2 cores. ``--json`` writes the "merge" area of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

TARGET_S = 20.0


def make_inputs(folder: Path, trace_mb: float, n_bundles: int, rows: int, log=print) -> dict:
    """The bundles (Parquet) and the profiler trace (JSON) in ``folder``; what they hold."""
    from fa4trace.trace.bundle import Trace
    from fa4trace.trace.decode import decode_buffer
    from fa4trace.profiler.synthetic import profiled_run
    from fa4trace.trace.synthetic import attention_like

    n_ctas = 132
    n_blocks = max(1, -(-(rows - 5 * n_ctas) // (18 * n_ctas)))  # 18 rows per CTA-block + 5 WARP rows
    t = time.perf_counter()
    buf, meta = attention_like("pingpong", n_ctas=n_ctas, n_blocks=n_blocks)
    base = Trace.from_launches([decode_buffer(buf)], meta)
    traces = []
    for i in range(n_bundles):
        m = dict(base.meta, kernel=f"synthetic_attention_{chr(ord('a') + i)}_kernel")
        traces.append(Trace(base.events, m))
    run = profiled_run(traces, steps=1, layers=1, min_bytes=int(trace_mb * 1e6))
    prof = run.write(folder / "prof.json")
    paths = [str(tr.save(folder / f"b{i}.parquet")) for i, tr in enumerate(run.traces)]
    n_events = run.text.count('"ph": ')
    log(f"inputs: {prof.stat().st_size / 1e6:.1f} MB trace ({n_events:,} events), {n_bundles} bundles x "
        f"{base.events.num_rows:,} rows ({time.perf_counter() - t:.1f} s to make)")
    return {"trace": str(prof), "bundles": paths, "trace_bytes": prof.stat().st_size, "trace_events": n_events,
            "rows_per_bundle": base.events.num_rows, "n_bundles": n_bundles}


def merge_cli(inputs: dict, out: Path, extra: list) -> tuple[float, float, dict]:
    """One `fa4trace merge` as a fresh process: (wall s, CPU s of it and its workers, its JSON report)."""
    cmd = [sys.executable, "-m", "fa4trace", "merge", inputs["trace"], *inputs["bundles"], "-o", str(out),
           "--force", "--json", *extra]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=os.path.join(os.path.dirname(__file__), ".."))
    wall = time.perf_counter() - t
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"fa4trace merge failed: {r.stderr.strip()}")
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return wall, cpu, json.loads(r.stdout)


def bench(inputs: dict, out: Path, repeat: int, log=print) -> list[dict]:
    rows = []
    for label, extra in (("merge (with numbers)", []), ("merge --no-numbers", ["--no-numbers"])):
        walls, cpus, reports = [], [], []
        for i in range(repeat + 1):
            load0 = os.getloadavg()[0]
            w, cpu, rep = merge_cli(inputs, out, extra)
            log(f"  {label}: {w:.2f} s wall, {cpu:.2f} s CPU (load {load0:.1f})" + (" [cold, not counted]" if i == 0 else ""))
            if i:
                walls.append(w)
                cpus.append(cpu)
                reports.append(rep)
        best = reports[walls.index(min(walls))]
        med = statistics.median(walls)
        rows.append({"case": label, "median_s": round(med, 2), "best_s": round(min(walls), 2),
                     "runs": [round(w, 2) for w in walls], "cpu_median_s": round(statistics.median(cpus), 2),
                     "cpu_over_cores_s": round(statistics.median(cpus) / (os.cpu_count() or 1), 2),
                     "stages_best_run": best["written"]["stages"], "output_mb": round(best["written"]["bytes"] / 1e6, 1),
                     "slices": best["written"]["slices"], "launches": len(best["launches"]),
                     "target": f"<= {TARGET_S:g} s: {'met' if med <= TARGET_S else '**missed**'}"})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace-mb", type=float, default=200.0, help="profiler trace size (MB, at least)")
    ap.add_argument("--bundles", type=int, default=10)
    ap.add_argument("--rows", type=int, default=1_000_000, help="about this many rows per bundle")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs after one cold run")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    info = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "cores": os.cpu_count(),
            "loadavg_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        inputs = make_inputs(Path(tmp), args.trace_mb, args.bundles, args.rows)
        rows = bench(inputs, Path(tmp) / "one.pftrace", args.repeat)
    info["loadavg_after"] = os.getloadavg()
    for r in rows:
        print(f"{r['case']}: median {r['median_s']} s (best {r['best_s']}; CPU {r['cpu_median_s']} s), stages {r['stages_best_run']}, "
              f"{r['output_mb']} MB, {r['target']}")
    if args.json:
        from bench_export import machine

        from fa4trace.bench.results import envelope, write

        m = machine()
        lo = min(info["loadavg_before"][0], info["loadavg_after"][0])
        hi = max(info["loadavg_before"][0], info["loadavg_after"][0])
        doc = envelope(
            "merge", f"fa4trace merge: a {inputs['trace_bytes'] / 1e6:.0f} MB torch.profiler trace + "
                     f"{inputs['n_bundles']} bundles of {inputs['rows_per_bundle'] / 1e6:.1f} M rows ({m['cores']} cores)",
            [{k: r[k] for k in ("case", "median_s", "best_s", "runs", "cpu_median_s", "cpu_over_cores_s", "output_mb",
                                "slices", "target")} for r in rows],
            gpu=f"none: {m['cpu']} x{m['cores']} (load {lo:.1f}-{hi:.1f}), Python {m['python']}, numpy {m['numpy']}, "
                f"pyarrow {m['pyarrow']}",
            columns=[("case", "case"), ("median_s", "median s"), ("best_s", "best s"), ("cpu_median_s", "CPU s"),
                     ("output_mb", "output MB"), ("slices", "slices"), ("target", "target")],
            notes=f"Synthetic inputs ({inputs['trace_events']:,} Kineto events; bundles from "
                  f"fa4trace.trace.synthetic.attention_like). Wall time of the whole command (a fresh process) after one "
                  f"cold run; {args.repeat} runs. Stage times of the best run: "
                  + "; ".join(f"{r['case']}: " + ", ".join(f"{k} {v}" for k, v in r["stages_best_run"].items())
                              for r in rows),
            info=info, inputs={k: v for k, v in inputs.items() if k not in ("trace", "bundles")}, results=rows)
        print(f"wrote {write(args.json, doc)}")


if __name__ == "__main__":
    main()
