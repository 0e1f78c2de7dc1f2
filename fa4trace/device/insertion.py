"""Where the DSL's trace is inserting ops right now (trace time, no device code).

The recorders ask while a kernel compiles: ``Recorder`` whether an open block's events are still
in one code region (their staging lanes are then counted, not computed), ``SegmentRecorder``
whether a segment's events are in the region it was opened in and whether anything was emitted
between two events (then they cannot share a timer read); FA4's hooks whether a wait is in the
region of the load that follows it.
"""

from __future__ import annotations


def current_block():
    """The MLIR block ops are being inserted into right now (None outside a trace)."""
    from cutlass._mlir import ir

    try:
        return ir.InsertionPoint.current.block
    except (ValueError, AttributeError):
        return None


def emit_point():
    """Where ops are inserted now: (block, its op count, the op the insertion point is before,
    the op right before the insertion point); None outside a trace. Two equal points taken at
    different times mean nothing was emitted in between (``SegmentRecorder.timer``)."""
    from cutlass._mlir import ir

    try:
        ip = ir.InsertionPoint.current
    except (ValueError, AttributeError):
        return None
    block = ip.block
    ops = block.operations
    n = len(ops)
    ref = ip.ref_operation
    if ref is None:
        return block, n, None, ops[n - 1].operation if n else None
    ref = ref.operation
    prev = None
    for op in ops:
        if op.operation == ref:
            break
        prev = op.operation
    return block, n, ref, prev


def same_point(a, b) -> bool:
    """``emit_point`` a == b (MLIR handles do not compare with None); False where in doubt
    (a handle of a module already gone raises)."""
    if a is None or b is None:
        return False
    try:
        return a[0] == b[0] and a[1] == b[1] and all(
            (x is None and y is None) or (x is not None and y is not None and x == y) for x, y in zip(a[2:], b[2:]))
    except (RuntimeError, TypeError, ValueError):
        return False
