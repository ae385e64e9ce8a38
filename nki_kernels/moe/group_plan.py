"""Host plans of the grouped matmul (`torch.ops.nki.grouped_mm`): rows cut into blocks.

A grouped matmul gets its rows already sorted by group: group g owns rows
[offs[g-1], offs[g]) (offs are cumulative end offsets, offs[-1] = 0), rows past
offs[G-1] belong to no group. Two plans, both integer bookkeeping on G + 1 ints:

Forward plan (`plan_row_blocks`): every group's rows are cut into blocks of whole
128-row sub-tiles, at most NS = block_rows / 128 sub-tiles each, one group per block:

- a group of n rows has t = ceil(n / 128) sub-tiles and ceil(t / NS) blocks, the
  sub-tiles spread as evenly as possible (block sizes differ by at most one sub-tile),
  so the padding is exactly round_up(n, 128) - n, never a whole padded block, and no
  block is smaller than it must be (a small block re-streams the group's weights for
  few rows, so its weight stream is exposed);
- blocks are ordered by their sub-tile count s, largest first (the kernel runs one device
  loop per count, with s static in its body), then by group;
- `slot_rows[b, p, c]` = the row of sub-tile c, partition p of block b, or M (out of
  range) past the block's rows: the kernel's gathers and scatters skip it;
- `block_group[b, 0]` = the group (weight slice) of block b;
- `kind_bounds[0, j]`: blocks of s = NS - j sub-tiles are [kind_bounds[j],
  kind_bounds[j + 1]) for j < NS; the last kind, [kind_bounds[NS], kind_bounds[NS + 1]),
  are zero blocks: the rows past offs[-1] (in no group), which the kernel writes zeros to
  (an output the kernel allocates is otherwise undefined there);
- empty groups get no block: they cost nothing.

Weight-gradient plan (`plan_row_tiles`): 128-row tiles sorted by group, `tile_rows[t, p,
0]` as above and `group_bounds[0, g]`: group g's tiles are [group_bounds[g],
group_bounds[g + 1]).

Shapes depend on (M, G, block_rows) only: NB = max(1, floor((M + m * (B - 1)) / B))
with m = min(G, M) groups that can be non-empty (each wastes < B slots of a block), plus
one for the zero blocks' run in the forward plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

P = 128  # rows per sub-tile: one row per SBUF partition


def max_blocks(rows: int, groups: int, block_rows: int, tail: bool = False) -> int:
    """Worst-case block count of `plan_row_blocks` (`tail`: with its zero blocks) or of
    `plan_row_tiles` (static: shapes only)."""
    m = min(groups, rows) + (1 if tail else 0)
    return max(1, (rows + m * (block_rows - 1)) // block_rows)


def check_offsets(offs: np.ndarray, rows: int) -> None:
    """offs are non-decreasing, >= 0 and <= rows (ValueError naming `offs` otherwise)."""
    if offs.size == 0:
        return
    if int(offs.min()) < 0 or int(offs[-1]) > rows:
        raise ValueError(
            f"offs: expected cumulative end offsets in [0, {rows}] (rows of the input); got "
            f"min {int(offs.min())}, last {int(offs[-1])}"
        )
    steps = np.diff(offs.astype(np.int64))
    if steps.size and int(steps.min()) < 0:
        at = int(np.argmin(steps)) + 1
        raise ValueError(
            f"offs: expected non-decreasing offsets; got offs[{at - 1}] = {int(offs[at - 1])} "
            f"> offs[{at}] = {int(offs[at])}"
        )


def _starts(offs: np.ndarray) -> np.ndarray:
    o = offs.astype(np.int64)
    return np.concatenate([[0], o[:-1]]) if o.size else o


@dataclass(frozen=True)
class RowBlockPlan:
    """The forward plan (module docstring); numpy int32 arrays."""

    slot_rows: np.ndarray  # [NB, 128, NS]
    block_group: np.ndarray  # [NB, 1]
    kind_bounds: np.ndarray  # [1, NS + 2]
    used_blocks: int  # blocks of some group (zero blocks follow them)
    padded_rows: int  # slots of the used blocks' sub-tiles (128 per sub-tile)


def plan_row_blocks(
    offs: np.ndarray, rows: int, block_rows: int, padded_rows: int | None = None
) -> RowBlockPlan:
    """Blocks of <= block_rows rows (a multiple of 128), see the module docstring; for
    inputs padded to `padded_rows` (>= rows: the shapes and the padding index follow it)."""
    check_offsets(offs, rows)
    ns = block_rows // P
    groups = int(offs.size)
    real_rows = rows
    rows = rows if padded_rows is None else padded_rows
    nb = max_blocks(rows, groups, block_rows, tail=True)
    blocks: list[tuple[int, int, int, int]] = []  # (sub-tiles, group, first row, end row)
    for g, (lo, hi) in enumerate(zip(_starts(offs), offs.astype(np.int64))):
        n = int(hi - lo)
        if n <= 0:
            continue
        tiles = -(-n // P)
        nblk = -(-tiles // ns)
        r = int(lo)
        for j in range(nblk):
            s = tiles // nblk + (1 if j < tiles % nblk else 0)
            blocks.append((s, g, r, min(int(hi), r + s * P)))
            r += s * P
    blocks.sort(key=lambda b: (-b[0], b[1], b[2]))
    padded = sum(b[0] for b in blocks) * P
    last = int(offs[-1]) if offs.size else 0
    for lo in range(last, real_rows, block_rows):  # zero blocks, kind NS
        blocks.append((0, 0, lo, min(real_rows, lo + block_rows)))
    slot_rows = np.full((nb, P, ns), rows, dtype=np.int32)
    block_group = np.zeros((nb, 1), dtype=np.int32)
    counts = np.zeros(ns + 2, dtype=np.int64)
    for b, (s, g, lo, hi) in enumerate(blocks):
        width = s if s else ns
        idx = np.arange(width * P, dtype=np.int64) + lo
        idx[idx >= hi] = rows
        slot_rows[b, :, :width] = idx.reshape(width, P).T
        block_group[b, 0] = g
        counts[ns - s + 1 if s else ns + 1] += 1
    bounds = np.cumsum(counts).astype(np.int32).reshape(1, ns + 2)
    used = len(blocks) - sum(1 for b in blocks if b[0] == 0)
    return RowBlockPlan(slot_rows, block_group, bounds, used, padded)


@dataclass(frozen=True)
class RowTilePlan:
    """The weight-gradient plan (module docstring); numpy int32 arrays."""

    tile_rows: np.ndarray  # [NT, 128, 1]
    group_bounds: np.ndarray  # [1, G + 1]


def plan_row_tiles(offs: np.ndarray, rows: int, padded_rows: int | None = None) -> RowTilePlan:
    """128-row tiles sorted by group (module docstring); `padded_rows` as in
    `plan_row_blocks`."""
    check_offsets(offs, rows)
    groups = int(offs.size)
    rows = rows if padded_rows is None else padded_rows
    nt = max_blocks(rows, groups, P)
    tile_rows = np.full((nt, P, 1), rows, dtype=np.int32)
    bounds = np.zeros((1, groups + 1), dtype=np.int32)
    t = 0
    for g, (lo, hi) in enumerate(zip(_starts(offs), offs.astype(np.int64))):
        for r in range(int(lo), int(hi), P):
            idx = np.arange(r, r + P, dtype=np.int64)
            idx[idx >= hi] = rows
            tile_rows[t, :, 0] = idx
            t += 1
        bounds[0, g + 1] = t
    return RowTilePlan(tile_rows, bounds)
