"""Placing a replayed plan's SBUF tiles with every lifetime known in advance.

The interpreter places tiles online, in program order (memory.py): a tile goes to a free
hole when it starts, knowing nothing of the tiles still to come, so the holes that tiles
of different sizes leave behind can fragment SBUF until a large tile finds enough bytes
in total but no hole of its size. The compiler's default allocator does not place tiles
that way: it "allocates the tiles with graph coloring after it traces the kernel" (NKI
`nki.compiler.Allocation.COLORING`), i.e. with every tile's live range known. As the last
resort before a plan is called an overflow (launch.py), the replay therefore computes
each SBUF tile's address from the recorded live ranges, largest tile first (then longest
range), at the lowest address clear of every tile already given one whose live range
overlaps; the placing pass puts each tile there, and falls back to the online allocator
for a tile whose address is taken (a tile the recording did not see). Which packing the
compiler's coloring finds is not documented; this one is a common heuristic for the same
problem (assumed, M). It never places two tiles live at the same time on the same bytes,
so it accepts no plan whose live bytes exceed SBUF at any point. `last_resorts` runs the
replay's last resorts in order: fills and loads deferred (liveness.py), then packed.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any

from .errors import MemoryPlanError
from .liveness import Liveness
from .memory import SBUF_ALIGN, SBUF_MIN_ALIGN

# time buckets of the overlap index: ranges are looked up by the buckets they cover
_BUCKETS = 4096


def pack(
    items: Iterable[tuple[Hashable, int, int, int]], capacity: int, granule: int
) -> dict[Hashable, int] | None:
    """Addresses for `items` (ident, bytes, first slot, last slot; both slots included)
    such that no two whose slot ranges overlap share a byte, each in [0, capacity) and a
    multiple of `granule`; None if some item does not fit."""
    todo = sorted(items, key=lambda it: (-_round(it[1], granule), it[2] - it[3], it[2]))
    if not todo:
        return {}
    top = max(it[3] for it in todo)
    width = max(1, (top + 1) // _BUCKETS + 1)
    buckets: dict[int, list[int]] = {}
    placed: list[tuple[int, int, int, int]] = []  # (lo, hi, address, end)
    out: dict[Hashable, int] = {}
    for ident, nbytes, lo, hi in todo:
        size = _round(nbytes, granule)
        b0, b1 = lo // width, hi // width
        seen: set[int] = set()
        busy: list[tuple[int, int]] = []
        for b in range(b0, b1 + 1):
            for j in buckets.get(b, ()):
                if j in seen:
                    continue
                seen.add(j)
                plo, phi, a, e = placed[j]
                if plo <= hi and lo <= phi:
                    busy.append((a, e))
        addr = _lowest_gap(busy, size)
        if addr + size > capacity:
            return None
        out[ident] = addr
        j = len(placed)
        placed.append((lo, hi, addr, addr + size))
        for b in range(b0, b1 + 1):
            buckets.setdefault(b, []).append(j)
    return out


def _round(nbytes: int, granule: int) -> int:
    return max(granule, -(-nbytes // granule) * granule)


def _lowest_gap(busy: list[tuple[int, int]], size: int) -> int:
    """The lowest address at which `size` bytes overlap none of the `busy` [a, e) spans
    (their ends are multiples of the granule, so the result is too)."""
    pos = 0
    for a, e in sorted(busy):
        if a - pos >= size:
            return pos
        pos = max(pos, e)
    return pos


def last_resorts(
    recorder: Liveness,
    free_unused: bool,
    placed: Callable[..., Any],
    failed: MemoryPlanError,
    drop: Callable[[BaseException], None],
) -> tuple[Any, Any]:
    """The compiler's schedule and allocation beyond the replay (liveness.py, this file)
    for a launch (`placed(plan, granule)`, launch.py) whose plan overflows SBUF with
    every tile freed after its last use: fills and loads deferred to their first reader,
    then, with every live range known, the tiles packed largest first; each at 64-byte,
    then 4-byte alignment. The result and the launch; the last overflow (saying what was
    tried) if none fits."""
    moved = recorder.deferred_plan()
    counts, spans, ranges = moved or (recorder.counts, recorder.spans, recorder.live_ranges())
    for packed in (False, True):
        if not packed and moved is None:
            continue  # the replay's own plan, which just overflowed
        plan = Liveness(
            counts,
            free_unused=free_unused,
            reorder=True,
            spans=spans,
            ranges=ranges,
            sizes=recorder.sizes if packed else None,
        )
        for granule in (SBUF_ALIGN, SBUF_MIN_ALIGN):
            try:
                result, launch = placed(plan, granule)
                return result, launch
            except MemoryPlanError as e:
                if e.rule != "SBUF_OVERFLOW":
                    raise
                drop(e)  # the failed attempt's frames, before the next one runs
                failed = e
    failed.tried = (  # type: ignore[attr-defined]
        ", fills and loads deferred to their first reader" if moved is not None else ""
    ) + ", packed with every live range known"
    raise failed
