"""Host plan of the streamed decode kernel (NumPy): tiles, piece tables, masks, merge.

`plan_decode` turns the cache lengths (and a block table) into the kernel's static
arguments (tiles, piece size, slab count, tail flag, key splits) and its index tensors:

- a sequence's keys [0, len) are covered by pieces of C consecutive keys that lie
  entirely inside its length: in a contiguous cache the pieces start at 0, C, 2C, ...
  and, when len is not a multiple of C, one more piece ends exactly at len (its keys
  already covered get position BIG: masked); in a paged cache the pieces lie inside
  blocks (C divides block_size) and the keys of the last partial piece go to the tail
  slab, one key per row;
- a slab's unused entries repeat the sequence's first piece with every position BIG
  (real keys of the same sequence, so no foreign or uninitialized value meets a zero
  weight); a sequence with no full piece points them at any in-bounds row and its
  columns get full = 0 (the kernel keeps its O^T unchanged on those slabs);
- hi[col] = len - Sq + i + 1 (query i of Sq sees keys up to len - Sq + i).

Row indices are in the units of the kernel's gather view (`decode_stream._gather`):
contiguous rows of D elements (b * Hkv * S + key), paged (vLLM) cache slots
(block * block_size + offset), paged head-major rows of D elements
(block * Hkv * block_size + offset).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

P = 128
PSUM_F32 = 512
BIG = 3.0e38
NO_ROW = np.iinfo(np.uint32).max  # a row index past any cache: the tail's unused rows
# SBUF bytes per partition for the K^T / V ring (trn2 leaves ~208 KiB to a kernel; the
# rest holds scores, probabilities and the accumulators)
SLAB_BUDGET = 144 * 1024
LAYOUTS = ("contiguous", "paged", "paged_hm")


@dataclass(frozen=True)
class StreamPlan:
    """Static arguments and index tensors of one `decode_stream_fwd` launch."""

    layout: str
    piece: int
    tiles: tuple[tuple[int, int, int, int], ...]
    n_slabs: int
    tail: bool
    ksplit: int
    ring: int
    idx: np.ndarray  # uint32 [T, n_slabs, 128, nseq]
    kpos: np.ndarray  # fp32 [T, n_slabs, 128, nseq, C]
    tail_idx: np.ndarray  # uint32 [T, 16 * ceil(C / 16), nseq] (NO_ROW: none)
    tail_kpos: np.ndarray  # fp32 [T, 16 * ceil(C / 16), nseq]
    hi: np.ndarray  # fp32 [T, NGR]
    full: np.ndarray  # uint8 [T, NGR]
    # the kernel zeroes the V rows of masked keys (position BIG) in its first zero_masked_v
    # slabs before P V: set where a masked key's V may be non-finite (keys before a sliding
    # window), not by plan_decode
    zero_masked_v: int = 0

    def static_args(self) -> tuple[Any, ...]:
        return (self.layout, self.piece, self.tiles, self.n_slabs, self.tail, self.ksplit,
                self.ring, self.zero_masked_v)  # fmt: skip


def tile_shape(
    hq: int,
    hkv: int,
    sq: int,
    batch: int,
    piece: int,
    d: int = 128,
    itemsize: int = 2,
    ring: int = 2,
) -> tuple[int, int, int]:
    """(KV heads per tile, piece size C, sequences per tile): as many packed columns as
    fit 128 partitions with C * columns <= 512 (one PSUM bank of scores), C first, and
    `ring` slabs of K^T and V (plus fp32's staging rows) within SLAB_BUDGET."""
    rows = hq // hkv * sq
    nh = max([x for x in range(1, hkv + 1) if hkv % x == 0 and x * rows <= P])
    nd = -(-d // P)
    c = min(piece, 1 << int(math.log2(PSUM_F32 // (nh * rows))))
    per_key = nd * P * itemsize + d * itemsize + (nd * P * 4 if itemsize == 4 else 0)
    while c > 1 and ring * nh * c * per_key > SLAB_BUDGET:
        c //= 2
    fit = SLAB_BUDGET // (ring * nh * c * per_key)
    nseq = max(1, min(batch, P // (nh * rows), PSUM_F32 // (c * nh * rows), fit))
    return nh, c, nseq


def plan_decode(
    lens: np.ndarray,
    hq: int,
    hkv: int,
    sq: int,
    layout: str,
    cache_shape: tuple[int, ...],
    block_table: np.ndarray | None = None,
    d: int = 128,
    itemsize: int = 2,
    piece: int = 16,
    ring: int = 2,
    ksplit: int = 1,
) -> StreamPlan:
    """The launch plan for sequences of `lens` keys (see the module docstring)."""
    lens = np.asarray(lens, dtype=np.int64)
    batch = lens.shape[0]
    rows = hq // hkv * sq
    nh, c, nseq = tile_shape(hq, hkv, sq, batch, piece, d, itemsize, ring)
    if layout != "contiguous":
        bs = cache_shape[2] if layout == "paged_hm" else cache_shape[1]
        c = math.gcd(c, bs)
    while True:
        pieces, tails = [], []
        for b in range(batch):
            rows_b, kp_b, tail_b = _sequence_pieces(b, int(lens[b]), c, layout, cache_shape,
                                                    block_table, hkv)  # fmt: skip
            pieces.append((rows_b, kp_b))
            tails.append(tail_b)
        n_slabs = max([-(-len(r) // P) for r, _ in pieces] + [0])
        if n_slabs >= ksplit or c == 1:
            break
        c //= 2  # a key split needs a slab per split: smaller pieces, more slabs
    ksplit = max(1, min(ksplit, n_slabs))  # every split gets at least one slab
    tail = any(len(t) for t in tails)
    tiles = tuple(
        (b0, min(nseq, batch - b0), h0, nh)
        for b0 in range(0, batch, nseq)
        for h0 in range(0, hkv, nh)
    )
    nt, ngr = len(tiles), nseq * nh * rows
    # at least one slab's entries (an NKI tensor has no empty dim; unread when n_slabs = 0)
    # uint32 row indices (an indirect DMA transpose takes no other index dtype); the tail
    # has a multiple of 16 rows (an indirect transpose gathers 16 to 128), unused rows
    # NO_ROW: out of bounds, skipped by the kernel's oob_mode.skip gathers
    idx = np.zeros((nt, max(n_slabs, 1), P, nseq), np.uint32)
    kpos = np.full((nt, max(n_slabs, 1), P, nseq, c), BIG, np.float32)
    tail_rows = -(-c // 16) * 16
    tail_idx = np.full((nt, tail_rows, nseq), NO_ROW, np.uint32)
    tail_kpos = np.full((nt, tail_rows, nseq), BIG, np.float32)
    hi = np.zeros((nt, ngr), np.float32)
    full = np.zeros((nt, ngr), np.uint8)
    i = np.arange(sq)
    for t, (b0, ns, _, _) in enumerate(tiles):
        for sl in range(ns):
            b = b0 + sl
            rows_b, kp_b = pieces[b]
            n = len(rows_b)
            pad_row = rows_b[0] if n else _any_row(b, int(lens[b]), layout, cache_shape,
                                                  block_table, hkv)  # fmt: skip
            ns_ = idx.shape[1]
            flat_rows = np.full(ns_ * P, pad_row, np.int64)
            flat_rows[:n] = rows_b
            idx[t, :, :, sl] = flat_rows.reshape(ns_, P)
            flat_kp = np.full((ns_ * P, c), BIG, np.float32)
            flat_kp[:n] = kp_b
            kpos[t, :, :, sl, :] = flat_kp.reshape(ns_, P, c)
            tr, tk = zip(*tails[b]) if tails[b] else ((), ())
            tail_idx[t, : len(tr), sl] = tr
            tail_kpos[t, : len(tk), sl] = tk
            col0 = sl * nh * rows
            his = np.tile(lens[b] - sq + i + 1, nh * rows // sq).astype(np.float32)
            hi[t, col0 : col0 + nh * rows] = his
            full[t, col0 : col0 + nh * rows] = 1 if n else 0
    return StreamPlan(layout, c, tiles, n_slabs, tail, ksplit, ring, idx, kpos, tail_idx,
                      tail_kpos, hi, full)  # fmt: skip


def _row(b: int, key: int, layout: str, shape: tuple[int, ...], table: Any, hkv: int) -> int:
    """Gather-view row of key `key` of sequence b (head 0)."""
    if layout == "contiguous":
        return (b * hkv) * shape[2] + key
    bs = shape[2] if layout == "paged_hm" else shape[1]
    block = int(table[b, key // bs])
    if layout == "paged_hm":
        return block * hkv * bs + key % bs
    return block * bs + key % bs


def _any_row(b: int, n: int, layout: str, shape: tuple[int, ...], table: Any, hkv: int) -> int:
    """An in-bounds row whose values are discarded (a sequence without a full piece): the
    sequence's own first row where it has keys (its first block when paged), else the
    cache's first row (an empty sequence's output is replaced by 0 on the host)."""
    if layout == "contiguous":
        return b * hkv * shape[2]
    return _row(b, 0, layout, shape, table, hkv) if n else 0


def _sequence_pieces(
    b: int, n: int, c: int, layout: str, shape: tuple[int, ...], table: Any, hkv: int
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, float]]]:
    """(piece rows, key positions [pieces, C], tail (row, position) list) of sequence b."""
    full = n // c
    starts = [j * c for j in range(full)]
    kp = [np.arange(s, s + c, dtype=np.float32) for s in starts]
    tail: list[tuple[int, float]] = []
    rest = range(full * c, n)
    if layout == "contiguous" and full and n % c:  # the piece ending at the length
        s = n - c
        pos = np.arange(s, s + c, dtype=np.float32)
        pos[pos < full * c] = BIG
        starts.append(s)
        kp.append(pos)
    else:
        tail = [(_row(b, j, layout, shape, table, hkv), float(j)) for j in rest]
    rows = np.array([_row(b, s, layout, shape, table, hkv) for s in starts], np.int64)
    kps = np.stack(kp) if kp else np.zeros((0, c), np.float32)
    return rows, kps, tail


def merge_splits(out: np.ndarray, lse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact log-sum-exp merge of per-split (out [S, ...D], lse [S, ...]) partials."""
    if out.shape[0] == 1:
        return out[0], lse[0]
    top = lse.max(axis=0)
    w = np.exp(lse - top[None])
    tot = w.sum(axis=0)
    merged = (w[..., None] * out.astype(np.float32)).sum(axis=0) / tot[..., None]
    return merged, top + np.log(tot)


__all__ = ["LAYOUTS", "StreamPlan", "merge_splits", "plan_decode", "tile_shape"]
