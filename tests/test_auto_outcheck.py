"""The record-time output check on the memory a kernel's arguments cover (no GPU: Python
functions stand in for the plain and traced kernels, on CPU tensors)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fa4trace.auto.outcheck import OutputCheck, named_tensors, regions  # noqa: E402


def test_bitwise_equality_counts_nan_payloads_and_signed_zeros():
    a = torch.tensor([float("nan"), 1.0, -0.0])
    (ra,) = regions([("a", a)])
    assert ra.bytes.numel() == 12 and torch.equal(ra.bytes, regions([("b", a.clone())])[0].bytes)
    z, nz = regions([("z", torch.tensor([0.0]))])[0], regions([("nz", torch.tensor([-0.0]))])[0]
    assert not torch.equal(z.bytes, nz.bytes)


def test_a_broadcast_gradient_is_checked_without_writing_through_its_overlap():
    """The expanded gradient of a mean-reduced loss (stride 0) is one element many times: the
    check sees its one element, and the kernel's real output is checked and kept."""
    dloss = (torch.ones((), requires_grad=False) / 64).expand(64)
    assert dloss.stride() == (0,)
    x = torch.randn(64, 32)
    dx = torch.empty_like(x)
    rs = regions(named_tensors((x, dloss, dx), {}, ["x", "dloss", "dx"]))
    assert [r.names for r in rs] == [["x"], ["dloss"], ["dx"]]
    assert rs[1].bytes.numel() == 4  # one float

    def kernel():
        dx.copy_(x * dloss[:, None])

    oc = OutputCheck(named_tensors((x, dloss, dx), {}, ["x", "dloss", "dx"]))
    oc.plain_twice(lambda i: kernel())
    assert not oc.nondeterministic
    kernel()  # the "traced" launch
    assert oc.compare() == []
    assert torch.equal(dx, x * dloss[:, None])


def test_overlapping_views_of_one_buffer_are_one_region_and_gaps_stay_out():
    base = torch.zeros(100)
    q, k = base[0:40], base[20:60]  # overlap
    v = base[80:90]  # same storage, apart
    rs = regions([("q", q), ("k", k), ("v", v)])
    assert [r.names for r in rs] == [["q", "k"], ["v"]]
    assert [r.bytes.numel() for r in rs] == [60 * 4, 10 * 4]
    rs[1].bytes.fill_(0xFF)
    assert torch.isnan(base[80:90]).all() and not torch.isnan(base[60:80]).any()


def test_strided_views_cover_their_span_only():
    m = torch.arange(48.0).reshape(6, 8)
    col = m[1:4, 2]  # elements 10, 18, 26
    (r,) = regions([("col", col)])
    assert r.bytes.numel() == (26 - 10 + 1) * 4
    assert r.bytes.view(torch.float32)[0] == 10.0 and r.bytes.view(torch.float32)[-1] == 26.0


def test_empty_tensors_cover_nothing():
    assert regions([("e", torch.empty(0)), ("e2", torch.empty(3, 0))]) == []


def test_only_memory_a_plain_run_changed_is_written_back():
    x = torch.randn(16)
    out = torch.zeros(16)
    oc = OutputCheck([("x", x), ("out", out)])
    oc.plain_twice(lambda i: out.copy_(x * 2))
    assert oc.written == ["out", "out"]  # put back after each plain run; x was never written
    assert torch.equal(out, torch.zeros(16))
    out.copy_(x * 2)
    assert oc.compare() == [] and oc.written == ["out", "out"]


def test_two_plain_runs_that_differ_name_the_argument_and_it_is_not_compared():
    x = torch.randn(8)
    acc = torch.zeros(8)
    out = torch.zeros(8)
    calls = iter(range(10))

    def kernel(i):
        acc.copy_(x + next(calls))  # differs run to run: an atomic accumulator
        out.copy_(x * 3)

    oc = OutputCheck([("x", x), ("dq_accum", acc), ("out", out)])
    oc.plain_twice(kernel)
    assert oc.nondeterministic == {"dq_accum"}
    kernel(2)
    assert oc.compare() == []


def test_a_traced_launch_that_differs_is_named_and_the_plain_result_kept():
    x = torch.randn(8)
    out = torch.zeros(8)
    oc = OutputCheck([("x", x), ("out", out)])
    oc.plain_twice(lambda i: out.copy_(x * 3))
    out.copy_(x * 3)
    out[2] += 1  # the traced kernel got one element wrong
    assert oc.compare() == ["out"]
    assert torch.equal(out, x * 3)


def test_autograd_outputs_are_written_without_bumping_their_version():
    """Writing back through the byte view leaves autograd's version counters alone (a view of
    an autograd output modified in place would otherwise fail backward)."""
    w = torch.randn(8, requires_grad=True)
    y = w * 2
    v0 = y._version
    oc = OutputCheck([("y", y)])
    oc.plain_twice(lambda i: y.data.mul_(1.5))
    assert y._version == v0
    assert torch.equal(y, w.detach() * 2)


def test_trace_tensor_is_made_on_the_device_and_equals_the_host_buffer():
    from fa4trace.format.layout import BufferSpec
    from fa4trace.run.record import new_trace_tensor

    for spec in (BufferSpec.for_grid(7, 4, 16), BufferSpec.for_grid(40, 12, 8, cta_first=3, cta_stride=2,
                                                                     warps=[0, 4, 8, 31 % 12])):
        t = new_trace_tensor(spec, device="cpu")
        assert t.dtype == torch.int64 and np.array_equal(t.numpy().view(np.uint64), spec.new_buffer())


def _accumulating():
    """An input, an output a kernel accumulates into (out += x), and that kernel."""
    x = torch.arange(8.0)
    out = torch.full((8,), 100.0)
    return x, out, lambda: out.add_(x)


def test_snapshot_and_put_back_undo_extra_launches_of_an_accumulating_kernel():
    """After the checked launch, more launches on the same arguments (the plain-twin timing)
    accumulate again; put_back leaves exactly one launch's result, and touches no input."""
    x, out, kernel = _accumulating()
    oc = OutputCheck([("x", x), ("out", out)])
    oc.plain_twice(lambda i: kernel())
    kernel()  # the traced launch
    assert oc.compare() == []
    snap = oc.snapshot()
    assert snap[1] is oc.want[1]  # the plain result the memory holds: no copy made
    for _ in range(5):
        kernel()
    assert oc.put_back(snap) == ["out"]
    assert torch.equal(out, 100.0 + x) and torch.equal(x, torch.arange(8.0))
    assert oc.put_back(snap) == []  # nothing differs: nothing written


def test_snapshot_copies_what_the_check_does_not_know():
    """Without plain runs (check off) or where two plain runs disagree, the snapshot is a copy
    of the bytes as they are: put_back restores the traced launch's own result."""
    x, out, kernel = _accumulating()
    oc = OutputCheck([("x", x), ("out", out)])
    kernel()
    snap = oc.snapshot()
    assert snap[1] is not None and snap[1].data_ptr() != oc.regions[1].bytes.data_ptr()
    kernel()
    kernel()
    oc.put_back(snap)
    assert torch.equal(out, 100.0 + x)


def test_rerun_replays_from_the_bytes_before_the_launch_and_checks_it():
    """A pass replays the launch from the memory the arguments held before it (an
    accumulating kernel adds once, not twice) and is compared with the plain result."""
    x, out, kernel = _accumulating()
    oc = OutputCheck([("x", x), ("out", out)])
    oc.plain_twice(lambda i: kernel())
    kernel()
    assert oc.compare() == []
    seen = []
    assert oc.rerun(lambda: (kernel(), seen.append(out.clone()))) == []
    assert torch.equal(seen[0], 100.0 + x)  # from 100, not from 100 + x
    assert oc.rerun(lambda: out.add_(x * 2)) == ["out"]  # a pass that computed something else
    assert torch.equal(out, 100.0 + x)  # the plain result put back
