"""An fp32 reference for decode attention, and the relative error against it."""

from __future__ import annotations

import math
from typing import Optional


def reference(q, k, v, softmax_scale: Optional[float] = None, *, max_elems: int = 1 << 28):
    """float32 attention on q's device: o [b, sq, hq, d] and lse [b, hq, sq].

    Query heads are grouped by KV head (no repeat of K/V), batches in chunks that keep the
    fp32 copies under ``max_elems`` elements each.
    """
    import torch

    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    r = hq // hkv
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    o = torch.empty(b, sq, hq, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(b, hq, sq, dtype=torch.float32, device=q.device)
    step = max(1, max_elems // max(1, sk * hkv * d))
    for b0 in range(0, b, step):
        b1 = min(b, b0 + step)
        qf = q[b0:b1].float().reshape(b1 - b0, sq, hkv, r, d).permute(0, 2, 3, 1, 4)  # b,hkv,r,sq,d
        qf = qf.reshape(b1 - b0, hkv, r * sq, d)
        kf = k[b0:b1].float().permute(0, 2, 1, 3)  # b, hkv, sk, d
        s = torch.matmul(qf, kf.transpose(-1, -2)) * scale  # b, hkv, r*sq, sk
        del kf
        l_ = torch.logsumexp(s, dim=-1)
        p = torch.softmax(s, dim=-1)
        del s
        vf = v[b0:b1].float().permute(0, 2, 1, 3)
        of = torch.matmul(p, vf)  # b, hkv, r*sq, d
        del p, vf
        o[b0:b1] = of.reshape(b1 - b0, hkv, r, sq, d).permute(0, 3, 1, 2, 4).reshape(b1 - b0, sq, hq, d)
        lse[b0:b1] = l_.reshape(b1 - b0, hkv, r, sq).reshape(b1 - b0, hq, sq)
    return o, lse


def rel_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN anywhere gives NaN)."""
    o = out.double()
    rf = ref.double()
    return float((o - rf).norm() / rf.norm())
