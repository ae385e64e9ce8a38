"""LNC programs as cooperating threads: core_barrier, sendrecv, and unmet waits (rule SYNC)."""

from __future__ import annotations

import numpy as np
import pytest

from nki_kernels.interp import NkiValidationError, nisa, nki, nl, run


@nki.jit
def _halves_then_swap(x):
    """Each program writes its half of a shared tensor, barriers, then reads the other half."""
    n, f = x.shape
    half = n // 2
    pid = nl.program_id(0)
    stage = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((half, f), x.dtype)
    nisa.dma_copy(dst=t, src=x[pid * half : (pid + 1) * half, :])
    nisa.activation(dst=t, data=t, op=nl.exp)
    nisa.dma_copy(dst=stage[pid * half : (pid + 1) * half, :], src=t)
    nisa.core_barrier(stage, (0, 1))
    other = 1 - pid
    u = nl.ndarray((half, f), x.dtype)
    nisa.dma_copy(dst=u, src=stage[other * half : (other + 1) * half, :])
    nisa.dma_copy(dst=out[other * half : (other + 1) * half, :], src=u)
    return out


def test_core_barrier_makes_the_other_programs_writes_visible():
    x = np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32)
    out = _halves_then_swap[2](x)
    np.testing.assert_allclose(out, np.exp(x), rtol=1e-6)


def test_core_barrier_refuses_a_psum_tensor():
    @nki.jit
    def on_psum(x):
        acc = nl.ndarray((2, 3), nl.float32, buffer=nl.psum)
        nisa.core_barrier(acc, (0, 1))
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    with pytest.raises(NkiValidationError, match=r"core_barrier: data must be in HBM .*psum") as e:
        on_psum[2](np.ones((2, 3), np.float32))
    assert "rule BUF" in str(e.value)


def test_a_barrier_is_recorded_after_every_members_pre_barrier_work():
    """Trace order p0 pre, p1 pre, p0 barrier, p0 post, p1 barrier, p1 post: so in the cost
    model each core's barrier waits for both cores' writes to `data`, and the later core's
    pre-barrier writes never wait for the early core's barrier (a reader of `data`)."""
    from nki_kernels.perfmodel.timeline import schedule

    @nki.jit
    def skewed_work(x):
        n, f = x.shape
        pid = nl.program_id(0)
        stage = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((1, f), x.dtype)
        nisa.dma_copy(dst=t, src=x[pid : pid + 1, :])
        for _ in range(20 * pid):  # program 1 arrives much later
            nisa.activation(dst=t, data=t, op=nl.exp)
        nisa.dma_copy(dst=stage[pid : pid + 1, :], src=t)
        nisa.core_barrier(stage, (0, 1))
        u = nl.ndarray((1, f), x.dtype)
        nisa.dma_copy(dst=u, src=stage[1 - pid : 2 - pid, :])
        out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[1 - pid : 2 - pid, :], src=u)
        return out

    res = run(skewed_work[2], np.ones((2, 3), np.float32), trace_only=True)
    instrs = res.trace.instrs
    seq = [(i.program, i.opcode) for i in instrs if i.opcode in ("core_barrier", "dma_copy")]
    assert seq[:2] == [(0, "dma_copy"), (0, "dma_copy")] and seq[2][0] == 1
    bar = [k for k, i in enumerate(instrs) if i.opcode == "core_barrier"]
    p1_store = max(k for k, i in enumerate(instrs[: bar[0]]) if i.program == 1)
    assert [instrs[k].program for k in bar] == [0, 1] and p1_store < bar[0]
    sched = schedule(res.trace, "trn2")
    last_exp = max(k for k, i in enumerate(instrs) if i.opcode == "activation")
    # program 1's store follows its own work, not program 0's barrier; both barriers end
    # after it (the data both cores wrote is complete)
    assert sched.start[p1_store] >= sched.end[last_exp]
    assert all(sched.start[k] >= sched.end[p1_store] for k in bar)


def test_without_the_barrier_program_0_reads_unwritten_memory():
    @nki.jit
    def racy(x):
        n, f = x.shape
        pid = nl.program_id(0)
        stage = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((1, f), x.dtype)
        nisa.dma_copy(dst=t, src=x[pid : pid + 1, :])
        nisa.dma_copy(dst=stage[pid : pid + 1, :], src=t)
        u = nl.ndarray((1, f), x.dtype)
        nisa.dma_copy(dst=u, src=stage[1 - pid : 2 - pid, :])
        out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[1 - pid : 2 - pid, :], src=u)
        return out

    out = racy[2](np.ones((2, 3), np.float32))
    # program 0 ran to the end before program 1 wrote its row: row 1 of out is NaN
    assert np.isnan(out[1]).all() and (out[0] == 1).all()


def test_a_barrier_reached_by_one_program_only_names_both_positions():
    @nki.jit
    def lonely(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:
            nisa.core_barrier(out, (0, 1))
        return out

    with pytest.raises(NkiValidationError) as e:
        lonely[2](np.ones((2, 2), np.float32))
    msg = str(e.value)
    assert e.value.rule == "SYNC"
    assert "program 0 waits in core_barrier" in msg and "test_lnc_sync.py" in msg
    assert "program 1 returned from the kernel" in msg


def test_crossed_waits_are_a_deadlock():
    @nki.jit
    def crossed(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        a = nl.ndarray(x.shape, x.dtype)
        b = nl.ndarray(x.shape, x.dtype)
        nisa.memset(a, 0.0)
        if nl.program_id(0) == 0:
            nisa.core_barrier(out, (0, 1))
        else:
            nisa.sendrecv(a, b, send_to_rank=0, recv_from_rank=0, pipe_id=0)
        return out

    with pytest.raises(NkiValidationError) as e:
        crossed[2](np.ones((2, 2), np.float32))
    msg = str(e.value)
    assert e.value.rule == "SYNC" and "program 0 waits in core_barrier" in msg
    assert "program 1 waits in sendrecv" in msg


def test_a_two_core_barrier_under_lnc1_has_no_partner_and_completes():
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.core_barrier(x, [0, 1])  # an input, as nki-library's router_topk passes
        nisa.dma_copy(dst=out, src=x)
        return out

    res = run(k, np.ones((2, 2), np.float32))
    assert res.trace.instrs[0].opcode == "core_barrier" and (res.outputs == 1).all()


def test_a_barrier_on_an_sbuf_counter_is_accepted_as_nki_librarys_moe_cte_uses_it():
    """bwmm_shard_on_I barriers on its SBUF block counter (docs: shared HBM data)."""

    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        counter = nl.ndarray((1, 1), buffer=nl.sbuf, dtype=nl.int32)
        nisa.memset(counter, value=0)
        nisa.core_barrier(counter, (0, 1))
        if nl.program_id(0) == 0:
            nisa.dma_copy(dst=out, src=x)
        return out

    res = run(k[2], np.ones((2, 2), np.float32))
    assert [i.opcode for i in res.trace.instrs].count("core_barrier") == 2
    assert (res.outputs == 1).all()


@pytest.mark.parametrize("dtype", [nl.float32, nl.bfloat16])
@pytest.mark.parametrize("rows", [128, 37])
def test_sendrecv_swaps_tiles_between_the_programs(dtype, rows):
    @nki.jit
    def swap(x):
        pid = nl.program_id(0)
        out = nl.ndarray((2, rows, 4), x.dtype, buffer=nl.shared_hbm)
        mine = nl.ndarray((rows, 4), x.dtype)
        theirs = nl.ndarray((rows, 4), x.dtype)
        nisa.dma_copy(dst=mine, src=x[pid])
        nisa.sendrecv(mine, theirs, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
        nisa.dma_copy(dst=out[pid], src=theirs)
        return out

    x = np.random.default_rng(1).standard_normal((2, rows, 4)).astype(np.float32)
    xd = x.astype(dtype)
    out = swap[2](xd)
    np.testing.assert_array_equal(out[0], xd[1])
    np.testing.assert_array_equal(out[1], xd[0])


def test_sendrecv_partners_must_agree():
    @nki.jit
    def bad(x):
        a = nl.ndarray((2, 2), nl.float32)
        b = nl.ndarray((2, 2), nl.float32)
        nisa.memset(a, 1.0)
        pid = nl.program_id(0)
        nisa.sendrecv(a, b, send_to_rank=1 - pid, recv_from_rank=pid, pipe_id=3)
        return x

    with pytest.raises(NkiValidationError) as e:
        bad[2](np.ones((2, 2), np.float32))
    assert e.value.rule == "SYNC" and "receives from" in str(e.value)


def test_programs_without_meetings_keep_the_sequential_trace_order():
    @nki.jit
    def k(x):
        t = nl.ndarray(x.shape, x.dtype)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    res = run(k[2], np.ones((2, 2), np.float32))
    assert [i.program for i in res.trace.instrs] == [0, 0, 1, 1]


@nki.jit
def _inner(x, out):
    pid = nl.program_id(0)
    t = nl.ndarray((1, x.shape[1]), x.dtype)
    nisa.dma_copy(dst=t, src=x[pid : pid + 1, :])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(10 * (pid + 1)))
    nisa.dma_copy(dst=out[pid : pid + 1, :], src=t)
    return out


def test_a_jit_kernel_called_from_a_kernel_is_inlined_into_the_callers_programs():
    @nki.jit
    def outer(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        got = _inner(x, out)
        assert got is out  # a tensor of the caller's launch, not a NumPy copy
        return out

    x = np.zeros((2, 3), np.float32)
    res = run(outer[2], x)
    np.testing.assert_array_equal(res.outputs, [[10.0] * 3, [20.0] * 3])
    assert {i.program for i in res.trace.instrs} == {0, 1}


def test_an_inner_launch_with_another_lnc_is_refused():
    @nki.jit
    def outer(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        return _inner[2](x, out)

    with pytest.raises(NkiValidationError) as e:
        outer(np.zeros((2, 3), np.float32))
    assert e.value.rule == "LAUNCH" and "caller's programs" in str(e.value)
