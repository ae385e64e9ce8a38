"""The decode benchmark rows carry what their bands are made of: the latency under each
of the cost model's parameter sets (shipped set first), and a band that is those
samples' range widened by the structural error (cost model v3)."""

from __future__ import annotations

import pytest

from nki_kernels.attention.bench_decode import STREAMED, kv_bytes, streamed_row
from nki_kernels.bench.bands import latency_band, parameter_sets, ratio_band
from nki_kernels.perfmodel import COST_MODEL_VERSION
from nki_kernels.targets import get_target


def test_streamed_row_keeps_per_set_samples_and_a_widened_band() -> None:
    row = streamed_row(4, 1, 2048, False)
    assert row.method == STREAMED and row.label.startswith(
        f"modeled (cost model {COST_MODEL_VERSION}"
    )
    assert len(row.samples_us) == len(parameter_sets("trn2"))
    assert row.latency_us == pytest.approx(row.samples_us[0])  # the shipped set first
    assert row.band_us == pytest.approx(latency_band(row.samples_us, "trn2"))
    assert row.band_us[0] < min(row.samples_us) and row.band_us[1] > max(row.samples_us)
    # MBU: the K / V bytes over the modeled HBM bandwidth of one core
    tgt = get_target("trn2")
    assert row.mbu == pytest.approx(
        kv_bytes(1, 2048) / (row.latency_us * 1e3 * tgt.hbm_bytes_per_ns)
    )
    # a speedup pairs the same parameter set on both sides: against itself it is 1
    lo, hi = ratio_band(row.samples_us, row.samples_us, "trn2")
    assert lo < 1.0 < hi and lo * hi == pytest.approx(1.0)
