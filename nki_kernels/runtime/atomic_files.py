"""Files written whole or not at all, and read-merge-write updates that lose nobody's.

`write_text_atomic` writes a unique temporary file beside the target (flushed to disk)
and renames it over the target: a reader, or a process killed mid-write, never sees half
a file, and concurrent writers (threads or processes) never share a temporary. A writer
that merges its change into what a file holds takes `dir_lock` on the file's directory
around the read and the write, so two writers cannot both read the old content and the
second rename drop the first one's change.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

FILE_MODE = 0o644  # data and configs are for every user of a shared directory


@contextlib.contextmanager
def dir_lock(directory: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive advisory lock on `directory` itself (flock on its descriptor): no lock
    file is created, so a killed writer leaves nothing behind and the lock dies with it.
    Each call opens its own descriptor, so threads of one process exclude each other too."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_text_atomic(path: str | os.PathLike[str], text: str, *, mode: int = FILE_MODE) -> Path:
    """Replace `path` with `text` atomically (creating its directory); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return p


__all__ = ["FILE_MODE", "dir_lock", "write_text_atomic"]
