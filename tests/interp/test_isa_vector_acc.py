"""VectorE accumulator-register instructions against NumPy references: range_select,
select_reduce, tensor_scalar_reduce (registers shared, persistent, per lane)."""

from __future__ import annotations

import numpy as np
import pytest
from tile_harness import BF16, bf16, expect_rule, last_instr, outputs, run_tiles

from nki_kernels.interp import InterpreterWarning, nisa, nl

FP32_MIN = np.float32(np.finfo(np.float32).min)
RC = nisa.reduce_cmd
rng = np.random.default_rng(5)


def _raises(rule, body, inputs, outs, target="trn2"):
    return expect_rule(rule, run_tiles, body, inputs, outs, target=target)


# ---- range_select ---------------------------------------------------------------------
def _range_ref(x, b0, b1, start, c0, c1):
    idx = (start + np.arange(x.shape[1])).astype(np.float32)[None, :]
    return np.where(c0(idx, b0) & c1(idx, b1), x, FP32_MIN).astype(np.float32)


def test_range_select_from_psum_with_reduce_res():
    p, n, start = 64, 48, 10
    x = rng.standard_normal((p, n)).astype(np.float32)
    b0 = rng.integers(0, 40, (p, 1)).astype(np.float32)
    b1 = b0 + rng.integers(0, 30, (p, 1)).astype(np.float32)
    b1[5] = b0[5]  # an empty range: the whole row is FP32_MIN

    def body(t, lo, hi, out, red):
        ps = nl.ndarray((p, n), nl.float32, buffer=nl.psum)
        nisa.tensor_copy(ps, t)
        nisa.range_select(
            out,
            on_true_tile=ps,
            comp_op0=nl.greater_equal,
            comp_op1=nl.less,
            bound0=lo,
            bound1=hi,
            reduce_res=red,
            range_start=start,
            on_false_value=nl.fp32_min,
        )

    res = run_tiles(body, [x, b0, b1], [((p, n), nl.float32), ((p, 1), nl.float32)])
    out, red = res.outputs
    ref = _range_ref(x, b0, b1, start, np.greater_equal, np.less)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(red[:, 0], ref.max(axis=1))
    assert red[5, 0] == FP32_MIN
    rec = last_instr(res, "range_select")
    assert (rec.engine, rec.p, rec.n, rec.attrs["psum_in"]) == ("vector", p, n, True)


def test_range_select_chained_reduce_ragged_bf16_dst():
    x = rng.standard_normal((128, 64)).astype(np.float32)
    lo = np.full((128, 1), 8.0, np.float32)
    hi = rng.integers(0, 64, (128, 1)).astype(np.float32)

    def body(t, b0, b1, out, red):
        nisa.range_select(
            out[0:77, 0:32], t[0:77, 0:32], nl.greater_equal, nl.less_equal, b0[0:77], b1[0:77]
        )
        nisa.range_select(
            out[0:77, 32:64],
            t[0:77, 32:64],
            nl.greater_equal,
            nl.less_equal,
            b0[0:77],
            b1[0:77],
            reduce_cmd=RC.reduce,
            reduce_res=red[0:77],
            range_start=32,
        )

    out, red = outputs(body, [x, lo, hi], [((128, 64), nl.bfloat16), ((128, 1), nl.float32)])
    ref = _range_ref(x[:77], lo[:77], hi[:77], 0, np.greater_equal, np.less_equal)
    np.testing.assert_array_equal(out[:77], bf16(ref))
    assert np.isneginf(out[:77].astype(np.float32)).any()  # FP32_MIN overflows bf16
    np.testing.assert_array_equal(red[:77, 0], ref.max(axis=1))
    assert np.isnan(red[77:]).all()


@pytest.mark.parametrize(
    "case, rule, target",
    [
        ("trn1", "VERSION", "trn1"),
        ("not_equal", "OP", "trn2"),
        ("reduce_add", "OP", "trn2"),
        ("fill", "RANGE_FILL", "trn2"),
        ("bound_bf16", "DTYPE", "trn2"),
        ("on_true_int", "DTYPE", "trn2"),
        ("load_reduce", "ACC_CMD", "trn2"),
        ("bound_wide", "FREE", "trn2"),
        ("red_wide", "FREE", "trn2"),
    ],
)
def test_range_select_rules(case, rule, target):
    def body(t, out, bb, ii):
        b = t[:, 0:1]
        kw = {}
        args = [out, t, nl.greater_equal, nl.less, b, b]
        if case == "not_equal":
            args[2] = nl.not_equal
        elif case == "reduce_add":
            kw["reduce_op"] = nl.add
        elif case == "fill":
            kw["on_false_value"] = 0.0
        elif case == "bound_bf16":
            args[4] = bb
        elif case == "on_true_int":
            args[1] = ii
        elif case == "load_reduce":
            kw["reduce_cmd"] = RC.load_reduce
        elif case == "bound_wide":
            args[5] = t[:, 0:2]
        elif case == "red_wide":
            kw["reduce_res"] = out[:, 0:2]
        nisa.range_select(*args, **kw)

    outs = [((8, 16), nl.float32), ((8, 1), nl.bfloat16), ((8, 16), nl.int32)]
    _raises(rule, body, [np.zeros((8, 16), np.float32)], outs, target)


# ---- select_reduce ---------------------------------------------------------------------
def test_select_reduce_scalar_on_false_with_reduction():
    x = rng.standard_normal((96, 40)).astype(np.float32)
    pred = rng.integers(0, 2, (96, 40)).astype(np.uint8)

    def body(t, m, out, red):
        nisa.select_reduce(out, m, t, -3.0, reduce_res=red, reduce_cmd=RC.reset_reduce)

    out, red = outputs(body, [x, pred], [((96, 40), nl.float32), ((96, 1), nl.float32)])
    ref = np.where(pred != 0, x, np.float32(-3.0))
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(red[:, 0], ref.max(axis=1))


def test_select_reduce_column_on_false_reverse_pred_bf16_ragged():
    x = rng.standard_normal((128, 24)).astype(BF16)
    pred = rng.integers(-2, 2, (128, 24)).astype(np.int16)
    alt = rng.standard_normal((128, 1)).astype(np.float32)

    def body(t, m, a, out):
        nisa.select_reduce(out[0:77, :], m[0:77, :], t[0:77, :], a[0:77, :], reverse_pred=True)

    out = outputs(body, [x, pred, alt], [((128, 24), nl.bfloat16)])
    ref = np.where(pred[:77] == 0, x[:77].astype(np.float32), alt[:77])
    np.testing.assert_array_equal(out[:77], bf16(ref))
    assert np.isnan(out[77:].astype(np.float32)).all()


def test_registers_are_shared_across_vector_instructions_not_scalar():
    x = rng.standard_normal((32, 16)).astype(np.float32)
    pred = np.ones((32, 16), np.uint8)

    def body(t, m, scratch, act_out, act_red, red):
        # VectorE registers := row max of 2x; ScalarE's own registers are separate.
        nisa.tensor_scalar_reduce(scratch, t, nl.multiply, 2.0, nl.maximum)
        nisa.activation(
            act_out, nl.copy, t, reduce_op=nl.add, reduce_res=act_red, reduce_cmd=RC.reset_reduce
        )
        nisa.select_reduce(scratch, m, t, 0.0, reduce_res=red)  # idle: registers as they were

    outs = [
        ((32, 16), nl.float32),
        ((32, 16), nl.float32),
        ((32, 1), nl.float32),
        ((32, 1), nl.float32),
    ]
    with pytest.warns(InterpreterWarning, match="reduce_cmd=idle"):
        res = outputs(body, [x, pred], outs)
    np.testing.assert_allclose(res[2][:, 0], x.sum(axis=1), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(res[3][:, 0], (2 * x).max(axis=1))


@pytest.mark.parametrize(
    "case, rule",
    [
        ("pred_float", "DTYPE"),
        ("on_true_i32", "DTYPE"),
        ("reduce_add", "OP"),
        ("red_int", "DTYPE"),
        ("psum", "BUF"),
    ],
)
def test_select_reduce_rules(case, rule):
    def body(t, out, m, i32):
        if case == "pred_float":
            nisa.select_reduce(out, t, t, 0.0)
        elif case == "on_true_i32":
            nisa.select_reduce(i32, m, i32, 0.0)
        elif case == "reduce_add":
            nisa.select_reduce(out, m, t, 0.0, reduce_op=nl.add)
        elif case == "red_int":
            nisa.select_reduce(out, m, t, 0.0, reduce_res=i32[:, 0:1], reduce_cmd=RC.reset_reduce)
        else:
            pt = nl.ndarray((8, 16), nl.float32, buffer=nl.psum)
            pm = nl.ndarray((8, 16), nl.uint8, buffer=nl.psum)
            nisa.select_reduce(out, pm, pt, 0.0)

    outs = [((8, 16), nl.float32), ((8, 16), nl.uint8), ((8, 16), nl.int32)]
    _raises(rule, body, [np.zeros((8, 16), np.float32)], outs)


# ---- tensor_scalar_reduce ------------------------------------------------------------
def test_tensor_scalar_reduce_scale_max_bf16_ragged():
    x = rng.standard_normal((128, 3, 10)).astype(np.float32)

    def body(t, out, red):
        nisa.tensor_scalar_reduce(
            out[0:77],
            data=t[0:77],
            op0=nl.multiply,
            operand0=0.125,
            reduce_op=nl.maximum,
            reduce_res=red[0:77],
        )

    res = run_tiles(body, [x], [((128, 3, 10), nl.bfloat16), ((128, 1), nl.float32)])
    out, red = res.outputs
    y = x[:77] * np.float32(0.125)
    np.testing.assert_array_equal(out[:77], bf16(y))
    np.testing.assert_array_equal(red[:77, 0], y.reshape(77, -1).max(axis=1))
    rec = last_instr(res, "tensor_scalar_reduce")
    assert (rec.engine, rec.p, rec.n, rec.attrs["reduce_op"]) == ("vector", 77, 30, "maximum")


def test_tensor_scalar_reduce_chained_add_and_load_reduce_negate():
    a = rng.standard_normal((16, 20)).astype(np.float32)
    b = rng.standard_normal((16, 20)).astype(np.float32)
    init = rng.standard_normal((16, 1)).astype(np.float32)

    def body(x, y, i0, out, red, red2):
        nisa.tensor_scalar_reduce(out, x, nl.add, 1.0, nl.add)
        nisa.tensor_scalar_reduce(out, y, nl.add, 1.0, nl.add, reduce_res=red, reduce_cmd=RC.reduce)
        nisa.tensor_scalar_reduce(
            out,
            y,
            nl.subtract,
            i0,
            nl.minimum,
            reduce_res=red2,
            reduce_cmd=RC.load_reduce,
            reduce_init=i0,
            reduce_res_negate=True,
        )

    outs = [((16, 20), nl.float32), ((16, 1), nl.float32), ((16, 1), nl.float32)]
    out, red, red2 = outputs(body, [a, b, init], outs)
    np.testing.assert_allclose(red[:, 0], (a + 1).sum(axis=1) + (b + 1).sum(axis=1), rtol=1e-5)
    ref2 = np.minimum(init[:, 0], (b - init).min(axis=1))
    np.testing.assert_array_equal(red2[:, 0], -ref2)
    np.testing.assert_array_equal(out, b - init)


def test_tensor_scalar_reduce_unary_abs_prod():
    x = (rng.standard_normal((8, 6)) + 0.1).astype(np.float32)

    def body(t, out, red):
        nisa.tensor_scalar_reduce(out, t, nl.abs, None, nl.multiply, reduce_res=red)

    out, red = outputs(body, [x], [((8, 6), nl.float32), ((8, 1), nl.float32)])
    np.testing.assert_array_equal(out, np.abs(x))
    np.testing.assert_allclose(red[:, 0], np.abs(x).prod(axis=1), rtol=1e-6)


@pytest.mark.parametrize(
    "case, rule",
    [
        ("reverse0", "ARG"),
        ("reduce_subtract", "OP"),
        ("load_no_init", "ACC_CMD"),
        ("init_no_load", "ACC_CMD"),
        ("idle", "ACC_CMD"),
        ("op_exp", "OP"),
        ("op_bitvec", "OP"),
        ("operand_bf16", "DTYPE"),
        ("unary_operand", "ARG"),
    ],
)
def test_tensor_scalar_reduce_rules(case, rule):
    def body(t, out, bb):
        args = [out, t, nl.multiply, 2.0, nl.add]
        kw = {}
        if case == "reverse0":
            kw["reverse0"] = True
        elif case == "reduce_subtract":
            args[4] = nl.subtract
        elif case == "load_no_init":
            kw["reduce_cmd"] = RC.load_reduce
        elif case == "init_no_load":
            kw["reduce_init"] = 1.0
        elif case == "idle":
            kw["reduce_cmd"] = RC.idle
        elif case == "op_exp":
            args[2] = nl.exp
        elif case == "op_bitvec":
            args[2] = nl.bitwise_and
        elif case == "operand_bf16":
            args[3] = bb
        else:
            args[2] = nl.abs
        nisa.tensor_scalar_reduce(*args, **kw)

    _raises(
        rule, body, [np.zeros((8, 16), np.float32)], [((8, 16), nl.float32), ((8, 1), nl.bfloat16)]
    )
