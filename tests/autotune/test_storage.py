"""Shared storage: a killed run resumes, several worker processes split one study, and a
real PostgreSQL server serves a two-worker study (when NKI_KERNELS_TEST_PG_URL is set)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from optuna.trial import TrialState

from nki_kernels.autotune.space import SearchSpace
from nki_kernels.autotune.storage import normalize_url, open_storage, redact
from nki_kernels.autotune.study import ABANDONED, TuneOptions, Tuner, result_of
from nki_kernels.targets import TRN2

from .toy import ToyConfig, ToyMeasurer, make_toy
from .toy_worker import PROBLEM

TESTS_DIR = Path(__file__).resolve().parents[1]
REPO = TESTS_DIR.parent
PG_ENV = "NKI_KERNELS_TEST_PG_URL"
SPACE_SIZE = SearchSpace(ToyConfig, PROBLEM, TRN2).size


def start_worker(url: str, op: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "autotune.toy_worker", url, op, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def tuner_for(url: str, op: str, **kw) -> Tuner:
    return Tuner(
        make_toy(op),
        PROBLEM,
        TRN2,
        storage=open_storage(url),
        measurer=ToyMeasurer(),
        options=TuneOptions(strategy="grid", gate="off", **kw),
    )


def finished(tuner: Tuner) -> dict[int, tuple]:
    return {
        t.number: (t.state, t.value, t.user_attrs.get("config"), result_of(t).get("outcome"))
        for t in tuner.study().get_trials(deepcopy=False)
        if t.state.is_finished()
    }


def assert_each_config_evaluated_once(tuner: Tuner) -> Counter:
    report = tuner.report()
    evaluated = [r for r in report.records if r.evaluated]
    keys = Counter(json.dumps(r.config, sort_keys=True) for r in evaluated)
    assert max(keys.values()) == 1, [k for k, n in keys.items() if n > 1]
    assert len(keys) == SPACE_SIZE
    return Counter(r.worker for r in evaluated)


def test_storage_urls_normalize(tmp_path):
    assert normalize_url(None, tmp_path) == f"sqlite:///{tmp_path / 'autotune.db'}"
    assert normalize_url(str(tmp_path / "a.db")) == f"sqlite:///{tmp_path / 'a.db'}"
    assert normalize_url(str(tmp_path / "a.log")).startswith("journal:///")
    assert normalize_url("postgres://u@h/db") == "postgresql://u@h/db"
    assert normalize_url("memory") == "memory"
    with pytest.raises(ValueError, match="storage: expected"):
        normalize_url("ftp://x")
    assert redact("postgresql://me:secret@host:5432/db") == "postgresql://me:***@host:5432/db"


def test_killed_run_resumes_without_rerunning_finished_trials(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    op = f"toy_resume_{uuid.uuid4().hex[:8]}"
    proc = start_worker(url, op, "--sleep", "0.25")
    observer = tuner_for(url, op)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            done = [v for v in finished(observer).values() if v[3] == "ok"]
            measuring = [
                t
                for t in observer.study().get_trials(deepcopy=False)
                if t.state == TrialState.RUNNING and "config" in t.user_attrs
            ]
            if len(done) >= 4 and measuring:  # kill it in the middle of a measurement
                break
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.05)
        else:
            pytest.fail("worker made no progress")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before = finished(observer)
    running = [
        t.number
        for t in observer.study().get_trials(deepcopy=False)
        if t.state == TrialState.RUNNING
    ]
    assert before and len(before) < SPACE_SIZE
    assert running

    resumed = tuner_for(url, op)
    resumed.run()
    after = finished(resumed)
    for number, state in before.items():  # finished trials are kept as they were
        assert after[number] == state
    for number in running:  # the trial the kill interrupted is given up, not lost silently
        assert after[number][0] == TrialState.FAIL and after[number][3] == ABANDONED
    # the restart measured exactly the configs the first run had not finished
    first_keys = {v[2] for v in before.values() if v[3] in ("ok", "invalid")}
    assert resumed.measurer.calls == SPACE_SIZE - len(first_keys)
    assert_each_config_evaluated_once(resumed)


def run_two_workers(url: str, op: str, go: Path) -> Counter:
    procs = [
        start_worker(url, op, "--sleep", "0.03", "--worker", str(i), "--go", str(go))
        for i in (0, 1)
    ]
    try:
        for p in procs:  # both have imported everything and opened the study
            assert p.stdout is not None
            ready, _, _ = select.select([p.stdout], [], [], 120)
            assert ready, "worker did not open the study within 120 s"
            line = p.stdout.readline()
            assert line.strip() == "ready", p.communicate()[1]
        go.touch()
        for p in procs:
            _out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
    finally:  # a failed start must not leave a worker waiting for the go file forever
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return assert_each_config_evaluated_once(tuner_for(url, op))


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_two_workers_split_one_study_without_duplicates(tmp_path, kind):
    url = f"sqlite:///{tmp_path / 's.db'}" if kind == "sqlite" else str(tmp_path / "s.log")
    by_worker = run_two_workers(url, f"toy_split_{uuid.uuid4().hex[:8]}", tmp_path / "go")
    assert len(by_worker) == 2, by_worker  # both processes did part of the work
    assert min(by_worker.values()) >= 5


@pytest.mark.skipif(
    not os.environ.get(PG_ENV),
    reason=f"{PG_ENV} is unset: start a server with scripts/ci_postgres.sh and export its URL",
)
def test_postgresql_serves_a_two_worker_study(tmp_path):
    url = os.environ[PG_ENV]
    by_worker = run_two_workers(url, f"toy_pg_{uuid.uuid4().hex[:8]}", tmp_path / "go")
    assert len(by_worker) == 2, by_worker
