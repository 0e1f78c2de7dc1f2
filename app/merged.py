"""The Profiler tab's data: a trace written by ``fa4trace merge`` (torch.profiler + bundles).

The merged Perfetto file carries its report (fa4trace.profiler.report): which kernel activity
each traced launch was matched to, the host ops around its launch call, how its clocks were
aligned, and fa4trace's busy / waiting / overlap numbers of the launch. These functions turn it
into the tab's kernel table and the drill-down of one launch (op -> kernel -> warps); the warps'
timeline comes from the launch's bundle, where it still is on disk. A merge of several ranks
(``fa4trace merge --ranks``) adds the ranks' table: each rank's process, GPUs, clock offset and
launches, and the cross-rank alignment error in the summary line.
"""

from __future__ import annotations

from pathlib import Path

from fa4trace.profiler.report import MergeReport, read_report

__all__ = ["load_report", "kernel_rows", "op_path", "role_rows", "facts", "bundle_path", "pct", "rank_rows",
           "summary_line"]


def load_report(path: str) -> MergeReport:
    """The report of a merged file (Fa4traceError in one line when the file is not one)."""
    return read_report(path)


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _us(ns) -> str:
    return "-" if ns is None else f"{ns / 1e3:,.2f}"


def _overlap(n: dict) -> str:
    ov = n.get("overlap") or {}
    return ", ".join(f"{k} {pct(v)}" for k, v in ov.items()) or "-"


def summary_line(name: str, report: MergeReport) -> str:
    """The line above the tab: what the merge holds and how well its clocks agree."""
    c = report.clock
    if not report.ranks:
        return (f"{name}: {len(report.launches)} traced launch(es) of {len(report.bundles)} bundle(s) in "
                f"{Path(report.profiler_trace).name} ({report.host.get('events', 0):,} profiler events). Clocks: kernel "
                f"start − first warp start {c.get('median_delta_ns', 0) / 1e3:+,.3f} µs (median), spread "
                f"{c.get('spread_ns', 0) / 1e3:,.3f} µs; warps placed by {report.align} alignment.")
    rc = report.rank_clock
    across = (f"one collective's kernels end within {_us(rc['error_ns'])} µs across the ranks (median over "
              f"{rc['collectives']} collectives, worst {_us(rc['worst_ns'])} µs)" if rc.get("error_ns") is not None
              else f"the ranks' alignment is not measured ({rc.get('why', 'no collective in common')})")
    return (f"{name}: {len(report.ranks)} ranks, {len(report.launches)} traced launch(es) of {len(report.bundles)} "
            f"bundle(s) ({report.host.get('events', 0):,} profiler events). Clocks: {rc.get('mode', '?')} — {across}; "
            f"each rank's warps against its kernels: spread up to {_us(c.get('spread_ns'))} µs "
            f"({report.align} alignment).")


def rank_rows(report: MergeReport) -> list[dict]:
    """One row per rank of a merge of several ranks (none for a merge of one process)."""
    rows = []
    for r in report.ranks:
        c = r.get("clock") or {}
        off = r.get("offset_ns")
        rows.append({
            "rank": r["rank"], "host": r.get("host") or "-", "pid": r.get("pid"),
            "GPU": ", ".join(str(d) for d in r.get("devices") or []) or "-", "profiler trace": r["profiler_trace"],
            "profiler events": r.get("events", 0), "bundles": len(r.get("bundles") or []),
            "traced launches": r.get("launches", 0),
            "clock offset µs": "not measured" if off is None else round(off / 1e3, 3),
            "taken out": off is not None and r.get("shift_ns") == off,
            "paired collectives": r.get("pairs", 0), "warps' spread µs": round(c.get("spread_ns", 0) / 1e3, 3)})
    return rows


def _rank_clock(report: MergeReport, e: dict) -> dict:
    """The clock statistics the launch was placed with: its rank's, or the merge's."""
    if "rank" in e:
        return next((r.get("clock") or {} for r in report.ranks if r["rank"] == e["rank"]), {})
    return report.clock


def kernel_rows(report: MergeReport) -> list[dict]:
    """One row per traced launch, in time order: what the tab's table shows (a merge of several
    ranks: the rank first)."""
    t0 = report.host.get("start_ns") or 0
    rows = []
    for e in sorted(report.launches, key=lambda e: e["kernel_start_ns"]):
        n = e.get("numbers") or {}
        rows.append({
            **({"rank": e["rank"]} if "rank" in e else {}),
            "launch": f"{e['bundle']}.{e['launch']}", "op": (e.get("ops") or ["-"])[-1], "kernel": e["label"],
            "stream": e["stream"], "start µs": round((e["kernel_start_ns"] - t0) / 1e3, 2),
            "kernel µs": round(e["kernel_dur_ns"] / 1e3, 2), "warps µs": round(e["span_ns"] / 1e3, 2),
            "busy": pct(n.get("busy")), "waiting": pct(n.get("waiting")), "idle": pct(n.get("idle")),
            "overlap": _overlap(n), "matched by": e["method"] + (" (ambiguous)" if e.get("ambiguous") else ""),
            "clock residual µs": round(e["residual_ns"] / 1e3, 3), "outside": e["outside"]})
    return rows


def entry_of(report: MergeReport, launch_id: str) -> dict:
    """The report's entry of launch "b.k"."""
    b, k = (int(x) for x in launch_id.split("."))
    return next(e for e in report.launches if e["bundle"] == b and e["launch"] == k)


def op_path(e: dict) -> list[str]:
    """op -> ... -> kernel -> warps, as the breadcrumb of the drill-down."""
    return [*(e.get("ops") or []), f"{e['kernel']} (stream {e['stream']}, {_us(e['kernel_dur_ns'])} µs)",
            f"{e.get('ctas', 0)} CTAs, {e.get('warps', 0)} warps"]


def role_rows(e: dict) -> list[dict]:
    """Busy / waiting / idle per role of the launch's warps (automatically traced kernels)."""
    roles = (e.get("numbers") or {}).get("roles") or {}
    return [{"role": r, "warps": v.get("warps"), "busy": pct(v.get("busy")), "waiting": pct(v.get("waiting")),
             "idle": pct(v.get("idle"))} for r, v in roles.items()]


def facts(e: dict, report: MergeReport) -> list[str]:
    """How the launch was matched and placed, in sentences."""
    out = [f"matched by {e['method']} among {e['candidates']} kernel(s) of its name"
           + (" — ambiguous: another kernel fitted as well" if e.get("ambiguous") else ""),
           f"kernel start − first warp start: {_us(e['delta_ns'])} µs (median over the "
           f"{'merge' if 'rank' not in e else 'rank ' + str(e['rank'])} "
           f"{_us(_rank_clock(report, e).get('median_delta_ns'))} µs; this launch {e['residual_ns'] / 1e3:+,.3f} µs off it)",
           f"placed by {report.align} alignment: first warp {_us(e['start_slack_ns'])} µs after the kernel starts, "
           f"last warp {_us(e['end_slack_ns'])} µs before it ends; {e['outside']} event(s) outside the kernel"]
    if not e.get("warps_drawn", True):
        out.append(f"its warps are not in the Perfetto file (the first {report.max_launches} launches per bundle only)")
    tc = (e.get("numbers") or {}).get("tensor_core_busy")
    if tc is not None:
        out.append(f"tensor cores busy {pct(tc)} of the CTAs' time")
    return out


def bundle_path(report: MergeReport, e: dict) -> Path | None:
    """The launch's bundle file, if the merge read it from disk and it is still there."""
    b = next((x for x in report.bundles if x["index"] == e["bundle"]), None)
    p = Path(b["path"]) if b and b.get("path") else None
    return p if p is not None and p.is_file() else None
