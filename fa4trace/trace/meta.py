"""A bundle's metadata, typed: ``BundleMeta`` and its parts (``GpuMeta``, ``LaunchMeta``,
``InstrumentMeta``, ``TimingMeta``, ``CtaLifetimes``).

A bundle stores its metadata as one JSON object (``fa4trace.trace.bundle``: ``Trace.meta``, the
dict as stored); ``Trace.info`` reads it as a ``BundleMeta``, whose attributes are the keys
fa4trace writes and reads, so that a reader names ``trace.info.gpu.name`` or
``trace.info.launches[0].clock_ghz_median`` instead of spelling a key. Every key is optional
(bundles of older fa4trace lack the newer ones): a key the bundle lacks reads as its field's
default (None unless said), and nothing is converted, so a reader sees the value as stored.

``from_meta(dict)`` / ``to_meta()`` go both ways: keys this fa4trace does not know (a bundle
written by a newer one) are kept in ``extra`` and written back; a key that was stored is
written back even where it holds the default, and a part stored as something other than an
object (never written by fa4trace) is kept as it was. So ``BundleMeta.from_meta(m).to_meta() ==
m`` for any metadata ``m``, and a bundle read and saved again keeps every key.

The objects are frozen: to change a bundle's metadata, change ``Trace.meta``, or make a new
object with ``updated(**changes)`` and store its ``to_meta()``.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, ClassVar, Optional


def _stored(name: str, default: Any = None, **kw):
    """A field stored under ``name`` (a key that is no Python name, "pass")."""
    return field(default=default, metadata={"key": name}, **kw)


@dataclass(frozen=True, kw_only=True)
class MetaPart:
    """What every part shares: its keys as fields, ``extra`` (the keys this fa4trace does not
    know, as stored) and ``present`` (the fields the stored object had)."""

    extra: dict = field(default_factory=dict)
    present: frozenset = field(default=frozenset(), repr=False, compare=False)

    NESTED: ClassVar[dict] = {}  # field -> the part a stored object of it reads as
    LISTS: ClassVar[dict] = {}  # field -> the part each stored object of its list reads as

    @classmethod
    def _keys(cls) -> dict:
        """Stored key -> field, for the fields of the format (not ``extra`` / ``present``)."""
        return {f.metadata.get("key", f.name): f for f in fields(cls) if f.name not in ("extra", "present")}

    @classmethod
    def from_meta(cls, stored) -> "MetaPart":
        """The part a stored JSON object reads as (anything but an object reads as the defaults)."""
        stored = stored if isinstance(stored, dict) else {}
        keys = cls._keys()
        kw, present, extra = {}, set(), {}
        for k, v in stored.items():
            f = keys.get(k)
            if f is None:
                extra[k] = v
                continue
            part, items = cls.NESTED.get(f.name), cls.LISTS.get(f.name)
            # a part stored as something else than fa4trace writes (None where the field's
            # default is a part or a list) is kept as stored, in extra, and reads as the default
            if part is not None and not (v is None and f.default is None):
                if not isinstance(v, dict):
                    extra[k] = v
                    continue
                v = part.from_meta(v)
            elif items is not None:
                if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
                    extra[k] = v
                    continue
                v = tuple(items.from_meta(x) for x in v)
            kw[f.name] = v
            present.add(f.name)
        return cls(**kw, extra=extra, present=frozenset(present))

    def updated(self, **changes) -> "MetaPart":
        """A copy with ``changes`` made (each stored, even where it holds its default)."""
        return replace(self, **changes, present=self.present | set(changes))

    def has(self, name: str) -> bool:
        """Whether the stored object had field ``name``'s key (a stored None included)."""
        return name in self.present

    def to_meta(self) -> dict:
        """The JSON object this part is stored as."""
        out = dict(self.extra)
        for k, f in self._keys().items():
            v = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            if f.name not in self.present and v == default:
                continue
            if isinstance(v, MetaPart):
                v = v.to_meta()
            elif f.name in self.LISTS and isinstance(v, (list, tuple)):
                v = [x.to_meta() if isinstance(x, MetaPart) else x for x in v]
            out[k] = v
        return out


@dataclass(frozen=True, kw_only=True)
class GpuMeta(MetaPart):
    """The GPU that recorded the bundle (``fa4trace.run.gpu.gpu_facts``)."""

    name: Optional[str] = None
    sm_count: Optional[int] = None
    compute_capability: Optional[str] = None
    arch: Optional[str] = None
    memory_gib: Optional[float] = None
    l2_mib: Optional[float] = None
    torch: Optional[str] = None
    cuda_runtime: Optional[str] = None
    driver: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class LaunchMeta(MetaPart):
    """One launch of the bundle (``meta["launches"][i]``): what the recording said of it
    (kernel, grid, host times, pass...) and what decoding its buffer found (records, drops,
    clock, ring...; ``fa4trace.trace.decode``)."""

    launch: Optional[int] = None
    kernel: Optional[str] = None
    grid: Optional[list] = None
    block: Optional[list] = None
    grid_ctas: Optional[int] = None
    recorded_ctas: Optional[str] = None
    cta_subset: Optional[bool] = None
    warp_subset: Optional[list] = None
    warps_per_cta: Optional[int] = None
    capacity: Optional[int] = None
    cta_first: Optional[int] = None
    cta_stride: Optional[int] = None
    ctas_recorded: Optional[int] = None
    warps_recorded: Optional[int] = None
    timebase: Optional[str] = None
    records: Optional[int] = None
    dropped: Optional[int] = None
    overflowed_warps: Optional[int] = None
    ring: Optional[int] = None
    overwritten: Optional[int] = None
    overwritten_warps: Optional[int] = None
    anchors: Optional[int] = None
    borrowed_clock_ratio_warps: Optional[int] = None
    truncated_spans: Optional[int] = None
    span_ns: Optional[int] = None
    clock_ghz_median: Optional[float] = None
    t0_offset_ns: Optional[int] = None
    ctas_timed: Optional[int] = None
    ctas_outside_lifetime: Optional[int] = None
    host_launch_ns: Optional[int] = None
    host_return_ns: Optional[int] = None
    captured: Optional[bool] = None
    captured_at_ns: Optional[int] = None
    device: Optional[int] = None
    cuda_symbols: Optional[list] = None
    call: Optional[int] = None  # which call of the kernel the launch replays (fa4trace.auto.run)
    pass_name: Optional[str] = _stored("pass")  # which recording of that call: "dense" or a lighter pass
    checked: Optional[bool] = None
    l2: Optional[str] = None  # "flushed" where L2 was flushed right before the launch (fa4trace.run.l2), or why not
    how: Optional[str] = None  # "jit" or the AOT build it was loaded from
    n_splits: Optional[int] = None
    n_comb: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class InstrumentMeta(MetaPart):
    """What ``fa4trace.instrument`` compiled into the kernel and how each call ran
    (``meta["instrument"]``; ``fa4trace.auto.compiler``, ``fa4trace.auto.run``)."""

    kernel: Optional[str] = None
    kernels: Optional[list] = None
    entry: Optional[str] = None
    build: Optional[str] = None
    arch: Optional[str] = None
    dsl: Optional[str] = None
    families: Optional[list] = None
    spans: Optional[list] = None
    found: Optional[dict] = None
    missing: Optional[list] = None
    spans_missing: Optional[list] = None
    placed: Optional[dict] = None
    pipelines: Optional[dict] = None
    roles: Optional[dict] = None
    params: Optional[list] = None
    warps_per_cta: Optional[int] = None
    cursor: Optional[str] = None
    cursor_reason: Optional[str] = None
    ring: Optional[int] = None
    ring_cta_warps: Optional[int] = None
    ring_smem_bytes: Optional[int] = None
    l2: Optional[str] = None
    split: Optional[bool] = None
    split_refused: Optional[str] = None
    cta_lifetimes: Optional[bool] = None
    cta_dependencies: Optional[dict] = None
    cuda_symbols: Optional[list] = None
    checked: Optional[list] = None
    nondeterministic: Optional[list] = None
    plain_twin: Any = None  # one entry per launch (a list); older bundles: one {"plain_ns", "traced_ns"}
    passes: Optional[list] = None
    passes_skipped: Optional[dict] = None


@dataclass(frozen=True, kw_only=True)
class TimingMeta(MetaPart):
    """The kernel's own times, in µs, where the recording timed it (``meta["timing"]``):
    untraced (``kernel_us``) and traced (``traced_us``) on the recorded inputs, and as
    ``fa4trace bench`` times it (``bench_us``, cold L2)."""

    kernel_us: Optional[float] = None
    traced_us: Optional[float] = None
    bench_us: Optional[float] = None
    method: Optional[str] = None
    bench_method: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class CtaLifetimes(MetaPart):
    """The bundle's timed CTAs as columns of equal length (``meta["cta_lifetimes"]``; module doc
    of ``fa4trace.trace.bundle``): launch, CTA, start and end (ns on the events' time axis) and
    whether the CTA recorded (0/1)."""

    COLUMNS: ClassVar[tuple] = ("launch", "cta", "start_ns", "end_ns", "recorded")

    launch: Optional[list] = None
    cta: Optional[list] = None
    start_ns: Optional[list] = None
    end_ns: Optional[list] = None
    recorded: Optional[list] = None

    @property
    def complete(self) -> bool:
        """Every column is there, as a list of as many rows as the others, and there are rows."""
        cols = [getattr(self, c) for c in self.COLUMNS]
        return all(isinstance(c, list) for c in cols) and len({len(c) for c in cols}) == 1 and bool(cols[0])


@dataclass(frozen=True, kw_only=True)
class BundleMeta(MetaPart):
    """A bundle's metadata (module doc). ``config``: what the kernel ran (its shape, schedule,
    tiles; the kernel's own keys); ``cta_lifetimes``: the CTA-lifetime columns
    (``fa4trace.trace.bundle``); ``vocabulary``: the event vocabulary it was decoded with."""

    format: Optional[str] = None
    bundle_version: Optional[int] = None
    fa4trace_version: Optional[str] = None
    recorded_at: Optional[str] = None
    kernel: Optional[str] = None
    config: dict = field(default_factory=dict)
    gpu: GpuMeta = field(default_factory=GpuMeta)
    launches: tuple = ()
    instrument: Optional[InstrumentMeta] = None
    timing: Optional[TimingMeta] = None
    t0_globaltimer_ns: Optional[int] = None
    total_dropped: Optional[int] = None
    total_overwritten: Optional[int] = None
    cta_subset: Optional[bool] = None
    warp_subset: Optional[list] = None
    # the launches' shape where they do not say it themselves (synthetic bundles say it here)
    grid: Optional[list] = None
    block: Optional[list] = None
    warps_per_cta: Optional[int] = None
    cuda_symbols: Optional[list] = None
    synthetic: bool = False
    vocabulary: Optional[dict] = None
    cta_lifetimes: Optional[CtaLifetimes] = None
    clock: Optional[dict] = None
    notes: Optional[str] = None
    calibration: Optional[dict] = None  # the calibration kernel's timer checks
    check: Optional[dict] = None  # a recording's output check (FA4: traced == untraced)
    fa4: Optional[dict] = None  # FlashAttention-4's version, path and build
    distributed: Optional[dict] = None  # which rank recorded it (fa4trace.trace.ranks)
    recorder_cost: Optional[dict] = None  # the calibration its figures are compensated with
    launch_of: Optional[dict] = None  # one launch cut out of a bundle (fa4trace.analysis.launches)
    role_assignment: Optional[dict] = None  # the roles an analysis gave the warps

    NESTED: ClassVar[dict] = {"gpu": GpuMeta, "instrument": InstrumentMeta, "timing": TimingMeta,
                              "cta_lifetimes": CtaLifetimes}
    LISTS: ClassVar[dict] = {"launches": LaunchMeta}

    @property
    def kernel_name(self) -> Optional[str]:
        """The kernel's name: the instrumented entry's where fa4trace.instrument compiled it
        (``instrument.kernel``), else the bundle's ``kernel``."""
        return (self.instrument.kernel if self.instrument is not None else None) or self.kernel
