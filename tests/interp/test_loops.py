"""Device loops and virtual registers: fori_loop, while_loop, the deprecated
dynamic_range and `while reg:`, register_alloc / move / load / store."""

from __future__ import annotations

import numpy as np
import pytest

from nki_kernels.interp import NkiValidationError, TensorSpec, nisa, nl, run
from nki_kernels.interp import loops as loops_mod

rng = np.random.default_rng(3)


def _copy_rows_kernel(data, bound, step):
    """out[r] = data[r] for r in range(lower, bound[0], step) via a fori_loop; the rest 0."""
    n, d = data.shape
    out = nl.ndarray((n, d), data.dtype, buffer=nl.shared_hbm)
    zeros = nl.zeros((n, d), data.dtype)
    nisa.dma_copy(out, zeros)
    ub_sb = nl.ndarray((1, 1), nl.int32)
    nisa.dma_copy(ub_sb, bound)
    ub = nisa.register_alloc()
    nisa.register_load(ub, ub_sb)
    row = nl.ndarray((1, d), data.dtype)

    def body(i):
        nisa.dma_copy(row, data.ap([[d, 1], [1, d]], scalar_offset=i, indirect_dim=0))
        nisa.dma_copy(out.ap([[d, 1], [1, d]], scalar_offset=i, indirect_dim=0), row)

    nl.fori_loop(1, ub, body, step=step)
    return out


@pytest.mark.parametrize("bound, step", [(7, 1), (9, 2), (1, 1)])
def test_fori_loop_register_bound_and_scalar_offset(bound, step):
    data = rng.standard_normal((10, 6)).astype(np.float32)
    res = run(_copy_rows_kernel, data, np.array([[bound]], np.int32), step)
    ref = np.zeros_like(data)
    rows = list(range(1, bound, step))
    ref[rows] = data[rows]
    np.testing.assert_array_equal(res.outputs, ref)
    branches = [i for i in res.trace if i.opcode == "loop_branch"]
    assert [b.attrs["taken"] for b in branches] == [True] * len(rows) + [False]
    assert all(b.engine == "sync" for b in branches)
    assert res.trace.count("dma", "dma_copy") == 2 + 2 * len(rows)


def test_while_loop_counts_down_and_body_sees_a_copy():
    def kernel(count, val):
        out = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
        v = nl.load(val)
        acc = nl.zeros((1, 1), nl.float32)
        cnt = nl.load(count)
        one = nl.ndarray((1, 1), nl.int32)
        nisa.memset(one, 1)
        reg = nisa.register_alloc()
        nisa.register_load(reg, cnt)
        seen = []

        def body(r):
            seen.append(r)
            nisa.tensor_tensor(acc, acc, v, nl.add)
            nisa.tensor_tensor(cnt, cnt, one, nl.subtract)
            nisa.register_load(r, cnt)
            return r

        nl.while_loop(reg, body)
        assert all(r is not reg for r in seen)
        nl.store(out, acc)
        return out

    for count in (5, 0):
        res = run(kernel, np.array([[count]], np.int32), np.array([[1.5]], np.float32))
        assert res.outputs[0, 0] == np.float32(1.5 * count)
        assert res.trace.count("sync", "loop_branch") == count + 1


def test_deprecated_dynamic_range_and_while_reg():
    def kernel(bound):
        out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
        n_sb = nl.load(bound)
        n = nisa.register_alloc(n_sb)  # nki-library passes a one-element tensor
        total = nl.zeros((1, 1), nl.int32)
        for _ in nl.dynamic_range(n):
            nisa.tensor_scalar(total, total, nl.add, 10)
        left = nl.load(bound)
        reg = nisa.register_alloc()
        nisa.register_load(reg, left)
        while reg:
            nisa.tensor_scalar(total, total, nl.add, 1)
            nisa.tensor_scalar(left, left, nl.subtract, 1)
            nisa.register_load(reg, left)
        nl.store(out, total)
        return out

    with pytest.warns(DeprecationWarning) as record:
        res = run(kernel, np.array([[4]], np.int32))
    messages = " ".join(str(w.message) for w in record)
    assert "dynamic_range" in messages and "while reg" in messages
    assert res.outputs[0, 0] == 4 * 10 + 4


def test_register_move_store_roundtrip():
    def kernel(x):
        out = nl.ndarray((1, 3), nl.int32, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 3), nl.int32)
        a = nisa.register_alloc(-7)
        b = nisa.register_alloc()
        nisa.register_move(b, a)
        c = nisa.register_alloc(nl.load(x))
        nisa.register_store(t[:, 0:1], a)
        nisa.register_store(t[:, 1:2], b)
        nisa.register_store(t[:, 2:3], c)
        nisa.register_move(a, 2**31 + 5)  # uint32 range is accepted too
        nl.store(out, t)
        return out

    res = run(kernel, np.array([[123456]], np.int32))
    np.testing.assert_array_equal(res.outputs, [[-7, -7, 123456]])
    assert res.trace.count("sync", "register_store") == 3


def test_trace_only_static_bounds_run_and_runtime_bounds_refuse():
    def kernel(x, use_register):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        upper = 3
        if use_register:
            upper = nisa.register_alloc()
            nisa.register_load(upper, nl.load(x[0:1, 0:1]))
        nl.fori_loop(0, upper, lambda i: nisa.tensor_scalar(t, t, nl.add, 1))
        nl.store(out, t)
        return out

    spec = TensorSpec((4, 4), np.int32)
    res = run(kernel, spec, False, trace_only=True)
    assert res.trace.count("vector", "tensor_scalar") == 3
    with pytest.raises(NkiValidationError) as e:
        run(kernel, spec, True, trace_only=True)
    assert e.value.rule == "LOOP" and "trace-only" in str(e.value)


# ---- rules ----------------------------------------------------------------------------
@pytest.mark.parametrize("use", ["int", "range", "add", "compare", "index"])
def test_register_as_python_value_is_a_meta_language_error(use):
    def kernel(x):
        t = nl.load(x)
        r = nisa.register_alloc(2)
        if use == "int":
            int(r)
        elif use == "range":
            range(r)
        elif use == "add":
            _ = r + 1
        elif use == "compare":
            _ = r < 3
        else:
            _ = t[r, 0]
        return None

    with pytest.raises(TypeError) as e:
        run(kernel, np.zeros((4, 4), np.float32))
    assert isinstance(e.value, NkiValidationError) and e.value.rule == "REGISTER"


@pytest.mark.parametrize(
    "case, rule",
    [
        ("write_induction", "REGISTER"),
        ("load_float", "DTYPE"),
        ("load_two", "REGISTER"),
        ("load_psum", "BUF"),
        ("uninit", "REGISTER"),
        ("too_big", "REGISTER"),
        ("move_float", "REGISTER"),
        ("step0", "LOOP"),
        ("step_float", "LOOP"),
        ("lower_float", "LOOP"),
        ("lower_tensor", "LOOP"),
        ("body_returns", "LOOP"),
        ("while_int", "LOOP"),
        ("while_none", "LOOP"),
        ("no_reorder", "LOOP"),
    ],
)
def test_loop_and_register_rules(case, rule):
    def kernel(x):
        f = nl.load(x)
        i32 = nl.zeros((1, 2), nl.int32)
        reg = nisa.register_alloc(1)
        if case == "write_induction":
            nl.fori_loop(0, 2, lambda i: nisa.register_move(i, 5))
        elif case == "load_float":
            nisa.register_load(reg, f[0:1, 0:1])
        elif case == "load_two":
            nisa.register_load(reg, i32)
        elif case == "load_psum":
            nisa.register_load(reg, nl.ndarray((1, 1), nl.int32, buffer=nl.psum))
        elif case == "uninit":
            nisa.register_store(i32[:, 0:1], nisa.register_alloc())
        elif case == "too_big":
            nisa.register_alloc(2**40)
        elif case == "move_float":
            nisa.register_move(reg, 1.5)
        elif case == "step0":
            nl.fori_loop(0, 4, lambda i: None, step=0)
        elif case == "step_float":
            nl.fori_loop(0, 4, lambda i: None, step=1.0)
        elif case == "lower_float":
            nl.fori_loop(0.0, 4, lambda i: None)
        elif case == "lower_tensor":
            nl.fori_loop(i32[:, 0:1], 4, lambda i: None)
        elif case == "body_returns":
            nl.fori_loop(0, 4, lambda i: i)
        elif case == "while_int":
            nl.while_loop(1, lambda r: r)
        elif case == "while_none":
            nl.while_loop(reg, lambda r: None)
        else:
            with nl.no_reorder():
                nl.fori_loop(0, 4, lambda i: None)
        return None

    with pytest.raises(NkiValidationError) as e:
        run(kernel, np.zeros((4, 4), np.float32))
    assert e.value.rule == rule, str(e.value)


def test_runaway_while_loop_is_stopped(monkeypatch):
    monkeypatch.setattr(loops_mod, "MAX_ITERATIONS", 20)

    def kernel(x):
        nl.while_loop(nisa.register_alloc(1), lambda r: r)

    with pytest.raises(NkiValidationError) as e:
        run(kernel, np.zeros((1, 1), np.float32))
    assert e.value.rule == "LOOP" and "20 iterations" in str(e.value)


def test_legacy_loop_aliases_are_plain_ranges():
    assert list(nl.range(2, 8, 3)) == [2, 5]
    assert list(nl.sequential_range(3)) == list(nl.static_range(3)) == [0, 1, 2]


def test_no_reorder_blocks_are_recorded_on_their_instructions():
    def kernel(x):
        t = nl.ndarray((128, 64), nl.float32)
        nisa.memset(dst=t, value=0.0)  # outside: 0
        with nl.no_reorder():
            nisa.memset(dst=t, value=1.0)
            with nl.no_reorder():  # nested: part of the outer block
                nisa.memset(dst=t, value=2.0)
            nisa.memset(dst=t, value=3.0)
        with nl.no_reorder():  # a second block: its own id
            nisa.memset(dst=t, value=4.0)
        nisa.memset(dst=t, value=5.0)

    trace = run(kernel, TensorSpec((4, 4), "float32"), trace_only=True).trace
    got = [i.no_reorder for i in trace.instrs if i.opcode == "memset"]
    assert got[0] == got[5] == 0
    assert got[1] > 0 and got[1] == got[2] == got[3]
    assert got[4] > 0 and got[4] != got[1]
