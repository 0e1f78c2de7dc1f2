"""torch.profiler merge benchmark: `fa4trace merge` of a ~200 MB profiler trace with 10 bundles,
and of several ranks of them (`fa4trace merge --ranks`).

    python benchmarks/bench_merge.py [--trace-mb 200] [--bundles 10] [--rows 1000000]
                                     [--repeat 3] [--json benchmarks/results/merge_cpu.json]
    python benchmarks/bench_merge.py --ranks 8 [--repeat 1] [--json benchmarks/results/merge_ranks_cpu.json]

Makes, on the CPU, ``--bundles`` bundles of ~``--rows`` rows each (fa4trace.testing.bundles.attention_like:
132 CTAs x 5 warps, clearly synthetic) and a torch.profiler Chrome trace of at least
``--trace-mb`` MB around them (fa4trace.testing.profiler.profiled_run: Kineto's layout, each
bundle's launch placed in it), then times the ``fa4trace merge`` command on them: the whole
command line (a fresh process: imports, reading, matching, writing), after one cold run,
``--repeat`` times, with and without the per-launch numbers (--no-numbers), its wall time and
the CPU time of it and its worker processes (on a shared machine the CPU time over the cores
is what an idle one would come near, where the work spreads evenly); the output path is cleared
before each run (freeing the last run's file is no part of a merge). The merge's own stage
times (read, match, host events, warps, waiting for the numbers, write) and its CPU split (the
merging process, the launches' jobs) come from its report (``--json`` output of the command). The machine is shared: the load average is
recorded. Target: <= 20 s on 2 cores. ``--json`` writes the "merge" area of BENCHMARKS.md.

``--ranks N``: N ranks of a tensor-parallel run, each a profiler trace of ``--trace-mb`` MB with
``--bundles`` bundles of ``--rows`` rows (fa4trace.testing.profiler.profiled_rank: one shared
timeline, an NCCL all-reduce per layer, each rank's clock off by a known offset), made on the
fly one rank at a time into rank<r>/ folders; then the `fa4trace merge --ranks` command on the
folder, timed as above, its peak memory the largest sum of the resident sets of it and its worker
processes (sampled from /proc every 0.2 s). Target: <= 60 s on 2 cores, <= 4 GB, for 8 ranks.
``--json`` writes the "merge-ranks" area (docs/profiler-merge-speed.md). ``--keep DIR`` makes the
inputs in DIR once and reuses them on later runs (the recorded command says DIR).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

TARGET_S = 20.0
RANKS_TARGET_S = 60.0
RANKS_TARGET_GB = 4.0
RANK_OFFSETS_NS = [0, 37_000, -123_000, 5_000, 900_000, -2_000_000, 12, 77_777]  # injected, cycled past 8 ranks


def make_inputs(folder: Path, trace_mb: float, n_bundles: int, rows: int, log=print) -> dict:
    """The bundles (Parquet) and the profiler trace (JSON) in ``folder``; what they hold."""
    from fa4trace.trace.bundle import Trace
    from fa4trace.trace.decode import decode_buffer
    from fa4trace.testing.profiler import profiled_run
    from fa4trace.testing.bundles import attention_like

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


def make_rank_inputs(folder: Path, ranks: int, trace_mb: float, n_bundles: int, rows: int, log=print) -> dict:
    """rank<r>/prof.json and rank<r>/b<i>.parquet for each rank, made one rank at a time."""
    from fa4trace.trace.bundle import Trace
    from fa4trace.trace.decode import decode_buffer
    from fa4trace.testing.profiler import profiled_rank
    from fa4trace.testing.bundles import attention_like

    n_ctas = 132
    n_blocks = max(1, -(-(rows - 5 * n_ctas) // (18 * n_ctas)))
    t = time.perf_counter()
    buf, meta = attention_like("pingpong", n_ctas=n_ctas, n_blocks=n_blocks)
    base = Trace.from_launches([decode_buffer(buf)], meta)
    traces = [Trace(base.events, dict(base.meta, kernel=f"synthetic_attention_{chr(ord('a') + i)}_kernel"))
              for i in range(n_bundles)]
    offsets = [RANK_OFFSETS_NS[r % len(RANK_OFFSETS_NS)] for r in range(ranks)]
    sizes, events, collectives = [], 0, 0
    for r in range(ranks):
        d = folder / f"rank{r}"
        d.mkdir(parents=True, exist_ok=True)
        run = profiled_rank(traces, r, ranks, host_clock_offset_ns=offsets[r], steps=1, layers=1,
                            min_bytes=int(trace_mb * 1e6))
        sizes.append(run.write(d / "prof.json").stat().st_size)
        events += run.text.count('"ph": ')
        collectives = len(run.collectives)
        for i, tr in enumerate(run.traces):
            tr.save(d / f"b{i}.parquet")
        log(f"  rank {r}: {sizes[-1] / 1e6:.1f} MB trace, {n_bundles} bundles ({time.perf_counter() - t:.0f} s so far)")
        del run
    log(f"inputs: {ranks} ranks x ({sum(sizes) / ranks / 1e6:.1f} MB trace, {n_bundles} bundles x "
        f"{base.events.num_rows:,} rows) ({time.perf_counter() - t:.1f} s to make)")
    return {"folder": str(folder), "ranks": ranks, "trace_bytes": sum(sizes), "trace_events": events,
            "collectives_per_rank": collectives, "rows_per_bundle": base.events.num_rows,
            "n_bundles": n_bundles * ranks, "offsets_ns": offsets}


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and every process below it (Linux /proc)."""
    kids: dict = {}
    rss: dict = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            fields = st[st.rindex(")") + 2:].split()
            kids.setdefault(int(fields[1]), []).append(int(d))
            rss[int(d)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += kids.get(p, [])
    return total


def merge_ranks_cli(inputs: dict, out: Path, extra: list) -> tuple[float, float, dict, int]:
    """One `fa4trace merge --ranks` as a fresh process: (wall s, CPU s, its JSON report, peak bytes)."""
    cmd = [sys.executable, "-m", "fa4trace", "merge", "--ranks", inputs["folder"], "-o", str(out), "--force",
           "--json", *extra]
    out.unlink(missing_ok=True)  # the last run's output (GBs): freeing it is no part of this run
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=os.path.join(os.path.dirname(__file__), ".."))
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.wait(0.2):
            peak[0] = max(peak[0], _tree_rss(proc.pid))

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    stdout, stderr = proc.communicate()
    done.set()
    th.join()
    wall = time.perf_counter() - t
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"fa4trace merge --ranks failed: {stderr.strip()}")
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return wall, cpu, json.loads(stdout), peak[0]


def bench_ranks(inputs: dict, out: Path, repeat: int, log=print) -> list[dict]:
    rows = []
    for label, extra in (("merge --ranks (with numbers)", []), ("merge --ranks --no-numbers", ["--no-numbers"])):
        walls, cpus, reports, peaks, loads = [], [], [], [], []
        for _ in range(repeat):
            load0 = os.getloadavg()[0]
            w, cpu, rep, peak = merge_ranks_cli(inputs, out, extra)
            log(f"  {label}: {w:.2f} s wall, {cpu:.2f} s CPU, peak {peak / 1e9:.2f} GB (load {load0:.1f} before, "
                f"{os.getloadavg()[0]:.1f} after)")
            walls.append(w)
            cpus.append(cpu)
            reports.append(rep)
            peaks.append(peak)
            loads.append([round(load0, 2), round(os.getloadavg()[0], 2)])
        best = reports[walls.index(min(walls))]
        med = statistics.median(walls)
        rc = best["rank_clock"]
        offs = {r["rank"]: r["offset_ns"] for r in best["ranks"]}
        recovered = max(abs(offs[r] - (inputs["offsets_ns"][r] - inputs["offsets_ns"][0])) for r in offs)
        peak_gb = max(peaks) / 1e9
        met = med <= RANKS_TARGET_S and peak_gb <= RANKS_TARGET_GB
        rows.append({"case": label, "median_s": round(med, 2), "best_s": round(min(walls), 2),
                     "runs": [round(w, 2) for w in walls], "cpu_median_s": round(statistics.median(cpus), 2),
                     "peak_gb": round(peak_gb, 2), "loadavg_per_run": loads,
                     "cpu_split_best_run": best["written"].get("cpu_s"),
                     "stages_best_run": best["written"]["stages"], "output_mb": round(best["written"]["bytes"] / 1e6, 1),
                     "slices": best["written"]["slices"], "launches": len(best["launches"]),
                     "alignment_error_ns": rc.get("error_ns"), "alignment_worst_ns": rc.get("worst_ns"),
                     "offset_recovery_err_ns": int(recovered),
                     "target": f"<= {RANKS_TARGET_S:g} s and <= {RANKS_TARGET_GB:g} GB: "
                               f"{'met' if met else '**missed**'}"})
    return rows


def merge_cli(inputs: dict, out: Path, extra: list) -> tuple[float, float, dict]:
    """One `fa4trace merge` as a fresh process: (wall s, CPU s of it and its workers, its JSON report)."""
    cmd = [sys.executable, "-m", "fa4trace", "merge", inputs["trace"], *inputs["bundles"], "-o", str(out),
           "--force", "--json", *extra]
    out.unlink(missing_ok=True)  # the last run's output: freeing it is no part of this run
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
                     "cpu_split_best_run": best["written"].get("cpu_s"),
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
    ap.add_argument("--ranks", type=int, default=0, help="merge this many ranks (fa4trace merge --ranks)")
    ap.add_argument("--keep", default=None, help="--ranks: make the inputs in this folder and keep them")
    args = ap.parse_args(argv)
    if args.ranks:
        return main_ranks(args)
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
                  f"fa4trace.testing.bundles.attention_like). Wall time of the whole command (a fresh process) after one "
                  f"cold run; {args.repeat} runs. CPU time of the best run, the merging process and the launches' "
                  f"jobs: " + "; ".join(f"{r['case']}: {_split(r)}" for r in rows) + ". Stage times of the best run: "
                  + "; ".join(f"{r['case']}: " + ", ".join(f"{k} {v}" for k, v in r["stages_best_run"].items())
                              for r in rows),
            info=info, inputs={k: v for k, v in inputs.items() if k not in ("trace", "bundles")}, results=rows)
        print(f"wrote {write(args.json, doc)}")


def main_ranks(args) -> None:
    """--ranks: make the ranks' inputs, time `fa4trace merge --ranks`, write the results."""
    info = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "cores": os.cpu_count(),
            "loadavg_before": os.getloadavg(), "uptime_before": _uptime()}
    with contextlib.ExitStack() as stack:
        folder = Path(args.keep) if args.keep else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        if args.keep and (folder / "inputs.json").exists():
            inputs = json.loads((folder / "inputs.json").read_text())
            print(f"inputs: kept in {folder}")
        else:
            inputs = make_rank_inputs(folder / "ranks", args.ranks, args.trace_mb, args.bundles, args.rows)
            if args.keep:
                (folder / "inputs.json").write_text(json.dumps(inputs))
        info["loadavg_inputs_made"] = os.getloadavg()
        rows = bench_ranks(inputs, folder / "all.pftrace", args.repeat)
        (folder / "all.pftrace").unlink(missing_ok=True)
    info["loadavg_after"] = os.getloadavg()
    info["uptime_after"] = _uptime()
    for r in rows:
        print(f"{r['case']}: median {r['median_s']} s (best {r['best_s']}; CPU {r['cpu_median_s']} s), peak "
              f"{r['peak_gb']} GB, stages {r['stages_best_run']}, {r['output_mb']} MB, alignment error "
              f"{r['alignment_error_ns']} ns (worst {r['alignment_worst_ns']}), offsets recovered within "
              f"{r['offset_recovery_err_ns']} ns, {r['target']}")
    if args.json:
        from bench_export import machine

        from fa4trace.bench.results import envelope, write

        m = machine()
        loads = [x for r in rows for run in r["loadavg_per_run"] for x in run]
        doc = envelope(
            "merge-ranks",
            f"fa4trace merge --ranks: {inputs['ranks']} ranks x (a {inputs['trace_bytes'] / inputs['ranks'] / 1e6:.0f} MB "
            f"torch.profiler trace + {inputs['n_bundles'] // inputs['ranks']} bundles of "
            f"{inputs['rows_per_bundle'] / 1e6:.1f} M rows) ({m['cores']} cores)",
            [{k: r[k] for k in ("case", "median_s", "best_s", "runs", "cpu_median_s", "peak_gb", "output_mb", "slices",
                                "alignment_error_ns", "alignment_worst_ns", "offset_recovery_err_ns", "target")}
             for r in rows],
            gpu=f"none: {m['cpu']} x{m['cores']} (load {min(loads):.1f}-{max(loads):.1f} during the runs), "
                f"Python {m['python']}, numpy {m['numpy']}, pyarrow {m['pyarrow']}, msgspec {_version('msgspec')}",
            columns=[("case", "case"), ("median_s", "median s"), ("best_s", "best s"), ("cpu_median_s", "CPU s"),
                     ("peak_gb", "peak GB"), ("output_mb", "output MB"), ("slices", "slices"),
                     ("alignment_error_ns", "alignment error ns"), ("alignment_worst_ns", "worst ns"),
                     ("offset_recovery_err_ns", "offsets recovered within ns"), ("target", "target")],
            notes=f"Synthetic inputs ({inputs['trace_events']:,} Kineto events over the ranks, "
                  f"{inputs['collectives_per_rank']} NCCL all-reduces per rank; bundles from "
                  f"fa4trace.testing.bundles.attention_like; clock offsets injected per rank: "
                  f"{', '.join(f'{o / 1e3:+g}' for o in inputs['offsets_ns'])} µs). Wall time of the whole command "
                  f"(a fresh process), {args.repeat} run(s) each; peak: the largest sum of resident sets of the "
                  f"command and its workers. The machine is shared: load average before/after each run in the "
                  f"file (uptime: {info['uptime_before']} / {info['uptime_after']}). CPU time of the best run, the "
                  f"merging process and the launches' jobs (the workers'): "
                  + "; ".join(f"{r['case']}: {_split(r)}" for r in rows) + ". Stage times of the best run: "
                  + "; ".join(f"{r['case']}: " + ", ".join(f"{k} {v}" for k, v in r["stages_best_run"].items())
                              for r in rows),
            info=info, inputs={k: v for k, v in inputs.items() if k != "folder"}, results=rows,
            command=_command(args))
        print(f"wrote {write(args.json, doc)}")


def _command(args) -> str:
    """The command line as recorded: a ``--keep`` folder (inputs made by this script earlier and
    reused) is a path of this machine, written as DIR."""
    argv = ["python", "benchmarks/bench_merge.py", *sys.argv[1:]]
    if args.keep:
        argv = ["DIR" if a == args.keep else a.replace(f"--keep={args.keep}", "--keep=DIR") for a in argv]
    return " ".join(argv)


def _split(row: dict) -> str:
    """The merge's own CPU split (its report's written.cpu_s): main process, launches' jobs."""
    c = row.get("cpu_split_best_run") or {}
    return f"main {c.get('main', '?')} s, launches {c.get('launches', '?')} s"


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not recorded"


def _version(pkg: str) -> str:
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:  # noqa: BLE001 - not installed
        return "not installed"


if __name__ == "__main__":
    main()
