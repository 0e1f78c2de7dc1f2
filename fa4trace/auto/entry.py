"""The trace buffer as one more argument of a kernel that never asked for it.

``traced_entry`` makes a ``@cute.jit`` host function with the user's parameters plus
``fa4trace_buf`` (last by default); it hands the buffer to the kernel launches inside and
calls the user's entry, which the DSL inlines. ``traced_kernel`` makes a ``@cute.kernel``
with the kernel's parameters plus ``fa4trace_buf`` whose body starts every warp's recorder,
runs the kernel's own body (a fresh function over its code object: nothing is edited) and
finishes the recorder (with ``split``, in the recording CTAs only); with ``lifetimes`` every
CTA, recording or not, also stamps its start and end into the buffer's CTA-lifetime region
(fa4trace.format.layout), outside both copies of the body. The buffer is a real kernel
argument, so one compile serves every buffer and AOT export works. FA4's adapter and
``fa4trace.instrument`` (fa4trace.auto) both build on these.
"""

from __future__ import annotations

import inspect
import types
from typing import Callable, Optional

from ..format.errors import Fa4traceError

BUF = "fa4trace_buf"


def is_kernel(obj) -> bool:
    """A ``@cute.kernel`` function (or method)."""
    return getattr(getattr(obj, "__wrapped__", None), "_decorator_kind", None) == "kernel"


def is_jit(obj) -> bool:
    return getattr(getattr(obj, "__wrapped__", None), "_decorator_kind", None) == "jit"


def params_source(params, ns: dict, prefix: str = "_") -> list[str]:
    """``name: annotation = default`` for each parameter, with the objects put in ``ns``."""
    out = []
    for p in params:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise Fa4traceError(f"fa4trace cannot add its buffer to a signature with *args, **kwargs or "
                                f"keyword-only parameters (parameter {p.name!r})")
        s = p.name
        if p.annotation is not inspect.Parameter.empty:
            ns[f"{prefix}ann_{p.name}"] = p.annotation
            s += f": {prefix}ann_{p.name}"
        if p.default is not inspect.Parameter.empty:
            ns[f"{prefix}def_{p.name}"] = p.default
            s += f" = {prefix}def_{p.name}"
        out.append(s)
    return out


def _raw(fn):
    return getattr(fn, "__wrapped__", fn)


def traced_entry(entry: Callable, on_buffer: Callable, *, before: Optional[str] = None) -> Callable:
    """``entry`` (a ``@cute.jit`` function or method) plus a ``fa4trace_buf`` parameter, placed
    last or just before the parameter named ``before``; ``on_buffer(buf)`` runs first."""
    import cutlass.cute as cute

    params = list(inspect.signature(_raw(entry)).parameters.values())
    names = [p.name for p in params]
    if BUF in names:
        raise Fa4traceError(f"{_raw(entry).__qualname__} already has a parameter named {BUF}")
    ns = {"_entry": entry, "_Tensor": cute.Tensor, "_on_buffer": on_buffer}
    src = params_source(params, ns)
    at = len(src) if before is None else names.index(before)
    src.insert(at, f"{BUF}: _Tensor = None")
    if any("=" in s for s in src[:at]) and "=" not in src[at]:
        raise Fa4traceError("fa4trace's buffer cannot follow parameters with defaults")
    code = (f"def entry({', '.join(src)}):\n"
            f"    _on_buffer({BUF})\n"
            f"    return _entry({', '.join(names)})\n")
    exec(compile(code, f"<fa4trace entry for {_raw(entry).__qualname__}>", "exec"), ns)
    fn = ns["entry"]
    fn.__qualname__ = fn.__name__ = _raw(entry).__name__
    return cute.jit(preprocess=False)(fn)


class _LaunchSpy:
    """The kernel's launcher object, with ``launch(grid=, block=, ...)`` reported first."""

    def __init__(self, real, on_launch):
        self._real, self._on_launch = real, on_launch

    def __getattr__(self, name):
        return getattr(self._real, name)

    def launch(self, *args, **kwargs):
        self._on_launch(kwargs)
        return self._real.launch(*args, **kwargs)


def traced_kernel(kernel: Callable, on_enter: Callable, on_exit: Callable, buffer: Callable, *,
                  method: bool, on_launch: Optional[Callable] = None, split: bool = False,
                  lifetimes: bool = False) -> Callable:
    """A replacement for ``kernel`` (a ``@cute.kernel``) that takes ``fa4trace_buf`` from
    ``buffer()`` at launch, calls ``on_enter(buf)`` at the top of the kernel, then the kernel's
    own body, then ``on_exit()``. ``method``: the kernel is a method (first parameter self).
    ``split``: only in the CTAs the buffer selects; the others run the body alone
    (``fa4trace.auto.split``). ``lifetimes``: every warp of every CTA stamps the CTA's lifetime
    entry first and last (``take_cta_start`` / ``store_cta_start`` / ``stamp_cta_end``), around
    whichever copy runs, so recorded and untraced CTAs are timed the same way."""
    import cutlass.cute as cute

    from ..device.lifetimes import stamp_cta_end, store_cta_start, take_cta_start

    raw = _raw(kernel)
    code0 = getattr(raw, "_original_code", raw.__code__)
    body = types.FunctionType(code0, raw.__globals__, raw.__name__, raw.__defaults__, raw.__closure__)
    body.__kwdefaults__ = raw.__kwdefaults__
    body.__annotations__ = dict(raw.__annotations__)
    body.__qualname__, body.__module__ = raw.__qualname__, raw.__module__
    body_jit = cute.jit(body)
    params = list(inspect.signature(raw).parameters.values())

    def run(buf, args, top=lambda: None):  # the instrumented body
        on_enter(buf)
        top()
        body_jit(*args)
        on_exit()

    def run_split(buf, args, top=lambda: None):  # ... in the CTAs that record; the others run the body untouched
        from .split import split_by_cta

        split_by_cta(buf, body_jit, args, before=lambda: on_enter(buf), after=on_exit, method=method, top=top)

    def run_timed(buf, args):  # either, between the CTA's lifetime stamps: the start is stored
        taken, entry = take_cta_start(buf), []  # once the recorder's (or the selection's) loads are issued
        (run_split if split else run)(buf, args, top=lambda: entry.append(store_cta_start(buf, taken)))
        stamp_cta_end(buf, entry[0])

    ns = {"_Tensor": cute.Tensor, "_run": run_timed if lifetimes else run_split if split else run}
    src = params_source(params, ns)
    names = [p.name for p in params]
    code = (f"def kernel({', '.join(src)}, {BUF}: _Tensor = None):\n"
            f"    _run({BUF}, [{', '.join(names)}])\n")
    exec(compile(code, f"<fa4trace kernel for {raw.__qualname__}>", "exec"), ns)
    fn = ns["kernel"]
    fn.__qualname__, fn.__name__, fn.__module__ = raw.__qualname__, raw.__name__, raw.__module__
    traced = cute.kernel(preprocess=False)(fn)

    def spied(ret):
        return ret if on_launch is None else _LaunchSpy(ret, on_launch)

    if method:
        def launcher(self, *args, **kwargs):
            return spied(traced(self, *args, **{BUF: buffer()}, **kwargs))
    else:
        def launcher(*args, **kwargs):
            return spied(traced(*args, **{BUF: buffer()}, **kwargs))
    launcher.__wrapped__ = kernel.__wrapped__ if hasattr(kernel, "__wrapped__") else kernel
    launcher.__fa4trace_hook__ = True
    return launcher
