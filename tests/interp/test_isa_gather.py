"""nc_n_gather, local_gather and sequence_bounds against NumPy references (ragged
partition counts, bf16 bit-exact copies) and their documented constraints."""

from __future__ import annotations

import numpy as np
import pytest
from tile_harness import BF16, expect_rule, last_instr, outputs, run_tiles

from nki_kernels.interp import nisa, nl

rng = np.random.default_rng(11)


# ---- nc_n_gather ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int32])
def test_nc_n_gather_gathers_within_each_partition(dtype):
    p, per, n = 37, 6 * 7, 19  # ragged partitions; data's two free dims flatten to 42
    data = (rng.standard_normal((p, 6, 7)) * 50).astype(dtype)
    idx = rng.integers(0, per, size=(p, n)).astype(np.uint32)

    def body(d, i, out):
        nisa.nc_n_gather(dst=out, data=d, indices=i)

    got = outputs(body, [data, idx], [((p, n), data.dtype)])
    want = np.take_along_axis(data.reshape(p, per), idx.astype(np.int64), axis=1)
    assert got.dtype == data.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))  # bit-exact


def test_nc_n_gather_counts_its_512_element_groups():
    data = np.zeros((4, 8), np.float32)
    idx = np.zeros((4, 1030), np.uint32)

    def body(d, i, out):
        nisa.nc_n_gather(dst=out, data=d, indices=i)

    res = run_tiles(body, [data, idx], [((4, 1030), nl.float32)])
    assert last_instr(res, "nc_n_gather").attrs["groups"] == 3  # ceil(1030 / 512)


@pytest.mark.parametrize(
    "rule,idx_dtype,out_dtype,idx_value,n_out",
    [
        ("DTYPE", np.int32, np.float32, 0, 4),  # indices must be uint32
        ("DTYPE", np.uint32, np.float16, 0, 4),  # dst keeps data's dtype
        ("FREE", np.uint32, np.float32, 0, 5),  # dst / indices element counts differ
        ("IDX", np.uint32, np.float32, 8, 4),  # index past the 8 elements per partition
    ],
)
def test_nc_n_gather_rules(rule, idx_dtype, out_dtype, idx_value, n_out):
    data = np.zeros((4, 8), np.float32)
    idx = np.full((4, 4), idx_value, dtype=idx_dtype)

    def body(d, i, out):
        nisa.nc_n_gather(dst=out, data=d, indices=i)

    expect_rule(rule, run_tiles, body, [data, idx], [((4, n_out), out_dtype)])


def test_nc_n_gather_refuses_psum():
    def body(d, i, out):
        acc = nl.ndarray((4, 4), nl.float32, buffer=nl.psum)
        nisa.nc_n_gather(dst=acc, data=d, indices=i)

    data, idx = np.zeros((4, 8), np.float32), np.zeros((4, 4), np.uint32)
    expect_rule("GPSIMD_PSUM", run_tiles, body, [data, idx], [((4, 4), nl.float32)])


# ---- local_gather ---------------------------------------------------------------------
def _local_gather_ref(src, index, k, valid):
    p = src.shape[0]
    flat_src = src.reshape(p, -1)
    out = np.empty((p, valid * k), src.dtype)
    for c in range(0, p, 16):
        flat = index[c : c + 16].flatten(order="F")[:valid].astype(np.int64)
        cols = (flat[:, None] + np.arange(k)).reshape(-1)
        out[c : c + 16] = flat_src[c : c + 16][:, cols]
    return out


@pytest.mark.parametrize("k,valid", [(1, None), (4, 20)])
def test_local_gather_matches_the_sdk_numpy_semantics(k, valid):
    p, per = 32, 64
    src = rng.standard_normal((p, per)).astype(BF16)
    index = rng.integers(0, per - k + 1, size=(p, 3)).astype(np.uint16)
    n_valid = 16 * 3 if valid is None else valid

    def body(s, i, out):
        nisa.local_gather(out, s, i, num_elem_per_idx=k, num_valid_indices=valid)

    got = outputs(body, [src, index], [((p, n_valid * k), src.dtype)])
    want = _local_gather_ref(src, index, k, n_valid)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize(
    "rule,p,idx_dtype,k,valid",
    [
        ("PART", 24, np.uint16, 1, None),  # partitions not a multiple of 16
        ("DTYPE", 16, np.uint32, 1, None),  # index must be uint16
        ("ARG", 16, np.uint16, 3, None),  # num_elem_per_idx not in (1, 2, 4, 8, 16, 32)
        ("ARG", 16, np.uint16, 1, 33),  # more valid indices than the slice holds
    ],
)
def test_local_gather_rules(rule, p, idx_dtype, k, valid):
    src = np.zeros((p, 8), np.float32)
    index = np.zeros((p, 2), idx_dtype)
    n = (32 if valid is None else valid) * k

    def body(s, i, out):
        nisa.local_gather(out, s, i, num_elem_per_idx=k, num_valid_indices=valid)

    expect_rule(rule, run_tiles, body, [src, index], [((p, n), nl.float32)])


# ---- sequence_bounds -------------------------------------------------------------------
def test_sequence_bounds_follows_the_sdk_example():
    ids = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3]], dtype=np.int32)

    def body(s, out):
        nisa.sequence_bounds(dst=out, segment_ids=s)

    got = outputs(body, [ids], [((1, 2, 9), nl.int32)])
    want = [[[9, 1, 1, 3, 3, 3, 9, 7, 7], [-1, 3, 3, 6, 6, 6, -1, 9, 9]]]
    np.testing.assert_array_equal(got, np.array(want, np.int32))


def test_sequence_bounds_rules():
    def body(s, out):
        nisa.sequence_bounds(dst=out, segment_ids=s)

    two = np.ones((2, 4), np.float32)
    expect_rule("PART", run_tiles, body, [two], [((2, 2, 4), nl.float32)])
    expect_rule("DTYPE", run_tiles, body, [np.ones((1, 4), np.float16)], [((1, 2, 4), nl.float16)])
    expect_rule("FREE", run_tiles, body, [np.ones((1, 4), np.float32)], [((1, 2, 3), nl.float32)])
