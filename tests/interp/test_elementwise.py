"""VectorE / ScalarE / GpSimd element-wise instructions against NumPy fp32 references:
tensor_copy, memset, iota, tensor_tensor, tensor_scalar, scalar_tensor_tensor,
tensor_reduce, reciprocal; and their rules (activation: test_activation.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from tile_harness import BF16, bf16, expect_rule, last_instr, outputs, run_tiles

from nki_kernels.interp import nisa, nl

rng = np.random.default_rng(17)
F32 = np.float32


def _raises(rule, body, inputs, outs, target="trn2"):
    return expect_rule(rule, run_tiles, body, inputs, outs, target=target)


def _x(shape, scale=1.0, dtype=F32):
    return (rng.standard_normal(shape) * scale).astype(dtype)


# ---- tensor_copy / memset / iota ---------------------------------------------------------
def test_tensor_copy_is_bit_exact_for_equal_dtypes_and_rounds_otherwise():
    x = _x((100, 37), 3.0)
    nan_bits = np.array([[0x7FC1, 0xFFFF]], np.uint16).view(BF16)

    def body(t, nb, out16, out32, outnb, outi):
        nisa.tensor_copy(dst=out16[0:60, :], src=t[0:60, :])  # ragged partitions, fp32->bf16
        nisa.tensor_copy(dst=out32, src=t, engine=nisa.engine.gpsimd)
        nisa.tensor_copy(dst=outnb, src=nb, engine=nisa.engine.scalar)
        nisa.tensor_copy(dst=outi, src=t[:, 0:4])

    res = run_tiles(
        body,
        [x, nan_bits],
        [
            ((100, 37), nl.bfloat16),
            ((100, 37), nl.float32),
            ((1, 2), nl.bfloat16),
            ((100, 4), nl.int8),
        ],
    )
    o16, o32, onb, oi = res.outputs
    np.testing.assert_array_equal(o16[:60], bf16(x[:60]))
    assert np.isnan(o16[60:].astype(F32)).all()
    np.testing.assert_array_equal(o32, x)
    np.testing.assert_array_equal(onb.view(np.uint16), nan_bits.view(np.uint16))
    np.testing.assert_array_equal(oi, np.clip(np.rint(x[:, 0:4]), -128, 127))
    engines = [i.engine for i in res.trace if i.opcode == "tensor_copy"]
    assert engines == ["vector", "gpsimd", "scalar", "vector"]


def test_tensor_copy_between_dtypes_goes_through_fp32():
    x = np.array([[2**24 + 1, -(2**24) - 3, 5]], np.int32)

    def body(t, out):
        nisa.tensor_copy(dst=out, src=t)

    np.testing.assert_array_equal(outputs(body, [x], [((1, 3), nl.int16)]), [[32767, -32768, 5]])


def test_tensor_copy_evacuates_psum():
    x = _x((16, 8))

    def body(t, out):
        ps = nl.ndarray((16, 8), nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=ps, src=t)
        nisa.tensor_copy(dst=out, src=ps)

    np.testing.assert_array_equal(outputs(body, [x], [((16, 8), nl.float32)]), x)


def test_memset_values_by_dtype():
    def body(a, b, c, d):
        nisa.memset(dst=a, value=0)  # int literal into a float tile (docs example)
        nisa.memset(dst=b, value=1.0 / 3.0)
        nisa.memset(dst=c[:, 1:3], value=-7, engine=nisa.engine.gpsimd)
        nisa.memset(dst=d, value=300)

    a, b, c, d = outputs(
        body,
        [],
        [((4, 3), nl.bfloat16), ((4, 3), nl.bfloat16), ((4, 4), nl.int32), ((2, 2), nl.uint8)],
    )
    assert (a.astype(F32) == 0).all()
    assert (b == bf16(np.float32(1.0 / 3.0))).all()
    assert (c[:, 1:3] == -7).all() and (c[:, [0, 3]] == 4).all()  # 4: the int sentinel
    assert (d == 255).all()  # saturates


def test_iota_patterns_and_channel_multiplier():
    def body(a, b, c):
        nisa.iota(dst=a, pattern=[[1, 1]], offset=0, channel_multiplier=2)
        nisa.iota(dst=b, pattern=[[3, 2], [-1, 5]], offset=10, channel_multiplier=100)
        nisa.iota(dst=c, pattern=[[1, 6]], offset=-2)

    a, b, c = outputs(body, [], [((64, 1), nl.int32), ((8, 2, 5), nl.int32), ((3, 6), nl.float32)])
    np.testing.assert_array_equal(a[:, 0], np.arange(64) * 2)
    p, i, j = np.meshgrid(np.arange(8), np.arange(2), np.arange(5), indexing="ij")
    np.testing.assert_array_equal(b, 10 + 100 * p + 3 * i - j)
    np.testing.assert_array_equal(c, np.tile(np.arange(6) - 2, (3, 1)).astype(F32))


# ---- tensor_tensor / tensor_scalar / scalar_tensor_tensor ------------------------------------
BIN = [
    (nl.add, np.add),
    (nl.subtract, np.subtract),
    (nl.multiply, np.multiply),
    (nl.maximum, np.maximum),
    (nl.minimum, np.minimum),
    (nl.greater_equal, lambda a, b: (a >= b).astype(F32)),
    (nl.not_equal, lambda a, b: (a != b).astype(F32)),
    (nl.logical_and, lambda a, b: ((a != 0) & (b != 0)).astype(F32)),
]


@pytest.mark.parametrize(("op", "ref"), BIN, ids=[o.name for o, _ in BIN])
def test_tensor_tensor_arithmetic_in_fp32_rounds_on_store(op, ref):
    a, b = _x((70, 33)).astype(BF16), _x((70, 33))
    b[0, :5] = a[0, :5].astype(F32)  # some equal pairs for the comparisons

    def body(x, y, out):
        nisa.tensor_tensor(dst=out[0:70], data1=x, data2=y, op=op)

    got = outputs(body, [a, b], [((128, 33), nl.bfloat16)])
    np.testing.assert_array_equal(got[:70], bf16(ref(a.astype(F32), b)))
    assert np.isnan(got[70:].astype(F32)).all()


def test_tensor_tensor_int32_is_exact_on_gpsimd_and_bitvec_ops():
    a = np.array([[2**30 + 1, -7, 12]], np.int32)
    b = np.array([[2**29 + 3, 3, 10]], np.int32)

    def body(x, y, s, band, shl, shr):
        nisa.tensor_tensor(dst=s, data1=x, data2=y, op=nl.add)
        nisa.tensor_tensor(dst=band, data1=x, data2=y, op=nl.bitwise_and)
        nisa.tensor_tensor(dst=shl, data1=y, data2=y[:, 1:2].broadcast(1, 3), op=nl.left_shift)
        nisa.tensor_tensor(dst=shr, data1=x, data2=y[:, 1:2].broadcast(1, 3), op=nl.right_shift)

    res = run_tiles(body, [a, b], [((1, 3), nl.int32)] * 4)
    s, band, shl, shr = res.outputs
    np.testing.assert_array_equal(s, a.astype(np.int64) + b)
    np.testing.assert_array_equal(band, a & b)
    np.testing.assert_array_equal(shl, b << 3)
    np.testing.assert_array_equal(shr, (a.view(np.uint32) >> 3).view(np.int32))  # logical
    # all-int32 operands outside PSUM default to GpSimd (exact 32-bit integer math)
    assert {i.engine for i in res.trace if i.opcode == "tensor_tensor"} == {"gpsimd"}


def test_tensor_tensor_power_runs_on_gpsimd():
    a, b = np.abs(_x((8, 5))) + 0.5, _x((8, 5))

    def body(x, y, out):
        nisa.tensor_tensor(dst=out, data1=x, data2=y, op=nl.power)

    res = run_tiles(body, [a, b], [((8, 5), nl.float32)])
    np.testing.assert_allclose(res.outputs[0], np.power(a, b), rtol=1e-6)
    assert last_instr(res, "tensor_tensor").engine == "gpsimd"


def test_tensor_scalar_columns_scalars_reverse_and_unary():
    x = np.abs(_x((50, 12))) + 0.25
    col = _x((50, 1))

    def body(t, c, o1, o2, o3):
        nisa.tensor_scalar(
            dst=o1,
            data=t,
            op0=nl.subtract,
            operand0=c,
            reverse0=True,
            op1=nl.multiply,
            operand1=3.0,
        )
        nisa.tensor_scalar(
            dst=o2, data=t, op0=nl.rsqrt, operand0=None, op1=nl.add, operand1=c, reverse1=True
        )
        nisa.tensor_scalar(
            dst=o3,
            data=t,
            op0=nl.multiply,
            operand0=2.0,
            op1=nl.add,
            operand1=1.0,
            engine=nisa.engine.scalar,
        )

    res = run_tiles(
        body, [x, col], [((50, 12), nl.float32), ((50, 12), nl.bfloat16), ((50, 12), nl.float32)]
    )
    o1, o2, o3 = res.outputs
    np.testing.assert_allclose(o1, (col - x) * 3, rtol=1e-6)
    np.testing.assert_array_equal(o2, bf16(col + (F32(1) / np.sqrt(x))))
    np.testing.assert_allclose(o3, x * 2 + 1, rtol=1e-6)
    assert last_instr(res, "tensor_scalar").engine == "scalar"


def test_tensor_scalar_bitvec_with_int_column():
    x = np.array([[0b1011, 0b0110], [0xFF, 0x10]], np.int32)
    mask = np.array([[0b0011], [0xF0]], np.int32)

    def body(t, m, out):
        nisa.tensor_scalar(
            dst=out, data=t, op0=nl.bitwise_and, operand0=m, op1=nl.left_shift, operand1=1
        )

    np.testing.assert_array_equal(outputs(body, [x, mask], [((2, 2), nl.int32)]), (x & mask) << 1)


def test_scalar_tensor_tensor_matches_numpy():
    x, y = _x((64, 20)), _x((64, 20))
    col = _x((64, 1))

    def body(a, b, c, o1, o2):
        nisa.scalar_tensor_tensor(
            dst=o1, data=a, op0=nl.multiply, operand0=c, op1=nl.add, operand1=b
        )
        nisa.scalar_tensor_tensor(
            dst=o2,
            data=a,
            op0=nl.subtract,
            operand0=2.0,
            op1=nl.subtract,
            operand1=b,
            reverse0=True,
            reverse1=True,
        )

    o1, o2 = outputs(body, [x, y, col], [((64, 20), nl.float32), ((64, 20), nl.bfloat16)])
    np.testing.assert_allclose(o1, x * col + y, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(o2, bf16(y - (F32(2) - x)))


# ---- tensor_reduce / reciprocal ----------------------------------------------------------
def test_tensor_reduce_trailing_axes_negate_keepdims_and_bitvec():
    x = _x((40, 3, 4, 5))
    ints = rng.integers(0, 256, size=(40, 7)).astype(np.int32)

    def body(t, i, s, m, kd, bor):
        nisa.tensor_reduce(dst=s, op=nl.add, data=t, axis=(2, 3))
        nisa.tensor_reduce(dst=m, op=nl.maximum, data=t, axis=(1, 2, 3), negate=True)
        nisa.tensor_reduce(dst=kd, op=nl.minimum, data=t, axis=-1, keepdims=True)
        nisa.tensor_reduce(dst=bor, op=nl.bitwise_or, data=i, axis=1)

    s, m, kd, bor = outputs(
        body,
        [x, ints],
        [
            ((40, 3), nl.float32),
            ((40, 1), nl.bfloat16),
            ((40, 3, 4, 1), nl.float32),
            ((40, 1), nl.int32),
        ],
    )
    np.testing.assert_allclose(s, x.sum(axis=(2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(m[:, 0], bf16(-x.reshape(40, -1).max(axis=1)))
    np.testing.assert_array_equal(kd, x.min(axis=-1, keepdims=True))
    np.testing.assert_array_equal(bor[:, 0], np.bitwise_or.reduce(ints, axis=1))


def test_reciprocal_is_fp32_and_rounds_on_store():
    x = _x((33, 9)) + 0.01

    def body(t, o, o16):
        ps = nl.ndarray((33, 9), nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=ps, src=t)
        nisa.reciprocal(dst=o, data=ps)
        nisa.reciprocal(dst=o16, data=t)

    o, o16 = outputs(body, [x], [((33, 9), nl.float32), ((33, 9), nl.bfloat16)])
    np.testing.assert_array_equal(o, F32(1) / x)
    np.testing.assert_array_equal(o16, bf16(F32(1) / x))


# ---- every instruction on a partition window that does not start at 0 -------------------
R = slice(13, 90)  # partitions 13..89: a ragged window away from partition 0
RAGGED = [
    (
        "tensor_copy",
        lambda x, y, c, o: nisa.tensor_copy(dst=o[R], src=x[R]),
        lambda x, y, c: x[R],
        24,
    ),
    ("memset", lambda x, y, c, o: nisa.memset(dst=o[R], value=1 / 3), lambda x, y, c: 1 / 3, 24),
    (
        "iota",
        lambda x, y, c, o: nisa.iota(dst=o[R], pattern=[[3, 24]], offset=-5, channel_multiplier=7),
        lambda x, y, c: -5 + 7 * np.arange(77)[:, None] + 3 * np.arange(24)[None, :],
        24,
    ),
    (
        "tensor_tensor",
        lambda x, y, c, o: nisa.tensor_tensor(dst=o[R], data1=x[R], data2=y[R], op=nl.subtract),
        lambda x, y, c: x[R] - y[R],
        24,
    ),
    (
        "tensor_scalar",
        lambda x, y, c, o: nisa.tensor_scalar(
            dst=o[R], data=x[R], op0=nl.multiply, operand0=c[R], op1=nl.add, operand1=-0.5
        ),
        lambda x, y, c: x[R] * c[R] - 0.5,
        24,
    ),
    (
        "scalar_tensor_tensor",
        lambda x, y, c, o: nisa.scalar_tensor_tensor(
            dst=o[R], data=x[R], op0=nl.maximum, operand0=c[R], op1=nl.multiply, operand1=y[R]
        ),
        lambda x, y, c: np.maximum(x[R], c[R]) * y[R],
        24,
    ),
    (
        "tensor_reduce",
        lambda x, y, c, o: nisa.tensor_reduce(dst=o[R], op=nl.add, data=x[R], axis=1),
        lambda x, y, c: x[R].sum(axis=1, keepdims=True),
        1,
    ),
    (
        "reciprocal",
        lambda x, y, c, o: nisa.reciprocal(dst=o[R], data=y[R]),
        lambda x, y, c: 1 / y[R],
        24,
    ),
]


@pytest.mark.parametrize(
    ("call", "ref", "cols"), [c[1:] for c in RAGGED], ids=[c[0] for c in RAGGED]
)
def test_ragged_partition_window_rounds_to_bf16_and_leaves_other_rows(call, ref, cols):
    x, c = _x((128, 24)), _x((128, 1))
    y = ((np.abs(_x((128, 24))) + 0.5) * np.sign(_x((128, 24)))).astype(F32)  # |y| >= 0.5

    def body(a, b, col, out):
        call(a, b, col, out)

    got = outputs(body, [x, y, c], [((128, cols), nl.bfloat16)])
    expect = np.broadcast_to(ref(x.astype(np.float64), y.astype(np.float64), c), (77, cols))
    # fp32 engine math rounded once to bf16: within one bf16 ulp (2^-7 relative) of the
    # fp64 value rounded to bf16; atol covers the fp32 rounding of a 24-term sum near 0
    np.testing.assert_allclose(
        got[R].astype(F32), bf16(expect).astype(F32), rtol=2**-7, atol=24 * 2**-23 * 4
    )
    assert np.isnan(got[:13].astype(F32)).all() and np.isnan(got[90:].astype(F32)).all()


# ---- rules -------------------------------------------------------------------------------------
_T = [((8, 4), nl.float32)]
_I = [((8, 4), nl.int32)]


def _psum(shape=(8, 4), dtype=nl.float32):
    return nl.ndarray(shape, dtype, buffer=nl.psum)


RULE_CASES = [
    # tensor_copy
    (
        "GPSIMD_PSUM",
        lambda o: nisa.tensor_copy(dst=o, src=_psum(), engine=nisa.engine.gpsimd),
        _T,
        "trn2",
    ),
    ("ENGINE", lambda o: nisa.tensor_copy(dst=o, src=o, engine=nisa.engine.scalar), _T, "trn1"),
    ("ENGINE", lambda o: nisa.tensor_copy(dst=o, src=o, engine=nisa.engine.tensor), _T, "trn2"),
    ("ARG", lambda o: nisa.tensor_copy(dst=o, src=o, engine=5), _T, "trn2"),
    ("FREE", lambda o: nisa.tensor_copy(dst=o, src=o[:, 0:3]), _T, "trn2"),
    ("PART", lambda o: nisa.tensor_copy(dst=o, src=o[0:4, :]), _T, "trn2"),
    (
        "BUF",
        lambda o: nisa.tensor_copy(dst=o, src=nl.ndarray((8, 4), nl.float32, buffer=nl.hbm)),
        _T,
        "trn2",
    ),
    ("ARG", lambda o: nisa.tensor_copy(dst=o, src=np.zeros((8, 4))), _T, "trn2"),
    # memset
    ("MEMSET_KIND", lambda o: nisa.memset(dst=o, value=2.0), _I, "trn2"),
    ("MEMSET_KIND", lambda o: nisa.memset(dst=o, value=True), _T, "trn2"),
    ("MEMSET_KIND", lambda o: nisa.memset(dst=o, value="0"), _T, "trn2"),
    ("ENGINE", lambda o: nisa.memset(dst=o, value=0.0, engine=nisa.engine.scalar), _T, "trn2"),
    (
        "GPSIMD_PSUM",
        lambda o: nisa.memset(dst=_psum(), value=0.0, engine=nisa.engine.gpsimd),
        _T,
        "trn2",
    ),
    ("KWARG", lambda o: nisa.memset(dst=o, value=0.0, shape=(8, 4)), _T, "trn2"),
    # iota
    ("FREE", lambda o: nisa.iota(dst=o, pattern=[[1, 5]]), _I, "trn2"),
    ("ARG", lambda o: nisa.iota(dst=o, pattern=[[1, 1]] * 4 + [[1, 4]]), _I, "trn2"),
    ("ARG", lambda o: nisa.iota(dst=o, pattern=[[1, 4]], offset=0.5), _I, "trn2"),
    ("BUF", lambda o: nisa.iota(dst=_psum(dtype=nl.int32), pattern=[[1, 4]]), _I, "trn2"),
    # tensor_tensor
    (
        "BUF",
        lambda o: nisa.tensor_tensor(dst=o, data1=_psum(), data2=_psum(), op=nl.add),
        _T,
        "trn2",
    ),
    (
        "ENGINE",
        lambda o: nisa.tensor_tensor(
            dst=o, data1=o, data2=o, op=nl.power, engine=nisa.engine.vector
        ),
        _T,
        "trn2",
    ),
    (
        "ENGINE",
        lambda o: nisa.tensor_tensor(dst=o, data1=o, data2=o, op=nl.add, engine=nisa.engine.scalar),
        _T,
        "trn2",
    ),
    (
        "GPSIMD_PSUM",
        lambda o: nisa.tensor_tensor(dst=o, data1=_psum(), data2=o, op=nl.power),
        _T,
        "trn2",
    ),
    ("DTYPE", lambda o: nisa.tensor_tensor(dst=o, data1=o, data2=o, op=nl.bitwise_xor), _T, "trn2"),
    ("VERSION", lambda o: nisa.tensor_tensor(dst=o, data1=o, data2=o, op=nl.abs_max), _T, "trn2"),
    ("OP", lambda o: nisa.tensor_tensor(dst=o, data1=o, data2=o, op=nl.exp), _T, "trn2"),
    ("OP", lambda o: nisa.tensor_tensor(dst=o, data1=o, data2=o, op=nl.divide), _T, "trn2"),
    ("FREE", lambda o: nisa.tensor_tensor(dst=o, data1=o, data2=o[:, 0:2], op=nl.add), _T, "trn2"),
    # tensor_scalar
    (
        "DTYPE",
        lambda o: nisa.tensor_scalar(
            dst=o, data=o, op0=nl.add, operand0=nl.ndarray((8, 1), nl.bfloat16)
        ),
        _T,
        "trn2",
    ),
    ("ARG", lambda o: nisa.tensor_scalar(dst=o, data=o, op0=nl.abs, operand0=2.0), _T, "trn2"),
    (
        "ARG",
        lambda o: nisa.tensor_scalar(dst=o, data=o, op0=nl.add, operand0=1.0, operand1=2.0),
        _T,
        "trn2",
    ),
    (
        "OP",
        lambda o: nisa.tensor_scalar(
            dst=o, data=o, op0=nl.add, operand0=1, op1=nl.bitwise_and, operand1=1
        ),
        _I,
        "trn2",
    ),
    (
        "ENGINE",
        lambda o: nisa.tensor_scalar(
            dst=o, data=o, op0=nl.bitwise_and, operand0=1, engine=nisa.engine.gpsimd
        ),
        _I,
        "trn2",
    ),
    (
        "ENGINE",
        lambda o: nisa.tensor_scalar(
            dst=o,
            data=o,
            op0=nl.add,
            operand0=1.0,
            op1=nl.multiply,
            operand1=2.0,
            engine=nisa.engine.scalar,
        ),
        _T,
        "trn2",
    ),
    (
        "ENGINE",
        lambda o: nisa.tensor_scalar(
            dst=o, data=o, op0=nl.maximum, operand0=1.0, engine=nisa.engine.scalar
        ),
        _T,
        "trn2",
    ),
    ("OP", lambda o: nisa.tensor_scalar(dst=o, data=o, op0=nl.exp, operand0=None), _T, "trn2"),
    ("FREE", lambda o: nisa.tensor_scalar(dst=o, data=o, op0=nl.add, operand0=o), _T, "trn2"),
    # scalar_tensor_tensor
    (
        "BUF",
        lambda o: nisa.scalar_tensor_tensor(
            dst=o, data=_psum(), op0=nl.add, operand0=1.0, op1=nl.add, operand1=_psum()
        ),
        _T,
        "trn2",
    ),
    (
        "OP",
        lambda o: nisa.scalar_tensor_tensor(
            dst=o, data=o, op0=nl.bitwise_and, operand0=1, op1=nl.add, operand1=o
        ),
        _I,
        "trn2",
    ),
    # tensor_reduce
    (
        "REDUCE_AXIS",
        lambda o: nisa.tensor_reduce(
            dst=o[:, 0:1], op=nl.add, data=nl.ndarray((8, 2, 3), nl.float32), axis=1
        ),
        _T,
        "trn2",
    ),
    ("REDUCE_AXIS", lambda o: nisa.tensor_reduce(dst=o, op=nl.add, data=o, axis=0), _T, "trn2"),
    ("FREE", lambda o: nisa.tensor_reduce(dst=o, op=nl.add, data=o, axis=1), _T, "trn2"),
    ("OP", lambda o: nisa.tensor_reduce(dst=o[:, 0:1], op=nl.equal, data=o, axis=1), _T, "trn2"),
    (
        "ARG",
        lambda o: nisa.tensor_reduce(dst=o[:, 0:1], op=nl.bitwise_or, data=o, axis=1, negate=True),
        _I,
        "trn2",
    ),
    (
        "DTYPE",
        lambda o: nisa.tensor_reduce(dst=o[:, 0:1], op=nl.bitwise_or, data=o, axis=1),
        _T,
        "trn2",
    ),
    # reciprocal
    ("FREE", lambda o: nisa.reciprocal(dst=o, data=o[:, 0:1]), _T, "trn2"),
]


@pytest.mark.parametrize(("rule", "call", "outs", "target"), RULE_CASES)
def test_elementwise_rules(rule, call, outs, target):
    _raises(rule, lambda o: call(o), [], outs, target=target)


def test_memset_kind_error_suggests_the_literal():
    err = _raises("MEMSET_KIND", lambda o: nisa.memset(dst=o, value=2.0), [], _I)
    assert "must be an int literal for int32" in str(err) and "write 2" in str(err)


def test_memset_float_zero_fills_integer_tiles():
    # zero is accepted for every dtype (nki-library's cross_partition_copy memsets 0.0
    # into uint32 tiles); a non-zero float into an integer tile stays MEMSET_KIND
    def body(a, b, c):
        nisa.memset(dst=a, value=7)
        nisa.memset(dst=a, value=0.0)
        nisa.memset(dst=b, value=-0.0, engine=nisa.engine.gpsimd)
        nisa.memset(dst=c, value=np.float32(0.0))

    outs = [((4, 3), nl.uint32), ((4, 3), nl.int32), ((2, 2), nl.int8)]
    for got in outputs(body, [], outs):
        assert got.dtype.kind in "iu" and (got == 0).all()


@pytest.mark.parametrize(("value", "dtype"), [(1.0, nl.uint32), (0.5, nl.int8), (-2.0, nl.int16)])
def test_memset_nonzero_float_into_integer_tile_is_rejected(value, dtype):
    err = _raises("MEMSET_KIND", lambda o: nisa.memset(dst=o, value=value), [], [((8, 4), dtype)])
    assert f"value {value!r} must be an int literal for {dtype}" in str(err)


def test_bf16_input_is_widened_exactly():
    x = _x((4, 4)).astype(ml_dtypes.bfloat16)

    def body(t, out):
        nisa.tensor_scalar(dst=out, data=t, op0=nl.multiply, operand0=1.0)

    np.testing.assert_array_equal(outputs(body, [x], [((4, 4), nl.float32)]), x.astype(F32))
