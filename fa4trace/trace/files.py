"""Output files written whole or not at all, with the mode every new file of the user gets.

:func:`replacing` hands out a temporary path next to the target and renames it onto the
target when the block succeeds: an interrupted write never leaves half a file, and a failed
one leaves the target as it was. The temporary file is created with mode 0666 less the
process umask, as ``open(path, "w")`` would create it (``tempfile.mkstemp`` makes 0600, and
the rename would keep that): a saved bundle or merged trace reads like any other output.

Bundles (``trace.bundle``) and sweep datasets (``sweep.dataset``) write through it; merged
traces (``profiler.merge``) create their temporary file with :func:`create_beside`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Iterator

NEW_FILE_MODE = 0o666  # less the umask, by the kernel (os.open), as open() does


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[str]:
    """A fresh temporary file next to ``path`` (its path, as a str), renamed onto ``path``
    when the block ends without an exception, removed when it raises. The folder is made
    if missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = create_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def create_beside(path: str | os.PathLike) -> str:
    """Create (exclusively) an empty hidden file ``.NAME.<random>.tmp`` in ``path``'s folder, mode
    0666 less the umask; return its path (for writers that rename it themselves)."""
    path = Path(path)
    for _ in range(100):
        tmp = str(path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp"))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), NEW_FILE_MODE)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"{path.parent}: could not create a temporary file beside {path.name}")
