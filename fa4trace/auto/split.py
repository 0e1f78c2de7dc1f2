"""CTAs that do not record run an untouched copy of the kernel body.

A traced kernel's body is traced twice under one CTA-uniform branch at its top: the CTAs the
trace buffer selects (``cta_records``) run the instrumented body, every other CTA runs the
body as the kernel's authors wrote it, with not one instruction of fa4trace in it. A launch
that records a sample of CTAs then costs the others nothing (their code is the plain
kernel's), and the recorded CTAs run among neighbours at full speed.

Shared memory: both copies must use the same bytes, not twice as many. Every
``SmemAllocator`` allocation of the first copy is emitted before the branch (allocations are
typed and static, they take no operand), and the second copy's allocations, one for one in
the same order and type, get the first copy's pointers back. (Static shared memory a body
takes with ``cute.arch.alloc_smem`` is not shared: each copy has its own.)

Costs: each CTA reads two words of the buffer's header before it branches; the compile traces
and assembles the body twice. Inline PTX that declares names at function scope cannot appear
twice (ptxas: "Duplicate definition"); ``compile_traced`` then compiles one body.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from ..device.recorder import cta_records
from ..errors import Fa4traceError


@cute.jit
def _branch(trace: cute.Tensor, traced: cutlass.Constexpr, plain: cutlass.Constexpr):
    if cta_records(trace):
        traced()
    else:
        plain()


@contextlib.contextmanager
def _allocations(anchor, shared: list, replay: bool):
    """SmemAllocator allocations emitted before ``anchor`` (first copy: ``shared`` collects
    them) or handed back from ``shared`` in order (second copy)."""
    from cutlass._mlir import ir
    from cutlass.memory.smem import SmemAllocator

    orig = SmemAllocator.__dict__["_smem_alloca"]
    taken = [0]

    def alloca(self, layout, dtype, byte_alignment, swizzle=None, struct_fields=None, **kwargs):
        key = (str(layout.type), str(dtype), int(byte_alignment), str(swizzle.type) if swizzle is not None else "",
               tuple(struct_fields or ()))
        if not replay:
            with ir.InsertionPoint(anchor):
                ptr = orig(self, layout, dtype, byte_alignment, swizzle, struct_fields,
                           **{k: v for k, v in kwargs.items() if k not in ("ip", "loc")})
            shared.append((key, ptr))
            return ptr
        i = taken[0]
        taken[0] += 1
        if i >= len(shared) or shared[i][0] != key:
            raise Fa4traceError("fa4trace: the kernel's two copies allocate shared memory differently "
                                "(compile with split=False)")
        return shared[i][1]

    SmemAllocator._smem_alloca = alloca
    try:
        yield
    finally:
        SmemAllocator._smem_alloca = orig
    if replay and taken[0] != len(shared):
        raise Fa4traceError("fa4trace: the kernel's two copies allocate shared memory differently "
                            "(compile with split=False)")


def split_by_cta(trace: cute.Tensor, traced: Callable[[], None], plain: Callable[[], None]):
    """``traced()`` in the CTAs that record, ``plain()`` in the others (see the module)."""
    from cutlass._mlir.dialects import arith

    anchor = arith.ConstantOp(Int32.mlir_type, 0).operation  # marks the point before the branch
    shared: list = []

    def first():
        with _allocations(anchor, shared, replay=False):
            traced()

    def second():
        with _allocations(anchor, shared, replay=True):
            plain()

    _branch(trace, first, second)
