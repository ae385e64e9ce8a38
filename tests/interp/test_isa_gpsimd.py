"""GpSimd instructions against NumPy references: affine_select, tensor_partition_reduce."""

from __future__ import annotations

import numpy as np
import pytest
from tile_harness import bf16, last_instr, outputs, run_tiles

from nki_kernels.interp import NkiValidationError, nisa, nl

FP32_MIN = np.float32(np.finfo(np.float32).min)
rng = np.random.default_rng(7)


def _affine_ref(shape_pf: tuple[int, int], pairs, offset: int, mult: int) -> np.ndarray:
    p, _ = shape_pf
    grids = np.meshgrid(*[np.arange(n) for _, n in pairs], indexing="ij")
    val = offset + sum(g * s for g, (s, _) in zip(grids, pairs))
    return val.reshape(1, -1) + mult * np.arange(p).reshape(p, 1)


# ---- affine_select ----------------------------------------------------------------
def test_affine_select_causal_mask_fp32():
    p, n, q0, k0 = 64, 48, 32, 40
    x = rng.standard_normal((p, n)).astype(np.float32)

    def body(t, out):
        nisa.affine_select(
            out,
            pattern=[[-1, n]],
            channel_multiplier=1,
            on_true_tile=t,
            on_false_value=nl.fp32_min,
            cmp_op=nl.greater_equal,
            offset=q0 - k0,
        )

    got = outputs(body, [x], [((p, n), nl.float32)])
    keep = (q0 + np.arange(p)[:, None]) >= (k0 + np.arange(n)[None, :])
    np.testing.assert_array_equal(got, np.where(keep, x, FP32_MIN))


def test_affine_select_multi_dim_pattern_and_default_equal():
    p, a, b = 16, 4, 6
    x = rng.standard_normal((p, a, b)).astype(np.float32)
    pairs = [(6, a), (-2, b)]

    def body(t, out):
        nisa.affine_select(out, [[6, a], [-2, b]], 0, t, -1.5, offset=-6)

    got = outputs(body, [x], [((p, a, b), nl.float32)])
    val = _affine_ref((p, a * b), pairs, -6, 0).reshape(p, a, b)
    np.testing.assert_array_equal(got, np.where(val == 0, x, np.float32(-1.5)))


def test_affine_select_bf16_dst_rounds_and_fp32_min_becomes_inf():
    p, n = 32, 40
    x = rng.standard_normal((p, n)).astype(np.float32)

    def body(t, out):
        nisa.affine_select(out, [[1, n]], -1, t, nl.fp32_min, cmp_op=nl.less, offset=-5)

    got = outputs(body, [x], [((p, n), nl.bfloat16)])
    val = _affine_ref((p, n), [(1, n)], -5, -1)
    ref = bf16(np.where(val < 0, x, FP32_MIN))
    np.testing.assert_array_equal(got, ref)
    assert np.isneginf(got.astype(np.float32)).any()


def test_affine_select_int32_same_dtype_is_bit_exact():
    p, n = 8, 16
    x = (rng.integers(-(2**30), 2**30, (p, n)) | 1).astype(np.int32)

    def body(t, out):
        nisa.affine_select(out, [[1, n]], 1, t, 7.0, cmp_op=nl.not_equal, offset=-9)

    got = outputs(body, [x], [((p, n), nl.int32)])
    val = _affine_ref((p, n), [(1, n)], -9, 1)
    np.testing.assert_array_equal(got, np.where(val != 0, x, 7))


def test_affine_select_ragged_partitions_leave_the_rest_untouched():
    p, n = 128, 24
    x = rng.standard_normal((p, n)).astype(np.float32)

    def body(t, out):
        nisa.affine_select(
            out[0:77, :], [[-1, n]], 1, t[0:77, :], nl.fp32_min, cmp_op=nl.greater_equal
        )

    res = run_tiles(body, [x], [((p, n), nl.float32)])
    got = res.outputs[0]
    val = _affine_ref((77, n), [(-1, n)], 0, 1)
    np.testing.assert_array_equal(got[:77], np.where(val >= 0, x[:77], FP32_MIN))
    assert np.isnan(got[77:]).all()
    rec = last_instr(res, "affine_select")
    assert (rec.engine, rec.p, rec.n, rec.attrs["cmp_op"]) == ("gpsimd", 77, n, "greater_equal")


def test_affine_select_trace_only_records_without_values():
    x = np.zeros((16, 8), np.float32)

    def body(t, out):
        nisa.affine_select(out, [[1, 8]], 0, t, 0.0)

    res = run_tiles(body, [x], [((16, 8), nl.float32)], trace_only=True)
    assert res.trace.count("gpsimd", "affine_select") == 1


@pytest.mark.parametrize(
    "case, rule",
    [
        ("cmp_add", "OP"),
        ("psum", "GPSIMD_PSUM"),
        ("count", "FREE"),
        ("five_pairs", "ARG"),
        ("partitions", "PART"),
        ("tile_fill", "ARG"),
        ("float_offset", "ARG"),
        ("kwarg", "KWARG"),
    ],
)
def test_affine_select_rules(case, rule):
    x = np.zeros((16, 8), np.float32)

    def body(t, out):
        if case == "cmp_add":
            nisa.affine_select(out, [[1, 8]], 0, t, 0.0, cmp_op=nl.add)
        elif case == "psum":
            ps = nl.ndarray((16, 8), nl.float32, buffer=nl.psum)
            nisa.affine_select(out, [[1, 8]], 0, ps, 0.0)
        elif case == "count":
            nisa.affine_select(out, [[1, 7]], 0, t, 0.0)
        elif case == "five_pairs":
            nisa.affine_select(out, [[1, 1], [1, 1], [1, 1], [1, 2], [1, 4]], 0, t, 0.0)
        elif case == "partitions":
            nisa.affine_select(out[0:8, :], [[1, 8]], 0, t, 0.0)
        elif case == "tile_fill":
            nisa.affine_select(out, [[1, 8]], 0, t, t)
        elif case == "float_offset":
            nisa.affine_select(out, [[1, 8]], 0, t, 0.0, offset=1.5)
        else:
            nisa.affine_select(out, [[1, 8]], 0, t, 0.0, mask=None)

    with pytest.raises(NkiValidationError) as e:
        run_tiles(body, [x], [((16, 8), nl.float32)])
    assert e.value.rule == rule
    assert f"rule {rule}" in str(e.value)


# ---- tensor_partition_reduce --------------------------------------------------------
@pytest.mark.parametrize(
    "op, ref",
    [
        (nl.add, lambda x: x.sum(axis=0, dtype=np.float32)),
        (nl.average, lambda x: x.sum(axis=0, dtype=np.float32) / np.float32(x.shape[0])),
        (nl.maximum, lambda x: x.max(axis=0)),
        (nl.max, lambda x: x.max(axis=0)),
    ],
)
def test_partition_reduce_float_ops(op, ref):
    x = rng.standard_normal((64, 3, 4)).astype(np.float32)

    def body(t, out):
        nisa.tensor_partition_reduce(out, op, t)

    got = outputs(body, [x], [((1, 3, 4), nl.float32)])
    np.testing.assert_allclose(got[0], ref(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "op, fn", [(nl.bitwise_or, np.bitwise_or), (nl.bitwise_and, np.bitwise_and)]
)
def test_partition_reduce_bitwise_int32_exact(op, fn):
    x = rng.integers(0, 2**31 - 1, (32, 8)).astype(np.int32)

    def body(t, out):
        nisa.tensor_partition_reduce(out, op, t)

    got = outputs(body, [x], [((1, 8), nl.int32)])
    np.testing.assert_array_equal(got[0], fn.reduce(x, axis=0))


def test_partition_reduce_int_add_is_exact():
    x = rng.integers(-(2**20), 2**20, (128, 5)).astype(np.int32)

    def body(t, out):
        nisa.tensor_partition_reduce(out, nl.add, t)

    got = outputs(body, [x], [((1, 5), nl.int32)])
    np.testing.assert_array_equal(got[0], x.sum(axis=0))


def test_partition_reduce_ragged_bf16():
    x = rng.standard_normal((128, 16)).astype(np.float32)

    def body(t, out):
        nisa.tensor_partition_reduce(out, nl.add, t[0:77, :])

    res = run_tiles(body, [x], [((1, 16), nl.bfloat16)])
    np.testing.assert_array_equal(res.outputs[0][0], bf16(x[:77].sum(axis=0, dtype=np.float32)))
    rec = last_instr(res, "tensor_partition_reduce")
    assert (rec.engine, rec.p, rec.n) == ("gpsimd", 77, 16)


@pytest.mark.parametrize(
    "case, rule",
    [
        ("minimum", "OP"),
        ("bitwise_float", "DTYPE"),
        ("dst_parts", "PART"),
        ("psum", "GPSIMD_PSUM"),
        ("free", "FREE"),
    ],
)
def test_partition_reduce_rules(case, rule):
    x = np.zeros((16, 8), np.float32)

    def body(t, out):
        if case == "minimum":
            nisa.tensor_partition_reduce(out[0:1, :], nl.minimum, t)
        elif case == "bitwise_float":
            nisa.tensor_partition_reduce(out[0:1, :], nl.bitwise_or, t)
        elif case == "dst_parts":
            nisa.tensor_partition_reduce(out[0:2, :], nl.add, t)
        elif case == "psum":
            ps = nl.ndarray((16, 8), nl.float32, buffer=nl.psum)
            nisa.tensor_partition_reduce(out[0:1, :], nl.add, ps)
        else:
            nisa.tensor_partition_reduce(out[0:1, 0:4], nl.add, t)

    with pytest.raises(NkiValidationError) as e:
        run_tiles(body, [x], [((16, 8), nl.float32)])
    assert e.value.rule == rule
