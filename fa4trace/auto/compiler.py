"""Compile any CuTe DSL kernel with automatic events (needs nvidia-cutlass-dsl, no GPU).

``compile_traced(fn, *args)`` is ``cute.compile(fn, *args)`` with fa4trace in it: the hooks of
the chosen families are placed (``families.install``), every ``@cute.kernel`` the entry
launches takes the trace buffer as one more argument (``entry.traced_kernel``), the entry
takes it last (``entry.traced_entry``), and everything is put back once the DSL has traced.
The result knows its event vocabulary, its warps per CTA (from the launch) and which families
it found, so a buffer it fills decodes into a bundle on any machine.
"""

from __future__ import annotations

import inspect
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Optional

from ..format import layout as L
from ..format.errors import Fa4traceError
from ..format.options import Placement, options
from ..trace.meta import InstrumentMeta
from . import entry as E
from . import families as F
from .ctadeps import dependencies_of, keep_ptx
from .events import FAMILIES, EventTable
from .patches import Patches
from .state import STATE

COMPILE_CONTROLS = ("options", "is_experimental", "trace_finalize_hooks")
SUPPORTED_DSL = ("4.8",)  # nvidia-cutlass-dsl versions the hooks were written against


@dataclass
class CompiledTraced:
    """A traced compile: ``fn`` takes the entry's runtime arguments plus the trace buffer
    (last); ``meta`` says what was instrumented (fa4trace.auto.run uses it)."""

    fn: Any
    params: list  # the runtime parameter names (env streams left out), then fa4trace_buf
    vocab: Any
    meta: dict = field(default_factory=dict)
    plain: Any = None  # the same entry compiled without fa4trace (for the output check)

    @property
    def ptx(self) -> Optional[str]:
        return getattr(self.fn, "__ptx__", None)

    @property
    def info(self) -> InstrumentMeta:
        """``meta`` (the bundle's ``instrument`` to be) as typed fields."""
        return InstrumentMeta.from_meta(self.meta)


def dsl_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("nvidia-cutlass-dsl")
    except metadata.PackageNotFoundError:
        return "not installed"


def require_dsl() -> str:
    v = dsl_version()
    if not any(v.startswith(s) for s in SUPPORTED_DSL):
        raise Fa4traceError(f"fa4trace.instrument supports nvidia-cutlass-dsl {', '.join(s + '.x' for s in SUPPORTED_DSL)}; "
                            f"this environment has {v}")
    return v


def _kernels_of_class(cls) -> list[tuple[Any, str, Any, bool]]:
    out, seen = [], set()
    for c in cls.__mro__:
        for name, attr in vars(c).items():
            if name not in seen and E.is_kernel(attr) and not getattr(attr, "__fa4trace_hook__", False):
                out.append((c, name, attr, True))
                seen.add(name)
    return out


def _kernels_of_function(fn) -> list[tuple[Any, str, Any, bool]]:
    raw = getattr(fn, "__wrapped__", fn)
    mod = sys.modules.get(raw.__module__)
    return [(mod, raw.__name__, fn, False)] if mod is not None and vars(mod).get(raw.__name__) is fn else []


def find_kernels(fn, extra=()) -> list[tuple[Any, str, Any, bool]]:
    """(owner, attribute, kernel, is_method) of every kernel to give the buffer to: the kernels
    of the entry's class, the kernels in the entry's module, and ``extra`` (classes or kernels)."""
    found = []
    if E.is_jit(getattr(type(fn), "__call__", None)) and not E.is_jit(fn):
        found += _kernels_of_class(type(fn))
    else:
        raw = getattr(fn, "__wrapped__", fn)
        mod = sys.modules.get(raw.__module__)
        for name, v in vars(mod).items() if mod else ():
            if E.is_kernel(v):
                found.append((mod, name, v, False))
        for cell in raw.__closure__ or ():  # kernels the entry closes over (defined in a function)
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            if E.is_kernel(v):
                found.append((cell, "cell_contents", v, False))
    for x in extra:
        if isinstance(x, type):
            found += _kernels_of_class(x)
        elif E.is_kernel(x):
            if not any(k[2] is x for k in found):
                mine = _kernels_of_function(x)
                if not mine:
                    raise Fa4traceError(f"kernel {getattr(x, '__qualname__', x)} is neither module-level nor closed "
                                        "over by the compiled entry: fa4trace cannot reach it")
                found += mine
        else:
            raise Fa4traceError(f"kernels= takes classes with @cute.kernel methods or @cute.kernel functions, got {x!r}")
    uniq, seen = [], set()
    for k in found:
        if (id(k[0]), k[1]) not in seen:
            uniq.append(k)
            seen.add((id(k[0]), k[1]))
    return uniq


def _entry_of(fn):
    """(entry jit function, bound object or None)."""
    if E.is_jit(fn):
        return fn, None
    call = getattr(type(fn), "__call__", None)
    if E.is_jit(call):
        return call, fn
    raise Fa4traceError(f"fa4trace.instrument compiles a @cute.jit function or an object whose __call__ is "
                        f"@cute.jit; got {type(fn).__name__}")


def _split_kwargs(kwargs: dict) -> tuple[dict, dict]:
    ctl = {k: v for k, v in kwargs.items() if k in COMPILE_CONTROLS}
    return ctl, {k: v for k, v in kwargs.items() if k not in COMPILE_CONTROLS}


def _block_warps(launches: list[dict]) -> Optional[int]:
    for kw in launches:
        block = kw.get("block")
        try:
            n = 1
            for b in block:
                n *= int(b)
            return (n + 31) // 32
        except (TypeError, ValueError):
            continue
    return None


# errors a second copy of a kernel's body can cause (ptxas, IR verification) and what they mean
# (fa4trace.auto.split)
SPLIT_REFUSALS = {
    "Duplicate definition": "the kernel's inline PTX declares names that a second copy of its body would redeclare",
    "does not dominate": "the kernel's body keeps traced state outside its arguments and its object "
                         "(a global, a class attribute), which both copies of the body would share",
}


def compile_traced(fn, *args, placement: Optional[Placement] = None, kernels=(), check: bool = True,
                   compile_fn=None, hooks=None, buffer_before: Optional[str] = None, families=None, spans=None,
                   cursor: Optional[str] = None, l2: Optional[str] = None, split: Optional[bool] = None,
                   ring: Optional[int] = None, cta_lifetimes: Optional[bool] = None, **kwargs) -> CompiledTraced:
    """``cute.compile(fn, *args, **kwargs)`` with automatic events, placed as ``placement`` says
    (``fa4trace.format.options.Placement``: its defaults unless given, or made of the
    ``families`` / ``spans`` / ``cursor`` / ``l2`` / ``split`` / ``ring`` / ``cta_lifetimes``
    keywords).

    ``kernels``: more classes / kernels to instrument than the entry's own. The placement's
    ``cursor``: where each warp keeps its record count between events: "smem" (default; 128 B
    of static shared memory, read back in tens of cycles) or "gmem" (the warp's header: no
    shared memory, for a kernel that uses all of it, but an L2 round trip per event; see
    docs/tracing-cost.md), or "ring": the "smem" cursor, and each record one shared-memory
    store into the warp's ring of ``ring`` records (a power of two, default 128: 1 KB a warp,
    for the CTA's warp count when its block size is a constant, else for 32 warps), copied
    into the trace buffer when the warp exits; a warp then keeps its last ``ring`` records,
    and the bundle says how many older ones the ring overwrote (``SegmentRecorder``). ``l2``:
    the record stores' L2 policy, "first" (default: records leave L2 before the kernel's
    reused data) or "last" (records stay in L2; for kernels that stream their inputs once).
    ``split`` (default): the kernel holds its body twice, and CTAs the trace buffer does not
    select run the copy without instrumentation (``fa4trace.auto.split``); False: one
    instrumented body for every CTA (half the compile). ``cta_lifetimes`` (default): every
    CTA, recording or not, stamps its start and end into the buffer's CTA-lifetime region (two
    timer reads and two reductions per warp, outside the body), which lets each bundle say how
    much slower its recorded CTAs ran (fa4trace.analysis.fidelity). ``check``: also compile
    the plain kernel, for the output check.

    For adapters of one kernel (fa4trace.fa4): ``hooks(patches)`` places the kernel's own hooks
    after the families' (so they wrap them; ``patches`` puts everything back), and
    ``buffer_before`` names the entry parameter the buffer goes in front of (FA4 keeps its
    stream last).
    """
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    from ..device.segment import SegmentRecorder

    require_dsl()
    placement = options(Placement, placement, "compile_traced", families=families, spans=spans, cursor=cursor,
                        l2=l2, split=split, ring=ring, cta_lifetimes=cta_lifetimes)
    families, spans, cursor, ring = placement.families, placement.span_map(), placement.cursor, placement.ring
    compile_fn = compile_fn or cute.compile
    entry, obj = _entry_of(fn)
    targets = find_kernels(fn, kernels)
    if not targets:
        raise Fa4traceError(f"no @cute.kernel found for {getattr(entry, '__qualname__', entry)}: pass kernels=[...]")
    ctl, fkw = _split_kwargs(kwargs)
    raw = getattr(entry, "__wrapped__", entry)
    sig = inspect.signature(raw)
    bound = sig.bind(*((obj,) if obj is not None else ()), *args, **fkw)
    bound.apply_defaults()
    full = list(bound.arguments.values())
    # where the buffer goes among the entry's arguments: before ``buffer_before``, else last
    at = list(bound.arguments).index(buffer_before) if buffer_before else len(full)

    def attempt(split: bool):  # trace with the hooks in, compile, take the hooks out
        table = EventTable()
        ring_warps: list = []  # warps each kernel's rings were made for
        STATE.reset(table, tuple(families) + (("user",) if spans else ()))

        def on_buffer(buf):
            STATE.host_buf = buf

        def on_enter(buf):
            STATE.buf = buf
            # the launch being traced was just reported (entry._LaunchSpy): a constant block
            # sizes the ring for the CTA's warps
            warps = _block_warps(STATE.launches[-1:]) if cursor == "ring" else None
            STATE.rec = SegmentRecorder.start(buf, role=0, placement=placement, ring_warps=warps)
            if cursor == "ring":
                ring_warps.append(warps or L.MAX_CTA_WARPS)

        def on_exit():
            if STATE.rec is not None:
                STATE.rec.finish()
            STATE.rec = STATE.buf = None

        patches = Patches()
        try:
            F.install(patches, families, spans)
            if hooks is not None:
                hooks(patches)
            for owner, name, k, method in targets:
                patches.set(owner, name, E.traced_kernel(k, on_enter, on_exit, lambda: STATE.host_buf, method=method,
                                                         on_launch=STATE.launches.append, split=split,
                                                         lifetimes=placement.cta_lifetimes))
            traced = E.traced_entry(entry, on_buffer, before=buffer_before)
            buf = make_fake_compact_tensor(cutlass.Int64, (cute.sym_int(),), assumed_align=16)
            try:
                compiled = compile_fn(traced, *full[:at], buf, *full[at:], **keep_ptx(ctl, ptx_dir, compile_fn))
            except RuntimeError as exc:  # a hook placed where fa4trace cannot record (RuntimeError("fa4trace: ..."))
                msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                if not msg.startswith("fa4trace:"):
                    raise
                why = msg[len("fa4trace:"):].strip()
                if why.startswith("span "):  # the user's spans= entry, not a hook
                    raise Fa4traceError(f"{raw.__qualname__}: {why}") from None
                raise Fa4traceError(f"fa4trace cannot follow {raw.__qualname__}: {why} "
                                    f"(families {', '.join(FAMILIES)} on nvidia-cutlass-dsl {', '.join(SUPPORTED_DSL)}; "
                                    "try families= without the family named, or report the kernel)") from None
            meta = {
                "kernel": f"{raw.__module__}.{raw.__qualname__}",
                "kernels": [getattr(getattr(k, "__wrapped__", k), "__qualname__", n) for _o, n, k, _m in targets],
                "families": sorted(set(families)),
                "spans": sorted(spans or {}),
                "found": dict(STATE.found),
                "missing": sorted(set(families) - set(STATE.found)),
                "spans_missing": sorted(set(spans or {}) - {n for n in table.placed}),
                "placed": dict(table.placed),
                "pipelines": dict(table.pipelines),
                "warps_per_cta": _block_warps(STATE.launches),
                "cursor": cursor,
                **({"ring": int(ring), "ring_cta_warps": max(ring_warps, default=None),
                    "ring_smem_bytes": L.ring_smem_bytes(ring, max(ring_warps, default=L.MAX_CTA_WARPS))}
                   if cursor == "ring" else {}),
                "l2": placement.l2,
                "split": bool(split),
                "cta_lifetimes": placement.cta_lifetimes,
                "arch": _arch(),
                "dsl": dsl_version(),
            }
        finally:
            patches.restore()
            STATE.reset()
        return compiled, table, meta

    ptx_dir = tempfile.mkdtemp(prefix="fa4trace-ptx-")  # the PTX the DSL keeps is read into memory, then removed
    try:
        try:
            compiled, table, meta = attempt(placement.split)
        except Exception as exc:  # noqa: BLE001 (the DSL raises its own types; only these messages are ours to handle)
            why = next((w for key, w in SPLIT_REFUSALS.items() if key in str(exc)), None) if placement.split else None
            if why is None:
                raise
            compiled, table, meta = attempt(False)  # one instrumented body for every CTA instead
            meta["split_refused"] = why
        plain = compile_fn(fn, *args, **keep_ptx(kwargs, ptx_dir, compile_fn)) if check else None
    finally:
        shutil.rmtree(ptx_dir, ignore_errors=True)
    # whether the kernel's CTAs wait on each other (fa4trace.analysis.fidelity reads it): the
    # plain build's PTX where it was compiled, else the traced build's
    meta["cta_dependencies"] = dependencies_of(getattr(plain, "__ptx__", None), getattr(compiled, "__ptx__", None))
    # runtime parameters: the entry's with the buffer where the entry takes it, less the bound
    # object and any stream tvm-ffi takes from the environment
    params = list(bound.arguments.items())
    params.insert(at, (E.BUF, None))
    names = [n for n, v in params[1 if obj is not None else 0:] if not getattr(v, "use_tvm_ffi_env_stream", False)]
    return CompiledTraced(compiled, names, table.vocab, meta, plain)


def _arch() -> str:
    import os

    return os.environ.get("CUTE_DSL_ARCH", "")
