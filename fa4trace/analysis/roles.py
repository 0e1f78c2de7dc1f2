"""Which role each warp of an automatically traced kernel plays, and a trace that says so.

The decoder gives role "unknown" to warps of kernels traced by fa4trace.instrument (the
instrumenter does not know the kernel's warp specialization). A role is decided per warp index
in the CTA, first of:

1. ``given``: the ``roles`` argument (warp index -> role, or role -> warp indices; a warp
   index the trace does not hold is refused, in one line);
2. ``instrument``: the bundle's ``instrument.roles`` (role -> warp indices), when the kernel said;
3. ``recorded``: the role the warp recorded itself (hand-placed Recorder roles), if not unknown;
4. ``inferred``: from what the warp index recorded in any CTA, by the first rule that holds:
   **mma**: any mma.* event; **producer**: a pipeline acquire or commit, or a tma.load;
   **epilogue**: a tma.store (or store_wait); **consumer**: a pipeline wait or release;
   **epilogue**: barrier events and nothing else; **idle**: nothing but its lifetime;
   **unknown**: anything else (hand-placed events only).

Why per warp index: warp specialization is a function of the warp index in every CTA, and
an index that does a role's work in one CTA does it in all of them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from ..format.errors import Fa4traceError
from ..trace.bundle import Trace
from .autoevents import AutoCols

ROLE_ORDER = ("producer", "mma", "consumer", "epilogue", "unknown", "idle")  # display order
SOURCES = ("given", "instrument", "recorded", "inferred")


def normalize_roles(roles) -> dict[int, str]:
    """warp index -> role from either {warp: role} or {role: [warps]}; one-line errors."""
    if not roles:
        return {}
    if not isinstance(roles, Mapping):
        raise Fa4traceError(f"roles must be a mapping (warp -> role or role -> warps), got {type(roles).__name__}")
    out: dict[int, str] = {}
    for k, v in roles.items():
        if isinstance(v, (list, tuple, set, range)):
            pairs = [(w, str(k)) for w in v]
        else:
            pairs = [(k, str(v))]
        for w, r in pairs:
            try:
                w = int(w)
            except (TypeError, ValueError):
                raise Fa4traceError(f"role {r!r}: warp index {w!r} is not an integer") from None
            if w < 0:
                raise Fa4traceError(f"role {r!r}: warp index {w} is negative")
            if not r or not r.replace("_", "").isalnum():
                raise Fa4traceError(f"role name {r!r} must be a word (letters, digits, _)")
            if out.get(w, r) != r:
                raise Fa4traceError(f"warp {w} is given two roles: {out[w]!r} and {r!r}")
            out[w] = r
    return out


def infer_roles(c: AutoCols) -> dict[int, str]:
    """Role per warp index from what it recorded (rule 4 of the module docstring)."""
    if c.n == 0:
        return {}
    n_idx = int(c.warp.max()) + 1

    def has(mask) -> np.ndarray:
        return np.bincount(c.warp[mask], minlength=n_idx) > 0

    present = has(np.ones(c.n, bool))
    events = ~c.is_warp_row
    mma = has(c.where("mma"))
    produce = has(c.where("pipeline", ("acquire", "commit")) | c.where("tma", "load"))
    store = has(c.where("tma", ("store", "store_wait")))
    consume = has(c.where("pipeline", ("wait", "release")))
    barrier = has(c.where("barrier"))
    other = has(events & ~c.where("barrier"))
    anything = has(events)
    out = {}
    for w in np.flatnonzero(present).tolist():
        if mma[w]:
            r = "mma"
        elif produce[w]:
            r = "producer"
        elif store[w]:
            r = "epilogue"
        elif consume[w]:
            r = "consumer"
        elif barrier[w] and not other[w]:
            r = "epilogue"
        elif not anything[w]:
            r = "idle"
        else:
            r = "unknown"
        out[w] = r
    return out


def _recorded_roles(c: AutoCols) -> dict[int, str]:
    """The role each warp index recorded itself (the most rows that are not 'unknown')."""
    out = {}
    if c.n == 0 or not c.role_dict:
        return out
    known = np.array([r not in ("unknown", "") for r in c.role_dict])
    m = known[c.role_codes]
    if not m.any():
        return out
    n_roles = len(c.role_dict)
    counts = np.bincount(c.warp[m] * n_roles + c.role_codes[m], minlength=(int(c.warp.max()) + 1) * n_roles)
    counts = counts.reshape(-1, n_roles)
    for w in np.flatnonzero(counts.sum(axis=1)).tolist():
        out[w] = c.role_dict[int(np.argmax(counts[w]))]
    return out


def decide_roles(trace: Trace, roles=None, *, cols: AutoCols | None = None) -> dict:
    """{"by_warp": {warp: role}, "source": {warp: given|instrument|recorded|inferred}} for
    every warp index in the trace (keys are ints)."""
    c = cols if cols is not None else AutoCols.of(trace)
    given = normalize_roles(roles)
    inst = trace.info.instrument
    from_meta = normalize_roles((inst.roles if inst is not None else None) or {})
    recorded = _recorded_roles(c)
    inferred = infer_roles(c)
    _check_given(given, set(inferred))
    by_warp, source = {}, {}
    for w in sorted(set(inferred) | set(given) | set(from_meta)):
        for src, table in zip(SOURCES, (given, from_meta, recorded, inferred)):
            if w in table:
                by_warp[w], source[w] = table[w], src
                break
    present = set(inferred)
    return {"by_warp": {w: r for w, r in by_warp.items() if w in present},
            "source": {w: s for w, s in source.items() if w in present}}


def _check_given(given: dict[int, str], present: set) -> None:
    """A role given to a warp index the trace does not hold is a mistake (a typo, the wrong
    bundle): one line naming it and the warps there are, not a role silently dropped."""
    absent = sorted(set(given) - present)
    if absent:
        w = absent[0]
        raise Fa4traceError(f"role {given[w]!r}: warp {w} is not in this trace (its warps: {_spans(sorted(present))})")


def _spans(ws: list) -> str:
    """[0, 1, 2, 3, 8] -> '0-3, 8'; [] -> 'none'."""
    if not ws:
        return "none"
    parts, start = [], ws[0]
    for prev, w in zip(ws, ws[1:] + [None]):
        if w is None or w != prev + 1:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = w
    return ", ".join(parts)


def assign_roles(trace: Trace, roles=None) -> Trace:
    """The trace with its ``role`` column set per warp index (see the module docstring) and
    its metadata's ``role_assignment`` = {"by_warp": {"0": role...}, "source": {"0": how...}}."""
    c = AutoCols.of(trace)
    d = decide_roles(trace, roles, cols=c)
    ev = trace.events
    meta = trace.info.updated(role_assignment={"by_warp": {str(w): r for w, r in d["by_warp"].items()},
                                               "source": {str(w): s for w, s in d["source"].items()}}).to_meta()
    if ev.num_rows == 0:
        return Trace(ev, meta)
    names = sorted(set(d["by_warp"].values()), key=role_rank)
    lut = np.zeros(int(c.warp.max()) + 1, np.int16)
    for w, r in d["by_warp"].items():
        lut[w] = names.index(r)
    col = pa.DictionaryArray.from_arrays(pa.array(lut[c.warp]), pa.array(names, pa.string()))
    ev = ev.set_column(ev.schema.get_field_index("role"), ev.schema.field("role"), col)
    return Trace(ev, meta)


def role_rank(role: str) -> tuple:
    """Sort key: ROLE_ORDER first, other names alphabetically between unknown and idle."""
    if role in ROLE_ORDER:
        i = ROLE_ORDER.index(role)
        return (i if role != "idle" else len(ROLE_ORDER) + 1, "")
    return (len(ROLE_ORDER), role)
