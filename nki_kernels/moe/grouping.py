"""Token grouping: the block plan the blockwise expert kernels run from (host-side).

The router gives every token k (expert, weight) assignments. The expert kernels want the
assignments grouped by expert and cut into blocks of B token slots that all use one
expert, so each block is one dense [B, H] x [H, 2I] problem. The plan holds:

- slot positions s = b * B + c * 128 + p (block b, 128-token sub-tile c, partition p);
  blocks are ordered by expert, each expert's assignments fill its blocks in token order
  and its last block is padded to B;
- `slot_token[b, p, c]` = the token in slot s, or T (out of range) for a padding slot:
  the kernels' indirect gathers skip it (`oob_mode.skip` into a zeroed tile), so padding
  rows are exact zeros and never reach an output;
- `slot_weight[b, p, c]` = that assignment's routing weight (0 for padding);
- `block_expert[b, 0]`, the expert of block b (0 for unused trailing blocks);
- `block_count[0, 0]`, the number of blocks in use (the kernels' device-loop bound);
- `block_keep[b, 0]` = 0.0 when block b is the first block of its expert, else 1.0 (the
  backward's on-chip weight-gradient sums restart there);
- `token_slot[t, j]` = the slot of token t's j-th assignment, or NB * B when capacity
  dropped it (the combine's gather skips it);
- `num_blocks` = NB, a static worst case, so metadata shapes depend only on (T, k, E, B,
  capacity), never on the routing: NB = min(T*k, floor((N + m(B-1)) / B)) with N the most
  assignments that can be kept and m = min(E, N) the experts that can be non-empty (each
  non-empty expert wastes at most B-1 padding slots). This never exceeds the usual bound
  ceil(T*k / B) + E.
- `static_blocks`: a lower bound on the blocks in use (ceil(N_min / B)); the kernels run
  those as a static loop and the rest as a device loop up to `block_count`.

Variable-size blocks (`sized=True`, the forward's plan): an expert with n kept
assignments has t = ceil(n / 128) sub-tiles cut into ceil(t / NS) blocks whose sub-tile
counts differ by at most one (NS = B / 128), so its padding is round_up(n, 128) - n, never
most of a B-slot block, and no block is smaller than it must be (a small block streams
the expert's weights for few tokens). Blocks are ordered by sub-tile count s, largest
first, then by expert; `kind_bounds[0, j]` for j = 0..NS: blocks of s = NS - j sub-tiles
are [kind_bounds[j], kind_bounds[j + 1]) (kind_bounds[NS] = the used blocks). A block of
s sub-tiles uses slots b * B .. b * B + s * 128 - 1 (the layout stays B slots per block).
The block count per expert, hence NB, is the fixed plan's. The fixed plan's
`kind_bounds` puts every used block in kind NS.

What runs where, and why: the plan is integer bookkeeping on T*k small ints (a stable
sort by expert, per-expert counts, a prefix sum over E), microseconds on the host and a
few KiB to move, while NKI has no sort primitive and the work is negligible next to the
expert matmuls. Everything that touches activations -- gathering token rows by index
(indirect DMA), the expert MLP, and the weighted scatter-add back to tokens -- is NKI.

Capacity order (documented contract, see reference.py): each expert keeps its first C
assignments ranked by (choice rank j, token index t).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .reference import capacity as _capacity

PARTITIONS = 128  # slots per block sub-tile: one token per SBUF partition


@dataclass(frozen=True)
class BlockPlan:
    """The grouped routing of one batch (numpy arrays, shapes in the module docstring)."""

    block_size: int
    num_blocks: int
    static_blocks: int
    used_blocks: int
    slot_token: np.ndarray  # [NB, 128, B/128] int32
    slot_weight: np.ndarray  # [NB, 128, B/128] float32
    block_expert: np.ndarray  # [NB, 1] int32
    block_count: np.ndarray  # [1, 1] int32
    block_keep: np.ndarray  # [NB, 1] float32
    token_slot: np.ndarray  # [T, k] int32
    token_weight: np.ndarray  # [T, k] float32
    expert_counts: np.ndarray  # [E] int64: kept assignments per expert
    kept: np.ndarray  # [T, k] bool
    may_drop: bool  # some token_slot is out of range (capacity drops or padded tokens)
    kind_bounds: np.ndarray  # [1, B/128 + 1] int32: blocks of s = NS - j sub-tiles
    padded_slots: int  # slots of the used blocks' sub-tiles (128 per used sub-tile)


def kept_bounds(num_tokens: int, top_k: int, num_experts: int, cap: int | None) -> tuple[int, int]:
    """(fewest, most) assignments that can survive the capacity for any routing."""
    total = num_tokens * top_k
    if cap is None:
        return total, total
    # fewest: every token picks the same k experts; most: perfectly balanced routing
    return min(total, top_k * min(cap, num_tokens)), min(total, num_experts * cap)


def max_blocks(
    num_tokens: int, top_k: int, num_experts: int, block_size: int, cap: int | None = None
) -> int:
    """Static worst-case block count NB for any routing (see the module docstring)."""
    _, most = kept_bounds(num_tokens, top_k, num_experts, cap)
    nonempty = min(num_experts, most)
    return max(1, min(most, (most + nonempty * (block_size - 1)) // block_size))


def min_blocks(
    num_tokens: int, top_k: int, num_experts: int, block_size: int, cap: int | None = None
) -> int:
    """Blocks in use for every routing: ceil(fewest kept assignments / B)."""
    fewest, _ = kept_bounds(num_tokens, top_k, num_experts, cap)
    return math.ceil(fewest / block_size)


def plan_blocks(
    ids: np.ndarray,
    weights: np.ndarray,
    num_experts: int,
    block_size: int,
    capacity_factor: float | None = None,
    num_tokens: int | None = None,
    min_tokens: int | None = None,
    sized: bool = False,
) -> BlockPlan:
    """Group the assignments (ids, weights: [T, k]) into blocks of `block_size` slots
    (`sized`: variable-size blocks of whole 128-slot sub-tiles, see the module docstring).

    `num_tokens` (>= T, default T) is the padded token count the kernels see: padded
    tokens get no assignment, and the static sizes (NB, token_slot rows) come from it.
    `min_tokens` (<= T, default T) is the smallest token count sharing that static shape;
    `static_blocks` is a lower bound for every such count, so it is static too. The
    capacity is computed from the real T.
    """
    if block_size % PARTITIONS or block_size <= 0:
        raise ValueError(f"block_size: expected a positive multiple of 128; got {block_size}")
    ids = np.asarray(ids, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float32)
    t_count, k = ids.shape
    padded = t_count if num_tokens is None else num_tokens
    lowest = t_count if min_tokens is None else min_tokens
    if padded < t_count or not 1 <= lowest <= t_count:
        raise ValueError(
            f"num_tokens / min_tokens: expected min_tokens <= {t_count} <= num_tokens; got "
            f"{min_tokens} / {num_tokens}"
        )
    if ids.size and (ids.min() < 0 or ids.max() >= num_experts):
        raise ValueError(
            f"ids: expected expert ids in [0, {num_experts}); got {ids.min()}..{ids.max()}"
        )
    cap = None if capacity_factor is None else _capacity(t_count, num_experts, k, capacity_factor)
    # priority (j, t): flatten column-major so a stable sort by expert keeps that order
    flat_e = ids.T.reshape(-1)
    order = np.argsort(flat_e, kind="stable")
    sorted_e = flat_e[order]
    starts = np.searchsorted(sorted_e, np.arange(num_experts))
    rank = np.arange(order.size) - starts[sorted_e]  # position within the expert's queue
    keep_sorted = rank < cap if cap is not None else np.ones(order.size, dtype=bool)
    kept_flat = np.zeros(order.size, dtype=bool)
    kept_flat[order[keep_sorted]] = True
    kept = kept_flat.reshape(k, t_count).T

    counts = np.bincount(ids[kept], minlength=num_experts).astype(np.int64)
    blocks_per_expert = -(-counts // block_size)
    used = int(blocks_per_expert.sum())
    ns = block_size // PARTITIONS
    sizes, pos = _block_sizes(counts, blocks_per_expert, ns, sized)
    cap_hi = None if capacity_factor is None else _capacity(padded, num_experts, k, capacity_factor)
    nb = max_blocks(padded, k, num_experts, block_size, cap_hi)
    assert used <= nb, (used, nb)
    cap_lo = None if capacity_factor is None else _capacity(lowest, num_experts, k, capacity_factor)

    # place each expert's kept assignments in token order
    tok_flat = np.tile(np.arange(t_count), k)  # column-major (j, t) flattening
    kept_idx = np.nonzero(kept_flat)[0]
    e_kept = flat_e[kept_idx]
    t_kept = tok_flat[kept_idx]
    place = np.lexsort((t_kept, e_kept))
    e_sorted, t_sorted, src_sorted = e_kept[place], t_kept[place], kept_idx[place]
    e_start = np.searchsorted(e_sorted, np.arange(num_experts))
    within = np.arange(e_sorted.size) - e_start[e_sorted]
    # expert-major blocks q (expert e's j-th: q = first block of e + j) hold the expert's
    # assignments in order, size_q * 128 each; gpos = the assignment's place in that order
    cap = sizes[pos] * PARTITIONS
    begin = np.cumsum(cap) - cap
    first_q = np.concatenate(([0], np.cumsum(blocks_per_expert)[:-1])).astype(np.int64)
    gpos = begin[first_q[e_sorted]] + within if used else within
    q = np.searchsorted(begin, gpos, side="right") - 1
    slot = pos[q] * block_size + gpos - begin[q]

    slot_token_flat = np.full(nb * block_size, t_count, dtype=np.int32)
    slot_weight_flat = np.zeros(nb * block_size, dtype=np.float32)
    slot_token_flat[slot] = t_sorted
    w_flat = weights.T.reshape(-1)
    slot_weight_flat[slot] = w_flat[src_sorted]

    token_slot = np.full((padded, k), nb * block_size, dtype=np.int32)
    token_slot[:t_count] = _unflatten(np.full(k * t_count, nb * block_size), src_sorted, slot, k)
    token_weight = np.zeros((padded, k), dtype=np.float32)
    token_weight[:t_count] = weights
    block_expert = np.zeros((nb, 1), dtype=np.int32)
    block_expert[pos, 0] = np.repeat(np.arange(num_experts), blocks_per_expert)
    kinds = np.zeros(ns + 1, dtype=np.int64)  # kinds[j + 1]: blocks of NS - j sub-tiles
    np.add.at(kinds, ns - sizes + 1, 1)
    kind_bounds = np.cumsum(kinds).astype(np.int32).reshape(1, ns + 1)
    block_keep = np.zeros((nb, 1), dtype=np.float32)
    block_keep[1:used, 0] = block_expert[1:used, 0] == block_expert[: used - 1, 0]

    def _blocked(a: np.ndarray) -> np.ndarray:
        # slot s = b*B + c*128 + p  ->  [b, p, c]
        return np.ascontiguousarray(a.reshape(nb, ns, PARTITIONS).transpose(0, 2, 1))

    return BlockPlan(
        block_size=block_size,
        num_blocks=nb,
        static_blocks=min_blocks(lowest, k, num_experts, block_size, cap_lo),
        used_blocks=used,
        slot_token=_blocked(slot_token_flat),
        slot_weight=_blocked(slot_weight_flat),
        block_expert=block_expert,
        block_count=np.array([[used]], dtype=np.int32),
        block_keep=block_keep,
        token_slot=token_slot,
        token_weight=token_weight,
        expert_counts=counts,
        kept=kept,
        may_drop=bool(padded > t_count or not kept.all()),
        kind_bounds=kind_bounds,
        padded_slots=int(sizes.sum()) * PARTITIONS,
    )


def _block_sizes(
    counts: np.ndarray, blocks_per_expert: np.ndarray, ns: int, sized: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(sub-tiles of every used block by plan position, the plan position of each
    expert-major block q). Fixed: NS sub-tiles, plan order = expert-major. Sized: each
    expert's ceil(count / 128) sub-tiles split near-equally over its blocks (the larger
    ones first), ordered by size (largest first), then expert-major."""
    size_q: list[int] = []
    for e in np.nonzero(blocks_per_expert)[0]:
        nblk = int(blocks_per_expert[e])
        tiles = -(-int(counts[e]) // PARTITIONS) if sized else nblk * ns
        size_q += [tiles // nblk + (1 if j < tiles % nblk else 0) for j in range(nblk)]
    sq = np.asarray(size_q, dtype=np.int64)
    if sized:
        order = np.lexsort((np.arange(sq.size), -sq))  # plan position -> q
        pos = np.empty_like(order)
        pos[order] = np.arange(sq.size)
    else:
        pos = np.arange(sq.size, dtype=np.int64)
    sizes = np.empty_like(sq)
    sizes[pos] = sq
    return sizes, pos


def _unflatten(base: np.ndarray, where: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
    """Scatter `values` into the column-major (j, t) flattening `base`; return it as [T, k]."""
    out = base.astype(np.int32)
    out[where] = values
    return out.reshape(k, -1).T


def kind_counts(kind_bounds: np.ndarray) -> tuple[int, ...]:
    """Blocks of each size, NS sub-tiles first (a plan's `kind_bounds` [1, NS + 1]): the
    forward kernel's `static_kinds` for this plan."""
    return tuple(int(c) for c in np.diff(np.asarray(kind_bounds).reshape(-1)))


def sized_kinds(counts: np.ndarray, block_size: int) -> tuple[int, ...]:
    """`kind_counts` of the sized plan for per-expert assignment counts (no plan built)."""
    ns = block_size // PARTITIONS
    kinds = [0] * ns
    for n in np.asarray(counts, dtype=np.int64):
        if n <= 0:
            continue
        tiles, nblk = -(-int(n) // PARTITIONS), -(-int(n) // block_size)
        for j in range(nblk):
            kinds[ns - (tiles // nblk + (1 if j < tiles % nblk else 0))] += 1
    return tuple(kinds)


def gate_up_columns(fwd: BlockPlan, bwd: BlockPlan) -> tuple[np.ndarray, np.ndarray]:
    """Where the training forward saves gate / up: (save_cols [NB_fwd, 1] int32, the first
    column of each forward block's rows; save_holes [NC / 128 + 1, 1] int32: [0] = the
    count of holes inside the used backward blocks, [1..] their first columns, and the
    last row the tail's first column) for a saved array [2I, NC], NC = (NB_bwd + 2) *
    B_bwd, whose column is the backward plan's slot.

    Both plans keep the same assignments in the same order per expert, and a forward
    block holds consecutive ranks of one expert (only an expert's last 128-row sub-tile
    has padding), so its rows land on consecutive backward slots, padding included
    (zero rows in the forward: g = u = 0). The forward kernel zeroes what no block
    writes, so the whole array is defined: the holes (128-column sub-tiles past an
    expert's last 128 rows inside its last backward block, which the backward reads as
    padding) one by one, and the tail (the unused blocks and the two spare blocks the
    backward's prefetch reads past the last one: columns from used blocks * B on) in
    long runs.
    """
    kept = fwd.token_slot < fwd.num_blocks * fwd.block_size
    slot_map = np.zeros(fwd.num_blocks * fwd.block_size, dtype=np.int64)
    slot_map[fwd.token_slot[kept]] = bwd.token_slot[kept]
    cols = np.zeros((fwd.num_blocks, 1), dtype=np.int32)
    used = fwd.used_blocks
    cols[:used, 0] = slot_map[np.arange(used) * fwd.block_size]
    ncol = (bwd.num_blocks + 2) * bwd.block_size
    tail = bwd.used_blocks * bwd.block_size
    written = np.zeros(tail // PARTITIONS, dtype=bool)
    sizes = _kind_sizes(fwd.kind_bounds)  # sub-tiles of each used forward block
    for b in range(used):
        first = int(cols[b, 0]) // PARTITIONS
        written[first : first + sizes[b]] = True
    holes_at = np.nonzero(~written)[0] * PARTITIONS
    holes = np.zeros((ncol // PARTITIONS + 1, 1), dtype=np.int32)
    holes[0, 0] = holes_at.size
    holes[1 : holes_at.size + 1, 0] = holes_at
    holes[-1, 0] = tail
    return cols, holes


def _kind_sizes(kind_bounds: np.ndarray) -> np.ndarray:
    """Sub-tiles of each used block of a plan, from its `kind_bounds` (largest first)."""
    counts = kind_counts(kind_bounds)
    ns = len(counts)
    return np.repeat(np.arange(ns, 0, -1), counts)
