"""On-chip memory placement: a first-fit allocator per SBUF/PSUM address space.

Every on-chip allocation gets a physical place: a byte range within each partition of
SBUF, or whole 2 KiB banks of PSUM. A tile dies when the kernel drops its last
reference (CPython frees it at once), and its bytes go back to the free list, so a tile
allocated inside a loop rotates between two places -- the double buffering the compiler
gives such a tile. Placement is what lets the trace name physical regions, and what makes
a tile plan that does not fit on the chip fail here with the numbers.
"""

from __future__ import annotations

import bisect
from typing import Any

from .errors import MemoryPlanError

SBUF_ALIGN = 64  # bytes; allocation granule within a partition (assumed, L)


class FirstFit:
    """First-fit allocator over [0, capacity) with coalescing frees."""

    def __init__(self, capacity: int, granule: int) -> None:
        self.capacity = capacity
        self.granule = granule
        self.free: list[list[int]] = [[0, capacity]]  # sorted [start, end) holes
        self.live = 0
        self.peak = 0

    def round(self, nbytes: int) -> int:
        """`nbytes` rounded up to whole granules (at least one)."""
        g = self.granule
        return max(g, (nbytes + g - 1) // g * g)

    def alloc(self, nbytes: int) -> int | None:
        """Place `nbytes` (rounded up to the granule): the start offset, or None if full."""
        g = self.granule
        size = -(-nbytes // g) * g or g
        free = self.free
        for i, hole in enumerate(free):
            start, end = hole
            if end - start >= size:
                if end - start == size:
                    del free[i]
                else:
                    hole[0] = start + size
                live = self.live = self.live + size
                if live > self.peak:
                    self.peak = live
                return start
        return None

    def release(self, start: int, nbytes: int) -> None:
        """Return a placement to the free list, merging it with adjacent holes."""
        size = self.round(nbytes)
        end = start + size
        self.live -= size
        free = self.free
        i = bisect.bisect_left(free, [start, 0])
        free.insert(i, [start, end])
        if i + 1 < len(free) and free[i][1] == free[i + 1][0]:
            free[i][1] = free[i + 1][1]
            del free[i + 1]
        if i > 0 and free[i - 1][1] == free[i][0]:
            free[i - 1][1] = free[i][1]
            del free[i]


class OnChipMemory:
    """SBUF and PSUM placement for one NeuronCore (one LNC program)."""

    def __init__(self, target_name: str, sbuf_usable: int, psum_banks: int, bank_bytes: int):
        self.target_name = target_name
        self.sbuf = FirstFit(sbuf_usable, SBUF_ALIGN)
        self.psum = FirstFit(psum_banks * bank_bytes, bank_bytes)
        self.bank_bytes = bank_bytes
        self.psum_banks = psum_banks

    def place_sbuf(self, nbytes: int, storage: Any) -> int:
        """Place `nbytes` per partition in SBUF; fail with the numbers if they do not fit."""
        addr = self.sbuf.alloc(nbytes)
        if addr is None:
            what = storage.describe()
            need = self.sbuf.round(nbytes)
            raise MemoryPlanError(
                "SBUF_OVERFLOW",
                f"SBUF overflow on {self.target_name}: allocating {what} needs {need} B per "
                f"partition but {self.sbuf.live} of {self.sbuf.capacity} usable B per partition "
                f"are live (largest free hole {self._largest_hole(self.sbuf)} B)",
            )
        return addr

    def place_psum(self, nbytes: int, storage: Any) -> int:
        """Place whole 2 KiB banks of PSUM; fail with the numbers if they do not fit."""
        addr = self.psum.alloc(nbytes)
        if addr is None:
            what = storage.describe()
            banks = self.psum.round(nbytes) // self.bank_bytes
            live = self.psum.live // self.bank_bytes
            raise MemoryPlanError(
                "PSUM_OVERFLOW",
                f"PSUM overflow on {self.target_name}: allocating {what} needs {banks} bank(s) of "
                f"{self.bank_bytes} B but {live} of {self.psum_banks} banks are live",
            )
        return addr

    @staticmethod
    def _largest_hole(a: FirstFit) -> int:
        return max((e - s for s, e in a.free), default=0)

    @property
    def peak_sbuf_bytes(self) -> int:
        """High-water mark of live SBUF bytes per partition."""
        return self.sbuf.peak

    @property
    def peak_psum_banks(self) -> int:
        """High-water mark of live PSUM banks."""
        return self.psum.peak // self.bank_bytes
