"""The config-store fault matrix (issue 31): ways a user config directory can be broken.

Each fault `make(root)` breaks the directory `root` for op `rms_norm` on trn2 and returns
the directory to pass as the user config dir (sometimes not `root` itself: a file, a
symlink loop). Used by tests/runtime/test_config_store_faults.py and the property suite.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

OP, TARGET = "rms_norm", "trn2"


def _file(root: Path) -> Path:
    path = root / TARGET / f"{OP}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def deep_nesting(root: Path) -> Path:
    depth = 200_000  # far past Python's recursion limit
    _file(root).write_text('{"format": 1, "entries": {"k": ' + "[" * depth + "]" * depth + "}}")
    return root


def moderately_deep(root: Path) -> Path:
    # parses fine in Python, but deeper than any config file is
    _file(root).write_text('{"format": 1, "entries": {"k": ' + "[" * 60 + "]" * 60 + "}}")
    return root


def dir_is_a_file(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    f = root / "not_a_dir"
    f.write_text("{}")
    return f


def symlink_loop(root: Path) -> Path:
    path = _file(root)
    os.symlink(path.name, path)  # rms_norm.json -> rms_norm.json
    return root


def dir_symlink_loop(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / TARGET).symlink_to(TARGET)
    return root


def huge_number_key(root: Path) -> Path:
    entry = {"config": {}, "provenance": {}}
    data = {"format": 1, "entries": {"affine=w,dtype=float32,hidden=64,rows=1e400": entry}}
    _file(root).write_text(json.dumps(data))
    return root


def nan_key(root: Path) -> Path:
    entry = {"config": {}, "provenance": {}}
    data = {"format": 1, "entries": {"affine=w,dtype=float32,hidden=nan,rows=nan": entry}}
    _file(root).write_text(json.dumps(data))
    return root


def fifo(root: Path) -> Path:
    os.mkfifo(_file(root))
    return root


def directory_as_file(root: Path) -> Path:
    _file(root).mkdir()
    return root


def bad_json(root: Path) -> Path:
    _file(root).write_text('{"format": 1, "entries": {')
    return root


def not_utf8(root: Path) -> Path:
    _file(root).write_bytes(b'{"format": 1, "entries": {"\xff\xfe": 1}}')
    return root


def wrong_shape(root: Path) -> Path:
    _file(root).write_text('{"format": 1, "entries": [1, 2, 3]}')
    return root


def entries_not_objects(root: Path) -> Path:
    _file(root).write_text('{"format": 1, "entries": {"rows=1": 5, "": {}, "a,b": []}}')
    return root


def unreadable(root: Path) -> Path:
    path = _file(root)
    path.write_text('{"format": 1, "entries": {}}')
    path.chmod(0)
    return root


FAULTS: dict[str, Callable[[Path], Path]] = {
    f.__name__: f
    for f in (
        deep_nesting,
        moderately_deep,
        dir_is_a_file,
        symlink_loop,
        dir_symlink_loop,
        huge_number_key,
        nan_key,
        fifo,
        directory_as_file,
        bad_json,
        not_utf8,
        wrong_shape,
        entries_not_objects,
        unreadable,
    )
}
