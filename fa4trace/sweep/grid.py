"""A sweep's grid: kernels and the decode shapes they run on, from flags or a TOML file.

A grid is a union of products (each product: every combination of its axes' values), deduplicated
in order. TOML::

    kernels = ["base", "pingpong", "intrawg", "cudnn", "flash", "fa4"]
    d = [64, 128]                 # top-level axes: the defaults of every product
    heads = ["16:1", "16:2"]      # hq:hkv pairs
    b = [1]
    sq = [1]                      # q_len is accepted as another name
    dtype = ["bf16"]

    [[product]]
    sk = [1024, 2048, 4096]

    [[product]]
    sk = [131072]
    sq = [1, 2, 4, 8]

Without ``[[product]]`` tables the top-level axes are the one product. Every point is checked
up front (``attention.shape_problem``): a shape no kernel can run is refused with one line; a
shape only our kernels refuse (say d 256) stays a point whose rows for our kernels are errors.
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass, field
from typing import Optional

from ..attention.shapes import shape_problem
from ..format.errors import Fa4traceError
from ..format.shape import Shape
from ..kernels.decode_spec import SCHEDULES

OURS = tuple(SCHEDULES)  # base, pingpong, intrawg
PEERS = ("cudnn", "flash", "fa4")
KERNELS = OURS + PEERS
AXES = ("d", "heads", "sk", "b", "sq", "dtype")
DTYPES = ("bf16", "fp16")
DEFAULTS = {"d": [128], "heads": [(16, 1)], "sk": [131072], "b": [1], "sq": [1], "dtype": ["bf16"]}
SEED_SK = tuple(1024 << i for i in range(8))  # 1024 .. 131072


@dataclass(frozen=True)
class Point:
    d: int
    hq: int
    hkv: int
    sk: int
    b: int
    sq: int
    dtype: str

    @property
    def shape(self) -> Shape:
        return Shape(b=self.b, sq=self.sq, hq=self.hq, hkv=self.hkv, sk=self.sk, d=self.d, dtype=self.dtype)

    @property
    def id(self) -> str:
        from .dataset import point_id

        return point_id(self)

    def ours_problem(self) -> Optional[str]:
        """Why our kernels refuse this shape (one line), or None."""
        return shape_problem(b=self.b, sq=self.sq, hq=self.hq, hkv=self.hkv, sk=self.sk, d=self.d)


def point_seed(point: Point) -> int:
    """The inputs' seed of a point: stable across runs and resumes."""
    return zlib.crc32(point.id.encode()) & 0x7FFFFFFF


@dataclass
class Grid:
    kernels: list[str]
    products: list[dict] = field(default_factory=list)  # axis -> list of values

    def points(self) -> list[Point]:
        seen: dict = {}
        for prod in self.products:
            for d, (hq, hkv), sk, b, sq, dt in itertools.product(*(prod[a] for a in AXES)):
                p = Point(d, hq, hkv, sk, b, sq, dt)
                seen.setdefault(p, None)
        return list(seen)

    def to_json(self) -> dict:
        return {"kernels": list(self.kernels),
                "products": [{a: ([f"{h}:{k}" for h, k in p[a]] if a == "heads" else list(p[a])) for a in AXES}
                             for p in self.products]}


def parse_kernels(value) -> list[str]:
    names = [k.strip() for k in (value.split(",") if isinstance(value, str) else value) if str(k).strip()]
    if not names:
        raise Fa4traceError("kernels: give at least one of " + ", ".join(KERNELS))
    for k in names:
        if k not in KERNELS:
            raise Fa4traceError(f"kernels: unknown kernel {k!r} (want {', '.join(KERNELS)})")
    return list(dict.fromkeys(names))


def _ints(axis: str, value) -> list[int]:
    vals = value.split(",") if isinstance(value, str) else (value if isinstance(value, list) else [value])
    out = []
    for v in vals:
        if isinstance(v, bool):
            raise Fa4traceError(f"{axis}: want integers, got {v!r}")
        try:
            out.append(int(str(v).strip()))
        except ValueError:
            raise Fa4traceError(f"{axis}: want integers, got {v!r}") from None
    if not out:
        raise Fa4traceError(f"{axis}: no values")
    return out


def _heads(value) -> list[tuple[int, int]]:
    vals = value.split(",") if isinstance(value, str) else (value if isinstance(value, list) else [value])
    out = []
    for v in vals:
        hq, sep, hkv = str(v).strip().partition(":")
        try:
            if not sep:
                raise ValueError
            out.append((int(hq), int(hkv)))
        except ValueError:
            raise Fa4traceError(f"heads: want hq:hkv pairs such as 16:1, got {v!r}") from None
    if not out:
        raise Fa4traceError("heads: no values")
    return out


def _dtypes(value) -> list[str]:
    vals = value.split(",") if isinstance(value, str) else (value if isinstance(value, list) else [value])
    out = [str(v).strip() for v in vals if str(v).strip()]
    for v in out:
        if v not in DTYPES:
            raise Fa4traceError(f"dtype: want {' or '.join(DTYPES)}, got {v!r}")
    if not out:
        raise Fa4traceError("dtype: no values")
    return out


def _axis(axis: str, value):
    if axis == "heads":
        return _heads(value)
    if axis == "dtype":
        return _dtypes(value)
    return _ints(axis, value)


def _product(raw: dict, base: dict) -> dict:
    raw = dict(raw)
    if "q_len" in raw:
        if "sq" in raw:
            raise Fa4traceError("give sq or q_len, not both")
        raw["sq"] = raw.pop("q_len")
    unknown = sorted(set(raw) - set(AXES))
    if unknown:
        raise Fa4traceError(f"unknown grid key {unknown[0]!r} (want kernels, {', '.join(AXES)}, q_len, product)")
    prod = dict(base)
    for axis, value in raw.items():
        prod[axis] = _axis(axis, value)
    return prod


def check(grid: Grid) -> Grid:
    """Every point must be a decode-attention problem at all (sizes >= 1, hq a multiple of hkv):
    else one line naming the first bad point. Limits of our kernels only are not checked here."""
    pts = grid.points()
    if not pts:
        raise Fa4traceError("the grid has no points")
    names = {"b": "b", "sq": "sq", "hq": "hq", "hkv": "hkv", "sk": "sk", "d": "d"}
    for p in pts:
        problem = shape_problem(b=p.b, sq=p.sq, hq=p.hq, hkv=p.hkv, sk=p.sk, d=p.d, names=names, ours=False)
        if problem:
            raise Fa4traceError(f"grid point {p.id}: {problem}")
    return grid


def from_flags(*, kernels: str = ",".join(KERNELS), d=None, heads=None, sk=None, b=None, sq=None,
               dtype=None) -> Grid:
    """One product from comma lists (None: the default of that axis)."""
    given = {"d": d, "heads": heads, "sk": sk, "b": b, "sq": sq, "dtype": dtype}
    return check(Grid(parse_kernels(kernels), [_product({k: v for k, v in given.items() if v is not None},
                                                        DEFAULTS)]))


def from_toml(path) -> Grid:
    import tomllib

    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise Fa4traceError(f"{path}: not valid TOML ({str(exc).splitlines()[0]})") from None
    kernels = parse_kernels(doc.pop("kernels", list(KERNELS)))
    products = doc.pop("product", None)
    base = _product(doc, DEFAULTS)
    if products is None:
        return check(Grid(kernels, [base]))
    if not isinstance(products, list) or not all(isinstance(p, dict) for p in products) or not products:
        raise Fa4traceError(f"{path}: 'product' must be an array of tables ([[product]])")
    return check(Grid(kernels, [_product(p, base) for p in products]))


def seed_grid(kernels: str = ",".join(KERNELS)) -> Grid:
    """Colfax's decode article grid: d {64, 128} x hq:hkv {16:1, 16:2} x sk 1024..131072 (powers of
    two) at b 1, q_len 1; plus q_len {1, 2, 4, 8} at sk 131072. 32 + 16 products, 44 distinct
    points (the q_len 1, sk 131072 ones are in both)."""
    base = {"d": [64, 128], "heads": [(16, 1), (16, 2)], "b": [1], "dtype": ["bf16"]}
    return check(Grid(parse_kernels(kernels), [{**base, "sk": list(SEED_SK), "sq": [1]},
                                               {**base, "sk": [131072], "sq": [1, 2, 4, 8]}]))
