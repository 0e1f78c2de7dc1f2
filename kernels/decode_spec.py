"""What the Hopper decode-attention kernel is, in one leaf module: its limits, schedules, event
sets and the variants a build holds.

Both sides import this and nothing else of each other: the kernel (``attention_sm90``, CuTe
DSL) reads its constants here, and the host (``fa4trace.attention``, the loader, the CLI) plans
launches, names variants and looks them up with the same values. It imports no cutlass and no
torch, so the host stays importable on any machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from fa4trace.format.vocab import VOCAB

# base: QK -> softmax -> PV, one at a time; pingpong: QK(i+1) overlaps softmax(i) (two S tiles);
# intrawg: FA3's intra-warpgroup overlap, softmax(i) overlaps PV(i-1) (one S tile).
SCHEDULES = ("base", "pingpong", "intrawg")
HEAD_DIMS = (64, 128)
DTYPES = ("bf16", "fp16")
MAX_RATIO = 16  # query heads per KV head
MAX_SQ = 8  # query tokens per sequence
TILE_M = 64  # one wgmma M tile: the packed query rows of a KV head
BLOCK_ROWS = (64, 32)  # query rows per CTA: the whole M tile, or one row per consumer thread
NUM_CONSUMER_THREADS = 128  # one warpgroup
PRODUCER_WARP = 4
NUM_THREADS = NUM_CONSUMER_THREADS + 32
WARPS_PER_CTA = NUM_THREADS // 32
# One warp per role: the consumer warpgroup's warps run in step (every wgmma is the whole
# warpgroup's), so warp 0 shows what the other three do. ``fa4trace record --warps lead``.
LEAD_WARPS = (0, PRODUCER_WARP)
COMBINE_UNROLL = 16  # splits per combine thread
MAX_SPLITS = 256  # <= COMBINE_UNROLL * the 32 partitions one warp holds
COUNTER_WORDS = 4  # int32 words per group: [arrival count, its value at the next launch's start, -, -]
SCALAR_ARGS = ("softmax_scale", "n_splits", "n_comb", "comb_nc4_log2", "comb_parts_log2")
TENSOR_ARGS = ("q", "k", "v", "o", "lse", "o_part", "lse_part", "count")
# Keys per KV block. The ping-pong holds two S tiles in registers, so it takes 64-key blocks
# (128 would spill at d64).
DEFAULT_TILE_N = {(64, "base"): 128, (128, "base"): 128, (64, "pingpong"): 64, (128, "pingpong"): 64,
                  (64, "intrawg"): 128, (128, "intrawg"): 64}
# Consumer records of one KV block, at most (a recorder block per mainloop step).
EVENTS_PER_STEP = 12

# What a traced variant records.
# "core"   loads, QK and PV in flight, softmax, correction, epilogue, combine and the split's
#          ticket mark: everything the schedule is about; the default.
# "stalls" core plus WAIT_K / WAIT_V, the consumer waiting for a K or V stage to land (what
#          shows a consumer starved by the stream). Their probe sits next to the stage wait,
#          which costs the mainloop more, so they are opt-in.
CORE_EVENTS = ("LOAD_Q", "LOAD_K", "LOAD_V", "QK", "SOFTMAX", "CORRECTION", "PV", "EPILOGUE", "COMBINE", "MARK")
STALL_EVENTS = ("WAIT_K", "WAIT_V")
EVENT_SETS = {"core": CORE_EVENTS, "stalls": CORE_EVENTS + STALL_EVENTS}


def event_ids(events: str) -> frozenset:
    """Event ids an ``events`` set compiles in (the other recorder calls compile to nothing)."""
    if events not in EVENT_SETS:
        raise ValueError(f"trace_events must be one of {', '.join(EVENT_SETS)}, got {events!r}")
    return frozenset(VOCAB.event(n).id for n in EVENT_SETS[events])


@dataclass(frozen=True)
class Variant:
    """One compiled kernel: everything fixed at compile time. Shapes are runtime values.

    ``events``: None for the uninstrumented kernel, else the EVENT_SETS name it records.
    ``pdl``: launched with programmatic dependent launch (uninstrumented only).
    """

    head_dim: int
    schedule: str
    dtype: str = "bf16"
    block_rows: int = TILE_M
    events: Optional[str] = None
    pdl: bool = False

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {', '.join(map(str, HEAD_DIMS))}, got {self.head_dim}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.block_rows not in BLOCK_ROWS:
            raise ValueError(f"block_rows must be one of {BLOCK_ROWS}, got {self.block_rows!r}")
        if self.events is not None:
            event_ids(self.events)  # a known set, or one line naming them
        if self.pdl and self.events is not None:
            raise ValueError("pdl=True runs the uninstrumented kernel only (no trace)")

    @property
    def traced(self) -> bool:
        return self.events is not None

    @property
    def tile_n(self) -> int:
        return DEFAULT_TILE_N[(self.head_dim, self.schedule)]

    @property
    def event_ids(self) -> Optional[frozenset]:
        return None if self.events is None else event_ids(self.events)

    @property
    def name(self) -> str:
        """The exported function's name, e.g. ``decode_attn_sm90_d128_pingpong_bf16_r32_traced``."""
        name = f"decode_attn_sm90_d{self.head_dim}_{self.schedule}_{self.dtype}"
        if self.block_rows != TILE_M:
            name += f"_r{self.block_rows}"
        if self.events is None:
            return name + ("_pdl" if self.pdl else "")
        return name + ("_traced" if self.events == "core" else f"_traced_{self.events}")

    def config(self) -> dict:
        """What a build's manifest says of this variant (also what the loader checks)."""
        return {**asdict(self), "traced": self.traced, "tile_n": self.tile_n, "warps_per_cta": WARPS_PER_CTA,
                "args": ",".join(TENSOR_ARGS + SCALAR_ARGS + (("trace",) if self.traced else ()))}


def all_variants() -> list[Variant]:
    """Every variant ``fa4trace build`` exports: what ``decode_attention`` and ``record`` reach."""
    out = []
    for d in HEAD_DIMS:
        for schedule in SCHEDULES:
            for dtype in DTYPES:
                for events, pdl in ((None, False), (None, True), *((e, False) for e in EVENT_SETS)):
                    for rows in BLOCK_ROWS:
                        out.append(Variant(d, schedule, dtype, rows, events, pdl))
    return out
