"""The table of traces/auto/ in traces/README.md, from the bundles themselves.

    python benchmarks/auto_traces_table.py [traces/auto]
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _warps(ws):
    ws = sorted(ws)
    return f"{ws[0]}-{ws[-1]}" if len(ws) > 1 and ws[-1] - ws[0] == len(ws) - 1 else ",".join(map(str, ws))


def main(folder="traces/auto"):
    import fa4trace
    from fa4trace.analysis.kernel import summarize_kernel

    print("| bundle | kernel | config | CTAs × warps recorded | rows | roles (inferred) | waiting share per role | "
          "wait chain of the typical CTA | traced == plain | MB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".parquet"):
            continue
        path = os.path.join(folder, name)
        t = fa4trace.load(path)
        s = summarize_kernel(t)
        cfg = ", ".join(f"{k}={v}" for k, v in sorted(t.meta.get("config", {}).items()) if k not in ("variant",))
        ev = t.events
        ctas = len(set(ev.column("cta").to_pylist()))
        warps = len(set(zip(ev.column("cta").to_pylist(), ev.column("warp").to_pylist())))
        roles = ", ".join(f"{r} {_warps(v['warps'])}" for r, v in s["roles"].items())
        waiting = ", ".join(f"{r} {100 * v['waiting']:.0f}%" for r, v in s["role_fractions"].items() if r != "idle")
        ch = s.get("wait_chain") or {}
        top = ", ".join(f"{k} {v / 1000:.1f}" for k, v in list(ch.get("by_event", {}).items())[:2])
        chain = (f"{ch['wait_ns'] / 1000:.1f} µs in {ch['steps']} waits ({100 * ch['share_of_cta']:.0f}% of the CTA; {top})"
                 if ch else "-")
        ok = t.meta.get("instrument", {}).get("checked")
        print(f"| `{name}` | {t.meta.get('kernel')} | {cfg} | {ctas} × {warps // max(ctas, 1)} | {len(t)} | "
              f"{roles} | {waiting} | {chain} | "
              f"{all(ok) if ok else '-'} | {os.path.getsize(path) / 1e6:.2f} |")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default="traces/auto")
    main(ap.parse_args().folder)
