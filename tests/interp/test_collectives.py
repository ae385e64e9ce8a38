"""nki.collectives between the ranks of a run_ranks launch: NumPy references for each
collective (ragged partitions, bf16 rounding), sub-groups, and the documented
restrictions as rule COLLECTIVE / SYNC errors."""

from __future__ import annotations

import numpy as np
import pytest

from nki_kernels.interp import dtypes as dt
from nki_kernels.interp import run_ranks
from nki_kernels.interp.errors import NkiValidationError
from nki_kernels.interp.package import nki

nl, nisa, ncc = nki.language, nki.isa, nki.collectives
RG = ncc.ReplicaGroup


def _staged(x, shape=None, buffer=None):
    """An nl.shared_hbm (or SBUF) copy of kernel input `x`: collectives cannot touch IO tensors."""
    t = nl.ndarray(shape or x.shape, dtype=x.dtype, buffer=buffer or nl.shared_hbm)
    if shape is None:
        nisa.dma_copy(dst=t, src=x)
    return t


def _out(t):
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def reduce_kernel(x, g, op):
    src = _staged(x)
    dst = _staged(x, x.shape)
    ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=g, op=op)
    return _out(dst)


@pytest.mark.parametrize("op,ref", [(nl.add, np.sum), (nl.maximum, np.max), (nl.minimum, np.min)])
@pytest.mark.parametrize("lnc", [1, 2])
def test_all_reduce_matches_numpy(op, ref, lnc):
    xs = np.random.default_rng(0).standard_normal((3, 37, 5)).astype(np.float32)
    res = run_ranks(reduce_kernel, [{"x": x, "g": RG([[0, 1, 2]]), "op": op} for x in xs], lnc=lnc)
    for r in res:
        np.testing.assert_allclose(r.outputs, ref(xs, axis=0), rtol=1e-6)


def test_all_reduce_sums_in_fp32_then_rounds_to_bf16():
    rng = np.random.default_rng(1)
    xs = dt.cast(rng.standard_normal((2, 5, 7)).astype(np.float32), dt.bfloat16)
    want = dt.cast(dt.to_f32(xs[0]) + dt.to_f32(xs[1]), dt.bfloat16)
    res = run_ranks(reduce_kernel, [{"x": x, "g": RG([[0, 1]]), "op": nl.add} for x in xs])
    for r in res:
        assert r.outputs.dtype == xs.dtype
        np.testing.assert_array_equal(r.outputs, want)


def test_sub_groups_reduce_separately():
    xs = np.arange(4 * 3 * 2, dtype=np.float32).reshape(4, 3, 2)
    g = RG([[0, 2], [1, 3]])
    res = run_ranks(reduce_kernel, [{"x": x, "g": g, "op": nl.add} for x in xs])
    for r, out in enumerate(res):
        np.testing.assert_array_equal(out.outputs, xs[r % 2] + xs[r % 2 + 2])


@nki.jit
def gather_kernel(x, g, n, dim, on_sbuf):
    shape = list(x.shape)
    shape[dim] *= n
    if on_sbuf:
        src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=src, src=x)
        dst = nl.ndarray(tuple(shape), dtype=x.dtype, buffer=nl.sbuf)
    else:
        src, dst = _staged(x), _staged(x, tuple(shape))
    ncc.all_gather(srcs=[src], dsts=[dst], replica_group=g, collective_dim=dim)
    return _out(dst)


@pytest.mark.parametrize("dim,on_sbuf", [(0, False), (0, True), (1, True)])
def test_all_gather_concatenates_in_rank_list_order(dim, on_sbuf):
    xs = np.random.default_rng(2).standard_normal((3, 19, 6)).astype(np.float32)
    g = RG([[2, 0, 1]])
    res = run_ranks(
        gather_kernel, [{"x": x, "g": g, "n": 3, "dim": dim, "on_sbuf": on_sbuf} for x in xs]
    )
    want = np.concatenate([xs[2], xs[0], xs[1]], axis=dim)
    for r in res:
        np.testing.assert_array_equal(r.outputs, want)
        (rec,) = [i for i in r.trace.instrs if i.opcode == "all_gather"]
        assert rec.nbytes == 2 * 19 * 6 * 4  # the two other ranks' 19x6 fp32 received


@nki.jit
def scatter_kernel(x, g, n):
    src = _staged(x)
    dst = _staged(x, (x.shape[0] // n, x.shape[1]))
    ncc.reduce_scatter(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0, op=nl.add)
    return _out(dst)


@nki.jit
def a2a_kernel(x, g):
    src, dst = _staged(x), _staged(x, x.shape)
    ncc.all_to_all(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0)
    return _out(dst)


def test_reduce_scatter_and_all_to_all_match_numpy():
    xs = np.random.default_rng(3).standard_normal((2, 6, 3)).astype(np.float32)
    g = RG([[0, 1]])
    rs = run_ranks(scatter_kernel, [{"x": x, "g": g, "n": 2} for x in xs])
    total = xs.sum(axis=0)
    for r, out in enumerate(rs):
        np.testing.assert_allclose(out.outputs, total[3 * r : 3 * r + 3], rtol=1e-6)
    a2a = run_ranks(a2a_kernel, [{"x": x, "g": g} for x in xs])
    for r, out in enumerate(a2a):
        want = np.concatenate([xs[0][3 * r : 3 * r + 3], xs[1][3 * r : 3 * r + 3]])
        np.testing.assert_array_equal(out.outputs, want)


@nki.jit
def rank_kernel(table):
    out = nl.ndarray((1, table.shape[1]), dtype=table.dtype, buffer=nl.shared_hbm)
    w = table.shape[1]
    nisa.dma_copy(
        dst=out, src=table.ap(pattern=[[w, 1], [1, w]], scalar_offset=ncc.rank_id(), indirect_dim=0)
    )
    return out


def test_rank_id_selects_each_ranks_row():
    table = np.arange(12, dtype=np.float32).reshape(3, 4)
    res = run_ranks(rank_kernel, [{"table": table}] * 3)
    for r, out in enumerate(res):
        np.testing.assert_array_equal(out.outputs, table[r : r + 1])


@nki.jit
def twice_kernel(x, g):
    a, b = _staged(x), _staged(x, x.shape)
    ncc.all_reduce(srcs=[a], dsts=[b], replica_group=g, op=nl.add)
    ncc.all_reduce(srcs=[b], dsts=[a], replica_group=g, op=nl.add)
    return _out(a)


def test_consecutive_collectives_of_three_ranks():
    # three ranks, two collectives: a released rank already waiting at the next one
    xs = np.ones((3, 2, 2), dtype=np.float32)
    for out in run_ranks(twice_kernel, [{"x": x, "g": RG([[0, 1, 2]])} for x in xs]):
        np.testing.assert_array_equal(out.outputs, np.full((2, 2), 9.0, np.float32))


def test_collective_is_priced_as_dma_traffic():
    xs = np.ones((2, 4, 8), dtype=np.float32)
    res = run_ranks(reduce_kernel, [{"x": x, "g": RG([[0, 1]]), "op": nl.add} for x in xs])
    (rec,) = [i for i in res[0].trace.instrs if i.opcode == "all_reduce"]
    assert rec.engine == "dma"
    assert rec.nbytes == 4 * 8 * 4  # one other rank's 4x8 fp32 contribution received
    from nki_kernels.perfmodel.api import estimate_trace

    # the cost model prices it with the DMAs: copy in + all_reduce + copy out, 128 B each
    assert estimate_trace(res[0].trace).dma_bytes == 3 * 4 * 8 * 4


# ---- rules ---------------------------------------------------------------------------------
@nki.jit
def only_some_kernel(x, g, takes_part):
    src, dst = _staged(x), _staged(x, x.shape)
    if takes_part:
        ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=g, op=nl.add)
    return _out(dst)


def test_a_collective_some_ranks_skip_is_a_sync_error_naming_each_rank():
    x = np.zeros((2, 2), np.float32)
    with pytest.raises(NkiValidationError, match="rule SYNC") as e:
        run_ranks(
            only_some_kernel, [{"x": x, "g": RG([[0, 1]]), "takes_part": r == 0} for r in range(2)]
        )
    msg = str(e.value)
    assert "rank 0 waits in all_reduce" in msg and "test_collectives.py" in msg
    assert "rank 1 returned from the kernel" in msg


@nki.jit
def io_kernel(x, g):
    dst = _staged(x, x.shape)
    ncc.all_reduce(srcs=[x], dsts=[dst], replica_group=g, op=nl.add)
    return _out(dst)


@nki.jit
def mixed_kernel(x, g):
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x)
    dst = _staged(x, x.shape)
    ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=g, op=nl.add)
    return _out(dst)


@nki.jit
def a2a_sbuf_kernel(x, g):
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x)
    ncc.all_to_all(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0)
    return _out(dst)


@nki.jit
def coalesced_sbuf_kernel(x, g):
    ts = [nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf) for _ in range(4)]
    for t in ts:
        nisa.dma_copy(dst=t, src=x)
    ncc.all_reduce(srcs=ts[:2], dsts=ts[2:], replica_group=g, op=nl.add)
    return _out(ts[2])


@pytest.mark.parametrize(
    "kernel,extra,match",
    [
        (io_kernel, {}, "kernel's IO tensors"),
        (mixed_kernel, {}, "mixing HBM and SBUF operands is not supported; got '"),
        (a2a_sbuf_kernel, {}, "must be on HBM (SBUF is not supported for this collective); got '"),
        (coalesced_sbuf_kernel, {}, "only supported on HBM"),
        (gather_kernel, {"n": 2, "dim": 1, "on_sbuf": False}, "collective_dim must be one of"),
        (reduce_kernel, {"g": RG([[0, 1], [1]]), "op": nl.add}, "must not overlap"),
        (reduce_kernel, {"g": RG([[0, 1, 2]]), "op": nl.add}, "rank 2 of"),
        (reduce_kernel, {"g": RG([[0]]), "op": nl.add}, "rank 1 is in none"),
    ],
)
def test_documented_restrictions_are_rule_collective(kernel, extra, match):
    x = np.ones((4, 4), dtype=np.float32)
    kwargs = {"x": x, "g": RG([[0, 1]]), **extra}
    with pytest.raises(NkiValidationError, match="rule COLLECTIVE") as e:
        run_ranks(kernel, [dict(kwargs), dict(kwargs)])
    assert e.value.rule == "COLLECTIVE" and match in str(e.value)


@nki.jit
def priority_kernel(x, g, priority):
    src, dst = _staged(x), _staged(x, x.shape)
    ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=g, op=nl.add, priority=priority)
    return _out(dst)


def test_reduce_op_and_priority_rules():
    x = np.ones((4, 4), dtype=np.float32)
    with pytest.raises(NkiValidationError, match="rule OP"):
        run_ranks(reduce_kernel, [{"x": x, "g": RG([[0, 1]]), "op": nl.multiply}] * 2)
    kw = {"x": x, "g": RG([[0, 1]])}
    # priority is a DMA QoS level 0-3, NeuronCore-v4+ only (nki.collectives docs)
    res = run_ranks(priority_kernel, [{**kw, "priority": 3}] * 2, target="trn3")
    np.testing.assert_array_equal(res[0].outputs, 2 * x)
    for bad in (4, -1, True, 1.0):
        with pytest.raises(NkiValidationError, match="rule ARG") as e:
            run_ranks(priority_kernel, [{**kw, "priority": bad}] * 2, target="trn3")
        assert f"priority must be None or 0..3; got {bad!r}" in str(e.value)
    with pytest.raises(NkiValidationError, match="rule VERSION"):
        run_ranks(priority_kernel, [{**kw, "priority": 0}] * 2, target="trn2")


def test_run_ranks_argument_errors():
    with pytest.raises(NkiValidationError, match="sequence of per-rank dicts"):
        run_ranks(reduce_kernel, {"x": 1})  # type: ignore[arg-type]
    with pytest.raises(NkiValidationError, match="lnc"):
        run_ranks(reduce_kernel, [{}], lnc=3)


def test_a_single_launch_is_a_world_of_rank_0():
    x = np.full((2, 3), 2.0, dtype=np.float32)
    np.testing.assert_array_equal(reduce_kernel(x, RG([[0]]), nl.add), x)
    with pytest.raises(NkiValidationError, match="not launched"):
        reduce_kernel(x, RG([[0, 1]]), nl.add)


def test_trace_only_ranks_record_the_collectives():
    from nki_kernels.interp import TensorSpec

    spec = TensorSpec((128, 64), "float32")
    res = run_ranks(
        reduce_kernel, [{"x": spec, "g": RG([[0, 1]]), "op": nl.add}] * 2, trace_only=True
    )
    for r in res:
        assert r.outputs == spec
        assert r.trace.count(opcode="all_reduce") == 1
