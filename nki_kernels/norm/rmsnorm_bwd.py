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
    mul_by,
    prefetch_start,
    prefetch_take,
    ring_alloc,
    row_segments,
    rows_view,
    stat_tile,
    stat_view,
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
    arguments as in `rms_norm_fwd` (`mul_engine` runs the tensor_tensor multiplies).

        for tile in row tiles:
            dxy = dy * x ; dw += colsum(dxy * rstd) ; s = rowsum(dxy * w)
            dx = dy * w * rstd - x * rstd^3 * s / H
    """
    n, hdim = x.shape
    c = hdim if chunk <= 0 else min(chunk, hdim)
    assert c == hdim or c % P == 0, f"chunk must be a multiple of {P} or H; got {chunk}"
    assert rows_per_partition >= 1 and bufs >= 2
    dx = nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm)
    dw = nl.ndarray((hdim,), dtype=w.dtype, buffer=nl.shared_hbm) if w is not None else None
    plan = {"chunk": c, "resident": resident, "bufs": bufs, "mul_engine": mul_engine}
    ctx = {
        "dx": dx,
        "plan": plan,
        "chunks": col_chunks(hdim, c),
        "w_sb": load_row_vector(w, hdim) if w is not None else None,
        "acc": colsum_init(hdim) if w is not None else None,
        "rings": {"x": [], "dy": [], "dx": []},
        "loads": (("x", x), ("dy", dy)),
    }
    segs = row_segments(n, rows_per_partition)
    pf = prefetch_start(bwd_jobs(segs, ctx), bufs - 1, issue_rows_load, ctx)
    for seg in segs:
        rt = stat_tile(seg)
        nisa.dma_copy(dst=rt[0 : seg["rows"], 0 : seg["cols"]], src=stat_view(rstd, seg))
        for t in seg["tiles"]:
            if resident:
                _bwd_resident(ctx, t, prefetch_take(pf), rt)
            else:
                _bwd_streaming(ctx, t, pf, rt)
    if w is None:
        return dx
    colsum_store(ctx["acc"], dw)
    return dx, dw


# --- private helpers ---------------------------------------------------------------------
def bwd_jobs(segs: list[dict[str, Any]], ctx: dict[str, Any]) -> list[Any]:
    """Load jobs in consumption order: whole tiles, or every chunk once per pass."""
    jobs = []
    for seg in segs:
        for t in seg["tiles"]:
            if ctx["plan"]["resident"]:
                jobs.append((t, None))
            else:
                jobs.extend((t, ch) for _ in range(2) for ch in ctx["chunks"])
    return jobs


def _bwd_resident(ctx: dict[str, Any], tile: Any, ld: dict[str, Any], rt: Any) -> None:
    rows, kk, off = tile[1], tile[2], tile[4]
    chunks = ctx["chunks"]
    rcol = rt[0:rows, off : off + kk]
    part = nl.ndarray((P, kk, len(chunks)), dtype=nl.float32, buffer=nl.sbuf)
    for ci, (c0, cw) in enumerate(chunks):
        xc, dyc = ld["x"][0:rows, :, c0 : c0 + cw], ld["dy"][0:rows, :, c0 : c0 + cw]
        _pass1_chunk(ctx, tile, xc, dyc, c0, rcol, part, ci)
    coef = _coef(ctx, tile, part, rcol)
    for c0, cw in chunks:
        xc, dyc = ld["x"][0:rows, :, c0 : c0 + cw], ld["dy"][0:rows, :, c0 : c0 + cw]
        _pass2_chunk(ctx, tile, xc, dyc, c0, rcol, coef)


def _bwd_streaming(ctx: dict[str, Any], tile: Any, pf: dict[str, Any], rt: Any) -> None:
    rows, kk, off = tile[1], tile[2], tile[4]
    chunks = ctx["chunks"]
    rcol = rt[0:rows, off : off + kk]
    part = nl.ndarray((P, kk, len(chunks)), dtype=nl.float32, buffer=nl.sbuf)
    for ci, (c0, cw) in enumerate(chunks):
        ld = prefetch_take(pf)
        _pass1_chunk(
            ctx, tile, ld["x"][0:rows, :, 0:cw], ld["dy"][0:rows, :, 0:cw], c0, rcol, part, ci
        )
        ld = None  # release the chunk's buffers before the next take (double buffering)
    coef = _coef(ctx, tile, part, rcol)
    for c0, cw in chunks:
        ld = prefetch_take(pf)
        _pass2_chunk(ctx, tile, ld["x"][0:rows, :, 0:cw], ld["dy"][0:rows, :, 0:cw], c0, rcol, coef)
        ld = None


def _pass1_chunk(
    ctx: dict[str, Any], tile: Any, xc: Any, dyc: Any, c0: int, rcol: Any, part: Any, ci: int
) -> None:
    """dxy = dy * x; dw += colsum(dxy * rstd); part[:, j, ci] = sum(dxy * w)."""
    rows, kk = tile[1], tile[2]
    cw = xc.shape[2]
    w_sb, eng = ctx["w_sb"], ctx["plan"]["mul_engine"]
    for j in range(kk):
        dxy = nl.ndarray((P, cw), dtype=nl.float32, buffer=nl.sbuf)
        mul_by(dxy[0:rows, :], dyc[:, j, :], xc[:, j, :], eng)
        red = dxy
        if w_sb is not None:
            colsum_add(ctx["acc"], dxy[0:rows, :], c0, rcol[:, j : j + 1])
            red = nl.ndarray((P, cw), dtype=nl.float32, buffer=nl.sbuf)
            mul_by(red[0:rows, :], dxy[0:rows, :], w_sb[0:rows, c0 : c0 + cw], eng)
        nisa.activation(
            dst=red[0:rows, :],
            op=nl.copy,
            data=red[0:rows, :],
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
    ctx: dict[str, Any], tile: Any, xc: Any, dyc: Any, c0: int, rcol: Any, coef: Any
) -> None:
    """dx = dy * w * rstd + x * coef for one chunk, then its store."""
    rows, kk = tile[1], tile[2]
    cw = xc.shape[2]
    plan, w_sb = ctx["plan"], ctx["w_sb"]
    dx = ctx["dx"]
    dxt = ring_alloc(ctx["rings"]["dx"], plan["bufs"], (P, kk, plan["chunk"]), dx.dtype)
    for j in range(kk):
        g = dyc[:, j, :]
        if w_sb is not None:
            gt = nl.ndarray((P, cw), dtype=nl.float32, buffer=nl.sbuf)
            mul_by(gt[0:rows, :], g, w_sb[0:rows, c0 : c0 + cw], plan["mul_engine"])
            g = gt[0:rows, :]
        xs = nl.ndarray((P, cw), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(
            dst=xs[0:rows, :], op=nl.copy, data=xc[:, j, :], scale=coef[0:rows, j : j + 1]
        )
        nisa.scalar_tensor_tensor(
            dst=dxt[0:rows, j, 0:cw],
            data=g,
            op0=nl.multiply,
            operand0=rcol[:, j : j + 1],
            op1=nl.add,
            operand1=xs[0:rows, :],
        )
    nisa.dma_copy(dst=rows_view(dx, tile)[:, :, c0 : c0 + cw], src=dxt[0:rows, :, 0:cw])
