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
    each_chunk,
    identity,
    load_row_vector,
    prefetch_take,
    ring_alloc,
    rings,
    row_plan,
    row_segments,
    rows_view,
    run_rows,
    stats_load,
    temp,
    to_psum,
    tt_split,
    tt_split_psum,
)

PSUM_COLS = 512  # fp32 columns of one PSUM bank
PSUM_RING = 3  # PSUM banks x * coef rotates through (the column sums hold one more)
NSTAGES = 3  # A: loads, weight-gradient terms, row sums; B: coef; C: dx and its store


@nki.jit
def rms_norm_bwd(
    dy: Any,
    x: Any,
    w: Any,
    rstd: Any,
    dh: Any = None,
    rows_per_partition: int = 1,
    chunk: int = 0,
    resident: bool = True,
    bufs: int = 4,
    gpsimd_eighths: int = 0,
) -> Any:
    """RMSNorm backward: returns (dx [N, H] in x.dtype, dw [H] in w.dtype), or dx if w is None.

    With `dh` ([N, H], x.dtype) the kernel is the backward of the fused residual add +
    RMSNorm (x is then h = x + residual, dh the gradient of the h output): dx + dh is the
    gradient of both x and the residual.

    dy, x: [N, H] in HBM; w: [H] or None; rstd: [N] fp32 from `rms_norm_fwd`. Schedule
    arguments as in `rms_norm_fwd` (`gpsimd_eighths` splits the tensor_tensor multiplies).

        for tile in row tiles:
            dxy = dy * x ; dw += colsum(dxy * rstd) ; s = rowsum(dxy * w)
            dx = dy * w * rstd - x * rstd^3 * s / H
    """
    n, hdim = x.shape
    plan = row_plan(
        hdim,
        rows_per_partition,
        chunk,
        resident,
        bufs,
        NSTAGES,
        True,
        gpsimd_eighths=gpsimd_eighths,
    )
    dx = nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm)
    dw = nl.ndarray((hdim,), dtype=w.dtype, buffer=nl.shared_hbm) if w is not None else None
    ctx = {
        "dx": dx,
        "stats": (rstd,),
        "plan": plan,
        "chunks": col_chunks(hdim, plan["chunk"]),
        "w_sb": load_row_vector(w, hdim),
        "acc": colsum_init(hdim) if w is not None else None,
        "eye": identity(dy.dtype) if dy.dtype != nl.float32 else None,
        "rings": rings(),
        "loads": (("x", x), ("dy", dy), ("dh", dh)),
    }
    run_rows(ctx, row_segments(n, plan["k"]), [_stage_a, _stage_b, _stage_c], stats_load)
    if w is None:
        return dx
    colsum_store(ctx["acc"], dw)
    return dx, dw


# --- private helpers ---------------------------------------------------------------------
def _stage_a(ctx: dict[str, Any], tile: Any, sbufs: Any) -> dict[str, Any]:
    """Load; per chunk: weight-gradient terms (column sums on TensorE) and row sums s."""
    rows, kk, off = tile[1], tile[2], tile[4]
    rcol = sbufs[0][0:rows, off : off + kk]
    part = nl.ndarray((P, kk, len(ctx["chunks"])), dtype=nl.float32, buffer=nl.sbuf)
    ld = prefetch_take(ctx["pf"]) if ctx["plan"]["resident"] else None
    each_chunk(ctx, tile, ld, _pass1_chunk, rcol, part)
    return {"tile": tile, "ld": ld, "part": part, "rcol": rcol}


def _stage_b(ctx: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """coef = -rstd^3 * s / H per row (VectorE, [rows, kk])."""
    st["coef"] = _coef(ctx, st["tile"], st["part"], st["rcol"])
    return st


def _stage_c(ctx: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """dx per chunk and its store (streaming: reloading x and dy)."""
    each_chunk(ctx, st["tile"], st["ld"], _pass2_chunk, st["rcol"], st["coef"])
    return st


def _pass1_chunk(
    ctx: dict[str, Any], tile: Any, ci: int, c0: int, v: dict[str, Any], rcol: Any, part: Any
) -> None:
    """dxy = dy * x; dw += colsum(dxy * rstd); part[:, j, ci] = sum(dxy * w)."""
    rows, kk = tile[1], tile[2]
    xc, dyc = v["x"], v["dy"]
    cw = xc.shape[2]
    w_sb, eng = ctx["w_sb"], ctx["plan"]["gpsimd_eighths"]
    for j in range(kk):
        dxy = temp(ctx, "t1")
        _mul_dy(ctx, dxy[0:rows, 0:cw], dyc[:, j, :], xc[:, j, :])
        red = dxy
        if w_sb is not None:
            colsum_add(ctx["acc"], dxy[0:rows, 0:cw], c0, rcol[:, j : j + 1])
            red = temp(ctx, "t2")
            tt_split(
                red[0:rows, 0:cw],
                dxy[0:rows, 0:cw],
                w_sb[0:rows, c0 : c0 + cw],
                nl.multiply,
                eng,
            )
        nisa.activation(
            dst=red[0:rows, 0:cw],
            op=nl.copy,
            data=red[0:rows, 0:cw],
            reduce_op=nl.add,
            reduce_res=part[0:rows, j, ci : ci + 1],
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )


def _mul_dy(ctx: dict[str, Any], dst: Any, dy: Any, b: Any) -> None:
    """dst = dy * b (fp32): VectorE's columns read dy from a PSUM copy made on TensorE."""
    eng = ctx["plan"]["gpsimd_eighths"]
    if ctx["eye"] is None:  # fp32 dy: a TensorE copy would run at the fp32 rate
        tt_split(dst, dy, b, nl.multiply, eng)
        return
    rows, cw = dst.shape[0], dst.shape[1]
    for s0 in range(0, cw, PSUM_COLS):
        m = min(PSUM_COLS, cw - s0)
        v = m - m * eng // 8
        dyp = ring_alloc(ctx["rings"]["dyp"], 2, (P, PSUM_COLS), nl.float32, nl.psum)
        if v:
            to_psum(dyp[0:rows, 0:v], ctx["eye"], dy[:, s0 : s0 + v])
        tt_split_psum(
            dst[:, s0 : s0 + m],
            dyp[0:rows, 0:m],
            dy[:, s0 : s0 + m],
            b[:, s0 : s0 + m],
            nl.multiply,
            eng,
        )


def _coef(ctx: dict[str, Any], tile: Any, part: Any, rcol: Any) -> Any:
    """coef = -rstd^3 * s / H per row, [P, kk] fp32 (s = sum of the chunk sums)."""
    rows, kk = tile[1], tile[2]
    hdim = ctx["dx"].shape[1]
    s = part
    if part.shape[2] > 1:
        s = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=s[0:rows, :], op=nl.add, data=part[0:rows, :, :], axis=(2,))
    coef = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(
        dst=coef[0:rows, :],
        data=rcol,
        op0=nl.multiply,
        operand0=-1.0 / hdim,
        op1=nl.multiply,
        operand1=rcol,
    )
    nisa.tensor_tensor(dst=coef[0:rows, :], data1=coef[0:rows, :], data2=rcol, op=nl.multiply)
    nisa.tensor_tensor(
        dst=coef[0:rows, :], data1=coef[0:rows, :], data2=s[0:rows, :], op=nl.multiply
    )
    return coef


def _pass2_chunk(
    ctx: dict[str, Any], tile: Any, ci: int, c0: int, v: dict[str, Any], rcol: Any, coef: Any
) -> None:
    """dx = dy * w * rstd + x * coef [+ dh] for one chunk, then its store."""
    rows, kk = tile[1], tile[2]
    xc, dyc, dhc = v["x"], v["dy"], v.get("dh")
    cw = xc.shape[2]
    plan, w_sb = ctx["plan"], ctx["w_sb"]
    dx = ctx["dx"]
    dxt = ring_alloc(ctx["rings"]["dx"], 2, (P, kk, plan["chunk"]), dx.dtype)
    for j in range(kk):
        g = dyc[:, j, :]
        if w_sb is not None:
            gt = temp(ctx, "t3")
            _mul_dy(ctx, gt[0:rows, 0:cw], g, w_sb[0:rows, c0 : c0 + cw])
            g = gt[0:rows, 0:cw]
        for s0 in range(0, cw, PSUM_COLS):
            m = min(PSUM_COLS, cw - s0)
            # x * coef lands in a PSUM bank so that the VectorE combine below reads one
            # PSUM operand (half the cycles of two SBUF operands)
            xs = ring_alloc(ctx["rings"]["xp"], PSUM_RING, (P, PSUM_COLS), nl.float32, nl.psum)
            xsv = xs[0:rows, 0:m]
            nisa.activation(
                dst=xsv, op=nl.copy, data=xc[:, j, s0 : s0 + m], scale=coef[0:rows, j : j + 1]
            )
            if dhc is not None:
                nisa.tensor_tensor(dst=xsv, data1=xsv, data2=dhc[:, j, s0 : s0 + m], op=nl.add)
            nisa.scalar_tensor_tensor(
                dst=dxt[0:rows, j, s0 : s0 + m],
                data=g[:, s0 : s0 + m],
                op0=nl.multiply,
                operand0=rcol[:, j : j + 1],
                op1=nl.add,
                operand1=xsv,
            )
    nisa.dma_copy(dst=rows_view(dx, tile)[:, :, c0 : c0 + cw], src=dxt[0:rows, :, 0:cw])
