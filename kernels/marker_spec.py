"""The marker-dense microbenchmark (``markers.py``) as the host sees it: its variants, kinds of
work, warps per CTA and global pointer-chase table. No cutlass here: the recorder, the check and
the benchmarks size buffers and inputs from these, and the kernel compiles against the same
numbers.
"""

from __future__ import annotations

# plain: no markers; fa4trace*: our recorder (staged in lane registers, the same with one room
# check per block, lane-0 direct stores, globaltimer per event, staged in shared memory, the same
# with one room check per block); iket: NVIDIA's IKET markers.
VARIANTS = ("plain", "fa4trace", "fa4trace_block", "fa4trace_lane", "fa4trace_gt", "fa4trace_smem",
            "fa4trace_smem_block", "iket")
RECORDING_VARIANTS = tuple(v for v in VARIANTS if v.startswith("fa4trace"))  # those that fill a trace buffer
WORKS = ("l2", "smem")
WARPS_PER_CTA = 8
L2_TABLE = 1 << 16  # words in the global (L2-resident, 256 KiB) pointer-chase table
