"""Read-merge-write files written from several threads at once keep every writer's part:
the benchmark rows (`bench.rows.append_rows`) and the ledger's partial samples
(`ledger.store._keep_partial`). A slow rename makes the race certain: without the lock,
every writer reads the file before any has replaced it, and the last rename wins."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nki_kernels.bench.rows import BenchRow, append_rows, read_rows
from nki_kernels.ledger import store

N = 5


@pytest.fixture
def slow_rename(monkeypatch: Any) -> None:
    replace = os.replace

    def slow(src: Any, dst: Any) -> None:
        time.sleep(0.05)
        replace(src, dst)

    monkeypatch.setattr(os, "replace", slow)


def _threads(fn: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            fn(i)
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def _row(i: int) -> BenchRow:
    return BenchRow(
        family="test", op=f"op{i}", case="c", impl="nki", target="trn2", lnc=1,
        latency_us=float(i), provenance="modeled (cost model v3, trn2)",
    )  # fmt: skip


def test_append_rows_from_threads_keeps_every_row(tmp_path: Path, slow_rename: None) -> None:
    path = tmp_path / "rows.jsonl"
    append_rows(path, [_row(-1)])
    _threads(lambda i: append_rows(path, [_row(i)]))
    assert sorted(r.op for r in read_rows(path)) == sorted(f"op{i}" for i in range(-1, N))
    assert [f.name for f in tmp_path.iterdir()] == ["rows.jsonl"]


def test_ledger_partial_samples_from_threads_keep_every_key(
    tmp_path: Path, monkeypatch: Any, slow_rename: None
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    store._keep_partial("seed", "s", [0.0])
    _threads(lambda i: store._keep_partial(f"key{i}", "s", [float(i)]))
    d = json.loads(store.partial_path().read_text())
    assert sorted(d) == sorted(["seed", *(f"key{i}" for i in range(N))])
    assert all(store._partial(f"key{i}", "s") == [float(i)] for i in range(N))
