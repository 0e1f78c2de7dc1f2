"""A folder of synthetic replay points (``fa4trace sweep --replay``), for tests and for trying an
executor on a machine without a GPU::

    python -m fa4trace.testing.replay FOLDER --points 8
    fa4trace sweep --replay FOLDER -o DATASET --workers 2

Each point is an ``attention_like`` buffer (``fa4trace.testing.bundles``) and its metadata, marked
synthetic: the shapes are labels only.
"""

from __future__ import annotations

from ..sweep.replay import write_point
from .bundles import attention_like


def make_synthetic(folder, n: int, *, seed: int = 0, n_ctas: int = 4, n_blocks: int = 16) -> list[str]:
    """``n`` replay points of ``attention_like`` buffers, base and ping-pong in turn, over made-up
    decode shapes (labels only: marked synthetic). Returns their names."""
    names = []
    for i in range(n):
        schedule = ("base", "pingpong")[i % 2]
        shape = {"d": (64, 128)[i // 2 % 2], "hq": 16, "hkv": (1, 2)[i // 4 % 2], "sk": 1024 * (1 + i // 8),
                 "b": 1, "sq": 1, "dtype": "bf16"}
        buf, meta = attention_like(schedule, n_ctas=n_ctas, n_blocks=n_blocks, seed=seed + i)
        meta["config"] = {**meta["config"], **shape}
        name = f"d{shape['d']}_h16kv{shape['hkv']}_sk{shape['sk']}_{schedule}"
        write_point(folder, name, buf, meta)
        names.append(name)
    return names


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m fa4trace.testing.replay",
                                 description="Write a folder of synthetic replay points (fa4trace.testing.bundles buffers).")
    ap.add_argument("folder")
    ap.add_argument("--points", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.points < 1:
        ap.error("--points must be >= 1")
    names = make_synthetic(args.folder, args.points, seed=args.seed)
    print(f"wrote {len(names)} synthetic replay points to {args.folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
