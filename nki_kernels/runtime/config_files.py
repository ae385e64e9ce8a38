"""Reading config-store files safely, and their parsed index (see config_store.py).

A config file is user data that every op call consults, so reading it must never take
an op down or hang it:

- only regular files are opened (checked before and, against a swap, after opening,
  non-blocking): a FIFO, a device or a directory where a file should be is refused;
- at most `MAX_BYTES` are read and JSON is nested at most `MAX_DEPTH` deep;
- a directory that is not one (`NKI_KERNELS_CONFIG_DIR` pointing at a file), a symlink
  loop, a permission error: a `ConfigFileError` naming the path and the reason.

`FileIndex` is a file's entries with their keys parsed once (per file version: the
store re-reads a file only when its (mtime, size, inode) stamp changes). A key that does
not parse, or holds a number that is not finite (rows=1e400), is set aside with its
reason instead of failing every lookup.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config_keys import is_number, parse_key

FORMAT = 1
MAX_BYTES = 16 * 1024 * 1024  # the shipped files are ~100 kB; a tuned store of 100k keys fits
MAX_DEPTH = 32  # {"entries": {key: {"config": {...}, "provenance": {...}}}} is 4 deep

Stamp = tuple[int, int, int]  # (st_mtime_ns, st_size, st_ino): a new one means re-read


class ConfigFileError(ValueError):
    """A config file (or directory) that cannot be used; the message names it and why."""


def file_stamp(path: Path) -> Stamp | None:
    """The stamp of a regular file at `path`; None when there is no file (a missing
    file or directory is simply no stored configs). ConfigFileError for anything else."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise ConfigFileError(f"{path}: a directory on the path is not a directory") from None
    except OSError as e:
        why = "symlink loop" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise ConfigFileError(f"{path}: cannot be read ({why})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigFileError(f"{path}: not a regular file ({_kind(st.st_mode)}); not opened")
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a file"


def _depth(data: Any) -> int:
    """Nesting depth of parsed JSON, iteratively (no recursion on hostile input)."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        x, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(x, dict):
            stack.extend((v, d + 1) for v in x.values())
        elif isinstance(x, list):
            stack.extend((v, d + 1) for v in x)
    return deepest


def read_config_file(path: Path) -> dict[str, Any] | None:
    """A config file's JSON (None when there is no file); ConfigFileError naming the file
    for a non-regular file, an oversized or too deeply nested one, bad JSON or format."""
    if file_stamp(path) is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigFileError(f"{path}: cannot be read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):  # swapped for something else since the check
            raise ConfigFileError(f"{path}: not a regular file ({_kind(st.st_mode)})")
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise ConfigFileError(f"{path}: larger than {MAX_BYTES} bytes; not parsed")
    try:
        data = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ConfigFileError(f"{path}: JSON nested deeper than {MAX_DEPTH} levels") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigFileError(f"{path}: not valid JSON ({e})") from None
    if _depth(data) > MAX_DEPTH:
        raise ConfigFileError(f"{path}: JSON nested deeper than {MAX_DEPTH} levels")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigFileError(f"{path}: expected a config file with format {FORMAT}")
    if not isinstance(data.get("entries", {}), dict):
        kind = type(data["entries"]).__name__
        raise ConfigFileError(
            f"{path}: field 'entries': expected an object keyed by problem; got {kind}"
        )
    return data


@dataclass(frozen=True)
class IndexedKey:
    """One stored key, parsed once: its fields and the sizes that break distance ties."""

    key: str
    fields: dict[str, int | float | str]
    sizes: tuple[float, ...]
    entry: Any


@dataclass
class FileIndex:
    """The usable keys of one version of one file, and the ones set aside (key, why)."""

    stamp: Stamp | None
    keys: list[IndexedKey] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)


def build_index(stamp: Stamp | None, entries: dict[str, Any]) -> FileIndex:
    index = FileIndex(stamp)
    for key, entry in entries.items():
        try:
            fields = parse_key(key) if isinstance(key, str) and key else None
        except ValueError:
            fields = None
        if fields is None:
            index.rejected.append((str(key), "not a key of name=value fields"))
            continue
        bad = [n for n, v in fields.items() if isinstance(v, int | float) and not math.isfinite(v)]
        if bad:
            index.rejected.append((key, f"field {bad[0]!r} is not a finite number"))
            continue
        sizes = tuple(float(fields[n]) for n in sorted(fields) if is_number(fields[n]))
        index.keys.append(IndexedKey(key, fields, sizes, entry))
    return index


__all__ = [
    "FORMAT",
    "MAX_BYTES",
    "MAX_DEPTH",
    "ConfigFileError",
    "FileIndex",
    "IndexedKey",
    "build_index",
    "file_stamp",
    "read_config_file",
]
