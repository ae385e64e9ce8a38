"""RMSNorm backward in NKI: dx and the weight gradient, both reduced on chip.

Algorithm (per row; rstd saved by the forward, g = dy * w, H = hidden size):
    dxy   = dy * x                             tensor_tensor (fp32)
    dw   += sum_rows(dxy * rstd)               TensorE: dxy block^T @ rstd column into one
                                               PSUM bank, accumulated over the whole kernel
    s     = sum_h(g * x) = sum_h(dxy * w)      tensor_tensor + ScalarE add-reduce
    coef  = -rstd^3 * s / H                    per row, [rows, kk] fp32
    dx    = g * rstd + x * coef                ScalarE (x * coef) + VectorE (g * rstd + .)
which is dx = rstd * (g - xhat * mean(g * xhat)) with xhat = x * rstd, rearranged so that
every full-width step is one instruction and the row reduction needs one tensor_tensor.

Loop nest (same row tiles and column chunks as the forward):
    for each row tile (rows partitions x kk rows per partition):
        load rstd[tile]
        pass 1, per chunk: load x, dy; per row group j: dxy, column sums (TensorE), s
        coef from s
        pass 2, per chunk: [streaming: reload x, dy]; per row group j: dx; store dx
    transpose the PSUM column sums on TensorE and store dw (cast to w.dtype by the DMA)
All intermediates are fp32; dx is rounded once, to x.dtype.

Limits: any N >= 1 (ragged tail sliced) and 1 <= H <= 65536 (the column sums must fit one
PSUM bank); column chunks must start at multiples of 128 (chunk % 128 == 0 or chunk = H);
one NeuronCore (the weight gradient is reduced within the core; no LNC split).
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl
from .tiling import (
    P,
    col_chunks,
    colsum_add,
    colsum_init,
    colsum_store,
    load_row_vector,
    mul_by,
    ring_alloc,
    row_tiles,
    tile_view,
)


@nki.jit
def rms_norm_bwd(
    dy: Any,
    x: Any,
    w: Any,
    rstd: Any,
    rows_per_partition: int = 1,
    chunk: int = 0,
    resident: bool = True,
    bufs: int = 2,
    mul_engine: str = "vector",
) -> Any:
    """RMSNorm backward: returns (dx [N, H] in x.dtype, dw [H] in w.dtype), or dx if w is None.

    dy, x: [N, H] in HBM; w: [H] or None; rstd: [N] fp32 from `rms_norm_fwd`. Schedule
    arguments as in `rms_norm_fwd` (`mul_engine` runs the two tensor_tensor multiplies).

        for tile in row tiles:
            dxy = dy * x ; dw += colsum(dxy * rstd) ; s = rowsum(dxy * w)
            dx = dy * w * rstd - x * rstd^3 * s / H
    """
    n, hdim = x.shape
    c = hdim if chunk <= 0 else min(chunk, hdim)
    assert c == hdim or c % P == 0, f"chunk must be a multiple of {P} or H; got {chunk}"
    assert rows_per_partition >= 1 and bufs >= 1
    dx = nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm)
    dw = nl.ndarray((hdim,), dtype=w.dtype, buffer=nl.shared_hbm) if w is not None else None
    w_sb = load_row_vector(w, hdim) if w is not None else None
    acc = colsum_init(hdim) if w is not None else None
    plan = {"chunk": c, "resident": resident, "bufs": bufs, "mul_engine": mul_engine}
    rings: dict[str, list[Any]] = {"x": [], "dy": [], "dx": []}
    for r0, rows, kk in row_tiles(n, rows_per_partition):
        _bwd_tile(dy, x, w_sb, rstd, dx, acc, r0, rows, kk, plan, rings)
    if acc is None:
        return dx
    colsum_store(acc, dw)
    return dx, dw


# --- private helpers ---------------------------------------------------------------------
def _load_pair(
    x: Any,
    dy: Any,
    xv: Any,
    dyv: Any,
    res: tuple[Any, Any] | None,
    rows: int,
    kk: int,
    c0: int,
    cw: int,
    plan: dict[str, Any],
    rings: dict[str, list[Any]],
    load: bool,
) -> tuple[Any, Any]:
    """x and dy of one column chunk as [rows, kk, cw] SBUF views (DMA'd when `load`)."""
    if res is not None:
        xc, dyc = res[0][0:rows, :, c0 : c0 + cw], res[1][0:rows, :, c0 : c0 + cw]
    else:
        c_max = plan["chunk"]
        xt = ring_alloc(rings["x"], plan["bufs"], (P, kk, c_max), x.dtype)
        dyt = ring_alloc(rings["dy"], plan["bufs"], (P, kk, c_max), dy.dtype)
        xc, dyc = xt[0:rows, :, 0:cw], dyt[0:rows, :, 0:cw]
    if load:
        nisa.dma_copy(dst=xc, src=xv[:, :, c0 : c0 + cw])
        nisa.dma_copy(dst=dyc, src=dyv[:, :, c0 : c0 + cw])
    return xc, dyc


def _bwd_tile(
    dy: Any,
    x: Any,
    w_sb: Any,
    rstd: Any,
    dx: Any,
    acc: Any,
    r0: int,
    rows: int,
    kk: int,
    plan: dict[str, Any],
    rings: dict[str, list[Any]],
) -> None:
    hdim = x.shape[1]
    chunks = col_chunks(hdim, plan["chunk"])
    nch = len(chunks)
    c_max = plan["chunk"]
    xv, dyv, dxv = (
        tile_view(x, r0, rows, kk),
        tile_view(dy, r0, rows, kk),
        tile_view(dx, r0, rows, kk),
    )

    rt = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=rt[0:rows, :], src=rstd[r0 : r0 + rows * kk].reshape((rows, kk)))
    res = None
    if plan["resident"]:
        res = (
            ring_alloc(rings["x"], plan["bufs"], (P, kk, hdim), x.dtype),
            ring_alloc(rings["dy"], plan["bufs"], (P, kk, hdim), dy.dtype),
        )
    s = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    part = s if nch == 1 else nl.ndarray((P, kk, nch), dtype=nl.float32, buffer=nl.sbuf)

    # pass 1: weight-gradient terms, their column sums, and s = sum(dy * w * x) per row
    for ci, (c0, cw) in enumerate(chunks):
        xc, dyc = _load_pair(x, dy, xv, dyv, res, rows, kk, c0, cw, plan, rings, True)
        for j in range(kk):
            dxy = nl.ndarray((P, c_max), dtype=nl.float32, buffer=nl.sbuf)
            mul_by(dxy[0:rows, 0:cw], dyc[:, j, :], xc[:, j, :], plan["mul_engine"])
            red = dxy
            if w_sb is not None:
                colsum_add(acc, dxy[0:rows, 0:cw], c0, rt[0:rows, j : j + 1])
                red = nl.ndarray((P, c_max), dtype=nl.float32, buffer=nl.sbuf)
                mul_by(
                    red[0:rows, 0:cw],
                    dxy[0:rows, 0:cw],
                    w_sb[0:rows, c0 : c0 + cw],
                    plan["mul_engine"],
                )
            dst_col = s[0:rows, j : j + 1] if nch == 1 else part[0:rows, j, ci : ci + 1]
            nisa.activation(
                dst=red[0:rows, 0:cw],
                op=nl.copy,
                data=red[0:rows, 0:cw],
                reduce_op=nl.add,
                reduce_res=dst_col,
                reduce_cmd=nisa.reduce_cmd.reset_reduce,
            )
    if nch > 1:
        nisa.tensor_reduce(dst=s[0:rows, :], op=nl.add, data=part[0:rows, :, :], axis=(2,))

    # coef = -rstd^3 * s / H
    coef = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(
        dst=coef[0:rows, :],
        data=rt[0:rows, :],
        op0=nl.multiply,
        operand0=-1.0 / hdim,
        op1=nl.multiply,
        operand1=rt[0:rows, :],
    )
    nisa.tensor_tensor(
        dst=coef[0:rows, :], data1=coef[0:rows, :], data2=rt[0:rows, :], op=nl.multiply
    )
    nisa.tensor_tensor(
        dst=coef[0:rows, :], data1=coef[0:rows, :], data2=s[0:rows, :], op=nl.multiply
    )

    # pass 2: dx = g * rstd + x * coef
    for c0, cw in chunks:
        xc, dyc = _load_pair(
            x, dy, xv, dyv, res, rows, kk, c0, cw, plan, rings, not plan["resident"]
        )
        dxt = ring_alloc(rings["dx"], plan["bufs"], (P, kk, c_max), dx.dtype)
        for j in range(kk):
            g = dyc[:, j, :]
            if w_sb is not None:
                gt = nl.ndarray((P, c_max), dtype=nl.float32, buffer=nl.sbuf)
                mul_by(gt[0:rows, 0:cw], g, w_sb[0:rows, c0 : c0 + cw], plan["mul_engine"])
                g = gt[0:rows, 0:cw]
            xs = nl.ndarray((P, c_max), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(
                dst=xs[0:rows, 0:cw], op=nl.copy, data=xc[:, j, :], scale=coef[0:rows, j : j + 1]
            )
            nisa.scalar_tensor_tensor(
                dst=dxt[0:rows, j, 0:cw],
                data=g,
                op0=nl.multiply,
                operand0=rt[0:rows, j : j + 1],
                op1=nl.add,
                operand1=xs[0:rows, 0:cw],
            )
        nisa.dma_copy(dst=dxv[:, :, c0 : c0 + cw], src=dxt[0:rows, :, 0:cw])
