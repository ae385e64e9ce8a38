"""moe/gather_pricing.py: the dispatch and combine gathers priced (modeled, labelled,
banded), with their HBM bytes counted exactly."""

from __future__ import annotations

from nki_kernels.moe.gather_pricing import price_dispatch_combine
from nki_kernels.perfmodel import COST_MODEL_VERSION


def test_dispatch_and_combine_bytes_and_labels() -> None:
    t, h, k = 200, 96, 3  # R = 600 rows, bf16
    d, c = price_dispatch_combine(t, h, k, "trn2")
    for p in (d, c):
        assert p.label == f"modeled (cost model {COST_MODEL_VERSION}, trn2)"
        assert p.us_band[0] <= p.us <= p.us_band[1]
        assert 0.0 < p.mbu <= 1.0
    # dispatch: 600 bf16 rows read and written, 600 int32 indices
    assert round(d.hbm_mb * 1e6) == 600 * h * 2 * 2 + 600 * 4
    # combine: 600 bf16 rows read, 200 fp32 rows written, 200 x 3 indices and weights
    assert round(c.hbm_mb * 1e6) == 600 * h * 2 + 200 * h * 4 + 200 * 3 * 4 * 2
