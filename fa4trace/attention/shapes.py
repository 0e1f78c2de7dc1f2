"""Decode attention's problem shape and the checks every argument passes before any GPU work.

The shape itself (``Shape``: b, sq, hq, hkv, sk, d, dtype, and the rules every attention
problem keeps) is the format's (``fa4trace.format.shape``), so that every layer can name a
problem by it; here are our kernels' own limits (``shape_problem``), how our kernels cut a
problem into CTAs (``m_blocks``, ``groups``) and the tensors' checks (``validate``).

CPU-testable: ``validate`` needs only torch tensors' attributes. A bad argument raises one
``ValueError`` line that names it.
"""

from __future__ import annotations

import math
from typing import Optional

from ..format import shape as F
from ..format.shape import Shape
from ..kernels.decode_spec import HEAD_DIMS, MAX_RATIO, MAX_SQ, SCHEDULES, TILE_M


def m_blocks(shape: Shape, block_rows: int = TILE_M) -> int:
    """CTAs per (batch, kv head) that share its packed query rows, ``block_rows`` each."""
    return -(-shape.sq * shape.ratio // block_rows)


def groups(shape: Shape, block_rows: int = TILE_M) -> int:
    """(batch, kv head, m-block) triples: each is split over the KV and combined."""
    return shape.b * shape.hkv * m_blocks(shape, block_rows)


def _dtype_name(t) -> str:
    import torch

    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(t.dtype, str(t.dtype).replace("torch.", ""))


# How shape_problem names the sizes: the tensor API's words (the CLI passes its flags).
SHAPE_NAMES = {"b": "q batch", "sq": "q sequence length (dim 1)", "hq": "q heads", "hkv": "k heads",
               "sk": "k sequence length (dim 1)", "d": "q head dim"}


def shape_problem(*, b: int, sq: int, hq: int, hkv: int, sk: int, d: int, names=SHAPE_NAMES,
                  ours: bool = True) -> Optional[str]:
    """The size rules of decode attention, as one line naming the size, or None if they hold.
    ``ours``: also the limits of our kernels (head dim, q length, GQA ratio); FA4 has its own.
    Shared by ``validate`` (tensors) and ``fa4trace record`` (flags, checked before any GPU);
    the rules every problem keeps are ``fa4trace.format.shape.problem``'s."""
    general = F.problem(b=b, sq=sq, hq=hq, hkv=hkv, sk=sk, d=d, names=names)
    if general:
        return general
    if ours and d not in HEAD_DIMS:
        return f"{names['d']} must be one of {', '.join(map(str, HEAD_DIMS))}, got {d}"
    if ours and sq > MAX_SQ:
        return f"{names['sq']} must be 1..{MAX_SQ}, got {sq}"
    if ours and hq // hkv > MAX_RATIO:
        return f"{names['hq']} / {names['hkv']} must be <= {MAX_RATIO}, got {hq}/{hkv} = {hq // hkv}"
    return None


def validate(q, k, v, *, schedule: str = "pingpong", num_splits=None, softmax_scale=None,
             trace=None, require_cuda: bool = True) -> Shape:
    """Check every argument; raise ``ValueError`` (one line, naming the argument) or return the shape."""
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D ([b, s, h, d]), got shape {tuple(t.shape)}")
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"{name} must be bfloat16 or float16, got {t.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        bad = "k" if k.dtype != q.dtype else "v"
        raise ValueError(f"{bad} dtype {getattr(k if bad == 'k' else v, 'dtype')} differs from q dtype {q.dtype}")
    b, sq, hq, d = q.shape
    bk, sk, hkv, dk = k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v shape {tuple(v.shape)} differs from k shape {tuple(k.shape)}")
    if dk != d:
        raise ValueError(f"k head dim {dk} differs from q head dim {d}")
    if bk != b:
        raise ValueError(f"k batch {bk} differs from q batch {b}")
    problem = shape_problem(b=b, sq=sq, hq=hq, hkv=hkv, sk=sk, d=d)
    if problem:
        raise ValueError(problem)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if require_cuda and t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor, got device {t.device}")
    if k.device != q.device or v.device != q.device:
        bad = "k" if k.device != q.device else "v"
        raise ValueError(f"{bad} is on {(k if bad == 'k' else v).device}, q on {q.device}: use one device")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (FA layout [b, s, h, d], row-major); call .contiguous()")
        if t.data_ptr() % 16:
            raise ValueError(f"{name} data pointer must be 16-byte aligned")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
            raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    if softmax_scale is not None:
        if not isinstance(softmax_scale, (int, float)) or not math.isfinite(softmax_scale) or softmax_scale <= 0:
            raise ValueError(f"softmax_scale must be a finite positive number or None, got {softmax_scale!r}")
    if trace is not None:
        if not isinstance(trace, torch.Tensor) or trace.dtype != torch.int64 or trace.dim() != 1:
            raise ValueError("trace must be a 1-D int64 torch tensor (a BufferSpec buffer), or None")
        if require_cuda and trace.device != q.device:
            raise ValueError(f"trace must be on {q.device}, got {trace.device}")
        if not trace.is_contiguous():
            raise ValueError("trace must be contiguous")
    return Shape(b, sq, hq, hkv, sk, d, _dtype_name(q))
