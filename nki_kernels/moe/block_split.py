"""The LNC block split of the MoE backward's phase A: program p of n runs blocks p, p + n, ...

Like `tiles.block_loop`, but over one program's blocks: those below `static_blocks` as a
static loop, the rest as device loops up to the run-time block count, in pairs so that a
body's buffer set (its parity: the block's position among this program's blocks, mod 2)
is static. Under LNC 1 (step 1) it visits the blocks `tiles.block_loop` visits, with the
same parities. Alternate blocks balance the programs under any routing (blocks are sorted
by expert, so a skewed expert's blocks are shared too).
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nl
from .tiles import as_register, used_block_register


def program_blocks() -> tuple[int, int]:
    """(this LNC program's index, the number of programs): (0, 1) under LNC 1."""
    if nl.program_ndim() == 0 or nl.num_programs(0) == 1:
        return 0, 1
    return nl.program_id(0), nl.num_programs(0)


def first_device_block(static_blocks: int, pid: int, step: int) -> int:
    """This program's first block at or past `static_blocks`."""
    return static_blocks + (pid - static_blocks) % step


def split_bounds(block_count: Any, static_blocks: int, pid: int, step: int) -> tuple[Any, Any]:
    """Registers (used blocks, end of this program's device-loop pairs).

    With s the first device block and m = count - s (>= -1: count >= static_blocks), the
    pairs end at s + ((m + step - 1) & -(2 * step)) for step 1 or 2, computed on chip.
    """
    assert step in (1, 2), "split_bounds: LNC 1 or 2"
    cnt = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    count = used_block_register(block_count, cnt)
    start = first_device_block(static_blocks, pid, step)
    end = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=end, data=cnt, op0=nl.subtract, operand0=start - step + 1)
    nisa.tensor_scalar(dst=end, data=end, op0=nl.bitwise_and, operand0=-2 * step)
    nisa.tensor_scalar(dst=end, data=end, op0=nl.add, operand0=start)
    pairs = nisa.register_alloc()
    nisa.register_load(pairs, end)
    return count, pairs


def split_block_loop(
    body: Any, static_blocks: int, nb: int, bounds: Any, pid: int = 0, step: int = 1
) -> None:
    """body(addr, parity, first) for this program's used blocks, in order (addr as in
    `tiles.block_loop`: (register, static extra blocks)); `bounds` from `split_bounds`
    (None when every block is static)."""
    mine = range(pid, min(static_blocks, nb), step)
    for j, b in enumerate(mine):
        body((as_register(b), 0), j % 2, j == 0)
    if static_blocks >= nb:
        return
    count, pairs = bounds
    p0 = len(mine) % 2
    start = first_device_block(static_blocks, pid, step)

    def pair(i: Any) -> None:
        body((i, 0), p0, False)
        body((i, step), 1 - p0, False)

    def last(i: Any) -> None:
        body((i, 0), p0, False)

    nl.fori_loop(start, pairs, pair, step=2 * step)
    nl.fori_loop(pairs, count, last, step=step)
