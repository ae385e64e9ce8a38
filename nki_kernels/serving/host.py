"""Host side of the serving kernels (torch + NumPy): plan a scheduler step, launch.

A step is vLLM's flattened batch: T query tokens of S sequences, sequence s owning tokens
[query_start_loc[s], query_start_loc[s + 1]) at positions cached_seq_len[s] + i, its keys
being positions [0, cached_seq_len[s] + query_len[s]) of its cache blocks (block_table
row s). The plan:

* work items: sequence s's tokens in tiles of TQ = min(128 // G, longest query) (G = Hq /
  Hkv): one item packs the G heads x TQ tokens of a KV head into R = G * TQ rows;
* key_rows [items, n_steps * kv_tile, 1]: the cache row of each key position (the layout's
  row, see `segmented.py`), -1 past the sequence's length or before the sliding window of
  every row of the item (not read: V zeros, masked);
* rowinfo [items, 128, 4]: per packed row its key interval [lo, hi) (causal: hi =
  position + 1; sliding window W: lo = position - W + 1) and the softmax start (m0, l0):
  (sink / sc, 1) with an attention sink, else (M_INIT, 0);
* write_rows [T, 1]: the cache row of each new token's slot (slot -1: skipped).

Keys are gathered kv_tile (`key_step`: 128..512) at a time; the step count is the
longest sequence's keys over kv_tile: one specialization per (items, kv_tile, step
count); each item runs every step (a shorter sequence's extra steps are masked).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..runtime.host_array import host_numpy
from ..runtime.launch import launch
from .cache_write import cache_write_fwd
from .segmented import M_INIT, serving_attention_fwd

P = 128
LAYOUTS = ("nhd", "hnd")
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


@dataclass(frozen=True)
class CacheGeometry:
    """A cache's layout, block size, pool size and heads."""

    layout: str
    num_blocks: int
    block_size: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, k_cache: Tensor, layout: str) -> CacheGeometry:
        nb, a, b, d = k_cache.shape
        return cls(layout, nb, a, b, d) if layout == "nhd" else cls(layout, nb, b, a, d)

    def row(self, slot: np.ndarray) -> np.ndarray:
        """Layout row (head 0) of flat slots block * block_size + offset (>= 0)."""
        if self.layout == "nhd":
            return slot
        bs = self.block_size
        return (slot // bs) * self.kv_heads * bs + slot % bs


def fp8_max(cache_dtype: torch.dtype) -> float:
    """The largest finite value of an fp8 cache dtype; 0.0 for other dtypes."""
    return FP8_MAX.get(cache_dtype, 0.0)


def kv_scales(
    k_scale: Tensor | None, v_scale: Tensor | None, hkv: int, softmax_scale: float
) -> Tensor:
    """fp32 [Hkv, 4]: (softmax_scale * k_scale, v_scale, 1 / k_scale, 1 / v_scale) per KV
    head (a per-tensor scale is the same for every head; None is 1)."""
    cols = []
    for s in (k_scale, v_scale):
        t = torch.ones(hkv) if s is None else s.detach().to("cpu", torch.float64).reshape(-1)
        cols.append(t.expand(hkv).to(torch.float64))
    ks, vs = cols
    out = torch.stack([softmax_scale * ks, vs, 1.0 / ks, 1.0 / vs], dim=1)
    return out.to(torch.float32).contiguous()


def write_rows(slot_mapping: np.ndarray, geo: CacheGeometry) -> np.ndarray:
    """int32 [T, 1] layout rows of the new tokens' slots (-1 where slot == -1).

    Raises ValueError naming `slot_mapping` for a slot outside the cache or a slot given
    twice."""
    slots = slot_mapping.astype(np.int64).reshape(-1)
    capacity = geo.num_blocks * geo.block_size
    bad = (slots < -1) | (slots >= capacity)
    if bad.any():
        raise ValueError(
            f"slot_mapping: expected slots in [0, {capacity}) (num_blocks * block_size = "
            f"{geo.num_blocks} * {geo.block_size}) or -1 (skip); got {int(slots[bad][0])} at "
            f"token {int(np.flatnonzero(bad)[0])}"
        )
    live = np.flatnonzero(slots >= 0)
    order = live[np.argsort(slots[live], kind="stable")]
    dup = np.flatnonzero(slots[order][1:] == slots[order][:-1])
    if dup.size:
        # two rows scattered to one slot: which lands last is not defined (the DMA queues
        # of a launch, both programs of LNC 2; vLLM's reshape_and_cache, a thread block per
        # token, leaves it undefined too)
        i, j = int(order[dup[0]]), int(order[dup[0] + 1])
        raise ValueError(
            f"slot_mapping: expected each slot at most once (-1, skip, excepted); got slot "
            f"{int(slots[i])} at tokens {i} and {j}"
        )
    rows = np.where(slots >= 0, geo.row(np.maximum(slots, 0)), -1)
    return rows.astype(np.int32).reshape(-1, 1)


@dataclass(frozen=True)
class StepPlan:
    """Work items of one step (see the module docstring)."""

    tq: int  # tokens per item
    kv_tile: int  # key positions per step
    item_tokens: np.ndarray  # int64 [items, tq]: token index, -1 = padding
    key_rows: np.ndarray  # int32 [items, n_steps * kv_tile, 1]
    rowinfo: np.ndarray  # fp32 [items, 128, 4] (m0 / l0 filled by `with_sinks`)
    n_steps: int
    has_key: np.ndarray  # bool [items, tq]: the token sees at least one key

    @property
    def n_items(self) -> int:
        return int(self.item_tokens.shape[0])


def plan_step(
    query_start_loc: np.ndarray,
    cached_seq_len: np.ndarray,
    block_table: np.ndarray,
    geo: CacheGeometry,
    group: int,
    sliding_window: int | None,
) -> StepPlan:
    """Plan the items of one step; raises ValueError naming the argument at fault."""
    qsl = query_start_loc.astype(np.int64)
    ctx = cached_seq_len.astype(np.int64)
    qlen = qsl[1:] - qsl[:-1]
    total = ctx + qlen
    bs, mb = geo.block_size, block_table.shape[1]
    check_keys(qlen, ctx, block_table, geo)
    longest_q = int(qlen.max(initial=1))
    tq = max(1, min(P // group, longest_q))
    items: list[tuple[int, int]] = []  # (sequence, first token of the tile within it)
    for s in range(len(qlen)):
        items.extend((s, j) for j in range(0, int(qlen[s]), tq))
    n_items = len(items)
    longest = max(1, int(total.max(initial=1)))
    kv_tile = key_step(longest)
    n_steps = -(-longest // kv_tile)
    n_keys = n_steps * kv_tile
    tokens = np.full((n_items, tq), -1, dtype=np.int64)
    key_rows = np.full((n_items, n_keys, 1), -1, dtype=np.int32)
    info = np.zeros((n_items, P, 4), dtype=np.float32)
    has_key = np.zeros((n_items, tq), dtype=bool)
    j = np.arange(n_keys)
    for it, (s, j0) in enumerate(items):
        n = min(tq, int(qlen[s]) - j0)
        tokens[it, :n] = qsl[s] + j0 + np.arange(n)
        pos = ctx[s] + j0 + np.arange(n)  # absolute positions of the item's tokens
        hi = pos + 1
        lo = (
            np.zeros_like(pos)
            if sliding_window is None
            else np.maximum(pos - sliding_window + 1, 0)
        )
        # keys before the window of every row of the item are not gathered (row -1: the
        # DMA skips them, their V is zeroed): weight 0 times a non-finite V there (vLLM's
        # never-written null block) would be NaN. Same tiles and steps as reading them.
        live = (j < total[s]) & (j >= int(lo.min()))
        blocks = block_table[s, np.minimum(j // bs, mb - 1)].astype(np.int64)
        rows = geo.row(np.maximum(blocks, 0) * bs + j % bs)
        key_rows[it, :, 0] = np.where(live, rows, -1)
        has_key[it, :n] = hi > lo
        for h in range(group):
            info[it, h * tq : h * tq + n, 0] = lo
            info[it, h * tq : h * tq + n, 1] = hi
    return StepPlan(tq, kv_tile, tokens, key_rows, info, n_steps, has_key)


def check_keys(
    qlen: np.ndarray, ctx: np.ndarray, block_table: np.ndarray, geo: CacheGeometry
) -> None:
    """ValueError naming `cached_seq_len` when a sequence's keys (cached + new) pass its
    block table, or `block_table` when a block a sequence uses is outside the pool."""
    total = ctx.astype(np.int64) + qlen
    bs, mb = geo.block_size, block_table.shape[1]
    if total.size and total.max() > mb * bs:
        s = int(np.argmax(total))
        raise ValueError(
            f"cached_seq_len: sequence {s} needs {int(total[s])} keys (cached {int(ctx[s])} + "
            f"{int(qlen[s])} new), past its block table's {mb} blocks * {bs}"
        )
    used = np.arange(mb)[None, :] < -(-total[:, None] // bs)
    blocks = block_table.astype(np.int64)
    bad = used & ((blocks < 0) | (blocks >= geo.num_blocks))
    if bad.any():
        s, c = (int(x) for x in np.argwhere(bad)[0])
        raise ValueError(
            f"block_table: expected block ids in [0, {geo.num_blocks}) (the pool) for the "
            f"{int(total[s])} keys of sequence {s}; got {int(blocks[s, c])} at column {c}"
        )


def key_step(longest: int) -> int:
    """Keys per step: 512 (one fp32 PSUM bank of scores; the per-step statistics
    amortized over 4 gathers) from 512 keys on, else the power of two >= the longest
    sequence's keys (at least 128)."""
    return 512 if longest >= 512 else max(P, 1 << (longest - 1).bit_length())


def step_key_tiles(
    plan: StepPlan, block_size: int, row_bytes: int = 4
) -> tuple[np.ndarray, np.ndarray | None]:
    """The kernel's per-step index tiles of `plan.key_rows`.

    512-key steps over blocks of a multiple of 4 keys, with key rows (head_dim x the
    cache's element size, `row_bytes`) of whole 32-bit words, are gathered four keys per
    partition (partition p: keys 4p .. 4p + 3, one row of the grouped view): key_rows
    [items, steps, 128, 1] = (row of key 4p) / 4, or -1 when the group is past the
    sequence's length, and key_mask int32 [items, steps, 128, 4] (-1, all bits set: a
    key of the sequence; 0: not). Otherwise key_rows [items, steps, 128, kv_tile / 128]
    (key u * 128 + p at [p, u]) and no mask."""
    n_items, n_steps, kv = plan.n_items, plan.n_steps, plan.kv_tile
    rows = plan.key_rows.reshape(n_items, n_steps, kv)
    n_sub = kv // P
    if kv == 512 and block_size % 4 == 0 and row_bytes % 4 == 0:
        # the group's row (its first key's row / 4) from any of its keys that is read: a
        # group may start before the window or end past the length (a group never
        # straddles a block: block_size % 4 == 0)
        quads = rows.reshape(n_items, n_steps, P, 4)
        cand = np.where(quads >= 0, (quads - np.arange(4)) // 4, -1)
        grouped = cand.max(axis=-1).astype(np.int32)[..., None]
        mask = np.where(rows.reshape(n_items, n_steps, P, 4) >= 0, -1, 0).astype(np.int32)
        return np.ascontiguousarray(grouped), np.ascontiguousarray(mask)
    tiles = rows.reshape(n_items, n_steps, n_sub, P).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(tiles), None


def with_sinks(
    plan: StepPlan, sinks: Tensor | None, scales: Tensor, hkv: int, group: int
) -> np.ndarray:
    """rowinfo [items, Hkv, 128, 4] with the softmax start (m0, l0) of each row: a sink
    joins the denominator as a key of logit `sink` and no value (m0 = sink / sc, l0 = 1)."""
    info = np.repeat(plan.rowinfo[:, None], hkv, axis=1)
    info[:, :, :, 2] = M_INIT
    info[:, :, :, 3] = 0.0
    if sinks is not None:
        sc = scales[:, 0].double().numpy()  # [Hkv]
        snk = sinks.detach().to("cpu", torch.float64).numpy().reshape(hkv, group)
        m0 = snk / sc[:, None]  # [Hkv, G]
        tq = plan.tq
        for h in range(group):
            info[:, :, h * tq : (h + 1) * tq, 2] = m0[None, :, h, None]
            info[:, :, h * tq : (h + 1) * tq, 3] = 1.0
    return info.astype(np.float32)


def write_cache(
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None,
    v_scale: Tensor | None,
    layout: str,
) -> None:
    """Scatter k, v [T, Hkv, D] into the caches at slot_mapping (in place)."""
    geo = CacheGeometry.of(k_cache, layout)
    rows = torch.from_numpy(write_rows(host_numpy(slot_mapping), geo))
    if k.shape[0] == 0:
        return
    scales = kv_scales(k_scale, v_scale, geo.kv_heads, 1.0)
    dev = k_cache.device
    kc, vc = _dense(k_cache), _dense(v_cache)
    launch(
        cache_write_fwd,
        k.reshape(k.shape[0], -1).contiguous(),
        v.reshape(v.shape[0], -1).contiguous(),
        kc,
        vc,
        rows.to(dev),
        scales.to(dev),
        layout,
        fp8_max(k_cache.dtype),
        mutated=(2, 3),
    )
    _write_back(k_cache, kc, v_cache, vc)


def _dense(cache: Tensor) -> Tensor:
    """The cache itself when row-major (the kernel writes it in place), else a copy."""
    return cache if cache.is_contiguous() else cache.contiguous()


def _write_back(k_cache: Tensor, kc: Tensor, v_cache: Tensor, vc: Tensor) -> None:
    """Copy a strided cache's written dense copy back into it."""
    if kc is not k_cache:
        k_cache.copy_(kc)
    if vc is not v_cache:
        v_cache.copy_(vc)


def serving_attention(
    q: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor | None,
    block_table: Tensor,
    cached_seq_len: Tensor,
    query_start_loc: Tensor,
    sinks: Tensor | None,
    k_scale: Tensor | None,
    v_scale: Tensor | None,
    softmax_scale: float | None,
    sliding_window: int | None,
    layout: str,
) -> Tensor:
    """out [T, Hq, D]: write k, v (if given) at slot_mapping, then segmented attention."""
    t_tok, hq, d = q.shape
    geo = CacheGeometry.of(k_cache, layout)
    hkv, group = geo.kv_heads, hq // geo.kv_heads
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    scales = kv_scales(k_scale, v_scale, hkv, scale)
    plan = plan_step(
        host_numpy(query_start_loc), host_numpy(cached_seq_len), host_numpy(block_table),
        geo, group, sliding_window,
    )  # fmt: skip
    rows_w = None
    if k is not None:
        assert slot_mapping is not None and v is not None
        rows_w = torch.from_numpy(write_rows(host_numpy(slot_mapping), geo))
    dev = q.device
    out = q.new_zeros((t_tok, hq, d))
    if plan.n_items == 0:
        if k is not None and v is not None:
            write_cache(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, layout)  # type: ignore[arg-type]
        return out
    row_bytes = d * k_cache.element_size()
    q_t, key_rows, key_mask, info = segmented_inputs(q, plan, sinks, scales, hkv, group,
                                                     geo.block_size, row_bytes)  # fmt: skip
    kc, vc = _dense(k_cache), _dense(v_cache)
    args = [q_t, None, None, kc, vc, None]
    if k is not None and v is not None and t_tok > 0:
        args[1] = k.reshape(t_tok, -1).contiguous()
        args[2] = v.reshape(t_tok, -1).contiguous()
        args[5] = rows_w.to(dev)  # type: ignore[union-attr]
    res = launch(
        serving_attention_fwd, *args, key_rows, key_mask, info, scales.to(dev), layout,
        plan.n_steps, plan.kv_tile, fp8_max(k_cache.dtype), mutated=(3, 4),
    )  # fmt: skip
    _write_back(k_cache, kc, v_cache, vc)
    return scatter_out(res, plan, out, sinks is not None, hkv, group)


def segmented_inputs(
    q: Tensor,
    plan: StepPlan,
    sinks: Tensor | None,
    scales: Tensor,
    hkv: int,
    group: int,
    block_size: int,
    row_bytes: int,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """The segmented kernel's q_t, key_rows, key_mask and rowinfo for `plan` (on q's
    device): Q^T packed per item and KV head, the per-step key tiles (`row_bytes`: a
    cached key row's bytes), each row's bounds and softmax start."""
    t_tok, hq, d = q.shape
    dev = q.device
    tq, n_items = plan.tq, plan.n_items
    tok = torch.from_numpy(plan.item_tokens)
    gather = torch.where(tok >= 0, tok, t_tok).reshape(-1).to(dev)
    q_pad = torch.cat([q, q.new_zeros((1, hq, d))])
    qi = q_pad.index_select(0, gather).reshape(n_items, tq, hkv, group, d)
    q_t = qi.permute(0, 2, 4, 3, 1).reshape(n_items, hkv, d, group * tq).contiguous()
    info = torch.from_numpy(with_sinks(plan, sinks, scales, hkv, group)).to(dev)
    key_rows, key_mask = step_key_tiles(plan, block_size, row_bytes)
    mask = None if key_mask is None else torch.from_numpy(key_mask).to(dev)
    return q_t, torch.from_numpy(key_rows).to(dev), mask, info


def scatter_out(
    res: Tensor, plan: StepPlan, out: Tensor, sinks: bool, hkv: int, group: int
) -> Tensor:
    """The items' [items, Hkv, R, D] results placed at their tokens of out [T, Hq, D];
    rows that see no key (and have no sink) are 0."""
    n_items, tq = plan.n_items, plan.tq
    t_tok, hq, d = out.shape
    r = res.reshape(n_items, hkv, group, tq, d).permute(0, 3, 1, 2, 4)  # [items, tq, Hkv, G, D]
    r = r.reshape(n_items * tq, hq, d)
    if not sinks:
        keep = torch.from_numpy(plan.has_key.reshape(-1)).to(out.device)
        r = torch.where(keep[:, None, None], r, torch.zeros((), dtype=r.dtype, device=r.device))
    tok = torch.from_numpy(plan.item_tokens.reshape(-1)).to(out.device)
    sel = tok >= 0
    out_full = torch.cat([out, out.new_zeros((1, hq, d))])
    idx = torch.where(sel, tok, t_tok)
    out_full = out_full.index_copy(0, idx[sel], r[sel])
    return out_full[:t_tok]


__all__ = [
    "FP8_MAX",
    "LAYOUTS",
    "CacheGeometry",
    "StepPlan",
    "check_keys",
    "fp8_max",
    "kv_scales",
    "plan_step",
    "scatter_out",
    "segmented_inputs",
    "serving_attention",
    "with_sinks",
    "write_cache",
    "write_rows",
]
