"""Viewer benchmark: time to first render, driven headless.

    python benchmarks/bench_app.py [--blocks 424] [--no-browser] [--json out.json]

Two cases:
  default  the app as `fa4trace view` opens it (bundles in traces/, default pairing)
  1M pair  a synthetic base/ping-pong pair of ~1 M events each (fa4trace.testing.bundles, 132 CTAs x
           5 warps, --blocks KV blocks; labelled synthetic: a scale test, not a measurement)
  1M in one CTA  ~1 M synthetic events in a single CTA, window widened to the whole CTA
           (AppTest): what the server-side decimation sends to the browser

Two drivers:
  AppTest  streamlit.testing.v1 in a fresh Python process: the script run that produces the
           page (loading, analysis, figures), cold (first run in the process) and warm (rerun).
  browser  headless Chromium on a real server (the viewer's server.py, as `fa4trace view` runs it):
           from navigation to the timeline drawn by plotly and the script finished, on a fresh
           server (cold caches) and on a second page load (warm caches); then the Perfetto UI
           tab until its trace processor has the trace (export + postMessage + wasm import).

``--json`` writes the "viewer" area of BENCHMARKS.md (one row per case; every number under
"results"). Wall-clock times on a shared machine: the 1-minute load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RENDERED_JS = ("(() => { const p = document.querySelector('.js-plotly-plot');"
               " return !!(p && p.data && p.data.length && p.querySelector('.main-svg'))"
               " && !document.querySelector('[data-testid=stStatusWidget]')"
               " && document.querySelectorAll('[data-testid=stException]').length === 0; })()")

APPTEST_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
from streamlit.testing.v1 import AppTest
t_import = time.perf_counter() - t0
at = AppTest.from_file(sys.argv[1], default_timeout=600)
t = time.perf_counter(); at.run(); cold = time.perf_counter() - t
assert not at.exception, [e.value for e in at.exception]
t = time.perf_counter(); at.run(); warm = time.perf_counter() - t
full = None
if os.environ.get("BENCH_FULL_WINDOW") and at.slider:
    s = at.slider[0]
    t = time.perf_counter(); s.set_value((s.min, s.max)).run(); full = time.perf_counter() - t
    assert not at.exception, [e.value for e in at.exception]
charts = at.get("plotly_chart")
spec = json.loads(charts[0].proto.spec) if charts else {"data": []}
import numpy as np, base64
def n_seg(tr):
    x = tr.get("x")
    if isinstance(x, dict):
        x = np.frombuffer(base64.b64decode(x["bdata"]), dtype=x["dtype"])
    x = np.asarray(x if x is not None else [], dtype=float)
    return int(np.isnan(x).sum()) if tr.get("mode") == "lines" else int(x.size)
titles = [a["text"] for a in spec.get("layout", {}).get("annotations", [])]
print(json.dumps({"import_s": t_import, "cold_s": cold, "warm_s": warm, "full_window_s": full, "titles": titles,
                  "segments": sum(n_seg(t) for t in spec["data"]), "figure_bytes": len(charts[0].proto.spec) if charts else 0,
                  "a": at.session_state["trace_a"], "b": at.session_state["trace_b"]}))
"""


def apptest(env: dict) -> dict:
    import fa4trace.viewer

    main_py = Path(fa4trace.viewer.__file__).with_name("main.py")
    r = subprocess.run([sys.executable, "-c", APPTEST_CHILD, str(main_py)], capture_output=True,
                       text=True, env={**os.environ, **env}, cwd=REPO, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def browser(bundles: list[str], env: dict) -> dict:
    from tests.tools.headless import PERFETTO_WINDOW_JS, Chromium, StreamlitServer, perfetto_query_js

    out = {}
    with StreamlitServer(bundles, env=env, timeout=120) as srv:
        with Chromium(width=1500, height=1600, offline=True) as br:
            for label in ("cold_s", "warm_s"):
                br.navigate("about:blank")
                t = time.perf_counter()
                br.navigate(srv.url)
                br.wait_for(RENDERED_JS, timeout=120, interval=0.05)
                out[label] = time.perf_counter() - t
            # the Perfetto tab: export, embed, load into the wasm trace processor (default scope)
            br.navigate("about:blank")
            t = time.perf_counter()
            br.navigate(srv.url + "/?view=Perfetto%20UI")
            br.wait_for(f"(() => {{ const w = {PERFETTO_WINDOW_JS}; "
                        "return !!(w && w.app && w.app.trace && w.app.trace.traceInfo); })()", timeout=300, interval=0.05)
            out["perfetto_s"] = time.perf_counter() - t
            out["perfetto_slices"] = br.evaluate(perfetto_query_js("select count(*) as n from slice"))[0]["n"]
    return out


def make_pair(d: Path, blocks: int) -> tuple[list[str], int]:
    from fa4trace.trace.bundle import Trace
    from fa4trace.trace.decode import decode_buffer
    from fa4trace.testing.bundles import attention_like

    paths, rows = [], 0
    for sched in ("base", "pingpong"):
        buf, meta = attention_like(sched, n_ctas=132, n_blocks=blocks, seed=1)
        tr = Trace.from_launches([decode_buffer(buf)], meta)
        rows = max(rows, len(tr))
        paths.append(str(tr.save(d / f"synthetic_1m_{sched}.parquet", overwrite=True)))
    return paths, rows


def make_one_cta(d: Path, rows: int) -> str:
    """~rows events in a single CTA (ping-pong): the timeline must decimate a whole-CTA window."""
    from fa4trace.trace.bundle import Trace
    from fa4trace.trace.decode import decode_buffer
    from fa4trace.testing.bundles import attention_like

    buf, meta = attention_like("pingpong", n_ctas=1, n_blocks=max(1, rows // 18), seed=2)
    return str(Trace.from_launches([decode_buffer(buf)], meta).save(d / "synthetic_1m_one_cta.parquet", overwrite=True))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=424, help="KV blocks per CTA of the synthetic pair (424 -> ~1.0 M rows)")
    ap.add_argument("--no-browser", action="store_true", help="AppTest only")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: servers and browsers are ended

    from fa4trace.viewer.data import TRACES_DIR, startup
    from tests.tools.headless import find_chromium

    results = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(),
               "cpus": os.cpu_count(), "machine": platform.machine()}
    start = startup([], TRACES_DIR)
    names = {s.key: s.path.name for s in start.sources if s.path}
    results["default_traces"] = [names[k] for k in (start.default_a, start.default_b) if k]
    results["default_is_pair"] = start.default_b is not None
    print(f"default view: {results['default_traces']}", flush=True)
    use_browser = not args.no_browser and find_chromium() is not None
    none = {"FA4TRACE_BUNDLES": "", "FA4TRACE_TRACES_DIR": ""}
    with tempfile.TemporaryDirectory(prefix="fa4trace-bench-app-") as d:
        cases = {"default": ([], none)}
        t = time.perf_counter()
        pair, rows = make_pair(Path(d), args.blocks)
        results["synthetic_rows_per_trace"] = rows
        results["synthetic_make_s"] = time.perf_counter() - t
        empty = Path(d) / "empty"
        empty.mkdir()
        cases["1M pair"] = (pair, {"FA4TRACE_BUNDLES": os.pathsep.join(pair), "FA4TRACE_TRACES_DIR": str(empty)})
        one = make_one_cta(Path(d), rows)
        cases["1M in one CTA"] = ([one], {"FA4TRACE_BUNDLES": one, "FA4TRACE_TRACES_DIR": str(empty),
                                          "BENCH_FULL_WINDOW": "1"})
        for name, (bundles, env) in cases.items():
            r = {"load_before": os.getloadavg()[0], "apptest": apptest(env)}
            if use_browser and name != "1M in one CTA":
                benv = dict(env)
                benv["FA4TRACE_BUNDLES"] = ""  # the browser case passes them on the command line
                r["browser"] = browser(bundles, benv)
            r["load_after"] = os.getloadavg()[0]
            results[name] = r
            print(f"{name}: {json.dumps(r)}", flush=True)
    if not use_browser:
        results["browser"] = "skipped (no chromium or --no-browser)"
    print()
    print("| case | AppTest cold | AppTest warm | browser cold | browser warm | Perfetto tab (slices) | segments sent | 1-min load |")
    print("|---|---|---|---|---|---|---|---|")
    for name in ("default", "1M pair"):
        r = results[name]
        b = r.get("browser", {})
        print(f"| {name} | {r['apptest']['cold_s']:.2f} s | {r['apptest']['warm_s']:.2f} s | "
              f"{b.get('cold_s', float('nan')):.2f} s | {b.get('warm_s', float('nan')):.2f} s | "
              f"{b.get('perfetto_s', float('nan')):.2f} s ({b.get('perfetto_slices', 0):,}) | {r['apptest']['segments']:,} | "
              f"{r['load_before']:.1f}–{r['load_after']:.1f} |")
    r = results["1M in one CTA"]["apptest"]
    print(f"\n1M events in one CTA, whole-CTA window: rerun {r['full_window_s']:.2f} s, {r['segments']:,} segments "
          f"sent ({r['titles'][0].split(' · ')[-1] if r['titles'] else ''})")
    if args.json:
        from fa4trace.bench.results import envelope, write

        def sec(x):
            return None if x is None else round(x, 2)

        rows = []
        for name in ("default", "1M pair", "1M in one CTA"):
            r = results[name]
            b = r.get("browser", {})
            case = name if name != "default" else f"default: {', '.join(results['default_traces'])}"
            rows.append({"case": case, "apptest_cold": sec(r["apptest"]["cold_s"]),
                         "apptest_warm": sec(r["apptest"]["warm_s"]),
                         "full_window": sec(r["apptest"].get("full_window_s")),
                         "browser_cold": sec(b.get("cold_s")), "browser_warm": sec(b.get("warm_s")),
                         "perfetto_tab": sec(b.get("perfetto_s")), "segments": r["apptest"]["segments"],
                         "load": f"{r['load_before']:.1f}-{r['load_after']:.1f}"})
        doc = envelope("viewer", "Viewer (Streamlit app) speed", rows,
                       gpu=f"none: {results['cpus']}-core {results['machine']}, Python {results['python']}",
                       columns=[("case", "case"), ("apptest_cold", "AppTest cold s"), ("apptest_warm", "AppTest warm s"),
                                ("full_window", "whole-CTA window s"), ("browser_cold", "browser cold s (first render)"),
                                ("browser_warm", "browser warm s"), ("perfetto_tab", "Perfetto tab s"),
                                ("segments", "segments sent"), ("load", "1-min load")],
                       results=results)
        print(f"wrote {write(args.json, doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
