"""Mask semantics: per-query key intervals against the element-wise reference mask, and
the tile classification (SKIP tiles have no allowed pair, FULL tiles nothing masked)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nki_kernels.attention import masks
from nki_kernels.attention.reference import reference_mask

CASES = [
    # (batch, sq, sk, causal, window, kv_lens, segment_ids)
    (1, 77, 77, True, None, None, None),
    (1, 100, 300, True, None, None, None),  # Sq < Sk: bottom-right alignment
    (1, 300, 100, True, None, None, None),  # Sq > Sk: the first 200 rows see nothing
    (2, 130, 130, False, None, [17, 0], None),
    (1, 200, 200, True, 33, None, None),
    (2, 150, 150, True, None, None, [[0] * 40 + [1] * 100 + [2] * 10, [5] * 150]),
    (2, 150, 150, False, 20, [150, 90], [[3] * 75 + [4] * 75, [0] * 150]),
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_bounds_match_the_reference_mask(case: tuple) -> None:
    b, sq, sk, causal, window, kv_lens, seg = case
    kl = np.asarray(kv_lens) if kv_lens is not None else None
    sg = np.asarray(seg) if seg is not None else None
    lo, hi = masks.query_bounds(
        b, sq, sk, causal=causal, sliding_window=window, kv_lens=kl, segment_ids=sg
    )
    ref = reference_mask(
        b,
        sq,
        sk,
        causal=causal,
        sliding_window=window,
        kv_lens=torch.tensor(kv_lens) if kv_lens is not None else None,
        segment_ids=torch.tensor(seg) if seg is not None else None,
    ).numpy()
    np.testing.assert_array_equal(masks.dense_mask(lo, hi, sk), ref)


def test_padding_rows_are_empty_and_padded_keys_never_allowed() -> None:
    lo, hi = masks.query_bounds(1, 256, 384, causal=True, sq_valid=200, sk_valid=300)
    assert (hi[0, 200:] == lo[0, 200:]).all()
    assert hi.max() <= 300
    # alignment uses the real lengths: row 0 sees keys 0..100 (offset 300 - 200)
    assert (lo[0, 0], hi[0, 0]) == (0, 101)


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_tile_classes_agree_with_the_mask(case: tuple) -> None:
    b, sq, sk, causal, window, kv_lens, seg = case
    kl = np.asarray(kv_lens) if kv_lens is not None else None
    sg = np.asarray(seg) if seg is not None else None
    lo, hi = masks.query_bounds(
        b, sq, sk, causal=causal, sliding_window=window, kv_lens=kl, segment_ids=sg
    )
    dense = masks.dense_mask(lo, hi, sk)
    live = hi > lo
    classes = masks.classify_tiles(lo, hi, sk)
    t = masks.TILE
    for bi in range(b):
        for qt in range(classes.shape[1]):
            rows = slice(qt * t, (qt + 1) * t)
            for kt in range(classes.shape[2]):
                block = dense[bi, rows, kt * t : (kt + 1) * t][live[bi, rows]]
                c = classes[bi, qt, kt]
                if c == masks.SKIP:
                    assert not block.any()
                elif c == masks.FULL:
                    assert block.all()
                else:
                    assert block.any() and not block.all()


def test_causal_skips_the_upper_triangle() -> None:
    lo, hi = masks.query_bounds(1, 1024, 1024, causal=True)
    classes = masks.classify_tiles(lo, hi, 1024)[0]
    n = classes.shape[0]
    assert (
        classes
        == np.triu(np.full((n, n), masks.SKIP), 1)
        + np.tril(np.ones((n, n)), -1) * masks.FULL
        + np.eye(n) * masks.PARTIAL
    ).all()
    assert masks.allowed_fraction(classes) == (n * (n + 1) // 2) / (n * n)


def test_non_contiguous_documents_are_rejected() -> None:
    with pytest.raises(ValueError, match="segment_ids: each document must be one contiguous run"):
        masks.segment_runs(np.array([[0, 0, 1, 1, 0]]))


def test_kernel_bounds_layout() -> None:
    lo = np.arange(300).reshape(1, 300)
    hi = lo + 5
    kb = masks.kernel_bounds(lo, hi)
    assert kb.shape == (1, 128, 2, 3) and kb.dtype == np.float32
    assert kb[0, 5, 0, 2] == 256 + 5 and kb[0, 5, 1, 2] == 256 + 10
    assert kb[0, 100, 0, 2] == 0 and kb[0, 100, 1, 2] == 0  # rows past the end: empty
