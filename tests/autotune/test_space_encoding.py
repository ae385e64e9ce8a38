"""Issue 16 finding 7 (dashboard): studies store parameters as the config's values, ordered
int ranges keep TPE's view of the order, and studies stored with indices still resume."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution

from nki_kernels.autotune.space import CandidateSampler, SearchSpace
from nki_kernels.autotune.storage import open_storage
from nki_kernels.autotune.study import ENCODING_ATTR, OK, TuneOptions, Tuner
from nki_kernels.targets import TRN2

from .toy import ToyConfig, ToyMeasurer, ToyProblem, make_toy

PROBLEM = ToyProblem(rows=256, cols=8200)


def tuner(storage, **kw):  # type: ignore[no-untyped-def]
    return Tuner(make_toy(), PROBLEM, TRN2, storage=storage, measurer=ToyMeasurer(),
                 options=TuneOptions(gate="off", **kw))  # fmt: skip


def test_values_encoding_is_ordered_int_ranges_over_the_values() -> None:
    d = SearchSpace(ToyConfig, PROBLEM, TRN2).distributions()
    assert d["tile_cols"] == IntDistribution(128, 8192, log=True)  # 128, 256, ... 8192
    assert d["bufs"] == IntDistribution(1, 8, log=True)
    assert d["skip_tail"] == CategoricalDistribution((False, True))
    idx = SearchSpace(ToyConfig, PROBLEM, TRN2, encoding="index").distributions()
    assert idx["tile_cols"] == IntDistribution(0, 6)


def test_every_sampled_parameter_is_a_candidate_value() -> None:
    t = tuner(open_storage("memory"), strategy="tpe", n_startup_trials=3, seed=1)
    t.run(n_trials=25)
    trials = [x for x in t.study().trials if x.params]
    assert len(trials) >= 20
    for x in trials:
        config = json.loads(x.user_attrs["config"])
        assert x.params == {k: config[k] for k in x.params}
        assert x.params["tile_cols"] in (128, 256, 512, 1024, 2048, 4096, 8192)
    assert t.study().user_attrs[ENCODING_ATTR] == "values"
    assert t.report().count(OK) >= 10


def test_snapping_is_nearest_in_log_space() -> None:
    (p,) = [q for q in SearchSpace(ToyConfig, PROBLEM, TRN2).params if q.name == "tile_cols"]
    assert p.snaps and p.snap(700) == 512 and p.snap(730) == 1024 and p.snap(8000) == 8192


def test_independent_samples_are_uniform_over_the_candidates() -> None:
    space = SearchSpace(ToyConfig, PROBLEM, TRN2)
    s = CandidateSampler(optuna.samplers.RandomSampler(seed=0), space, seed=0)
    dist = space.distributions()["tile_cols"]
    study = optuna.create_study()
    trial = study.ask()
    draws = [s.sample_independent(study, trial._cached_frozen_trial, "tile_cols", dist)
             for _ in range(7000)]  # fmt: skip
    counts = {c: draws.count(c) for c in (128, 256, 512, 1024, 2048, 4096, 8192)}
    assert sum(counts.values()) == 7000
    assert all(800 < n < 1200 for n in counts.values()), counts  # ~1000 each


def test_a_study_stored_with_indices_resumes_with_indices() -> None:
    storage = open_storage("memory")
    old = tuner(storage, strategy="tpe", encoding="index", seed=0)
    old.run(n_trials=6)
    # a study from before the values encoding carries no encoding attribute
    storage.set_study_user_attr(old.study()._study_id, ENCODING_ATTR, None)
    again = tuner(storage, strategy="tpe", seed=0)  # default: values
    report = again.run(n_trials=12)
    assert again.space.encoding == "index" and report.distinct_done >= 12
    assert {x.distributions["tile_cols"] for x in again.study().trials if x.params} == {
        IntDistribution(0, 6)
    }


def test_unknown_encoding_is_an_error() -> None:
    with pytest.raises(ValueError, match="encoding: expected one of"):
        TuneOptions(encoding="ranks")
