"""Host pipeline benchmark: decode, Perfetto export (plain / compressed), Chrome export.

    python benchmarks/bench_export.py [--events 1000000] [--schedules base,pingpong]
                                      [--repeat 5] [--json out.json]

On ~1M synthetic events (fa4trace.testing.bundles.attention_like: 132 CTAs x 5 warps, clearly
synthetic, never a measurement of a GPU) it times, per schedule:
  decode    decode_buffer(): raw buffer -> Arrow rows (rows/s and records/s)
  perfetto  to_perfetto() to a file, plain and compress=True: slices/s, bytes/slice
  ablation  bytes/slice without flows, without the iter annotation, without both
  chrome    to_chrome() to a file: events/s, bytes/event
Each step runs --repeat times after one cold run; the table shows the median wall time (and
the best, and the median CPU time of this process: the machine is shared, so the wall clock
can include other people's work; the load average is printed). Targets: decode >= 5 M
events/s; Perfetto >= 0.5 M slices/s, <= 32 B/slice plain, <= 10 B/slice compressed.
``--json`` writes the "host" area of BENCHMARKS.md (the table's rows; every number under
"results").
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

TARGETS = {"decode_events_per_s": 5e6, "perfetto_slices_per_s": 0.5e6, "perfetto_bytes_per_slice": 32.0,
           "perfetto_compressed_bytes_per_slice": 10.0}


def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import numpy
    import pyarrow

    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "numpy": numpy.__version__, "pyarrow": pyarrow.__version__, "platform": platform.platform()}


def timed(fn, repeat: int):
    """One cold run, then `repeat` runs: (result of last run, stats dict)."""
    res = None
    walls, cpus = [], []
    cold = None
    for i in range(repeat + 1):
        t, c = time.perf_counter(), time.process_time()
        res = fn()
        w, cp = time.perf_counter() - t, time.process_time() - c
        if i == 0:
            cold = w
        else:
            walls.append(w)
            cpus.append(cp)
    return res, {"cold_s": cold, "median_s": statistics.median(walls), "best_s": min(walls), "worst_s": max(walls),
                 "cpu_median_s": statistics.median(cpus)}


def bench_schedule(schedule: str, n_events: int, repeat: int, tmp: str, log=print) -> dict:
    from fa4trace.export.chrome import to_chrome
    from fa4trace.export.perfetto import to_perfetto
    from fa4trace.trace.bundle import Trace
    from fa4trace.trace.decode import decode_buffer
    from fa4trace.testing.bundles import attention_like

    n_ctas = 132
    n_blocks = max(1, -(-(n_events - 5 * n_ctas) // (18 * n_ctas)))  # 18 rows per CTA-block + 5 WARP rows
    buf, meta = attention_like(schedule, n_ctas=n_ctas, n_blocks=n_blocks)
    out = {"schedule": schedule, "n_ctas": n_ctas, "n_blocks": n_blocks}

    d, st = timed(lambda: decode_buffer(buf), repeat)
    rows, records = d.table.num_rows, d.summary["records"]
    out["decode"] = {**st, "rows": rows, "records": records, "rows_per_s": rows / st["median_s"],
                     "records_per_s": records / st["median_s"]}
    log(f"  decode    {rows} rows ({records} records): {st['median_s']:.3f} s")
    trace = Trace.from_launches([d], meta)

    pf = os.path.join(tmp, f"{schedule}.pftrace")
    for name, kw in (("perfetto", {}), ("perfetto_compressed", {"compress": True})):
        s, st = timed(lambda: to_perfetto(trace, pf, **kw), repeat)
        assert s.slices == rows and os.path.getsize(pf) == s.bytes
        out[name] = {**st, "slices": s.slices, "bytes": s.bytes, "bytes_per_slice": s.bytes / s.slices,
                     "slices_per_s": s.slices / st["median_s"], "slices_per_s_best": s.slices / st["best_s"],
                     "flows": s.flows, "slice_tracks": s.slice_tracks, "extra_lanes": s.extra_lanes,
                     "sequences": s.sequences, "lane_rounds": s.lane_rounds,
                     "phases_last_run_s": {k: round(v, 4) for k, v in s.timings.items()}}
        log(f"  {name:<20s} {st['median_s']:.3f} s, {s.bytes / s.slices:.2f} B/slice")
    abl = {}
    for name, kw in (("no_flows", {"flows": False}), ("no_iter", {"iterations": False}),
                     ("no_flows_no_iter", {"flows": False, "iterations": False}),
                     ("no_flows_no_iter_compressed", {"flows": False, "iterations": False, "compress": True}),
                     ("inflight_counters", {"inflight_counters": True})):
        s = to_perfetto(trace, pf, **kw)
        abl[name] = s.bytes / s.slices
    out["perfetto_bytes_per_slice_variants"] = abl
    log("  variants  " + ", ".join(f"{k} {v:.2f}" for k, v in abl.items()))

    cj = os.path.join(tmp, f"{schedule}.json")
    s, st = timed(lambda: to_chrome(trace, cj), repeat)
    out["chrome"] = {**st, "events": s.events, "bytes": s.bytes, "bytes_per_event": s.bytes / s.events,
                     "events_per_s": s.events / st["median_s"]}
    log(f"  chrome    {st['median_s']:.3f} s, {s.bytes / s.events:.1f} B/event")
    for p in (pf, cj):
        os.unlink(p)
    return out


def table_rows(results: list[dict]) -> list[dict]:
    """One dict per schedule and step: schedule, step, median_s, best_s, worst_s, cpu_median_s,
    spread (the median and the runs' range, as shown), rate, size, target."""
    out = []

    def row(sched, step, r, rate, size, target):
        out.append({"schedule": sched, "step": step, "median_s": round(r["median_s"], 3),
                    "best_s": round(r["best_s"], 3), "worst_s": round(r["worst_s"], 3),
                    "spread": f"{r['median_s']:.3f} [{r['best_s']:.3f}-{r['worst_s']:.3f}]",
                    "cpu_median_s": round(r["cpu_median_s"], 3), "rate": rate, "size": size, "target": target})

    for res in results:
        s = res["schedule"]
        d = res["decode"]
        ok = "met" if d["rows_per_s"] >= TARGETS["decode_events_per_s"] else "**missed**"
        row(s, "decode", d, f"{d['rows_per_s'] / 1e6:.2f} M rows/s ({d['records_per_s'] / 1e6:.2f} M records/s)",
            f"{d['rows']} rows", f">= 5 M events/s: {ok}")
        for key, label, bt in (("perfetto", "perfetto", "perfetto_bytes_per_slice"),
                               ("perfetto_compressed", "perfetto compress=True", "perfetto_compressed_bytes_per_slice")):
            p = res[key]
            rate_ok = "met" if p["slices_per_s"] >= TARGETS["perfetto_slices_per_s"] else "**missed**"
            size_ok = "met" if p["bytes_per_slice"] <= TARGETS[bt] else "**missed**"
            row(s, label, p, f"{p['slices_per_s'] / 1e6:.2f} M slices/s",
                f"{p['bytes_per_slice']:.2f} B/slice ({p['bytes'] / 2**20:.1f} MiB)",
                f">= 0.5 M/s: {rate_ok}; <= {TARGETS[bt]:g} B: {size_ok}")
        c = res["chrome"]
        row(s, "chrome", c, f"{c['events_per_s'] / 1e6:.2f} M events/s",
            f"{c['bytes_per_event']:.1f} B/event ({c['bytes'] / 2**20:.1f} MiB)", "-")
    return out


def table(results: list[dict]) -> str:
    head = ["schedule", "step", "median s (best, CPU)", "rate", "size", "target"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table_rows(results):
        t = f"{r['median_s']:.3f} ({r['best_s']:.3f}, {r['cpu_median_s']:.3f})"
        lines.append(f"| {r['schedule']} | {r['step']} | {t} | {r['rate']} | {r['size']} | {r['target']} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="about this many rows per schedule")
    ap.add_argument("--schedules", default="base,pingpong")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs after one cold run")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    info = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
            "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
            "loadavg_before": os.getloadavg()}
    print(f"{info['date']}  {info['machine']['cpu']} x{info['machine']['cores']}  load {info['loadavg_before']}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for sched in args.schedules.split(","):
            print(f"{sched}:", flush=True)
            results.append(bench_schedule(sched, args.events, args.repeat, tmp,
                                          log=lambda m: print(m, flush=True)))
    info["loadavg_after"] = os.getloadavg()
    md = table(results)
    print(md)
    print(f"load average after: {info['loadavg_after']}")
    if args.json:
        from fa4trace.bench.results import envelope, write

        m = info["machine"]
        load = f"{min(info['loadavg_before'][0], info['loadavg_after'][0]):.1f}-" \
               f"{max(info['loadavg_before'][0], info['loadavg_after'][0]):.1f}"
        doc = envelope("host", f"Host pipeline on a {m['cores']}-core CPU machine (decode, Perfetto, Chrome)",
                       table_rows(results),
                       gpu=f"none: {m['cpu']} x{m['cores']} (load {load}), Python {m['python']}, "
                           f"numpy {m['numpy']}, pyarrow {m['pyarrow']}",
                       columns=[("schedule", "schedule"), ("step", "step"), ("spread", "median s [range]"),
                                ("rate", "rate"), ("size", "size"), ("target", "target")],
                       notes=f"~{args.events:,} synthetic events per schedule (fa4trace.testing.bundles: 132 CTAs x 5 "
                             f"warps); median [range] of {args.repeat} runs after one cold run; rates of the median.",
                       info=info, targets=TARGETS, results=results)
        print(f"wrote {write(args.json, doc)}")


if __name__ == "__main__":
    main()
