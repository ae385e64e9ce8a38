"""ScalarE `activation` / `activation_reduce` against fp64 NumPy references: every
activation function, scale and bias, rounding to the destination, ragged partitions, the
accumulator registers and reduce_cmd; and their rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tile_harness import bf16, expect_rule, outputs, run_tiles

from nki_kernels.interp import nisa, nl, ops

rng = np.random.default_rng(19)
F32 = np.float32


def _x(shape, scale=1.0, dtype=F32):
    return (rng.standard_normal(shape) * scale).astype(dtype)


# ---- activation functions -------------------------------------------------------------
_erf = np.vectorize(math.erf)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _gelu_tanh(x):
    c = math.sqrt(2 / math.pi)
    return 0.5 * x * (1 + np.tanh(c * (x + 0.044715 * x**3)))


def _softplus(x):
    return np.log1p(np.exp(x))


def _derivative(f):
    """Central difference in fp64: an independent reference for the *_dx functions."""
    h = 1e-5
    return lambda x: (f(x + h) - f(x - h)) / (2 * h)


def _gelu(x):
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def _silu(x):
    return x * _sigmoid(x)


def _gelu_sigmoid(x):
    return x * _sigmoid(1.702 * x)


# (token, fp64 reference, input domain): "any" = N(0, 1.5) data, "positive" = kept above
# 0.1, "bounded" = |scale * x + bias| < pi/2 (the valid input ranges of the ScalarE table)
ACTS = [
    (nl.copy, lambda x: x, "any"),
    (nl.exp, np.exp, "any"),
    (nl.relu, lambda x: np.maximum(x, 0), "any"),
    (nl.prelu, lambda x: np.maximum(x, 0), "any"),  # relu_param defaults to 0.0
    (nl.square, np.square, "any"),
    (nl.silu, _silu, "any"),
    (nl.silu_dx, _derivative(_silu), "any"),
    (nl.sigmoid, _sigmoid, "any"),
    (nl.tanh, np.tanh, "any"),
    (nl.gelu, _gelu, "any"),
    (nl.gelu_dx, _derivative(_gelu), "any"),
    (nl.gelu_apprx_tanh, _gelu_tanh, "any"),
    (nl.gelu_apprx_sigmoid, _gelu_sigmoid, "any"),
    (nl.gelu_apprx_sigmoid_dx, _derivative(_gelu_sigmoid), "any"),
    (nl.softplus, _softplus, "any"),
    (nl.mish, lambda x: x * np.tanh(_softplus(x)), "any"),
    (nl.erf, _erf, "any"),
    (nl.erf_dx, _derivative(_erf), "any"),
    (nl.sign, np.sign, "any"),
    (nl.abs, np.abs, "any"),
    (nl.sin, np.sin, "bounded"),
    (nl.arctan, np.arctan, "bounded"),
    (nl.rsqrt, lambda x: 1 / np.sqrt(x), "positive"),
    (nl.sqrt, np.sqrt, "positive"),
    (nl.log, np.log, "positive"),
    (nl.reciprocal, lambda x: 1 / x, "positive"),
]


def test_every_activation_function_has_a_reference():
    tested = {op.name for op, _, _ in ACTS}
    assert tested == {name for name, op in ops.TOKENS.items() if op.activation}


@pytest.mark.parametrize(("op", "ref", "domain"), ACTS, ids=[o.name for o, _, _ in ACTS])
def test_activation_scale_bias_op_rounds_to_dst(op, ref, domain):
    x = _x((96, 40), 1.5)
    scale = (rng.random((96, 1)) + 0.5).astype(F32)
    bias = _x((96, 1), 0.1)
    if domain == "positive":
        x, bias = np.abs(x) + 0.1, np.abs(bias)
    elif domain == "bounded":  # |x| < 0.7, scale < 1.5, |bias| < 0.5
        x, bias = np.tanh(x) * F32(0.7), np.clip(bias, -0.5, 0.5)

    def body(t, s, b, out, out16):
        nisa.activation(dst=out, op=op, data=t, scale=s, bias=b)
        nisa.activation(dst=out16[0:50, :], op=op, data=t[0:50, :], scale=0.5)

    o32, o16 = outputs(body, [x, scale, bias], [((96, 40), nl.float32), ((96, 40), nl.bfloat16)])
    arg = x.astype(np.float64) * scale + bias
    np.testing.assert_allclose(o32, ref(arg), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(
        o16[:50].astype(F32),
        bf16(ref(x[:50].astype(np.float64) * 0.5)).astype(F32),
        rtol=2**-7,
        atol=1e-6,
    )
    assert np.isnan(o16[50:].astype(F32)).all()


def test_activation_reduce_registers_persist_across_calls():
    x = _x((128, 30))

    def body(t, r1, r2, r3, y):
        nisa.activation(
            dst=y,
            op=nl.square,
            data=t[:, 0:10],
            reduce_op=nl.add,
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )
        nisa.activation(
            dst=y,
            op=nl.square,
            data=t[:, 10:20],
            reduce_op=nl.add,
            reduce_cmd=nisa.reduce_cmd.reduce,
            reduce_res=r1,
        )
        nisa.activation(
            dst=y, op=nl.copy, data=t[:, 20:30], reduce_cmd=nisa.reduce_cmd.idle, reduce_res=r2
        )  # idle: registers unchanged, read out again
        nisa.activation(
            dst=y, op=nl.copy, data=t[:, 20:30], reduce_cmd=nisa.reduce_cmd.reset, reduce_res=r3
        )

    r1, r2, r3, y = outputs(body, [x], [((128, 1), nl.float32)] * 3 + [((128, 10), nl.float32)])
    ref = (x[:, 0:20].astype(np.float64) ** 2).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(r1, ref, rtol=1e-5)
    np.testing.assert_array_equal(r2, r1)
    assert (r3 == 0).all()
    np.testing.assert_array_equal(y, x[:, 20:30])


def test_activation_reduce_uses_the_lanes_of_the_data_partitions():
    x = _x((128, 8))

    def body(t, out, y):
        nisa.activation(
            dst=y, op=nl.copy, data=t, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce
        )
        # partitions 64..127 only: lanes 64..127 reset and accumulate; lanes 0..63 keep
        nisa.activation(
            dst=y[64:128, :],
            op=nl.copy,
            data=t[64:128, :],
            reduce_op=nl.add,
            reduce_cmd=nisa.reduce_cmd.reduce,
            reduce_res=out[64:128, :],
        )
        nisa.activation_reduce(
            dst=y[0:64, :], op=nl.copy, data=t[0:64, :], reduce_op=nl.add, reduce_res=out[0:64, :]
        )

    out, _ = outputs(body, [x], [((128, 1), nl.float32), ((128, 8), nl.float32)])
    s = x.astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(out[64:, 0], 2 * s[64:], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[:64, 0], s[:64], rtol=1e-5, atol=1e-6)


def test_reduction_sums_the_inputs_even_when_dst_overlaps_data():
    x = _x((16, 9))

    def body(t, out):
        nisa.activation(
            dst=t[:, 1:9],  # overwrites data shifted by one column
            op=nl.copy,
            data=t[:, 0:8],
            reduce_op=nl.add,
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
            reduce_res=out,
        )

    got = outputs(body, [x], [((16, 1), nl.float32)])
    np.testing.assert_allclose(got[:, 0], x[:, 0:8].astype(np.float64).sum(axis=1), rtol=1e-6)


def test_activation_reduce_res_may_alias_dst():
    x = _x((16, 1))

    def body(t, out):
        nisa.activation(
            dst=out,
            op=nl.exp,
            data=t,
            reduce_op=nl.add,
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
            reduce_res=out,
        )

    np.testing.assert_allclose(outputs(body, [x], [((16, 1), nl.float32)]), np.exp(x), rtol=1e-6)


# ---- rules -------------------------------------------------------------------------------------
_T = [((8, 4), nl.float32)]

RULE_CASES = [
    ("OP", lambda o: nisa.activation(dst=o, op=nl.subtract, data=o), _T, "trn2"),
    ("OP", lambda o: nisa.activation(dst=o, op="exp", data=o), _T, "trn2"),
    ("OP", lambda o: nisa.activation(dst=o, op=np.exp, data=o), _T, "trn2"),
    (
        "OP",
        lambda o: nisa.activation(
            dst=o, op=nl.exp, data=o, reduce_op=nl.maximum, reduce_cmd=nisa.reduce_cmd.reset_reduce
        ),
        _T,
        "trn2",
    ),
    ("VERSION", lambda o: nisa.activation(dst=o, op=nl.exp, data=o, bias=1.0), _T, "trn1"),
    (
        "DTYPE",
        lambda o: nisa.activation(dst=o, op=nl.exp, data=o, scale=nl.ndarray((8, 1), nl.bfloat16)),
        _T,
        "trn2",
    ),
    (
        "FREE",
        lambda o: nisa.activation(dst=o, op=nl.exp, data=o, bias=nl.ndarray((8, 2), nl.float32)),
        _T,
        "trn2",
    ),
    ("FREE", lambda o: nisa.activation(dst=o, op=nl.exp, data=o, reduce_res=o), _T, "trn2"),
    (
        "ARG",
        lambda o: nisa.activation(dst=o, op=nl.exp, data=o, reduce_cmd=nisa.reduce_cmd.load_reduce),
        _T,
        "trn2",
    ),
    ("ARG", lambda o: nisa.activation(dst=o, op=nl.exp, data=o, reduce_cmd=3), _T, "trn2"),
    ("PART", lambda o: nisa.activation(dst=o[0:7], op=nl.exp, data=o), _T, "trn2"),
]


@pytest.mark.parametrize(("rule", "call", "outs", "target"), RULE_CASES)
def test_activation_rules(rule, call, outs, target):
    expect_rule(rule, run_tiles, lambda o: call(o), [], outs, target=target)


def test_prelu_is_an_op_token_only():
    with pytest.raises(TypeError, match=r"nl\.prelu is an op token only"):
        nl.prelu(1.0)
