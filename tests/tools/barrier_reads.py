"""Whether each barrier of a kernel is left before the timer read that follows it.

``fa4trace.device.clock.after_barrier`` puts a branch on %nsmid between a barrier and the read
that ends its span (bar.sync lets the warp that gets there first issue on until a branch). The
PTX tests (test_known_answer_ptx) and the instrument() probe (auto_probe) check it with this one
reader, in PTX, or in SASS with the patterns given.
"""

from __future__ import annotations

import re

BARRIER_PTX = r"\bbar(rier)?(\.cta)?\.sync"
CLOCK_PTX = r"%clock(64)?\b"
SETTLE_PTX = r"mov\.u32 \w+, %nsmid; setp\.ne\.u32 \w+, \w+, 0; @\w+ bra\.uni"  # clock.after_barrier


def waits_after_barriers(code: str, barrier: str = BARRIER_PTX, read: str = CLOCK_PTX,
                         wait: str = SETTLE_PTX) -> list[bool]:
    """Per ``barrier`` in ``code``, in order: whether ``wait`` comes before the next ``read``
    (False where no read follows)."""
    out = []
    for m in re.finditer(barrier, code):
        rest = code[m.end():]
        r, w = re.search(read, rest), re.search(wait, rest)
        out.append(bool(r and w and w.start() < r.start()))
    return out
