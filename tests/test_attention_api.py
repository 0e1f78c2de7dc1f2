"""CPU tests of fa4trace.attention: argument validation, the split-KV plan, the reference."""

import math

import pytest

torch = pytest.importorskip("torch")

from fa4trace import attention as A  # noqa: E402


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


def test_trace_event_sets():
    """"core" is the issue's vocabulary; "stalls" adds the consumer's K/V waits, nothing else."""
    from fa4trace.vocab import VOCAB

    core = {VOCAB.event(i).name for i in A.trace_event_ids("core")}
    stalls = {VOCAB.event(i).name for i in A.trace_event_ids("stalls")}
    assert {"LOAD_Q", "LOAD_K", "LOAD_V", "QK", "PV", "SOFTMAX", "CORRECTION", "EPILOGUE", "COMBINE"} <= core
    assert not core & {"WAIT_K", "WAIT_V"}
    assert stalls - core == {"WAIT_K", "WAIT_V"}
    # what a recorded bundle lists as compiled in, for the named sets and an experiment's list
    assert A._event_names("core") == list(A.CORE_EVENTS)
    assert A._event_names("PV,QK") == ["QK", "PV"]


def test_unknown_event_set_is_refused_before_any_gpu_work():
    q, k, v = _qkv()
    assert "trace_events must be one of core, stalls" in _err(A.decode_attention, q, k, v, trace_events="all")
    assert "trace_events must be one of core, stalls" in _err(A.decode_attention, q, k, v, trace_events="QK,NOPE")
    # experiment builds: a comma list of event names, or none
    assert A.trace_event_ids("none") == frozenset()
    assert A.trace_event_ids("QK,PV") == A.trace_event_ids("PV,QK") and len(A.trace_event_ids("QK,PV")) == 2


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
        if s.groups() <= 132:
            assert p.n_ctas <= 132, (s, p)
        if p.n_splits > 1:
            assert 1 <= p.n_comb <= p.n_splits
            assert s.groups() * (p.n_comb - 1) < 132, (s, p)
        # With enough KV blocks, the default uses at least ~90% of the SMs when groups are few.
        if s.groups() <= 66 and p.n_blocks >= 132:
            assert p.n_ctas >= 0.9 * 132 * (132 // s.groups() * s.groups()) / 132 - 1e-9


def test_two_ctas_per_sm_fill_twice_the_sms_and_stay_deadlock_free():
    for s in SHAPES:
        p1 = A.plan_splits(s, 64, 132)
        p2 = A.plan_splits(s, 64, 132, ctas_per_sm=2)
        assert p2.n_splits >= p1.n_splits
        if s.groups() <= 264:
            assert p2.n_ctas <= 264, (s, p2)
        if p2.n_splits > 1:
            # the bound counts SMs, not CTA slots: it holds if the GPU runs only one CTA per SM
            assert s.groups() * (p2.n_comb - 1) < 132, (s, p2)


def test_default_block_rows_follow_the_packed_rows():
    assert A.default_block_rows(A.Shape(1, 1, 16, 1, 100, 128, "bf16")) == 32  # 16 rows
    assert A.default_block_rows(A.Shape(1, 2, 16, 1, 100, 128, "bf16")) == 32  # 32 rows
    assert A.default_block_rows(A.Shape(1, 4, 16, 1, 100, 128, "bf16")) == 64  # 64 rows
    assert A.default_block_rows(A.Shape(1, 3, 16, 1, 100, 128, "bf16")) == 64  # 48: one CTA, not two


def test_bench_variant_options_parse():
    assert A._variant_option("pingpong@n96", "n96") == (96, None, None, None, False)
    assert A._variant_option("pingpong@o2", "o2") == (None, 2, None, None, False)
    assert A._variant_option("pingpong@n64o2", "n64o2") == (64, 2, None, None, False)
    assert A._variant_option("pingpong@r64", "r64") == (None, None, 64, None, False)
    assert A._variant_option("pingpong@o2s132", "o2s132") == (None, 2, None, 132, False)
    assert A._variant_option("pingpong@p", "p") == (None, None, None, None, True)
    assert A._variant_option("pingpong@s8p", "s8p") == (None, None, None, 8, True)
    assert A._variant_option("pingpong", "") == (None, None, None, None, False)
    with pytest.raises(ValueError, match="unknown kernel option"):
        A._variant_option("pingpong@x2", "x2")


def test_explicit_splits_are_clamped_to_the_blocks():
    s = A.Shape(1, 1, 16, 1, 1000, 128, "bf16")
    assert A.plan_splits(s, 128, 132, num_splits=1000).n_splits == 8
    assert A.plan_splits(A.Shape(1, 1, 16, 1, 10**6, 128, "bf16"), 64, 132, num_splits=1000).n_splits == A.MAX_SPLITS
    assert A.plan_splits(s, 64, 132, num_splits=3).n_splits == 3
    # many groups forced to many splits: combiners stay below the deadlock bound
    big = A.Shape(32, 1, 16, 2, 131072, 128, "bf16")
    p = A.plan_splits(big, 64, 132, num_splits=64)
    assert big.groups() * (p.n_comb - 1) < 132


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
                    for i in range(A.COMBINE_UNROLL):
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
        assert plan.n_splits <= A.COMBINE_UNROLL * plan.comb_parts
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


def test_bench_table_ratios_and_overheads():
    s = A.Shape(1, 1, 16, 1, 131072, 128, "bf16")
    rows = [A.BenchRow(s, "base", 25.0, 0.1, 2e-3, {}), A.BenchRow(s, "pingpong", 20.0, 0.1, 3e-3, {}),
            A.BenchRow(s, "cudnn", 30.0, 0.1, 1e-3, {}), A.BenchRow(s, "base+trace", 26.0, 0.1, float("nan"), {}),
            A.BenchRow(s, "pingpong+trace", 21.0, 0.1, float("nan"), {}),
            A.BenchRow(s, "pingpong+tracelead", 20.4, 0.1, float("nan"), {}),
            A.BenchRow(s, "base+tracestalls", 27.5, 0.1, float("nan"), {}),
            A.BenchRow(s, "pingpong+tracestalls", 22.0, 0.1, float("nan"), {}),
            A.BenchRow(s, "flash", float("nan"), float("nan"), float("nan"), {"error": "refused"})]
    md = A.bench_table(rows).splitlines()
    assert md[0].count("|") == md[2].count("|")
    cells = [c.strip() for c in md[2].strip("|").split("|")]
    head = [c.strip() for c in md[0].strip("|").split("|")]
    row = dict(zip(head, cells))
    tbps = s.io_bytes() / 20e-6 / 1e12
    assert row["pingpong µs (TB/s)"] == f"20.0 ({tbps:.2f})"
    assert row["flash µs (TB/s)"] == "-"
    assert row["pp vs base"] == "+25.0%" and row["pp vs cuDNN"] == "1.50x"
    assert row["trace ovh base/pp"] == "+4.0% / +5.0%"
    assert row["lead-warp ovh base/pp"] == "- / +2.0%"  # no base+tracelead row: a '-' cell
    assert row["stalls ovh base/pp"] == "+10.0% / +10.0%"
    # with a "+ref" timing (the untraced kernel timed next to the traced ones) that is the reference
    rows.append(A.BenchRow(s, "pingpong+ref", 20.5, 0.1, 3e-3, {}))
    md = A.bench_table(rows).splitlines()
    row = dict(zip(head, [c.strip() for c in md[2].strip("|").split("|")]))
    assert row["trace ovh base/pp"] == "+4.0% / +2.4%" and row["pingpong µs (TB/s)"] == f"20.0 ({tbps:.2f})"
    assert md[0] == "| " + " | ".join(head) + " |"  # +ref adds no column
    assert row["max rel err"] == "3.0e-03"
    assert row["pp % of 4.8"] == f"{100 * tbps / 4.8:.0f}%"
    # a third schedule with traced timings gets its own share of the overhead cells
    rows += [A.BenchRow(s, "intrawg", 22.0, 0.1, 2e-3, {}), A.BenchRow(s, "intrawg+trace", 23.1, 0.1, float("nan"), {})]
    md = A.bench_table(rows).splitlines()
    row = dict(zip([c.strip() for c in md[0].strip("|").split("|")], [c.strip() for c in md[2].strip("|").split("|")]))
    assert row["trace ovh base/pp/iw"] == "+4.0% / +2.4% / +5.0%"
    assert row["lead-warp ovh base/pp/iw"] == "- / -0.5% / -"  # against pingpong+ref
    assert row["intrawg µs (TB/s)"].startswith("22.0 (")


def test_launches_per_graph_keep_l2_cold_and_spread_the_replay_cost():
    mib = 1 << 20
    for set_bytes in (2 * mib, 32 * mib, 64 * mib, 128 * mib, 1024 * mib, 4096 * mib):
        n_sets, per = A.launches_per_graph(set_bytes)
        assert per % n_sets == 0 and 8 <= per <= 128
        assert n_sets * set_bytes >= min(A.L2_ROTATE_BYTES, 64 * set_bytes)  # rotation >= 256 MB
    assert A.launches_per_graph(64 * mib) == (4, 64)  # d128 16:1 sk 131072 b 1
    assert A.launches_per_graph(4096 * mib) == (1, 8)  # the largest shapes: 8 launches
    assert A.launches_per_graph(2 * mib) == (64, 64)


def test_bench_reports_the_last_of_two_passes_else_the_median_after_warm_up():
    assert A.reported_us([130.0]) == 130.0
    assert A.reported_us([130.0, 121.0]) == 121.0  # the first pass is the warm-up one
    # a slow warm-up pass and a drifting last one do not decide the row
    assert A.reported_us([140.0, 120.0, 121.0, 127.0]) == 121.0
    assert A.reported_us([140.0, 120.0, 126.0]) == 123.0
    with pytest.raises(ValueError):
        A.reported_us([])


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


def test_traced_variants_are_found_by_their_event_set(tmp_path, monkeypatch):
    """A build holds a traced variant per event set; one made before event sets (every event
    compiled in, ``trace_events`` None) serves "stalls" only, and asking it for "core" says so."""
    from fa4trace import aot
    from fa4trace.errors import Fa4traceError

    monkeypatch.setattr(aot.BuildDir, "function", lambda self, name: name)  # no library to load here
    cfg = dict(head_dim=128, schedule="pingpong", dtype="bf16", tile_n=64, ctas_per_sm=1, block_rows=32)

    def build(name, functions):
        path = tmp_path / name
        path.mkdir()
        aot.write_manifest(path, "sm_90a", {n: {"kind": "attention", "config": {**cfg, **c}} for n, c in functions.items()})
        return path

    new = build("new", {"plain": {"traced": False, "trace_events": None},
                        "core": {"traced": True, "trace_events": sorted(A.trace_event_ids("core"))},
                        "stalls": {"traced": True, "trace_events": sorted(A.trace_event_ids("stalls"))}})
    old = build("old", {"plain": {"traced": False, "trace_events": None},
                        "full": {"traced": True, "trace_events": None}})

    def fn(path, traced, events="core"):
        return A.kernel_function(128, "pingpong", "bf16", traced, build=path, block_rows=32, trace_events=events).fn

    assert (fn(new, False), fn(new, True), fn(new, True, "stalls")) == ("plain", "core", "stalls")
    assert (fn(old, False), fn(old, True, "stalls")) == ("plain", "full")
    with pytest.raises(Fa4traceError, match="recording the 'core' event set.*rebuild"):
        fn(old, True)


def test_bench_times_each_traced_variant_next_to_a_reference(monkeypatch):
    seen = []
    monkeypatch.setattr(A, "bench_shape", lambda shape, ks, **kw: seen.append(list(ks)) or [])
    A.bench_run([A.Shape(1, 1, 16, 1, 131072, 128, "bf16"), A.Shape(1, 1, 16, 1, 4096, 128, "bf16")],
                ["base", "pingpong", "cudnn"], log=lambda *a: None)
    traced = ["+ref", "+trace", "+tracelead", "+tracestalls"]
    assert seen[0] == ["base", "pingpong", "cudnn", *("base" + t for t in traced), *("pingpong" + t for t in traced)]
    assert seen[1] == ["base", "pingpong", "cudnn"]  # overheads only at sk 131072, sq 1


def test_power_log_reads_a_polling_nvidia_smi(tmp_path):
    """PowerLog against a stand-in nvidia-smi (one GPU, lines as the real one prints them with
    --format=csv,noheader,nounits): samples parse, the power-cap share and clock range come out,
    and the bench table names the capped shape."""
    import stat
    import time

    from fa4trace.power_log import PowerLog, parse_line

    assert parse_line("1830, 701.20, 700.00, 0x0000000000000004") == (1830, 701.2, 700.0, 4)
    assert parse_line("[N/A], [N/A], 700.00, 0x0") is None and parse_line("clocks.sm, power") is None
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    'if [ "$1" = "-L" ]; then echo "GPU 0: NVIDIA H200 (UUID: GPU-x)"; exit 0; fi\n'
                    "while true; do echo '1980, 650.00, 700.00, 0x0000000000000000'; "
                    "echo '1800, 702.50, 700.00, 0x0000000000000004'; sleep 0.05; done\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with PowerLog(period_ms=50, exe=str(fake)) as log:
        assert log.enabled
        t0 = log.now()
        time.sleep(0.5)
        st = log.summary(t0, log.now())
    assert st is not None and st["samples"] >= 4
    assert (st["sm_mhz_min"], st["sm_mhz_max"], st["power_w_max"]) == (1800, 1980, 702.5)
    assert 0.3 <= st["power_cap_share"] <= 0.7 and st["thermal_share"] == 0
    s = A.Shape(1, 1, 16, 1, 131072, 128, "bf16")
    md = A.bench_table([A.BenchRow(s, "pingpong", 20.0, 0.1, 2e-3, {"gpu_state": st})])
    assert "power cap" in md.splitlines()[-1] and "sk 131072 b 1" in md.splitlines()[-1]
    with PowerLog(exe=str(tmp_path / "missing")) as off:
        assert not off.enabled and off.summary(0, 1e12) is None


def test_pdl_is_an_untraced_launch_mode(tmp_path, monkeypatch):
    """pdl=True picks the build's PDL twin of the untraced kernel (old builds have none: one
    clear error); with a trace buffer it is refused before any GPU work; the bench's @p runs it
    and adds no traced variants for it."""
    from fa4trace import aot
    from fa4trace.errors import Fa4traceError

    q, k, v = _qkv()
    assert "pdl=True runs the uninstrumented kernel only" in _err(A.decode_attention, q, k, v, pdl=True,
                                                                   trace=object())
    monkeypatch.setattr(aot.BuildDir, "function", lambda self, name: name)
    cfg = dict(head_dim=128, schedule="pingpong", dtype="bf16", tile_n=64, ctas_per_sm=1, block_rows=32,
               traced=False)
    for name, functions in (("new", {"plain": {"pdl": False}, "plain_pdl": {"pdl": True}}), ("old", {"plain": {}})):
        (tmp_path / name).mkdir()
        aot.write_manifest(tmp_path / name, "sm_90a",
                           {n: {"kind": "attention", "config": {**cfg, **c}} for n, c in functions.items()})

    def fn(name, pdl):
        return A.kernel_function(128, "pingpong", "bf16", False, build=tmp_path / name, block_rows=32, pdl=pdl).fn

    assert (fn("new", False), fn("new", True), fn("old", False)) == ("plain", "plain_pdl", "plain")
    with pytest.raises(Fa4traceError, match="pdl=True.*rebuild"):
        fn("old", True)
    with pytest.raises(ValueError, match="uninstrumented kernel only"):  # also the bench's +trace@p
        A.kernel_function(128, "pingpong", "bf16", True, build=tmp_path / "new", block_rows=32, pdl=True)
    seen = []
    monkeypatch.setattr(A, "bench_shape", lambda shape, ks, **kw: seen.append(list(ks)) or [])
    A.bench_run([A.Shape(1, 1, 16, 1, 131072, 128, "bf16")], ["pingpong", "pingpong@p"], log=lambda *a: None)
    assert "pingpong@p" in seen[0] and not any("@p" in k and "+" in k for k in seen[0])
