"""Study driver on the toy kernel: heuristic first, invalid / rejected configs, dedupe,
strategies, reproducibility."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from nki_kernels.autotune.gate import CorrectnessGate
from nki_kernels.autotune.space import SearchSpace
from nki_kernels.autotune.storage import open_storage
from nki_kernels.autotune.study import (
    BUSY,
    INVALID,
    OK,
    REJECTED,
    TuneOptions,
    Tuner,
    result_of,
)
from nki_kernels.targets import TRN2

from .toy import ToyConfig, ToyMeasurer, ToyProblem, make_toy

# 1024 x 8200: a ragged last column tile for every tile width, and 8 row tiles, so that
# 8 buffers are all live at every width (a buffer no instruction touches is not
# allocated) and 8 x 8192-wide fp32 buffers (256 KiB per partition) overflow trn2's
# usable SBUF.
PROBLEM = ToyProblem(rows=1024, cols=8200)


def make_tuner(strategy: str = "grid", seed: int = 0, gate: str = "always", **kw) -> Tuner:
    return Tuner(
        make_toy(),
        PROBLEM,
        TRN2,
        storage=open_storage("memory"),
        measurer=ToyMeasurer(),
        gate=CorrectnessGate(),
        options=TuneOptions(strategy=strategy, seed=seed, gate=gate, **kw),
    )


@pytest.fixture(scope="module")
def grid_report():
    tuner = make_tuner("grid")
    report = tuner.run()
    return tuner, report


def test_heuristic_default_is_the_first_trial(grid_report):
    _tuner, report = grid_report
    first = min(report.records, key=lambda r: r.number)
    assert first.number == 0
    assert first.config == ToyConfig.heuristic(PROBLEM, TRN2).to_dict()
    assert report.heuristic is not None and report.heuristic.number == 0
    assert report.heuristic.outcome == OK


def test_grid_covers_the_space_once_and_finds_the_exhaustive_best(grid_report):
    _tuner, report = grid_report
    space = SearchSpace(ToyConfig, PROBLEM, TRN2)
    evaluated = [r for r in report.records if r.evaluated]
    keys = [tuple(sorted(r.config.items())) for r in evaluated]
    assert len(keys) == len(set(keys)) == space.size == 56
    # the best by brute force over the same measurer, among valid, correct configs
    m = ToyMeasurer()
    brute = {}
    for c in space.configs():
        if not c.is_valid(PROBLEM, TRN2) or (c.skip_tail and PROBLEM.cols % c.tile_cols):
            continue
        try:
            brute[c.key()] = m.measure(make_toy(), PROBLEM, c, TRN2).latency_ns
        except optuna.exceptions.OptunaError:
            raise
        except Exception:
            continue
    best_key = min(brute, key=brute.get)
    assert report.best is not None
    assert report.best.latency_ns == pytest.approx(brute[best_key])
    assert ToyConfig(**report.best.config).key() == best_key


def test_invalid_configs_are_recorded_with_their_rule(grid_report):
    tuner, report = grid_report
    invalid = [r for r in report.records if r.outcome == INVALID]
    assert {r.rule for r in invalid} == {"SBUF_OVERFLOW"}
    for r in invalid:
        assert r.config["tile_cols"] * r.config["bufs"] * 4 > TRN2.sbuf_usable_bytes
        assert "SBUF overflow" in r.reason
    # every config that overflows is among them: 8192 x 8 is the only combination > usable
    assert {(r.config["tile_cols"], r.config["bufs"]) for r in invalid} == {(8192, 8)}
    study = tuner.study()
    for t in study.get_trials(deepcopy=False):
        if result_of(t).get("outcome") == INVALID:
            assert t.state == TrialState.PRUNED
    assert report.best.outcome == OK


def test_validate_rejection_is_recorded_and_never_best():
    tuner = Tuner(
        make_toy(),
        ToyProblem(rows=128, cols=300),
        TRN2,
        storage=open_storage("memory"),
        measurer=ToyMeasurer(),
        options=TuneOptions(strategy="grid", gate="off"),
    )
    report = tuner.run()
    rejected = [r for r in report.records if r.outcome == INVALID and r.rule == "validate"]
    # tile_cols 512..8192 exceed cols=300: 5 widths x 4 bufs x 2 skip_tail
    assert len(rejected) == 5 * 4 * 2
    assert all("> cols 300" in r.reason for r in rejected)
    assert report.best.config["tile_cols"] <= 300


def test_wrong_output_config_is_rejected_and_reported(grid_report):
    _tuner, report = grid_report
    rejected = [r for r in report.records if r.outcome == REJECTED]
    assert rejected, "skip_tail configs drop the ragged tail and must be rejected"
    assert all(r.config["skip_tail"] for r in rejected)
    assert all("wrong output" in r.reason for r in rejected)
    # they were fast: at least one would have beaten the accepted best
    assert min(r.latency_ns for r in rejected) < report.best.latency_ns
    assert not report.best.config["skip_tail"]


def test_without_the_gate_the_fast_wrong_config_would_win():
    # the counterfactual that makes the gate test meaningful
    report = make_tuner("grid", gate="off").run()
    assert report.best.config["skip_tail"] is True


def test_duplicates_are_never_evaluated_twice():
    tuner = make_tuner("random", seed=3, gate="off")
    measurer = tuner.measurer
    report = tuner.run(n_trials=40)
    evaluated = [r for r in report.records if r.evaluated]
    keys = [tuple(sorted(r.config.items())) for r in evaluated]
    assert len(keys) == len(set(keys)) == 40
    # random sampling over 56 configs draws repeats: they were copied, not measured
    copies = [r for r in report.records if r.duplicate_of is not None]
    assert copies, "expected the random sampler to propose some config twice"
    n_valid_evals = sum(1 for r in evaluated if r.rule != "validate")
    assert measurer.calls == n_valid_evals
    for c in copies:
        src = next(r for r in report.records if r.number == c.duplicate_of)
        assert src.config == c.config and src.outcome == c.outcome
        assert c.outcome != BUSY


@pytest.mark.parametrize("strategy", ["tpe", "random"])
def test_seeded_strategies_are_reproducible(strategy):
    a = make_tuner(strategy, seed=7, gate="off").run(n_trials=15)
    b = make_tuner(strategy, seed=7, gate="off").run(n_trials=15)
    seq = lambda rep: [(r.config, r.outcome, r.latency_ns) for r in rep.records]  # noqa: E731
    assert seq(a) == seq(b)


def test_auto_strategy_is_grid_for_small_spaces_and_tpe_otherwise():
    assert make_tuner("auto").strategy == "grid"  # 56 configs <= 64
    assert make_tuner("auto", grid_threshold=10).strategy == "tpe"


def test_budget_counts_distinct_configs_and_timeout_stops():
    tuner = make_tuner("tpe", seed=1, gate="off")
    report = tuner.run(n_trials=12)
    assert report.distinct_done == 12
    report = tuner.run(n_trials=12)  # already there: nothing new
    assert report.distinct_done == 12
    report = tuner.run(n_trials=30, timeout=0.0)
    assert report.distinct_done == 12
