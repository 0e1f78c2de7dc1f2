"""Compile upstream FA4's forward kernel with fa4trace markers (or without), here or for AOT.

FA4's own ``interface._flash_attn_fwd`` chooses the kernel and its configuration (tile sizes,
pack-GQA, S/P ping-pong...) and ends in ``cute.compile(kernel_object, *args)``. We run it in
``FakeTensorMode`` with that one call intercepted (``capture``), which hands us FA4's exact
kernel object and arguments. A traced build is then fa4trace.auto's ``compile_traced`` of that
object, as for any CuTe DSL kernel: the buffer becomes one more kernel argument (placed before
FA4's ``stream``, which FA4 keeps last), every warp records its lifetime, the generic event
families asked for are placed, and FA4's own hooks (fa4trace.fa4.hooks: roles, Q/K/V loads,
QK/PV, softmax, correction) name what only FA4 knows. One compile serves every buffer; AOT
works; callers of FA4's API never see the buffer. Plain builds go through FA4's ``__call__``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from ..auto.patches import Patches
from ..format.errors import BadOption, Fa4traceError
from ..format.options import Placement
from . import hooks

FA4_VERSIONS = ("4.0.0b36",)
SM_COUNT = {"sm100": 148, "sm90": 132}  # B200, H100/H200: the SKUs FA4's scheduler is built for
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def fa4_version() -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version("flash-attn-4")
    except metadata.PackageNotFoundError:
        return None


def require_fa4() -> str:
    """The installed flash-attn-4 version, or one clear line on why it cannot be used."""
    v = fa4_version()
    if v is None:
        raise Fa4traceError(f"tracing FlashAttention-4 needs flash-attn-4 {' or '.join(FA4_VERSIONS)}: "
                            f"pip install 'flash-attn-4=={FA4_VERSIONS[-1]}' --no-deps (see docs/fa4-on-b200.md)")
    if v not in FA4_VERSIONS:
        raise Fa4traceError(f"flash-attn-4 {v} is not supported by fa4trace's FA4 adapter (hooks are pinned to "
                            f"{', '.join(FA4_VERSIONS)}): pip install 'flash-attn-4=={FA4_VERSIONS[-1]}' --no-deps")
    return v


# ---- target selection -----------------------------------------------------------------------
class _HardwareInfoStandIn:
    """``cutlass.utils.HardwareInfo`` without a driver: the target SKU's SM count."""

    sm_count = 132

    def __init__(self, device_id: int = 0):
        pass

    def get_device_multiprocessor_count(self) -> int:
        return self.sm_count

    def get_max_active_clusters(self, cluster_size: int) -> int:
        return self.sm_count // cluster_size


def _cuda_visible() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _visible_sm_count() -> Optional[int]:
    if not _cuda_visible():
        return None
    import torch

    return int(torch.cuda.get_device_properties(0).multi_processor_count)


@contextlib.contextmanager
def target(arch: str, num_sms: Optional[int] = None):
    """Compile for ``arch`` ("sm100" or "sm90"). Where no GPU is visible, FA4's SM-count queries
    get the target SKU's count (148 on B200, 132 on H100/H200) instead of a driver call."""
    if arch not in SM_COUNT:
        raise ValueError(f"arch must be one of {sorted(SM_COUNT)}, got {arch!r}")
    want = "sm_100a" if arch == "sm100" else "sm_90a"
    have = os.environ.get("CUTE_DSL_ARCH")
    import sys

    if have and have != want and "cutlass" in sys.modules:
        raise Fa4traceError(f"the CuTe DSL in this process targets {have}; compile {arch} in a fresh process "
                            f"(CUTE_DSL_ARCH={want})")
    os.environ["CUTE_DSL_ARCH"] = want
    n = num_sms or _visible_sm_count() or SM_COUNT[arch]
    patches = Patches()
    patches.set_env("FLASH_ATTENTION_NUM_SMS", str(n))
    if not _cuda_visible():
        import cutlass.utils  # after CUTE_DSL_ARCH is set: the DSL reads it once
        import flash_attn.cute.tile_scheduler as ts

        stand_in = type("HardwareInfo", (_HardwareInfoStandIn,), {"sm_count": n})
        for owner in (cutlass.utils, ts):
            patches.set(owner, "HardwareInfo", stand_in)
    try:
        yield
    finally:
        patches.restore()


# ---- capturing FA4's compile ----------------------------------------------------------------
@dataclass
class Captured:
    """FA4's kernel object and compile arguments for one configuration."""

    kernel: Any
    args: tuple  # positional compile arguments after the kernel object (stream last)
    options: str
    config: dict = field(default_factory=dict)


class _Capture(Exception):
    pass


class _CuteProxy:
    def __init__(self, real, sink):
        self._real, self._sink = real, sink

    def __getattr__(self, name):
        return getattr(self._real, name)

    def compile(self, fn, *args, **kwargs):
        self._sink.append((fn, args, kwargs))
        raise _Capture()


def capture(arch: str, *, schedule: str, d: int, hq: int, hkv: int, sq: int = 1, sk: int, b: int = 1,
            dtype: str = "bf16", num_splits: int = 1, causal: bool = False) -> Captured:
    """Run FA4's interface on fake tensors and stop at its ``cute.compile`` call."""
    version = require_fa4()
    if schedule not in ("base", "pingpong"):
        raise ValueError(f"schedule must be base or pingpong, got {schedule!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from flash_attn.cute import interface
    from flash_attn.cute import utils as fa_utils

    tdt = getattr(torch, DTYPES[dtype])
    sink: list = []
    real_cute = interface.cute
    saved_pp = fa_utils._fa_disable_s_ping_pong_enabled
    interface.cute = _CuteProxy(real_cute, sink)
    fa_utils._fa_disable_s_ping_pong_enabled = schedule == "base"
    hooks.clear_fa4_compile_cache()
    try:
        with FakeTensorMode():
            q = torch.empty(b, sq, hq, d, dtype=tdt, device="cuda")
            k = torch.empty(b, sk, hkv, d, dtype=tdt, device="cuda")
            v = torch.empty(b, sk, hkv, d, dtype=tdt, device="cuda")
            try:
                interface._flash_attn_fwd(q, k, v, num_splits=num_splits, causal=causal,
                                          _arch=100 if arch == "sm100" else 90)
            except _Capture:
                pass
    finally:
        interface.cute = real_cute
        fa_utils._fa_disable_s_ping_pong_enabled = saved_pp
    if not sink:
        raise Fa4traceError("FA4 did not reach its compile step for this shape (nothing to instrument)")
    fn, args, kwargs = sink[-1]
    kobj = fn
    pingpong = bool(getattr(kobj, "use_s_ping_pong", False))
    if arch == "sm100" and (schedule == "pingpong") != pingpong:
        raise Fa4traceError(f"FA4 {version} does not use the S/P ping-pong for this shape "
                            f"(d={d}, hq={hq}, hkv={hkv}, sq={sq}); --schedule {schedule} cannot be honored")
    config = {
        "impl": "fa4", "fa4_version": version, "arch": arch, "schedule": schedule if arch == "sm100" else "fa3",
        "kernel_class": type(kobj).__name__, "d": d, "hq": hq, "hkv": hkv, "sq": sq, "dtype": dtype,
        "s_ping_pong": pingpong, "causal": bool(causal),
        "intra_wg_overlap": bool(getattr(kobj, "intra_wg_overlap", False)),
        "tile": [int(x) for x in _tile(kobj)],
        "pack_gqa": bool(getattr(kobj, "pack_gqa", False)),
        "warps_per_cta": int(getattr(kobj, "threads_per_cta", None) or kobj.num_threads) // 32,
    }
    return Captured(kobj, tuple(args), kwargs.get("options", ""), config)


def default_cursor(arch: str, d: int) -> str:
    """Where warps keep their event cursor by default (``Placement.cursor``).

    SM90: shared memory (128 B, 1 KB with the alignment of FA4's dynamic region): cheaper than
    the cursor in global memory on the H200 (d128 decode; BENCHMARKS.md), outputs bitwise equal
    either way. Head dims above
    128 take more of the shared memory, so they keep the global cursor. SM100: global memory,
    since FA4 fills ~224 KB of shared memory there and no B200 was at hand to check more.
    """
    return "smem" if arch == "sm90" and d <= 128 else "gmem"


def placement_for(arch: str, d: int, *, families=(), cursor: Optional[str] = None) -> Placement:
    """How a traced FA4 build places the recorder unless told: FA4's own events plus the generic
    ``families`` asked for (default none), the cursor ``default_cursor`` picks, records kept in
    L2 (evict_last: decode streams its KV once), and on SM90 CTAs the buffer does not select
    running FA4's body untouched (``split``; SM100: FA4's tcgen05 helpers declare PTX registers
    by name, which a second copy of the body would redeclare)."""
    return Placement(families=tuple(families), cursor=cursor or default_cursor(arch, d), l2="last",
                     split=arch == "sm90")


def _tile(kobj):
    if hasattr(kobj, "m_block_size"):
        return kobj.m_block_size, kobj.n_block_size
    return kobj.tile_m, kobj.tile_n


@dataclass
class Compiled:
    fn: Any  # the compiled function (JitCompiledFunction; tvm-ffi callable, export_to_c)
    traced: bool
    config: dict
    params: list  # runtime parameters in order (FA4's __call__ names, fa4trace_buf if traced)
    counts: dict = field(default_factory=dict)  # events placed per role while tracing

    @property
    def ptx(self) -> Optional[str]:
        return self.fn.__ptx__


def compile_fa4(arch: str, *, schedule: str = "pingpong", d: int = 128, hq: int = 16, hkv: int = 1,
                sq: int = 1, sk: int = 32768, b: int = 1, dtype: str = "bf16", traced: bool = True,
                events=None, placement: Optional[Placement] = None, families=None, cursor: Optional[str] = None,
                variant: str = "default", keep_ptx: bool = False, num_sms: Optional[int] = None) -> Compiled:
    """Compile FA4's forward kernel for this decode shape, with markers (``traced``) or as FA4
    itself compiles it. Shapes other than d/hq/hkv/sq/dtype are dynamic in the result.

    ``events``: which roles' event hooks record (default all; see hooks.SM100_ROLES/SM90_ROLES).
    ``placement``: how the recorder is placed (default ``placement_for``), or its ``families``
    (fa4trace.format.options.FAMILIES: FA4's pipeline waits, TMA copies, wgmma waits, named
    barriers, recorded besides FA4's own events; default none) and ``cursor`` ("gmem", "smem"
    or "ring"; default ``default_cursor``) as keywords. ``variant``: a name for builds that
    differ only in these (stored in the config; loaders pick "default").
    """
    if placement is not None and (families is not None or cursor is not None):
        raise BadOption("compile_fa4: give placement= or families=/cursor=, not both")
    placement = placement or placement_for(arch, d, families=families or (), cursor=cursor)
    with target(arch, num_sms), warnings.catch_warnings():
        # FA4's forward takes an ``aux_data`` (its AuxData) the DSL cannot turn into a JIT argument:
        # the DSL warns on every compile and keeps it as a compile-time value, as FA4 means it. Not
        # the fa4trace user's concern: this one warning is quiet here, nothing else is filtered.
        warnings.filterwarnings("ignore", message=r"Argument aux_data \(position \d+\) cannot be converted",
                                category=UserWarning)
        import cutlass.cute as cute

        cap = capture(arch, schedule=schedule, d=d, hq=hq, hkv=hkv, sq=sq, sk=sk, b=b, dtype=dtype)
        cls = type(cap.kernel)
        options = cap.options + (" --keep-ptx" if keep_ptx else "")
        names = [p.name for p in inspect.signature(cls.__call__.__wrapped__).parameters.values()][1:]
        if not traced:
            hooks.clear_fa4_compile_cache()
            fn = cute.compile(cap.kernel, *cap.args, options=options)
            return Compiled(fn, False, dict(cap.config, traced=False, variant="default"), names[:-1])
        from ..auto.compiler import compile_traced

        if names[-1] != "stream":
            raise Fa4traceError(f"{cls.__name__}.__call__ no longer ends with `stream`: FA4 changed, update fa4trace.fa4")
        ev = hooks.check_events(arch, events)
        try:
            c = compile_traced(cap.kernel, *cap.args, placement=placement, check=False, buffer_before="stream",
                               hooks=lambda patches: hooks.place(patches, arch, ev), options=options)
        finally:
            hooks.clear_fa4_compile_cache()
        cfg = dict(cap.config, traced=True, variant=variant, cursor=placement.cursor, events=sorted(ev),
                   families=sorted(placement.families))
        if placement.families:  # the generic events' names travel with the build, for the decoder
            cfg.update(vocab=c.vocab.to_json(), found=c.info.found, missing=c.info.missing)
        return Compiled(c.fn, True, cfg, c.params, dict(hooks.STATE.counts))
