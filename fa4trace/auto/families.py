"""The automatic event families: hooks on the building blocks every pipelined CuTe DSL
kernel calls, placed while it compiles (``install``) and removed after (``Patches.restore``).

    pipeline   every ``cutlass.pipeline.PipelineAsync`` subclass (TMA, cp.async, UMMA, quack's
               and FA4's own): producer_acquire (span), producer_commit (instant),
               consumer_wait (span), consumer_release (instant); payload = the state's
               running count, name = the pipeline's variable name at the call site
    tma        ``cute.copy`` with a bulk-tensor (TMA) atom: load / store issue (instants)
    mma        ``warpgroup.commit_group`` and ``tcgen05.commit`` (instant ``mma.commit``),
               ``warpgroup.wait_group(k)`` (span ``mma.wait``, payload k), ``cute.gemm`` with a
               tcgen05 atom (instant ``mma.issue``; Blackwell, compile-checked only)
    barrier    ``cute.arch.barrier`` (span ``barrier.sync``), ``cute.arch.barrier_arrive``
               (instant), payload = the barrier id
    user       spans the user names: ``spans={"softmax": "flash_attn.cute.softmax:Softmax.online_softmax"}``
               makes every call of that function a span called ``softmax`` (what a generic layer
               cannot know: which code is the softmax); ``{"target": ..., "payload": "n_block"}``
               gives each span the value of that integer argument as its iteration

Each hooked call is one segment of the calling warp's ``SegmentRecorder`` (the recorder that
needs no carrying through someone else's loops). A hooked call inside another hooked call
records nothing: the outer one already brackets it (quack's pipelines call their parents').
Inside a segment a kernel's own hooks opened ``shared`` (FA4's, around one KV block), hooked
calls record into that segment, where it is open in the same region (fa4trace.fa4.hooks).
Functions are replaced under every module name they are reachable by (``from x import copy``
included), found by identity in ``sys.modules``.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Optional

from .events import FAMILIES
from .patches import Patches, subclasses
from .state import STATE

PIPELINE_METHODS = {
    "producer_acquire": "acquire",
    "producer_commit": "commit",
    "consumer_wait": "wait",
    "consumer_release": "release",
}


# Families whose spans store their begin record before the wrapped call (a segment each side of
# it) instead of holding it in registers until the end. The user's spans: a span held open
# across its call would bracket the hooked calls inside it, which then record nothing (a hooked
# call inside another records nothing), so a span the user names around code with waits or
# barriers would hide them. Holding every begin was no cheaper beyond the spread of runs
# (docs/not-kept.md); the families' spans wrap short waits and always hold theirs.
STORE_AT_BEGIN: frozenset = frozenset({"user"})


def recorded(family: str, op: str, call: Callable[[], Any], *, resource: str = "", stages: int = 0,
             payload=None):
    """Run ``call()`` as one event of the current warp (a span around it, or an instant after)."""
    st = STATE
    rec = st.rec
    if rec is None or not rec.enabled or family not in st.families:
        return call()
    joined = rec.current
    if joined is not None and not joined.joinable():
        return call()
    table = st.table
    eid = table.event(family, op, resource, stages)
    seg = joined if joined is not None else rec.open()
    if table.is_span(family, op) and joined is None and family in STORE_AT_BEGIN:
        # the begin record leaves before the call: nothing of the recorder is held across it
        seg.begin(eid, payload)
        seg.close()
        ret = call()
        seg = rec.open()
        seg.end(eid, payload)
    elif table.is_span(family, op):
        seg.begin(eid, payload)
        ret = call()
        if family == "barrier":  # its end read must wait for the release (clock.after_barrier)
            from ..device.clock import after_barrier

            after_barrier()
        seg.end(eid, payload)
    else:
        ret = call()
        seg.instant(eid, payload)
    st.found[family] = st.found.get(family, 0) + 1
    if joined is not None:  # the kernel's own hook that opened the segment closes it
        return ret
    seg.close()
    return ret


# ---- pipeline ---------------------------------------------------------------------------------
def _strip_pipeline(name: str) -> str:
    short = name.replace("pipeline", "").strip("_")
    return short or name


def pipeline_name(obj) -> str:
    """The pipeline's variable name where the kernel uses it (``ab_pipeline`` -> ``ab``), else
    its class name and a number. Stable for one compile (cached by object)."""
    st = STATE
    key = id(obj)
    hit = st.names.get(key)
    if hit is not None:
        return hit[0]
    name = None
    generic = None  # a parameter called just "pipeline": used only if nothing says more
    f = sys._getframe(2)
    for _ in range(16):
        if f is None or name:
            break
        if not f.f_globals.get("__name__", "").startswith(("fa4trace.auto", "cutlass.")):
            cands = [k for k, v in f.f_locals.items() if v is obj and k != "self"]
            for v in f.f_locals.values():  # a field of a NamedTuple the kernel passes around (pipes.k)
                for k in getattr(v, "_fields", ()):
                    if getattr(v, k, None) is obj:
                        cands.insert(0, k)
            slf = f.f_locals.get("self")
            if slf is not None and slf is not obj:
                cands += [k for k, v in getattr(slf, "__dict__", {}).items() if v is obj]
            for k in cands:
                if _strip_pipeline(k) != k or k not in ("pipeline", "pipe", "p"):
                    name = _strip_pipeline(k)
                    break
                generic = generic or k
        f = f.f_back
    name = name or generic
    if not name:
        name = f"{type(obj).__name__}{sum(1 for n, _ in st.names.values() if n.startswith(type(obj).__name__))}"
    taken = {n for n, _ in st.names.values()}
    base, i = name, 2
    while name in taken:
        name, i = f"{base}{i}", i + 1
    st.names[key] = (name, obj)  # keep obj alive: its id must not be reused during the compile
    st.table.pipelines[name] = {"class": type(obj).__name__, "stages": int(getattr(obj, "num_stages", 0) or 0)}
    return name


def _state_count(args, kwargs):
    state = kwargs.get("state", args[0] if args else None)
    return getattr(state, "count", None)


def _pipeline_wrapper(orig: Callable, op: str) -> Callable:
    @functools.wraps(orig)
    def wrapper(self, *args, **kwargs):
        if STATE.rec is None or "pipeline" not in STATE.families:
            return orig(self, *args, **kwargs)
        return recorded("pipeline", op, lambda: orig(self, *args, **kwargs), resource=pipeline_name(self),
                        stages=int(getattr(self, "num_stages", 0) or 0), payload=_state_count(args, kwargs))

    wrapper.__fa4trace_hook__ = True
    return wrapper


def _patch_pipelines(patches: Patches):
    from cutlass.pipeline import PipelineAsync

    for cls in subclasses(PipelineAsync):
        for meth, op in PIPELINE_METHODS.items():
            fn = vars(cls).get(meth)
            if fn is not None and callable(fn) and not getattr(fn, "__fa4trace_hook__", False):
                patches.set(cls, meth, _pipeline_wrapper(fn, op))


# ---- functions: tma, mma, barrier ---------------------------------------------------------------
def _tma_kind(atom) -> Optional[str]:
    name = type(getattr(atom, "op", None)).__name__
    if "BulkTensor" not in name:
        return None
    return "load" if "G2S" in name else "store" if "S2G" in name else None


def _copy_wrapper(orig):
    @functools.wraps(orig)
    def copy(atom, *args, **kwargs):
        kind = _tma_kind(atom) if STATE.rec is not None else None
        if kind is None:
            return orig(atom, *args, **kwargs)
        return recorded("tma", kind, lambda: orig(atom, *args, **kwargs))

    return copy


def _is_tcgen05(atom) -> bool:
    op = getattr(atom, "op", None)
    return "tcgen05" in type(op).__module__


def _gemm_wrapper(orig):
    """``cute.gemm`` with a tcgen05 (UMMA) atom: one ``mma.issue`` instant per call (Blackwell,
    where completion is signalled through a pipeline, not waited for by the issuing warp)."""

    @functools.wraps(orig)
    def gemm(atom, *args, **kwargs):
        if STATE.rec is None or not _is_tcgen05(atom):
            return orig(atom, *args, **kwargs)
        return recorded("mma", "issue", lambda: orig(atom, *args, **kwargs))

    return gemm


def _commit_wrapper(orig):
    @functools.wraps(orig)
    def commit(*args, **kwargs):
        return recorded("mma", "commit", lambda: orig(*args, **kwargs))

    return commit


def _wait_group_wrapper(orig):
    @functools.wraps(orig)
    def wait_group(group, *args, **kwargs):
        return recorded("mma", "wait", lambda: orig(group, *args, **kwargs), payload=group)

    return wait_group


def _barrier_wrapper(orig, op: str):
    @functools.wraps(orig)
    def barrier(*args, **kwargs):
        return recorded("barrier", op, lambda: orig(*args, **kwargs), payload=kwargs.get("barrier_id"))

    return barrier


def _function_hooks() -> list[tuple[str, Callable, Callable]]:
    """(family, original, replacement) for every hooked free function."""
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import tcgen05, warpgroup

    return [
        ("tma", cute.copy, _copy_wrapper(cute.copy)),
        ("mma", warpgroup.commit_group, _commit_wrapper(warpgroup.commit_group)),
        ("mma", warpgroup.wait_group, _wait_group_wrapper(warpgroup.wait_group)),
        ("mma", tcgen05.commit, _commit_wrapper(tcgen05.commit)),
        ("mma", cute.gemm, _gemm_wrapper(cute.gemm)),
        ("barrier", cute.arch.barrier, _barrier_wrapper(cute.arch.barrier, "sync")),
        ("barrier", cute.arch.barrier_arrive, _barrier_wrapper(cute.arch.barrier_arrive, "arrive")),
    ]


def resolve(target):
    """(owner, attribute) of a span target: "module:Class.method", "module:function" or a tuple."""
    import importlib

    if isinstance(target, tuple) and len(target) == 2:
        return target
    if not isinstance(target, str) or ":" not in target:
        raise ValueError(f"a span target is 'module:Class.method' or (owner, name), got {target!r}")
    mod_name, path = target.split(":", 1)
    try:
        owner = importlib.import_module(mod_name)
        *parents, attr = path.split(".")
        for p in parents:
            owner = getattr(owner, p)
        getattr(owner, attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"span target {target!r} not found: {exc}") from None
    return owner, attr


def span_spec(label: str, spec) -> tuple[Any, str, Optional[str]]:
    """(owner, attribute, payload argument or None) of one ``spans`` entry: a target
    ("module:Class.method", "module:function" or (owner, name)), or {"target": ..., "payload":
    "argument"} whose named argument (an integer: a loop index, a KV block) becomes each span's
    payload, as a pipeline event's is its stage count."""
    if isinstance(spec, dict):
        if "target" not in spec or set(spec) - {"target", "payload"}:
            raise ValueError(f"span {label!r}: a dict takes 'target' and optionally 'payload', got {sorted(spec)}")
        owner, attr = resolve(spec["target"])
        payload = spec.get("payload")
        if payload is not None and not isinstance(payload, str):
            raise ValueError(f"span {label!r}: 'payload' names an argument of the function, got {payload!r}")
        return owner, attr, payload
    owner, attr = resolve(spec)
    return owner, attr, None


def _span_wrapper(fn, label: str, payload_arg: Optional[str] = None):
    sig = None
    if payload_arg is not None:
        import inspect

        sig = inspect.signature(fn)
        if payload_arg not in sig.parameters:
            raise ValueError(f"span {label!r}: {getattr(fn, '__qualname__', fn)} has no parameter {payload_arg!r} "
                             f"(it has {', '.join(sig.parameters)})")

    @functools.wraps(fn)
    def span(*args, **kwargs):
        payload = None
        if sig is not None:
            bound = sig.bind_partial(*args, **kwargs)
            bound.apply_defaults()
            payload = _integer_payload(label, payload_arg, bound.arguments.get(payload_arg))
        return recorded("user", "span", lambda: fn(*args, **kwargs), resource=label, payload=payload)

    return span


def _integer_payload(label: str, arg: str, value):
    """A span payload must be an integer (Python or DSL); anything else fails the compile in one line."""
    from cutlass import Integer

    if isinstance(value, bool) or not isinstance(value, (int, Integer)):
        raise RuntimeError(f"fa4trace: span {label!r}: argument {arg!r} is a {type(value).__name__}, "
                           "not an integer (a span payload is an iteration or block index)")
    return value


def _patch_spans(patches: Patches, spans: dict):
    for label, spec in spans.items():
        owner, attr, payload_arg = span_spec(label, spec)
        raw = vars(owner).get(attr, getattr(owner, attr)) if hasattr(owner, "__dict__") else getattr(owner, attr)
        if isinstance(raw, (staticmethod, classmethod)):
            new = type(raw)(_span_wrapper(raw.__func__, label, payload_arg))
        else:
            new = _span_wrapper(raw, label, payload_arg)
        patches.set(owner, attr, new)


def install(patches: Patches, families, spans: dict | None = None) -> None:
    """Hook the chosen families and the user's spans (the rest of the kernel compiles as it is)."""
    if spans:
        _patch_spans(patches, spans)
    fams = set(families) - {"user"}
    unknown = fams - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown event families {sorted(unknown)}; families are {list(FAMILIES)}")
    if "pipeline" in fams:
        _patch_pipelines(patches)
    swaps = {id(orig): (orig, new) for fam, orig, new in _function_hooks() if fam in fams}
    patches.set_everywhere(swaps)
