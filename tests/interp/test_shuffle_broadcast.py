"""nc_stream_shuffle, nonzero_with_count, nl.broadcast_to / expand_dims, shared_constant
from a .npy file and scalar_tensor_tensor's operand dtypes, against NumPy references."""

from __future__ import annotations

import numpy as np
import pytest
from tile_harness import BF16, expect_rule, outputs, run_tiles

from nki_kernels.interp import nisa, nl, run

rng = np.random.default_rng(7)


def _shuffle_ref(src, dst, mask):
    out = dst.copy()
    for i in range(dst.shape[0]):
        m = mask[i % 32]
        if m != 255:
            out[i] = src[i - i % 32 + m]
    return out


@pytest.mark.parametrize("rows", [128, 64, 32])
def test_nc_stream_shuffle_moves_partitions_within_quadrants(rows):
    src = rng.standard_normal((rows, 5)).astype(np.float32)
    dst0 = rng.standard_normal((rows, 5)).astype(np.float32)
    mask = [(i * 7) % 32 for i in range(32)]
    mask[3] = 255  # partition 3 of each quadrant keeps its value

    def body(s, d0, o):
        nisa.tensor_copy(dst=o, src=d0)
        nisa.nc_stream_shuffle(dst=o, src=s, shuffle_mask=mask)

    got = outputs(body, [src, dst0], [((rows, 5), nl.float32)])
    np.testing.assert_array_equal(got, _shuffle_ref(src, dst0, mask))


def test_nc_stream_shuffle_in_place_and_broadcast_of_partition_0():
    src = rng.standard_normal((64, 3)).astype(BF16)

    def body(s, d):
        nisa.tensor_copy(dst=d, src=s)
        nisa.nc_stream_shuffle(dst=d, src=d, shuffle_mask=[0] * 32)

    got = outputs(body, [src], [((64, 3), nl.bfloat16)])
    want = _shuffle_ref(src.astype(np.float32), src.astype(np.float32), [0] * 32)
    np.testing.assert_array_equal(got.astype(np.float32), want)


def test_nc_stream_shuffle_masked_partitions_keep_the_destination():
    src = rng.standard_normal((96, 4)).astype(np.float32)
    mask = [31 - i if i % 2 else 255 for i in range(32)]

    def body(s, d):
        nisa.memset(d, -5.0)
        nisa.nc_stream_shuffle(dst=d, src=s, shuffle_mask=mask)

    got = outputs(body, [src], [((96, 4), nl.float32)])
    np.testing.assert_array_equal(got, _shuffle_ref(src, np.full((96, 4), -5.0, np.float32), mask))


def test_nc_stream_shuffle_rules():
    def shuffle(mask, sdt=nl.float32, p=32, start=0):
        def kernel():
            s = nl.ndarray((128, 4), sdt)
            d = nl.ndarray((128, 4), nl.float32)
            nisa.memset(s, 1.0)
            nisa.nc_stream_shuffle(dst=d[start : start + p], src=s[start : start + p],
                                   shuffle_mask=mask)  # fmt: skip

        run(kernel)

    expect_rule("ARG", shuffle, [0] * 31)
    expect_rule("ARG", shuffle, [40] * 32)
    expect_rule("DTYPE", shuffle, [0] * 32, nl.bfloat16)
    expect_rule("PART", shuffle, [0] * 32, nl.float32, 64, 32)  # 64 active: start 0 or 64
    shuffle([0] * 32, nl.float32, 32, 96)  # 32 active may start at 96


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_nonzero_with_count_on_the_gpsimd_core_partitions(dtype):
    p, n = 128, 24
    src = (rng.random((p, n)) < 0.3).astype(dtype) * rng.integers(1, 5, (p, n)).astype(dtype)

    def body(s, d):
        nisa.memset(d, 9)
        nisa.nonzero_with_count(dst=d, src=s, index_offset=16, padding_val=-1)

    got = outputs(body, [src], [((p, n + 1), nl.int32)])
    for i in range(p):
        if i % 16:
            assert (got[i] == 9).all()  # untouched
            continue
        idx = np.flatnonzero(src[i]) + 16
        want = np.concatenate([idx, np.full(n - idx.size, -1), [idx.size]])
        np.testing.assert_array_equal(got[i], want)


def test_nonzero_with_count_rules():
    def call(sdt=nl.float32, ddt=nl.int32, extra=1, target="trn2"):
        def kernel():
            s = nl.ndarray((16, 8), sdt)
            d = nl.ndarray((16, 8 + extra), ddt)
            nisa.memset(s, 0)
            nisa.nonzero_with_count(dst=d, src=s)

        run(kernel, target=target)

    expect_rule("DTYPE", call, nl.bfloat16)
    expect_rule("DTYPE", call, nl.float32, nl.float32)
    expect_rule("FREE", call, nl.float32, nl.int32, 0)
    expect_rule("VERSION", call, target="trn1")


@pytest.mark.parametrize("rows, cols", [(128, 700), (37, 9)])
def test_broadcast_to_a_partition_row(rows, cols):
    row = rng.standard_normal((1, cols)).astype(BF16)
    got = outputs(lambda r, o: nisa.tensor_copy(dst=o, src=nl.broadcast_to(r, (rows, cols))),
                  [row], [((rows, cols), nl.bfloat16)])  # fmt: skip
    np.testing.assert_array_equal(got, np.broadcast_to(row, (rows, cols)))


def test_broadcast_to_free_dims_with_a_dtype_cast():
    col = rng.standard_normal((50, 1)).astype(np.float32)
    got = outputs(
        lambda c, o: nisa.tensor_copy(dst=o, src=nl.broadcast_to(c, (50, 6), dtype=nl.bfloat16)),
        [col],
        [((50, 6), nl.bfloat16)],
    )
    np.testing.assert_array_equal(got, np.broadcast_to(col, (50, 6)).astype(BF16))  # rounded


def test_broadcast_to_rules_and_identity():
    def kernel():
        t = nl.ndarray((4, 3), nl.float32)
        assert nl.broadcast_to(t, (4, 3)) is t
        nl.broadcast_to(t, (4, 6))

    expect_rule("NL_SHAPE", run, kernel)

    def rank():
        nl.broadcast_to(nl.ndarray((1, 3), nl.float32), (4, 3, 1))

    expect_rule("NL_SHAPE", run, rank)


def test_expand_dims_is_a_view():
    x = rng.standard_normal((8, 6)).astype(np.float32)
    got = outputs(lambda t, o: nisa.tensor_copy(dst=o, src=nl.expand_dims(t, 1)),
                  [x], [((8, 1, 6), nl.float32)])  # fmt: skip
    np.testing.assert_array_equal(got.reshape(8, 6), x)


def test_shared_constant_from_a_npy_path(tmp_path):
    const = rng.standard_normal((4, 6)).astype(np.float32)
    path = tmp_path / "c.npy"
    np.save(path, const)

    def kernel():
        return nl.shared_constant(str(path))

    np.testing.assert_array_equal(run(kernel).outputs, const)

    def missing():
        nl.shared_constant(str(tmp_path / "nope.npy"))

    e = expect_rule("ARG", run, missing)
    assert "nope.npy" in str(e)


def test_scalar_tensor_tensor_takes_a_bf16_operand_tile_but_tensor_scalar_does_not():
    x = rng.standard_normal((40, 8)).astype(np.float32)
    y = rng.standard_normal((40, 8)).astype(np.float32)
    s = rng.standard_normal((40, 1)).astype(BF16)

    def body(a, b, c, o):
        nisa.scalar_tensor_tensor(dst=o, data=a, op0=nl.multiply, operand0=c, op1=nl.add,
                                  operand1=b)  # fmt: skip

    got = outputs(body, [x, y, s], [((40, 8), nl.float32)])
    np.testing.assert_allclose(got, x * s.astype(np.float32) + y, rtol=1e-6)

    def ts(a, c, o):
        nisa.tensor_scalar(dst=o, data=a, op0=nl.multiply, operand0=c)

    e = expect_rule("DTYPE", run_tiles, ts, [x, s], [((40, 8), nl.float32)])
    assert "must be fp32" in str(e)
