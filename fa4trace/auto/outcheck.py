"""The record-time output check: a traced launch must leave memory exactly as the plain kernel does.

A kernel sees memory through its tensor arguments, and those may overlap: a broadcast tensor
(stride 0, such as the expanded gradient of a mean-reduced loss) names one element many
times, and two arguments may be views of one buffer. So the check works on the *memory* the
arguments cover, not on the tensors: each argument's span of its storage, merged per storage
where spans overlap, seen as one flat byte view (``regions``). Before the traced launch the
plain kernel runs twice from the same bytes; a region two plain runs agree on must come out of
the traced run bit for bit the same, one they disagree on (atomics, reductions in arrival
order) is named as non-deterministic. Only regions a plain run changed are written back, so
nothing the kernel could not have written is ever touched.

The same regions let fa4trace run the kernel again after the checked launch and leave memory
as that launch did: ``snapshot`` / ``put_back`` around the plain-twin timing (many launches on
the same arguments, into an output a kernel may accumulate into), and ``rerun`` for a pass
(the same launch replayed from the bytes the arguments held before it, with a lighter
recording, and compared with the plain result).

It runs on any torch device (the CPU tests drive it with Python "kernels").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Region:
    """A stretch of one storage that the named arguments cover, as a flat uint8 tensor."""

    names: list
    bytes: Any

    @property
    def name(self) -> str:
        return "/".join(self.names)


def _span(t) -> tuple[int, int]:
    """Byte offsets [lo, hi) of ``t``'s storage that its elements occupy (torch strides are >= 0)."""
    el = t.element_size()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    lo = t.storage_offset() * el
    return lo, lo + (last + 1) * el


def regions(tensors) -> list[Region]:
    """The memory behind ``tensors`` ((name, tensor) pairs): one region per run of overlapping
    spans of a storage, in argument order of their first name. Empty tensors cover nothing."""
    import torch

    by_storage: dict = {}
    for name, t in tensors:
        if t.numel() == 0:
            continue
        st = t.untyped_storage()
        key = (t.device, st.data_ptr())
        by_storage.setdefault(key, (st, t.device, []))[2].append((*_span(t), name))
    out = []
    for st, device, spans in by_storage.values():
        spans.sort(key=lambda s: (s[0], s[1]))
        merged: list = []
        for lo, hi, name in spans:
            if merged and lo < merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
                merged[-1][2].append(name)
            else:
                merged.append([lo, hi, [name]])
        for lo, hi, names in merged:
            flat = torch.empty(0, dtype=torch.uint8, device=device)
            flat.set_(st, lo, (hi - lo,), (1,))
            out.append(Region(names, flat))
    order = {name: i for i, (name, _t) in enumerate(tensors)}
    out.sort(key=lambda r: min(order[n] for n in r.names))
    return out


def equal(a, b) -> bool:
    """Bitwise equality of two byte views (NaN payloads and signed zeros count)."""
    import torch

    return torch.equal(a, b)


class OutputCheck:
    """One checked launch: ``plain_twice`` before it, ``compare`` after it.

    ``sync`` waits for the device (torch.cuda.synchronize on a GPU; nothing on the CPU)."""

    def __init__(self, tensors, sync: Callable[[], None] = lambda: None):
        self.regions = regions(tensors)
        self.sync = sync
        self.before = [r.bytes.clone() for r in self.regions]
        self.want: list = []
        self.nondeterministic: set[str] = set()
        self.written: list[str] = []  # regions written back, in order (what the check touched)
        self.compared = False  # compare() ran: each region with a plain result holds it

    def _restore(self) -> None:
        """Put back the bytes of every region a run changed (and only those)."""
        for r, b in zip(self.regions, self.before):
            if not equal(r.bytes, b):
                r.bytes.copy_(b)
                self.written.append(r.name)

    def plain_twice(self, run_plain: Callable[[int], None]) -> None:
        """Run the plain kernel twice from the same bytes (``run_plain(i)``, i = 0, 1) and keep
        what each region should hold after a launch, or None where the two runs differ."""
        outs = []
        for i in range(2):
            run_plain(i)
            self.sync()
            outs.append([r.bytes.clone() for r in self.regions])
            self._restore()
        self.want = []
        for r, a, b in zip(self.regions, *outs):
            if equal(a, b):
                self.want.append(a)
            else:
                self.want.append(None)
                self.nondeterministic.update(r.names)

    def compare(self) -> list[str]:
        """The argument names whose memory the traced launch left different from the plain
        kernel's where plain is reproducible; that memory gets the plain result back."""
        differ = []
        for r, w in zip(self.regions, self.want):
            if w is not None and not equal(r.bytes, w):
                differ += r.names
                r.bytes.copy_(w)
                self.written.append(r.name)
        self.compared = True
        return differ

    def snapshot(self) -> list:
        """What every region holds now, for ``put_back``: after ``compare`` a region with a
        plain result holds exactly that (no copy is made), any other region is copied."""
        want = self.want if self.compared and self.want else [None] * len(self.regions)
        return [w if w is not None else r.bytes.clone() for r, w in zip(self.regions, want)]

    def put_back(self, snap: list) -> list[str]:
        """Write ``snap`` (a ``snapshot``) back into every region whose bytes differ from it,
        and only those; the names of the regions written."""
        back = []
        for r, b in zip(self.regions, snap):
            if not equal(r.bytes, b):
                r.bytes.copy_(b)
                back.append(r.name)
        self.written += back
        return back

    def rerun(self, run: Callable[[], None]) -> list[str]:
        """Replay the launch: put back the bytes the arguments held before it (where they
        differ), ``run()``, wait, and ``compare`` with the plain result (the names that
        differ; none without ``plain_twice``)."""
        self._restore()
        run()
        self.sync()
        return self.compare()


def named_tensors(args, kwargs, params) -> list[tuple[str, Any]]:
    """(name, tensor) of every torch tensor among a call's arguments (positional ones named by
    ``params`` where it says, else ``arg<i>``)."""
    import torch

    named = [(params[i] if i < len(params) else f"arg{i}", a) for i, a in enumerate(args)]
    named += list(kwargs.items())
    return [(n, a) for n, a in named if isinstance(a, torch.Tensor)]

