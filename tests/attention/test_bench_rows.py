"""The attention benchmark table's bands: an MFU band never passes 100 %."""

from __future__ import annotations

import pytest

from nki_kernels.attention.bench import Row, markdown_table


def _row(lo: float, hi: float, mfu: float = 0.88) -> Row:
    return Row(
        "bwd", "llama3-8b", "trn2", 8192, False, 1, 32, 8, 128, "bfloat16",
        40_000.0, mfu, "tensor", "tensor", 95.0, 40.0, 30.0, "full trace", 1, 0.1, "{}",
        "modeled (cost model v3, trn2)", "2026-12-05T00:00:00+00:00", lo, hi,
    )  # fmt: skip


def test_a_band_widened_past_the_tensore_peak_stops_at_100_pct_mfu():
    # the structural widening (latency / 1.15) would claim 101 % MFU: the low end
    # stops where TensorE runs the counted FLOPs at its peak
    r = _row(40_000.0 / 1.15, 48_000.0)
    lo, hi = r.latency_band()  # type: ignore[misc]
    assert lo == pytest.approx(0.88 * 40_000.0) and hi == 48_000.0
    mfu_lo, mfu_hi = r.mfu_band()  # type: ignore[misc]
    assert mfu_hi == pytest.approx(1.0) and mfu_lo == pytest.approx(0.88 * 40 / 48)
    assert "(73.3–100.0) ceiling" in markdown_table([r])


def test_a_band_inside_the_peak_is_kept():
    r = _row(38_000.0, 48_000.0, mfu=0.6)
    assert r.latency_band() == (38_000.0, 48_000.0)
    assert r.mfu_band()[1] == pytest.approx(0.6 * 40 / 38)  # type: ignore[index]
