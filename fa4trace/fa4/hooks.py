"""Markers in upstream FlashAttention-4 without editing it: Python hooks placed at compile time.

The CuTe DSL traces Python, so replacing a method of FA4's kernel class (or a helper FA4 looks
up in a module) with a wrapper that records and then calls the original puts the markers into
the compiled kernel. Nothing of FA4 is edited or copied: ``place()`` swaps attributes into a
``Patches`` that puts the originals back once the kernel is traced, and FA4's in-memory compile
cache is cleared around it (its key ignores patches).

Where the events come from (flash-attn-4 4.0.0b36):

SM100 (B200), warp roles from ``FlashAttentionForwardSm100.kernel``:
  load warp        ``load``                LOAD_Q (``load_Q``: acquire + TMA issue, iter = Q stage),
                                           LOAD_K / LOAD_V (``load_KV``: wait for a free stage +
                                           TMA issue, iter = KV block)
  MMA warp         ``mma``                 QK / PV: S/P ping-pong path ``mma_ping_pong_qk`` /
                                           ``mma_ping_pong_pv`` (issue + commit; PV includes the
                                           wait for P; iter = FA4's block counter); base path the
                                           tcgen05 issue helpers ``gemm_ptx_precomputed_varname``
                                           (QK) / ``gemm_ptx_partial`` (PV), iter from the K/V
                                           pipeline's count (``base_mma_block``). One level only:
                                           the helpers record nothing while a ping-pong segment
                                           is open.
  softmax warps    ``softmax_loop``        SOFTMAX (``softmax_step``: wait for S, softmax, P
                                           store; iter = KV block)
  correction warps ``correction_loop``     CORRECTION (``correction_rescale``, only when a rescale
                                           happens), EPILOGUE (``correction_epilogue``)
  epilogue warp    ``epilogue_s2g``        warp lifetime only
SM90 (H100/H200):
  producer WG      ``load``                LOAD_Q (the Q TMA copy), LOAD_K / LOAD_V (``load_KV``:
                                           TMA issue + commit; the wait for a free stage is the
                                           gap before it)
  consumer WGs     ``mma``                 per KV block one segment (``first_half_block_overlap``,
                                           ``mma_one_n_block_intrawg_overlap``, ``mma_one_n_block``,
                                           ``last_half_block_overlap``): QK and PV from wgmma issue
                                           to the ``wait_group`` that retires them (async: they
                                           overlap SOFTMAX), SOFTMAX (``online_softmax``),
                                           CORRECTION (``rescale_O``); EPILOGUE (``epilogue``)

These hooks are what the generic layer (fa4trace.auto) cannot know, placed through it:
``compile_traced`` gives FA4's kernel the trace buffer, starts every warp's ``SegmentRecorder``
at kernel entry and finishes it at exit, places the generic families the caller asked for, and
calls ``place`` for these. A role hook then only writes the warp's role into its header. Every
other hooked call is one segment of that recorder, opened ``shared``: generic events inside a
KV block's call (its pipeline waits, the warp-scheduler barriers of the two consumer
warpgroups) record into it. The swaps go through fa4trace.auto's ``Patches``: methods on their
classes, and ``warpgroup.wait_group`` (called by FA4 and by quack's wgmma helpers) in every
module that holds it, over the generic mma hook when that family is on. quack's
``copy_utils.tma_get_copy_fn`` is seen through flash_fwd_sm90's reference only (a stand-in
module): FA4's epilogue stores O through the same function elsewhere. What stays here is what
only FA4 tells: its roles, which copy is Q, K or V, which wgmma is QK or PV and of which KV
block, where the softmax and the correction are.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..auto.patches import Patches
from ..format.vocab import EV, ROLE

# Role names (for ``events=``) and the hooks that record events in each.
SM100_ROLES = ("load", "mma", "softmax", "correction", "epilogue")
SM90_ROLES = ("producer", "consumer")


@dataclass
class _State:
    """Python-side state while one kernel is traced (the DSL traces on one thread); the warp's
    recorder is fa4trace.auto's (``_rec``)."""

    role: Optional[str] = None
    events: frozenset = frozenset()  # roles whose event hooks record (role lifetimes always do)
    kernel: Any = None  # the FA4 kernel object whose role is being traced
    kv_wait: Any = None  # SM100 MMA warp: (kv pipeline count, MLIR block) of the last K/V wait
    n_block: Any = None  # SM90: KV block of the open consumer segment
    inflight: list = field(default_factory=list)  # SM90: async spans (event, payload) in issue order
    counts: dict = field(default_factory=dict)  # events placed per role (trace time), for tests

    @property
    def rec(self):
        return _rec()

    def recording(self) -> bool:
        rec = _rec()
        return rec is not None and rec.enabled and self.role in self.events

    def count(self, n=1, with_iter: bool = False):
        self.counts[self.role] = self.counts.get(self.role, 0) + n
        if with_iter:
            key = f"{self.role}:iter"
            self.counts[key] = self.counts.get(key, 0) + n


def _rec():
    """The recorder of the warp being traced (started by fa4trace.auto at kernel entry)."""
    from ..auto.state import STATE as AUTO

    return AUTO.rec


STATE = _State()


def _bind(fn: Callable, self, args, kwargs) -> dict:
    sig = _signature(fn)
    b = sig.bind_partial(self, *args, **kwargs)
    return b.arguments


@functools.lru_cache(maxsize=None)
def _signature(fn):
    return inspect.signature(getattr(fn, "__wrapped__", fn))


# ---- wrappers -------------------------------------------------------------------------------
def role_wrapper(orig: Callable, role: str, role_id: int) -> Callable:
    """Warp-role entry: write the role into this warp's header; the role's hooks record."""

    @functools.wraps(orig)
    def wrapper(self, *args, **kwargs):
        st = STATE
        rec = _rec()
        if rec is None or not rec.enabled:
            return orig(self, *args, **kwargs)
        outer = (st.role, st.kernel)
        rec.set_role(role_id)
        st.role, st.kernel = role, self
        st.inflight, st.kv_wait = [], None
        ret = orig(self, *args, **kwargs)
        st.role, st.kernel = outer
        st.kv_wait = None
        return ret

    wrapper.__fa4trace_hook__ = True
    return wrapper


def span_wrapper(orig: Callable, event: Callable | int, payload: Callable | None = None, *,
                 nested: str = "join") -> Callable:
    """One span around each call. ``event`` / ``payload``: constants or f(arguments) -> value.

    ``nested``: what to do when a segment is already open (a hook inside a hooked call):
    "join" records into it, "skip" records nothing (the outer hook instruments this level).
    """

    @functools.wraps(orig)
    def wrapper(self, *args, **kwargs):
        st = STATE
        if not st.recording():
            return orig(self, *args, **kwargs)
        seg = st.rec.current
        if seg is not None and nested == "skip":
            return orig(self, *args, **kwargs)
        a = _bind(orig, self, args, kwargs) if callable(event) or callable(payload) else {}
        ev = event(a) if callable(event) else event
        p = payload(a) if callable(payload) else payload
        own = seg is None
        if own:
            seg = st.rec.open(shared=True)
        seg.begin(ev, p)
        ret = orig(self, *args, **kwargs)
        seg.end(ev, p)
        st.count(2, with_iter=p is not None)
        if own:
            seg.close()
        return ret

    wrapper.__fa4trace_hook__ = True
    return wrapper


def func_span_wrapper(orig: Callable, event: int, payload: Callable | None = None, *,
                      nested: str = "skip") -> Callable:
    """``span_wrapper`` for a module-level function (no ``self``)."""
    inner = span_wrapper(lambda _self, *a, **k: orig(*a, **k), event,
                         (lambda _a: payload()) if payload else None, nested=nested)

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        return inner(None, *args, **kwargs)

    wrapper.__fa4trace_hook__ = True
    return wrapper


# ---- SM100 base path: the MMA warp's block index from its K/V pipeline ------------------------
def kv_wait_wrapper(orig: Callable) -> Callable:
    """``consumer_wait`` of FA4's K/V pipeline: in the MMA warp, remember the pipeline state's
    count (K and V blocks waited for so far) for the tcgen05 issue hooks that follow."""

    @functools.wraps(orig)
    def wrapper(self, state, *args, **kwargs):
        st = STATE
        if st.recording() and st.role == "mma":
            from ..device.insertion import current_block

            st.kv_wait = (state.count, current_block())
        return orig(self, state, *args, **kwargs)

    wrapper.__fa4trace_hook__ = True
    return wrapper


def base_mma_block():
    """KV block of a base-path QK/PV issue. With one Q tile per CTA (decode) the MMA warp waits
    K0, then V(i), K(i+1) per loop trip, then V(n-1): the wait just before an issue, in the same
    region, has count 2j (K(j)) or 2j+1 (V(j)), so the block is count // 2 (counting on across
    tiles, like the ping-pong path's counters). Unknown otherwise (iter -1)."""
    from ..device.insertion import current_block

    st = STATE
    k = st.kernel
    if (k is None or getattr(k, "use_s_ping_pong", True) or getattr(k, "q_stage", 0) != 1
            or st.kv_wait is None):
        return None
    count, block = st.kv_wait
    return count >> 1 if block == current_block() else None


# ---- SM90 consumer: one segment per KV block, async wgmma spans ------------------------------
def _close_inflight(keep: int):
    """wgmma wait_group(keep): every span but the newest ``keep`` has retired."""
    st = STATE
    seg = st.rec.current if st.rec is not None else None
    if seg is None:
        return
    while len(st.inflight) > keep:
        ev, p = st.inflight.pop(0)
        seg.end(ev, p)
        st.count(1, with_iter=p is not None)


def _wrap_mma_fn(fn: Callable, event: int, payload) -> Callable:
    """mma_qk_fn / mma_pv_fn (``functools.partial`` of quack's wgmma helpers): QK/PV begin at
    issue. They end at the ``wait_group`` that retires them (``wait_group_wrapper``), whether
    the helper waits itself (``wg_wait=k >= 0``) or FA4 does."""

    def wrapped(*args, **kwargs):
        st = STATE
        seg = st.rec.current
        seg.begin(event, payload)
        st.count(1, with_iter=payload is not None)
        st.inflight.append((event, payload))
        return fn(*args, **kwargs)

    return wrapped


def wait_group_wrapper(orig: Callable) -> Callable:
    """``warpgroup.wait_group(k)``, wherever FA4 or quack's wgmma helpers call it (swapped in
    every module that holds it, as the generic mma family's hook is): ends the async spans it
    retires, all but the newest k."""

    @functools.wraps(orig)
    def wait_group(group, *args, **kwargs):
        ret = orig(group, *args, **kwargs)
        st = STATE
        if st.recording() and st.rec.current is not None and isinstance(group, int):
            _close_inflight(group)
        return ret

    wait_group.__fa4trace_hook__ = True
    return wait_group


def sm90_block_wrapper(orig: Callable, kind: str, is_local: Callable[[Any], bool]) -> Callable:
    """A consumer call that processes one KV block: a segment; its QK/PV issue, softmax and
    rescale are recorded inside. ``kind``: "first" | "overlap" | "plain" | "last"."""

    @functools.wraps(orig)
    def wrapper(self, *args, **kwargs):
        st = STATE
        if not st.recording():
            return orig(self, *args, **kwargs)
        a = _bind(orig, self, args, kwargs)
        if kind == "last":
            # the final PV is of the lowest KV block; that is block 0 unless a local window
            # moves it (SM90 has no split-KV), and then it is not known here
            n_block = None
            pv_block = None if is_local(self) else 0
        else:
            n_block = a["n_block"]
            pv_block = n_block + 1 if kind == "overlap" else n_block
        for name in ("mma_qk_fn", "mma_pv_fn"):
            if name in a and name not in kwargs:  # FA4 b36 binds them by name (functools.partial)
                raise RuntimeError(f"fa4trace: {orig.__name__} got {name} positionally; FA4 changed, update hooks")
        seg = st.rec.open(shared=True)
        st.n_block = n_block
        st.inflight = []
        if "mma_qk_fn" in kwargs and kind != "last":
            kwargs = dict(kwargs, mma_qk_fn=_wrap_mma_fn(kwargs["mma_qk_fn"], EV.QK, n_block))
        if "mma_pv_fn" in kwargs and kind != "first":
            kwargs = dict(kwargs, mma_pv_fn=_wrap_mma_fn(kwargs["mma_pv_fn"], EV.PV, pv_block))
        ret = orig(self, *args, **kwargs)
        _close_inflight(0)  # nothing is left in flight after a block's call returns
        st.n_block = None
        seg.close()
        return ret

    wrapper.__fa4trace_hook__ = True
    return wrapper


def softmax_method_wrapper(orig: Callable, event: int) -> Callable:
    """Softmax.online_softmax / rescale_O: recorded only inside an open consumer segment."""

    @functools.wraps(orig)
    def wrapper(self, *args, **kwargs):
        st = STATE
        if not st.recording() or st.rec.current is None:
            return orig(self, *args, **kwargs)
        seg = st.rec.current
        p = st.n_block
        seg.begin(event, p)
        ret = orig(self, *args, **kwargs)
        seg.end(event, p)
        st.count(2, with_iter=p is not None)
        return ret

    wrapper.__fa4trace_hook__ = True
    return wrapper


class _CopyUtilsProxy:
    """Stands in for ``quack.copy_utils`` inside flash_fwd_sm90: the Q copy function
    (``tma_get_copy_fn(..., single_stage=True)``) records LOAD_Q around its TMA issue."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def tma_get_copy_fn(self, *args, **kwargs):
        ret = self._real.tma_get_copy_fn(*args, **kwargs)
        if not kwargs.get("single_stage", False):
            return ret
        fn, *rest = ret

        def load_q(*a, **k):
            st = STATE
            if not st.recording():
                return fn(*a, **k)
            seg = st.rec.open(shared=True)
            seg.begin(EV.LOAD_Q)
            r = fn(*a, **k)
            seg.end(EV.LOAD_Q)
            st.count(2)
            seg.close()
            return r

        return (load_q, *rest)


# ---- the hook tables ------------------------------------------------------------------------
def _kv_event(a):
    return EV.LOAD_K if a["K_or_V"] == "K" else EV.LOAD_V


def _patches_sm100():
    from flash_attn.cute import blackwell_helpers as bw
    from flash_attn.cute.flash_fwd_sm100 import FlashAttentionForwardSm100 as K
    from flash_attn.cute.pipeline import PipelineTmaUmma as pc  # FA4's K/V pipeline (TMA loads)

    d = K.__dict__
    return [
        (K, "load", role_wrapper(d["load"], "load", ROLE.PRODUCER)),
        (K, "mma", role_wrapper(d["mma"], "mma", ROLE.MMA)),
        (K, "softmax_loop", role_wrapper(d["softmax_loop"], "softmax", ROLE.SOFTMAX)),
        (K, "correction_loop", role_wrapper(d["correction_loop"], "correction", ROLE.CORRECTION)),
        (K, "epilogue_s2g", role_wrapper(d["epilogue_s2g"], "epilogue", ROLE.EPILOGUE)),
        (K, "load_KV", span_wrapper(d["load_KV"], _kv_event, lambda a: a["block"])),
        (K, "load_Q", span_wrapper(d["load_Q"], EV.LOAD_Q, lambda a: a["block"])),
        (K, "load_Q_non_tma", span_wrapper(d["load_Q_non_tma"], EV.LOAD_Q, lambda a: a["block"])),
        (K, "mma_ping_pong_qk", span_wrapper(d["mma_ping_pong_qk"], EV.QK, lambda a: a["block_count"])),
        (K, "mma_ping_pong_pv", span_wrapper(d["mma_ping_pong_pv"], EV.PV, lambda a: a["pv_count"])),
        (bw, "gemm_ptx_precomputed_varname",
         func_span_wrapper(bw.gemm_ptx_precomputed_varname, EV.QK, base_mma_block)),
        (bw, "gemm_ptx_partial", func_span_wrapper(bw.gemm_ptx_partial, EV.PV, base_mma_block)),
        (pc, "consumer_wait", kv_wait_wrapper(inspect.getattr_static(pc, "consumer_wait"))),
        (K, "softmax_step", span_wrapper(d["softmax_step"], EV.SOFTMAX, lambda a: a["n_block"])),
        (K, "correction_rescale", span_wrapper(d["correction_rescale"], EV.CORRECTION)),
        (K, "correction_epilogue", span_wrapper(d["correction_epilogue"], EV.EPILOGUE)),
    ]


def _function_swaps(arch: str) -> dict:
    """{id(current): (current, replacement)} for free functions, replaced in every module that
    holds them (``Patches.set_everywhere``). The current ``wait_group`` is the generic mma
    family's hook when that family is on: FA4's wraps it."""
    if arch != "sm90":
        return {}
    from cutlass.cute.nvgpu import warpgroup

    cur = warpgroup.wait_group
    return {id(cur): (cur, wait_group_wrapper(cur))}


def _patches_sm90():
    from flash_attn.cute import flash_fwd_sm90 as m90
    from flash_attn.cute.softmax import Softmax

    K = m90.FlashAttentionForwardSm90
    d = K.__dict__

    def local(self):
        return bool(self.is_local)

    return [
        (K, "load", role_wrapper(d["load"], "producer", ROLE.PRODUCER)),
        (K, "mma", role_wrapper(d["mma"], "consumer", ROLE.CONSUMER)),
        (K, "load_KV", span_wrapper(d["load_KV"], _kv_event, lambda a: a["block"])),
        (m90, "copy_utils", _CopyUtilsProxy(m90.copy_utils)),
        (K, "first_half_block_overlap", sm90_block_wrapper(d["first_half_block_overlap"], "first", local)),
        (K, "mma_one_n_block_intrawg_overlap",
         sm90_block_wrapper(d["mma_one_n_block_intrawg_overlap"], "overlap", local)),
        (K, "mma_one_n_block", sm90_block_wrapper(d["mma_one_n_block"], "plain", local)),
        (K, "last_half_block_overlap", sm90_block_wrapper(d["last_half_block_overlap"], "last", local)),
        (Softmax, "online_softmax", softmax_method_wrapper(Softmax.__dict__["online_softmax"], EV.SOFTMAX)),
        (Softmax, "rescale_O", softmax_method_wrapper(Softmax.__dict__["rescale_O"], EV.CORRECTION)),
        (K, "epilogue", span_wrapper(inspect.getattr_static(K, "epilogue"), EV.EPILOGUE)),
    ]


def clear_fa4_compile_cache():
    """FA4's in-memory compile cache is keyed without our patches: empty it on every change."""
    from flash_attn.cute import interface

    for obj in vars(interface).values():
        cache = getattr(obj, "compile_cache", None)
        if cache is not None and hasattr(cache, "clear"):
            cache.clear()


def roles_of(arch: str) -> tuple:
    return SM100_ROLES if arch == "sm100" else SM90_ROLES


def check_events(arch: str, events) -> frozenset:
    """The roles whose event hooks record (``events``; None: all), or ValueError naming the roles."""
    roles = roles_of(arch)
    ev = frozenset(roles if events is None else events)
    unknown = ev - set(roles)
    if unknown:
        raise ValueError(f"unknown {arch} role(s) {sorted(unknown)}; roles are {list(roles)}")
    return ev


def place(patches: Patches, arch: str, events=None):
    """Place FA4's hooks for ``arch`` ("sm100" | "sm90") in ``patches`` (``compile_traced``'s
    ``hooks``: after the generic families, before tracing; ``patches.restore()`` takes them out).
    ``events``: roles whose event hooks record (default all; role lifetimes always are)."""
    STATE.events = check_events(arch, events)
    STATE.counts = {}
    STATE.role = STATE.kernel = None
    for owner, name, new in (_patches_sm100() if arch == "sm100" else _patches_sm90()):
        patches.set(owner, name, new)
    patches.set_everywhere(_function_swaps(arch))
    clear_fa4_compile_cache()


def installed() -> bool:
    """Whether any FA4 hook is in place now (after a compile, none must be)."""
    from flash_attn.cute.flash_fwd_sm90 import FlashAttentionForwardSm90
    from flash_attn.cute.flash_fwd_sm100 import FlashAttentionForwardSm100
    from flash_attn.cute.softmax import Softmax

    return any(getattr(v, "__fa4trace_hook__", False)
               for cls in (FlashAttentionForwardSm90, FlashAttentionForwardSm100, Softmax) for v in vars(cls).values())
