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
    issue_rows_load,
    load_row_vector,
    pipeline_jobs,
    prefetch_depth,
    prefetch_start,
    prefetch_take,
    ring_alloc,
    row_segments,
    rows_view,
    run_pipeline,
    stat_tile,
    stat_view,
    tt_split,
)

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
    c = hdim if chunk <= 0 else min(chunk, hdim)
    assert c == hdim or c % P == 0, f"chunk must be a multiple of {P} or H; got {chunk}"
    assert rows_per_partition >= 1 and bufs >= (NSTAGES if resident else 2)
    dx = nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm)
    dw = nl.ndarray((hdim,), dtype=w.dtype, buffer=nl.shared_hbm) if w is not None else None
    plan = {"chunk": c, "resident": resident, "bufs": bufs, "gpsimd_eighths": gpsimd_eighths}
    chunks = col_chunks(hdim, c)
    ctx = {
        "dx": dx,
        "rstd": rstd,
        "plan": plan,
        "chunks": chunks,
        "w_sb": load_row_vector(w, hdim) if w is not None else None,
        "acc": colsum_init(hdim) if w is not None else None,
        "rings": {
            "x": [],
            "dy": [],
            "dh": [],
            "dx": [],
            "xs": [],
            "t1": [],
            "t2": [],
            "t3": [],
            "t4": [],
        },
        "loads": (("x", x), ("dy", dy), ("dh", dh)),
    }
    segs = row_segments(n, rows_per_partition)
    jobs = pipeline_jobs(segs, NSTAGES, resident, chunks)
    ctx["pf"] = prefetch_start(jobs, prefetch_depth(resident, bufs, NSTAGES), issue_rows_load, ctx)
    run_pipeline(ctx, segs, [_stage_a, _stage_b, _stage_c], _seg_begin, _seg_end)
    if w is None:
        return dx
    colsum_store(ctx["acc"], dw)
    return dx, dw


# --- private helpers ---------------------------------------------------------------------
def _seg_begin(ctx: dict[str, Any], seg: dict[str, Any]) -> Any:
    rt = stat_tile(seg)  # rstd of the segment's rows, one DMA
    nisa.dma_copy(dst=rt[0 : seg["rows"], 0 : seg["cols"]], src=stat_view(ctx["rstd"], seg))
    return rt


def _seg_end(ctx: dict[str, Any], seg: dict[str, Any], rt: Any) -> None:
    return None


def temp(ctx: dict[str, Any], name: str) -> Any:
    """A [P, chunk] fp32 temporary from its own two-buffer ring (stable addresses, so it
    only ever waits on its own previous use)."""
    return ring_alloc(ctx["rings"][name], 2, (P, ctx["plan"]["chunk"]), nl.float32)


def _stage_a(ctx: dict[str, Any], tile: Any, rt: Any) -> dict[str, Any]:
    """Load; per chunk: weight-gradient terms (column sums on TensorE) and row sums s."""
    rows, kk, off = tile[1], tile[2], tile[4]
    chunks = ctx["chunks"]
    rcol = rt[0:rows, off : off + kk]
    part = nl.ndarray((P, kk, len(chunks)), dtype=nl.float32, buffer=nl.sbuf)
    ld = None
    if ctx["plan"]["resident"]:
        ld = prefetch_take(ctx["pf"])
        for ci, (c0, cw) in enumerate(chunks):
            xc, dyc = ld["x"][0:rows, :, c0 : c0 + cw], ld["dy"][0:rows, :, c0 : c0 + cw]
            _pass1_chunk(ctx, tile, xc, dyc, c0, rcol, part, ci)
    else:
        for ci, (c0, cw) in enumerate(chunks):
            _pass1_taken(ctx, tile, prefetch_take(ctx["pf"]), c0, cw, rcol, part, ci)
    return {"tile": tile, "ld": ld, "part": part, "rcol": rcol}


def _stage_b(ctx: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """coef = -rstd^3 * s / H per row (VectorE, [rows, kk]); for a resident tile also
    xs = x * coef (ScalarE, fp32), one step before stage C adds it, so that VectorE never
    waits on ScalarE within a step."""
    tile, ld = st["tile"], st["ld"]
    coef = _coef(ctx, tile, st["part"], st["rcol"])
    st["coef"] = coef
    if ld is not None:
        rows, kk = tile[1], tile[2]
        hdim = ctx["dx"].shape[1]
        xs = ring_alloc(ctx["rings"]["xs"], 2, (P, kk, hdim), nl.float32)
        for j in range(kk):
            nisa.activation(
                dst=xs[0:rows, j, :],
                op=nl.copy,
                data=ld["x"][0:rows, j, :],
                scale=coef[0:rows, j : j + 1],
            )
        st["xs"] = xs
    return st


def _stage_c(ctx: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """dx per chunk and its store (streaming: reloading x and dy)."""
    tile, ld, rcol, coef = st["tile"], st["ld"], st["rcol"], st["coef"]
    rows = tile[1]
    for c0, cw in ctx["chunks"]:
        if ld is not None:
            xc, dyc = ld["x"][0:rows, :, c0 : c0 + cw], ld["dy"][0:rows, :, c0 : c0 + cw]
            dhc = ld["dh"][0:rows, :, c0 : c0 + cw] if "dh" in ld else None
            xsc = st["xs"][0:rows, :, c0 : c0 + cw]
            _pass2_chunk(ctx, tile, xc, dyc, dhc, c0, rcol, coef, xsc)
        else:
            _pass2_taken(ctx, tile, prefetch_take(ctx["pf"]), c0, cw, rcol, coef)
    return st


def _pass1_taken(
    ctx: dict[str, Any], tile: Any, ld: Any, c0: int, cw: int, rcol: Any, part: Any, ci: int
) -> None:
    rows = tile[1]
    xc, dyc = ld["x"][0:rows, :, 0:cw], ld["dy"][0:rows, :, 0:cw]
    _pass1_chunk(ctx, tile, xc, dyc, c0, rcol, part, ci)


def _pass2_taken(
    ctx: dict[str, Any], tile: Any, ld: Any, c0: int, cw: int, rcol: Any, coef: Any
) -> None:
    rows = tile[1]
    xc, dyc = ld["x"][0:rows, :, 0:cw], ld["dy"][0:rows, :, 0:cw]
    dhc = ld["dh"][0:rows, :, 0:cw] if "dh" in ld else None
    _pass2_chunk(ctx, tile, xc, dyc, dhc, c0, rcol, coef)


def _pass1_chunk(
    ctx: dict[str, Any], tile: Any, xc: Any, dyc: Any, c0: int, rcol: Any, part: Any, ci: int
) -> None:
    """dxy = dy * x; dw += colsum(dxy * rstd); part[:, j, ci] = sum(dxy * w)."""
    rows, kk = tile[1], tile[2]
    cw = xc.shape[2]
    w_sb, eng = ctx["w_sb"], ctx["plan"]["gpsimd_eighths"]
    for j in range(kk):
        dxy = temp(ctx, "t1")
        tt_split(dxy[0:rows, 0:cw], dyc[:, j, :], xc[:, j, :], nl.multiply, eng)
        red = dxy
        if w_sb is not None:
            colsum_add(ctx["acc"], dxy[0:rows, 0:cw], c0, rcol[:, j : j + 1])
            red = temp(ctx, "t2")
            tt_split(
                red[0:rows, 0:cw], dxy[0:rows, 0:cw], w_sb[0:rows, c0 : c0 + cw], nl.multiply, eng
            )
        nisa.activation(
            dst=red[0:rows, 0:cw],
            op=nl.copy,
            data=red[0:rows, 0:cw],
            reduce_op=nl.add,
            reduce_res=part[0:rows, j, ci : ci + 1],
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
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
    ctx: dict[str, Any],
    tile: Any,
    xc: Any,
    dyc: Any,
    dhc: Any,
    c0: int,
    rcol: Any,
    coef: Any,
    xsc: Any = None,
) -> None:
    """dx = dy * w * rstd + x * coef [+ dh] for one chunk, then its store."""
    rows, kk = tile[1], tile[2]
    cw = xc.shape[2]
    plan, w_sb = ctx["plan"], ctx["w_sb"]
    dx = ctx["dx"]
    dxt = ring_alloc(ctx["rings"]["dx"], 2, (P, kk, plan["chunk"]), dx.dtype)
    for j in range(kk):
        g = dyc[:, j, :]
        if w_sb is not None:
            gt = temp(ctx, "t3")
            tt_split(
                gt[0:rows, 0:cw], g, w_sb[0:rows, c0 : c0 + cw], nl.multiply, plan["gpsimd_eighths"]
            )
            g = gt[0:rows, 0:cw]
        if xsc is not None:
            xs = xsc[:, j, :]
        else:
            xst = temp(ctx, "t4")
            xs = xst[0:rows, 0:cw]
            nisa.activation(dst=xs, op=nl.copy, data=xc[:, j, :], scale=coef[0:rows, j : j + 1])
        if dhc is not None:
            tt_split(xs, xs, dhc[:, j, :], nl.add, plan["gpsimd_eighths"])
        nisa.scalar_tensor_tensor(
            dst=dxt[0:rows, j, 0:cw],
            data=g,
            op0=nl.multiply,
            operand0=rcol[:, j : j + 1],
            op1=nl.add,
            operand1=xs,
        )
    nisa.dma_copy(dst=rows_view(dx, tile)[:, :, c0 : c0 + cw], src=dxt[0:rows, :, 0:cw])
