"""A tile rewritten whole before its next read holds no live value in between: the
replay frees it after its last read and places it again at the rewrite (liveness.py,
"Live ranges"), as the compiler's liveness analysis allows. A partial rewrite keeps the
tile live, and tiles truly live together still overflow with the numbers."""

from __future__ import annotations

import numpy as np
import pytest

from nki_kernels.interp import MemoryPlanError, nisa, nl, run, settings
from nki_kernels.interp.trace import SBUF
from nki_kernels.targets import get_target

P = 128
COLS = 512  # fp32: 2 KiB per partition per tile


def _small_sbuf(kib: int):
    """trn2 with `kib` KiB of usable SBUF per partition."""
    t = get_target("trn2")
    return t.replace(sbuf_bytes_per_partition=t.sbuf_reserved_bytes + kib * 1024)


def _reload_kernel(iters: int, rewrite_cols: int, read_a_late: bool):
    """Tile `a` is allocated once and reloaded in every iteration (its first
    `rewrite_cols` columns); b = 2a, c = b + 1 (or b + a when `read_a_late`)."""

    def kernel(x):
        out = nl.ndarray((iters, P, COLS), dtype=nl.float32, buffer=nl.shared_hbm)
        a = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf)
        if rewrite_cols < COLS:
            nisa.memset(dst=a, value=0.0)
        for i in range(iters):
            nisa.dma_copy(dst=a[:, 0:rewrite_cols], src=x[i, :, 0:rewrite_cols])
            b = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(b, a, nl.multiply, 2.0)
            c = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf)
            if read_a_late:
                nisa.tensor_tensor(c, b, a, nl.add)
            else:
                nisa.tensor_scalar(c, b, nl.add, 1.0)
            nisa.dma_copy(dst=out[i], src=c)
        return out

    return kernel


def _x(iters: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((iters, P, COLS)).astype(np.float32)


def test_a_tile_reloaded_whole_is_free_between_its_last_read_and_the_reload():
    x = _x(3)
    res = run(_reload_kernel(3, COLS, False), x, target=_small_sbuf(4))
    np.testing.assert_allclose(res.outputs, 2 * x + 1, rtol=1e-6)
    assert res.peak_sbuf_bytes <= 4 * 1024  # a, b, c never all live: 6 KiB otherwise
    # each reload of `a` writes the bytes its iteration's first read then reads (the
    # trace follows the tile to its new place)
    instrs = res.trace.instrs
    loads = [k for k, i in enumerate(instrs) if i.opcode == "dma_copy" and i.writes[0][0] == SBUF]
    assert len(loads) == 3
    for k in loads:
        assert instrs[k + 1].opcode == "tensor_scalar"
        assert instrs[k + 1].reads[0][2:] == instrs[k].writes[0][2:]


def test_a_partial_reload_keeps_the_tile_live():
    # columns 256.. of `a` carry over from the memset: the value before the reload is
    # still read, so a, b and c are live together (6 KiB of 4)
    with pytest.raises(MemoryPlanError) as e:
        run(_reload_kernel(3, COLS // 2, False), _x(3), target=_small_sbuf(4))
    assert e.value.rule == "SBUF_OVERFLOW"
    assert "even with every tile freed after its last use" in str(e.value)


def test_tiles_truly_live_together_still_overflow_with_the_numbers():
    with pytest.raises(MemoryPlanError) as e:
        run(_reload_kernel(3, COLS, True), _x(3), target=_small_sbuf(4))
    msg = str(e.value)
    assert e.value.rule == "SBUF_OVERFLOW"
    assert "needs 2048 B per partition but 4096 of 4096 usable B per partition are live" in msg


def test_an_explicitly_placed_tile_is_never_split():
    # the same reload at a fixed address: its bytes stay reserved between the ranges
    def kernel(x):
        out = nl.ndarray((3, P, COLS), dtype=nl.float32, buffer=nl.shared_hbm)
        a = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf, address=(0, 0))
        for i in range(3):
            nisa.dma_copy(dst=a, src=x[i])
            b = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(b, a, nl.multiply, 2.0)
            c = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(c, b, nl.add, 1.0)
            nisa.dma_copy(dst=out[i], src=c)
        return out

    with pytest.raises(MemoryPlanError):
        run(kernel, _x(3), target=_small_sbuf(4))


def test_an_allocation_no_instruction_touches_is_dropped_unless_strict():
    # the compiler drops a dead allocation; the configs' dry runs of a reduced problem
    # (settings(free_unused_tiles=False)) keep it, since the full problem uses it
    def kernel(x):
        out = nl.ndarray((3, P, COLS), dtype=nl.float32, buffer=nl.shared_hbm)
        unused = nl.ndarray((P, 2 * COLS), dtype=nl.float32, buffer=nl.sbuf)  # 4 KiB
        for i in range(3):
            a = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=a, src=x[i])
            nisa.dma_copy(dst=out[i], src=a)
        assert unused is not None
        return out

    x = _x(3)
    np.testing.assert_array_equal(run(kernel, x, target=_small_sbuf(4)).outputs, x)
    with pytest.raises(MemoryPlanError), settings(free_unused_tiles=False):
        run(kernel, x, target=_small_sbuf(4))
