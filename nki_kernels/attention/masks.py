"""Attention masks as per-query key intervals, and their tile classification.

Every mask the flash-attention op supports leaves each query row a *contiguous* range of
allowed keys, so a mask is two integers per row, `lo <= key < hi`:

- causal (aligned bottom-right, offset = Sk - Sq): key <= q + offset;
- sliding_window W (implies causal): q + offset - W < key <= q + offset, i.e. the W most
  recent keys including the query's own position;
- kv_lens[b]: key < kv_lens[b] (per-sequence key padding; bucket padding uses it too);
- segment_ids[b, s] (packed documents, Sq == Sk): keys in the query's own document, a
  document being one contiguous run of equal ids.

A row whose interval is empty has no allowed key; the op returns 0 for it and
lse = -inf. `causal_offset` lets `sdpa` use torch's top-left alignment (offset 0).

Tile classification turns intervals into the static plan the kernels unroll: for a
128-query tile and a 128-key sub-tile, SKIP (no row allows any key: never computed),
FULL (every row allows every key: no mask instruction) or PARTIAL (masked on chip with
`range_select` against the row bounds). Rows with an empty interval are "don't care":
their results are replaced by the op, so they never force a tile to be computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TILE = 128  # queries per tile (partitions) and keys per sub-tile (one PE transpose)

SKIP = 0
PARTIAL = 1
FULL = 2


@dataclass(frozen=True)
class MaskSpec:
    """Which masks apply (shapes and flags only; the data lives in the bounds)."""

    causal: bool = False
    sliding_window: int | None = None
    has_kv_lens: bool = False
    has_segments: bool = False

    @property
    def static_only(self) -> bool:
        """True when the mask depends on shapes alone (causal / window / padding)."""
        return not (self.has_kv_lens or self.has_segments)


def segment_runs(segment_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive) of the document run each position belongs to.

    `segment_ids` is [B, S] of ints. Raises ValueError when a document id occurs in two
    separate runs of one sequence (documents must be contiguous).
    """
    seg = np.asarray(segment_ids)
    b, s = seg.shape
    idx = np.broadcast_to(np.arange(s), (b, s))
    new_run = np.ones((b, s), dtype=bool)
    new_run[:, 1:] = seg[:, 1:] != seg[:, :-1]
    run_start = np.maximum.accumulate(np.where(new_run, idx, 0), axis=1)
    ends_here = np.ones((b, s), dtype=bool)
    ends_here[:, :-1] = new_run[:, 1:]
    nxt = np.where(ends_here, idx + 1, s + 1)
    run_end = np.minimum.accumulate(nxt[:, ::-1], axis=1)[:, ::-1]
    for row in range(b):
        starts = seg[row][new_run[row]]
        if len(np.unique(starts)) != len(starts):
            vals, counts = np.unique(starts, return_counts=True)
            dup = int(vals[counts > 1][0])
            raise ValueError(
                f"segment_ids: each document must be one contiguous run; id {dup} appears "
                f"in {int(counts[counts > 1][0])} separate runs in batch row {row}"
            )
    return run_start, run_end


def query_bounds(
    batch: int,
    sq: int,
    sk: int,
    *,
    causal: bool = False,
    sliding_window: int | None = None,
    kv_lens: np.ndarray | None = None,
    segment_ids: np.ndarray | None = None,
    causal_offset: int | None = None,
    sq_valid: int | None = None,
    sk_valid: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Allowed key interval [lo, hi) of every query row: two int64 arrays [batch, sq].

    `sq`, `sk` are the (possibly padded) tensor lengths; `sq_valid` / `sk_valid` the real
    ones (rows >= sq_valid get an empty interval, keys >= sk_valid are never allowed).
    Causal alignment uses the real lengths: offset = sk_valid - sq_valid unless
    `causal_offset` is given.
    """
    sqv = sq if sq_valid is None else sq_valid
    skv = sk if sk_valid is None else sk_valid
    off = skv - sqv if causal_offset is None else causal_offset
    rows = np.arange(sq, dtype=np.int64)
    lo = np.zeros((batch, sq), dtype=np.int64)
    hi = np.full((batch, sq), skv, dtype=np.int64)
    if causal or sliding_window is not None:
        hi = np.minimum(hi, rows + off + 1)
    if sliding_window is not None:
        lo = np.maximum(lo, rows + off - sliding_window + 1)
    if kv_lens is not None:
        hi = np.minimum(hi, np.asarray(kv_lens, dtype=np.int64).reshape(batch, 1))
    if segment_ids is not None:
        start, end = segment_runs(np.asarray(segment_ids)[:, :sq])
        lo = np.maximum(lo, start)
        hi = np.minimum(hi, end)
    hi[:, sqv:] = 0
    lo = np.minimum(np.maximum(lo, 0), sk)
    hi = np.maximum(np.minimum(hi, sk), 0)
    hi = np.maximum(hi, lo)  # empty rows: lo == hi
    return lo, hi


def classify_tiles(lo: np.ndarray, hi: np.ndarray, sk: int) -> np.ndarray:
    """SKIP / PARTIAL / FULL for every (batch, 128-query tile, 128-key sub-tile).

    Returns int8 [batch, ceil(sq / 128), ceil(sk / 128)]. A ragged last tile (fewer
    than 128 rows or keys) is classified on the rows and keys it has.
    """
    batch, sq = lo.shape
    nq, nk = -(-sq // TILE), -(-sk // TILE)
    out = np.zeros((batch, nq, nk), dtype=np.int8)
    k0 = np.arange(nk, dtype=np.int64) * TILE
    k1 = np.minimum(k0 + TILE, sk)
    for t in range(nq):
        rl = lo[:, t * TILE : (t + 1) * TILE]
        rh = hi[:, t * TILE : (t + 1) * TILE]
        live = rh > rl  # [batch, rows]
        big = np.iinfo(np.int64).max
        small = np.iinfo(np.int64).min
        # any row touches the sub-tile
        touch = (rl[:, :, None] < k1[None, None, :]) & (rh[:, :, None] > k0[None, None, :])
        touched = (touch & live[:, :, None]).any(axis=1)
        max_lo = np.where(live, rl, small).max(axis=1, initial=small)
        min_hi = np.where(live, rh, big).min(axis=1, initial=big)
        full = (max_lo[:, None] <= k0[None, :]) & (min_hi[:, None] >= k1[None, :])
        out[:, t, :] = np.where(~touched, SKIP, np.where(full, FULL, PARTIAL))
    return out


def tile_plan(classes: np.ndarray) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """The classification as nested tuples (a hashable, specialization-time argument)."""
    return tuple(tuple(tuple(int(c) for c in row) for row in b) for b in classes)


def kernel_bounds(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The kernels' bounds operand: fp32 [batch, 128, 2, nq] with [b, p, 0/1, t] = lo/hi
    of query t * 128 + p (rows past the end get an empty interval).

    One DMA per batch then lands each query tile's bounds as two (128, 1) columns.
    """
    batch, sq = lo.shape
    nq = -(-sq // TILE)
    out = np.zeros((batch, TILE, 2, nq), dtype=np.float32)
    for which, arr in ((0, lo), (1, hi)):
        padded = np.zeros((batch, nq * TILE), dtype=np.float32)
        padded[:, :sq] = arr
        out[:, :, which, :] = padded.reshape(batch, nq, TILE).transpose(0, 2, 1)
    return out


def dense_mask(lo: np.ndarray, hi: np.ndarray, sk: int) -> np.ndarray:
    """The boolean [batch, sq, sk] mask the bounds describe (for tests and fallbacks)."""
    keys = np.arange(sk)
    return (keys[None, None, :] >= lo[:, :, None]) & (keys[None, None, :] < hi[:, :, None])


def classify_dense(allowed: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """SKIP / PARTIAL / FULL per (batch, 128-query tile, 128-key sub-tile) of a dense mask.

    `allowed` is bool [B, H, Sq, Sk] (B, H may be 1), `bias` None or fp32 of the same
    shape. A tile is SKIP when no head and row allows any of its keys, FULL when every
    head and row allows all of them with zero bias, else PARTIAL. The heads share one
    plan (the kernels' plan is per batch row); returns int8 [B, ceil(Sq/128), ceil(Sk/128)].
    """
    b, h, sq, sk = allowed.shape
    nq, nk = -(-sq // TILE), -(-sk // TILE)
    touched = np.zeros((b, h, nq * TILE, nk * TILE), dtype=bool)
    touched[:, :, :sq, :sk] = allowed
    touched_t = touched.reshape(b, h, nq, TILE, nk, TILE).any(axis=(1, 3, 5))
    full = np.ones((b, h, nq * TILE, nk * TILE), dtype=bool)  # ragged edges: don't care
    full[:, :, :sq, :sk] = allowed if bias is None else allowed & (bias == 0)
    full_t = full.reshape(b, h, nq, TILE, nk, TILE).all(axis=(1, 3, 5))
    return np.where(~touched_t, SKIP, np.where(full_t, FULL, PARTIAL)).astype(np.int8)


def row_intervals(allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """[lo, hi) per row when every row of bool [..., Sq, Sk] allows one contiguous key
    range (an empty row gives lo = hi = 0); None when some row has a gap.

    Masks of this kind (causal, windows, prefix-LM, contiguous documents, key padding)
    are applied on chip by `range_select` against the bounds, with nothing loaded.
    """
    sk = allowed.shape[-1]
    count = allowed.sum(axis=-1)
    lo = np.argmax(allowed, axis=-1)
    hi = sk - np.argmax(allowed[..., ::-1], axis=-1)
    live = count > 0
    if not (count[live] == (hi - lo)[live]).all():
        return None
    return np.where(live, lo, 0).astype(np.int64), np.where(live, hi, 0).astype(np.int64)


def allowed_fraction(classes: np.ndarray) -> float:
    """Fraction of (query tile, key sub-tile) pairs that are computed (not skipped)."""
    return float((classes != SKIP).mean()) if classes.size else 0.0


__all__ = [
    "FULL",
    "PARTIAL",
    "SKIP",
    "TILE",
    "MaskSpec",
    "allowed_fraction",
    "classify_dense",
    "classify_tiles",
    "dense_mask",
    "kernel_bounds",
    "query_bounds",
    "row_intervals",
    "segment_runs",
    "tile_plan",
]
