"""LayerNorm backward in NKI: dx, dweight and dbias, the cross-row sums reduced on chip.

Algorithm (per row; mean and rstd saved by the forward, g = dy * w, H = hidden size):
    dxm   = (x - mean) * dy                    VectorE scalar_tensor_tensor (fp32)
    dw   += sum_rows(dxm * rstd)               TensorE: dxm block^T @ rstd column (PSUM)
    db   += sum_rows(dy)                       TensorE: dy block^T @ ones column (PSUM)
    B     = sum_h(g * (x - mean)) = sum_h(dxm * w)   tensor_tensor + ScalarE add-reduce
    A     = sum_h(g)                           tensor_tensor + ScalarE add-reduce
    c1    = -rstd^3 * B / H ;  c0 = -rstd * A / H - c1 * mean          per row
    dx    = g * rstd + (x * c1 + c0)           ScalarE activation + VectorE STT
which is dx = rstd * (g - mean_h(g) - xhat * mean_h(g * xhat)) with
xhat = (x - mean) * rstd, rearranged so each full-width step is one instruction.

Loop nest: as rmsnorm_bwd.py (pass 1: loads, weight/bias-gradient terms and row sums;
pass 2: dx), then the PSUM column sums are transposed on TensorE and stored.

Limits: any N >= 1; 1 <= H <= 65536; chunk % 128 == 0 or chunk = H; one NeuronCore.
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
def layer_norm_bwd(
    dy: Any,
    x: Any,
    w: Any,
    has_bias: bool,
    mean: Any,
    rstd: Any,
    rows_per_partition: int = 1,
    chunk: int = 0,
    resident: bool = True,
    bufs: int = 2,
    mul_engine: str = "vector",
) -> Any:
    """LayerNorm backward: returns (dx, dw, db); dw / db are None when w / the bias is absent.

    dy, x: [N, H] in HBM; w: [H] or None; `has_bias` whether the forward had a bias (db in
    w's dtype, else in x's); mean, rstd: [N] fp32 from `layer_norm_fwd`. Schedule
    arguments as in `layer_norm_fwd`.

        for tile in row tiles:
            dxm = (x - mean) * dy ; dw += colsum(dxm * rstd) ; db += colsum(dy)
            A = rowsum(dy * w) ; B = rowsum(dxm * w)
            dx = rstd * dy * w + c1 * x + c0
    """
    n, hdim = x.shape
    c = hdim if chunk <= 0 else min(chunk, hdim)
    assert c == hdim or c % P == 0, f"chunk must be a multiple of {P} or H; got {chunk}"
    assert rows_per_partition >= 1 and bufs >= 1
    dx = nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm)
    gdtype = w.dtype if w is not None else x.dtype
    dw = nl.ndarray((hdim,), dtype=gdtype, buffer=nl.shared_hbm) if w is not None else None
    db = nl.ndarray((hdim,), dtype=gdtype, buffer=nl.shared_hbm) if has_bias else None
    w_sb = load_row_vector(w, hdim) if w is not None else None
    acc_w = colsum_init(hdim) if w is not None else None
    acc_b = colsum_init(hdim) if has_bias else None
    plan = {"chunk": c, "resident": resident, "bufs": bufs, "mul_engine": mul_engine}
    rings: dict[str, list[Any]] = {"x": [], "dy": [], "dx": []}
    for r0, rows, kk in row_tiles(n, rows_per_partition):
        stats = (mean, rstd)
        _ln_bwd_tile(dy, x, w_sb, stats, dx, (acc_w, acc_b), r0, rows, kk, plan, rings)
    if acc_w is not None:
        colsum_store(acc_w, dw)
    if acc_b is not None:
        colsum_store(acc_b, db)
    return dx, dw, db


# --- private helpers ---------------------------------------------------------------------
def _chunk_views(
    x: Any,
    dy: Any,
    xv: Any,
    dyv: Any,
    res: Any,
    rows: int,
    kk: int,
    c0: int,
    cw: int,
    plan: dict[str, Any],
    rings: dict[str, list[Any]],
    load: bool,
) -> tuple[Any, Any]:
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


def _row_sum(dst_col: Any, t: Any) -> None:
    """dst_col = sum over the free dim of t (ScalarE copy with add-reduce, in place)."""
    nisa.activation(
        dst=t,
        op=nl.copy,
        data=t,
        reduce_op=nl.add,
        reduce_res=dst_col,
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )


def _ln_bwd_tile(
    dy: Any,
    x: Any,
    w_sb: Any,
    stats: tuple[Any, Any],
    dx: Any,
    accs: tuple[Any, Any],
    r0: int,
    rows: int,
    kk: int,
    plan: dict[str, Any],
    rings: dict[str, list[Any]],
) -> None:
    hdim = x.shape[1]
    chunks = col_chunks(hdim, plan["chunk"])
    nch, c_max, eng = len(chunks), plan["chunk"], plan["mul_engine"]
    acc_w, acc_b = accs
    xv, dyv, dxv = (
        tile_view(x, r0, rows, kk),
        tile_view(dy, r0, rows, kk),
        tile_view(dx, r0, rows, kk),
    )
    mt = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    rt = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=mt[0:rows, :], src=stats[0][r0 : r0 + rows * kk].reshape((rows, kk)))
    nisa.dma_copy(dst=rt[0:rows, :], src=stats[1][r0 : r0 + rows * kk].reshape((rows, kk)))
    res = None
    if plan["resident"]:
        res = (
            ring_alloc(rings["x"], plan["bufs"], (P, kk, hdim), x.dtype),
            ring_alloc(rings["dy"], plan["bufs"], (P, kk, hdim), dy.dtype),
        )
    a_part = nl.ndarray((P, kk, nch), dtype=nl.float32, buffer=nl.sbuf)
    b_part = nl.ndarray((P, kk, nch), dtype=nl.float32, buffer=nl.sbuf)

    # pass 1: gradient terms of w and b, and the row sums A, B
    for ci, (c0, cw) in enumerate(chunks):
        xc, dyc = _chunk_views(x, dy, xv, dyv, res, rows, kk, c0, cw, plan, rings, True)
        for j in range(kk):
            dxm = nl.ndarray((P, c_max), dtype=nl.float32, buffer=nl.sbuf)
            nisa.scalar_tensor_tensor(
                dst=dxm[0:rows, 0:cw],
                data=xc[:, j, :],
                op0=nl.subtract,
                operand0=mt[0:rows, j : j + 1],
                op1=nl.multiply,
                operand1=dyc[:, j, :],
            )
            if acc_b is not None:
                colsum_add(acc_b, dyc[:, j, :], c0)
            a_col, b_col = a_part[0:rows, j, ci : ci + 1], b_part[0:rows, j, ci : ci + 1]
            if w_sb is None:
                _row_sum(b_col, dxm[0:rows, 0:cw])
                junk = nl.ndarray((P, c_max), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(
                    dst=junk[0:rows, 0:cw],
                    op=nl.copy,
                    data=dyc[:, j, :],
                    reduce_op=nl.add,
                    reduce_res=a_col,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce,
                )
                continue
            wc = w_sb[0:rows, c0 : c0 + cw]
            colsum_add(acc_w, dxm[0:rows, 0:cw], c0, rt[0:rows, j : j + 1])
            p = nl.ndarray((P, c_max), dtype=nl.float32, buffer=nl.sbuf)
            mul_by(p[0:rows, 0:cw], dxm[0:rows, 0:cw], wc, eng)
            _row_sum(b_col, p[0:rows, 0:cw])
            g = nl.ndarray((P, c_max), dtype=nl.float32, buffer=nl.sbuf)
            mul_by(g[0:rows, 0:cw], dyc[:, j, :], wc, eng)
            _row_sum(a_col, g[0:rows, 0:cw])

    c0_col, c1_col = _dx_coefs(a_part, b_part, mt, rt, rows, kk, hdim)

    # pass 2: dx = g * rstd + (x * c1 + c0)
    for c0, cw in chunks:
        xc, dyc = _chunk_views(
            x, dy, xv, dyv, res, rows, kk, c0, cw, plan, rings, not plan["resident"]
        )
        dxt = ring_alloc(rings["dx"], plan["bufs"], (P, kk, c_max), dx.dtype)
        for j in range(kk):
            g = dyc[:, j, :]
            if w_sb is not None:
                gt = nl.ndarray((P, c_max), dtype=nl.float32, buffer=nl.sbuf)
                mul_by(gt[0:rows, 0:cw], g, w_sb[0:rows, c0 : c0 + cw], eng)
                g = gt[0:rows, 0:cw]
            xs = nl.ndarray((P, c_max), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(
                dst=xs[0:rows, 0:cw],
                op=nl.copy,
                data=xc[:, j, :],
                scale=c1_col[0:rows, j : j + 1],
                bias=c0_col[0:rows, j : j + 1],
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


def _dx_coefs(
    a_part: Any, b_part: Any, mt: Any, rt: Any, rows: int, kk: int, hdim: int
) -> tuple[Any, Any]:
    """c1 = -rstd^3 * B / H and c0 = -rstd * A / H - c1 * mean, as [P, kk] fp32."""
    a = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    b = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=a[0:rows, :], op=nl.add, data=a_part[0:rows, :, :], axis=(2,))
    nisa.tensor_reduce(dst=b[0:rows, :], op=nl.add, data=b_part[0:rows, :, :], axis=(2,))
    r2 = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(
        dst=r2[0:rows, :],
        data=rt[0:rows, :],
        op0=nl.multiply,
        operand0=-1.0 / hdim,
        op1=nl.multiply,
        operand1=rt[0:rows, :],
    )  # -rstd^2 / H
    c1 = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=c1[0:rows, :], data1=r2[0:rows, :], data2=rt[0:rows, :], op=nl.multiply)
    nisa.tensor_tensor(dst=c1[0:rows, :], data1=c1[0:rows, :], data2=b[0:rows, :], op=nl.multiply)
    c0 = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(
        dst=c0[0:rows, :],
        data=a[0:rows, :],
        op0=nl.multiply,
        operand0=-1.0 / hdim,
        op1=nl.multiply,
        operand1=rt[0:rows, :],
    )  # -rstd * A / H
    cm = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=cm[0:rows, :], data1=c1[0:rows, :], data2=mt[0:rows, :], op=nl.multiply)
    nisa.tensor_tensor(dst=c0[0:rows, :], data1=c0[0:rows, :], data2=cm[0:rows, :], op=nl.subtract)
    return c0, c1
