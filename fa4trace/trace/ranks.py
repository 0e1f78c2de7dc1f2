"""Which process of a distributed program recorded a bundle.

A PyTorch program spread over several GPUs (``torch.distributed``, ``torchrun``) runs as several
processes, one rank each. A bundle recorded in one of them says which, in its metadata
(``distributed``: rank, world size, local rank, host, pid, backend), and is saved under a
name that says it (``step.parquet`` -> ``step_rank1.parquet``): the bundles of every rank can then
sit in one folder, and ``fa4trace merge --ranks`` puts each under its rank.

The rank is ``torch.distributed``'s where the program initialized it (read only when the
program imported it: nothing here imports torch), else the launcher's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, as torchrun sets them). A program of one process (no rank, or a
world of one) is not distributed: its bundles keep their plain names and no rank.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path

from .meta import BundleMeta

__all__ = ["KEY", "process_rank", "rank_meta", "rank_path", "bundle_rank"]

KEY = "distributed"  # the bundle metadata key


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def process_rank() -> dict | None:
    """This process's place in a distributed program (module docstring), or None."""
    info = None
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                info = {"rank": int(dist.get_rank()), "world_size": int(dist.get_world_size()),
                        "backend": str(dist.get_backend()), "source": "torch.distributed"}
        except Exception:  # noqa: BLE001 - a half-initialized group reads as "not distributed" here
            info = None
    if info is None:
        rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
        if rank is None:
            return None
        info = {"rank": rank, "world_size": world, "backend": None, "source": "environment"}
    if info["world_size"] is not None and info["world_size"] <= 1:
        return None
    info.update(local_rank=_env_int("LOCAL_RANK"), host=socket.gethostname(), pid=os.getpid())
    return info


def rank_meta() -> dict:
    """``{"distributed": process_rank()}`` in a distributed program, else ``{}``: what a bundle's
    metadata takes (``meta.update(rank_meta())``)."""
    info = process_rank()
    return {KEY: info} if info is not None else {}


def rank_path(path: str | os.PathLike, info: dict | None = None) -> Path:
    """``path`` with this process's rank in its name (``step.parquet`` -> ``step_rank1.parquet``)
    in a distributed program; unchanged outside one, or when the name already holds it.
    ``info``: a :func:`process_rank` result (default: this process's)."""
    path = Path(path)
    info = process_rank() if info is None else info
    if not info:
        return path
    r = int(info["rank"])
    if re.search(rf"(?<![0-9])rank[_-]?{r}(?![0-9])", path.name):
        return path
    return path.with_name(f"{path.stem}_rank{r}{path.suffix}")


def bundle_rank(meta: dict) -> int | None:
    """The rank that recorded a bundle, from its metadata (as stored); None where it does not say."""
    info = BundleMeta.from_meta(meta).distributed
    if not isinstance(info, dict):
        return None
    try:
        return int(info["rank"])
    except (KeyError, TypeError, ValueError):
        return None
