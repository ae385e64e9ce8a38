"""The masked-attention and decode benchmark rows (small cases; the sizes in the README
come from benchmarks/bench_attention_masks.py)."""

from __future__ import annotations

import numpy as np

from nki_kernels.attention import bench_masks, masks


def test_mask_rows_are_modeled_and_count_the_tiles_they_compute() -> None:
    rows = bench_masks.mask_rows((1024,))
    assert {r.method for r in rows} == {"ours", "ours, no skipping", "S x S decomposition"}
    assert all(r.label.startswith("modeled (cost model") and r.latency_us > 0 for r in rows)
    for r in rows:
        if r.method == "ours":
            allowed = bench_masks._mask(r.mask, 1024)
            frac = masks.allowed_fraction(masks.classify_dense(allowed))
            assert np.isclose(r.tiles_computed, frac)


def test_decode_rows_are_modeled_with_their_config() -> None:
    rows = bench_masks.decode_rows(batches=(1, 8), caches=(1024,))
    ours = [r for r in rows if r.method == "ours"]
    assert {(r.batch, r.paged) for r in ours} == {(1, False), (8, False), (1, True), (8, True)}
    assert all(r.label.startswith("modeled (cost model") and 0 < r.mbu < 1 for r in rows)
    one, eight = (next(r for r in ours if r.batch == b and not r.paged) for b in (1, 8))
    assert np.isclose(eight.latency_us, 8 * one.latency_us)  # priced per program x programs
