"""L2 before a launch that is compared with another: flushed, so both start alike.

Passes replay a launch to take each figure from the lightest recording that reports it, and a
reference recording is set beside them; what L2 holds when each starts depends on what ran
just before (the output check reads every argument back, a large trace buffer's memset
evicts, a small one does not). On a memory-bound kernel that alone moves every duration by
several percent (docs/fidelity.md, "How far the figures of a dense trace are off"). Nsight
Compute flushes the caches before each replay pass for the same reason
(``--cache-control all``). ``flush`` writes a scratch buffer twice the L2's size on the current
stream, right before the launch, evicting what the launch would otherwise find there.
"""

from __future__ import annotations

FLUSHED = "flushed"  # what a launch's record says where L2 was flushed right before it


def scratch(device=None):
    """A buffer that evicts L2 when written (twice its size, on ``device``: default the current
    one), or the reason there is none (a str: no memory for it, or what failed; the program
    goes on either way). Drop it after the launches: torch's caching allocator keeps the memory
    for the program's next allocation."""
    import torch

    try:
        dev = torch.cuda.current_device() if device is None else device
        size = 2 * int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or (64 << 20))
    except Exception as exc:  # noqa: BLE001 (a flush is fa4trace's business, never the program's)
        return f"not flushed: {type(exc).__name__}: {exc}"
    try:
        return torch.empty(size, dtype=torch.uint8, device=dev)
    except torch.cuda.OutOfMemoryError:
        return f"not flushed: no memory for a {size >> 20} MiB scratch buffer"


def flush(buf) -> str:
    """Write ``buf`` (from ``scratch``) on the current stream; what the launch's record says:
    ``FLUSHED``, or ``buf`` itself where it is the reason there is no buffer."""
    if isinstance(buf, str):
        return buf
    buf.zero_()
    return FLUSHED
