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
    each_chunk,
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
    tt_split,
)

NSTAGES = 3  # A: loads, gradient terms, row sums; B: dx coefficients; C: dx and its store


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
    bufs: int = 4,
    gpsimd_eighths: int = 0,
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
    plan = row_plan(
        hdim,
        rows_per_partition,
        chunk,
        resident,
        bufs,
        NSTAGES,
        aligned=True,
        gpsimd_eighths=gpsimd_eighths,
    )
    dx = nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm)
    gdtype = w.dtype if w is not None else x.dtype
    dw = nl.ndarray((hdim,), dtype=gdtype, buffer=nl.shared_hbm) if w is not None else None
    db = nl.ndarray((hdim,), dtype=gdtype, buffer=nl.shared_hbm) if has_bias else None
    ctx = {
        "dx": dx,
        "plan": plan,
        "chunks": col_chunks(hdim, plan["chunk"]),
        "w_sb": load_row_vector(w, hdim),
        "acc_w": colsum_init(hdim) if w is not None else None,
        "acc_b": colsum_init(hdim) if has_bias else None,
        "rings": rings(),
        "stats": (mean, rstd),
        "loads": (("x", x), ("dy", dy)),
    }
    run_rows(ctx, row_segments(n, plan["k"]), [_stage_a, _stage_b, _stage_c], stats_load)
    if ctx["acc_w"] is not None:
        colsum_store(ctx["acc_w"], dw)
    if ctx["acc_b"] is not None:
        colsum_store(ctx["acc_b"], db)
    return dx, dw, db


# --- private helpers ---------------------------------------------------------------------
def _stage_a(ctx: dict[str, Any], tile: Any, stb: Any) -> dict[str, Any]:
    """Load; per chunk: weight / bias gradient terms (TensorE column sums), row sums A, B."""
    rows, kk, off = tile[1], tile[2], tile[4]
    cols = (stb[0][0:rows, off : off + kk], stb[1][0:rows, off : off + kk])
    sums = _sums_init(kk, len(ctx["chunks"]))
    ld = prefetch_take(ctx["pf"]) if ctx["plan"]["resident"] else None
    each_chunk(ctx, tile, ld, _pass1_chunk, cols, sums)
    return {"tile": tile, "ld": ld, "cols": cols, "sums": sums}


def _stage_b(ctx: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """The per-row coefficients c0, c1 of dx (VectorE, [rows, kk]); for a resident tile
    also xs = x * c1 + c0 (ScalarE, fp32), one step before stage C adds it, so that
    VectorE never waits on ScalarE within a step."""
    tile, ld = st["tile"], st["ld"]
    rows, kk = tile[1], tile[2]
    mcol, rcol = st["cols"]
    hdim = ctx["dx"].shape[1]
    c0_col, c1_col = _dx_coefs(st["sums"], mcol, rcol, rows, kk, hdim)
    st["coefs"] = (c0_col, c1_col)
    if ld is not None:
        xs = ring_alloc(ctx["rings"]["xs"], 2, (P, kk, hdim), nl.float32)
        for j in range(kk):
            nisa.activation(
                dst=xs[0:rows, j, :],
                op=nl.copy,
                data=ld["x"][0:rows, j, :],
                scale=c1_col[0:rows, j : j + 1],
                bias=c0_col[0:rows, j : j + 1],
            )
        st["xs"] = xs
    return st


def _stage_c(ctx: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """dx per chunk and its store (streaming: reloading x and dy)."""
    each_chunk(ctx, st["tile"], st["ld"], _pass2_chunk, st["cols"][1], st["coefs"], st.get("xs"))
    return st


def _sums_init(kk: int, nch: int) -> tuple[Any, Any]:
    """Per-chunk partial row sums A (of g) and B (of g * (x - mean)), [P, kk, nch] fp32."""
    a = nl.ndarray((P, kk, nch), dtype=nl.float32, buffer=nl.sbuf)
    b = nl.ndarray((P, kk, nch), dtype=nl.float32, buffer=nl.sbuf)
    return a, b


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


def _pass1_chunk(
    ctx: dict[str, Any], tile: Any, ci: int, c0: int, v: dict[str, Any], cols: Any, sums: Any
) -> None:
    """Weight / bias gradient terms and the row sums A, B of one column chunk."""
    rows, kk = tile[1], tile[2]
    xc, dyc = v["x"], v["dy"]
    cw = xc.shape[2]
    mcol, rcol = cols
    w_sb, eng = ctx["w_sb"], ctx["plan"]["gpsimd_eighths"]
    for j in range(kk):
        dxm = temp(ctx, "t1")
        nisa.scalar_tensor_tensor(
            dst=dxm[0:rows, 0:cw],
            data=xc[:, j, :],
            op0=nl.subtract,
            operand0=mcol[:, j : j + 1],
            op1=nl.multiply,
            operand1=dyc[:, j, :],
        )
        if ctx["acc_b"] is not None:
            colsum_add(ctx["acc_b"], dyc[:, j, :], c0)
        a_col, b_col = sums[0][0:rows, j, ci : ci + 1], sums[1][0:rows, j, ci : ci + 1]
        if w_sb is None:
            _row_sum(b_col, dxm[0:rows, 0:cw])
            junk = temp(ctx, "t2")
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
        colsum_add(ctx["acc_w"], dxm[0:rows, 0:cw], c0, rcol[:, j : j + 1])
        p = temp(ctx, "t2")
        tt_split(p[0:rows, 0:cw], dxm[0:rows, 0:cw], wc, nl.multiply, eng)
        _row_sum(b_col, p[0:rows, 0:cw])
        g = temp(ctx, "t3")
        tt_split(g[0:rows, 0:cw], dyc[:, j, :], wc, nl.multiply, eng)
        _row_sum(a_col, g[0:rows, 0:cw])


def _pass2_chunk(
    ctx: dict[str, Any],
    tile: Any,
    ci: int,
    c0: int,
    v: dict[str, Any],
    rcol: Any,
    coefs: Any,
    xs_tile: Any,
) -> None:
    """dx = g * rstd + (x * c1 + c0) for one chunk (xs from stage B's `xs_tile` for a
    resident tile, else computed here), then its store."""
    rows, kk = tile[1], tile[2]
    xc, dyc = v["x"], v["dy"]
    cw = xc.shape[2]
    xsc = xs_tile[0:rows, :, c0 : c0 + cw] if xs_tile is not None else None
    plan, w_sb, dx = ctx["plan"], ctx["w_sb"], ctx["dx"]
    c0_col, c1_col = coefs
    dxt = ring_alloc(ctx["rings"]["dx"], 2, (P, kk, plan["chunk"]), dx.dtype)
    for j in range(kk):
        g = dyc[:, j, :]
        if w_sb is not None:
            gt = temp(ctx, "t4")
            tt_split(
                gt[0:rows, 0:cw], g, w_sb[0:rows, c0 : c0 + cw], nl.multiply, plan["gpsimd_eighths"]
            )
            g = gt[0:rows, 0:cw]
        if xsc is not None:
            xs = xsc[:, j, :]
        else:
            xst = temp(ctx, "t5")
            xs = xst[0:rows, 0:cw]
            nisa.activation(
                dst=xs,
                op=nl.copy,
                data=xc[:, j, :],
                scale=c1_col[0:rows, j : j + 1],
                bias=c0_col[0:rows, j : j + 1],
            )
        nisa.scalar_tensor_tensor(
            dst=dxt[0:rows, j, 0:cw],
            data=g,
            op0=nl.multiply,
            operand0=rcol[:, j : j + 1],
            op1=nl.add,
            operand1=xs,
        )
    nisa.dma_copy(dst=rows_view(dx, tile)[:, :, c0 : c0 + cw], src=dxt[0:rows, :, 0:cw])


def _dx_coefs(sums: Any, mcol: Any, rcol: Any, rows: int, kk: int, hdim: int) -> tuple[Any, Any]:
    """c1 = -rstd^3 * B / H and c0 = -rstd * A / H - c1 * mean, as [P, kk] fp32."""
    a = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    b = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=a[0:rows, :], op=nl.add, data=sums[0][0:rows, :, :], axis=(2,))
    nisa.tensor_reduce(dst=b[0:rows, :], op=nl.add, data=sums[1][0:rows, :, :], axis=(2,))
    r2 = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(
        dst=r2[0:rows, :],
        data=rcol,
        op0=nl.multiply,
        operand0=-1.0 / hdim,
        op1=nl.multiply,
        operand1=rcol,
    )  # -rstd^2 / H
    c1 = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=c1[0:rows, :], data1=r2[0:rows, :], data2=rcol, op=nl.multiply)
    nisa.tensor_tensor(dst=c1[0:rows, :], data1=c1[0:rows, :], data2=b[0:rows, :], op=nl.multiply)
    c0 = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(
        dst=c0[0:rows, :],
        data=a[0:rows, :],
        op0=nl.multiply,
        operand0=-1.0 / hdim,
        op1=nl.multiply,
        operand1=rcol,
    )  # -rstd * A / H
    cm = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=cm[0:rows, :], data1=c1[0:rows, :], data2=mcol, op=nl.multiply)
    nisa.tensor_tensor(dst=c0[0:rows, :], data1=c0[0:rows, :], data2=cm[0:rows, :], op=nl.subtract)
    return c0, c1
