"""Pinned (explicit `address=`) placements: the allocator's incremental accounting.

`AddressAllocator` counts, in `live`, the bytes of pinned placements that lie outside
first-fit tiles. It keeps that count up to date at every allocation, free, pin and
unpin instead of recounting every free hole each time (what made tracing AWS's
attention_cte, which pins hundreds of thousands of tiles, slow). Checked here against
the recount it replaced, after every operation of seeded random sequences: the count,
`live` and `peak` must be those the recount gives.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from nki_kernels.interp.memory import AddressAllocator


def _recounted(a: AddressAllocator) -> int:
    """The replaced recount: pinned-covered bytes inside the free holes."""
    if not a.pinned or a._cover is None:
        return 0
    covered = a._cover > 0
    return sum(int(np.count_nonzero(covered[h0:h1])) for h0, h1 in a.free)


@pytest.mark.parametrize("seed", range(40))
def test_incremental_pinned_bytes_match_a_full_recount(seed):
    rnd = random.Random(seed)
    a = AddressAllocator(8192, 64, rotate=bool(seed % 2))
    tiles: list[tuple[int, int]] = []
    pins: list[tuple[int, int]] = []
    plain = 0  # bytes of first-fit tiles (rounded), to check `live`
    for _ in range(400):
        r = rnd.random()
        if r < 0.3:
            n = rnd.randrange(1, 900)
            x = a.alloc(n)
            if x is not None:
                tiles.append((x, n))
                plain += a.round(n)
        elif r < 0.5 and tiles:
            x, n = tiles.pop(rnd.randrange(len(tiles)))
            a.release(x, n)
            plain -= a.round(n)
        elif r < 0.8:
            n = rnd.randrange(1, 700)
            start = rnd.randrange(0, 8000) // rnd.choice((1, 64)) * rnd.choice((1, 64))
            if a.pin(start, n) is not None:
                pins.append((start, n))
                if rnd.random() < 0.2 and a.pin(start, n) is not None:  # the same place twice
                    pins.append((start, n))
        elif pins:
            start, n = pins.pop(rnd.randrange(len(pins)))
            a.unpin(start, n)
        if pins:
            assert a.pinned_extra == _recounted(a)
        assert a.live == plain + a.pinned_extra
        assert a.peak >= a.live


def test_a_tile_placed_after_pins_avoids_them_and_frees_count_them_again():
    a = AddressAllocator(4096, 64, rotate=False)
    a.pin(0, 1024)
    assert a.live == 1024
    x = a.alloc(512)
    assert x == 1024  # first-fit steps past the pinned bytes
    a.pin(1024, 256)  # overlaps the tile: not counted twice
    assert a.live == 1024 + 512
    a.release(x, 512)  # the tile's bytes under the pin count as pinned again
    assert a.live == 1024 + 256 == a.pinned_extra
    a.unpin(0, 1024)
    a.unpin(1024, 256)
    assert a.live == 0 and a.peak == 1024 + 512
