"""CTAs that do not record run an untouched copy of the kernel body.

A traced kernel's body is traced twice under one CTA-uniform branch at its top: the CTAs the
trace buffer selects (``cta_records``) run the instrumented body, every other CTA runs the
body as the kernel's authors wrote it, with not one instruction of fa4trace in it. A launch
that records a sample of CTAs then costs the others nothing (their code is the plain
kernel's), and the recorded CTAs run among neighbours at full speed.

Shared memory: both copies must use the same bytes, not twice as many. Every allocation the
first copy's body makes (``SmemAllocator``, ``cute.arch.alloc_smem``) is emitted before the
branch (allocations are typed and static, they take no operand), and the second copy's
allocations, one for one in the same order and type, get the first copy's pointers back.
The recorder's own allocation (its cursor, or its cursors and rings with cursor="ring") is
made before the body's are taken over, so it stays in the instrumented copy: the plain copy
never touches it. Static shared memory belongs to the kernel, though, so every CTA of the
launch holds those bytes (a ring build's occupancy is that of its whole footprint).

State: each copy is traced from the same starting point. It gets fresh wrappers of the
kernel's arguments, and a kernel object's attributes are put back before the second copy.

Costs: each CTA reads two words of the buffer's header before it branches; the compile traces
and assembles the body twice. Inline PTX that declares names at function scope cannot appear
twice (ptxas: "Duplicate definition"), nor can traced state a body keeps where no copy has its
own (a module global: "does not dominate"); ``compile_traced`` then compiles one body.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from ..device.slot import cta_records
from ..format.errors import Fa4traceError
from .patches import Patches


@cute.jit
def _branch(trace: cute.Tensor, traced: cutlass.Constexpr, plain: cutlass.Constexpr, top: cutlass.Constexpr):
    selected = cta_records(trace)
    top()
    if selected:
        traced()
    else:
        plain()


def _differ():
    return Fa4traceError("fa4trace: the kernel's two copies allocate shared memory differently "
                         "(compile with split=False)")


@contextlib.contextmanager
def _allocations(anchor, shared: list, replay: bool):
    """Shared-memory allocations emitted before ``anchor`` (first copy: ``shared`` collects
    them) or handed back from ``shared`` in order (second copy)."""
    from cutlass._mlir import ir
    from cutlass.memory.smem import SmemAllocator

    taken = [0]

    def hoisted(orig, key_of):
        def alloc(*args, **kwargs):
            key = key_of(*args, **kwargs)
            if not replay:
                with ir.InsertionPoint(anchor):
                    ptr = orig(*args, **{k: v for k, v in kwargs.items() if k not in ("ip", "loc")})
                shared.append((key, ptr))
                return ptr
            i = taken[0]
            taken[0] += 1
            if i >= len(shared) or shared[i][0] != key:
                raise _differ()
            return shared[i][1]

        return alloc

    def allocator_key(_self, layout, dtype, byte_alignment, swizzle=None, struct_fields=None, **_kw):
        return ("SmemAllocator", str(layout.type), str(dtype), int(byte_alignment),
                str(swizzle.type) if swizzle is not None else "", tuple(struct_fields or ()))

    def static_key(element_type, size_in_elems, alignment=None, **_kw):
        return ("alloc_smem", str(element_type), int(size_in_elems), alignment)

    patches = Patches()
    patches.set(SmemAllocator, "_smem_alloca", hoisted(SmemAllocator.__dict__["_smem_alloca"], allocator_key))
    real = cute.arch.alloc_smem
    patches.set_everywhere({id(real): (real, hoisted(real, static_key))})
    try:
        yield
    finally:
        patches.restore()
    if replay and taken[0] != len(shared):
        raise _differ()


def _fresh(arg):
    """A new wrapper over the same kernel-parameter values: what one copy of the body does to
    it (``tiled_mma.set(ACCUMULATE, ...)`` rebinds the atom's value) stays in that copy."""
    extract = getattr(arg, "__extract_mlir_values__", None)
    rebuild = getattr(arg, "__new_from_mlir_values__", None)
    if isinstance(arg, type) or extract is None or rebuild is None:
        return arg
    return rebuild(extract())


def split_by_cta(trace: cute.Tensor, body: Callable, args: list, *, before: Callable[[], None],
                 after: Callable[[], None], method: bool = False, top: Callable[[], None] = lambda: None):
    """In the CTAs that record: ``before()``, ``body(*args)``, ``after()``; in the others
    ``body(*args)`` alone (see the module). What ``before`` / ``after`` allocate is theirs
    alone. Each copy gets its own wrappers of the arguments, and with ``method`` (args[0] is the
    kernel's object) the second copy starts from the object's attributes as they were before
    the first: state one copy leaves behind would not dominate the other's uses. ``top()``
    runs in every CTA once the selection's header loads are issued, before the branch (the
    CTA-lifetime start stamp)."""
    from cutlass._mlir.dialects import arith

    anchor = arith.ConstantOp(Int32.mlir_type, 0).operation  # marks the point before the branch
    shared: list = []
    owner = args[0] if method else None
    saved = dict(vars(owner)) if owner is not None and hasattr(owner, "__dict__") else None

    def own_args():
        return [a if (owner is not None and i == 0) else _fresh(a) for i, a in enumerate(args)]

    def traced():
        before()
        with _allocations(anchor, shared, replay=False):
            body(*own_args())
        after()

    def plain():
        if saved is not None:
            vars(owner).clear()
            vars(owner).update(saved)
        with _allocations(anchor, shared, replay=True):
            body(*own_args())

    _branch(trace, traced, plain, top)
