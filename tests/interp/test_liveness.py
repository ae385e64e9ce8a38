"""On-chip tiles die after their last use, as the compiler allocates them: a kernel that
keeps references to finished tiles still fits; one whose tiles are truly live together
overflows with the numbers."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import pytest

from nki_kernels.interp import MemoryPlanError, nisa, nl, run
from nki_kernels.interp import launch as launch_mod
from nki_kernels.interp.liveness import Liveness

P = 128
BANK_COLS = 512  # fp32 columns of one 2 KiB PSUM bank


def _psum_tiles_kept(n_tiles: int, read_all_at_end: bool, calls: list[int]):
    """A (P, n_tiles) output: column j = sum over partitions of x, via n_tiles matmuls.
    Every PSUM tile is kept in a Python list until the kernel returns; with
    `read_all_at_end` every tile is also read at the end (truly live together)."""

    def kernel(x):
        calls.append(1)
        out = nl.ndarray((n_tiles, BANK_COLS), dtype=nl.float32, buffer=nl.shared_hbm)
        xs = nl.ndarray((P, BANK_COLS), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x)
        ones = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=ones, value=1.0)
        kept = []
        for j in range(n_tiles):
            acc = nl.ndarray((1, BANK_COLS), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=acc, stationary=ones, moving=xs)
            kept.append(acc)
            if not read_all_at_end:
                res = nl.ndarray((1, BANK_COLS), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(res, acc, nl.multiply, float(j + 1))
                nisa.dma_copy(dst=out[j : j + 1, :], src=res)
        if read_all_at_end:
            for j, acc in enumerate(kept):
                res = nl.ndarray((1, BANK_COLS), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(res, acc, nl.multiply, float(j + 1))
                nisa.dma_copy(dst=out[j : j + 1, :], src=res)
        return out

    return kernel


def _x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((P, BANK_COLS)).astype(np.float32)


def _want(x: np.ndarray, n_tiles: int) -> np.ndarray:
    col = x.astype(np.float64).sum(axis=0)
    return np.stack([col * (j + 1) for j in range(n_tiles)]).astype(np.float32)


def test_psum_tiles_are_reused_after_their_last_use():
    calls: list[int] = []
    x = _x()
    res = run(_psum_tiles_kept(12, False, calls), x)  # 12 banks referenced, 1 in use at a time
    np.testing.assert_allclose(res.outputs, _want(x, 12), rtol=1e-5, atol=1e-4)
    assert res.trace.peak_psum_banks[0] <= 2  # freed after the copy that reads it
    assert len(calls) == 3  # Python-lifetime plan overflowed, recorded, replayed


def test_true_psum_overflow_fails_with_the_numbers():
    calls: list[int] = []
    with pytest.raises(MemoryPlanError) as e:
        run(_psum_tiles_kept(9, True, calls), _x())  # 9 banks live together: 8 exist
    msg = str(e.value)
    assert e.value.rule == "PSUM_OVERFLOW"
    assert "needs 1 bank(s) of 2048 B but 8 of 8 banks are live" in msg
    assert "even with every tile freed after its last use" in msg


def test_a_kernel_that_fits_runs_once_with_its_python_lifetime_plan():
    calls: list[int] = []
    x = _x()
    res = run(_psum_tiles_kept(8, True, calls), x)  # 8 banks: fits as written
    np.testing.assert_allclose(res.outputs, _want(x, 8), rtol=1e-5, atol=1e-4)
    assert len(calls) == 1 and res.trace.peak_psum_banks[0] == 8


def _sbuf_kernel(n_tiles: int, keep_live: bool, cols: int):
    def kernel(x):
        out = nl.ndarray((P, cols), dtype=nl.float32, buffer=nl.shared_hbm)
        tiles = []
        for _j in range(n_tiles):
            t = nl.ndarray((P, cols), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x)
            tiles.append(t)
        acc = nl.ndarray((P, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        # keep_live: every tile is read in two passes, so all are live between them
        for t in tiles + tiles if keep_live else tiles[-1:]:
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    return kernel


def test_sbuf_tiles_written_but_never_read_again_are_reused():
    cols = 16 * 1024  # 64 KiB per partition each; 6 would need 384 KiB
    x = np.ones((P, cols), np.float32)
    res = run(_sbuf_kernel(6, False, cols), x, trace_only=False)
    np.testing.assert_array_equal(res.outputs, x)


def test_true_sbuf_overflow_names_the_tile_and_bytes():
    cols = 16 * 1024
    with pytest.raises(MemoryPlanError) as e:
        run(_sbuf_kernel(6, True, cols), np.ones((P, cols), np.float32))
    msg = str(e.value)
    assert e.value.rule == "SBUF_OVERFLOW" and "needs 65536 B per partition" in msg
    assert "even with every tile freed after its last use" in msg


def _spy_recording(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Capture the recording pass of a liveness replay and, beside it, the use counts
    a recording pass with its arithmetic gives."""
    seen: dict[str, Any] = {}
    real = launch_mod._record_uses

    def spy(attempt: Any) -> Liveness:
        recorder = real(attempt)
        numeric = Liveness()
        attempt(numeric)
        seen["recorded"], seen["numeric"] = recorder.counts, numeric.counts
        return recorder

    monkeypatch.setattr(launch_mod, "_record_uses", spy)
    return seen


def _spy_modes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The trace_only flag of every launch attempt, in order."""
    modes: list[bool] = []
    real = launch_mod.state.Launch

    def launch_spy(target: Any, lnc: int, trace_only: bool) -> Any:
        modes.append(trace_only)
        return real(target, lnc, trace_only)

    monkeypatch.setattr(launch_mod.state, "Launch", launch_spy)
    return modes


def test_the_recording_pass_skips_the_arithmetic_and_counts_as_a_numeric_one(monkeypatch):
    seen = _spy_recording(monkeypatch)
    modes = _spy_modes(monkeypatch)
    x = _x()
    res = run(_psum_tiles_kept(12, False, []), x)
    np.testing.assert_allclose(res.outputs, _want(x, 12), rtol=1e-5, atol=1e-4)
    # Python-lifetime plan, trace-only recording, placed run (+ the spy's numeric one)
    assert modes[:3] == [False, True, False]
    assert seen["recorded"] == seen["numeric"] and len(seen["recorded"]) > 12


def _register_bounded_psum_kernel(n_tiles: int):
    """`_psum_tiles_kept` with a register-bounded device loop first: its trip count is
    read from memory, which a trace-only recording pass cannot follow."""
    inner = _psum_tiles_kept(n_tiles, False, [])

    def kernel(x, bound):
        ub_sb = nl.ndarray((1, 1), nl.int32)
        nisa.dma_copy(ub_sb, bound)
        ub = nisa.register_alloc()
        nisa.register_load(ub, ub_sb)
        row = nl.ndarray((1, BANK_COLS), nl.float32)
        nl.fori_loop(0, ub, lambda i: nisa.dma_copy(row, x[0:1, :]))
        return inner(x)

    return kernel


def test_a_register_bounded_loop_is_recorded_with_its_arithmetic(monkeypatch):
    seen = _spy_recording(monkeypatch)
    modes = _spy_modes(monkeypatch)
    x = _x()
    res = run(_register_bounded_psum_kernel(12), x, np.array([[3]], np.int32))
    # Python lifetimes, trace-only recording (stops at the loop), numeric recording, placed
    assert modes[:4] == [False, True, False, False]
    np.testing.assert_allclose(res.outputs, _want(x, 12), rtol=1e-5, atol=1e-4)
    assert res.trace.count("dma", "dma_copy") == 1 + 3 + 1 + 12
    assert seen["recorded"] == seen["numeric"]
    assert res.trace.peak_psum_banks[0] <= 2


def test_a_failed_attempt_frees_its_input_copies_before_the_replay():
    """The Python-lifetime attempt overflows; its traceback must not keep that attempt's
    storages (the copies of the inputs) alive while the replays run."""
    storages: list[Any] = []
    inner = _psum_tiles_kept(12, False, [])

    def kernel(x):
        storages.append(weakref.ref(x.storage))
        if len(storages) == 3:  # the placing pass: the first attempt's copy is gone
            assert storages[0]() is None
        return inner(x)

    x = _x()
    res = run(kernel, x)
    np.testing.assert_allclose(res.outputs, _want(x, 12), rtol=1e-5, atol=1e-4)
    assert len(storages) == 3


def test_a_replayed_launch_sees_the_callers_input_unchanged_until_the_write_back():
    """Every attempt reads the caller's array as it was; the input the kernel increments
    is incremented once, by the write-back of the placing pass."""
    inner = _psum_tiles_kept(12, False, [])

    def kernel(x, counter):
        t = nl.ndarray((1, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=counter)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
        nisa.dma_copy(dst=counter, src=t)
        return inner(x)

    x, counter = _x(), np.zeros((1, 4), np.float32)
    res = run(kernel, x, counter)  # overflows, records, replays
    np.testing.assert_allclose(res.outputs, _want(x, 12), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(counter, np.ones((1, 4), np.float32))
