"""Metrics panel: the numbers of `fa4trace compare --json`, formatted, with what changed.

Every number shown comes from :func:`fa4trace.analysis.overlap.compare` (two traces) or
:func:`fa4trace.analysis.overlap.summarize` (one), unmodified; the app also shows the raw dict, which
equals the CLI's JSON output for the same two bundles.
"""

from __future__ import annotations

from dataclasses import dataclass

ROWS = [  # (label, key, kind); kind picks the formatter
    ("kernel time", "kernel_time_ns", "ns"),
    ("achieved bandwidth", "bandwidth_tbps", "tbps"),
    ("QK ∥ SOFTMAX overlap", "qk_softmax_overlap", "pct"),
    ("PV ∥ SOFTMAX overlap", "pv_softmax_overlap", "pct"),
    ("hidden softmax per iteration (median)", "hidden_softmax_ns", "ns"),
    ("iteration period (median)", "period_ns", "ns"),
    ("tensor cores busy", "tensor_core_busy", "pct"),
    ("CTA time idle while the last mainloop runs", "mainloop_idle_share", "pct"),
    ("KV stream, steady rate (middle half)", "stream_tbps", "tbps"),
    ("KV stream: start beyond the steady pace", "stream_start_loss_ns", "ns"),
    ("KV stream: end beyond the steady pace", "stream_end_loss_ns", "ns"),
    ("after the last KV block (MMA, epilogue, combine)", "after_stream_ns", "ns"),
    ("startup: first KV load issued (median CTA)", "startup_first_load_ns", "ns"),
    ("startup: Q in shared memory (median CTA)", "startup_q_ready_ns", "ns"),
    ("startup: first QK issued (median CTA)", "startup_first_qk_ns", "ns"),
    ("startup: first PV issued (median CTA)", "startup_first_pv_ns", "ns"),
    ("dropped records", "dropped", "int"),
    ("warps recorded in each CTA", "warp_subset", "warps"),
]
MEDIANS = ("load_k", "load_v", "qk", "softmax", "correction", "pv")


def fmt(v, kind: str) -> str:
    if kind == "warps":  # a warp subset (``fa4trace record --warps``), None = every warp
        return "all" if not v else ", ".join(str(w) for w in v)
    if v is None:
        return "n/a"
    if kind == "pct":
        return f"{100 * v:.1f}%"
    if kind == "ns":
        return f"{v / 1e3:,.2f} µs" if abs(v) >= 1e4 else f"{v:,.0f} ns"
    if kind == "tbps":
        return f"{v:.2f} TB/s"
    if kind == "int":
        return f"{int(v):,}"
    return str(v)


def fmt_delta(a, b, kind: str) -> str:
    if a is None or b is None or kind == "warps":
        return ""
    d = b - a
    if kind == "pct":
        return f"{100 * d:+.1f} pts"
    if kind == "ns":
        s = f"{d / 1e3:+,.2f} µs" if abs(d) >= 1e4 else f"{d:+,.0f} ns"
    elif kind == "tbps":
        s = f"{d:+.2f} TB/s"
    else:
        s = f"{int(d):+,}"
    return s + (f" ({100 * d / a:+.1f}%)" if a else "")


@dataclass
class Row:
    label: str
    key: str
    a: float | None
    b: float | None
    a_text: str
    b_text: str
    delta_text: str


def metric_rows(sa: dict, sb: dict | None) -> list[Row]:
    """Rows of the metrics table for summaries ``sa`` and (optionally) ``sb``."""
    rows = []
    for label, key, kind in ROWS:
        a, b = sa.get(key), (sb or {}).get(key)
        if key == "kernel_time_ns":
            label = f"kernel time [{sa.get('kernel_time_source', '')}]"
        rows.append(Row(label, key, a, b, fmt(a, kind), fmt(b, kind) if sb else "", fmt_delta(a, b, kind) if sb else ""))
    ma, mb = sa.get("median_ns") or {}, (sb or {}).get("median_ns") or {}
    for ev in MEDIANS:
        if ev in ma or ev in mb:
            a, b = ma.get(ev), mb.get(ev)
            rows.append(Row(f"median {ev.upper()} duration", f"median_ns.{ev}", a, b, fmt(a, "ns"),
                            fmt(b, "ns") if sb else "", fmt_delta(a, b, "ns") if sb else ""))
    return rows


def headline(cmp: dict) -> list[str]:
    """The comparison in words, from compare()'s own sentences plus the overlap change."""
    out = [s for s in (cmp.get("headline"), cmp.get("speed")) if s]
    a, b = cmp["a"], cmp["b"]
    for key, label in (("qk_softmax_overlap", "QK ∥ SOFTMAX"), ("pv_softmax_overlap", "PV ∥ SOFTMAX")):
        if a.get(key) is not None and b.get(key) is not None:
            out.append(f"{label}: {fmt(a[key], 'pct')} → {fmt(b[key], 'pct')}")
    return out


def hidden_sentence(cmp: dict) -> str | None:
    """"B hides X ns of softmax per iteration, Y% of the period" (B's own numbers)."""
    b = cmp["b"]
    hid, per = b.get("hidden_softmax_ns"), b.get("period_ns")
    if hid is None or not per:
        return None
    sched = (b.get("config") or {}).get("schedule") or b.get("name")
    return f"{sched} hides {hid:,.0f} ns of softmax per iteration, {100 * hid / per:.1f}% of its {per:,.0f} ns period"
