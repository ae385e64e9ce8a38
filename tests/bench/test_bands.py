"""Row bands: one pricing per parameter set, traces replayed from the first run."""

from __future__ import annotations

import pytest

from nki_kernels.bench import bands, compare
from nki_kernels.perfmodel import api
from nki_kernels.perfmodel.band import structural_pct
from nki_kernels.targets import get_target


def test_bands_reprice_each_set_and_replay_the_traces(monkeypatch):
    trn2 = get_target("trn2")
    slow = trn2.replace(dma_fixed_ns=trn2.dma_fixed_ns + 1300.0)  # v2 fits 0 ns on trn2
    monkeypatch.setattr(bands, "parameter_sets", lambda t: [trn2, slow])
    calls = []
    real = api.run

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(api, "run", counting)

    def price(t):
        return compare.norm_rows((384,), (512,), [t], (1,))

    base = price(trn2)
    n_traces = len(calls)
    calls.clear()
    rows = bands.with_bands(price, "trn2")
    # the first pass traces as many kernels as a plain run; the second set replays them all
    assert len(calls) == n_traces
    assert [r.latency_us for r in rows] == [r.latency_us for r in base]
    f = 1 + structural_pct("trn2") / 100  # v3: widened by the cross-validated error
    for r in rows:
        lo, hi = r.band_us
        assert lo * f == pytest.approx(r.latency_us)  # a slower start only slows a kernel
        assert hi >= r.latency_us * f
        assert r.extra["samples_us"][0] == r.latency_us
    assert any(r.band_us[1] > r.band_us[0] for r in rows)


def test_without_parameter_sets_rows_have_no_band(monkeypatch):
    monkeypatch.setattr(bands, "parameter_sets", lambda t: [get_target(t)])
    rows = bands.with_bands(lambda t: compare.norm_rows((256,), (512,), [t], (1,)), "trn2")
    assert rows and all(r.band_us is None for r in rows)
