"""Decode attention on Hopper: the torch-facing API of the kernels in ``kernels/attention_sm90.py``.

    o = fa4trace.attention.decode_attention(q, k, v, schedule="pingpong")
    o, lse = decode_attention(q, k, v, num_splits=32, return_lse=True)

q ``[b, sq, hq, d]``, k and v ``[b, sk, hkv, d]`` (FA layout, contiguous), bf16 or fp16, on one
CUDA device; d in {64, 128}; hq % hkv == 0 with hq/hkv <= 16; sq 1..8; sk >= 1.
Returns o ``[b, sq, hq, d]`` (and lse ``[b, hq, sq]``, fp32, natural log).

Kernels come from the CuTe DSL (compiled here, JIT) where ``cutlass`` imports and a GPU is
present, otherwise from an AOT build folder (``fa4trace build``; ``$FA4TRACE_BUILD`` or
``./build/kernels``). Validation runs first and needs neither: a bad argument raises a
one-line ``ValueError`` naming it.

Variants: when all packed query rows of a KV head fit in 32 (sq * hq/hkv <= 32) a CTA serves
32 rows, one per consumer thread (``default_block_rows``), else 64; ``block_rows=`` forces one
(the results are bitwise equal). ``tile_n`` and ``ctas_per_sm`` pick other built variants
(benchmark options ``@n..``, ``@o..``).

Split-KV: the KV of each (batch, kv head) is cut into ``num_splits`` ranges so that all SMs
stream; partial results are combined inside the same launch (see the kernel's docstring).
The combine's counters are cached per device and left consistent by every launch (no memset
between graph replays); two launches that share them must not run concurrently (one stream
at a time).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .errors import DeviceUnavailable, Fa4traceError

# base: QK -> softmax -> PV, one at a time; pingpong: QK(i+1) overlaps softmax(i) (two S tiles);
# intrawg: FA3's intra-warpgroup overlap, softmax(i) overlaps PV(i-1) (one S tile).
SCHEDULES = ("base", "pingpong", "intrawg")
HEAD_DIMS = (64, 128)
MAX_RATIO = 16
MAX_SQ = 8
TILE_M = 64
WARPS_PER_CTA = 5  # 4 consumer warps (one warpgroup) + 1 producer warp
# One warp per role: the consumer warpgroup's warps run in step (every wgmma is the whole
# warpgroup's), so warp 0 shows what the other three do; recording only it and the producer
# stores a quarter of the records, which is what most of the tracing cost is at d128, b >= 8
# (BENCHMARKS.md, fifth session). ``fa4trace record --warps lead``.
LEAD_WARPS = (0, 4)
COMBINE_UNROLL = 16  # splits per combine thread (kernel constant)
# Which events a traced kernel records (``trace_events=``, ``fa4trace record --events``):
# "core"   loads, QK and PV in flight, softmax, correction, epilogue, combine and the split's
#          ticket mark: everything the schedule is about (the vocabulary); the default.
# "stalls" core plus WAIT_K / WAIT_V, the consumer waiting for a K or V stage to land (what
#          shows a consumer starved by the stream). Their probe sits next to the stage wait,
#          where any recorder code makes ptxas keep the pipeline state in vector registers for
#          the whole mainloop (SASS, BENCHMARKS.md seventh session): traced with every warp, the
#          d64 ping-pong at sk 131072 costs +8% to +21% with them, +3% to +11% without (eighth).
CORE_EVENTS = ("LOAD_Q", "LOAD_K", "LOAD_V", "QK", "SOFTMAX", "CORRECTION", "PV", "EPILOGUE", "COMBINE", "MARK")
STALL_EVENTS = ("WAIT_K", "WAIT_V")
TRACE_EVENTS = {"core": CORE_EVENTS, "stalls": CORE_EVENTS + STALL_EVENTS}
MAX_SPLITS = 256  # <= COMBINE_UNROLL * the 32 partitions one warp holds
COUNTER_WORDS = 4  # int32 words per group: [arrival count, its value at the next launch's start, -, -]
# Default KV tile per (head dim, schedule); the ping-pong keeps two S tiles in registers.
DEFAULT_TILE_N = {(64, "base"): 128, (128, "base"): 128, (64, "pingpong"): 64, (128, "pingpong"): 64,
                  (64, "intrawg"): 128, (128, "intrawg"): 64}
# CTAs resident per SM a variant is built for (each gets half the shared memory at 2).
DEFAULT_CTAS_PER_SM = {key: 1 for key in DEFAULT_TILE_N}


def trace_event_ids(events: str) -> frozenset:
    """Event ids a traced variant of this event set compiles in (the others compile to nothing).

    ``events``: a name of ``TRACE_EVENTS``; for experiments also a comma list of event names
    ("none" for no event), which JIT compiles and experiment builds (``benchmarks/attn_build.py
    --trace-events``) hold, but ``fa4trace build`` does not."""
    from .vocab import VOCAB

    if not isinstance(events, str):
        raise ValueError(f"trace_events must be one of {', '.join(TRACE_EVENTS)}, got {events!r}")
    if events in TRACE_EVENTS:
        return frozenset(VOCAB.event(n).id for n in TRACE_EVENTS[events])
    names = [n for n in events.split(",") if n and n != "none"]
    known = {e.name for e in VOCAB.events}
    if (not names and events != "none") or any(n not in known for n in names):
        raise ValueError(f"trace_events must be one of {', '.join(TRACE_EVENTS)} (or a comma list of event "
                         f"names), got {events!r}")
    return frozenset(VOCAB.event(n).id for n in names)


def _event_names(events: str) -> list:
    """The names of a traced variant's events: its TRACE_EVENTS entry, else (an experiment's
    comma list) the names of ``trace_event_ids`` by id."""
    if events in TRACE_EVENTS:
        return list(TRACE_EVENTS[events])
    from .vocab import VOCAB

    return [VOCAB.event(i).name for i in sorted(trace_event_ids(events))]


# ----------------------------------------------------------------------------------------
# validation (CPU-testable: needs torch tensors' attributes only)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    b: int
    sq: int
    hq: int
    hkv: int
    sk: int
    d: int
    dtype: str  # "bf16" | "fp16"

    @property
    def ratio(self) -> int:
        return self.hq // self.hkv

    def m_blocks(self, block_rows: int = TILE_M) -> int:
        """CTAs per (batch, kv head) that share its packed query rows, ``block_rows`` each."""
        return -(-self.sq * self.ratio // block_rows)

    def groups(self, block_rows: int = TILE_M) -> int:
        """(batch, kv head, m-block) triples: each is split over the KV and combined."""
        return self.b * self.hkv * self.m_blocks(block_rows)

    def kv_bytes(self, elem: int = 2) -> int:
        return 2 * self.b * self.sk * self.hkv * self.d * elem

    def io_bytes(self, elem: int = 2) -> int:
        """Q + K + V + O: the fewest bytes the problem must move."""
        return self.kv_bytes(elem) + 2 * self.b * self.sq * self.hq * self.d * elem


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
    Shared by ``validate`` (tensors) and ``fa4trace record`` (flags, checked before any GPU)."""
    for key, value in (("b", b), ("sq", sq), ("hq", hq), ("hkv", hkv), ("sk", sk), ("d", d)):
        if value < 1:
            return f"{names[key]} must be >= 1, got {value}"
    if ours and d not in HEAD_DIMS:
        return f"{names['d']} must be one of {', '.join(map(str, HEAD_DIMS))}, got {d}"
    if ours and sq > MAX_SQ:
        return f"{names['sq']} must be 1..{MAX_SQ}, got {sq}"
    if hq % hkv:
        return f"{names['hq']} ({hq}) must be a multiple of {names['hkv']} ({hkv})"
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


# ----------------------------------------------------------------------------------------
# split-KV plan (pure Python)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    tile_n: int
    n_blocks: int  # KV blocks of tile_n keys per (batch, kv head)
    n_splits: int
    n_comb: int  # CTAs per group that combine (the last n_comb to finish)
    comb_nc4: int  # float4 columns per combine item
    comb_parts: int  # threads summing different splits of one output float4
    grid: tuple  # (x, y, z) = (kv heads * m-blocks, splits, batch)
    block_rows: int = TILE_M  # query rows per CTA (the kernel variant's)

    @property
    def groups(self) -> int:
        """(batch, kv head, m-block) triples: grid x * z."""
        return self.grid[0] * self.grid[2]

    @property
    def n_ctas(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def n_parts(self) -> int:
        """Partials per group that the combine merges (one per split)."""
        return self.n_splits

    def kernel_args(self, softmax_scale: float) -> tuple:
        """The kernel's scalar arguments (kernels.attention_sm90.SCALAR_ARGS order)."""
        return (softmax_scale, self.n_splits, self.n_comb, self.comb_nc4.bit_length() - 1,
                self.comb_parts.bit_length() - 1)

    def workspace_floats(self, shape: Shape) -> tuple[int, int]:
        if self.n_splits == 1:
            return 4, 4
        n = self.groups * self.n_splits * TILE_M  # partials keep the 64-row stride
        return n * shape.d, n


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def default_block_rows(shape: Shape) -> int:
    """32-row CTAs (one row per consumer thread, half the softmax work) when all packed query
    rows of a KV head fit in 32, else 64 (a second m-block would read the KV twice)."""
    return 32 if shape.sq * shape.ratio <= 32 else TILE_M


def combine_cuts(shape: Shape, n_splits: int, groups: int, num_sms: int,
                 block_rows: int = TILE_M) -> list[tuple[int, int, int, int]]:
    """The ways the in-launch combine of ``n_splits`` partials can be cut, as (most combiner
    CTAs per group, NC4, P, work items): threads = NC4 float4 columns x P split partitions (<=
    COMBINE_UNROLL splits each) x R rows = 128. P from the fewest partitions that hold the
    splits up to a warp's 32, NC4 ascending. The most combiners keeps ``groups * (n_comb - 1)
    < num_sms`` (see ``plan_splits``)."""
    t_max = max(1, min(n_splits, (num_sms - 1) // groups + 1))
    rows = min(block_rows, shape.sq * shape.ratio)  # rows of the fullest m-block
    nc4_full = shape.d // 4
    parts = _pow2_ceil(-(-n_splits // COMBINE_UNROLL))
    cuts = []
    while parts <= 32:
        nc4 = 1
        while nc4 <= nc4_full and nc4 * parts <= 128:
            cuts.append((t_max, nc4, parts, -(-rows // (128 // (nc4 * parts))) * (nc4_full // nc4)))
            nc4 *= 2
        parts *= 2
    return cuts


def plan_splits(shape: Shape, tile_n: int, num_sms: int, num_splits: Optional[int] = None,
                ctas_per_sm: int = 1, block_rows: int = TILE_M) -> Plan:
    """How many KV splits per (batch, kv head, m-block), and how the in-launch combine is cut.

    Default: fill the SMs once (decode is memory-bound: every SM should stream KV) without
    exceeding ``ctas_per_sm`` CTAs per SM, with at least one KV block per split.
    The combine needs ``groups * (n_comb - 1) < num_sms`` (only waiting CTAs can hold SMs,
    and at least one SM must stay free for the CTAs not yet running): no deadlock even when
    the grid does not fit the GPU at once.
    """
    if num_sms < 1:
        raise ValueError(f"num_sms must be >= 1, got {num_sms}")
    n_blocks = -(-shape.sk // tile_n)
    groups = shape.groups(block_rows)
    if num_splits is None:
        s = max(1, num_sms * ctas_per_sm // groups)
    else:
        s = int(num_splits)
    s = max(1, min(s, n_blocks, MAX_SPLITS))
    grid = (shape.m_blocks(block_rows) * shape.hkv, s, shape.b)
    if s == 1:
        return Plan(tile_n, n_blocks, 1, 1, 1, 1, grid, block_rows)
    # Fewest rounds (one L2 round trip each) first, then the widest contiguous column piece
    # per split row (coalescing), then fewer waiting CTAs; the fewest partitions that hold
    # the splits (the first cuts).
    cuts = combine_cuts(shape, s, groups, num_sms, block_rows)
    best = None
    for t_max, nc4, parts, n_items in cuts:
        if parts != cuts[0][2]:
            break
        t = max(1, min(t_max, n_items))
        key = (-(-n_items // t), -nc4, t)
        if best is None or key < best[0]:
            best = (key, t, nc4, parts)
    _, t, nc4, parts = best
    return Plan(tile_n, n_blocks, s, t, nc4, parts, grid, block_rows)


def trace_capacity(plan: Plan) -> int:
    """Records per warp for one launch: 12 per KV block (consumer) plus epilogue/combine slack."""
    blocks = -(-plan.n_blocks // plan.n_splits)
    return 32 * (-(-(12 * blocks + 24) // 32))


# ----------------------------------------------------------------------------------------
# kernels: JIT (CuTe DSL here) or AOT (built folder)
# ----------------------------------------------------------------------------------------
_JIT_CACHE: dict = {}
_COUNTERS: dict = {}


def _build_dir(build=None) -> Path:
    from .kernel_loader import build_dir

    return build_dir(build)


def _use_jit(build=None) -> bool:
    """JIT where the DSL and a GPU are here, unless a build folder is named (arg or env)."""
    if build is not None or os.environ.get("FA4TRACE_BUILD"):
        return False
    from .kernel_loader import can_jit

    return can_jit()


@dataclass(frozen=True)
class Kernel:
    """One compiled variant and the compile-time facts the launch plan needs."""
    fn: Any
    tile_n: int
    ctas_per_sm: int
    block_rows: int
    build: Any = None  # the aot.BuildDir it came from (None: compiled here, this recorder)


def kernel_function(head_dim: int, schedule: str, dtype: str, traced: bool,
                    tile_n: Optional[int] = None, build=None, ctas_per_sm: Optional[int] = None,
                    block_rows: int = TILE_M, trace_events: str = "core", pdl: bool = False) -> Kernel:
    """One variant, JIT-compiled or loaded from the AOT build.

    Its ``fn`` takes (q, k, v, o, lse, o_part, lse_part, count, *Plan.kernel_args(scale),
    trace) with trace None for the uninstrumented variant. ``ctas_per_sm``: CTAs resident per
    SM the variant is built for (shared memory split between them); the split plan fills that.
    ``block_rows``: query rows per CTA, 64 or 32 (``default_block_rows``). ``trace_events``: the
    event set of a traced variant (``TRACE_EVENTS``; ignored untraced). ``pdl``: the untraced
    variant launched with programmatic dependent launch (see ``decode_attention``)."""
    if pdl and traced:
        raise ValueError("pdl=True runs the uninstrumented kernel only (trace must be None)")
    want_tile = tile_n or DEFAULT_TILE_N[(head_dim, schedule)]
    want_occ = ctas_per_sm or DEFAULT_CTAS_PER_SM[(head_dim, schedule)]
    events = trace_events if traced else None
    ids = trace_event_ids(events) if traced else None  # a known set, or one clear error
    key = (head_dim, schedule, dtype, traced, want_tile, want_occ, block_rows, events, bool(pdl), str(build))
    if key in _JIT_CACHE:
        return _JIT_CACHE[key]
    if _use_jit(build):
        from fa4trace.kernels.attention_sm90 import compile_variant

        fn, kern = compile_variant(head_dim, schedule, dtype, traced, tile_n=want_tile, ctas_per_sm=want_occ,
                                   block_rows=block_rows,
                                   **({"trace_events": ids} if traced else {"pdl": int(bool(pdl))}))
        _JIT_CACHE[key] = Kernel(fn, kern.tile_n, kern.ctas_per_sm, kern.block_rows)
        return _JIT_CACHE[key]
    from .aot import BuildDir

    path = _build_dir(build)
    if not (path / "manifest.json").is_file():
        raise DeviceUnavailable(
            f"no CuTe DSL here and no kernel build at {path}: run `fa4trace build -o {path}` on a machine "
            "with nvidia-cutlass-dsl, or set FA4TRACE_BUILD")
    bd = _BUILD_DIRS.get(str(path))
    if bd is None:
        bd = _BUILD_DIRS[str(path)] = BuildDir(path)
    cfg = dict(head_dim=head_dim, schedule=schedule, dtype=dtype, traced=traced, pdl=bool(pdl))
    if traced:
        # The compiled-in event ids say what a traced kernel records. Builds made before event
        # sets (and experiment builds) recorded every event, which their manifests say as None.
        cfg["trace_events"] = sorted(ids)
    any_tile = tile_n is None and ctas_per_sm is None
    name = _find_variant(bd, cfg, want_tile, want_occ, block_rows, any_tile)
    if name is None and traced and events == "stalls":
        name = _find_variant(bd, {**cfg, "trace_events": None}, want_tile, want_occ, block_rows, any_tile)
    if name is None:
        want = ", ".join(f"{k}={v}" for k, v in {**cfg, "tile_n": want_tile, "ctas_per_sm": want_occ,
                                                 "block_rows": block_rows}.items() if k != "trace_events")
        what = f" recording the {events!r} event set" if traced else ""
        raise Fa4traceError(f"no built attention kernel with {want}{what} in {path}; rebuild with `fa4trace build`")
    conf = bd.functions[name]["config"]
    _JIT_CACHE[key] = Kernel(bd.function(name), int(conf["tile_n"]), int(conf.get("ctas_per_sm", 1)),
                             int(conf.get("block_rows", TILE_M)), bd)
    return _JIT_CACHE[key]


def _find_variant(bd, cfg: dict, tile_n: int, ctas_per_sm: int, block_rows: int, any_tile: bool):
    """The build's function for cfg at this tile / occupancy / rows, or None. ``any_tile``: a
    build made with other defaults (older builds know 64-row kernels only) may answer with
    whatever it has; the launch plan follows what the found kernel was built for."""
    try:
        return bd.find("attention", tile_n=tile_n, ctas_per_sm=ctas_per_sm, block_rows=block_rows, **cfg)
    except Fa4traceError:
        if not any_tile:
            return None
    try:
        return bd.find("attention", **cfg)
    except Fa4traceError:
        return None


def _resolve(shape: Shape, schedule: str, traced: bool, num_splits, device, *, tile_n=None,
             ctas_per_sm=None, block_rows=None, build=None, trace_events: str = "core",
             pdl: bool = False) -> tuple[Kernel, Plan]:
    """The kernel variant for this shape and the split plan of its launch."""
    if block_rows not in (None, 32, TILE_M):
        raise ValueError(f"block_rows must be 32 or 64, got {block_rows!r}")
    kern = kernel_function(shape.d, schedule, shape.dtype, traced, tile_n, build, ctas_per_sm,
                           block_rows or default_block_rows(shape), trace_events, pdl)
    plan = plan_splits(shape, kern.tile_n, num_sms(device), num_splits, kern.ctas_per_sm, kern.block_rows)
    return kern, plan


_BUILD_DIRS: dict = {}


def workspaces(shape: Shape, plan: Plan, device) -> tuple:
    """(lse, o_part, lse_part, count): the kernel's outputs and scratch besides o for one
    launch of ``plan`` (the counters are the device's cached ones, see ``_counters``)."""
    import torch

    n_o, n_l = plan.workspace_floats(shape)
    return (torch.empty((shape.b, shape.hq, shape.sq), dtype=torch.float32, device=device),
            torch.empty(n_o, dtype=torch.float32, device=device),
            torch.empty(n_l, dtype=torch.float32, device=device),
            _counters(device, COUNTER_WORDS * plan.groups))


def _counters(device, n: int):
    """Per-device int32 words of the in-launch combine, COUNTER_WORDS per group: an arrival
    count and its value at the start of the next launch (every launch leaves the two equal),
    two spare words. Zero once at allocation."""
    import torch

    cur = _COUNTERS.get(device)
    if cur is None or cur.numel() < n:
        cur = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _COUNTERS[device] = cur
    return cur


def num_sms(device) -> int:
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


# ----------------------------------------------------------------------------------------
# public entry points
# ----------------------------------------------------------------------------------------
def decode_attention(q, k, v, *, schedule: str = "pingpong", num_splits: Optional[int] = None,
                     softmax_scale: Optional[float] = None, trace=None, return_lse: bool = False,
                     out=None, tile_n: Optional[int] = None, build=None,
                     ctas_per_sm: Optional[int] = None, block_rows: Optional[int] = None,
                     trace_events: str = "core", pdl: bool = False):
    """Multi-token decode attention (see the module docstring). ``schedule``: "pingpong" (QK(i+1)
    overlaps softmax(i)), "base" (no overlap) or "intrawg" (FA3's: softmax(i) overlaps PV(i-1));
    same math, outputs within rounding of each other. ``trace``: a recorder buffer
    (``trace_buffer``) to run the instrumented kernel; None runs the uninstrumented one.
    ``trace_events``: what the instrumented kernel records, "core" or "stalls" (core plus the
    consumer's waits for K/V: costlier, see ``TRACE_EVENTS``); the output is the same bits.
    ``tile_n``, ``ctas_per_sm``, ``block_rows``: pick a non-default kernel variant.
    ``pdl``: launch with programmatic dependent launch (uninstrumented kernel only): the launch
    may begin while the stream's previous kernel ends; its threads wait for that kernel to
    finish (``griddepcontrol.wait``) before they touch memory, and its CTAs let the next
    kernel launch once their part of the KV stream is done. Same output bits. Hides the gap
    between consecutive kernels: on the H200, launched after itself, -2 to -5% at sk 131072
    b 1 and up to -19% at sk 4096, but 1-5% slower at b >= 8, sk 131072 (BENCHMARKS.md), so it
    is off by default."""
    trace_event_ids(trace_events)  # a known set, or a one-line ValueError
    if pdl and trace is not None:
        raise ValueError("pdl=True runs the uninstrumented kernel only: pass trace=None")
    shape = validate(q, k, v, schedule=schedule, num_splits=num_splits, softmax_scale=softmax_scale,
                     trace=trace)
    import torch

    kern, plan = _resolve(shape, schedule, trace is not None, num_splits, q.device, tile_n=tile_n,
                          ctas_per_sm=ctas_per_sm, block_rows=block_rows, build=build,
                          trace_events=trace_events, pdl=pdl)
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(shape.d)
    o = out if out is not None else torch.empty_like(q)
    lse, o_part, lse_part, count = workspaces(shape, plan, q.device)
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device
                            or not out.is_contiguous()):
        raise ValueError("out must be a contiguous tensor with q's shape, dtype and device")
    kern.fn(q, k, v, o, lse, o_part, lse_part, count, *plan.kernel_args(scale), trace)
    return (o, lse) if return_lse else o


def trace_buffer(q, k, v, *, schedule: str = "pingpong", num_splits: Optional[int] = None,
                 cta_first: int = 0, cta_stride: int = 1, max_ctas: Optional[int] = None,
                 capacity: Optional[int] = None, tile_n: Optional[int] = None, build=None,
                 ctas_per_sm: Optional[int] = None, block_rows: Optional[int] = None, warps=None,
                 trace_events: str = "core"):
    """A zeroed recorder buffer on q's device sized for this launch; returns (tensor, BufferSpec, Plan).
    ``warps``: the warp indices that record (default all five; ``LEAD_WARPS`` = one warp per role).
    ``trace_events``: the event set the launch will record (the variant must exist)."""
    import numpy as np
    import torch

    from .layout import BufferSpec

    shape = validate(q, k, v, schedule=schedule, num_splits=num_splits)
    kern, plan = _resolve(shape, schedule, True, num_splits, q.device, tile_n=tile_n, ctas_per_sm=ctas_per_sm,
                          block_rows=block_rows, build=build, trace_events=trace_events)
    if warps is not None and kern.build is not None:
        kern.build.require_warp_mask()
    spec = BufferSpec.for_grid(plan.n_ctas, WARPS_PER_CTA, capacity or trace_capacity(plan),
                               cta_first=cta_first, cta_stride=cta_stride, max_ctas=max_ctas, warps=warps)
    buf = torch.from_numpy(spec.new_buffer().view(np.int64)).to(q.device)
    return buf, spec, plan


def record_attention(schedule: str = "pingpong", d: int = 128, hq: int = 16, hkv: int = 1, sk: int = 32768,
                     b: int = 1, sq: int = 1, dtype: str = "bf16", out_path: Optional[str] = None, *,
                     num_splits: Optional[int] = None, cta_first: int = 0, cta_stride: int = 1,
                     max_ctas: Optional[int] = None, capacity: Optional[int] = None, build=None,
                     seed: int = 0, overwrite: bool = False, warps=None, trace_events: str = "core"):
    """One traced launch on random inputs, decoded into a bundle (returns the Trace; saves it
    when ``out_path`` is given). ``trace_events``: "core" or "stalls" (``TRACE_EVENTS``).

    The uninstrumented kernel runs on the same inputs first: the traced output must equal it
    bit for bit (else Fa4traceError). Both are timed by CUDA-graph replay on these inputs
    (10 launches per graph, median of 20 replays; one input set, so L2 holds what of the KV
    fits: the benchmark's cold-L2 numbers are the reference) into ``meta['timing']``:
    ``kernel_us`` is the uninstrumented kernel, ``traced_us`` the recorded one.
    """
    from .gpu import require_cuda
    from .record import TracedLaunch, record

    torch = require_cuda()
    if dtype not in ("bf16", "fp16"):
        raise ValueError(f"dtype must be bf16 or fp16, got {dtype!r}")
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, hq, d, dtype=tdt, device="cuda", generator=g)
    k = torch.randn(b, sk, hkv, d, dtype=tdt, device="cuda", generator=g)
    v = torch.randn(b, sk, hkv, d, dtype=tdt, device="cuda", generator=g)
    shape = validate(q, k, v, schedule=schedule, num_splits=num_splits)
    kern, plan = _resolve(shape, schedule, True, num_splits, q.device, build=build, trace_events=trace_events)
    tn = kern.tile_n
    cap = capacity or trace_capacity(plan)
    kw = dict(schedule=schedule, num_splits=num_splits, build=build)
    tkw = dict(kw, trace_events=trace_events)

    scratch = trace_buffer(q, k, v, capacity=cap, cta_first=cta_first, cta_stride=cta_stride,
                           max_ctas=max_ctas, warps=warps, **tkw)[0]
    o_plain = torch.empty_like(q)
    # 10 launches per graph: one launch per replay would add the graph's own launch latency
    # (seen on the H200: 32 us per replay for a 24 us kernel).
    us_plain, _ = _graph_time(lambda i: decode_attention(q, k, v, out=o_plain, **kw), 1, 20, 10)
    us_traced, _ = _graph_time(lambda i: decode_attention(q, k, v, trace=scratch, **tkw), 1, 20, 10)
    torch.cuda.synchronize()
    outs = []

    def run(tr):
        outs.append(decode_attention(q, k, v, trace=tr, **tkw))

    launch = TracedLaunch(kernel="decode_attention_sm90", grid_ctas=plan.n_ctas, warps_per_cta=WARPS_PER_CTA,
                          run=run, grid=plan.grid, block=(32 * WARPS_PER_CTA, 1, 1), capacity=cap,
                          cta_first=cta_first, cta_stride=cta_stride, max_ctas=max_ctas, warps=warps,
                          extra={"n_splits": plan.n_splits, "n_comb": plan.n_comb})
    config = {"schedule": schedule, "head_dim": d, "d": d, "hq": hq, "hkv": hkv, "sk": sk, "b": b, "sq": sq,
              "dtype": dtype, "tile_m": TILE_M, "block_rows": plan.block_rows, "tile_n": tn,
              "trace_events": trace_events, "events_compiled": _event_names(trace_events),
              "n_blocks": plan.n_blocks,
              "n_splits": plan.n_splits, "n_comb": plan.n_comb, "comb_nc4": plan.comb_nc4,
              "comb_parts": plan.comb_parts, "io_bytes": shape.io_bytes(), "kv_bytes": shape.kv_bytes()}
    trace = record([launch], kernel="decode_attention_sm90", config=config,
                   timing={"kernel_us": us_plain, "traced_us": us_traced,
                           "method": "CUDA graph replay (10 launches per graph), median of 20, the recorded inputs"})
    if not torch.equal(o_plain, outs[0]):
        raise Fa4traceError("traced and untraced outputs differ: the recorder changed the kernel's result")
    if out_path is not None:
        trace.save(out_path, overwrite=overwrite)
    return trace


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


# ----------------------------------------------------------------------------------------
# benchmark: CUDA-graph replay, cold L2, same inputs for every kernel
# ----------------------------------------------------------------------------------------
PEAK_TBPS = 4.8
L2_ROTATE_BYTES = 256 << 20
# Each graph replay carries a fixed cost that the per-launch time takes a 1/launches share of:
# on the H200 an empty kernel read 4.15 / 2.48 / 1.04 us per launch with 4 / 8 / 16 launches
# per replay, and 0.75 us with 64 (BENCHMARKS.md, fifth session). A replay therefore holds
# enough launches for about REPLAY_BYTES of KV traffic (at least 8, at most 64; 64 at d128 b 1).
REPLAY_BYTES = 8 << 30


@dataclass
class BenchRow:
    shape: Shape
    kernel: str
    us: float  # median per launch
    us_spread: float  # (p90 - p10) / 2 over replays
    rel_err: float
    extra: dict

    @property
    def tbps(self) -> float:
        return self.shape.io_bytes() / (self.us * 1e-6) / 1e12


def launches_per_graph(set_bytes: int) -> tuple[int, int]:
    """(input sets, launches per graph) for one input set of ``set_bytes`` of KV: enough sets
    to rotate through L2_ROTATE_BYTES (1..64; consecutive launches read different sets, so L2
    is cold), and a multiple of them that makes each replay about REPLAY_BYTES of traffic
    (8..64 launches), so the replay's fixed cost is spread thin."""
    n_sets = max(1, min(64, -(-L2_ROTATE_BYTES // set_bytes)))
    want = max(8, min(64, -(-REPLAY_BYTES // set_bytes)))
    return n_sets, n_sets * -(-want // n_sets)


def cold_l2_inputs(shape: Shape, *, seed: int = 0, device: str = "cuda"):
    """Random (q, k, v, out) sets for timing ``shape`` with a cold L2: as many sets as make up
    L2_ROTATE_BYTES of KV (1..64), and the launches per graph that cycle through them
    (``_graph_time``). Returns (sets, per_graph)."""
    import torch

    tdt = torch.bfloat16 if shape.dtype == "bf16" else torch.float16
    g = torch.Generator(device=device).manual_seed(seed)
    n_sets, per_graph = launches_per_graph(shape.kv_bytes())
    sets = []
    for _ in range(n_sets):
        q = torch.randn(shape.b, shape.sq, shape.hq, shape.d, dtype=tdt, device=device, generator=g)
        k = torch.randn(shape.b, shape.sk, shape.hkv, shape.d, dtype=tdt, device=device, generator=g)
        v = torch.randn(shape.b, shape.sk, shape.hkv, shape.d, dtype=tdt, device=device, generator=g)
        sets.append((q, k, v, torch.empty_like(q)))
    return sets, per_graph


def _graph_time(launch, n_sets: int, replays: int, per_graph: int):
    """Median per-launch time (µs) of ``launch(i)`` over CUDA-graph replays.

    One graph holds ``per_graph`` launches cycling through the input sets (so consecutive
    launches read different KV: a cold L2); each replay is timed with events.
    """
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(min(n_sets, 3)):  # warm-up outside the graph: module load, workspaces
            launch(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for j in range(per_graph):
            launch(j % n_sets)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b_ = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b_.record()
        b_.synchronize()
        times.append(a.elapsed_time(b_) * 1e3 / per_graph)
    times.sort()
    med = times[len(times) // 2]
    spread = (times[int(0.9 * (len(times) - 1))] - times[int(0.1 * (len(times) - 1))]) / 2
    del g
    return med, spread


def _variant_option(name: str, opt: str) -> tuple:
    """``n64`` / ``o2`` / ``r64`` / ``s512`` / ``p`` (any of them, in this order) after the ``@``
    of a kernel name: KV tile, CTAs per SM, query rows per CTA, splits per (batch, kv head), and
    programmatic dependent launch (``decode_attention(pdl=True)``). Returns the four numbers
    (None where not given) and the pdl flag."""
    import re

    m = re.fullmatch(r"(?:n(\d+))?(?:o(\d+))?(?:r(\d+))?(?:s(\d+))?(p)?", opt)
    if m is None:
        raise ValueError(f"unknown kernel option {opt!r} in {name!r}: want n<tile>, o<ctas per SM>, "
                         "r<rows per CTA>, s<splits>, p (programmatic dependent launch), in that order")
    *nums, pdl = m.groups()
    return (*(int(g) if g else None for g in nums), pdl is not None)


def reported_us(rounds_us: list[float]) -> float:
    """The time a benchmark row reports from its passes (see bench_shape): the last of one or
    two, else the median of all but the first (the warm-up pass)."""
    import statistics

    if not rounds_us:
        raise ValueError("no timing passes")
    if len(rounds_us) < 3:
        return float(rounds_us[-1])
    return float(statistics.median(rounds_us[1:]))


def bench_shape(shape: Shape, kernels: list[str], *, replays: int = 15, seed: int = 0,
                check: bool = True, device: str = "cuda", rounds: int = 2) -> list[BenchRow]:
    """Time each kernel on the same random inputs. Kernel names: ``base``, ``pingpong``,
    ``base@n64`` / ``pingpong@n64o2`` variants (KV tile, CTAs per SM), ``pingpong+trace`` (full
    event set, every CTA recorded), ``pingpong+tracelead`` (the same, only ``LEAD_WARPS`` store
    records), ``pingpong+trace1`` (only the first CTA stores records), ``pingpong+tracestalls``
    (every CTA, the "stalls" event set: core plus WAIT_K / WAIT_V), ``pingpong+ref`` (the
    untraced kernel again, under another name: the reference timed next to the traced ones),
    ``cudnn``, ``flash``."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sets, per_graph = cold_l2_inputs(shape, seed=seed, device=device)
    n_sets = len(sets)
    ref = reference(*sets[0][:3])[0] if check else None
    rows: list[BenchRow] = []
    timed = []  # (row index, launch) of the kernels that passed the check
    for name in kernels:
        base_name, _, opt = name.partition("@")
        sched, _, tr = base_name.partition("+")
        if tr not in ("", "ref", "trace", "tracelead", "trace1", "tracestalls"):
            raise ValueError(f"unknown kernel suffix +{tr} in {name!r}: want +ref, +trace, +tracelead, +trace1 "
                             "or +tracestalls")
        traced = tr.startswith("trace")
        events = "stalls" if tr == "tracestalls" else "core"
        extra: dict = {}
        if sched in SCHEDULES:
            tile, occ, brows, splits, pdl = _variant_option(name, opt)  # @p with +trace: kernel_function refuses
            try:
                kern, plan = _resolve(shape, sched, traced, splits, device, tile_n=tile, ctas_per_sm=occ,
                                      block_rows=brows, trace_events=events, pdl=pdl)
            except Fa4traceError as exc:  # a variant this build lacks: a '-' cell
                rows.append(BenchRow(shape, name, float("nan"), float("nan"), float("nan"),
                                     {"error": str(exc)[:200]}))
                continue
            bufs = None
            if traced:
                # +trace1: every CTA runs the recorder's instructions, only the first stores
                # records (isolates the instruction cost from the record traffic).
                bufs = [trace_buffer(*st[:3], schedule=sched, num_splits=splits, tile_n=tile, ctas_per_sm=occ,
                                     block_rows=brows, max_ctas=1 if tr == "trace1" else None,
                                     warps=LEAD_WARPS if tr == "tracelead" else None,
                                     trace_events=events)[0] for st in sets[:1]]

            def launch(i, sched=sched, tile=tile, occ=occ, brows=brows, splits=splits, bufs=bufs, events=events,
                       pdl=pdl):
                q, k, v, o = sets[i]
                return decode_attention(q, k, v, schedule=sched, out=o, tile_n=tile, ctas_per_sm=occ,
                                        block_rows=brows, num_splits=splits, trace=bufs[0] if bufs else None,
                                        trace_events=events, pdl=pdl)

            extra = {"tile_n": kern.tile_n, "ctas_per_sm": kern.ctas_per_sm, "block_rows": kern.block_rows,
                     "splits": plan.n_splits, "ctas": plan.n_ctas, "n_comb": plan.n_comb}
        elif sched == "fa4":
            # Upstream FlashAttention-4's SM90 forward (AOT build, see fa4trace.fa4): no split-KV
            # on Hopper, so it launches b x hkv CTAs.
            from .fa4 import sm90_runner

            try:
                runners = [sm90_runner(*st[:3], out=st[3]) for st in sets]
            except Exception as exc:  # noqa: BLE001 - no FA4 build for this shape: a '-' cell
                rows.append(BenchRow(shape, name, float("nan"), float("nan"), float("nan"),
                                     {"error": str(exc)[:200]}))
                continue

            def launch(i, runners=runners):
                return runners[i]()

            extra = {"note": "FA4 4.0.0b36 SM90, no split-KV"}
        elif sched in ("cudnn", "flash"):
            backend = SDPBackend.CUDNN_ATTENTION if sched == "cudnn" else SDPBackend.FLASH_ATTENTION

            def launch(i, backend=backend):
                q, k, v, _ = sets[i]
                with sdpa_kernel([backend]):
                    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                         v.transpose(1, 2), enable_gqa=True)
                return out.transpose(1, 2)
        else:
            raise ValueError(f"unknown kernel {name!r}")
        err = float("nan")
        try:
            if check:
                sets[0][3].fill_(float("nan"))  # poison: unwritten elements fail the check
                out = launch(0)
                torch.cuda.synchronize()
                err = rel_error(out, ref)
        except Exception as exc:  # noqa: BLE001 - a backend that refuses a shape is a table entry
            rows.append(BenchRow(shape, name, float("nan"), float("nan"), err, {"error": str(exc)[:200]}))
            continue
        rows.append(BenchRow(shape, name, float("nan"), float("nan"), err, extra))
        timed.append((len(rows) - 1, launch))
    # Timing: ``rounds`` passes over all kernels in the same order; every pass is kept in
    # extra["rounds_us"]. Reported: the last pass with 2 rounds, else the median of all passes
    # but the first. On the H200 the first pass after a shape's inputs were allocated ran slow
    # for whichever traced kernel came first (up to +7%, and +1-7% for the first kernel overall),
    # a warm-up effect, not the kernel (BENCHMARKS.md, fourth session); and long shapes (b 32,
    # sk 131072: ~0.5-1 ms a launch) drift 2-5% from pass to pass, mostly slower as the run goes
    # on, so one pass decides a +-2% comparison by chance (seventh session).
    for rnd in range(rounds):
        for idx, launch in timed:
            row = rows[idx]
            if "error" in row.extra:
                continue
            try:
                us, spread = _graph_time(launch, n_sets, replays, per_graph)
            except Exception as exc:  # noqa: BLE001 - a backend that fails while timing is a table entry
                rows[idx] = BenchRow(shape, row.kernel, float("nan"), float("nan"), row.rel_err,
                                     {**row.extra, "error": str(exc)[:200]})
                continue
            hist = row.extra.get("rounds_us", []) + [us]
            rows[idx] = BenchRow(shape, row.kernel, reported_us(hist), spread, row.rel_err,
                                 {**row.extra, "rounds_us": [round(x, 2) for x in hist]})
    sets.clear()
    torch.cuda.empty_cache()
    return rows


def bench_matrix(*, quick: bool = False) -> list[Shape]:
    """The issue's matrix: d {64,128} x hq:hkv {16:1,16:2} x sk {4096,32768,131072} x b {1,8,32},
    sq 1, plus sq 4 at sk 131072."""
    shapes = []
    for d in (128, 64):
        for hq, hkv in ((16, 1), (16, 2)):
            for sk in ((131072,) if quick else (4096, 32768, 131072)):
                for b in (1, 8, 32):
                    shapes.append(Shape(b, 1, hq, hkv, sk, d, "bf16"))
            for b in (1, 8, 32):
                shapes.append(Shape(b, 4, hq, hkv, 131072, d, "bf16"))
    return shapes


def bench_run(shapes, kernels, *, replays: int = 15, trace_overhead: bool = True, rounds: int = 2,
              log=print, power=None) -> list[BenchRow]:
    """bench_shape over shapes; adds the traced variants at sk 131072, sq 1 (tracing overhead).
    ``power``: a running ``fa4trace.power_log.PowerLog``; each row then carries the GPU's clock
    and power state during its shape (``extra["gpu_state"]``)."""
    import time

    rows = []
    for i, shape in enumerate(shapes):
        ks = list(kernels)
        if trace_overhead and shape.sk == 131072 and shape.sq == 1:
            # The kernels and peers first, in the usual order; then each of ours again as "+ref"
            # with its traced variants right after it. An overhead is the ratio of two timings,
            # so they are taken next to each other: at the long shapes (b 32: 0.5-1 ms a launch)
            # where in a pass a kernel is timed moves it by up to 3% on the H200 (eighth session).
            for k in kernels:
                sched, at, opt = k.partition("@")
                if sched in SCHEDULES and not _variant_option(k, opt)[-1]:  # @p has no traced twin
                    ks += [sched + sfx + at + opt for sfx in ("+ref", "+trace", "+tracelead", "+tracestalls")]
        t = time.time()
        t0 = power.now() if power is not None else None
        r = bench_shape(shape, ks, replays=replays, seed=i, rounds=rounds)
        state = power.summary(t0, power.now()) if power is not None else None
        if state is not None:
            for x in r:
                x.extra["gpu_state"] = state
        rows += r
        cells = " ".join(f"{x.kernel}={x.us:.1f}" for x in r)
        note = "" if state is None else (f"; SM {state['sm_mhz_min']}-{state['sm_mhz_max']} MHz, power cap "
                                         f"{100 * state['power_cap_share']:.0f}% of samples")
        log(f"[{i + 1}/{len(shapes)}] d{shape.d} {shape.hq}:{shape.hkv} sk={shape.sk} b={shape.b} sq={shape.sq}: "
            f"{cells} ({time.time() - t:.1f} s{note})")
    return rows


def bench_json(rows: list[BenchRow]) -> list[dict]:
    return [{"d": r.shape.d, "hq": r.shape.hq, "hkv": r.shape.hkv, "sk": r.shape.sk, "b": r.shape.b,
             "sq": r.shape.sq, "dtype": r.shape.dtype, "kernel": r.kernel, "us": r.us,
             "us_spread": r.us_spread, "tbps": r.tbps, "rel_err": r.rel_err, **r.extra} for r in rows]


_SHORT = {"pingpong": "pp", "intrawg": "iw"}


def bench_table(rows: list[BenchRow], peak: float = PEAK_TBPS) -> str:
    """Markdown, one row per shape: every kernel's µs (TB/s), pingpong's % of peak, ratios,
    tracing overhead (core event set: every warp, lead warps; stalls event set: every warp;
    against the "+ref" timing where there is one) and the worst relative error of the checked
    outputs."""
    by_shape: dict = {}
    for r in rows:
        by_shape.setdefault(r.shape, {})[r.kernel] = r
    kernels = []
    for r in rows:
        if r.kernel not in kernels and "+" not in r.kernel.partition("@")[0]:
            kernels.append(r.kernel)
    # our schedules with traced timings, in SCHEDULES order (short names in the header)
    ours = [s for s in SCHEDULES if any(r.kernel.partition("@")[0] == s + "+trace" for r in rows)] \
        or ["base", "pingpong"]
    who = "/".join(_SHORT.get(s, s) for s in ours)
    head = ["d", "hq:hkv", "sk", "b", "sq"] + [f"{k} µs (TB/s)" for k in kernels] + \
        [f"pp % of {peak:g}", "pp vs base", "pp vs cuDNN", f"trace ovh {who}", f"lead-warp ovh {who}",
         f"stalls ovh {who}", "max rel err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def ok(x):
        return x is not None and x.us == x.us

    for shape, ks in by_shape.items():
        cells = [str(shape.d), f"{shape.hq}:{shape.hkv}", str(shape.sk), str(shape.b), str(shape.sq)]
        for k in kernels:
            r = ks.get(k)
            cells.append("-" if not ok(r) else f"{r.us:.1f} ({r.tbps:.2f})")
        pp, base, cud = ks.get("pingpong"), ks.get("base"), ks.get("cudnn")
        cells.append(f"{100 * pp.tbps / peak:.0f}%" if ok(pp) else "-")
        cells.append(f"{100 * (base.us / pp.us - 1):+.1f}%" if ok(pp) and ok(base) else "-")
        cells.append(f"{cud.us / pp.us:.2f}x" if ok(pp) and ok(cud) else "-")
        for suffix in ("+trace", "+tracelead", "+tracestalls"):
            ov = []
            for sname in ours:
                # the reference timed next to the traced variants, where there is one
                a = ks.get(sname + "+ref") if ok(ks.get(sname + "+ref")) else ks.get(sname)
                b = ks.get(sname + suffix)
                ov.append(f"{100 * (b.us / a.us - 1):+.1f}%" if ok(a) and ok(b) else "-")
            cells.append(" / ".join(ov))
        errs = [r.rel_err for r in ks.values() if r.rel_err == r.rel_err]
        cells.append(f"{max(errs):.1e}" if errs else "-")
        lines.append("| " + " | ".join(cells) + " |")
    capped = []
    for shape, ks in by_shape.items():
        st = next((r.extra["gpu_state"] for r in ks.values() if "gpu_state" in r.extra), None)
        if st is not None and (st["power_cap_share"] >= 0.1 or st["thermal_share"] > 0):
            capped.append(f"d{shape.d} {shape.hq}:{shape.hkv} sk {shape.sk} b {shape.b} sq {shape.sq} "
                          f"({100 * st['power_cap_share']:.0f}% power cap, {100 * st['thermal_share']:.0f}% "
                          f"thermal, SM {st['sm_mhz_min']}-{st['sm_mhz_max']} MHz)")
    if capped:
        lines += ["", "GPU clock lowered by its power or thermal limit during: " + "; ".join(capped)
                  + " (nvidia-smi samples; `gpu_state` in bench.json)."]
    return "\n".join(lines)


def bench_cli(argv=None) -> int:
    """`fa4trace bench` / benchmarks/bench_decode.py: the issue's matrix on this GPU."""
    import argparse
    import datetime as dt
    import json
    import sys

    ap = argparse.ArgumentParser(prog="fa4trace bench", description="Decode attention on this GPU: ours "
                                 "(base, pingpong, intrawg) vs cuDNN and FLASH SDPA; CUDA-graph replay, L2 cold, "
                                 "median.")
    ap.add_argument("--quick", action="store_true", help="sk 131072 shapes only")
    ap.add_argument("--kernels", default="base,pingpong,intrawg,cudnn,flash,fa4",
                    help="comma list: base, pingpong, intrawg, base@n64 (other KV tile), pingpong@p (programmatic "
                         "dependent launch), cudnn, flash, fa4 (FlashAttention-4 SM90 from its AOT build; a "
                         "missing build shows as '-')")
    ap.add_argument("--replays", type=int, default=15)
    # 5 by default: on the H200 single passes of the long shapes came out 8-25% slow while the
    # GPU sat at its power cap (eighth session); the median of passes 2-5 shrugs one off.
    ap.add_argument("--rounds", type=int, default=5,
                    help="timing passes over all kernels; reported: the last of 1-2, else the median of all but the first")
    ap.add_argument("--no-trace-overhead", action="store_true", help="skip the traced variants")
    ap.add_argument("--only", default="", help="filter, e.g. 'd=128,hkv=1,sk=131072'")
    ap.add_argument("--out", default=os.environ.get("OUT", "artifacts/bench"), help="folder for bench.json / bench.md")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.replays < 1:
        raise Fa4traceError(f"--rounds and --replays must be >= 1, got {args.rounds} and {args.replays}")
    from .gpu import gpu_facts, require_cuda

    torch = require_cuda()
    shapes = bench_matrix(quick=args.quick)
    for cond in filter(None, args.only.split(",")):
        key, _, val = cond.partition("=")
        if not hasattr(shapes[0], key):
            raise ValueError(f"--only: unknown key {key!r} (use d, hq, hkv, sk, b, sq)")
        shapes = [s for s in shapes if str(getattr(s, key)) == val]
    from .power_log import PowerLog

    dev = gpu_facts(0)
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    print(f"{dev['name']} ({dev['sm_count']} SMs, driver {dev['driver']}, torch {dev['torch']}) {date}", flush=True)
    with PowerLog() as power:
        if not power.enabled:
            print(f"(no clock/power log: {power.why_off})", flush=True)
        rows = bench_run(shapes, [k for k in args.kernels.split(",") if k], replays=args.replays,
                         trace_overhead=not args.no_trace_overhead, rounds=args.rounds,
                         log=lambda m: print(m, flush=True), power=power if power.enabled else None)
    md = bench_table(rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump({"device": dev, "date": date, "command": " ".join(sys.argv), "torch": torch.__version__,
                   "rows": bench_json(rows)}, f, indent=1)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    return 0

