"""The MoE combine: out[t] = sum_j w[t, j] * slots[token_slot[t, j]].

Per 128-token tile, the k slot rows of every token are gathered (indirect DMA) into
Y_j [128, cols] (tokens on partitions) and combined row by row on the engines:

    acc = w_0 * Y_0                       ScalarE (activation copy, per-partition scale)
    acc = w_j * Y_j + acc, j = 1..k-1     VectorE (scalar_tensor_tensor), j ascending

in fp32, one rounding to the output dtype at the last step. Each output row reads only
its own token's rows and weights: a NaN / Inf stays in its token (a TensorE combine
with diag(w) stationaries would multiply it by the zeros off the diagonal, 0 * NaN,
into all 128 tokens of the tile). Without weights (the backward's sum of dx slots) the
same chain adds.

Dropped assignments (capacity) and padded tokens point at slot NB * B (grouping.py): the
slot scratch has one extra row there, zeroed by `zero_row` when the launch may drop, so
every gather stays in bounds and needs no zero-filled destination.
"""

from __future__ import annotations

from typing import Any

from ..dtypes import dtype_bytes
from ..nki import nisa, nl
from .tiles import PSUM_FP32, P

COMBINE_BYTES = 4096  # gathered bytes per partition per slot row chunk (bounds SBUF use)


def zero_row(slots: Any) -> None:
    """slots[last row] = 0 (the row dropped assignments gather)."""
    rows, w = slots.shape
    for c0 in range(0, w, COMBINE_BYTES):
        cw = min(COMBINE_BYTES, w - c0)
        z = nl.ndarray((1, COMBINE_BYTES), dtype=slots.dtype, buffer=nl.sbuf)
        nisa.memset(dst=z[:, 0:cw], value=0.0)
        nisa.dma_copy(dst=slots[rows - 1 : rows, c0 : c0 + cw], src=z[:, 0:cw])


def combine(
    out: Any,
    slots: Any,
    token_slot: Any,
    token_weight: Any | None,
    col_range: tuple[int, int] | None = None,
    tiles: tuple[int, int] = (0, 1),
) -> None:
    """out [T, H] = the weighted (or plain, `token_weight` None) sum of each token's k slot
    rows of `slots` [NB * B + 1, H] (see the module docstring); only columns
    `col_range` = (lo, hi) when given, and only the 128-token tiles first, first + step,
    ... for `tiles` = (first, step) (an LNC program's share)."""
    t_count, h = out.shape
    first, step = tiles
    lo, hi = col_range if col_range is not None else (0, h)
    k = token_slot.shape[1]
    dt = slots.dtype
    cols = min(h, max(PSUM_FP32, COMBINE_BYTES // dtype_bytes(dt)))
    chunks = [(t0, c0) for t0 in range(first * P, t_count, step * P) for c0 in range(lo, hi, cols)]
    meta: dict[int, tuple[Any, Any]] = {}

    def load(t0: int, c0: int) -> list[Any]:
        """The k gathered slot rows of chunk (t0, c0) (and, first, the tile's slots and
        weights)."""
        rows, cw = min(P, t_count - t0), min(cols, hi - c0)
        r = slice(0, rows)
        if t0 not in meta:
            sl = nl.ndarray((P, k), dtype=nl.int32, buffer=nl.sbuf)
            nisa.dma_copy(dst=sl[r, :], src=token_slot[t0 : t0 + rows, :])
            wt: Any = None
            if token_weight is not None:
                wt = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
                nisa.dma_copy(dst=wt[r, :], src=token_weight[t0 : t0 + rows, :])
            meta[t0] = (sl, wt)
        sl = meta[t0][0]
        ys = []
        for j in range(k):
            yj = nl.ndarray((P, cols), dtype=dt, buffer=nl.sbuf)
            view = slots.ap(
                [[h, rows], [1, cw]], offset=c0, vector_offset=sl[r, j : j + 1], indirect_dim=0
            )
            nisa.dma_copy(dst=yj[r, 0:cw], src=view)
            ys.append(yj)
        return ys

    # the next chunk's gathers are issued before this chunk's sum and store: the DMA
    # engines, the combine's bottleneck with VectorE, then never wait for VectorE
    ahead = load(*chunks[0]) if chunks else []
    for q, (t0, c0) in enumerate(chunks):
        ys = ahead
        if q + 1 < len(chunks):
            ahead = load(*chunks[q + 1])
        rows, cw = min(P, t_count - t0), min(cols, hi - c0)
        r = slice(0, rows)
        wt = meta[t0][1]
        res = nl.ndarray((P, cols), dtype=out.dtype, buffer=nl.sbuf)
        acc = res
        if k > 1:
            acc = nl.ndarray((P, cols), dtype=nl.float32, buffer=nl.sbuf)
        for j in range(k):
            dst = res if j == k - 1 else acc
            _accumulate(dst[r, 0:cw], ys[j][r, 0:cw], acc[r, 0:cw], wt, r, j)
        nisa.dma_copy(dst=out[t0 : t0 + rows, c0 : c0 + cw], src=res[r, 0:cw])


def _accumulate(dst: Any, y: Any, acc: Any, wt: Any | None, r: slice, j: int) -> None:
    """dst = w_j * y (+ acc for j > 0), row-wise: w_j is a per-partition scalar."""
    if j == 0:
        if wt is None:
            nisa.tensor_copy(dst=dst, src=y, engine=nisa.engine.scalar)
        else:
            nisa.activation(dst=dst, op=nl.copy, data=y, scale=wt[r, 0:1])
        return
    if wt is None:
        nisa.tensor_tensor(dst=dst, data1=y, data2=acc, op=nl.add)
        return
    nisa.scalar_tensor_tensor(
        dst=dst, data=y, op0=nl.multiply, operand0=wt[r, j : j + 1], op1=nl.add, operand1=acc
    )
