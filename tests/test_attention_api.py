"""CPU tests of fa4trace.attention: argument validation, the split-KV plan, the reference."""

import math

import pytest

torch = pytest.importorskip("torch")

from fa4trace import attention as A  # noqa: E402
from fa4trace.kernels import decode_spec as S  # noqa: E402


def _qkv(b=1, sq=1, hq=16, hkv=1, sk=100, d=128, dtype=torch.bfloat16):
    return (torch.randn(b, sq, hq, d, dtype=dtype), torch.randn(b, sk, hkv, d, dtype=dtype),
            torch.randn(b, sk, hkv, d, dtype=dtype))


def _err(fn, *a, **kw) -> str:
    with pytest.raises(ValueError) as ei:
        fn(*a, **kw)
    msg = str(ei.value)
    assert "\n" not in msg, "validation errors are one line"
    return msg


@pytest.mark.parametrize("mutate, needle", [
    (lambda q, k, v: (q.float(), k, v), "q must be bfloat16 or float16"),
    (lambda q, k, v: (q, k.half(), v), "k dtype"),
    (lambda q, k, v: (q, k, v.half()), "v dtype"),
    (lambda q, k, v: (q[0], k, v), "q must be 4-D"),
    (lambda q, k, v: (q, k[..., :64].contiguous(), v[..., :64].contiguous()), "k head dim 64 differs"),
    (lambda q, k, v: (q[..., :96].contiguous(), k[..., :96].contiguous(), v[..., :96].contiguous()), "q head dim"),
    (lambda q, k, v: (q, k, v[:, :50].contiguous()), "v shape"),
    (lambda q, k, v: (q.expand(2, -1, -1, -1).contiguous(), k, v), "k batch"),
    (lambda q, k, v: (q.expand(-1, 9, -1, -1).contiguous(), k, v), "q sequence length"),
    (lambda q, k, v: (q, k[:, :0], v[:, :0]), "k sequence length"),
    (lambda q, k, v: (q[:, :, :15].contiguous(), torch.cat([k, k], 2), torch.cat([v, v], 2)),
     "multiple of k heads"),
    (lambda q, k, v: (torch.cat([q, q], 2), k, v), "must be <= 16"),
    (lambda q, k, v: ("q", k, v), "q must be a torch.Tensor"),
])
def test_bad_arguments_name_the_argument(mutate, needle):
    q, k, v = mutate(*_qkv())
    assert needle in _err(A.decode_attention, q, k, v)


def test_cpu_tensors_are_refused_before_any_gpu_work():
    q, k, v = _qkv()
    assert "q must be a CUDA tensor" in _err(A.decode_attention, q, k, v)


def test_non_contiguous_is_refused():
    q, k, v = _qkv(sk=64)
    kt = torch.randn(1, 128, 1, 128, dtype=k.dtype)[:, ::2]  # same shape, every other key
    assert kt.shape == k.shape and not kt.is_contiguous()
    assert "k must be contiguous" in _err(A.validate, q, kt, v, require_cuda=False)


@pytest.mark.parametrize("kw, needle", [
    ({"schedule": "fa3"}, "schedule must be one of"),
    ({"num_splits": 0}, "num_splits"),
    ({"num_splits": 2.0}, "num_splits"),
    ({"num_splits": True}, "num_splits"),
    ({"softmax_scale": -1.0}, "softmax_scale"),
    ({"softmax_scale": float("nan")}, "softmax_scale"),
    ({"trace": torch.zeros(8, dtype=torch.int32)}, "trace must be a 1-D int64"),
])
def test_bad_options(kw, needle):
    q, k, v = _qkv()
    assert needle in _err(A.validate, q, k, v, require_cuda=False, **kw)


def test_unknown_event_set_is_refused_before_any_gpu_work():
    q, k, v = _qkv()
    assert "trace_events must be one of core, stalls" in _err(A.decode_attention, q, k, v, trace_events="all")
    assert "trace_events must be one of core, stalls" in _err(A.decode_attention, q, k, v, trace_events="QK,NOPE")


def test_valid_shapes_pass():
    for d in (64, 128):
        for sq, hq, hkv in ((1, 16, 1), (8, 16, 2), (3, 12, 3), (1, 4, 4)):
            s = A.validate(*_qkv(2, sq, hq, hkv, 7, d, torch.float16), require_cuda=False)
            assert (s.d, s.ratio, s.dtype) == (d, hq // hkv, "fp16")


SHAPES = [A.Shape(b, sq, hq, hkv, sk, d, "bf16")
          for d in (64, 128) for (hq, hkv) in ((16, 1), (16, 2), (8, 8), (12, 3))
          for sk in (1, 77, 4096, 131072) for b in (1, 8, 32) for sq in (1, 4, 8)]


@pytest.mark.parametrize("tile_n", [64, 128])
def test_default_plan_fills_the_sms_and_is_deadlock_free(tile_n):
    for s in SHAPES:
        p = A.plan_splits(s, tile_n, 132)
        assert 1 <= p.n_splits <= p.n_blocks
        if A.groups(s) <= 132:
            assert p.n_ctas <= 132, (s, p)
        if p.n_splits > 1:
            assert 1 <= p.n_comb <= p.n_splits
            assert A.groups(s) * (p.n_comb - 1) < 132, (s, p)
        # With enough KV blocks, the default uses at least ~90% of the SMs when groups are few.
        if A.groups(s) <= 66 and p.n_blocks >= 132:
            assert p.n_ctas >= 0.9 * 132 * (132 // A.groups(s) * A.groups(s)) / 132 - 1e-9


def test_default_block_rows_follow_the_packed_rows():
    assert A.default_block_rows(A.Shape(1, 1, 16, 1, 100, 128, "bf16")) == 32  # 16 rows
    assert A.default_block_rows(A.Shape(1, 2, 16, 1, 100, 128, "bf16")) == 32  # 32 rows
    assert A.default_block_rows(A.Shape(1, 4, 16, 1, 100, 128, "bf16")) == 64  # 64 rows
    assert A.default_block_rows(A.Shape(1, 3, 16, 1, 100, 128, "bf16")) == 64  # 48: one CTA, not two


def test_explicit_splits_are_clamped_to_the_blocks():
    s = A.Shape(1, 1, 16, 1, 1000, 128, "bf16")
    assert A.plan_splits(s, 128, 132, num_splits=1000).n_splits == 8
    assert A.plan_splits(A.Shape(1, 1, 16, 1, 10**6, 128, "bf16"), 64, 132, num_splits=1000).n_splits == S.MAX_SPLITS
    assert A.plan_splits(s, 64, 132, num_splits=3).n_splits == 3
    # many groups forced to many splits: combiners stay below the deadlock bound
    big = A.Shape(32, 1, 16, 2, 131072, 128, "bf16")
    p = A.plan_splits(big, 64, 132, num_splits=64)
    assert A.groups(big) * (p.n_comb - 1) < 132


def _simulate_combine(shape, plan):
    """The kernel's combine work split (thread t = ((r * P) + p) * NC4 + c4; items = (row
    block, column chunk) striped over combiners; partition p sums splits p + i*P for
    i < COMBINE_UNROLL), replayed in Python: which splits each output element sums."""
    covered = {}
    rows_total = shape.sq * shape.ratio
    nc4, parts = plan.comb_nc4, plan.comb_parts
    group = nc4 * parts
    rows_par = 128 // group
    col_chunks = shape.d // 4 // nc4
    br = plan.block_rows
    for m_block in range(plan.grid[0] // shape.hkv):
        rows_here = min(rows_total - m_block * br, br)
        n_items = -(-rows_here // rows_par) * col_chunks
        for comb in range(plan.n_comb):
            for item in range(comb, n_items, plan.n_comb):
                cc = item % col_chunks
                for tidx in range(128):
                    c4 = tidx % nc4
                    p = (tidx // nc4) % parts
                    rr = tidx // group
                    row = (item // col_chunks) * rows_par + rr
                    if row >= rows_here:
                        continue
                    col = (cc * nc4 + c4) * 4
                    for i in range(S.COMBINE_UNROLL):
                        s = p + i * parts
                        if s < plan.n_splits:
                            for j in range(4):
                                covered.setdefault((m_block, row, col + j), []).append(s)
    return covered


@pytest.mark.parametrize("shape", [A.Shape(1, 1, 16, 1, 131072, 128, "bf16"),
                                   A.Shape(1, 8, 16, 1, 65537, 64, "bf16"),
                                   A.Shape(32, 1, 16, 2, 4096, 128, "bf16"),
                                   A.Shape(2, 5, 12, 3, 1000, 64, "bf16"),
                                   A.Shape(1, 6, 28, 2, 4097, 128, "bf16")])
@pytest.mark.parametrize("block_rows", [64, 32])
def test_combine_covers_every_output_once_with_every_split(shape, block_rows):
    for splits in (None, 2, 3, 17, 100, 256):
        plan = A.plan_splits(shape, 64, 132, splits, block_rows=block_rows)
        if plan.n_splits == 1:
            continue
        assert plan.comb_nc4 * plan.comb_parts <= 128 and (shape.d // 4) % plan.comb_nc4 == 0
        assert plan.n_splits <= S.COMBINE_UNROLL * plan.comb_parts
        cov = _simulate_combine(shape, plan)
        rows_total = shape.sq * shape.ratio
        m_blocks = -(-rows_total // block_rows)
        assert plan.grid[0] == m_blocks * shape.hkv and plan.groups == m_blocks * shape.hkv * shape.b
        want = {(mb, r, c) for mb in range(m_blocks) for r in range(min(block_rows, rows_total - block_rows * mb))
                for c in range(shape.d)}
        assert set(cov) == want
        for key, ss in cov.items():
            assert sorted(ss) == list(range(plan.n_splits)), key


def test_kernel_args_follow_the_plan():
    for s in SHAPES[::7]:
        p = A.plan_splits(s, 64, 132)
        args = p.kernel_args(0.5)
        assert args[:3] == (0.5, p.n_splits, p.n_comb)
        assert (1 << args[3], 1 << args[4]) == (p.comb_nc4, p.comb_parts)


def test_trace_capacity_holds_a_split():
    s = A.Shape(1, 1, 16, 1, 131072, 128, "bf16")
    p = A.plan_splits(s, 64, 132)
    blocks = -(-p.n_blocks // p.n_splits)
    assert A.trace_capacity(p) >= 12 * blocks + 8
    assert A.trace_capacity(p) % 32 == 0


def test_reference_groups_heads_like_repeat_interleave():
    torch.manual_seed(0)
    q, k, v = _qkv(2, 3, 8, 2, 50, 64, torch.float32)
    o, lse = A.reference(q, k, v, 0.3, max_elems=2000)  # forces batch chunks
    qf, kf, vf = (t.permute(0, 2, 1, 3) for t in (q, k, v))
    kf = kf.repeat_interleave(4, dim=1)
    vf = vf.repeat_interleave(4, dim=1)
    s = qf @ kf.transpose(-1, -2) * 0.3
    want = (torch.softmax(s, -1) @ vf).permute(0, 2, 1, 3)
    assert torch.allclose(o, want, atol=1e-5)
    assert torch.allclose(lse, torch.logsumexp(s, -1), atol=1e-5)
    assert A.rel_error(o, want) < 1e-6
    assert math.isnan(A.rel_error(o * float("nan"), want))


def test_io_bytes():
    s = A.Shape(1, 1, 16, 1, 131072, 128, "bf16")
    assert s.kv_bytes() == 64 * 2**20
    assert s.io_bytes() == 64 * 2**20 + 2 * 16 * 128 * 2


@pytest.mark.parametrize("kw, needle", [
    ({"hq": 0}, "q heads must be >= 1"),
    ({"hkv": 0}, "k heads must be >= 1"),
    ({"hq": 12, "hkv": 5}, "q heads (12) must be a multiple of k heads (5)"),
    ({"sq": 9}, "q sequence length (dim 1) must be 1..8"),
    ({"d": 96}, "q head dim must be one of 64, 128"),
])
def test_size_rules_name_the_size(kw, needle):
    sizes = {"b": 1, "sq": 1, "hq": 16, "hkv": 1, "sk": 100, "d": 128, **kw}
    assert needle in A.shape_problem(**sizes)
    assert A.shape_problem(b=1, sq=1, hq=16, hkv=1, sk=100, d=128) is None
    # FA4 has its own head dims and lengths: only the general rules apply to it
    assert A.shape_problem(b=1, sq=9, hq=16, hkv=1, sk=100, d=96, ours=False) is None


