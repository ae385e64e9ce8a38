"""`write_policy_file` from several threads at once: every writer's op lands in the file,
the file is whole JSON throughout, and no temporary is left beside it."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from nki_kernels.runtime import buckets
from nki_kernels.runtime.atomic_files import write_text_atomic

OPS = [f"op{i}" for i in range(6)]


def test_concurrent_writers_keep_every_op(tmp_path: Path, monkeypatch: Any) -> None:
    path = tmp_path / "policy.json"
    buckets.write_policy_file(path, buckets.parse_policy("128,256"), op="seed")
    read = buckets.load_policy_file

    def slow_read(p: Any) -> buckets.PolicySettings:
        time.sleep(0.05)  # every writer reads before any has written: the race, made certain
        return read(p)

    monkeypatch.setattr(buckets, "load_policy_file", slow_read)
    errors: list[BaseException] = []

    def write(op: str) -> None:
        try:
            buckets.write_policy_file(path, buckets.parse_policy("384,1408"), op=op)
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(op,)) for op in OPS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    got = read(path)
    assert sorted(got.ops or {}) == sorted([*OPS, "seed"])
    assert all(p.name() == buckets.parse_policy("384,1408").name() for k, p in
               (got.ops or {}).items() if k != "seed")  # fmt: skip
    assert [f.name for f in tmp_path.iterdir()] == ["policy.json"]


def test_write_text_atomic_keeps_the_old_file_when_the_write_fails(
    tmp_path: Path, monkeypatch: Any
) -> None:
    path = tmp_path / "out.json"
    write_text_atomic(path, "old\n")
    assert (path.stat().st_mode & 0o777) == 0o644

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert [f.name for f in tmp_path.iterdir()] == ["out.json"]


def test_set_bucket_policy_from_threads_keeps_every_op(monkeypatch: Any) -> None:
    monkeypatch.delenv(buckets.POLICY_ENV_VAR, raising=False)
    buckets.reset_bucket_policies()
    read = buckets._global_settings

    def slow_read() -> buckets.PolicySettings:
        got = read()
        time.sleep(0.05)  # a setter that read outside the lock now holds a stale copy
        return got

    monkeypatch.setattr(buckets, "_global_settings", slow_read)
    errors: list[BaseException] = []

    def set_one(op: str) -> None:
        try:
            buckets.set_bucket_policy("384,1408", op=op)
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=set_one, args=(op,)) for op in OPS]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert all(buckets.policy_for(op).name() == "explicit[384,1408]" for op in OPS)
    finally:
        buckets.reset_bucket_policies()
