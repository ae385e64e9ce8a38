"""The experimental nl compute layer against NumPy: binary / unary wrappers, reductions,
softmax, matmul, transpose, where. Every wrapper must issue traced ISA instructions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tile_harness import BF16, bf16, expect_rule

from nki_kernels.interp import nisa, nl, run

rng = np.random.default_rng(13)


def compute(fn, *arrays, target="trn2"):
    """Load the arrays as SBUF tiles, call fn(*tiles), store each result (PSUM via nl.copy)."""

    def kernel(*hbm):
        res = fn(*[nl.load(h) for h in hbm])
        outs = []
        for t in res if isinstance(res, tuple) else (res,):
            assert isinstance(t, nl.ndarray_type)
            src = nl.copy(t) if t.buffer is nl.psum else t
            o = nl.ndarray(src.shape, src.dtype, buffer=nl.shared_hbm)
            nl.store(o, src)
            outs.append(o)
        return tuple(outs)

    result = run(kernel, *arrays, target=target)
    out = result.outputs
    return (out[0] if len(out) == 1 else out), result.trace


def _raises(rule, fn, *arrays):
    return expect_rule(rule, compute, fn, *arrays)


X = rng.standard_normal((128, 24)).astype(np.float32)
Y = rng.standard_normal((128, 24)).astype(np.float32)


# ---- binary ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "op, ref",
    [
        (nl.add, np.add),
        (nl.subtract, np.subtract),
        (nl.multiply, np.multiply),
        (nl.maximum, np.maximum),
        (nl.minimum, np.minimum),
        (nl.greater, lambda a, b: (a > b).astype(np.float32)),
        (nl.less_equal, lambda a, b: (a <= b).astype(np.float32)),
        (nl.logical_and, lambda a, b: ((a > 0) & (b > 0)).astype(np.float32)),
    ],
)
def test_binary_tiles_ragged(op, ref):
    a, b = X, Y
    if op is nl.logical_and:
        a, b = (X > 0).astype(np.float32), (Y > 0).astype(np.float32)
    got, trace = compute(lambda x, y: op(x[0:77, :], y[0:77, :]), a, b)
    assert got.shape == (77, 24)
    np.testing.assert_array_equal(got, ref(a[:77], b[:77]))
    assert trace.count(opcode="tensor_tensor") == 1


def test_binary_scalar_either_side_and_dtype():
    def fn(x):
        return nl.subtract(x, 2.0), nl.subtract(2.0, x), nl.multiply(x, 3, dtype=nl.bfloat16)

    (a, b, c), trace = compute(fn, X)
    np.testing.assert_array_equal(a, X - np.float32(2.0))
    np.testing.assert_array_equal(b, np.float32(2.0) - X)
    np.testing.assert_array_equal(c, bf16(X * np.float32(3)))
    assert trace.count(opcode="tensor_scalar") == 3


def test_comparison_uint8_and_bf16_inputs_round():
    xb, yb = X.astype(BF16), Y.astype(BF16)
    (eq, s), _ = compute(
        lambda x, y: (nl.greater_equal(x, y, dtype=nl.uint8), nl.add(x, y)), xb, yb
    )
    assert eq.dtype == np.uint8
    np.testing.assert_array_equal(
        eq, (xb.astype(np.float32) >= yb.astype(np.float32)).astype(np.uint8)
    )
    assert s.dtype == BF16
    np.testing.assert_array_equal(s, bf16(xb.astype(np.float32) + yb.astype(np.float32)))


def test_bitwise_shift_invert_int():
    a = rng.integers(0, 2**20, (16, 8)).astype(np.int32)
    b = rng.integers(0, 2**20, (16, 8)).astype(np.int32)
    u = rng.integers(0, 256, (16, 8)).astype(np.uint8)

    def fn(x, y, z):
        return (
            nl.bitwise_and(x, y),
            nl.bitwise_xor(x, y),
            nl.left_shift(x, 3),
            nl.invert(x),
            nl.invert(z),
            nl.bitwise_or(x, 0xF0),
        )

    (band, bxor, shl, inv, invu, bor), _ = compute(fn, a, b, u)
    np.testing.assert_array_equal(band, a & b)
    np.testing.assert_array_equal(bxor, a ^ b)
    np.testing.assert_array_equal(shl, a << 3)
    np.testing.assert_array_equal(inv, ~a)
    np.testing.assert_array_equal(invu, ~u)
    np.testing.assert_array_equal(bor, a | 0xF0)


def test_power_two_tiles():
    base = np.abs(X[:8, :8]) + 0.5
    got, trace = compute(lambda x, y: nl.power(x, y), base, Y[:8, :8])
    np.testing.assert_allclose(got, np.power(base, Y[:8, :8]), rtol=1e-6)
    assert trace.count("gpsimd", "tensor_tensor") == 1  # power runs on GpSimd


@pytest.mark.parametrize(
    "case, rule",
    [
        ("divide", "NL_API"),
        ("power_scalar", "NL_API"),
        ("shape", "NL_SHAPE"),
        ("numbers", "NL_API"),
        ("string", "NL_API"),
    ],
)
def test_binary_rules(case, rule):
    def fn(x, y):
        if case == "divide":
            return nl.divide(x, y)
        if case == "power_scalar":
            return nl.power(x, 2.0)
        if case == "shape":
            return nl.add(x, y[:, 0:1])
        if case == "numbers":
            return nl.add(1.0, 2.0)
        return nl.add(x, "1")

    _raises(rule, fn, X, Y)


# ---- unary ----------------------------------------------------------------------------
POS = np.abs(X) + 0.25


@pytest.mark.parametrize(
    "op, ref, data",
    [
        (nl.exp, np.exp, X),
        (nl.log, np.log, POS),
        (nl.sqrt, np.sqrt, POS),
        (nl.rsqrt, lambda v: 1 / np.sqrt(v), POS),
        (nl.tanh, np.tanh, X),
        (nl.sigmoid, lambda v: 1 / (1 + np.exp(-v)), X),
        (nl.relu, lambda v: np.maximum(v, 0), X),
        (nl.square, np.square, X),
        (nl.abs, np.abs, X),
        (nl.reciprocal, lambda v: 1 / v, POS),
        (nl.gelu, lambda v: 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2))), X),
        (nl.silu, lambda v: v / (1 + np.exp(-v)), X),
        (nl.negative, np.negative, X),
    ],
)
def test_unary_against_numpy(op, ref, data):
    got, trace = compute(lambda x: op(x[0:77, :]), data)
    np.testing.assert_allclose(got, ref(data[:77].astype(np.float64)), rtol=2e-6, atol=1e-6)
    engines = {i.engine for i in trace if i.opcode in ("activation", "tensor_scalar")}
    assert engines == ({"vector"} if op is nl.negative else {"scalar"})


def test_unary_bf16_rounds_and_dtype_override():
    xb = X.astype(BF16)
    (e16, e32), _ = compute(lambda x: (nl.exp(x), nl.exp(x, dtype=nl.float32)), xb)
    ref = np.exp(xb.astype(np.float32))
    assert e16.dtype == BF16 and e32.dtype == np.float32
    np.testing.assert_array_equal(e16, bf16(ref))
    np.testing.assert_allclose(e32, ref, rtol=1e-6)


def test_logical_not_and_unlowered_unary():
    got, _ = compute(lambda x: nl.logical_not(x), (X > 0).astype(np.float32))
    np.testing.assert_array_equal(got, (X <= 0).astype(np.float32))
    _raises("NL_API", lambda x: nl.cos(x), X)
    _raises("DTYPE", lambda x: nl.invert(x), X)
    with pytest.raises(TypeError, match="op token only"):
        compute(lambda x: nl.average(x, x), X)


# ---- reductions -----------------------------------------------------------------------
X3 = rng.standard_normal((64, 4, 6)).astype(np.float32)


@pytest.mark.parametrize(
    "fn, ref",
    [
        (nl.sum, np.sum),
        (nl.max, np.max),
        (nl.min, np.min),
        (nl.prod, np.prod),
        (nl.mean, np.mean),
    ],
)
@pytest.mark.parametrize(
    "axis, keepdims", [(2, False), ((1, 2), False), ((1, 2), True), (-1, True)]
)
def test_reductions(fn, ref, axis, keepdims):
    got, trace = compute(lambda x: fn(x, axis=axis, keepdims=keepdims), X3)
    expected = ref(X3.astype(np.float64), axis=axis, keepdims=keepdims)
    if expected.ndim == 1:
        expected = expected[:, None]  # on-chip results stay 2-D
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert trace.count("vector", "tensor_reduce") == 1


def test_all_and_bf16_sum_to_fp32_and_token_still_an_op():
    m = (rng.random((32, 10)) > 0.2).astype(np.float32)
    m[3] = 1.0

    def fn(x, y):
        red = nl.ndarray((32, 1), nl.float32)
        nisa.tensor_reduce(red, nl.max, y, axis=1)  # nl.max is still an op token
        return nl.all(x, axis=1), nl.sum(y, axis=1, dtype=nl.float32), red

    (al, s, red), _ = compute(fn, m, X[:32, :10].astype(BF16))
    np.testing.assert_array_equal(al[:, 0], m.all(axis=1).astype(np.float32))
    yb = X[:32, :10].astype(BF16).astype(np.float32)
    np.testing.assert_allclose(s[:, 0], yb.sum(axis=1), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(red[:, 0], yb.max(axis=1))


@pytest.mark.parametrize("axis", [0, 1, (0, 1)])
def test_reduction_axis_rule(axis):
    _raises("REDUCE_AXIS", lambda x: nl.sum(x, axis=axis), X3)


def test_var_and_softmax():
    (v, sm), trace = compute(lambda x: (nl.var(x, axis=1), nl.softmax(x, axis=1)), X)
    np.testing.assert_allclose(v[:, 0], X.astype(np.float64).var(axis=1), rtol=1e-5)
    e = np.exp(X.astype(np.float64) - X.max(axis=1, keepdims=True))
    np.testing.assert_allclose(sm, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert trace.count("scalar", "activation") == 2
    _raises("NL_API", lambda x: nl.softmax(x, axis=2), X3)


# ---- matmul / transpose / where -----------------------------------------------------------
def test_matmul_transpose_x_into_psum():
    a = rng.standard_normal((96, 40)).astype(BF16)
    b = rng.standard_normal((96, 200)).astype(BF16)

    def fn(x, y):
        r = nl.matmul(x, y, transpose_x=True)
        assert r.buffer is nl.psum and r.dtype == nl.float32
        return r

    got, trace = compute(fn, a, b)
    ref = a.astype(np.float64).T @ b.astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)
    assert trace.count("tensor", "nc_matmul") == 1
    err = _raises("NL_API", lambda x, y: nl.matmul(x, y), a, b)
    assert "transpose_x=True" in str(err)


def test_transpose_and_cast():
    def fn(x):
        t = nl.transpose(x)
        assert t.buffer is nl.psum
        return t, nl.transpose(x, dtype=nl.float32)

    xb = X[:64, :24].astype(BF16)
    (t, t32), trace = compute(fn, xb)
    np.testing.assert_array_equal(t, xb.T)
    np.testing.assert_array_equal(t32, xb.T.astype(np.float32))
    assert trace.count("tensor", "nc_transpose") == 2
    _raises("NL_API", lambda x: nl.transpose(x), X3)


def test_where_tiles_and_scalars():
    cond = (X > 0).astype(np.float32)

    def fn(c, x, y):
        return nl.where(c, x, y), nl.where(c, x, -1.0), nl.where(c, 5.0, y, dtype=nl.bfloat16)

    (w1, w2, w3), trace = compute(fn, cond, X, Y.astype(BF16))
    np.testing.assert_array_equal(w1, np.where(cond != 0, X, Y.astype(BF16).astype(np.float32)))
    np.testing.assert_array_equal(w2, np.where(cond != 0, X, np.float32(-1.0)))
    np.testing.assert_array_equal(w3, np.where(cond != 0, BF16.type(5.0), Y.astype(BF16)))
    assert trace.count("vector", "tensor_copy_predicated") == 3
    _raises("NL_SHAPE", lambda c, x, y: nl.where(c, x[:, 0:4], y), cond, X, Y)
