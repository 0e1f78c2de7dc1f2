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

from . import layout as L
from .vocab import EV, ROLE


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
                 timebase: int = L.TIMEBASE_CLOCK64) -> np.ndarray:
    buf = spec.new_buffer()
    slots = buf[L.GLOBAL_HEADER_WORDS:].reshape(spec.n_slots, spec.slot_words)
    recorded = spec.recorded_warps
    for w in warps:
        rel = w.cta - spec.cta_first
        if rel < 0 or rel % spec.cta_stride or rel // spec.cta_stride >= spec.n_cta_slots or w.warp not in recorded:
            continue
        s = (rel // spec.cta_stride) * spec.warps_per_cta + recorded.index(w.warp)
        n = len(w.kind)
        attempted = n if w.attempted is None else w.attempted
        written = min(attempted, spec.capacity, n)
        hdr = slots[s, :L.WARP_HEADER_WORDS]
        hdr[L.W_MAGIC] = L.WARP_MAGIC | (L.FORMAT_VERSION << 32) | (timebase << 40) | (w.role << 48)
        hdr[L.W_IDS] = (w.sm & 0xFFFFFFFF) | (w.cta << 32)
        hdr[L.W_WARP] = w.warp
        hdr[L.W_GT0], hdr[L.W_CLK0], hdr[L.W_GT1], hdr[L.W_CLK1] = w.gt0, w.clk0, w.gt1, w.clk1
        hdr[L.W_COUNTS] = written | ((attempted - written) << 32)
        slots[s, L.WARP_HEADER_WORDS:L.WARP_HEADER_WORDS + written] = pack_records(
            w.t[:written], w.event[:written], w.kind[:written], w.payload[:written])
    return buf


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
                   capacity: int | None = None, seed: int = 0, ghz: float = 1.98) -> tuple[np.ndarray, dict]:
    """A plausible decode-attention buffer: 1 producer + 4 consumer warps per CTA.

    base:     QK(i) -> SOFTMAX(i) -> CORRECTION(i) -> PV(i), serial.
    pingpong: QK(i+1) is issued before SOFTMAX(i) and waited after PV(i) is issued.
    Returns (buffer words, launch metadata marked synthetic). Vectorized over CTAs and blocks.
    """
    if schedule not in ("base", "pingpong"):
        raise ValueError(f"schedule must be 'base' or 'pingpong', got {schedule!r}")
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
    slots = buf[L.GLOBAL_HEADER_WORDS:].reshape(spec.n_slots, spec.slot_words)
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
        slots[s, L.W_MAGIC] = L.WARP_MAGIC | (L.FORMAT_VERSION << 32) | (role << 48)
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
