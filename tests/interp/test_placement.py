"""`address=` placement of on-chip tiles: honoured by the allocator and the accounting;
deliberate overlap is allowed, a placement past the end fails with the numbers."""

from __future__ import annotations

import numpy as np
import pytest

from nki_kernels.interp import MemoryPlanError, NkiValidationError, nisa, nl, run, settings
from nki_kernels.targets import get_target

BANK = 2048


def test_psum_tiles_may_share_banks_by_address():
    def kernel():
        # 16 tiles of one bank each, placed on 4 banks: 16 live would overflow 8 banks
        tiles = [
            nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, (i % 4) * BANK))
            for i in range(16)
        ]
        more = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(4)]
        assert len(tiles) + len(more) == 20  # all live at once

    res = run(kernel)
    assert res.peak_psum_banks == 8


def test_first_fit_tiles_avoid_live_placed_tiles():
    def kernel(x):
        a = nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, 0))
        b = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        nisa.memset(a, 0.0)
        nisa.memset(b, 1.0)
        return x

    res = run(kernel, np.ones((1, 1), np.float32))
    a_w, b_w = (i.writes[0] for i in res.trace.instrs)
    assert a_w[4:] == (0, BANK) and b_w[4] >= BANK  # b was not placed on a's bank


def test_a_placement_past_psum_fails_with_the_numbers():
    def kernel():
        nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, 7 * BANK + 64))

    with pytest.raises(MemoryPlanError) as e:
        run(kernel)
    assert e.value.rule == "PSUM_OVERFLOW" and "address 14400" in str(e.value)
    assert "8 banks of 2048 B" in str(e.value)


def test_a_placement_past_sbuf_fails_with_the_numbers():
    usable = get_target("trn2").sbuf_usable_bytes

    def kernel():
        nl.ndarray((128, 1024), nl.float32, address=(0, usable - 1024))

    with pytest.raises(MemoryPlanError) as e:
        run(kernel)
    assert e.value.rule == "SBUF_OVERFLOW" and f"{usable} B per partition" in str(e.value)


def test_placed_sbuf_bytes_count_toward_the_peak_and_overflow():
    kib = 1024

    def kernel():
        pinned = nl.ndarray((128, 16 * kib), nl.float32, address=(0, 0))  # 64 KiB
        overlap = nl.ndarray((128, 16 * kib), nl.float32, address=(0, 0))  # the same bytes
        auto = nl.ndarray((128, 8 * kib), nl.float32)  # 32 KiB beside them
        assert pinned.shape == overlap.shape and auto is not None  # all live

    assert run(kernel).peak_sbuf_bytes == 96 * kib

    def too_much():
        pinned = nl.ndarray((128, 16 * kib), nl.float32, address=(0, 0))
        nl.ndarray((128, 40 * kib), nl.float32)  # 160 KiB do not fit beside 64 (< 208 usable)
        assert pinned is not None

    # untouched tiles: kept by the strict mode only (the default drops dead allocations)
    with pytest.raises(MemoryPlanError) as e, settings(free_unused_tiles=False):
        run(too_much)
    assert e.value.rule == "SBUF_OVERFLOW"


def test_placed_tiles_free_their_bytes():
    def kernel():
        for _ in range(3):
            t = nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, 0))
            del t
        eight = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
        assert len(eight) == 8

    assert run(kernel).peak_psum_banks == 8


@pytest.mark.parametrize(
    "address, rule",
    [((0,), "ARG"), ((0, -64), "ARG"), ((0, 1.5), "ARG"), ((32, 0), "UNSUPPORTED")],
)
def test_bad_addresses_are_refused(address, rule):
    def kernel():
        nl.ndarray((32, 8), nl.float32, address=address)

    with pytest.raises(NkiValidationError) as e:
        run(kernel)
    assert e.value.rule == rule and "address" in str(e.value)
