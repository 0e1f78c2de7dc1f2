"""The viewer's part of `fa4trace diff`: the figures that moved beyond noise from A to B, as
table rows and the sentences around them (numbers and words are fa4trace.analysis.diff's)."""

from __future__ import annotations

from fa4trace.analysis.diff import band_text, change_text, value_text
from fa4trace.analysis.words import plural

MARK = {"regressed": "▲ regressed", "improved": "▼ improved", "changed": "• changed"}


def moved_rows(result: dict) -> list[dict]:
    """One row per figure beyond noise, the most moved first: what `fa4trace diff A B` names."""
    several = len(result.get("groups") or []) > 1
    rows = []
    for f in sorted((f for f in result["figures"] if f.get("rank")), key=lambda f: f["rank"]):
        row = {"launch": f["launch"]} if several else {}
        row.update({"role": f["role"], "stage": f["stage"], "figure": f["metric"], "A": value_text(f, "base"),
                    "B": value_text(f, "new"), "change": change_text(f), "noise band": band_text(f),
                    "": MARK.get(f["status"], f["status"])})
        rows.append(row)
    return rows


def title(result: dict) -> str:
    """The section's label: how many figures regressed, improved, changed of how many."""
    figs = result["figures"]
    counts = {s: sum(f["status"] == s for f in figs) for s in MARK}
    moved = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    if not moved:
        return f"B against A, beyond noise: nothing moved ({plural(len(figs), 'figure')})"
    return f"B against A, beyond noise: {moved} of {plural(len(figs), 'figure')}"


def caption(result: dict) -> str:
    """What the band is and how A and B differ besides their figures."""
    from fa4trace.analysis.overlap import diff_text

    d = result["differs"]
    n = result["figures_judged"]
    parts = [f"{100 * result['confidence']:.0f}% noise band for " + ("its one figure" if n == 1 else f"all {n} figures together")
             + ", from each bundle's CTAs (rank-based; = fa4trace diff A B, docs/diff.md)"]
    if d.get("config"):
        parts.append(f"config: {diff_text(d['config'])}")
    if d.get("label"):
        parts.append(f"labels: {d['label'][0]} → {d['label'][1]}")
    parts += result.get("notes") or []
    return " · ".join(parts)


def any_regressed(result: dict) -> bool:
    return any(f["status"] == "regressed" for f in result["figures"])
