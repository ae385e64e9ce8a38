"""Issue 16 findings 6-8 in the study driver (toy kernel): interrupted and timed-out
trials never stay RUNNING, --stale-after, regating, claim clean-up, the export loop past
wrong configs, and the full-grid mode."""

from __future__ import annotations

import os
import signal
import socket
import time

import optuna
import pytest
from optuna.trial import TrialState

from nki_kernels.autotune.export import export_best
from nki_kernels.autotune.full_grid import run_full_grid
from nki_kernels.autotune.gate import CorrectnessGate
from nki_kernels.autotune.storage import open_storage
from nki_kernels.autotune.study import CLAIM_SEP, OK, REJECTED, TuneOptions, Tuner
from nki_kernels.runtime.config_store import ConfigStore
from nki_kernels.targets import TRN2

from .toy import ToyConfig, ToyMeasurer, ToyProblem, make_toy

PROBLEM = ToyProblem(rows=256, cols=8200)


class CountingGate(CorrectnessGate):
    def __init__(self) -> None:
        super().__init__()
        self.checked: list[str] = []

    def check(self, tunable, problem, config, target):  # type: ignore[no-untyped-def]
        self.checked.append(config.key())
        return super().check(tunable, problem, config, target)


def tuner(storage=None, measurer=None, checker=None, **kw) -> Tuner:  # type: ignore[no-untyped-def]
    return Tuner(
        make_toy(),
        PROBLEM,
        TRN2,
        storage=storage or open_storage("memory"),
        measurer=measurer or ToyMeasurer(),
        gate=checker,
        options=TuneOptions(**kw),
    )


def running(t: Tuner) -> list[int]:
    return [x.number for x in t.study().get_trials(states=(TrialState.RUNNING,))]


def test_gate_improving_is_the_default() -> None:
    assert TuneOptions().gate == "improving"


def test_timeout_is_enforced_inside_a_trial() -> None:
    t = tuner(measurer=ToyMeasurer(sleep_s=5.0), strategy="grid")
    start = time.monotonic()
    report = t.run(n_trials=10, timeout=0.5)
    assert time.monotonic() - start < 3.0
    assert report.distinct_done == 0 and running(t) == []
    (trial,) = t.study().get_trials()
    assert trial.state == TrialState.FAIL and trial.user_attrs["result"]["outcome"] == "abandoned"


def test_an_interrupted_trial_is_abandoned_not_left_running(monkeypatch) -> None:
    t = tuner(strategy="grid")
    calls = {"n": 0}
    real = t.measurer.measure

    def measure(*a, **k):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(t.measurer, "measure", measure)
    with pytest.raises(KeyboardInterrupt):
        t.run(n_trials=10)
    assert running(t) == []
    assert t.report().distinct_done == 2
    # resuming measures the abandoned config again and reaches the budget
    monkeypatch.setattr(t.measurer, "measure", real)
    assert t.run(n_trials=10).distinct_done == 10


def test_an_interrupt_while_a_trial_is_created_leaves_nothing_running(monkeypatch) -> None:
    # Ctrl-C delivered inside study.ask(), after it wrote the RUNNING trial: the signal
    # is held until the tuner has the trial, which it then abandons
    t = tuner(strategy="grid")
    study = t.study()
    real_ask = study.ask
    calls = {"n": 0}

    def ask(*a, **k):  # type: ignore[no-untyped-def]
        trial = real_ask(*a, **k)
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # an unheld SIGINT raises here, inside ask
        return trial

    monkeypatch.setattr(study, "ask", ask)
    monkeypatch.setattr(t, "study", lambda: study)
    with pytest.raises(KeyboardInterrupt):
        t.run(n_trials=10)
    assert running(t) == []
    assert t.report().distinct_done == 2


def test_stale_after_reaps_a_running_trial_of_another_host() -> None:
    storage = open_storage("memory")
    t = tuner(storage, strategy="grid", stale_after_s=1.0)
    trial = t.study().ask()
    trial.set_user_attr("worker", {"id": "elsewhere:1", "started": time.time() - 5})
    assert socket.gethostname() != "elsewhere"
    keep = tuner(storage, strategy="grid", stale_after_s=3600.0)
    assert keep.reap_stale() == 0 and len(running(keep)) == 1
    assert t.reap_stale() == 1 and running(t) == []


def test_a_trial_orphaned_before_its_worker_id_is_reaped_after_stale_after() -> None:
    # a worker SIGKILLed between creating a trial and writing its worker id leaves a
    # RUNNING trial with no owner: reaped after ORPHAN_AFTER_S, or the shorter --stale-after
    storage = open_storage("memory")
    t = tuner(storage, strategy="grid", stale_after_s=0.3)
    t.study().ask()
    keep = tuner(storage, strategy="grid")
    time.sleep(0.5)
    assert keep.reap_stale() == 0 and len(running(keep)) == 1
    assert t.reap_stale() == 1 and running(t) == []


def test_export_skips_wrong_configs_found_with_the_gate_off(tmp_path) -> None:
    t = tuner(strategy="grid", gate="off")
    report = t.run()
    assert report.best is not None and report.best.config["skip_tail"] is True  # fast, wrong
    out = export_best(t, ConfigStore([tmp_path], tmp_path))
    assert out.config.skip_tail is False
    # the verdicts stay with the study: its best is now a checked, correct config
    after = t.report()
    assert after.best is not None and after.best.gate == "passed"
    assert after.count(REJECTED) >= 1


def test_regate_checks_the_fastest_unchecked_until_one_passes() -> None:
    t = tuner(strategy="grid", gate="off")
    t.run()
    checks = t.regate()
    assert checks and checks[-1][1] is True and all(not ok for _, ok, _ in checks[:-1])
    assert t.report().best.gate == "passed"
    assert t.regate() == []  # nothing left to check


def test_claims_are_dropped_after_a_run() -> None:
    storage = open_storage("memory")
    t = tuner(storage, strategy="grid")
    t.run(n_trials=5)
    names = [s.study_name for s in storage.get_all_studies()]
    assert any(CLAIM_SEP in n for n in names)
    assert t.drop_claims() > 0
    assert [s.study_name for s in storage.get_all_studies()] == [t.key.name]


def test_full_grid_prices_everything_and_gates_only_the_fastest() -> None:
    gate = CountingGate()
    t = tuner(checker=gate, strategy="grid")
    report = run_full_grid(t)
    assert report.distinct_done == t.space.size
    assert report.best is not None and report.best.gate == "passed"
    assert report.best.config["skip_tail"] is False
    # the heuristic default (enqueued) plus the fastest configs until one passed
    assert len(gate.checked) <= 1 + report.count(REJECTED) + 1 < t.space.size
    brute = min(
        r.latency_ns for r in report.records if r.outcome == OK and not r.config["skip_tail"]
    )
    assert report.best.latency_ns == brute
    assert run_full_grid(t).distinct_done == t.space.size  # resuming adds nothing


def test_full_grid_matches_the_sampled_grid() -> None:
    a = run_full_grid(tuner(checker=CorrectnessGate(), strategy="grid"))
    b = tuner(checker=CorrectnessGate(), strategy="grid", gate="always").run()
    assert a.best is not None and b.best is not None
    assert ToyConfig(**a.best.config) == ToyConfig(**b.best.config)
    assert optuna.__version__  # the storage API used by add_trial
