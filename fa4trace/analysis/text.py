"""Text of `fa4trace summary` / `compare` for bundles of automatically traced kernels.

The numbers are fa4trace.analysis.kernel's (summarize_kernel, compare_kernels), formatted only;
lines that would only say "nothing" (idle warps' fractions, a pipeline with no recorded fill)
are left out of the text (the JSON keeps them).
"""

from __future__ import annotations

from .fidelity import perturbation_lines
from .words import config_value, plural


def pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def ns(x) -> str:
    return "n/a" if x is None else (f"{x / 1e3:.2f} µs" if abs(x) >= 1e4 else f"{x:.0f} ns")


def warps_text(ws) -> str:
    """[0, 1, 2, 3, 5] -> '0-3,5'."""
    ws = sorted(int(w) for w in ws)
    runs, i = [], 0
    while i < len(ws):
        j = i
        while j + 1 < len(ws) and ws[j + 1] == ws[j] + 1:
            j += 1
        runs.append(str(ws[i]) if i == j else f"{ws[i]}-{ws[j]}")
        i = j + 1
    return ",".join(runs)


def pipeline_recorded(d: dict) -> bool:
    """Whether a pipeline of a summary saw any fill, occupancy or lag (a pipeline whose stages
    were declared but whose commits were never recorded has nothing to show)."""
    counts = d.get("counts_per_cta") or {}
    return bool(counts.get("max")) or d.get("occupancy_mean") is not None or d.get("lag_median_ns") is not None


def launch_text(s: dict) -> str:
    """Which launch a summary's figures are: "1 launch", or "launch 0 of 2"."""
    n = s.get("launch_count") or s.get("launches") or 1
    return f"launch {s.get('launch', 0)} of {n}" if n > 1 else "1 launch"


def other_launches_lines(s: dict) -> list[str]:
    """A one-launch summary of a bundle of several: the other launches and their spans."""
    rows = s.get("other_launches") or []
    if not rows:
        return []
    return ["  other launches " + ", ".join(f"{r['launch']} ({ns(r.get('span_ns'))} span)" for r in rows)
            + " (--launch N shows one)"]


def format_launches(s: dict, format_one) -> str:
    """A summary of a bundle of several launches (``per_launch``): the launch table, kernel time
    across launches labelled as such, then each launch's own figures by ``format_one``."""
    lines = [f"{s['name']}{'  (SYNTHETIC)' if s.get('synthetic') else ''}",
             f"  launches       {s['launch_count']} in this bundle; each launch's own figures below "
             "(--launch N: one of them)",
             f"  {'launch':>8s}{'CTAs':>7s}{'warps':>8s}{'kernel time':>14s}{'starts at':>14s}"]
    t0 = min((r["start_ns"] for r in s.get("launch_table") or [] if r.get("start_ns") is not None), default=0)
    for r in s.get("launch_table") or []:
        at = "n/a" if r.get("start_ns") is None else f"{(r['start_ns'] - t0) / 1e9:+.6f} s"
        lines.append(f"  {r['launch']:>8d}{r['ctas']:>7d}{r['warps']:>8d}{ns(r.get('kernel_time_ns')):>14s}{at:>14s}")
    kt = (s.get("across_launches") or {}).get("kernel_time_ns")
    if s.get("launches_differ"):
        lines.append(f"  kernel time    the launches did different work ({s['launches_differ']}): no figure "
                     "across them, each launch's is its own")
    elif kt and kt["n"] > 1:
        lines.append(f"  kernel time    median of {kt['n']} launches {ns(kt['median'])} "
                     f"({ns(kt['min'])} to {ns(kt['max'])}): each launch's is its own")
    for one in s.get("per_launch") or []:
        lines += ["", f"launch {one.get('launch')} of {s['launch_count']}", format_one(one)]
    return "\n".join(lines)


def _counts(st: dict) -> str:
    """", N counts per CTA (median)" for a pipeline's fills per CTA; a median between two counts
    (CTAs that differ, e.g. only a cluster's leader fills) with one decimal and the range, never
    rounded to a count no CTA had."""
    cnt = st.get("median")
    if cnt is None:
        return ""
    if float(cnt).is_integer():
        return f", {plural(cnt, 'count', spec='.0f')} per CTA (median)"
    return f", {cnt:.1f} counts per CTA (median; {st['min']:.0f} to {st['max']:.0f})"


def format_kernel_summary(s: dict) -> str:
    if s.get("per_launch"):
        return format_launches(s, format_kernel_summary)
    cfg = s.get("config") or {}
    lines = [
        f"{s['name']}{'  (SYNTHETIC)' if s.get('synthetic') else ''}",
        f"  gpu            {s.get('gpu') or 'n/a'}{'  arch ' + s['arch'] if s.get('arch') else ''}",
        f"  config         {' '.join(f'{k}={config_value(v)}' for k, v in cfg.items()) or 'n/a'}",
        f"  rows           {s['rows']} ({plural(s['ctas'], 'CTA', spec='')}, {plural(s['warps'], 'warp', spec='')}, "
        f"{launch_text(s)})",
        *other_launches_lines(s),
        f"  kernel time    {ns(s.get('kernel_time_ns'))} [{s.get('kernel_time_source')}]",
        f"  dropped        {dropped_text(s)}",
        *perturbation_text(s.get("perturbation")),
        "  roles          " + ", ".join(f"{r} {warps_text(v['warps'])} ({v['source']})"
                                        for r, v in (s.get("roles") or {}).items()),
    ]
    fr, wbe = s.get("role_fractions") or {}, s.get("waiting_by_event") or {}
    if fr:
        lines.append(f"  {'role':13s}{'busy':>8s}{'waiting':>9s}{'idle':>8s}   waiting in")
        for r, f in fr.items():
            if r == "idle":  # idle by definition: the roles line names them
                continue
            top = ", ".join(f"{n} {pct(v)}" for n, v in list((wbe.get(r) or {}).items())[:3])
            lines.append(f"  {r:13s}{pct(f['busy']):>8s}{pct(f['waiting']):>9s}{pct(f['idle']):>8s}   {top}")
    for p, d in (s.get("pipelines") or {}).items():
        if not pipeline_recorded(d):
            continue
        n = d.get("stages")
        head = f"  pipeline {p + ':':10s} {plural(n, 'stage', spec='') if n else '? stages'}"
        lines.append(head + _counts(d.get("counts_per_cta") or {}))
        if d.get("occupancy_mean") is not None:
            lines.append(f"                 stages held: mean {d['occupancy_mean']:.2f}, max {d['occupancy_max']}; "
                         f"all held {pct(d['full_share'])}, none {pct(d['empty_share'])} of the time")
        if d.get("lag_median_ns") is not None:
            per = ", ".join(f"{x['stage']}: {ns(x['median_ns'])}" for x in d.get("lag_per_stage") or [])
            lines.append(f"                 lag commit → consumer wait end: median {ns(d['lag_median_ns'])}, "
                         f"p90 {ns(d['lag_p90_ns'])}; median per stage {per}")
    mf = s.get("mma_in_flight")
    if mf:
        ov = ", ".join(f"{n} {pct(v)}" for n, v in (mf.get("overlap") or {}).items() if v is not None)
        lines.append(f"  mma in flight  {plural(mf['groups'], 'group', spec='')}, median {ns(mf['median_ns'])} from commit to retire"
                     + (f"; named spans with the warp's MMAs in flight: {ov}" if ov else ""))
    ch = s.get("wait_chain")
    if ch:
        by = ", ".join(f"{n} {ns(v)}" for n, v in list(ch["by_event"].items())[:4])
        which = f" (median of {ch['ctas']} CTAs)" if ch.get("ctas", 1) > 1 else ""
        lines.append(f"  wait chain     CTA {ch['cta']}{which}: {plural(ch['steps'], 'wait', spec='')}, {ns(ch['wait_ns'])} "
                     f"({pct(ch.get('share_of_cta'))} of the CTA): {by or 'none'}")
        stats = s.get("wait_chain_ns") or {}
        if stats and ch.get("ctas", 1) > 1:
            lines.append(f"                 over CTAs: median {ns(stats['median'])}, max {ns(stats['max'])} "
                         f"(CTA {s.get('longest_chain_cta')})")
    return "\n".join(lines)


def dropped_text(s: dict) -> str:
    """What a summary lost: records dropped by full slots (the newest), or with shared-memory
    rings (``ring`` in the summary) the oldest records the rings overwrote."""
    if not s.get("ring"):
        return f"{plural(s['dropped'], 'record', spec='')} ({plural(s['overflowed_warps'], 'warp', spec='')} overflowed)"
    text = (f"ring of {plural(s['ring'], 'record', spec='')} per warp: the oldest {plural(s['overwritten'], 'record', spec='')} "
            f"of {plural(s['overwritten_warps'], 'warp', spec='')} {'was' if s['overwritten'] == 1 else 'were'} overwritten")
    newest = s["dropped"] - s["overwritten"]
    if newest > 0:  # launches without a ring in the same bundle
        text += f"; {plural(newest, 'newest record', spec='')} dropped by full slots"
    return text


def perturbation_text(p: dict | None, label: str = "perturbation") -> list[str]:
    """fa4trace.analysis.fidelity's lines, labelled like the summary's other rows."""
    lines = perturbation_lines(p)
    return [f"  {label if i == 0 else '':14s} {x}" for i, x in enumerate(lines)]


def fmt_value(key: str, v) -> str:
    """One metric's value as printed (share, ns or number by its key; "n/a" when absent)."""
    if v is None:
        return "n/a"
    if key.endswith(("busy", "waiting", "idle", "_share")):
        return pct(v)
    if key.endswith("_ns"):
        return ns(v)
    if isinstance(v, float):
        return f"{v:.0f}" if v.is_integer() else f"{v:.2f}"
    return str(v)


def fmt_delta(key: str, a, b) -> str:
    """B - A of one metric as printed, in its key's unit ("" when either is absent)."""
    if a is None or b is None:
        return ""
    d = b - a
    if key.endswith(("busy", "waiting", "idle", "_share")):
        return f"{100 * d:+.1f} pts"
    if key.endswith("_ns"):
        return (f"{d / 1e3:+.2f} µs" if abs(d) >= 1e4 else f"{d:+.0f} ns") + (f" ({100 * d / a:+.1f}%)" if a else "")
    return f"{d:+.2f}" if isinstance(d, float) and not d.is_integer() else f"{int(d):+d}"


LABELS = {"kernel_time_ns": "kernel time", "total_span_ns": "trace span", "wait_chain_ns": "wait chain (median CTA)",
          "wait_chain_steps": "wait chain steps", "dropped": "dropped records"}


def label(key: str) -> str:
    if key in LABELS:
        return LABELS[key]
    if key.startswith("role."):
        _, r, k = key.split(".", 2)
        return f"{r} {k}"
    if key.startswith("pipeline."):
        _, p, k = key.split(".", 2)
        return f"{p} {k.replace('_ns', '').replace('_', ' ')}"
    return key


def pairs_text(c: dict, format_one) -> str:
    """A comparison of several launch pairs (``pairs``): each pair's, headed by ``pair_line``."""
    return "\n\n".join(format_one(one) for one in c["pairs"])


def pair_line(c: dict) -> str:
    """Which launches a comparison of bundles of several launches set side by side ("" for two
    bundles of one launch each)."""
    na, nb = (c.get(k, {}).get("launch_count") or 1 for k in ("a", "b"))
    if na == nb == 1:
        return ""
    return f"A launch {c.get('launch_a')} of {na} vs B launch {c.get('launch_b')} of {nb}"


def format_kernel_compare(c: dict) -> str:
    from .kernel import metric_pairs

    if c.get("pairs"):
        return pairs_text(c, format_kernel_compare)
    out = [f"{'':28s}{'A: ' + c['a']['name']:>24s}  {'B: ' + c['b']['name']:>24s}  {'B − A':>18s}"]
    if pair_line(c):
        out.insert(0, pair_line(c))
    for key, a, b in metric_pairs(c["a"], c["b"]):
        out.append(f"{label(key):28s}{fmt_value(key, a):>24s}  {fmt_value(key, b):>24s}  {fmt_delta(key, a, b):>18s}")
    for which in ("a", "b"):
        out += perturbation_text(c[which].get("perturbation"), f"{which.upper()} perturbation")
    d = c.get("differs") or {}
    if d.get("kernel"):
        out.append(f"note: A is {d['kernel'][0]}, B is {d['kernel'][1]}: one device kernel "
                   f"({', '.join(d.get('device_kernels') or [])}) recorded under two labels")
    if c.get("speed"):
        out.append(c["speed"])
    elif d.get("config"):
        from .overlap import diff_text

        out.append(f"note: A and B ran different configs ({diff_text(c['differs']['config'])})")
    return "\n".join(out)
