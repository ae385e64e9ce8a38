"""RMSNorm forward and the fused residual add + RMSNorm forward, in NKI.

Algorithm (per row of x [N, H], fp32 statistics):
    ssum  = sum_h x^2                      ScalarE: activation(square) with its add-reduce
    rstd  = (ssum / H + eps) ^ -1/2        VectorE: two tensor_scalar on [rows, kk]
    xn    = x * rstd                       VectorE tensor_scalar (bf16 perf mode) or ScalarE
    y     = xn * w                         tensor_tensor, columns split VectorE / GpSimd
The fused variant first forms h = x + residual (VectorE), writes h back to HBM as the new
residual stream and normalizes h: x and residual are read once, y and h written once.

Layout and loop nest (see tiling.py): partition p owns a contiguous block of rows and a
row tile takes `rows_per_partition` (kk) of them per partition, one contiguous HBM run
per partition; the tail (N % 128 rows) is one more tile of fewer partitions. Each row
tile goes through a three-stage software pipeline (`tiling.run_pipeline`; step t runs
A(t), B(t-1), C(t-2)):
    A: load x [and residual; h = x + res; store h]; per chunk and row group:
       partial sums of x^2 (ScalarE)
    B: rstd from the partial sums (VectorE; into the segment's rstd buffer, stored to
       HBM once per segment for the backward); xn = x * rstd in place
    C: y = xn * w per chunk (VectorE + GpSimd); store y
so ScalarE squares tile t while VectorE scales tile t-1 and VectorE / GpSimd weight tile
t-2, and the loads run `bufs - 3` tiles ahead. Resident mode keeps each row tile in SBUF
through the three stages (x read once); streaming mode (rows too wide for SBUF) loads
column chunks in stage A for the sums and again in stage C (one extra read of x; the
fused variant re-adds the residual, bit-identically).

Limits: any N >= 1 and H >= 1; x, residual, w in fp32 / bf16 / fp16 (w may be None); eps
a positive specialization-time float; resident mode needs bufs >= 3, streaming >= 2.
`config.validate` checks a plan against SBUF; the interpreter's accounting is the judge.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl
from .tiling import (
    P,
    col_chunks,
    each_chunk,
    load_row_vector,
    prefetch_take,
    programs,
    ring_alloc,
    rings,
    row_plan,
    row_segments,
    rows_view,
    run_rows,
    scratch,
    stats_alloc,
    stats_store,
    tt_split,
)

# --- schedule choices (values of the config fields) ------------------------------------
# scale_mode: which engine forms xn = x * rstd
SCALE_SCALAR = "scalar"  # ScalarE activation(copy, scale=rstd)
SCALE_VECTOR = "vector"  # VectorE tensor_scalar (4x perf mode for bf16 / fp16)
SCALE_MODES = (SCALE_SCALAR, SCALE_VECTOR)
# gpsimd_eighths: eighths of each full-width tensor_tensor's columns that run on GpSimd
# (the rest on VectorE); GpSimd is slower per element, so a share balances the engines.
GPSIMD_EIGHTHS_MAX = 8
# The pipeline's stages (A: load + sums, B: rstd + scale, C: weight + store).
NSTAGES = 3


@nki.jit
def rms_norm_fwd(
    x: Any,
    w: Any,
    eps: float,
    rows_per_partition: int = 1,
    chunk: int = 0,
    resident: bool = True,
    bufs: int = 4,
    scale_mode: str = SCALE_VECTOR,
    gpsimd_eighths: int = 0,
) -> Any:
    """RMSNorm forward: returns (y [N, H] in x.dtype, rstd [N] fp32).

    x: [N, H] in HBM; w: [H] in HBM or None; eps > 0. Schedule arguments (the fields of
    `RMSNormConfig`): `rows_per_partition` rows per partition per tile, `chunk` columns per
    compute / DMA step (0 = H), `resident` keeps the row tile in SBUF through the stages,
    `bufs` rotating buffers per loaded tile or chunk, `scale_mode` / `gpsimd_eighths` pick
    the engines. Rows may be split across LNC programs (`rms_norm_fwd[2]`).

        for tile in row tiles:
            rstd = (sum(x^2) / H + eps) ^ -1/2 ; y = x * rstd * w
    """
    n, hdim = x.shape
    y = nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm)
    rstd = nl.ndarray((n,), dtype=nl.float32, buffer=nl.shared_hbm)
    plan = _plan(hdim, rows_per_partition, chunk, resident, bufs, scale_mode, gpsimd_eighths)
    _rms_rows(x, None, w, y, None, rstd, eps, plan)
    return y, rstd


@nki.jit
def add_rms_norm_fwd(
    x: Any,
    residual: Any,
    w: Any,
    eps: float,
    rows_per_partition: int = 1,
    chunk: int = 0,
    resident: bool = True,
    bufs: int = 4,
    scale_mode: str = SCALE_VECTOR,
    gpsimd_eighths: int = 0,
) -> Any:
    """Fused residual add + RMSNorm: returns (y, h = x + residual, rstd [N] fp32).

    x, residual: [N, H] in HBM, same dtype; h is rounded to x.dtype and y = rms_norm(h).
    Same schedule arguments as `rms_norm_fwd`.

        for tile in row tiles:
            h = x + res -> HBM ; rstd = (sum(h^2) / H + eps) ^ -1/2 ; y = h * rstd * w
    """
    n, hdim = x.shape
    y = nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm)
    h = nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm)
    rstd = nl.ndarray((n,), dtype=nl.float32, buffer=nl.shared_hbm)
    plan = _plan(hdim, rows_per_partition, chunk, resident, bufs, scale_mode, gpsimd_eighths)
    _rms_rows(x, residual, w, y, h, rstd, eps, plan)
    return y, h, rstd


@nki.jit
def rms_norm_stats(
    x: Any,
    eps: float,
    rows_per_partition: int = 1,
    chunk: int = 0,
    resident: bool = True,
    bufs: int = 4,
    scale_mode: str = SCALE_VECTOR,
    gpsimd_eighths: int = 0,
) -> Any:
    """rstd [N] fp32 of x [N, H] alone: the statistics the backward recomputes.

    Stages A and B of `rms_norm_fwd` (x read once, nothing else written); takes the same
    schedule arguments so the forward's config applies.
    """
    n, hdim = x.shape
    rstd = nl.ndarray((n,), dtype=nl.float32, buffer=nl.shared_hbm)
    plan = _plan(hdim, rows_per_partition, chunk, resident, bufs, scale_mode, gpsimd_eighths)
    _rms_rows(x, None, None, None, None, rstd, eps, plan)
    return rstd


# --- private helpers ---------------------------------------------------------------------
def _plan(
    hdim: int,
    rows_per_partition: int,
    chunk: int,
    resident: bool,
    bufs: int,
    scale_mode: str,
    gpsimd_eighths: int,
) -> dict[str, Any]:
    """Check the schedule arguments and resolve defaults (chunk 0 = the whole row)."""
    assert scale_mode in SCALE_MODES, f"scale_mode must be one of {SCALE_MODES}; got {scale_mode}"
    assert 0 <= gpsimd_eighths <= GPSIMD_EIGHTHS_MAX, f"gpsimd_eighths: 0..8; got {gpsimd_eighths}"
    return row_plan(
        hdim,
        rows_per_partition,
        chunk,
        resident,
        bufs,
        NSTAGES,
        scale_mode=scale_mode,
        gpsimd_eighths=gpsimd_eighths,
    )


def _rms_rows(
    x: Any, res: Any, w: Any, y: Any, h_out: Any, rstd_out: Any, eps: float, plan: dict[str, Any]
) -> None:
    """All row tiles of this program, through the three-stage pipeline (y None: the
    statistics only, stages A and B)."""
    n, hdim = x.shape
    ctx = {
        "x": x,
        "y": y,
        "h": h_out,
        "stats": (rstd_out,),
        "eps": eps,
        "plan": plan,
        "chunks": col_chunks(hdim, plan["chunk"]),
        "w_sb": load_row_vector(w, hdim),
        "junk": scratch(plan["chunk"], x.dtype),
        "rings": rings(),
        "loads": (("x", x), ("res", res)),
    }
    stages = [_stage_a, _stage_b, _stage_c] if y is not None else [_stage_a, _stage_b]
    segs = row_segments(n, plan["k"], *programs())
    run_rows(ctx, segs, stages, stats_alloc, stats_store, reload_last=y is not None)


def _stage_a(ctx: dict[str, Any], tile: Any, sbufs: Any) -> dict[str, Any]:
    """Load the tile (fused: add the residual, store h) and its partial sums of squares."""
    kk = tile[2]
    part = nl.ndarray((P, kk, len(ctx["chunks"])), dtype=nl.float32, buffer=nl.sbuf)
    ld = prefetch_take(ctx["pf"]) if ctx["plan"]["resident"] else None
    each_chunk(ctx, tile, ld, _sums_chunk, part)
    return {"tile": tile, "ld": ld, "part": part, "rstd": sbufs[0]}


def _stage_b(ctx: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """rstd (VectorE) and, for a resident tile, xn = x * rstd in place."""
    tile, ld = st["tile"], st["ld"]
    rows, kk, off = tile[1], tile[2], tile[4]
    rstd = st["rstd"][0:rows, off : off + kk]
    ssum = _total(st["part"], rows, kk)
    nisa.tensor_scalar(
        dst=rstd,
        data=ssum,
        op0=nl.multiply,
        operand0=1.0 / ctx["x"].shape[1],
        op1=nl.add,
        operand1=float(ctx["eps"]),
    )
    nisa.tensor_scalar(dst=rstd, data=rstd, op0=nl.rsqrt, operand0=None)
    if ld is not None and ctx["y"] is not None:
        for c0, cw in ctx["chunks"]:
            _scale(ctx, ld["x"][0:rows, :, c0 : c0 + cw], rstd)
    return {"tile": tile, "ld": ld, "rstd": rstd}


def _stage_c(ctx: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """y = xn * w per chunk and its store (streaming: reload, re-add, scale first)."""
    each_chunk(ctx, st["tile"], st["ld"], _out_chunk, st["rstd"], st["ld"] is None)
    return st


def _total(part: Any, rows: int, kk: int) -> Any:
    """Sum of the per-chunk partial sums, [rows, kk] fp32."""
    if part.shape[2] == 1:
        return part[0:rows, :, 0]
    total = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=total[0:rows, :], op=nl.add, data=part[0:rows, :, :], axis=(2,))
    return total[0:rows, :]


def _out_chunk(
    ctx: dict[str, Any], tile: Any, ci: int, c0: int, v: dict[str, Any], rstd: Any, streamed: bool
) -> None:
    """y for one chunk (streamed: re-add the residual and scale it first), and its store."""
    xc = v["x"]
    if streamed:
        if "res" in v:  # h = x + residual again, bit-identical to the h stored in stage A
            nisa.tensor_tensor(dst=xc, data1=xc, data2=v["res"], op=nl.add)
        _scale(ctx, xc, rstd)
    _weight_store(ctx, tile, xc, c0)


def _sums_chunk(
    ctx: dict[str, Any], tile: Any, ci: int, c0: int, v: dict[str, Any], part: Any
) -> None:
    """[fused: x += res, store h]; part[:, j, ci] = sum(x[:, j, :]^2) per row group j."""
    rows, kk = tile[1], tile[2]
    xc, rc = v["x"], v.get("res")
    cw = xc.shape[2]
    if rc is not None:
        nisa.tensor_tensor(dst=xc, data1=xc, data2=rc, op=nl.add)
        nisa.dma_copy(dst=rows_view(ctx["h"], tile)[:, :, c0 : c0 + cw], src=xc)
    junk = ctx["junk"]
    for j in range(kk):
        nisa.activation(
            dst=junk[0:rows, 0:cw],
            op=nl.square,
            data=xc[:, j, :],
            reduce_op=nl.add,
            reduce_res=part[0:rows, j, ci : ci + 1],
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )


def _scale(ctx: dict[str, Any], xc: Any, rstd: Any) -> None:
    """xc[:, j, :] *= rstd[:, j] in place, on the engine `scale_mode` names."""
    for j in range(xc.shape[1]):
        col = rstd[:, j : j + 1]
        if ctx["plan"]["scale_mode"] == SCALE_SCALAR:
            nisa.activation(dst=xc[:, j, :], op=nl.copy, data=xc[:, j, :], scale=col)
        else:
            nisa.tensor_scalar(dst=xc[:, j, :], data=xc[:, j, :], op0=nl.multiply, operand0=col)


def _weight_store(ctx: dict[str, Any], tile: Any, xc: Any, c0: int) -> None:
    """y[tile, c0:c0+cw] = xc * w (or xc without a weight), then its store."""
    rows, kk = tile[1], tile[2]
    cw = xc.shape[2]
    plan, w_sb, y = ctx["plan"], ctx["w_sb"], ctx["y"]
    yv = rows_view(y, tile)[:, :, c0 : c0 + cw]
    if w_sb is None:
        nisa.dma_copy(dst=yv, src=xc)
        return
    yt = ring_alloc(ctx["rings"]["y"], 2, (P, kk, plan["chunk"]), y.dtype)
    for j in range(kk):
        tt_split(
            yt[0:rows, j, 0:cw],
            xc[:, j, :],
            w_sb[0:rows, c0 : c0 + cw],
            nl.multiply,
            plan["gpsimd_eighths"],
        )
    nisa.dma_copy(dst=yv, src=yt[0:rows, :, 0:cw])
