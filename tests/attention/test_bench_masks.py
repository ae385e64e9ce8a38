"""The masked-attention and decode benchmark rows (small cases; the sizes in the README
come from benchmarks/bench_attention_masks.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nki_kernels.attention import bench_masks, masks
from nki_kernels.perfmodel.band import structural_pct

AWS = Path("/work/ext/aws-neuron+nki-library")


def _in_band(r) -> bool:  # type: ignore[no-untyped-def]
    lo, hi = r.band_us
    return lo <= r.latency_us * (1 + 1e-9) and r.latency_us <= hi * (1 + 1e-9)


def test_mask_rows_are_modeled_with_bands_and_count_the_tiles_they_compute() -> None:
    rows = bench_masks.mask_rows((1024,), kinds=("document+causal", "ALiBi + causal"))
    assert {r.method for r in rows} == {
        "ours",
        "ours, dense (no block map)",
        "S x S decomposition",
    }
    assert all(r.label == "modeled (cost model v3, trn2)" and r.latency_us > 0 for r in rows)
    assert all(_in_band(r) and r.band_us[0] < r.band_us[1] for r in rows)
    # every row's band, kernels and the S x S decomposition alike, carries the structural
    # term: at least the model's cross-validated error on each side of the figure
    f = 1 + structural_pct("trn2") / 100
    assert f > 1.1
    for r in rows:
        lo, hi = r.band_us
        assert lo <= r.latency_us / f * (1 + 1e-9) and hi >= r.latency_us * f * (1 - 1e-9), r
    for r in rows:
        if r.method == "ours":
            allowed = bench_masks._mask(r.mask, 1024)
            frac = masks.allowed_fraction(masks.classify_dense(allowed))
            assert np.isclose(r.tiles_computed, frac)
    ours = {r.mask: r.latency_us for r in rows if r.method == "ours"}
    dense = {r.mask: r.latency_us for r in rows if r.method.startswith("ours, dense")}
    assert ours["document+causal"] < dense["document+causal"]  # skipped tiles cost nothing


def test_decode_rows_are_modeled_with_their_config_and_band() -> None:
    rows = bench_masks.decode_rows(batches=(1, 8), caches=(1024,))
    ours = [r for r in rows if r.method == "ours"]
    assert {(r.batch, r.paged) for r in ours} == {(1, False), (8, False), (1, True), (8, True)}
    assert all(r.label.startswith("modeled (cost model v3") and 0 < r.mbu < 1 for r in rows)
    assert all(_in_band(r) for r in rows)
    one, eight = (next(r for r in ours if r.batch == b and not r.paged) for b in (1, 8))
    assert np.isclose(eight.latency_us, 8 * one.latency_us)  # priced per program x programs


@pytest.mark.skipif(not AWS.is_dir(), reason="needs the nki-library checkout")
def test_aws_tkg_rows_run_the_unmodified_kernel_through_the_harness() -> None:
    rows = bench_masks.aws_decode_rows(str(AWS), (1, 2), 1024, False, "trn2")
    rows += bench_masks.aws_decode_rows(str(AWS), (1,), 1024, True, "trn2")
    assert all(r.method == bench_masks.AWS_TKG and r.latency_us > 0 for r in rows), rows
    assert all(r.label == "modeled (cost model v3, trn2)" and _in_band(r) for r in rows)
    assert all("nki-library d2ad3a57" in r.note for r in rows)
    # one launch serves the whole batch: two sequences cost more than one, less than two
    one, two = rows[0].latency_us, rows[1].latency_us
    assert one < two < 2 * one
