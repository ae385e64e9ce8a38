"""`tune --rank pessimistic`: trials ranked by the slow end of the cost model's band.

A synthetic family prices configs from the band's parameter sets: the "fragile" config
is the fastest with the shipped parameters but slows down under the slowest semaphore
latency of the band's sets (cost model v3 varies it over 0-200 ns; its leave-one-out sets
all fit a DMA start latency of 0, the parameter this test used under v2); the "robust" one
costs the same under every set. The nominal
ranking exports the fragile config, the pessimistic one the robust config.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from nki_kernels.autotune.export import export_best
from nki_kernels.autotune.full_grid import run_full_grid
from nki_kernels.autotune.measure import CostModelMeasurer
from nki_kernels.autotune.storage import open_storage
from nki_kernels.autotune.study import TuneOptions, Tuner
from nki_kernels.perfmodel.band import parameter_sets
from nki_kernels.runtime.config_store import ConfigStore
from nki_kernels.targets import get_target

from .toy import ToyConfig, ToyProblem, make_toy

TRN2 = get_target("trn2")
PROBLEM = ToyProblem(rows=256, cols=4096)
FRAGILE, ROBUST = 1024, 2048


def _slowest_semaphore() -> float:
    return max(t.semaphore_ns for t in parameter_sets(TRN2))


def synthetic_price(p: Any, config: Any, target: Any) -> tuple[float, dict[str, Any]]:
    """ns: fragile 100 with the shipped semaphore latency, up to 300 at the slowest set's;
    robust 110 everywhere; every other config 400 (+ bufs, so the best is unique)."""
    if config.tile_cols == FRAGILE:
        extra = target.semaphore_ns - TRN2.semaphore_ns
        lat = 100.0 + 200.0 * max(extra, 0.0) / (_slowest_semaphore() - TRN2.semaphore_ns)
    elif config.tile_cols == ROBUST:
        lat = 110.0
    else:
        lat = 400.0
    return lat + config.bufs, {}


def _tuner(rank: str, strategy: str = "grid") -> Tuner:
    tunable = dataclasses.replace(make_toy(), price=synthetic_price)
    return Tuner(tunable, PROBLEM, TRN2, storage=open_storage("memory"),
                 measurer=CostModelMeasurer(bands=rank == "pessimistic"),
                 options=TuneOptions(strategy=strategy, rank=rank))  # fmt: skip


def test_the_band_sets_include_a_slower_semaphore() -> None:
    # the premise of the synthetic case: some parameter set of the band is slower
    assert _slowest_semaphore() > TRN2.semaphore_ns


@pytest.mark.parametrize("how", ["run", "full"])
def test_a_config_that_wins_only_under_optimistic_parameters_is_not_exported(
    how: str, tmp_path: Any
) -> None:
    exported = {}
    for rank in ("nominal", "pessimistic"):
        tuner = _tuner(rank)
        if how == "full":
            run_full_grid(tuner)
        else:
            tuner.run()
        out = export_best(tuner, ConfigStore([tmp_path / rank], tmp_path / rank))
        exported[rank] = out
    nominal, pessimistic = exported["nominal"], exported["pessimistic"]
    assert nominal.config.tile_cols == FRAGILE and pessimistic.config.tile_cols == ROBUST
    assert not nominal.config.skip_tail and not pessimistic.config.skip_tail  # gated
    # both figures are recorded: the nominal latency and the band's ends
    prov = pessimistic.provenance
    assert prov.rank == "pessimistic" and nominal.provenance.rank == "nominal"
    assert prov.latency_ns == pytest.approx(110.0 + pessimistic.config.bufs)
    assert prov.latency_band_ns == pytest.approx([prov.latency_ns, prov.latency_ns])
    fragile_band = nominal.provenance.latency_band_ns
    assert fragile_band is not None and fragile_band[0] < prov.latency_ns < fragile_band[1]
    assert fragile_band[1] == pytest.approx(300.0 + nominal.config.bufs)


def test_trials_record_both_figures_and_rank_by_the_slow_end() -> None:
    tuner = _tuner("pessimistic", strategy="random")
    report = tuner.run(n_trials=20)
    priced = [r for r in report.records if r.outcome == "ok" and r.config is not None]
    assert priced and all(r.set_ns is not None for r in priced)
    for r in priced:
        assert r.latency_ns == r.set_ns[0]  # the first set is the shipped one
        assert r.latency_hi_ns == max(r.set_ns) >= r.latency_ns
    assert report.best is not None
    assert report.best.latency_hi_ns == min(r.latency_hi_ns for r in priced)
    assert "pessimistic" in tuner.key.name


def test_pessimistic_ranking_needs_a_measurer_that_prices_the_band() -> None:
    with pytest.raises(ValueError, match="rank: 'pessimistic' needs a measurer"):
        Tuner(make_toy(), PROBLEM, TRN2, storage=open_storage("memory"),
              measurer=CostModelMeasurer(), options=TuneOptions(rank="pessimistic"))  # fmt: skip
    with pytest.raises(ValueError, match="rank: expected one of"):
        TuneOptions(rank="optimistic")


def test_toy_default_is_neither_candidate() -> None:
    assert ToyConfig.heuristic(PROBLEM, TRN2).tile_cols not in (FRAGILE, ROBUST)
