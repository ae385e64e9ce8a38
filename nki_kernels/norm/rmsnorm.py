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
from .forward import NSTAGES, fwd_plan, fwd_rows
from .tiling import P, rows_view

# --- schedule choices (values of the config fields) ------------------------------------
# scale_mode: which engine forms xn = x * rstd
SCALE_SCALAR = "scalar"  # ScalarE activation(copy, scale=rstd)
SCALE_VECTOR = "vector"  # VectorE tensor_scalar (4x perf mode for bf16 / fp16)
SCALE_MODES = (SCALE_SCALAR, SCALE_VECTOR)
# gpsimd_eighths: eighths of each full-width tensor_tensor's columns that run on GpSimd
# (the rest on VectorE); GpSimd is slower per element, so a share balances the engines.
GPSIMD_EIGHTHS_MAX = 8
__all__ = ["NSTAGES", "add_rms_norm_fwd", "rms_norm_fwd", "rms_norm_stats"]


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
    plan = _plan(x, rows_per_partition, chunk, resident, bufs, scale_mode, gpsimd_eighths)
    o = fwd_rows(HOOKS, x, plan, eps, 1, y=True, w=w)
    return o["y"], o["stats"][0]


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
    plan = _plan(x, rows_per_partition, chunk, resident, bufs, scale_mode, gpsimd_eighths)
    o = fwd_rows(HOOKS, x, plan, eps, 1, y=True, res=residual, w=w)
    return o["y"], o["h"], o["stats"][0]


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
    plan = _plan(x, rows_per_partition, chunk, resident, bufs, scale_mode, gpsimd_eighths)
    return fwd_rows(HOOKS, x, plan, eps, 1)["stats"][0]


# --- private helpers ---------------------------------------------------------------------
def _plan(x: Any, k: int, chunk: int, resident: bool, bufs: int, mode: str, eng: int) -> Any:
    return fwd_plan(x.shape[1], k, chunk, resident, bufs, eng, scale_mode=(mode, SCALE_MODES))


def _init(ctx: dict[str, Any], tile: Any) -> Any:
    """Per-chunk partial sums of squares, [P, kk, chunks] fp32."""
    return nl.ndarray((P, tile[2], len(ctx["chunks"])), dtype=nl.float32, buffer=nl.sbuf)


def _finish(ctx: dict[str, Any], tile: Any, part: Any, sbufs: Any) -> Any:
    """rstd = (sum / H + eps) ^ -1/2 (VectorE) into the segment buffer, as [rows, kk]."""
    rows, kk, off = tile[1], tile[2], tile[4]
    rstd = sbufs[0][0:rows, off : off + kk]
    nisa.tensor_scalar(
        dst=rstd,
        data=_total(part, rows, kk),
        op0=nl.multiply,
        operand0=1.0 / ctx["x"].shape[1],
        op1=nl.add,
        operand1=float(ctx["eps"]),
    )
    nisa.tensor_scalar(dst=rstd, data=rstd, op0=nl.rsqrt, operand0=None)
    return rstd


def _total(part: Any, rows: int, kk: int) -> Any:
    """Sum of the per-chunk partial sums, [rows, kk] fp32."""
    if part.shape[2] == 1:
        return part[0:rows, :, 0]
    total = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=total[0:rows, :], op=nl.add, data=part[0:rows, :, :], axis=(2,))
    return total[0:rows, :]


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


HOOKS = {"init": _init, "chunk": _sums_chunk, "finish": _finish, "scale": _scale}
