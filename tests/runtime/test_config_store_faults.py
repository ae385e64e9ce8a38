"""A broken user config store never takes an op down or hangs it (issue 31): each fault
is reported once with an InvalidEntryWarning and ignored, and the op runs on the shipped
or default configs. Stored files are parsed once per version, not once per call."""

from __future__ import annotations

import json
import os
import threading
import warnings
from pathlib import Path

import pytest
import torch
from store_faults import FAULTS, OP, TARGET

import nki_kernels.ops.norm  # noqa: F401  (registers the ops)
from nki_kernels.norm.config import NormProblem
from nki_kernels.runtime import config_files
from nki_kernels.runtime import config_store as cs
from nki_kernels.runtime.config_store import InvalidEntryWarning

TIMEOUT = 60


@pytest.fixture
def restore_default_store():  # type: ignore[no-untyped-def]
    saved = cs._default
    yield
    cs._default = saved


def _rms_norm() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(6, 64, generator=g), torch.randn(64, generator=g)
    return torch.ops.nki.rms_norm(x, w, 1e-6)


def _call_with_timeout() -> tuple[torch.Tensor, list[warnings.WarningMessage]]:
    box: dict = {}

    def body() -> None:
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                box["out"] = _rms_norm()
            box["warnings"] = seen
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(TIMEOUT)
    assert not t.is_alive(), "the op hung on the config store"
    if "error" in box:
        raise box["error"]
    return box["out"], box["warnings"]


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_broken_user_store_is_reported_once_and_the_op_runs(
    fault: str, tmp_path: Path, restore_default_store: None
) -> None:
    if fault == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads a file whatever its permissions")
    cs.set_config_dir(None)
    want = _rms_norm()
    user = FAULTS[fault](tmp_path / "user")
    cs.set_config_dir(user)
    out, seen = _call_with_timeout()
    torch.testing.assert_close(out, want, atol=0.0, rtol=0.0)
    reports = [w for w in seen if issubclass(w.category, InvalidEntryWarning)]
    assert len(reports) == 1, [str(w.message) for w in seen]
    out, seen = _call_with_timeout()  # reported once: not again
    assert not [w for w in seen if issubclass(w.category, InvalidEntryWarning)]
    torch.testing.assert_close(out, want, atol=0.0, rtol=0.0)


def _thousand_entry_store(root: Path) -> Path:
    entries = {
        f"affine=w,dtype=float32,hidden={64 * (i + 2)},rows=512": {
            "config": {},
            "provenance": {},
        }
        for i in range(1000)
    }
    path = root / TARGET / f"{OP}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": 1, "entries": entries}))
    return path


def test_a_stored_file_is_parsed_once_per_version_not_per_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _thousand_entry_store(tmp_path / "user")
    store = cs.ConfigStore([tmp_path / "user", cs.SHIPPED_DIR], tmp_path / "user")
    reads, keys = [0], [0]
    real_read, real_parse = config_files.read_config_file, config_files.parse_key

    def counting_read(p):  # type: ignore[no-untyped-def]
        reads[0] += 1
        return real_read(p)

    def counting_parse(k):  # type: ignore[no-untyped-def]
        keys[0] += 1
        return real_parse(k)

    monkeypatch.setattr(cs, "read_config_file", counting_read)
    monkeypatch.setattr(config_files, "parse_key", counting_parse)
    problem = NormProblem(rows=512, hidden=64, dtype="float32", affine="w")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = store.decide(OP, TARGET, problem)
        for _ in range(50):
            assert store.decide(OP, TARGET, problem) == first
    assert reads[0] == 2  # the user file and the shipped one, once each
    user_keys = keys[0]
    assert user_keys >= 1000
    # a new version of the file is read again (and only it)
    data = json.loads(path.read_text())
    data["entries"].pop(next(iter(data["entries"])))
    path.write_text(json.dumps(data))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store.decide(OP, TARGET, problem)
    assert reads[0] == 3 and keys[0] == user_keys + 999


def test_an_oversized_file_is_not_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_files, "MAX_BYTES", 100)
    path = tmp_path / "user" / TARGET / f"{OP}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": 1, "entries": {"x": "y" * 200}}))
    with pytest.raises(config_files.ConfigFileError, match="larger than 100 bytes"):
        config_files.read_config_file(path)
