"""The MoE combine on TensorE: out[t] = sum_j w[t, j] * slots[token_slot[t, j]].

Per 128-token tile, the k slot rows of every token are gathered (indirect DMA) into
Y_j [128, cols], and

    out_tile = sum_j diag(w_j)^T Y_j              PSUM, fp32, j ascending

with diag(w_j) the [128, 128] diagonal of the tile's j-th routing weights as the
stationary operand: one matmul per 512 columns per j, where a VectorE combine costs two
passes over every element per j. For 2-byte dtypes the weight is split into w_hi =
dtype(w) and w_lo = dtype(w - w_hi), each product of two 2-byte values is exact in fp32,
so the sum equals fp32 arithmetic with w rounded to ~16 bits (relative error <= 2^-17);
fp32 slots use fp32 matmuls (4x the cycles). Without weights (the backward's sum of dx
slots) the identity is the stationary. One rounding to the output dtype at the end.

Dropped assignments (capacity) and padded tokens point at slot NB * B (grouping.py): the
slot scratch has one extra row there, zeroed by `zero_row` when the launch may drop, so
every gather stays in bounds and needs no zero-filled destination.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nl
from .tiles import PSUM_FP32, P, matmul

COMBINE_BYTES = 4096  # gathered bytes per partition per slot row chunk (bounds SBUF use)


def zero_row(slots: Any) -> None:
    """slots[last row] = 0 (the row dropped assignments gather)."""
    rows, w = slots.shape
    for c0 in range(0, w, COMBINE_BYTES):
        cw = min(COMBINE_BYTES, w - c0)
        z = nl.ndarray((1, COMBINE_BYTES), dtype=slots.dtype, buffer=nl.sbuf)
        nisa.memset(dst=z[:, 0:cw], value=0.0)
        nisa.dma_copy(dst=slots[rows - 1 : rows, c0 : c0 + cw], src=z[:, 0:cw])


def combine(out: Any, slots: Any, token_slot: Any, token_weight: Any | None) -> None:
    """out [T, H] = the weighted (or plain, `token_weight` None) sum of each token's k slot
    rows of `slots` [NB * B + 1, H] (see the module docstring)."""
    t_count, h = out.shape
    k = token_slot.shape[1]
    dt = slots.dtype
    cols = min(h, max(PSUM_FP32, COMBINE_BYTES // dt.itemsize))
    ident = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
    nl.shared_identity_matrix(P, dst=ident)
    plain: Any = None
    if token_weight is None:
        plain = nl.ndarray((P, P), dtype=dt, buffer=nl.sbuf)
        nisa.tensor_copy(dst=plain, src=ident)
    for t0 in range(0, t_count, P):
        rows = min(P, t_count - t0)
        r = slice(0, rows)
        sl = nl.ndarray((P, k), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sl[r, :], src=token_slot[t0 : t0 + rows, :])
        stats: list[list[Any]]
        if token_weight is None:
            stats = [[plain] for _ in range(k)]
        else:
            stats = _diagonals(ident, token_weight, t0, rows, dt)
        for c0 in range(0, h, cols):
            cw = min(cols, h - c0)
            ys = []
            for j in range(k):
                yj = nl.ndarray((P, cols), dtype=dt, buffer=nl.sbuf)
                view = slots.ap(
                    [[h, rows], [1, cw]], offset=c0, vector_offset=sl[r, j : j + 1], indirect_dim=0
                )
                nisa.dma_copy(dst=yj[r, 0:cw], src=view)
                ys.append(yj)
            res = nl.ndarray((P, cols), dtype=out.dtype, buffer=nl.sbuf)
            parity = 0
            for n0 in range(0, cw, PSUM_FP32):
                nw = min(PSUM_FP32, cw - n0)
                ps = nl.ndarray((P, PSUM_FP32), dtype=nl.float32, buffer=nl.psum)
                terms = [(st, yj) for st_j, yj in zip(stats, ys) for st in st_j]
                for q, (st, yj) in enumerate(terms):
                    matmul(ps[r, 0:nw], st[r, r], yj[r, n0 : n0 + nw], q != 0)
                eng = nisa.engine.scalar if parity % 2 else nisa.engine.vector
                nisa.tensor_copy(dst=res[r, n0 : n0 + nw], src=ps[r, 0:nw], engine=eng)
                parity += 1
            nisa.dma_copy(dst=out[t0 : t0 + rows, c0 : c0 + cw], src=res[r, 0:cw])


def _diagonals(ident: Any, token_weight: Any, t0: int, rows: int, dt: Any) -> list[list[Any]]:
    """Per j: the stationary diag(w_j) as [hi, lo] parts in a 2-byte dtype, else [fp32]."""
    k = token_weight.shape[1]
    r = slice(0, rows)
    wt = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt[r, :], src=token_weight[t0 : t0 + rows, :])
    stats = []
    for j in range(k):
        w_col = wt[r, j : j + 1]
        hi = nl.ndarray((P, P), dtype=dt, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=hi[r, r], data=ident[r, r], op0=nl.multiply, operand0=w_col)
        if dt.itemsize == 4:
            stats.append([hi])
            continue
        lo = nl.ndarray((P, P), dtype=dt, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(
            dst=lo[r, r],
            data=ident[r, r],
            op0=nl.multiply,
            operand0=w_col,
            op1=nl.subtract,
            operand1=hi[r, r],
        )
        stats.append([hi, lo])
    return stats
