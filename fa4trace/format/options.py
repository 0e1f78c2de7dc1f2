"""The recording options that travel whole through the layers: who records (``Sampling``) and
how the recorder is placed in a kernel (``Placement``).

Each is a frozen dataclass, checked once when it is made (``__post_init__``: one line naming
the bad value, ``BadOption``), with one default per setting. The command line, ``instrument()``
and the recordings of fa4trace's own kernels make one and hand it down whole: to the buffer's
spec (``Sampling.spec``), to the compile that places the recorder (``fa4trace.auto.compiler``)
and to the device recorder itself (``fa4trace.device.segment.SegmentRecorder.start``). They live
in the format, the floor every other one stands on, so that every layer can take them.

``options(cls, given, where, **fields)``: the object an entry point that also takes the
fields as keywords (``fa4trace.instrument(ctas=16, cursor="gmem")``) works with, made in one
place.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

from .errors import BadOption
from .layout import DEFAULT_RING, MAX_CTA_WARPS, BufferSpec, check_ring

# The automatic event families fa4trace.instrument can place ("user" spans are named by the user).
FAMILIES = ("pipeline", "tma", "mma", "barrier")
# Where a SegmentRecorder keeps its cursor (and, "ring", its records) between segments.
CURSORS = ("gmem", "smem", "ring")
# The L2 policy of record stores: "first" (evict_first: records leave L2 before a kernel's reused
# data) or "last" (evict_last: records stay in L2, for kernels that stream their inputs once).
L2_POLICIES = ("first", "last")
# CTAs that record where the launch's grid is unknown when the buffer is made (fa4trace.instrument
# allocates before the kernel computes its grid) and the sampling names no count: the first 256.
UNKNOWN_GRID_CTAS = 256
# Records per warp where neither the sampling nor the recording sizes the slots.
DEFAULT_CAPACITY = 4096


def count(name: str, value, low: int, *, none: bool = False) -> Optional[int]:
    """``value`` as an integer >= ``low`` (None passes where ``none``), else one BadOption line:
    the one check of every count an options object holds."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise BadOption(f"{name} must be an integer >= {low}{' or None' if none else ''}, got {value!r}")
    if int(value) < low:
        raise BadOption(f"{name} must be >= {low}, got {value}")
    return int(value)


@dataclass(frozen=True)
class Sampling:
    """Who records, and how much.

    ``ctas``: how many CTAs record (None: every CTA of the launch that the stride selects; where
    the grid is unknown when the buffer is made, ``fa4trace.instrument``, the first
    ``UNKNOWN_GRID_CTAS``), taken from ``cta_first`` every ``cta_stride``-th, in cluster order
    (a sampled CTA brings its cluster: ``fa4trace.format.layout``). ``warps``: the warp indices
    in each CTA that record (None: every warp). ``capacity``: records per warp slot (None: what
    the recording sizes for its kernel, else ``DEFAULT_CAPACITY``)."""

    ctas: Optional[int] = None
    cta_first: int = 0
    cta_stride: int = 1
    warps: Optional[tuple] = None
    capacity: Optional[int] = None

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "ctas", count("ctas", self.ctas, 1, none=True))
        set_(self, "cta_first", count("cta_first", self.cta_first, 0))
        set_(self, "cta_stride", count("cta_stride", self.cta_stride, 1))
        set_(self, "capacity", count("capacity", self.capacity, 1, none=True))
        if self.warps is not None:
            if isinstance(self.warps, (str, bytes)) or not hasattr(self.warps, "__iter__"):
                raise BadOption(f"warps must be warp indices 0..{MAX_CTA_WARPS - 1}, got {self.warps!r}")
            ws = list(self.warps)
            if not ws or any(isinstance(w, bool) or not hasattr(w, "__index__") or not 0 <= int(w) < MAX_CTA_WARPS
                             for w in ws):
                raise BadOption(f"warps must be warp indices 0..{MAX_CTA_WARPS - 1}, got {ws}")
            set_(self, "warps", tuple(sorted({int(w) for w in ws})))

    def spec(self, warps_per_cta: int, *, grid_ctas: Optional[int] = None,
             capacity: Optional[int] = None) -> BufferSpec:
        """The buffer spec of a launch of ``warps_per_cta`` warps per CTA: for its grid of
        ``grid_ctas`` CTAs where known, else for ``ctas`` (or ``UNKNOWN_GRID_CTAS``) CTAs from
        ``cta_first``. ``capacity``: the recording's own size for its kernel's slots, where this
        sampling names none."""
        cap = self.capacity or capacity or DEFAULT_CAPACITY
        if grid_ctas is None:
            grid_ctas = self.cta_first + (self.ctas or UNKNOWN_GRID_CTAS) * self.cta_stride
        return BufferSpec.for_grid(grid_ctas, warps_per_cta, cap, cta_first=self.cta_first,
                                   cta_stride=self.cta_stride, max_ctas=self.ctas, warps=self.warps)


def _span_entry(label, spec) -> tuple:
    """One ``spans`` entry, checked for its form only (fa4trace.auto.families imports the target):
    a label and "module:Class.method", (owner, name), or {"target": ..., "payload": "argument"}."""
    if not isinstance(label, str) or not label:
        raise BadOption(f"spans: a span's name must be a non-empty string, got {label!r}")
    if isinstance(spec, dict):
        if "target" not in spec or set(spec) - {"target", "payload"}:
            raise BadOption(f"span {label!r}: a dict takes 'target' and optionally 'payload', got {sorted(spec)}")
        if spec.get("payload") is not None and not isinstance(spec["payload"], str):
            raise BadOption(f"span {label!r}: 'payload' names an argument of the function, got {spec['payload']!r}")
        target = spec["target"]
    else:
        target = spec
    if isinstance(target, str):
        if ":" not in target:
            raise BadOption(f"span {label!r}: a target is 'module:Class.method' or 'module:function', got {target!r}")
    elif not (isinstance(target, tuple) and len(target) == 2 and isinstance(target[1], str)):
        raise BadOption(f"span {label!r}: a target is 'module:Class.method', 'module:function' or (owner, name), "
                        f"got {target!r}")
    return (label, target, spec.get("payload") if isinstance(spec, dict) else None)


@dataclass(frozen=True)
class Placement:
    """How the recorder is placed in a kernel fa4trace compiles (``fa4trace.instrument``, the
    FA4 adapter) and what it records there.

    ``families``: which automatic event families to record (fewer cost less; warp lifetimes
    always record). ``spans``: {"name": "module:Class.method"} or {"name": {"target": ...,
    "payload": "argument"}}: each call of those functions becomes a span, and with a payload
    that integer argument its iteration (kept as (name, target, payload or None) triples;
    ``span_map()`` gives the dict). ``cursor``: where each warp keeps its
    record count between events, "smem" (128 B of static shared memory), "gmem" (its warp
    header: no shared memory, an L2 round trip per event) or "ring" (the "smem" cursor, and each
    warp keeps its last ``ring`` records, a power of two, in shared memory, copied out when it
    exits). ``l2``: the record stores' L2 policy (``L2_POLICIES``). ``split``: CTAs that do not
    record run a copy of the kernel body without instrumentation. ``cta_lifetimes``: every CTA
    stamps its start and end into the buffer's lifetime region (fa4trace.analysis.fidelity)."""

    families: tuple = FAMILIES
    spans: tuple = ()
    cursor: str = "smem"
    ring: int = DEFAULT_RING
    l2: str = "first"
    split: bool = True
    cta_lifetimes: bool = True

    def __post_init__(self):
        set_ = object.__setattr__
        if isinstance(self.families, str) or not hasattr(self.families, "__iter__"):
            raise BadOption(f"families must be names from {', '.join(FAMILIES)}, got {self.families!r}")
        fams = tuple(dict.fromkeys(str(f) for f in self.families))
        unknown = [f for f in fams if f not in FAMILIES]
        if unknown:
            raise BadOption(f"unknown event families {unknown}; families are {list(FAMILIES)}")
        set_(self, "families", fams)
        if isinstance(self.spans, dict):
            entries = tuple(_span_entry(label, spec) for label, spec in self.spans.items())
        elif isinstance(self.spans, tuple) and all(isinstance(e, tuple) and len(e) == 3 for e in self.spans):
            entries = tuple(_span_entry(label, {"target": t, "payload": p}) for label, t, p in self.spans)
        elif not self.spans:
            entries = ()
        else:
            raise BadOption(f"spans must be a dict {{name: target}}, got {self.spans!r}")
        set_(self, "spans", entries)
        if self.cursor not in CURSORS:
            raise BadOption(f"cursor must be one of {', '.join(repr(c) for c in CURSORS)}, got {self.cursor!r}")
        try:
            set_(self, "ring", check_ring(self.ring))
        except ValueError as exc:
            raise BadOption(str(exc)) from None
        if self.l2 not in L2_POLICIES:
            raise BadOption(f"l2 must be one of {', '.join(repr(p) for p in L2_POLICIES)}, got {self.l2!r}")
        for name in ("split", "cta_lifetimes"):
            if not isinstance(getattr(self, name), bool):
                raise BadOption(f"{name} must be True or False, got {getattr(self, name)!r}")

    def span_map(self) -> dict:
        """The spans as ``instrument(spans=)`` takes them: {name: target, or {"target", "payload"}}."""
        return {label: (target if payload is None else {"target": target, "payload": payload})
                for label, target, payload in self.spans}


def options(cls, given, where: str, keyword: Optional[str] = None, **fields_):
    """The ``cls`` object an entry point works with: ``given`` (an object the caller made, passed
    as ``keyword``: default the class name in lower case), or one made of the ``fields_`` the
    caller passed as keywords (None: not passed, the field's default). Both at once is one
    BadOption line, naming ``where``."""
    keyword = keyword or cls.__name__.lower()
    passed = {k: v for k, v in fields_.items() if v is not None}
    unknown = set(passed) - {f.name for f in fields(cls)}
    if unknown:  # a caller's mistake, not the user's
        raise TypeError(f"{cls.__name__} has no field {', '.join(sorted(unknown))}")
    if given is None:
        return cls(**passed)
    if not isinstance(given, cls):
        raise BadOption(f"{where}: {keyword}= takes a {cls.__name__}, got {type(given).__name__}")
    if passed:
        raise BadOption(f"{where}: give {keyword}= or {', '.join(f'{k}=' for k in passed)}, not both")
    return given
