"""Decode attention on a real GPU (skips cleanly without one).

Runs through fa4trace.attention: JIT where the CuTe DSL is installed, else the AOT build in
$FA4TRACE_BUILD (default build/kernels, made by `fa4trace build`; see fa4trace.run.loader).
Every check draws fresh random inputs and poisons the output with NaN first.
"""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)
cap = torch.cuda.get_device_capability()
if cap[0] != 9:
    pytest.skip(f"decode attention targets sm_90a, this GPU is sm_{cap[0]}{cap[1]}", allow_module_level=True)

from fa4trace import attention as A  # noqa: E402

TOL = {"bf16": 1e-2, "fp16": 5e-3}
_seed = [1000]


def _inputs(b, sq, hq, hkv, sk, d, dtype):
    _seed[0] += 1
    g = torch.Generator(device="cuda").manual_seed(_seed[0])
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
    q = torch.randn(b, sq, hq, d, dtype=tdt, device="cuda", generator=g)
    k = torch.randn(b, sk, hkv, d, dtype=tdt, device="cuda", generator=g)
    v = torch.randn(b, sk, hkv, d, dtype=tdt, device="cuda", generator=g)
    return q, k, v


def _check(b, sq, hq, hkv, sk, d, schedule, splits, dtype="bf16", scale=None):
    q, k, v = _inputs(b, sq, hq, hkv, sk, d, dtype)
    out = torch.full_like(q, float("nan"))
    o, lse = A.decode_attention(q, k, v, schedule=schedule, num_splits=splits, softmax_scale=scale,
                                out=out, return_lse=True)
    torch.cuda.synchronize()
    ref_o, ref_lse = A.reference(q, k, v, scale)
    assert not torch.isnan(o).any(), "NaN in output (unwritten elements or overflow)"
    err = A.rel_error(o, ref_o)
    assert err <= TOL[dtype], f"rel error {err:.3g}"
    lse_err = (lse - ref_lse).abs().max().item()
    assert lse_err < 2e-2, f"lse max abs error {lse_err:.3g}"
    return err


# sk {1, 77, 1000, 65537} x ratio {1, 4, 8, 16} x sq 1..8, several split counts
CASES = [
    # b, sq, hq, hkv, sk, splits
    (1, 1, 16, 1, 1, None),
    (2, 1, 16, 4, 77, None),
    (1, 3, 8, 1, 77, 1),
    (2, 2, 4, 1, 1000, None),
    (1, 8, 16, 2, 1000, 3),
    (1, 5, 12, 3, 1000, 8),   # ratio 4, 20 rows
    (3, 1, 8, 8, 1000, 5),    # ratio 1
    (1, 1, 16, 1, 65537, None),
    (2, 4, 16, 2, 65537, 17),
    (1, 8, 16, 1, 65537, None),  # 128 rows: two m-blocks
    (1, 7, 8, 1, 65537, 2),
    (4, 1, 32, 4, 65537, 1),  # ratio 8, no split
    (1, 6, 28, 2, 4097, None),  # ratio 14: rows do not tile 64
]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("schedule", A.SCHEDULES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}sq{}h{}:{}sk{}s{}".format(*c))
def test_matches_fp32_reference(d, schedule, case):
    _check(*case[:5], d, schedule, case[5])


@pytest.mark.parametrize("schedule", A.SCHEDULES)
@pytest.mark.parametrize("d", [64, 128])
def test_fp16_and_scale(schedule, d):
    _check(2, 2, 16, 2, 3000, d, schedule, None, dtype="fp16", scale=0.05)


@pytest.mark.parametrize("schedule", A.SCHEDULES)
def test_every_split_count_for_one_shape(schedule):
    for splits in (1, 2, 3, 7, 16, 31, 64, 200):
        _check(1, 1, 16, 1, 8192, 128, schedule, splits)


@pytest.mark.parametrize("schedule", A.SCHEDULES)
def test_repeated_launches_give_the_same_bits(schedule):
    """Splits finish (and take combine tickets) in a different order every launch; the
    combine merges the partials in split order, so the bits do not change."""
    q, k, v = _inputs(1, 1, 16, 1, 131072, 128, "bf16")
    outs = [A.decode_attention(q, k, v, schedule=schedule, return_lse=True) for _ in range(8)]
    torch.cuda.synchronize()
    for o, lse in outs[1:]:
        assert torch.equal(o, outs[0][0]) and torch.equal(lse, outs[0][1])


@pytest.mark.parametrize("schedule", A.SCHEDULES)
@pytest.mark.parametrize("d, sk, events", [(64, 20000, "core"), (128, 20000, "core"), (128, 131072, "core"),
                                           (64, 20000, "stalls"), (128, 131072, "stalls")])
def test_tracing_does_not_change_the_output(schedule, d, sk, events):
    q, k, v = _inputs(2, 2, 16, 2, sk, d, "bf16")
    plain = A.decode_attention(q, k, v, schedule=schedule)
    buf, spec, plan = A.trace_buffer(q, k, v, schedule=schedule, trace_events=events)
    traced = A.decode_attention(q, k, v, schedule=schedule, trace=buf, trace_events=events)
    torch.cuda.synchronize()
    assert torch.equal(plain, traced)
    words = buf.cpu().numpy()
    from fa4trace.trace.decode import decode_buffer

    t = decode_buffer(words, grid_ctas=plan.n_ctas).table
    names = set(t.column("name").to_pylist())
    # WAIT_K / WAIT_V appear only when a block had not landed yet (not required here), and
    # only in the "stalls" event set.
    for ev in ("LOAD_Q", "LOAD_K", "LOAD_V", "QK", "SOFTMAX", "CORRECTION", "PV", "EPILOGUE"):
        assert ev in names, ev
    if events == "core":
        assert not names & {"WAIT_K", "WAIT_V"}
    # Every KV block left its four consumer spans in every consumer warp, and the producer its
    # two loads (the mainloop records through Recorder.open_block: nothing may be lost there).
    assert sum(t.column("dropped").to_pylist()) == 0
    every = t.column("name").to_pylist()
    blocks = plan.n_blocks * plan.grid[0] * plan.grid[2]  # KV blocks over all groups
    for ev in ("QK", "SOFTMAX", "CORRECTION", "PV"):
        assert every.count(ev) == blocks * 4, (ev, every.count(ev), blocks * 4)
    assert every.count("LOAD_K") == blocks and every.count("LOAD_V") == blocks
    if plan.n_splits > 1:
        assert "COMBINE" in names


@pytest.mark.parametrize("schedule", A.SCHEDULES)
@pytest.mark.parametrize("blocks_per_split", [1, 2, 3])
def test_every_kv_load_is_recorded_once_whatever_the_split_length(schedule, blocks_per_split):
    """The ping-pong producer's K1 and last V are recorded with ``when=`` (outside the dynamic
    if that issues them): splits of 1, 2 and 3 blocks must show each load exactly once."""
    from fa4trace.trace.decode import decode_buffer

    tile = A.Variant(128, schedule).tile_n
    n_blocks = 12
    q, k, v = _inputs(1, 1, 16, 1, n_blocks * tile - 5, 128, "bf16")
    splits = n_blocks // blocks_per_split
    plain = A.decode_attention(q, k, v, schedule=schedule, num_splits=splits)
    buf, spec, plan = A.trace_buffer(q, k, v, schedule=schedule, num_splits=splits)
    traced = A.decode_attention(q, k, v, schedule=schedule, num_splits=splits, trace=buf)
    torch.cuda.synchronize()
    assert plan.n_splits == splits and torch.equal(plain, traced)
    t = decode_buffer(buf.cpu().numpy(), grid_ctas=plan.n_ctas).table.to_pandas()
    assert t["dropped"].sum() == 0
    for ev in ("LOAD_K", "LOAD_V"):
        spans = t[t.name == ev]
        assert sorted(spans["iter"]) == list(range(n_blocks)), ev  # one span per block, no phantom K1


@pytest.mark.parametrize("schedule", A.SCHEDULES)
def test_lead_warps_record_alone_and_completely(schedule):
    """A buffer selecting LEAD_WARPS (warp mask): only warps 0 and 4 have rows, each with every
    event it records when all warps do, and the output is still bit-equal."""
    from fa4trace.trace.decode import decode_buffer

    q, k, v = _inputs(2, 1, 16, 2, 20000, 128, "bf16")
    plain = A.decode_attention(q, k, v, schedule=schedule)
    bufs = {w: A.trace_buffer(q, k, v, schedule=schedule, warps=w) for w in (None, A.LEAD_WARPS)}
    outs = {w: A.decode_attention(q, k, v, schedule=schedule, trace=b[0]) for w, b in bufs.items()}
    torch.cuda.synchronize()
    assert all(torch.equal(plain, o) for o in outs.values())
    full, lead = (decode_buffer(bufs[w][0].cpu().numpy(), grid_ctas=bufs[w][2].n_ctas).table.to_pandas()
                  for w in (None, A.LEAD_WARPS))
    assert sorted(lead["warp"].unique()) == [0, 4]
    assert lead["dropped"].sum() == 0
    # Timing decides the waits, and the finishing order (MARK's payload) which splits combine.
    timing = ["WAIT_K", "WAIT_V", "MARK", "COMBINE"]
    for w in (0, 4):
        a = full[(full.warp == w) & ~full.name.isin(timing)]
        b = lead[(lead.warp == w) & ~lead.name.isin(timing)]
        # the same events with the same payloads, CTA by CTA
        key = ["cta", "name", "kind", "iter"]
        assert a[key].astype(str).value_counts().sort_index().equals(b[key].astype(str).value_counts().sort_index())
        assert (a.name == "MARK").sum() == (b.name == "MARK").sum()  # one ticket per split


@pytest.mark.parametrize("schedule", A.SCHEDULES)
def test_waits_for_kv_are_recorded_where_the_stream_is_the_limit(schedule):
    """d128 at b 8, sk 131072 is memory-bound: consumers must be seen waiting for K/V blocks.
    (A blocking probe once hid every wait: the trace showed a consumer that never starved.)"""
    q, k, v = _inputs(8, 1, 16, 2, 131072, 128, "bf16")
    buf, spec, plan = A.trace_buffer(q, k, v, schedule=schedule, trace_events="stalls")
    A.decode_attention(q, k, v, schedule=schedule, trace=buf, trace_events="stalls")
    torch.cuda.synchronize()
    from fa4trace.trace.decode import decode_buffer

    t = decode_buffer(buf.cpu().numpy(), grid_ctas=plan.n_ctas).table
    names = t.column("name").to_pylist()
    waits = sum(n in ("WAIT_K", "WAIT_V") for n in names)
    blocks = names.count("QK")
    assert waits > 0.01 * blocks, (waits, blocks)


@pytest.mark.parametrize("schedule", A.SCHEDULES)
@pytest.mark.parametrize("sq, hq, hkv, splits", [(1, 16, 1, None), (2, 16, 1, 1), (3, 8, 2, 7)])
def test_32_and_64_row_ctas_give_the_same_bits(schedule, sq, hq, hkv, splits):
    """A real row goes through the same operations in the same order in either layout."""
    q, k, v = _inputs(2, sq, hq, hkv, 5000, 128, "bf16")
    o32, l32 = A.decode_attention(q, k, v, schedule=schedule, num_splits=splits, block_rows=32, return_lse=True)
    o64, l64 = A.decode_attention(q, k, v, schedule=schedule, num_splits=splits, block_rows=64, return_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(o32, o64) and torch.equal(l32, l64)


def test_graph_replay_leaves_counters_usable():
    """The in-launch combine leaves its counters consistent (arrival count = the next launch's
    base): 20 replays give the same result as one launch."""
    q, k, v = _inputs(1, 1, 16, 1, 131072, 128, "bf16")
    o = torch.empty_like(q)
    A.decode_attention(q, k, v, out=o)
    first = o.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        A.decode_attention(q, k, v, out=o)
    for _ in range(20):
        o.fill_(float("nan"))
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(o, first)
    from fa4trace.attention.api import _counters
    from fa4trace.kernels.decode_spec import COUNTER_WORDS

    words = _counters(q.device, COUNTER_WORDS).view(-1, COUNTER_WORDS)[:64].cpu()
    assert torch.equal(words[:, 0], words[:, 1])  # arrival count == base of the next launch
    assert int(words[0, 0]) > 0  # the counter advanced (it is never reset)


@pytest.mark.parametrize("schedule", A.SCHEDULES)
def test_pdl_launches_give_the_same_bits_back_to_back(schedule):
    """pdl=True: the same output as the default launch, also when launches overlap: a graph of
    back-to-back PDL launches that write each other's inputs' neighbours (one workspace and one
    set of counters) and alternate outputs, replayed, with a plain launch between replays."""
    q, k, v = _inputs(1, 1, 16, 1, 65537, 128, "bf16")
    q2, k2, v2 = _inputs(2, 1, 16, 2, 4097, 64, "bf16")
    want = A.decode_attention(q, k, v, schedule=schedule)
    want2 = A.decode_attention(q2, k2, v2, schedule=schedule)
    got = A.decode_attention(q, k, v, schedule=schedule, pdl=True)
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    o, o2 = torch.empty_like(q), torch.empty_like(q2)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(4):
            A.decode_attention(q, k, v, schedule=schedule, out=o, pdl=True)
            A.decode_attention(q2, k2, v2, schedule=schedule, out=o2, pdl=True)
    for _ in range(5):
        o.fill_(float("nan"))
        o2.fill_(float("nan"))
        g.replay()
        A.decode_attention(q2, k2, v2, schedule=schedule, out=o2)
    torch.cuda.synchronize()
    assert torch.equal(o, want) and torch.equal(o2, want2)


# What each schedule overlaps, seen in its own trace (fa4trace.analysis.overlap): base nothing,
# pingpong QK(i+1) with SOFTMAX(i) (and PV(i-1)), intrawg PV(i-1) with SOFTMAX(i) but not QK,
# whose wait comes before the softmax. Time-weighted over every CTA; 32 blocks per split, so
# the first block's softmax (nothing to overlap in intrawg) weighs little. "Not" allows 10%:
# the four consumer warps' spans are unioned per CTA and the warps drift a little.
# fa4trace check judges the same ranges (one table for both).
from fa4trace.attention.record import record_attention  # noqa: E402
from fa4trace.check.rows import OUR_OVERLAPS as OVERLAPS  # noqa: E402


@pytest.mark.parametrize("schedule", A.SCHEDULES)
def test_each_schedule_overlaps_what_it_claims(schedule):
    from fa4trace.analysis import overlap

    tr = record_attention(schedule=schedule, d=128, hq=16, hkv=1, sk=32768, b=1, sq=1,
                            num_splits=32768 // 128 // 32)
    s = overlap.summarize(tr)
    (qk_lo, qk_hi), (pv_lo, pv_hi) = OVERLAPS[schedule]
    assert qk_lo <= s["qk_softmax_overlap"] <= qk_hi, s["qk_softmax_overlap"]
    assert pv_lo <= s["pv_softmax_overlap"] <= pv_hi, s["pv_softmax_overlap"]


def test_a_recording_carries_the_cold_l2_time_that_summary_reports():
    """record_attention times the untraced kernel the way ``fa4trace bench`` does (cold L2)
    beside the recorded inputs' times; summary reports the cold-L2 one and says so."""
    from fa4trace.analysis import overlap

    tr = record_attention(schedule="pingpong", d=128, hq=16, hkv=1, sk=32768, b=1, sq=1)
    t = tr.meta["timing"]
    assert t["bench_us"] > 0 and t["kernel_us"] > 0 and t["traced_us"] > 0
    s = overlap.summarize(tr)
    assert s["kernel_time_kind"] == "cold_l2_bench"
    assert abs(s["kernel_time_ns"] - t["bench_us"] * 1e3) < 1e-6
