"""Record the marker microbenchmark (``fa4trace.kernels.markers``): a marker-dense kernel whose
plain and recording variants measure what one event costs.
"""

from __future__ import annotations

import numpy as np

from ..format.options import Sampling, options
from ..kernels.marker_spec import L2_TABLE, RECORDING_VARIANTS
from ..kernels.marker_spec import WARPS_PER_CTA as MARKER_WARPS
from ..run.gpu import require_cuda
from ..run.record import TracedLaunch, record
from ..trace.bundle import Trace


# ---- the marker microbenchmark ---------------------------------------------------------------
def chase_table(n: int = L2_TABLE, seed: int = 0) -> np.ndarray:
    """A random single-cycle permutation for the marker kernel's L2 pointer chase."""
    order = np.random.default_rng(seed).permutation(n)
    nxt = np.empty(n, np.int32)
    nxt[order] = np.roll(order, -1)
    return nxt


def marker_inputs(n_ctas: int):
    """(out, table) device tensors for the marker kernel: output poisoned with NaN."""
    torch = require_cuda()
    out = torch.full((n_ctas * 32 * MARKER_WARPS,), float("nan"), dtype=torch.float32, device="cuda")
    table = torch.from_numpy(chase_table()).cuda()
    return out, table


def record_markers(*, variant: str = "fa4trace", work: str = "l2", n_ctas: int = 1056, iters: int = 200,
                   chain: int = 1, sampling: Sampling | None = None, build=None, capacity: int | None = None,
                   cta_first: int | None = None, cta_stride: int | None = None, max_ctas: int | None = None,
                   warps=None) -> Trace:
    """One traced launch of the marker-dense microbenchmark (2 events per iteration per warp).
    ``sampling`` (``Sampling``, or its fields as the ``cta_first``, ``cta_stride``, ``max_ctas``
    (its ``ctas``), ``capacity``, ``warps`` keywords): who records; every CTA and warp, with
    room for every record, unless told."""
    from ..run import loader

    sampling = options(Sampling, sampling, "record_markers", ctas=max_ctas, cta_first=cta_first,
                       cta_stride=cta_stride, capacity=capacity, warps=warps)
    if variant not in RECORDING_VARIANTS:
        raise ValueError(f"marker variant {variant!r} records nothing; the recording variants are "
                         f"{', '.join(RECORDING_VARIANTS)}")
    kern = loader.load("markers", build=build, variant=variant, work=work)
    fn, how = kern.fn, kern.how
    out, table = marker_inputs(n_ctas)
    launch = TracedLaunch(
        kernel=f"markers_{work}_{variant}", grid_ctas=n_ctas, warps_per_cta=MARKER_WARPS,
        run=lambda tr: fn(out, table, tr, n_ctas, iters, chain), grid=(n_ctas, 1, 1),
        block=(32 * MARKER_WARPS, 1, 1), capacity=2 * iters + 8, sampling=sampling, extra={"how": how})
    return record([launch], kernel=f"markers_{work}_{variant}",
                  config={"variant": variant, "work": work, "n_ctas": n_ctas, "iters": iters, "chain": chain})
