"""Run instrumented kernels on the GPU and turn their buffers into bundles.

kernel (launch with a trace buffer) -> buffer (torch tensor) -> decode -> Trace
The launch itself is the caller's (a closure taking the trace tensor): ``record`` owns the
buffer's life, the decode and the metadata, for every kernel alike. The recordings of
fa4trace's own kernels are built on it: ``fa4trace.attention.record`` (our decode attention),
``fa4trace.probes`` (the calibration and marker kernels).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..format import layout as L
from ..format.options import DEFAULT_CAPACITY, Sampling
from ..format.vocab import VOCAB
from ..trace.bundle import Trace
from ..trace.decode import decode_buffer
from .gpu import gpu_facts, require_cuda


@dataclass
class TracedLaunch:
    """One kernel launch to record: how to run it given a trace tensor, and what it is.
    ``sampling``: who records (``fa4trace.format.options.Sampling``); ``capacity``: records per
    warp the recording sizes for this kernel, where the sampling names none."""

    kernel: str
    grid_ctas: int
    warps_per_cta: int
    run: Callable  # run(trace_tensor) launches the kernel once (asynchronously is fine)
    grid: tuple = (1, 1, 1)
    block: tuple = (1, 1, 1)
    capacity: int = DEFAULT_CAPACITY
    sampling: Sampling = Sampling()
    extra: dict = field(default_factory=dict)

    def spec(self) -> L.BufferSpec:
        return self.sampling.spec(self.warps_per_cta, grid_ctas=self.grid_ctas, capacity=self.capacity)


def new_trace_tensor(spec: L.BufferSpec, device="cuda"):
    """A zeroed trace buffer with its header, made on ``device`` with no copy from the host:
    a memset and one fill per non-zero header word, each a device operation, so it can be
    made while a stream captures a CUDA graph (a host-to-device copy cannot be captured)."""
    if str(device).startswith("cuda"):
        torch = require_cuda()
    else:
        import torch
    buf = torch.zeros(spec.words, dtype=torch.int64, device=device)
    for i, word in enumerate(spec.header().view(np.int64).tolist()):
        if word:
            buf[i].fill_(word)
    return buf


def record(launches: list[TracedLaunch], *, kernel: str, config: dict, timing: dict | None = None,
           notes: str | None = None, vocab=None) -> Trace:
    """Launch each (in order, one buffer each), wait, decode, and join into one Trace.
    ``vocab``: the kernel's event vocabulary where it records more than the attention one."""
    torch = require_cuda()
    vocab = vocab or VOCAB
    bufs = []
    for ln in launches:
        buf = new_trace_tensor(ln.spec())
        ln.run(buf)
        bufs.append(buf)
    torch.cuda.synchronize()
    decoded = [decode_buffer(b.cpu().numpy(), launch_index=i, grid_ctas=ln.grid_ctas, vocab=vocab)
               for i, (ln, b) in enumerate(zip(launches, bufs))]
    launch_meta = []
    for ln in launches:
        spec = ln.spec()
        subset = spec.n_cta_slots < ln.grid_ctas
        launch_meta.append({
            "kernel": ln.kernel, "grid": list(ln.grid), "block": list(ln.block),
            "grid_ctas": ln.grid_ctas, "recorded_ctas": spec.recorded_ctas,
            "cta_subset": subset, "warp_subset": spec.warp_subset,
            **ln.extra,
        })
    meta = {
        "kernel": kernel,
        "config": config,
        "gpu": gpu_facts(),
        "launches": launch_meta,
        "recorded_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "clock": {"globaltimer_tick_ns_expected": 32},
        "cta_subset": any(m["cta_subset"] for m in launch_meta),
        "warp_subset": next((m["warp_subset"] for m in launch_meta if m["warp_subset"]), None),
    }
    if timing:
        meta["timing"] = timing
    if notes:
        meta["notes"] = notes
    return Trace.from_launches(decoded, meta, vocab=vocab)
