"""The documented limits of an indirect DMA transpose (nki.isa.dma_transpose, section "DMA
Indirect Transpose Constraints", NKI 2.29 / 2.30), each rejected with the rule and the
numbers. The doc's statements are quoted beside each case."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from tile_harness import expect_rule

from nki_kernels.interp import nisa, nl, run

rng = np.random.default_rng(11)


def _gather_transpose(src, idx, view_shape):
    """Gather `view_shape` (rows first, a 2-D / 4-D view of `src` [N, W]) through `idx`
    (loaded into SBUF with its dtype) and transpose it into SBUF."""
    n_idx, k_idx = idx.shape
    dt = {np.uint32: nl.uint32, np.int32: nl.int32}[idx.dtype.type]

    def kernel(s, ix):
        it = nl.ndarray((n_idx, k_idx), dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=it, src=ix)
        w = s.shape[1]
        if len(view_shape) == 2:
            pat = [[w, view_shape[0]], [1, view_shape[1]]]
        else:
            n, a, b, c = view_shape
            pat = [[w, n], [b * c, a], [c, b], [1, c]]
        view = s.ap(pat, offset=0, vector_offset=it)
        # the documented permutations: (1, 0) for 2-D, (3, 1, 2, 0) for 4-D sources
        if len(view_shape) == 2:
            want = (view_shape[1], view_shape[0])
        else:
            want = (view_shape[3], view_shape[1], view_shape[2], view_shape[0])
        dst = nl.ndarray(want, nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=dst, src=view)
        out = nl.ndarray(want, nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=dst)
        return out

    return run(kernel, src, idx)


def _src(rows, width):
    return rng.standard_normal((rows, width)).astype(ml_dtypes.bfloat16)


def test_4d_source_with_heads_and_keys_both_above_one_is_rejected():
    # "When src is 4D: len(src[1]) or len(src[2]) must be 1"
    src = _src(256, 2 * 4 * 64)
    idx = np.arange(128, dtype=np.uint32).reshape(128, 1)
    err = expect_rule("TRANSPOSE", _gather_transpose, src, idx, (128, 2, 4, 64))
    assert "dim 1 or dim 2 of size 1; got 2 and 4" in str(err)


def test_4d_source_with_one_head_is_gathered_and_transposed():
    src = _src(256, 4 * 64)
    idx = rng.permutation(256)[:128].astype(np.uint32).reshape(128, 1)
    got = _gather_transpose(src, idx, (128, 1, 4, 64)).outputs
    want = src[idx[:, 0]].reshape(128, 1, 4, 64).transpose(3, 1, 2, 0)
    np.testing.assert_array_equal(got, want)


def test_int32_indices_are_rejected():
    # "indices.dtype is np.uint32"
    src = _src(64, 32)
    idx = np.arange(16, dtype=np.int32).reshape(16, 1)
    err = expect_rule("TRANSPOSE", _gather_transpose, src, idx, (16, 32))
    assert "indices.dtype must be uint32; got int32" in str(err)


@pytest.mark.parametrize("rows", [4, 8])
def test_fewer_than_16_gathered_rows_are_rejected(rows):
    # "src.shape[0] must be divisible by 16"; "indices.shape[0] must be in [16, 128] and
    # divisible by 16"
    src = _src(64, 32)
    idx = np.arange(rows, dtype=np.uint32).reshape(rows, 1)
    err = expect_rule("TRANSPOSE", _gather_transpose, src, idx, (rows, 32))
    assert f"src.shape[0] must be divisible by 16; got {rows}" in str(err)


def test_two_index_columns_need_128_index_rows():
    # "When indices.shape[1] > 1: indices.shape[0] must be exactly 128"
    src = _src(64, 32)
    idx = np.arange(32, dtype=np.uint32).reshape(16, 2)
    err = expect_rule("TRANSPOSE", _gather_transpose, src, idx, (32, 32))
    assert "indices.shape[0] must be 128 when indices.shape[1] > 1; got 16 x 2" in str(err)


def test_a_scalar_offset_source_is_rejected():
    # the documented indirect form gathers through an "indices" tensor; a source moved by a
    # run-time scalar offset (one expert's weight slice) is not among them
    src = _src(64, 32)

    def kernel(s):
        e = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=e, value=1)
        view = s.ap([[32, 16], [1, 32]], offset=0, scalar_offset=e, indirect_dim=0)
        dst = nl.ndarray((32, 16), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=dst, src=view)
        return dst

    err = expect_rule("TRANSPOSE", run, kernel, src)
    assert "needs a vector_offset index tensor" in str(err)


def test_more_than_128_rows_gather_through_a_128_by_k_index_read_column_major():
    # "When indices.shape[1] > 1: indices.shape[0] must be exactly 128"; "indices.shape[0] *
    # indices.shape[1] must be >= src.shape[0]": 144 rows through a [128, 2] index, row i
    # at index[i % 128, i // 128] (the MoE weight loads' form, tiles.load_weight_cols)
    src = _src(400, 64)
    rows = rng.permutation(400)[:256].astype(np.uint32)
    idx = rows.reshape(2, 128).T.copy()
    got = _gather_transpose(src, idx, (144, 64)).outputs
    np.testing.assert_array_equal(got, src[rows[:144]].T)


@pytest.mark.parametrize("rows", [16, 48, 128])
def test_row_counts_on_the_16_grid_are_gathered_and_transposed(rows):
    src = _src(200, 96)
    idx = rng.permutation(200)[:rows].astype(np.uint32).reshape(rows, 1)
    got = _gather_transpose(src, idx, (rows, 96)).outputs
    np.testing.assert_array_equal(got, src[idx[:, 0]].T)
