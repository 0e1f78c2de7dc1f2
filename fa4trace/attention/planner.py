"""The split-KV launch plan: how many KV splits per (batch, kv head, m-block) and how the
in-launch combine is cut (pure Python, no GPU)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..kernels.decode_spec import COMBINE_UNROLL, EVENTS_PER_STEP, MAX_SPLITS, TILE_M
from .shapes import Shape, groups, m_blocks


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
                block_rows: int = TILE_M) -> Plan:
    """How many KV splits per (batch, kv head, m-block), and how the in-launch combine is cut.

    Default: fill the SMs once (decode is memory-bound: every SM should stream KV), one CTA
    per SM, with at least one KV block per split.
    The combine needs ``groups * (n_comb - 1) < num_sms`` (only waiting CTAs can hold SMs,
    and at least one SM must stay free for the CTAs not yet running): no deadlock even when
    the grid does not fit the GPU at once.
    """
    if num_sms < 1:
        raise ValueError(f"num_sms must be >= 1, got {num_sms}")
    n_blocks = -(-shape.sk // tile_n)
    n_groups = groups(shape, block_rows)
    if num_splits is None:
        s = max(1, num_sms // n_groups)
    else:
        s = int(num_splits)
    s = max(1, min(s, n_blocks, MAX_SPLITS))
    grid = (m_blocks(shape, block_rows) * shape.hkv, s, shape.b)
    if s == 1:
        return Plan(tile_n, n_blocks, 1, 1, 1, 1, grid, block_rows)
    # Fewest rounds (one L2 round trip each) first, then the widest contiguous column piece
    # per split row (coalescing), then fewer waiting CTAs; the fewest partitions that hold
    # the splits (the first cuts).
    cuts = combine_cuts(shape, s, n_groups, num_sms, block_rows)
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
    """Records per warp for one launch: EVENTS_PER_STEP per KV block (consumer) plus
    epilogue/combine slack, in whole 32-record blocks."""
    blocks = -(-plan.n_blocks // plan.n_splits)
    return 32 * (-(-(EVENTS_PER_STEP * blocks + 24) // 32))
