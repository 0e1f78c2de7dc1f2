"""Run an instrumented kernel and turn its buffers into a bundle (torch + a GPU; no cutlass).

Works the same for a kernel compiled here (``compiler.CompiledTraced``) and for one loaded
from an AOT build: all it needs is the compiled function, its vocabulary and what the
compile found (``meta``). Each call gets a fresh buffer appended to its arguments; with
``check`` the plain build runs first on the same inputs and every tensor argument must come
out bit-identical from the traced run (instrumentation never changes what a kernel computes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from .. import layout as L
from ..errors import Fa4traceError

DEFAULT_CTAS = 256  # the first CTAs of the grid record (a launch's grid is often known only at run time)
DEFAULT_CAPACITY = 4096  # records per warp


@dataclass
class RecordOptions:
    """Which warps record and how much: the first ``ctas`` CTAs (or every ``cta_stride``-th
    from ``cta_first``), ``warps`` (warp indices; None = all), ``capacity`` records each."""

    ctas: int = DEFAULT_CTAS
    capacity: int = DEFAULT_CAPACITY
    cta_first: int = 0
    cta_stride: int = 1
    warps: Optional[tuple] = None
    check: bool = True

    def spec(self, warps_per_cta: int) -> L.BufferSpec:
        n = self.cta_first + self.ctas * self.cta_stride
        return L.BufferSpec.for_grid(n, warps_per_cta, self.capacity, cta_first=self.cta_first,
                                     cta_stride=self.cta_stride, max_ctas=self.ctas, warps=self.warps)


def _bits(t):
    """A tensor's bytes (bit-for-bit comparison: NaN payloads and signed zeros included)."""
    import torch

    return t.contiguous().reshape(-1).view(torch.uint8)


def _tensors(args) -> list:
    import torch

    return [a for a in args if isinstance(a, torch.Tensor)]


class Instrumented:
    """Callable like the kernel it wraps; ``trace()`` gives the bundle of its launches so far."""

    def __init__(self, fn: Callable, vocab, meta: dict, *, plain: Optional[Callable] = None,
                 options: Optional[RecordOptions] = None, to_arg: Callable = lambda t: t):
        self.fn, self.vocab, self.meta, self.plain = fn, vocab, dict(meta), plain
        self.options = options or RecordOptions()
        self.to_arg = to_arg  # torch trace tensor -> what the compiled function takes
        self._launches: list[tuple[Any, L.BufferSpec]] = []
        self.checked: list[bool] = []

    @property
    def warps_per_cta(self) -> int:
        w = self.meta.get("warps_per_cta")
        if not w:
            raise Fa4traceError("the kernel's block size was not a constant at compile time: "
                                "pass warps_per_cta to fa4trace.instrument")
        return int(w)

    def __call__(self, *args):
        import torch

        from ..record import new_trace_tensor

        spec = self.options.spec(self.warps_per_cta)
        buf = new_trace_tensor(spec)
        check = self.options.check and self.plain is not None
        if check:
            before = [t.clone() for t in _tensors(args)]
            self.plain(*args)
            torch.cuda.synchronize()
            want = [t.clone() for t in _tensors(args)]
            for t, b in zip(_tensors(args), before):
                t.copy_(b)
        ret = self.fn(*args, self.to_arg(buf))
        self._launches.append((buf, spec))
        if check:
            torch.cuda.synchronize()
            same = all(torch.equal(_bits(t), _bits(w)) for t, w in zip(_tensors(args), want))
            self.checked.append(same)
            if not same:
                raise Fa4traceError("instrumentation changed the kernel's output (traced != untraced, bitwise): "
                                    "please report this kernel")
        return ret

    def trace(self, *, config: Optional[dict] = None):
        """Decode every launch so far into one ``Trace`` (and forget them)."""
        import torch

        from ..bundle import Trace
        from ..decode import decode_buffer
        from ..gpu import gpu_facts

        if not self._launches:
            raise Fa4traceError("nothing recorded yet: call the instrumented kernel first")
        torch.cuda.synchronize()
        decoded = [decode_buffer(b.cpu().numpy(), launch_index=i, vocab=self.vocab)
                   for i, (b, _s) in enumerate(self._launches)]
        launches = [{"kernel": self.meta.get("kernel"), "recorded_ctas":
                     f"{s.cta_first}:{s.cta_first + s.n_cta_slots * s.cta_stride}:{s.cta_stride}",
                     "warp_subset": s.warp_subset} for _b, s in self._launches]
        meta = {"kernel": self.meta.get("kernel", "kernel"), "config": dict(config or {}),
                "gpu": gpu_facts(), "launches": launches,
                "instrument": dict(self.meta, checked=list(self.checked)),
                "cta_subset": True, "warp_subset": launches[0]["warp_subset"]}
        self._launches = []
        return Trace.from_launches(decoded, meta, vocab=self.vocab)
