"""On-chip memory placement: an allocator per SBUF/PSUM address space.

Every on-chip allocation gets a physical place: a byte range within each partition of
SBUF, or whole 2 KiB banks of PSUM. A tile dies when the kernel drops its last
reference (CPython frees it at once), and its bytes go back to the free list. Placement
is what lets the trace name physical regions, and what makes a tile plan that does not
fit on the chip fail here with the numbers.

**Rotation** (the default): a new tile goes to the first hole at or after the end of the
previous placement, wrapping around to the start (next-fit), so the bytes a tile just
freed are handed out again last. The compiler "analyzes the memory dependency and
allocates a physical address to each tile" and may give the tiles of a loop body several
physical buffers so that the next iteration's loads overlap this one's compute (NKI
migration guide, block dimensions: "the compiler could choose to allocate 2 physical
tiles ... then the DMA copy from HBM to SBUF can overlap"); the language guide: the
compiler "may reorder operations that have no data dependencies". Next-fit gives
exactly that while memory is free, and falls back to reusing recently freed bytes --
a true memory dependency -- only when the free space has run out. Lowest-address
first-fit (`rotate=False`) instead reuses the previous iteration's buffers at once, a
false cross-iteration dependency; the launcher retries a plan that rotation fragments
into an overflow with first-fit.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from .errors import MemoryPlanError

# Bytes; the granule a tile is placed in within a partition. 64 B (assumed, L) is the
# first choice: the timeline tracks on-chip dependencies per 64 B block, so tiles placed
# on it never share a block.
SBUF_ALIGN = 64
# The finest placement the public sources allow, tried before a plan is called an
# overflow: the NKI front end gives `nl.tile_size.sbuf_min_align` = 1 and
# `psum_min_align` = 4 (leanprover/KLR @ 7ccd18c, KLR/Trace.lean, "Add tile_size based on
# arch"); its access patterns take a tile's free offset to be a whole number of elements
# (KLR/Core/Tensor.lean), nki-library's SbufManager aligns a tile to its dtype size by
# default (d2ad3a57, core/utils/allocator.py), and the widest on-chip dtype is 4 B.
SBUF_MIN_ALIGN = 4


class AddressAllocator:
    """Next-fit (`rotate`, default) or first-fit allocator over [0, capacity) with
    coalescing frees.

    Explicit placements (`nl.ndarray(..., address=)`) sit beside it: they may overlap each
    other and earlier tiles (a deliberate overlap is legal), and later first-fit
    placements avoid them while they live. `live` counts the bytes in use by either.
    """

    def __init__(self, capacity: int, granule: int, rotate: bool = True) -> None:
        self.capacity = capacity
        self.granule = granule
        self.rotate = rotate
        self.cursor = 0  # end of the previous placement: where next-fit starts looking
        self.free: list[list[int]] = [[0, capacity]]  # sorted [start, end) holes
        self.live = 0
        self.peak = 0
        # live explicit placements [start, end) -> how many (placements may coincide)
        self.pinned: dict[tuple[int, int], int] = {}
        self.pinned_extra = 0  # bytes of pinned placements outside first-fit tiles
        # per-byte count of the live pinned placements covering it (created on first pin)
        self._cover: np.ndarray | None = None
        # bytes covered by a pinned placement that lie in free holes, kept up to date by
        # every change of the holes or the cover (what `_recount` adds to `live`): a
        # change costs its own bytes, not the whole free list
        self._covered_free = 0

    def round(self, nbytes: int) -> int:
        """`nbytes` rounded up to whole granules (at least one)."""
        g = self.granule
        return max(g, (nbytes + g - 1) // g * g)

    def alloc(self, nbytes: int) -> int | None:
        """Place `nbytes` (rounded up to the granule): the start offset, or None if full."""
        g = self.granule
        size = -(-nbytes // g) * g or g
        free = self.free
        if self.rotate and self.cursor:
            # from the cursor on (the longest-free bytes), then wrap to the start
            cur = self.cursor
            i0 = bisect.bisect_right(free, [cur, self.capacity + 1])
            if i0 and free[i0 - 1][1] > cur:
                i0 -= 1
            for i in range(i0, len(free)):
                got = self._place(i, max(free[i][0], cur), size)
                if got is not None:
                    return got
        for i in range(len(free)):
            got = self._place(i, free[i][0], size)
            if got is not None:
                return got
        return None

    def alloc_at(self, start: int, nbytes: int) -> int | None:
        """Place `nbytes` (rounded up to the granule) at `start` if those bytes are free
        (a packed plan's address, packing.py): the start, or None."""
        size = -(-nbytes // self.granule) * self.granule or self.granule
        free = self.free
        i = bisect.bisect_right(free, [start, self.capacity + 1]) - 1
        if i < 0 or free[i][1] < start + size or start % self.granule:
            return None
        return self._place(i, start, size)

    def _place(self, i: int, start: int, size: int) -> int | None:
        end = self.free[i][1]
        if self.pinned:
            clear = self._clear_of_pinned(start, end, size)
            if clear is None:
                return None
            start = clear
        if end - start < size:
            return None
        self._take(i, start, size)
        self.live += size
        self.cursor = start + size if start + size < self.capacity else 0
        self._recount()
        return start

    def _take(self, i: int, start: int, size: int) -> None:
        if self._cover is not None:
            self._covered_free -= int(np.count_nonzero(self._cover[start : start + size]))
        hole = self.free[i]
        h0, h1 = hole
        pieces = [p for p in ([h0, start], [start + size, h1]) if p[1] > p[0]]
        self.free[i : i + 1] = pieces

    def _clear_of_pinned(self, start: int, end: int, size: int) -> int | None:
        pos = start
        moved = True
        while moved and pos + size <= end:
            moved = False
            for a, b in self.pinned:
                if a < pos + size and pos < b:
                    pos = -(-b // self.granule) * self.granule
                    moved = True
        return pos if pos + size <= end else None

    def release(self, start: int, nbytes: int) -> None:
        """Return a placement to the free list, merging it with adjacent holes."""
        size = self.round(nbytes)
        end = start + size
        self.live -= size
        if self._cover is not None:
            self._covered_free += int(np.count_nonzero(self._cover[start:end]))
        free = self.free
        i = bisect.bisect_left(free, [start, 0])
        free.insert(i, [start, end])
        if i + 1 < len(free) and free[i][1] == free[i + 1][0]:
            free[i][1] = free[i + 1][1]
            del free[i + 1]
        if i > 0 and free[i - 1][1] == free[i][0]:
            free[i - 1][1] = free[i][1]
            del free[i]
        if self.pinned:
            self._recount()

    def pin(self, start: int, nbytes: int) -> int | None:
        """Place `nbytes` at `start` exactly: the start, or None past the capacity."""
        end = start + self.round(nbytes)
        if start < 0 or end > self.capacity:
            return None
        self.pinned[(start, end)] = self.pinned.get((start, end), 0) + 1
        if self._cover is None:
            self._cover = np.zeros(self.capacity, dtype=np.int32)
        cover = self._cover[start:end]
        self._covered_free += self._in_holes(start, end, cover == 0)
        cover += 1
        self._recount()
        return start

    def unpin(self, start: int, nbytes: int) -> None:
        """Drop an explicit placement."""
        end = start + self.round(nbytes)
        left = self.pinned[(start, end)] - 1
        if left:
            self.pinned[(start, end)] = left
        else:
            del self.pinned[(start, end)]
        assert self._cover is not None
        cover = self._cover[start:end]
        self._covered_free -= self._in_holes(start, end, cover == 1)
        cover -= 1
        self._recount()

    def _in_holes(self, start: int, end: int, mask: np.ndarray) -> int:
        """How many bytes b in [start, end) with mask[b - start] set lie in free holes."""
        free = self.free
        i = max(0, bisect.bisect_right(free, [start, self.capacity + 1]) - 1)
        n = 0
        while i < len(free) and free[i][0] < end:
            h0, h1 = free[i]
            a, b = max(h0, start), min(h1, end)
            if a < b:
                n += int(np.count_nonzero(mask[a - start : b - start]))
            i += 1
        return n

    def _recount(self) -> None:
        """Bytes of pinned placements not inside first-fit tiles (= inside free holes)."""
        self.live -= self.pinned_extra
        extra = self._covered_free if self.pinned else 0
        self.pinned_extra = extra
        self.live += extra
        if self.live > self.peak:
            self.peak = self.live


def _site(storage: Any) -> str:
    """' from file.py:LINE' where the kernel allocated `storage`, when it was recorded."""
    site = getattr(storage, "site", "")
    return f" from {site}" if site else ""


def _overflow(space: AddressAllocator, need: int, rule: str, message: str) -> MemoryPlanError:
    """The error of a failed placement; `fragmented` tells the launcher whether the bytes
    were there in total (so first-fit placement might still fit the plan)."""
    err = MemoryPlanError(rule, message)
    err.fragmented = space.rotate and space.live + need <= space.capacity  # type: ignore[attr-defined]
    return err


class OnChipMemory:
    """SBUF and PSUM placement for one NeuronCore (one LNC program)."""

    def __init__(
        self,
        target_name: str,
        sbuf_usable: int,
        psum_banks: int,
        bank_bytes: int,
        rotate: bool = True,
    ):
        self.target_name = target_name
        self.sbuf = AddressAllocator(sbuf_usable, SBUF_ALIGN, rotate)
        self.psum = AddressAllocator(psum_banks * bank_bytes, bank_bytes, rotate)
        self.bank_bytes = bank_bytes
        self.psum_banks = psum_banks
        # live tiles by storage id: (in PSUM, shape, dtype, bytes per partition, kernel
        # line) -- what an overflow message lists
        self.tiles: dict[int, tuple[bool, Any, Any, int, str]] = {}

    def place_sbuf(
        self, nbytes: int, storage: Any, address: int | None = None, prefer: int | None = None
    ) -> int:
        """Place `nbytes` per partition in SBUF (at byte `address` if given; at `prefer`,
        a packed plan's address, if those bytes are free); fail with the numbers if they
        do not fit."""
        if address is not None:
            got = self.sbuf.pin(address, nbytes)
            if got is None:
                raise MemoryPlanError(
                    "SBUF_OVERFLOW",
                    f"SBUF overflow on {self.target_name}: {storage.describe()} placed at "
                    f"address {address} needs bytes [{address}, {address + nbytes}) per "
                    f"partition but {self.sbuf.capacity} B per partition are usable",
                )
            self._track(storage, False, nbytes)
            return got
        addr = self.sbuf.alloc_at(prefer, nbytes) if prefer is not None else None
        if addr is None:
            addr = self.sbuf.alloc(nbytes)
        if addr is None:
            what = storage.describe()
            need = self.sbuf.round(nbytes)
            raise _overflow(
                self.sbuf,
                need,
                "SBUF_OVERFLOW",
                f"SBUF overflow on {self.target_name}: allocating {what}{_site(storage)} needs "
                f"{need} B per partition but {self.sbuf.live} of {self.sbuf.capacity} usable B "
                f"per partition are live (largest free hole {self._largest_hole(self.sbuf)} B)"
                f"{self._live_list(False)}",
            )
        self._track(storage, False, nbytes)
        return addr

    def place_psum(self, nbytes: int, storage: Any, address: int | None = None) -> int:
        """Place whole 2 KiB banks of PSUM (from byte `address` of the 16 KiB per-partition
        PSUM if given); fail with the numbers if they do not fit."""
        if address is not None:
            bank0 = address // self.bank_bytes * self.bank_bytes
            got = self.psum.pin(bank0, nbytes + address - bank0)
            if got is None:
                raise MemoryPlanError(
                    "PSUM_OVERFLOW",
                    f"PSUM overflow on {self.target_name}: {storage.describe()} placed at "
                    f"address {address} needs bytes [{address}, {address + nbytes}) but PSUM "
                    f"has {self.psum_banks} banks of {self.bank_bytes} B",
                )
            self._track(storage, True, nbytes + address - bank0)
            return address
        addr = self.psum.alloc(nbytes)
        if addr is None:
            what = storage.describe()
            banks = self.psum.round(nbytes) // self.bank_bytes
            live = self.psum.live // self.bank_bytes
            raise _overflow(
                self.psum,
                banks * self.bank_bytes,
                "PSUM_OVERFLOW",
                f"PSUM overflow on {self.target_name}: allocating {what}{_site(storage)} needs "
                f"{banks} bank(s) of {self.bank_bytes} B but {live} of {self.psum_banks} banks "
                f"are live{self._live_list(True)}",
            )
        self._track(storage, True, nbytes)
        return addr

    def _track(self, storage: Any, psum: bool, nbytes: int) -> None:
        space = self.psum if psum else self.sbuf
        site = _site(storage)
        self.tiles[storage.sid] = (psum, storage.shape, storage.dtype, space.round(nbytes), site)

    def _live_list(self, psum: bool, most: int = 8) -> str:
        """'; live: 12 x (128, 512) float32 (2048 B each) from f.py:999, ...': the live
        tiles of one space grouped by shape, dtype and kernel line, largest total first."""
        groups: dict[tuple[str, int, str], int] = {}
        for in_psum, shape, dtype, size, site in self.tiles.values():
            if in_psum == psum:
                key = (f"{shape} {dtype}", size, site)
                groups[key] = groups.get(key, 0) + 1
        if not groups:
            return ""
        order = sorted(groups.items(), key=lambda g: -g[0][1] * g[1])
        parts = [f"{n} x {kind} ({size} B each){site}" for (kind, size, site), n in order[:most]]
        rest = sum(n for _, n in order[most:])
        more = f", and {rest} smaller tile(s)" if rest else ""
        return "; live: " + ", ".join(parts) + more

    def set_granule(self, granule: int) -> None:
        """Place SBUF tiles in `granule`-byte steps (before the first placement only)."""
        if self.sbuf.live or self.sbuf.pinned:
            raise RuntimeError("the SBUF granule changes only before the first placement")
        self.sbuf.granule = granule

    def set_rotation(self, rotate: bool) -> None:
        """Next-fit (True) or lowest-address first-fit (False) placement from now on."""
        self.sbuf.rotate = self.psum.rotate = rotate

    def release(self, psum: bool, addr: int, nbytes: int, pinned: bool, sid: int = 0) -> None:
        """Free a placement made by place_sbuf / place_psum (of storage `sid`)."""
        self.tiles.pop(sid, None)
        space = self.psum if psum else self.sbuf
        if not pinned:
            space.release(addr, nbytes)
        elif psum:
            bank0 = addr // self.bank_bytes * self.bank_bytes
            space.unpin(bank0, nbytes + addr - bank0)
        else:
            space.unpin(addr, nbytes)

    @staticmethod
    def _largest_hole(a: AddressAllocator) -> int:
        return max((e - s for s, e in a.free), default=0)

    @property
    def peak_sbuf_bytes(self) -> int:
        """High-water mark of live SBUF bytes per partition."""
        return self.sbuf.peak

    @property
    def peak_psum_banks(self) -> int:
        """High-water mark of live PSUM banks."""
        return self.psum.peak // self.bank_bytes
