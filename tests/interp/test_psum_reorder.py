"""PSUM read-outs reordered as neuronx-cc schedules them (`settings(reorder_psum_reads=True)`):
accumulators kept in a list and read out in a later loop fit when each read-out can run
right after its accumulation; they still overflow when a read-out depends on something
written after all of them. Overflow messages list the live tiles and where the kernel
allocated them."""

from __future__ import annotations

import numpy as np
import pytest

from nki_kernels.interp import MemoryPlanError, nisa, nl, run, settings

P = 128
BANK_COLS = 512  # fp32 columns of one 2 KiB PSUM bank
N_ACC = 12  # accumulators: more than PSUM's 8 banks


def _later_readout(late_scale: bool):
    """N_ACC PSUM accumulators allocated in one list, filled by one matmul each, then
    read out in a second loop into SBUF tiles allocated up front (the pattern of
    nki-library's shard-on-I MoE kernel). With `late_scale` every read-out also reads a
    scale tile written only after the last matmul, so none can move before it."""

    def kernel(x):
        out = nl.ndarray((N_ACC, BANK_COLS), dtype=nl.float32, buffer=nl.shared_hbm)
        xs = nl.ndarray((P, BANK_COLS), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x)
        ones = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=ones, value=1.0)
        results = [
            nl.ndarray((1, BANK_COLS), dtype=nl.float32, buffer=nl.sbuf) for _ in range(N_ACC)
        ]
        scale = nl.ndarray((1, BANK_COLS), dtype=nl.float32, buffer=nl.sbuf)
        accs = [nl.ndarray((1, BANK_COLS), dtype=nl.float32, buffer=nl.psum) for _ in range(N_ACC)]
        for j in range(N_ACC):
            nisa.nc_matmul(dst=accs[j], stationary=ones, moving=xs)
        if late_scale:
            nisa.memset(dst=scale, value=2.0)
        for j in range(N_ACC):
            if late_scale:
                nisa.tensor_tensor(dst=results[j], data1=accs[j], data2=scale, op=nl.multiply)
            else:
                nisa.tensor_scalar(results[j], accs[j], nl.multiply, float(j + 1))
        for j in range(N_ACC):
            nisa.dma_copy(dst=out[j : j + 1, :], src=results[j])
        return out

    return kernel


def _x() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((P, BANK_COLS)).astype(np.float32)


def test_readouts_in_a_later_loop_fit_when_psum_reads_are_reordered():
    x = _x()
    with settings(reorder_psum_reads=True):
        res = run(_later_readout(False), x)
    col = x.astype(np.float64).sum(axis=0)
    want = np.stack([col * (j + 1) for j in range(N_ACC)]).astype(np.float32)
    np.testing.assert_allclose(res.outputs, want, rtol=1e-5, atol=1e-4)
    # each accumulator is evicted right after its matmul: never more than two banks
    assert res.trace.peak_psum_banks[0] <= 2


def test_in_program_order_the_same_kernel_overflows_psum():
    with pytest.raises(MemoryPlanError) as e:
        run(_later_readout(False), _x())
    msg = str(e.value)
    assert e.value.rule == "PSUM_OVERFLOW"
    assert "8 of 8 banks are live" in msg and "even with every tile freed" in msg
    assert "reordered" not in msg


def test_a_readout_that_waits_for_a_later_write_still_overflows():
    with settings(reorder_psum_reads=True), pytest.raises(MemoryPlanError) as e:
        run(_later_readout(True), _x())
    msg = str(e.value)
    assert e.value.rule == "PSUM_OVERFLOW"
    assert msg.endswith("and PSUM read-outs reordered (rule PSUM_OVERFLOW)")


def test_an_overflow_lists_the_live_tiles_and_their_kernel_lines():
    with pytest.raises(MemoryPlanError) as e:
        run(_later_readout(False), _x())
    msg = str(e.value)
    # the 9th accumulator, with the 8 live ones grouped by shape, dtype and source line
    assert "allocating 't" in msg and "from test_psum_reorder.py:" in msg
    assert "; live: 8 x (1, 512) float32 (2048 B each) from test_psum_reorder.py:" in msg
