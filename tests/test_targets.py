"""Target overrides found in NKI_KERNELS_TARGETS_DIR: loaded once, seen by every thread
that asks for a target while they load, and a bad file is an error on every call."""

from __future__ import annotations

import json
import threading
import time

import pytest

from nki_kernels import targets


def _override(path, **params) -> None:  # type: ignore[no-untyped-def]
    path.write_text(
        json.dumps({"kind": targets.OVERRIDE_KIND, "target": "trn2", "parameters": params})
    )


@pytest.fixture
def fresh_overrides(monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    monkeypatch.setenv(targets.OVERRIDE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(targets, "_overrides_loaded", False)
    yield tmp_path
    targets.clear_overrides()


def test_threads_asking_while_the_overrides_load_all_get_the_override(
    fresh_overrides, monkeypatch
) -> None:
    shipped = targets.SHIPPED_TARGETS["trn2"].hbm_bytes_per_ns
    _override(fresh_overrides / "trn2.json", hbm_bytes_per_ns=shipped + 1.0)
    load = targets.use_override

    def slow_load(path):  # type: ignore[no-untyped-def]
        time.sleep(0.05)  # a slow disk: the other threads ask meanwhile
        return load(path)

    monkeypatch.setattr(targets, "use_override", slow_load)
    n = 6
    start = threading.Barrier(n)
    got: list[float] = []

    def work() -> None:
        start.wait()
        got.append(targets.get_target("trn2").hbm_bytes_per_ns)

    pool = [threading.Thread(target=work) for _ in range(n)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert got == [shipped + 1.0] * n


def test_a_bad_override_file_fails_every_call_not_just_the_first(fresh_overrides) -> None:
    (fresh_overrides / "bad.json").write_text("{not json")
    for _ in range(2):
        with pytest.raises(ValueError, match=r"bad\.json: cannot read"):
            targets.get_target("trn2")


class _SlowClearDict(dict):
    """A dict that yields the GIL right after emptying itself: a reader that runs between
    an unguarded clear and refill finds no targets, on almost every clear."""

    def clear(self) -> None:
        super().clear()
        time.sleep(1e-3)


def test_clearing_overrides_never_hides_a_target_from_a_reader(monkeypatch) -> None:
    monkeypatch.setattr(targets, "TARGETS", _SlowClearDict(targets.TARGETS))
    stop = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        while not stop.is_set():
            try:
                targets.get_target("trn3")
            except BaseException as e:  # reported below, in the test's thread
                errors.append(e)
                return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(50):
            targets.clear_overrides()
    finally:
        stop.set()
        reader.join()
    assert not errors, errors[0]
