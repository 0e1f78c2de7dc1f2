"""Experiment: a warp the kernel leaves idle records the pipelines' full-barrier completions.

The computing warps execute nothing for these events: the observer (one warp, after the
kernel's own body returns for it) waits on each stage's full mbarrier in turn (try_wait, which
suspends) and records the time each phase completes, until every other warp of the CTA has
reached the end of the kernel (a shared-memory count they raise at their exit).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from .. import layout as L


def alloc_done_counter():
    """4 bytes of static shared memory, zeroed by lane 0 of warp 0 (before the kernel's own
    initial CTA sync, which orders it before any warp's exit)."""
    ptr = cute.arch.alloc_smem(Int32, 4, alignment=16)
    t = cute.make_tensor(ptr, cute.make_layout(4))
    _zero(t)
    return t


@cute.jit
def _zero(t: cute.Tensor):
    if cute.arch.thread_idx()[0] == 0:
        t[0] = Int32(0)


@cute.jit
def arrive_done(t: cute.Tensor):
    if cute.arch.lane_idx() == 0:
        cute.arch.atomic_add(t.iterator, Int32(1))


@cute.jit
def observe(full_base: cute.Pointer, stages: cutlass.Constexpr, done: cute.Tensor, n_done: Int32,
            trace: cute.Tensor, records: Int32, cap: Int32, cursor0: Int32, tag: cutlass.Constexpr) -> Int32:
    """Record each completion of the ``stages`` full barriers in order; returns the cursor."""
    i = Int32(0)
    pos = cursor0
    while _volatile_load(done) < n_done:
        s = i % stages
        ph = (i // stages) & 1
        if cute.arch.mbarrier_try_wait(full_base + s, ph):
            t = cute.arch.clock64()
            if pos < cap:
                word = (Int64(t) & 0xFFFFFFFF) | (Int64(i & ((1 << L.PAYLOAD_BITS) - 1)) << L.PAYLOAD_SHIFT) | Int64(tag)
                trace[records + pos] = word
            pos = pos + 1
            i = i + 1
    return pos


def _volatile_load(t: cute.Tensor) -> Int32:
    from cutlass._mlir.dialects import llvm

    return Int32(llvm.inline_asm(Int32.mlir_type, [t.iterator.llvm_ptr], "ld.volatile.shared.u32 $0, [$1];",
                                 "=r,r", has_side_effects=True, is_align_stack=False,
                                 asm_dialect=llvm.AsmDialect.AD_ATT))


@cute.jit
def exit_hook(warp_obs: cutlass.Constexpr, full_base: cute.Pointer, stages: cutlass.Constexpr, done: cute.Tensor,
              n_done: cutlass.Constexpr, trace: cute.Tensor, records: Int32, cap: Int32, cursors: cute.Tensor,
              tag: cutlass.Constexpr):
    """At the kernel's end: the observer warp observes until the others are done; the others
    say they are done."""
    w = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    if w == warp_obs:
        c1 = observe(full_base, stages, done, Int32(n_done), trace, records, cap, Int32(cursors[w % 32]), tag)
        cursors[w % 32] = c1
    else:
        arrive_done(done)


def patch_creation(patches, created: list):
    """Every pipeline a kernel creates (``Cls.create``), in creation order, into ``created``."""
    from cutlass.pipeline import PipelineAsync

    from .families import _subclasses

    depth = [0]
    for cls in _subclasses(PipelineAsync):
        raw = vars(cls).get("create")
        if raw is None:
            continue
        fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw

        def make(fn=fn, kind=type(raw)):
            def create(*args, **kwargs):
                depth[0] += 1  # a subclass's create calling its parent's: one pipeline
                try:
                    obj = fn(*args, **kwargs)
                finally:
                    depth[0] -= 1
                if depth[0] == 0:
                    created.append(obj)
                return obj
            return kind(create) if kind in (staticmethod, classmethod) else create

        patches.set(cls, "create", make())
