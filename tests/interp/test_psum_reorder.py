"""Memory accounted as neuronx-cc schedules it (`compiler_schedule`, on by default): PSUM
accumulators kept in a list and read out in a later loop fit when each read-out can run
right after its accumulation, and SBUF tiles allocated up front live from their first
write; both still overflow when the tiles are truly live together. Overflow messages
list the live tiles and where the kernel allocated them."""

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
    with settings(compiler_schedule=True):
        res = run(_later_readout(False), x)
    col = x.astype(np.float64).sum(axis=0)
    want = np.stack([col * (j + 1) for j in range(N_ACC)]).astype(np.float32)
    np.testing.assert_allclose(res.outputs, want, rtol=1e-5, atol=1e-4)
    # each accumulator is evicted right after its matmul: never more than two banks
    assert res.trace.peak_psum_banks[0] <= 2


def test_in_program_order_the_same_kernel_overflows_psum():
    with settings(compiler_schedule=False), pytest.raises(MemoryPlanError) as e:
        run(_later_readout(False), _x())
    msg = str(e.value)
    assert e.value.rule == "PSUM_OVERFLOW"
    assert "8 of 8 banks are live, even with every tile freed after its last use; live:" in msg
    assert "first use" not in msg


def test_a_readout_that_waits_for_a_later_write_still_overflows():
    with settings(compiler_schedule=True), pytest.raises(MemoryPlanError) as e:
        run(_later_readout(True), _x())
    msg = str(e.value)
    assert e.value.rule == "PSUM_OVERFLOW"
    assert "even with every tile freed after its last use (placed at its first use, PSUM" in msg


def test_an_overflow_lists_the_live_tiles_and_their_kernel_lines():
    with settings(compiler_schedule=False), pytest.raises(MemoryPlanError) as e:
        run(_later_readout(False), _x())
    msg = str(e.value)
    # the 9th accumulator, with the 8 live ones grouped by shape, dtype and source line
    assert "allocating 't" in msg and "from test_psum_reorder.py:" in msg
    assert "; live: 8 x (1, 512) float32 (2048 B each) from test_psum_reorder.py:" in msg


SBUF_COLS = 16 * 1024  # fp32: 64 KiB per partition; 4 need 256 KiB of trn2's 208 KiB


def _sbuf_list(read_at_end: bool, passes: int = 1):
    """4 SBUF tiles allocated in one list; each is loaded, then added into an
    accumulator -- right after its load, or (`read_at_end`) all after the last load, in
    `passes` passes over the list."""

    def kernel(x):
        out = nl.ndarray((P, SBUF_COLS // 4), dtype=nl.float32, buffer=nl.shared_hbm)
        tiles = [nl.ndarray((P, SBUF_COLS), dtype=nl.float32, buffer=nl.sbuf) for _ in range(4)]
        acc = nl.ndarray((P, SBUF_COLS // 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for t in tiles:
            nisa.dma_copy(dst=t, src=x)
            if not read_at_end:
                nisa.tensor_tensor(dst=acc, data1=acc, data2=t[:, 0 : SBUF_COLS // 4], op=nl.add)
        if read_at_end:
            for t in tiles * passes:
                nisa.tensor_tensor(dst=acc, data1=acc, data2=t[:, 0 : SBUF_COLS // 4], op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    return kernel


def test_sbuf_tiles_allocated_up_front_live_from_their_first_write():
    x = np.full((P, SBUF_COLS), 0.5, np.float32)
    with settings(compiler_schedule=False), pytest.raises(MemoryPlanError) as e:
        run(_sbuf_list(False), x)  # placed at their allocation: all 4 at once
    assert e.value.rule == "SBUF_OVERFLOW"
    with settings(compiler_schedule=True):
        res = run(_sbuf_list(False), x)
    np.testing.assert_array_equal(res.outputs, np.full((P, SBUF_COLS // 4), 2.0, np.float32))
    assert res.trace.peak_sbuf_bytes[0] < 3 * SBUF_COLS * 4


def test_sbuf_tiles_read_after_the_last_load_fit_with_the_loads_deferred():
    # each load holds nothing needed before its tile's read: deferred there (liveness.py,
    # "Deferred fills and loads"), one 64 KiB tile is live at a time
    x = np.full((P, SBUF_COLS), 0.5, np.float32)
    with settings(compiler_schedule=True):
        res = run(_sbuf_list(True), x)
    np.testing.assert_array_equal(res.outputs, np.full((P, SBUF_COLS // 4), 2.0, np.float32))
    assert res.trace.peak_sbuf_bytes[0] < 2 * SBUF_COLS * 4
    with settings(compiler_schedule=False), pytest.raises(MemoryPlanError):
        run(_sbuf_list(True), x)  # program order: all 4 at once


def test_sbuf_tiles_read_twice_after_the_last_load_still_overflow():
    # read in two passes: all 4 are live between the passes, wherever the loads go
    x = np.full((P, SBUF_COLS), 0.5, np.float32)
    with settings(compiler_schedule=True), pytest.raises(MemoryPlanError) as e:
        run(_sbuf_list(True, passes=2), x)
    msg = str(e.value)
    assert e.value.rule == "SBUF_OVERFLOW" and "needs 65536 B per partition" in msg
    assert "fills and loads deferred to their first reader" in msg
    assert "; live: 2 x (128, 16384) float32 (65536 B each) from test_psum_reorder.py:" in msg
