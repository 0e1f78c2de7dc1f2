"""SegmentRecorder (the recorder the FA4 adapter uses): compiles on the CPU, places its stores
and timer reads, compiles to nothing without a buffer, and refuses events outside its region."""

from __future__ import annotations

import os

import pytest

cutlass = pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (pip install 'fa4trace[dsl]')")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cutlass.cute as cute  # noqa: E402
from cutlass import Int32  # noqa: E402
from cutlass.cute.runtime import make_fake_compact_tensor  # noqa: E402

from fa4trace.device import SegmentRecorder  # noqa: E402
from fa4trace.device.segment import Segment  # noqa: E402
from fa4trace.format import layout as L  # noqa: E402
from fa4trace.format.vocab import EV, ROLE  # noqa: E402


class _Hooked:
    """Stands in for library code: a loop the recorder is not carried through, and a method
    that a hook wraps with a segment (state kept on the object, as the FA4 adapter does)."""

    def __init__(self, nested: bool = False, cursor: str = "gmem", **ring):
        self.rec = None
        self.nested = nested
        self.cursor = cursor
        self.ring = ring  # ring= / ring_warps= of SegmentRecorder.start

    def step(self, out: cute.Tensor, i):
        seg = self.rec.open()
        seg.begin(EV.SOFTMAX, i)
        out[i] = out[i] * 2.0 + 1.0
        seg.end(EV.SOFTMAX, i)
        seg.close()

    def mark(self, i):  # a hook called from inside the library's dynamic if
        self.rec.current.instant(EV.MARK, i)

    @cute.jit
    def bad_step(self, out: cute.Tensor, i: Int32):
        rec = self.rec
        rec.open()
        if i > 3:  # a dynamic if: an event inside it cannot join the open segment
            self.mark(i)
        rec.current.close()


def _build(hooked: _Hooked):
    @cute.kernel
    def k(out: cute.Tensor, trace: cute.Tensor, n: Int32):
        # l2="last": decode attention's policy, as the FA4 adapter places it
        hooked.rec = SegmentRecorder.start(trace, role=ROLE.SOFTMAX, cursor=hooked.cursor, l2="last", **hooked.ring)
        for i in cutlass.range(n, unroll=1):
            if cutlass.const_expr(hooked.nested):
                hooked.bad_step(out, i)
            else:
                hooked.step(out, i)
        hooked.rec.finish()

    @cute.jit
    def launch(out: cute.Tensor, trace: cute.Tensor, n: Int32):
        k(out, trace, n).launch(grid=[2, 1, 1], block=[64, 1, 1])

    return launch


def _fake(dtype):
    return make_fake_compact_tensor(dtype, (cute.sym_int(),), assumed_align=16)


def _ptx(fn, *args):
    return cute.compile(fn, *args, options="--keep-ptx").__ptx__


def test_segment_recorder_compiles_and_stores_in_a_loop():
    ptx = _ptx(_build(_Hooked()), _fake(cutlass.Float32), _fake(cutlass.Int64), Int32(8))
    # start + finish read both timers; each segment reads clock64 twice (begin and end)
    assert ptx.count("%clock64") >= 4
    assert ptx.count("%globaltimer") >= 2  # start and finish anchors (NVVM may duplicate one)
    # the cursor is reloaded from the header word W_COUNTS inside the loop (no register
    # carries it) and stored back there; finish reads it once more
    counts = f"+{8 * L.W_COUNTS}]"
    loads = [ln for ln in ptx.splitlines() if "ld.global" in ln and counts in ln]
    stores = [ln for ln in ptx.splitlines() if "st.global" in ln and counts in ln]
    assert len(loads) == 2 and len(stores) == 3, (loads, stores)  # start, per segment, finish
    # two records per segment, each with its own bounds-checked store (L2 evict_last), besides
    # the header words (start 5, finish 3) and the cursor
    assert ptx.count("st.global.L2::cache_hint.b64") >= 2
    assert ptx.count("st.global.b64") >= 5 + 1 + 3


def test_segment_recorder_off_compiles_to_nothing():
    h = _Hooked()

    @cute.kernel
    def k(out: cute.Tensor, n: Int32):
        h.rec = SegmentRecorder.start(None, role=ROLE.SOFTMAX)
        for i in cutlass.range(n, unroll=1):
            h.step(out, i)
        h.rec.finish()

    @cute.kernel
    def plain(out: cute.Tensor, n: Int32):
        for i in cutlass.range(n, unroll=1):
            out[i] = out[i] * 2.0 + 1.0

    @cute.jit
    def la(out: cute.Tensor, n: Int32):
        k(out, n).launch(grid=[1, 1, 1], block=[32, 1, 1])

    @cute.jit
    def lb(out: cute.Tensor, n: Int32):
        plain(out, n).launch(grid=[1, 1, 1], block=[32, 1, 1])

    pa = _ptx(la, _fake(cutlass.Float32), Int32(8))
    pb = _ptx(lb, _fake(cutlass.Float32), Int32(8))
    body = lambda p: [ln for ln in p.splitlines() if ln.startswith("\t") and "kernel" not in ln]  # noqa: E731
    assert "%clock64" not in pa and "%globaltimer" not in pa
    assert body(pa) == body(pb)


def test_event_outside_the_segment_region_fails_the_compile():
    with pytest.raises(Exception, match="another region"):
        _ptx(_build(_Hooked(nested=True)), _fake(cutlass.Float32), _fake(cutlass.Int64), Int32(8))


def test_smem_cursor_keeps_the_cursor_out_of_global_memory():
    ptx = _ptx(_build(_Hooked(cursor="smem")), _fake(cutlass.Float32), _fake(cutlass.Int64), Int32(8))
    counts = f"+{8 * L.W_COUNTS}]"
    g_loads = [ln for ln in ptx.splitlines() if "ld.global" in ln and counts in ln]
    g_stores = [ln for ln in ptx.splitlines() if "st.global" in ln and counts in ln]
    assert g_loads == [] and len(g_stores) == 1, (g_loads, g_stores)  # only finish writes the counts
    assert ".shared .align 16 .b8 __static_shmem" in ptx
    # (here the compiler may even keep the cursor in a register across the loop: nothing else
    # touches that shared word; in FA4 its barriers keep the shared-memory loads)
    assert "st.shared" in ptx
    with pytest.raises(ValueError, match="cursor"):
        SegmentRecorder.start(_fake(cutlass.Int64), cursor="regs")


class _Adjacent(_Hooked):
    """Events with nothing of the kernel between them, and one after a kernel op."""

    def step(self, out: cute.Tensor, i):
        seg = self.rec.open()
        seg.begin(EV.SOFTMAX, i)  # reads the timer
        out[i] = out[i] * 2.0 + 1.0
        seg.end(EV.SOFTMAX, i)  # after a kernel op: reads
        seg.begin(EV.CORRECTION, i)  # right after the end: shares its read
        seg.end(EV.CORRECTION, i)  # a span around nothing: shares
        seg.close()
        seg = self.rec.open()
        seg.instant(EV.MARK, i)  # only the recorder's close and open between: shares
        out[i] = out[i] + 1.0
        seg.instant(EV.MARK, i)  # after a kernel op: reads
        seg.close()


def _clock_reads(hooked, monkeypatch, share: bool) -> tuple:
    monkeypatch.setattr(SegmentRecorder, "share_timer", share)
    ptx = _ptx(_build(hooked), _fake(cutlass.Float32), _fake(cutlass.Int64), Int32(8))
    return ptx.count("%clock64"), ptx.count("st.global.L2::cache_hint.b64")


def test_adjacent_events_share_one_timer_read(monkeypatch):
    reads, records = _clock_reads(_Adjacent(cursor="smem"), monkeypatch, True)
    reads_off, records_off = _clock_reads(_Adjacent(cursor="smem"), monkeypatch, False)
    # six events per loop trip: three read the timer, three reuse a read (same records stored)
    assert reads_off - reads == 3 and records == records_off == 6, (reads, reads_off, records)


def test_an_event_after_a_kernel_op_reads_the_timer(monkeypatch):
    # begin, kernel op, end: both events read, sharing on or off
    on = _clock_reads(_Hooked(cursor="smem"), monkeypatch, True)
    off = _clock_reads(_Hooked(cursor="smem"), monkeypatch, False)
    assert on == off and on[1] == 2


def _loop(ptx: str) -> list:
    """The lines of the kernel's loop: from the label its back edge jumps to, to that branch."""
    lines = ptx[ptx.index(".entry"):].splitlines()
    pragma = next(i for i, ln in enumerate(lines) if '.pragma "nounroll"' in ln)  # the loop's first line
    label = lines[pragma - 1].rstrip(":")
    back = next(i for i in range(pragma, len(lines)) if lines[i].strip().endswith(f"bra \t{label};")
                or lines[i].split()[-1:] == [f"{label};"])
    return lines[pragma:back + 1]


def test_ring_stores_each_record_into_shared_memory_and_copies_at_exit():
    """cursor="ring": in the loop each record is one st.shared.b64 at (cursor + j) & (R - 1), with
    no global store and no bounds branch (the loop's only branch is its back edge); the records
    reach global memory once, in the copy after bar.warp.sync at finish. The smem cursor's loop,
    for contrast, stores each record to global memory behind its own bounds branch."""
    args = (_fake(cutlass.Float32), _fake(cutlass.Int64), Int32(8))
    ring = _ptx(_build(_Hooked(cursor="ring", ring=64, ring_warps=2)), *args)
    loop = _loop(ring)
    assert sum("st.shared.b64" in ln for ln in loop) == 2  # begin and end of the segment
    assert sum("and.b32" in ln for ln in loop) == 2  # (cursor + j) & 63 (in bytes: & 504, or the compiler's twin)
    assert not any("st.global" in ln and "[%rd" in ln and ".b64" in ln for ln in loop), loop
    assert sum(" bra" in ln for ln in loop) == 1
    # the ring (2 warps x 64 records x 8 B) and the cursors, statically
    assert ".shared .align 16 .b8 __static_shmem__1[1024];" in ring and "__static_shmem__0[128];" in ring
    exit_ = ring[ring.index("bar.warp.sync"):]
    assert "activemask.b32" in ring[:ring.index("bar.warp.sync")]
    assert ring.count("st.global.L2::cache_hint.b64") == exit_.count("st.global.L2::cache_hint.b64") == 1
    assert "ld.shared.b64" in exit_
    smem_loop = _loop(_ptx(_build(_Hooked(cursor="smem")), *args))
    assert sum("st.global.L2::cache_hint" in ln for ln in smem_loop) == 2
    assert sum(" bra" in ln for ln in smem_loop) > 1


def test_ring_sizes_are_checked_in_one_line():
    t = _fake(cutlass.Int64)
    for kw, match in (({"ring": 100}, "ring must be a power of two"),
                      ({"ring": 256}, "needs 65664 B of static shared memory"),  # 32 warps: more than 48 KB
                      ({"ring": 64, "ring_warps": 33}, "ring_warps must be 1..32")):
        with pytest.raises(ValueError, match=match) as exc:
            SegmentRecorder.start(t, cursor="ring", **kw)
        assert "\n" not in str(exc.value)



class _SpanAndInstant(_Hooked):
    """One span around a kernel op, then an instant after another: three timer reads a trip."""

    def step(self, out: cute.Tensor, i):
        super().step(out, i)
        out[i] = out[i] + 1.0
        seg = self.rec.open()
        seg.instant(EV.MARK, i)
        seg.close()


def _fa4_cost_parts():
    """benchmarks/fa4_cost_parts.py, whose ``ablated`` builds the recorder with timer reads taken out."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "fa4_cost_parts.py"
    spec = importlib.util.spec_from_file_location("benchmarks_fa4_cost_parts", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("ablation, reads", [(None, 3), ("no-timer", 0), ("no-timer-instants", 2),
                                             ("no-timer-spans", 1)])
def test_ablations_take_out_the_timer_reads_they_name_and_keep_every_record(ablation, reads):
    """benchmarks/fa4_cost_parts.py's ``ablated``: the loop reads the timer only for the records
    the ablation leaves timed, and stores all three records either way; after the block the
    recorder is the product's again."""
    bench = _fa4_cost_parts()
    shipped = [(owner, name, getattr(owner, name)) for owner, name in
               ((SegmentRecorder, "read_timer"), (Segment, "begin"), (Segment, "end"), (Segment, "instant"))]
    with bench.ablated(ablation):
        loop = _loop(_ptx(_build(_SpanAndInstant(cursor="smem")), _fake(cutlass.Float32), _fake(cutlass.Int64),
                          Int32(8)))
    assert all(getattr(owner, name) is method for owner, name, method in shipped)
    assert sum("%clock64" in ln for ln in loop) == reads
    assert sum("st.global.L2::cache_hint.b64" in ln for ln in loop) == 3
