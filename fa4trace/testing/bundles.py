"""Host-side twin of the device recorder, for tests, fuzzing and scale benchmarks.

``write_buffer`` lays events out exactly as ``fa4trace.device.Recorder`` does (same header
words, same record bits), so the decoder can be tested on buffers with known answers on a
machine without a GPU. ``attention_like`` makes large, plausible base / ping-pong timelines
(clearly labelled synthetic in their metadata) for the app and the benchmarks: they are
never presented as measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..format import layout as L
from ..format.vocab import EV, ROLE

T0_NS = 1_700_000_000_000_000_000  # the synthetic launches' %globaltimer origin (ns)


@dataclass
class WarpEvents:
    """Events of one warp, in record order. Times are cycles (or ns in the globaltimer timebase)."""

    cta: int
    warp: int
    sm: int
    role: int
    clk0: int
    clk1: int
    gt0: int
    gt1: int
    kind: np.ndarray  # int: layout.KIND_*
    event: np.ndarray  # int event ids
    payload: np.ndarray  # int, -1 = none
    t: np.ndarray  # int64 timer values (full 64-bit)
    attempted: int | None = None  # default len(kind): > capacity models an overflowing warp


def write_buffer(spec: L.BufferSpec, warps: list[WarpEvents], *,
                 timebase: int = L.TIMEBASE_CLOCK64, lifetimes=None, ring: int = 0) -> np.ndarray:
    """``warps`` into their slots, and ``lifetimes`` — (CTA indices, start ns, end ns),
    absolute %globaltimer — into the CTA-lifetime region as the stamps leave it (entries of
    CTAs beyond ``spec.lifetime_ctas`` are not timed, as on the device).

    ``ring``: the warps recorded into shared-memory rings of that many records
    (``SegmentRecorder`` cursor="ring"): each keeps the last min(n, ring, capacity) of its
    events, the others count as dropped (overwritten), and its header names the ring. Without
    a ring a warp keeps its first events, as a slot that fills does."""
    if ring:
        L.check_ring(ring)
    buf = spec.new_buffer()
    slots = buf[L.GLOBAL_HEADER_WORDS:spec.slots_end].reshape(spec.n_slots, spec.slot_words)
    recorded = spec.recorded_warps
    for w in warps:
        rel = w.cta - spec.cta_first
        if rel < 0 or rel % spec.cta_stride or rel // spec.cta_stride >= spec.n_cta_slots or w.warp not in recorded:
            continue
        s = (rel // spec.cta_stride) * spec.warps_per_cta + recorded.index(w.warp)
        n = len(w.kind)
        attempted = n if w.attempted is None else w.attempted
        written = min(attempted, spec.capacity, n, ring or n)
        keep = slice(n - written, n) if ring else slice(0, written)  # a ring keeps the newest
        hdr = slots[s, :L.WARP_HEADER_WORDS]
        hdr[L.W_MAGIC] = L.warp_word0(timebase, w.role)
        hdr[L.W_IDS] = (w.sm & 0xFFFFFFFF) | (w.cta << 32)
        hdr[L.W_WARP] = w.warp | (L.ring_field(ring) << L.RING_SHIFT)
        hdr[L.W_GT0], hdr[L.W_CLK0], hdr[L.W_GT1], hdr[L.W_CLK1] = w.gt0, w.clk0, w.gt1, w.clk1
        hdr[L.W_COUNTS] = written | ((attempted - written) << 32)
        slots[s, L.WARP_HEADER_WORDS:L.WARP_HEADER_WORDS + written] = pack_records(
            w.t[keep], w.event[keep], w.kind[keep], w.payload[keep])
    if lifetimes is not None:
        write_lifetimes(buf, spec, *lifetimes)
    return buf


def write_lifetimes(buf: np.ndarray, spec: L.BufferSpec, cta, start, end) -> None:
    """The CTA-lifetime entries the device's stamps leave: ~start and end per timed CTA."""
    cta = np.asarray(cta, np.int64)
    keep = cta < spec.lifetime_ctas
    region = buf[spec.slots_end:spec.words].reshape(spec.lifetime_ctas, L.LIFETIME_WORDS)
    region[cta[keep], L.LIFE_START_NOT] = ~np.asarray(start, np.int64)[keep].astype(np.uint64)
    region[cta[keep], L.LIFE_END] = np.asarray(end, np.int64)[keep].astype(np.uint64)


def pack_records(t, event, kind, payload) -> np.ndarray:
    """Vectorized layout.pack_record."""
    t = np.asarray(t, np.int64).astype(np.uint64)
    p = np.asarray(payload, np.int64)
    p = np.where(p < 0, L.PAYLOAD_NONE, np.minimum(p, L.PAYLOAD_MAX)).astype(np.uint64)
    return ((t & np.uint64(0xFFFFFFFF))
            | (np.asarray(event, np.uint64) << np.uint64(L.EVENT_SHIFT))
            | (np.asarray(kind, np.uint64) << np.uint64(L.KIND_SHIFT))
            | (p << np.uint64(L.PAYLOAD_SHIFT)))


def attention_like(schedule: str, *, n_ctas: int = 132, n_blocks: int = 64, sms: int = 132,
                   capacity: int | None = None, seed: int = 0, ghz: float = 1.98,
                   stretch: dict | None = None) -> tuple[np.ndarray, dict]:
    """A plausible decode-attention buffer: 1 producer + 4 consumer warps per CTA.

    base:     QK(i) -> SOFTMAX(i) -> CORRECTION(i) -> PV(i), serial.
    pingpong: QK(i+1) is issued before SOFTMAX(i) and waited after PV(i) is issued.
    ``stretch``: {event: factor} on the durations of QK, SOFTMAX, CORRECTION or PV (a stage made
    slower, or faster; what follows it moves with it), the noise drawn as without it.
    Returns (buffer words, launch metadata marked synthetic). Vectorized over CTAs and blocks.
    """
    if schedule not in ("base", "pingpong"):
        raise ValueError(f"schedule must be 'base' or 'pingpong', got {schedule!r}")
    stretch = dict(stretch or {})
    if set(stretch) - {"QK", "SOFTMAX", "CORRECTION", "PV"}:
        raise ValueError(f"stretch takes QK, SOFTMAX, CORRECTION, PV; got {sorted(stretch)}")
    rng = np.random.default_rng(seed)
    warps_per_cta = 5
    ev_per_block_cons = 8  # QK b/e, SOFTMAX b/e, CORRECTION b/e, PV b/e
    cap = capacity or max(ev_per_block_cons * n_blocks + 8, 64)
    spec = L.BufferSpec(warps_per_cta, n_ctas, cap)

    # Per (CTA, block) durations in cycles, jittered.
    shape = (n_ctas, n_blocks)
    qk = rng.normal(420, 30, shape).clip(200)
    sm_ = rng.normal(520, 40, shape).clip(250)
    corr = rng.normal(90, 10, shape).clip(30)
    pv = rng.normal(430, 30, shape).clip(200)
    gap = rng.normal(40, 8, shape).clip(5)
    qk, sm_, corr, pv = (x * float(stretch.get(n, 1.0)) for n, x in
                         (("QK", qk), ("SOFTMAX", sm_), ("CORRECTION", corr), ("PV", pv)))
    if schedule == "base":
        period = qk + sm_ + corr + pv + gap
    else:
        # QK(i+1) runs under SOFTMAX(i): the period loses most of QK.
        period = np.maximum(sm_ + corr + pv + gap, qk + 60)
    start = np.cumsum(period, axis=1) - period + rng.normal(1500, 100, (n_ctas, 1))
    t_qk_b = start.copy()
    if schedule == "pingpong":
        t_qk_b[:, 1:] = (start[:, :-1] + 30)  # issued right before the previous softmax
    t_qk_e = t_qk_b + qk
    t_sm_b = np.maximum(start + (0 if schedule == "pingpong" else qk), t_qk_e) + 15
    t_sm_e = t_sm_b + sm_
    t_co_b = t_sm_e + 5
    t_co_e = t_co_b + corr
    t_pv_b = t_co_e + 10
    t_pv_e = t_pv_b + pv
    cons = np.stack([t_qk_b, t_qk_e, t_sm_b, t_sm_e, t_co_b, t_co_e, t_pv_b, t_pv_e], axis=-1)
    cons_ev = np.array([EV.QK, EV.QK, EV.SOFTMAX, EV.SOFTMAX, EV.CORRECTION, EV.CORRECTION, EV.PV, EV.PV])
    cons_kind = np.array([0, 1] * 4)
    t_lk_b = start - 700 + rng.normal(0, 20, shape)
    prod = np.stack([t_lk_b, t_lk_b + 120, t_lk_b + 300, t_lk_b + 420], axis=-1)
    prod_ev = np.array([EV.LOAD_K, EV.LOAD_K, EV.LOAD_V, EV.LOAD_V])
    prod_kind = np.array([0, 1, 0, 1])

    base_clk = rng.integers(1 << 33, 1 << 36, n_ctas)  # per-SM clocks differ
    gt_start = 1_700_000_000_000_000_000 + rng.integers(0, 200, n_ctas)
    end_c = np.maximum(cons[..., -1].max(axis=1), prod[..., -1].max(axis=1)) + 400
    ns_per_cycle = 1.0 / ghz

    buf = spec.new_buffer()
    slots = buf[L.GLOBAL_HEADER_WORDS:spec.slots_end].reshape(spec.n_slots, spec.slot_words)
    for w in range(warps_per_cta):
        s = np.arange(n_ctas) * warps_per_cta + w
        if w == 0:
            t, ev, kd, role = prod, prod_ev, prod_kind, ROLE.PRODUCER
        else:
            t = cons + rng.normal(0, 3, cons.shape)  # the 4 consumer warps of a warpgroup differ slightly
            ev, kd, role = cons_ev, cons_kind, ROLE.CONSUMER
        k = t.shape[-1]
        tt = np.sort(t.reshape(n_ctas, -1), axis=1)  # record order = time order
        order = np.argsort(t.reshape(n_ctas, -1), axis=1, kind="stable")
        evs = np.tile(ev, n_blocks)[order]
        kds = np.tile(kd, n_blocks)[order]
        pay = np.repeat(np.arange(n_blocks), k)[order]
        full = base_clk[:, None] + np.rint(tt).astype(np.int64)
        n = min(tt.shape[1], cap)
        slots[s[:, None], L.WARP_HEADER_WORDS + np.arange(n)[None, :]] = pack_records(
            full[:, :n], evs[:, :n], kds[:, :n], pay[:, :n])
        clk1 = base_clk + np.rint(end_c).astype(np.int64)
        slots[s, L.W_MAGIC] = L.warp_word0(role=role)
        slots[s, L.W_IDS] = (np.arange(n_ctas) % sms).astype(np.uint64) | (np.arange(n_ctas).astype(np.uint64) << np.uint64(32))
        slots[s, L.W_WARP] = w
        slots[s, L.W_GT0] = gt_start
        slots[s, L.W_CLK0] = base_clk
        slots[s, L.W_GT1] = gt_start + np.rint(end_c * ns_per_cycle).astype(np.int64)
        slots[s, L.W_CLK1] = clk1
        slots[s, L.W_COUNTS] = np.uint64(n) | (np.uint64(tt.shape[1] - n) << np.uint64(32))
    meta = {"kernel": f"synthetic_attention_{schedule}", "synthetic": True,
            "config": {"schedule": schedule, "n_blocks": n_blocks},
            "grid": [n_ctas, 1, 1], "block": [32 * warps_per_cta, 1, 1]}
    return buf, meta


# ---- any kernel: a producer/consumer GEMM-like CTA set ------------------------------------------
PIPELINE = "ab"  # the synthetic mainloop pipeline's name
# (name, family, op, resource, is a span, color): the events fa4trace.instrument would register
_AUTO_EVENTS = (
    ("{p}.acquire", "pipeline", "acquire", "{p}", True, "#fcbba1"),
    ("{p}.commit", "pipeline", "commit", "{p}", False, "#3182bd"),
    ("{p}.wait", "pipeline", "wait", "{p}", True, "#de2d26"),
    ("{p}.release", "pipeline", "release", "{p}", False, "#9ecae1"),
    ("tma.load", "tma", "load", "", False, "#6baed6"),
    ("tma.store", "tma", "store", "", False, "#756bb1"),
    ("tma.store_wait", "tma", "store_wait", "", True, "#fb6a4a"),
    ("mma.commit", "mma", "commit", "", False, "#e6550d"),
    ("mma.wait", "mma", "wait", "", True, "#fd8d3c"),
    ("barrier.sync", "barrier", "sync", "", True, "#c51b8a"),
    ("barrier.arrive", "barrier", "arrive", "", False, "#8c6bb1"),
)
AUTO_FIRST_ID = 32  # automatic events take ids from here on


def pipelined_vocab(stages: int, pipeline: str = PIPELINE):
    """The shared vocabulary plus the automatic events of :func:`pipelined_like` (ids >= 32),
    with the fields fa4trace.instrument gives them (family, op, resource, stages)."""
    from ..format.vocab import VOCAB

    v = VOCAB.copy()
    for i, (name, fam, op, res, _span, color) in enumerate(_AUTO_EVENTS):
        res = res.format(p=pipeline)
        v.register(name.format(p=pipeline), AUTO_FIRST_ID + i, family=fam, op=op, resource=res,
                   stages=stages if fam == "pipeline" else 0, color=color,
                   description=f"synthetic {fam} {op}" + (f" of pipeline {res}" if res else ""))
    return v


def pipelined_like(*, n_ctas: int = 4, k_tiles: int = 16, stages: int = 4, consumer_warps: int = 4,
                   idle_warps: int = 2, load_ns=400, mma_ns=300, store_ns=200,
                   consumer_stagger_ns: int = 4, straggler_ns: int = 0, producer_gap_ns: int = 10,
                   consumer_gap_ns: int = 10, cta_offset_ns: int = 100, sms: int = 132,
                   roles: dict | None = None, kernel: str = "synthetic.gemm_like", t0_ns: int = T0_NS):
    """A GEMM-like warp-specialized CTA set recorded by automatic events (known answers for tests).

    Warps of each CTA: 0..W-1 consumers (``consumer_warps``), W the producer, then ``idle_warps``
    that record nothing, then one epilogue warp. Times are exact ns (globaltimer timebase), from
    the CTA's start (CTA i starts ``i * cta_offset_ns`` after CTA 0, CTA 0 at ``t0_ns``). Per k-tile count c
    (stage c % stages):

    * producer: ``ab.acquire(c)`` from ``acq`` until ``max(acq, last consumer release of
      c - stages) + 10``, ``tma.load`` 5 ns after, ``ab.commit(c)`` 10 ns after; the next
      acquire ``producer_gap_ns`` after the commit (the first at 50). The tile lands
      ``load_ns`` (+ ``extra`` of that CTA and count: ``load_ns`` may be an array broadcast to
      (n_ctas, k_tiles)) after the commit.
    * consumer w: ``ab.wait(c)`` from ``q`` until ``max(q, landed) + 10``; ``mma.commit`` 10 ns
      after; ``mma.wait`` (iter 0) from 20 ns after the wait for ``mma_ns + w *
      consumer_stagger_ns`` (``mma_ns`` may be an array broadcast to (n_ctas, k_tiles));
      ``ab.release(c)`` 10 ns after; the next wait ``consumer_gap_ns`` after the release (the
      first at 50).
    * epilogue: consumer w arrives at ``barrier.sync`` (id 1) 20 ns after its last release
      (the last consumer ``straggler_ns`` later), all leave 10 ns after the last arrives,
      ``barrier.arrive`` (id 2) 100 ns later; the epilogue warp waits at ``barrier.sync`` (id 2)
      from 50 until 10 ns after the last consumer arrived, then ``tma.store`` (+20) and
      ``tma.store_wait`` (+30, ``store_ns`` long, or per CTA: an array of n_ctas). Warps end
      30 ns (consumers), 50 ns
      (producer, epilogue) after their last event; idle warps live 200 ns.

    Returns (buffer words, metadata marked synthetic with meta["instrument"], vocabulary to
    decode it with). ``roles``: meta["instrument"]["roles"] (role -> warp indices), default
    None (the analysis infers them). Vectorized over CTAs; one step per k-tile.
    """
    if stages < 1 or k_tiles < 1 or consumer_warps < 1 or n_ctas < 1:
        raise ValueError("stages, k_tiles, consumer_warps and n_ctas must be >= 1")
    vocab = pipelined_vocab(stages)
    ev = {e.name: e.id for e in vocab.events}
    P = PIPELINE
    W = consumer_warps
    prod, epi = W, W + idle_warps + 1
    warps_per_cta = epi + 1
    load = np.broadcast_to(np.asarray(load_ns, np.int64), (n_ctas, k_tiles))
    mma = np.broadcast_to(np.asarray(mma_ns, np.int64), (n_ctas, k_tiles))
    store = np.broadcast_to(np.asarray(store_ns, np.int64), (n_ctas,))
    Bk, Ek, Ik = L.KIND_BEGIN, L.KIND_END, L.KIND_INSTANT
    progs: dict[int, list] = {w: [] for w in range(warps_per_cta)}  # warp -> [(t[n_ctas], id, kind, payload)]

    def rec(w, t, name, kind, payload=-1):
        progs[w].append((np.asarray(t, np.int64), ev[name], kind, payload))

    zero = np.zeros(n_ctas, np.int64)
    p_next = zero + 50
    q_next = [zero + 50 for _ in range(W)]
    released = np.zeros((k_tiles, n_ctas), np.int64)  # last consumer release per count
    rel_w = [zero] * W
    for c in range(k_tiles):
        acq_s = p_next
        free = acq_s if c < stages else np.maximum(acq_s, released[c - stages])
        acq_e = free + 10
        rec(prod, acq_s, f"{P}.acquire", Bk, c)
        rec(prod, acq_e, f"{P}.acquire", Ek, c)
        rec(prod, acq_e + 5, "tma.load", Ik)
        commit = acq_e + 10
        rec(prod, commit, f"{P}.commit", Ik, c)
        p_next = commit + producer_gap_ns
        landed = commit + load[:, c]
        for w in range(W):
            ws = q_next[w]
            we = np.maximum(ws, landed) + 10
            rec(w, ws, f"{P}.wait", Bk, c)
            rec(w, we, f"{P}.wait", Ek, c)
            rec(w, we + 10, "mma.commit", Ik)
            me = we + 20 + mma[:, c] + w * consumer_stagger_ns
            rec(w, we + 20, "mma.wait", Bk, 0)
            rec(w, me, "mma.wait", Ek, 0)
            rel_w[w] = me + 10
            rec(w, rel_w[w], f"{P}.release", Ik, c)
            q_next[w] = rel_w[w] + consumer_gap_ns
        released[c] = np.max(np.stack(rel_w), axis=0)
    bar_in = [rel_w[w] + 20 + (straggler_ns if w == W - 1 else 0) for w in range(W)]
    bar_out = np.max(np.stack(bar_in), axis=0) + 10
    ends = {}
    for w in range(W):
        rec(w, bar_in[w], "barrier.sync", Bk, 1)
        rec(w, bar_out, "barrier.sync", Ek, 1)
        rec(w, bar_out + 100, "barrier.arrive", Ik, 2)
        ends[w] = bar_out + 130
    ends[prod] = p_next - producer_gap_ns + 50
    e_out = bar_out + 100 + 10
    rec(epi, zero + 50, "barrier.sync", Bk, 2)
    rec(epi, e_out, "barrier.sync", Ek, 2)
    rec(epi, e_out + 20, "tma.store", Ik)
    rec(epi, e_out + 30, "tma.store_wait", Bk)
    rec(epi, e_out + 30 + store, "tma.store_wait", Ek)
    ends[epi] = e_out + 30 + store + 50
    for w in range(prod + 1, epi):
        ends[w] = zero + 200

    cap = max(8, max(len(p) for p in progs.values()))
    spec = L.BufferSpec(warps_per_cta, n_ctas, cap)
    gt_base = t0_ns
    warps = []
    for cta in range(n_ctas):
        g0 = gt_base + cta * cta_offset_ns
        for w in range(warps_per_cta):
            p = progs[w]
            t = np.array([r[0][cta] for r in p], np.int64) + g0
            g1 = g0 + int(ends[w][cta])
            warps.append(WarpEvents(cta, w, cta % sms, ROLE.UNKNOWN, g0, g1, g0, g1,
                                    np.array([r[2] for r in p], np.int64), np.array([r[1] for r in p], np.int64),
                                    np.array([r[3] for r in p], np.int64), t))
    buf = write_buffer(spec, warps, timebase=L.TIMEBASE_GLOBALTIMER)
    meta = {"kernel": kernel, "synthetic": True,
            "config": {"k_tiles": k_tiles, "stages": stages, "consumer_warps": W},
            "grid": [n_ctas, 1, 1], "block": [32 * warps_per_cta, 1, 1],
            "instrument": {"kernel": kernel, "arch": "sm_90a", "families": ["pipeline", "tma", "mma", "barrier"],
                           "pipelines": {P: {"class": "PipelineTmaAsync", "stages": stages}},
                           "roles": roles, "warps_per_cta": warps_per_cta, "synthetic": True}}
    return buf, meta, vocab


# ---- a sampled launch: some CTAs record, every CTA is timed --------------------------------------
# what fa4trace.auto.ctadeps reads from a kernel whose CTAs never talk to each other
NO_CTA_DEPENDENCIES = {"verdict": "none", "found": "", "waits_on_ctas": [], "waits_on_previous_grid": [],
                       "cluster_only": [], "fire_and_forget": []}


def sampled_like(*, n_ctas: int = 64, sms: int = 8, cta_first: int = 0, cta_stride: int = 1, n_recorded: int = 8,
                 work_ns: int = 10_000, slowdown: float = 0.25, opening_extra: float = 0.0, work_spread: float = 0.0,
                 work_gradient: float = 0.0, jitter: float = 0.01, warps_per_cta: int = 2,
                 lifetime_ctas: int | None = None, split: bool = True, events: bool = True, t0_ns: int = T0_NS,
                 seed: int = 0):
    """A launch of ``n_ctas`` CTAs on ``sms`` CTA slots, taken in CTA order as slots free up
    (known answers for fa4trace.analysis.fidelity's tests; marked synthetic).

    CTA i runs ``work_ns`` x (1 + ``work_gradient`` x i / (n_ctas - 1)) (work that grows along
    the grid, as under a causal mask) x (1 + a uniform draw in ±``work_spread``) x (1 +
    ``jitter`` noise), x (1 + ``slowdown``) when it records, x (1 + ``opening_extra``) when it
    starts in the first wave (the opening's contention). CTAs first, first+stride, ...
    (``n_recorded`` of them) record: each warp a lifetime and (``events``) one ``barrier.sync``
    span, in the globaltimer timebase, from ``t0_ns``. Every CTA below ``lifetime_ctas``
    (default all) gets its lifetime entry, as the device's stamps leave it. Its CTAs never wait
    on each other (meta ``instrument.cta_dependencies``). Returns (buffer words, metadata with
    meta["instrument"], vocabulary)."""
    rng = np.random.default_rng(seed)
    work = work_ns * (1 + work_gradient * np.arange(n_ctas) / max(n_ctas - 1, 1))
    work = work * (1 + rng.uniform(-work_spread, work_spread, n_ctas)) * (1 + jitter * rng.standard_normal(n_ctas))
    spec = L.BufferSpec.for_grid(n_ctas, warps_per_cta, 8, cta_first=cta_first, cta_stride=cta_stride,
                                 max_ctas=n_recorded, lifetime_ctas=n_ctas if lifetime_ctas is None else lifetime_ctas)
    recorded = np.isin(np.arange(n_ctas), spec.cta_of_slot(np.arange(spec.n_cta_slots)))
    work = work * np.where(recorded, 1 + slowdown, 1.0) * np.where(np.arange(n_ctas) < sms, 1 + opening_extra, 1.0)
    free = np.zeros(sms, np.int64)  # when each slot frees up, ns from t0
    start, end = np.zeros(n_ctas, np.int64), np.zeros(n_ctas, np.int64)
    for c in range(n_ctas):
        s = int(free.argmin())
        start[c] = free[s] + 40  # the launch of a CTA into a freed slot
        end[c] = start[c] + max(int(work[c]), 200)
        free[s] = end[c]
    return _timed_launch("synthetic.sampled", spec, sms, start, end, recorded, warps_per_cta, events, t0_ns,
                         {"n_ctas": n_ctas, "sms": sms, "slowdown": slowdown}, split, NO_CTA_DEPENDENCIES)


def _timed_launch(kernel: str, spec: L.BufferSpec, sms: int, start, end, recorded, warps_per_cta: int, events: bool,
                  t0_ns: int, config: dict, split: bool, deps: dict):
    """A launch's buffer from its CTAs' start and end (ns from ``t0_ns``): each recorded CTA's
    warps a lifetime and (``events``) one ``barrier.sync`` span; every CTA its lifetime entry."""
    vocab = pipelined_vocab(1)
    sync = next(e.id for e in vocab.events if e.name == "barrier.sync")
    warps = []
    for c in np.flatnonzero(recorded).tolist():
        for w in range(warps_per_cta):
            g0, g1 = t0_ns + start[c] + 10 + w, t0_ns + end[c] - 10 - w
            mid = (g0 + g1) // 2
            kinds, ids, pay, t = (([L.KIND_BEGIN, L.KIND_END], [sync, sync], [1, 1], [mid - 50, mid + 50]) if events
                                  else ([], [], [], []))
            warps.append(WarpEvents(c, w, c % sms, ROLE.UNKNOWN, g0, g1, g0, g1, np.array(kinds, np.int64),
                                    np.array(ids, np.int64), np.array(pay, np.int64), np.array(t, np.int64)))
    n_ctas = len(start)
    buf = write_buffer(spec, warps, timebase=L.TIMEBASE_GLOBALTIMER,
                       lifetimes=(np.arange(n_ctas), t0_ns + np.asarray(start), t0_ns + np.asarray(end)))
    meta = {"kernel": kernel, "synthetic": True, "config": config,
            "grid": [n_ctas, 1, 1], "block": [32 * warps_per_cta, 1, 1],
            "instrument": {"kernel": kernel, "arch": "sm_90a", "families": ["barrier"] if events else [],
                           "pipelines": {}, "roles": None, "warps_per_cta": warps_per_cta, "split": split,
                           "cta_lifetimes": True, "cta_dependencies": dict(deps), "synthetic": True}}
    return buf, meta, vocab


# what fa4trace.auto.ctadeps reads from a split-KV kernel whose CTAs take a ticket from a counter
SPLIT_KV_DEPENDENCIES = {
    "verdict": "waits_on_ctas",
    "found": "returning atomics on global memory (counters, tickets, semaphores, tile schedulers): "
             "atom.global.acq_rel.add.u32 x1; acquire gpu-scope loads of global memory (spin waits, polled "
             "counters): ld.acquire.gpu.global.b32 x2",
    "waits_on_ctas": [{"what": "returning atomics on global memory (counters, tickets, semaphores, tile schedulers)",
                       "ops": {"atom.global.acq_rel.add.u32": 1}},
                      {"what": "acquire gpu-scope loads of global memory (spin waits, polled counters)",
                       "ops": {"ld.acquire.gpu.global.b32": 2}}],
    "waits_on_previous_grid": [], "cluster_only": [], "fire_and_forget": []}


def split_kv_like(*, groups: int = 32, splits: int = 4, sms: int = 132, cta_first: int = 0, cta_stride: int = 1,
                  n_recorded: int = 32, work_ns: int = 10_000, combine_ns: int = 1_000, slowdown: float = 0.25,
                  jitter: float = 0.01, warps_per_cta: int = 2, events: bool = True, seed: int = 0):
    """A split-KV launch whose CTAs wait on each other (known answers for the perturbation
    statistic where it does not hold; marked synthetic).

    ``groups`` x ``splits`` CTAs, CTA c = split (c % splits) of group (c // splits), taken in CTA
    order by ``sms`` slots. Each runs its share of the KV, ``work_ns`` x (1 + ``jitter``
    noise), x (1 + ``slowdown``) when it records; then takes a ticket from its group's counter
    and waits until every split of the group has arrived, and combines one share of the
    output (``combine_ns``): every CTA of a group ends with its slowest split. A recorded
    (slowed) CTA so makes the untraced CTAs of its group longer: the in-launch comparison
    reads near 0% while every recorded CTA ran ``slowdown`` longer and the launch took longer.
    The metadata says the CTAs wait on each other (``instrument.cta_dependencies``) and holds
    the known answers: ``synthetic_truth`` {"cta_slowdown", "plain_ns", "traced_ns",
    "launch_cost"} (the launch run again with ``slowdown`` 0 on the same draws). Returns
    (buffer words, metadata, vocabulary)."""
    rng = np.random.default_rng(seed)
    n_ctas = groups * splits
    if n_ctas > sms:  # a group that waits on a split no slot will run: the kernel needs one wave
        raise ValueError(f"split_kv_like runs one wave: groups x splits ({n_ctas}) must fit the {sms} slots")
    base = work_ns * (1 + jitter * rng.standard_normal(n_ctas))
    spec = L.BufferSpec.for_grid(n_ctas, warps_per_cta, 8, cta_first=cta_first, cta_stride=cta_stride,
                                 max_ctas=n_recorded)
    recorded = np.isin(np.arange(n_ctas), spec.cta_of_slot(np.arange(spec.n_cta_slots)))

    def run(slow: float):
        start = np.full(n_ctas, 40, np.int64)
        arrive = start + (base * np.where(recorded, 1 + slow, 1.0)).astype(np.int64)
        last = arrive.reshape(groups, splits).max(axis=1).repeat(splits)  # every split of the group arrived
        return start, last + combine_ns

    start, end = run(slowdown)
    plain_start, plain_end = run(0.0)
    buf, meta, vocab = _timed_launch("synthetic.split_kv", spec, sms, start, end, recorded, warps_per_cta, events,
                                     T0_NS, {"groups": groups, "splits": splits, "sms": sms, "slowdown": slowdown},
                                     True, SPLIT_KV_DEPENDENCIES)
    plain_ns, traced_ns = int(plain_end.max() - plain_start.min()), int(end.max() - start.min())
    meta["synthetic_truth"] = {"cta_slowdown": slowdown, "plain_ns": plain_ns, "traced_ns": traced_ns,
                               "launch_cost": traced_ns / plain_ns - 1}
    return buf, meta, vocab
