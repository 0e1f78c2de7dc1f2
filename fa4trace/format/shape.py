"""The problem a decode-attention launch solves: ``Shape`` (b, sq, hq, hkv, sk, d, dtype).

One frozen object that every layer names a problem by: our decode attention and its planner
(``fa4trace.attention``), FlashAttention-4's recording (``fa4trace.fa4``), the timings
(``fa4trace.run.timing``, ``fa4trace.bench``), a sweep's points and the command line. A Shape
holds the rules every attention kernel shares (sizes >= 1, hq a multiple of hkv, bf16 or fp16),
checked once when it is made; a kernel's own limits (our head dims, query length, GQA ratio)
stay with the kernel (``fa4trace.attention.shape_problem``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from .errors import BadOption

SIZES = ("b", "sq", "hq", "hkv", "sk", "d")
DTYPES = ("bf16", "fp16")
# How ``problem`` names the sizes unless told (the command line names its flags, the tensor API
# the tensors' dimensions).
SIZE_NAMES = {k: k for k in SIZES}


def problem(*, b, sq, hq, hkv, sk, d, names=SIZE_NAMES) -> Optional[str]:
    """The rules every attention problem keeps, as one line naming the size that breaks them
    (in ``names``' words), or None if they hold."""
    for key, value in (("b", b), ("sq", sq), ("hq", hq), ("hkv", hkv), ("sk", sk), ("d", d)):
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            return f"{names[key]} must be an integer, got {value!r}"
        if value < 1:
            return f"{names[key]} must be >= 1, got {value}"
    if hq % hkv:
        return f"{names['hq']} ({hq}) must be a multiple of {names['hkv']} ({hkv})"
    return None


@dataclass(frozen=True)
class Shape:
    """Decode attention's problem: q ``[b, sq, hq, d]``, k and v ``[b, sk, hkv, d]``, of
    ``dtype``. The defaults are the problem ``fa4trace record`` records unless told."""

    b: int = 1
    sq: int = 1
    hq: int = 16
    hkv: int = 1
    sk: int = 32768
    d: int = 128
    dtype: str = "bf16"

    def __post_init__(self):
        why = problem(b=self.b, sq=self.sq, hq=self.hq, hkv=self.hkv, sk=self.sk, d=self.d)
        if why:
            raise BadOption(why)
        for key in SIZES:
            object.__setattr__(self, key, int(getattr(self, key)))
        if self.dtype not in DTYPES:
            raise BadOption(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    @property
    def ratio(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.hq // self.hkv

    def kv_bytes(self, elem: int = 2) -> int:
        return 2 * self.b * self.sk * self.hkv * self.d * elem

    def io_bytes(self, elem: int = 2) -> int:
        """Q + K + V + O: the fewest bytes the problem must move."""
        return self.kv_bytes(elem) + 2 * self.b * self.sq * self.hq * self.d * elem

    def config(self) -> dict:
        """The shape as a bundle's ``config`` names it (d, hq, hkv, sk, b, sq, dtype)."""
        return asdict(self)
