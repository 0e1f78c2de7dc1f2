"""Which input files are which rank's: ``fa4trace merge --ranks`` arguments, one group per rank.

The arguments are files and folders, in any order::

    fa4trace merge --ranks prof_rank0.json step_rank0_*.parquet prof_rank1.json step_rank1_*.parquet -o all.pftrace
    fa4trace merge --ranks run/ -o all.pftrace        # run/ (or run/rank0/, run/rank1/ ...) holds them

* A folder stands for its ``*.json``, ``*.json.gz`` and ``*.parquet`` files and those of its
  folders one level down, by name.
* A file that is a Parquet file is a bundle; any other is a torch.profiler trace (read as one
  later, with its own one-line errors).
* A profiler trace's rank: its ``distributedInfo`` (torch.profiler writes it where
  ``torch.distributed`` was initialized), else ``rank<N>`` in its file or folder name, else its
  place among the traces (0, 1, ...).
* A bundle's rank: its metadata's (``fa4trace.instrument()`` in a distributed program writes it,
  :mod:`fa4trace.trace.ranks`), else ``rank<N>`` in its file or folder name, else the profiler
  trace before it among the arguments as given (a file named itself, not found in a folder),
  else the one profiler trace there is.

Two traces of one rank, a bundle of a rank no trace is of, or a bundle whose rank nothing tells
are one-line errors.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path

from ..format.errors import Fa4traceError
from ..trace.bundle import read_meta
from ..trace.ranks import bundle_rank
from .ranks import RankInput

__all__ = ["rank_inputs", "profile_header", "name_rank"]

HEAD_BYTES = 1 << 20  # a trace's top-level keys are looked for this far into it
_RANK = re.compile(r"(?:^|[^a-z0-9])rank[_-]?(\d+)(?![0-9])", re.IGNORECASE)
_SUFFIXES = (".json", ".json.gz", ".parquet")


def name_rank(path: Path) -> int | None:
    """``rank<N>`` in the file's name, else in its folder's; None where neither says."""
    for part in (path.name, path.parent.name):
        m = _RANK.search(part)
        if m:
            return int(m[1])
    return None


def profile_header(path: Path) -> dict:
    """The top-level keys a torch.profiler trace writes before its events (``distributedInfo``,
    ``host_name`` ...), read from the start of the file; {} where they cannot be read so."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
        if head[:2] == b"\x1f\x8b":
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, HEAD_BYTES)
        text = head.decode("utf-8", "replace")
        i = text.find('"traceEvents"')
        if i < 0:
            return {}
        doc = json.loads(text[:i] + '"traceEvents": []}')
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError, zlib.error, gzip.BadGzipFile):
        return {}


def _expand(args: list) -> list[tuple[Path, bool]]:
    """(file, given as a file itself) for each argument; folders hold files one level down."""
    out = []
    for a in args:
        p = Path(a)
        if not p.exists():
            raise Fa4traceError(f"{p}: no such file or folder")
        if p.is_file():
            out.append((p, True))
            continue
        found = []
        for d in [p, *sorted(x for x in p.iterdir() if x.is_dir())]:
            found += sorted(f for f in d.iterdir() if f.is_file() and f.name.endswith(_SUFFIXES))
        if not found:
            raise Fa4traceError(f"{p}: no torch.profiler trace (.json, .json.gz) or bundle (.parquet) in it")
        out += [(f, False) for f in found]
    return out


def _is_bundle(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PAR1"
    except OSError as exc:
        raise Fa4traceError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def rank_inputs(args: list) -> list[RankInput]:
    """One :class:`fa4trace.profiler.ranks.RankInput` per rank from the command line's files and
    folders (module docstring), in rank order."""
    files = _expand(args)
    traces, bundles = [], []
    last_trace = None
    for path, explicit in files:
        if _is_bundle(path):
            bundles.append((path, explicit, last_trace))
        else:
            last_trace = len(traces)
            traces.append(path)
    if not traces:
        raise Fa4traceError("no torch.profiler trace among the inputs: name each rank's "
                            "(prof.export_chrome_trace's JSON) with its bundles")
    rank_of = []
    for i, t in enumerate(traces):
        info = profile_header(t).get("distributedInfo")
        r = info.get("rank") if isinstance(info, dict) else None
        if not isinstance(r, int):
            r = name_rank(t)
        rank_of.append(i if r is None else int(r))
    seen: dict = {}
    for t, r in zip(traces, rank_of):
        if r in seen:
            raise Fa4traceError(f"{seen[r].name} and {t.name} are both rank {r}'s profiler trace")
        seen[r] = t
    groups = {r: RankInput(r, str(t), []) for t, r in zip(traces, rank_of)}
    for path, explicit, before in bundles:
        r = bundle_rank(read_meta(path))
        if r is None:
            r = name_rank(path)
        if r is None and explicit and before is not None:
            r = rank_of[before]
        if r is None and len(traces) == 1:
            r = rank_of[0]
        if r is None:
            raise Fa4traceError(f"{path}: which rank recorded it? neither its metadata nor its name says: name it "
                                "after its rank's profiler trace")
        if r not in groups:
            raise Fa4traceError(f"{path} was recorded by rank {r}, and no profiler trace among the inputs is rank "
                                f"{r}'s (ranks {', '.join(map(str, sorted(groups)))})")
        groups[r].bundles.append(str(path))
    return [groups[r] for r in sorted(groups)]
