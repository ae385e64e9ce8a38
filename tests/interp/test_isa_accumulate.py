"""tensor_scalar_cumulative, exponential and activate2 against NumPy references (ragged
partitions, bf16 rounding, the shared accumulator registers) and their documented rules."""

from __future__ import annotations

import numpy as np
import pytest
from tile_harness import BF16, bf16, expect_rule, outputs, run_tiles

from nki_kernels.interp import nisa, nl

RC = nisa.reduce_cmd
rng = np.random.default_rng(13)


def _scan(v, fn, reg):
    out = np.empty_like(v)
    for i in range(v.shape[1]):
        reg = fn(v[:, i], reg).astype(np.float32)
        out[:, i] = reg
    return out


# ---- tensor_scalar_cumulative ------------------------------------------------------------
@pytest.mark.parametrize(
    "op1,fn,start",
    [
        (nl.add, np.add, 0.0),
        (nl.multiply, np.multiply, 1.0),
        (nl.maximum, np.maximum, -np.inf),
        (nl.minimum, np.minimum, np.inf),
        (nl.subtract, np.subtract, 0.0),  # reg = v_i - reg, as the pseudocode writes it
    ],
)
def test_tensor_scalar_cumulative_matches_the_pseudocode(op1, fn, start):
    p, n = 45, 13
    x = rng.uniform(0.5, 1.5, size=(p, n)).astype(np.float32)
    imm0 = rng.uniform(-0.2, 0.2, size=(p, 1)).astype(np.float32)

    def body(t, i0, out):
        nisa.tensor_scalar_cumulative(dst=out, src=t, op0=nl.add, op1=op1, imm0=i0)

    got = outputs(body, [x, imm0], [((p, n), nl.float32)])
    v = (x + imm0).astype(np.float32)
    want = _scan(v, fn, np.full(p, start, np.float32))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_tensor_scalar_cumulative_chains_through_the_register_and_rounds_to_bf16():
    p, n = 16, 8
    x = rng.standard_normal((p, n)).astype(np.float32)

    def body(t, a, b, c):
        nisa.tensor_scalar_cumulative(
            dst=a, src=t, op0=nl.multiply, op1=nl.add, imm0=2.0, imm1=3.0, reduce_cmd=RC.load_reduce
        )
        nisa.tensor_scalar_cumulative(
            dst=b, src=t, op0=nl.multiply, op1=nl.add, imm0=2.0, reduce_cmd=RC.reduce
        )
        nisa.tensor_scalar_cumulative(dst=c, src=t, op0=nl.multiply, op1=nl.add, imm0=2.0)

    a, b, c = outputs(body, [x], [((p, n), nl.float32), ((p, n), BF16), ((p, n), nl.float32)])
    first = _scan(2 * x, np.add, np.full(p, 3.0, np.float32))
    np.testing.assert_allclose(a, first, rtol=1e-6)
    second = _scan(2 * x, np.add, first[:, -1])
    np.testing.assert_array_equal(b, bf16(second))
    np.testing.assert_allclose(c, _scan(2 * x, np.add, np.zeros(p, np.float32)), rtol=1e-6)


def test_tensor_scalar_cumulative_rules():
    x = np.ones((4, 4), np.float32)

    def body_with(**kw):
        def body(t, out):
            args = {"dst": out, "src": t, "op0": nl.add, "op1": nl.add, "imm0": 0.0, **kw}
            nisa.tensor_scalar_cumulative(**args)

        return body

    expect_rule("OP", run_tiles, body_with(op1=nl.power), [x], [((4, 4), nl.float32)])
    expect_rule(
        "ACC_CMD", run_tiles, body_with(reduce_cmd=RC.load_reduce), [x], [((4, 4), nl.float32)]
    )
    expect_rule("DTYPE", run_tiles, body_with(), [x], [((4, 4), nl.int32)])


# ---- exponential --------------------------------------------------------------------------
def test_exponential_subtracts_the_max_and_sums_into_the_registers():
    p, n = 33, 10
    x = rng.standard_normal((p, n)).astype(np.float32)
    mx = x.max(axis=1, keepdims=True)

    def body(t, m, out, res):
        nisa.exponential(dst=out, src=t, max_value=m, reduce_res=res, reduce_cmd=RC.reset_reduce)

    got, res = outputs(body, [x, mx], [((p, n), BF16), ((p, 1), nl.float32)], target="trn3")
    y = np.exp(x - mx).astype(np.float32)
    np.testing.assert_array_equal(got, bf16(y))
    np.testing.assert_allclose(res[:, 0], y.sum(axis=1), rtol=1e-5)


def test_exponential_load_reduce_starts_from_reduce_init():
    x = np.zeros((8, 4), np.float32)

    def body(t, out, res):
        nisa.exponential(dst=out, src=t, reduce_res=res, reduce_cmd=RC.load_reduce, reduce_init=1.5)

    _, res = outputs(body, [x], [((8, 4), nl.float32), ((8, 1), nl.float32)], target="trn3")
    np.testing.assert_array_equal(res[:, 0], np.full(8, 5.5, np.float32))  # 1.5 + 4 x exp(0)


def test_exponential_rules():
    x = np.zeros((4, 4), np.float32)

    def body(t, out):
        nisa.exponential(dst=out, src=t)

    expect_rule("VERSION", run_tiles, body, [x], [((4, 4), nl.float32)])

    def bad_init(t, out):
        nisa.exponential(dst=out, src=t, reduce_init=1.0)

    e = expect_rule("ACC_CMD", run_tiles, bad_init, [x], [((4, 4), nl.float32)], target="trn3")
    assert "got 1.0 with reduce_cmd.idle" in str(e)
    e = expect_rule("DTYPE", run_tiles, body, [x], [((4, 4), nl.uint32)], target="trn3")
    assert "dst dtype must be one of" in str(e) and "got uint32" in str(e)


# ---- activate2 ----------------------------------------------------------------------------
@pytest.mark.parametrize("rev0,rev1", [(False, False), (True, True)])
def test_activate2_scale_bias_then_activation_then_reduce(rev0, rev1):
    p, n = 21, 9
    x = rng.standard_normal((p, n)).astype(np.float32)
    scale = rng.uniform(0.5, 2.0, size=(p, 1)).astype(np.float32)

    def body(t, s, out, res):
        nisa.activate2(
            dst=out,
            op=nl.gelu_apprx_tanh,
            data=t,
            imm0=s,
            imm1=0.25,
            op0=nl.multiply,
            op1=nl.subtract,
            reverse0=rev0,
            reverse1=rev1,
            reduce_op=nl.maximum,
            reduce_res=res,
            reduce_cmd=RC.reset_reduce,
        )

    got, res = outputs(body, [x, scale], [((p, n), BF16), ((p, 1), nl.float32)], target="trn3")
    t = (x * scale).astype(np.float32)
    t = (np.float32(0.25) - t) if rev1 else (t - np.float32(0.25))
    y = (0.5 * t * (1 + np.tanh(np.sqrt(2 / np.pi) * (t + 0.044715 * t**3)))).astype(np.float32)
    # where x * scale cancels 0.25, t is a few fp32 ulps of 0.25 (~1.5e-8) in either
    # computation, so the relative error there is 1: an absolute floor of that size
    np.testing.assert_allclose(
        got.astype(np.float32), bf16(y).astype(np.float32), rtol=1e-2, atol=3e-8
    )
    np.testing.assert_allclose(res[:, 0], y.max(axis=1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rev0", [False, True])
def test_activate2_reverse0_swaps_the_operands_of_a_non_commutative_op0(rev0):
    p, n = 19, 7
    x = rng.standard_normal((p, n)).astype(np.float32)
    col = rng.standard_normal((p, 1)).astype(np.float32)

    def body(t, c, out):
        nisa.activate2(
            dst=out,
            op=nl.exp,
            data=t,
            imm0=c,
            imm1=None,
            op0=nl.subtract,
            op1=nl.bypass,
            reverse0=rev0,
        )

    got = outputs(body, [x, col], [((p, n), nl.float32)], target="trn3")
    t = (col - x) if rev0 else (x - col)
    np.testing.assert_allclose(got, np.exp(t.astype(np.float32)), rtol=1e-6)


def test_activate2_prelu_uses_relu_param():
    x = np.array([[-2.0, 3.0, -0.5, 1.0]], np.float32)

    def body(t, out):
        nisa.activate2(
            dst=out,
            op=nl.prelu,
            data=t,
            imm0=0.0,
            imm1=0.0,
            op0=nl.bypass,
            op1=nl.bypass,
            relu_param=0.1,
        )

    got = outputs(body, [x], [((1, 4), nl.float32)], target="trn3")
    np.testing.assert_allclose(got, np.where(x > 0, x, 0.1 * x), rtol=1e-6)


def test_activate2_rules():
    x = np.zeros((4, 4), np.float32)

    def body_with(**kw):
        def body(t, out):
            args = {
                "dst": out,
                "op": nl.exp,
                "data": t,
                "imm0": 1.0,
                "imm1": 0.0,
                "op0": nl.multiply,
                "op1": nl.add,
                **kw,
            }
            nisa.activate2(**args)

        return body

    out = [((4, 4), nl.float32)]
    expect_rule("VERSION", run_tiles, body_with(), [x], out)
    expect_rule("OP", run_tiles, body_with(op0=nl.add, op1=nl.add), [x], out, target="trn3")
    expect_rule("ARG", run_tiles, body_with(op1=nl.bypass, reverse1=True), [x], out, target="trn3")
    expect_rule("ACC_CMD", run_tiles, body_with(reduce_cmd=RC.reduce), [x], out, target="trn3")
