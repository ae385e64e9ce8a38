"""The torchrun launch of one parity phase: one relaunch after a failed launch, never more."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from nki_kernels.parity import distributed


def _fake_launches(monkeypatch: pytest.MonkeyPatch, work: Path, codes: list[int]) -> list[Any]:
    calls: list[Any] = []

    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        code = codes[len(calls) - 1]
        logs = Path(next(c for c in cmd if c.startswith("--log-dir=")).split("=", 1)[1])
        (logs / "0").mkdir(parents=True)
        (logs / "0" / "stderr.log").write_text(f"launch {len(calls)} rank 0 said goodbye\n")
        if code == 0:
            (work / "train.json").write_text(json.dumps({"launch": len(calls)}))
        return subprocess.CompletedProcess(cmd, code, "", "")

    monkeypatch.setattr(distributed.subprocess, "run", run)
    return calls


def test_a_failed_launch_is_relaunched_once_and_its_log_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _fake_launches(monkeypatch, tmp_path, [-6, 0])
    got = distributed._torchrun(2, "train", tmp_path, [])
    assert got == {"launch": 2}
    assert len(calls) == 2
    printed = capsys.readouterr().out
    assert "the train launch failed (exit -6)" in printed
    assert "launch 1 rank 0 said goodbye" in printed
    assert "relaunching the train phase once" in printed


def test_a_second_failure_raises_with_both_launches_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_launches(monkeypatch, tmp_path, [1, 134])
    with pytest.raises(RuntimeError) as e:
        distributed._torchrun(2, "train", tmp_path, [])
    assert len(calls) == 2
    msg = str(e.value)
    assert "exit 1" in msg and "exit 134" in msg
    assert "launch 1 rank 0 said goodbye" in msg and "launch 2 rank 0 said goodbye" in msg
