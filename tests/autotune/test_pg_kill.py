"""Done-when of issue 16: a 4-worker PostgreSQL run killed at the parent (SIGKILL) leaves no
process behind, and no RUNNING trial once a run with --stale-after has passed over it.

Needs a real server: `export NKI_KERNELS_TEST_PG_URL="$(scripts/ci_postgres.sh)"` (CI does);
skipped otherwise. Small budget: rms_norm at one 2048-row bucket (1,152 configs, so the
run cannot end before the kill).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from nki_kernels.autotune.storage import open_storage
from nki_kernels.cli import main

PG = os.environ.get("NKI_KERNELS_TEST_PG_URL")
ARGS = ["rms_norm", "--buckets", "2048", "--shape", "llama3-8b", "--no-export", "--no-progress",
        "--seed", "16"]  # fmt: skip


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _trials(state: TrialState, skip: frozenset[str] = frozenset()) -> int:
    storage = open_storage(PG)
    n = 0
    for s in storage.get_all_studies():
        if s.study_name in skip or "#claim#" in s.study_name:
            continue
        if s.study_name.startswith("rms_norm/trn2/rows2048-h4096"):
            n += len(storage.get_all_trials(s._study_id, deepcopy=False, states=(state,)))
    return n


@pytest.mark.skipif(not PG, reason="NKI_KERNELS_TEST_PG_URL is not set (scripts/ci_postgres.sh)")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_four_worker_run_killed_at_the_parent_leaves_nothing_behind() -> None:
    assert main(["tune", *ARGS, "--storage", PG, "--reset"]) == 0  # a fresh study
    # studies of other kernel / cost-model versions in the same database are not ours
    old = frozenset(s.study_name for s in open_storage(PG).get_all_studies())
    cmd = [sys.executable, "-m", "nki_kernels.cli", "tune", *ARGS, "--storage", PG,
           "--workers", "4", "--trials", "300", "--strategy", "tpe"]  # fmt: skip
    parent = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while (
        _trials(TrialState.COMPLETE, old) + _trials(TrialState.PRUNED, old) < 8
        or len(_children(parent.pid)) < 3
    ):
        assert parent.poll() is None and time.monotonic() < deadline
        time.sleep(1.0)
    workers = _children(parent.pid)
    assert len(workers) == 3, workers
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 60
    while any(_alive(w) for w in workers):
        if time.monotonic() > deadline:
            for w in workers:
                if _alive(w):
                    os.kill(w, signal.SIGKILL)
            pytest.fail("workers outlived their SIGKILLed parent")
        time.sleep(0.2)
    # the workers mark their own trial abandoned on SIGTERM; the parent's trial (and any a
    # worker could not mark) is reaped by the next run: its owner's process is gone, or,
    # killed before it could write its worker id, it is older than --stale-after
    time.sleep(2.0)
    assert main(["tune", *ARGS, "--storage", PG, "--trials", "1", "--stale-after", "1"]) == 0
    assert _trials(TrialState.RUNNING, old) == 0
