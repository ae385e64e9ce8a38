"""RMSNorm forward and the fused residual add + RMSNorm forward, in NKI.

Algorithm (per row of x [N, H], fp32 statistics):
    ssum  = sum_h x^2                      ScalarE: activation(square) with its add-reduce
    rstd  = 1 / sqrt(ssum / H + eps)       ScalarE: one rsqrt activation per row tile
    y     = x * rstd * w                   VectorE / ScalarE / GpSimd (config `scale_mode`)
The fused variant first forms h = x + residual (VectorE), writes h back to HBM as the new
residual stream, and normalizes h -- one pass over memory: x and residual are read once,
y and h written once.

Layout and loop nest:
    rows are grouped into row tiles of `rows` partitions x `kk` rows per partition
    (partition p holds rows r0 + p*kk .. r0 + p*kk + kk - 1: one contiguous HBM run of
    kk*H elements per partition, so small-H problems still move >= 2 KiB per partition);
    for each row tile (split across LNC programs):
        pass 1, for each column chunk c (width `chunk`):
            load x[tile, c] (DMA)                      [fused: load res, h = x + res, store h]
            partial[:, j, c] = sum(x[:, j, c]^2)        ScalarE, one per row group j
        rstd = rsqrt(sum_c partial / H + eps)          -> rstd[N] in HBM (for backward)
        pass 2, for each column chunk c:
            [streaming mode: reload x[tile, c]]
            y[:, j, c] = x * rstd[:, j] * w[c]          -> store y[tile, c] (DMA)
Resident mode keeps the whole row tile in SBUF between the passes (x read from HBM once);
streaming mode (for rows too wide for SBUF) rereads it, costing one extra read of x.
Tiles allocated inside the loops rotate through `bufs` buffers, so the DMA of the next
tile overlaps the compute of the current one.

Limits: H >= 1 (any H; wide rows use streaming mode, chunk <= H); N >= 1 with a ragged
last tile (by slicing); x, residual, w in fp32 / bf16 / fp16 (w may also be None); eps is
a positive specialization-time float. The tile plan is checked by `config.validate`
and, authoritatively, by the interpreter's SBUF accounting.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl
from .tiling import (
    P,
    col_chunks,
    const_column,
    load_row_vector,
    mul_by,
    programs,
    ring_alloc,
    row_tiles,
    tile_view,
)

# --- schedule choices (values of the config fields) ------------------------------------
# scale_mode: how y = x * rstd * w is formed
SCALE_FUSED = "fused"  # VectorE scalar_tensor_tensor: (x * rstd) * w in one instruction
SCALE_SCALAR = "scalar"  # ScalarE activation(copy, scale=rstd), then a tensor_tensor with w
SCALE_VECTOR = "vector"  # VectorE tensor_scalar (bf16 perf mode), then a tensor_tensor with w
SCALE_MODES = (SCALE_FUSED, SCALE_SCALAR, SCALE_VECTOR)
# engines for the tensor_tensor multiply by w (after SCALE_SCALAR / SCALE_VECTOR)
MUL_ENGINES = ("vector", "gpsimd", "split")


@nki.jit
def rms_norm_fwd(
    x: Any,
    w: Any,
    eps: float,
    rows_per_partition: int = 1,
    chunk: int = 0,
    resident: bool = True,
    bufs: int = 2,
    scale_mode: str = SCALE_VECTOR,
    mul_engine: str = "vector",
) -> Any:
    """RMSNorm forward: returns (y [N, H] in x.dtype, rstd [N] fp32).

    x: [N, H] in HBM; w: [H] in HBM or None; eps > 0. Schedule arguments (the fields of
    `RMSNormConfig`): `rows_per_partition` row groups per partition per tile, `chunk`
    columns per compute/DMA step (0 = H), `resident` keeps the row tile in SBUF across the
    two passes, `bufs` rotating buffers per streamed tile, `scale_mode` / `mul_engine`
    pick the engines that form y.

        for tile in row tiles:                 # rows x kk rows, ragged tail sliced
            ssum = sum(x^2) ; rstd = rsqrt(ssum/H + eps)
            y = x * rstd * w
    """
    n, hdim = x.shape
    y = nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm)
    rstd = nl.ndarray((n,), dtype=nl.float32, buffer=nl.shared_hbm)
    plan = _plan(hdim, rows_per_partition, chunk, resident, bufs, scale_mode, mul_engine)
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
    bufs: int = 2,
    scale_mode: str = SCALE_VECTOR,
    mul_engine: str = "vector",
) -> Any:
    """Fused residual add + RMSNorm: returns (y, h = x + residual, rstd [N] fp32).

    x, residual: [N, H] in HBM, same dtype; h is rounded to x.dtype and y = rms_norm(h).
    Same schedule arguments as `rms_norm_fwd`.

        for tile in row tiles:
            h = x + res -> HBM ; ssum = sum(h^2) ; rstd = rsqrt(ssum/H + eps)
            y = h * rstd * w
    """
    n, hdim = x.shape
    y = nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm)
    h = nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm)
    rstd = nl.ndarray((n,), dtype=nl.float32, buffer=nl.shared_hbm)
    plan = _plan(hdim, rows_per_partition, chunk, resident, bufs, scale_mode, mul_engine)
    _rms_rows(x, residual, w, y, h, rstd, eps, plan)
    return y, h, rstd


# --- private helpers ---------------------------------------------------------------------
def _plan(
    hdim: int,
    rows_per_partition: int,
    chunk: int,
    resident: bool,
    bufs: int,
    scale_mode: str,
    mul_engine: str,
) -> dict[str, Any]:
    """Check the schedule arguments and resolve defaults (chunk 0 = the whole row)."""
    assert rows_per_partition >= 1, f"rows_per_partition must be >= 1; got {rows_per_partition}"
    assert bufs >= 1, f"bufs must be >= 1; got {bufs}"
    assert scale_mode in SCALE_MODES, f"scale_mode must be one of {SCALE_MODES}; got {scale_mode}"
    assert mul_engine in MUL_ENGINES, f"mul_engine must be one of {MUL_ENGINES}; got {mul_engine}"
    c = hdim if chunk <= 0 else min(chunk, hdim)
    return {
        "k": rows_per_partition,
        "chunk": c,
        "resident": resident,
        "bufs": bufs,
        "scale_mode": scale_mode,
        "mul_engine": mul_engine,
    }


def _rms_rows(
    x: Any, res: Any, w: Any, y: Any, h_out: Any, rstd_out: Any, eps: float, plan: dict[str, Any]
) -> None:
    """All row tiles of this program."""
    n, hdim = x.shape
    pid, nprog = programs()
    w_sb = load_row_vector(w, hdim) if w is not None else None
    eps_sb = const_column(eps)
    rings: dict[str, list[Any]] = {"x": [], "res": [], "y": [], "tmp": []}
    for r0, rows, kk in row_tiles(n, plan["k"], pid, nprog):
        _rms_tile(x, res, w_sb, eps_sb, y, h_out, rstd_out, r0, rows, kk, plan, rings)


def _rms_tile(
    x: Any,
    res: Any,
    w_sb: Any,
    eps_sb: Any,
    y: Any,
    h_out: Any,
    rstd_out: Any,
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
    depth = plan["bufs"]
    xv = tile_view(x, r0, rows, kk)
    resv = tile_view(res, r0, rows, kk) if res is not None else None
    hv = tile_view(h_out, r0, rows, kk) if h_out is not None else None
    yv = tile_view(y, r0, rows, kk)

    x_res = None
    if plan["resident"]:
        x_res = ring_alloc(rings["x"], depth, (P, kk, hdim), x.dtype)
    ssum = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    part = ssum if nch == 1 else nl.ndarray((P, kk, nch), dtype=nl.float32, buffer=nl.sbuf)

    # pass 1: load (and add the residual), per-chunk sums of squares
    for ci, (c0, cw) in enumerate(chunks):
        if x_res is not None:
            xc = x_res[0:rows, :, c0 : c0 + cw]
        else:
            xt = ring_alloc(rings["x"], depth, (P, kk, c_max), x.dtype)
            xc = xt[0:rows, :, 0:cw]
        nisa.dma_copy(dst=xc, src=xv[:, :, c0 : c0 + cw])
        if resv is not None:
            rt = ring_alloc(rings["res"], depth, (P, kk, c_max), res.dtype)
            nisa.dma_copy(dst=rt[0:rows, :, 0:cw], src=resv[:, :, c0 : c0 + cw])
            nisa.tensor_tensor(dst=xc, data1=xc, data2=rt[0:rows, :, 0:cw], op=nl.add)
            nisa.dma_copy(dst=hv[:, :, c0 : c0 + cw], src=xc)
        junk = nl.ndarray((P, c_max), dtype=x.dtype, buffer=nl.sbuf)
        for j in range(kk):
            dst_col = ssum[0:rows, j : j + 1] if nch == 1 else part[0:rows, j, ci : ci + 1]
            nisa.activation(
                dst=junk[0:rows, 0:cw],
                op=nl.square,
                data=xc[:, j, :],
                reduce_op=nl.add,
                reduce_res=dst_col,
                reduce_cmd=nisa.reduce_cmd.reset_reduce,
            )
    if nch > 1:
        nisa.tensor_reduce(dst=ssum[0:rows, :], op=nl.add, data=part[0:rows, :, :], axis=(2,))

    rstd = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(
        dst=rstd[0:rows, :],
        op=nl.rsqrt,
        data=ssum[0:rows, :],
        bias=eps_sb[0:rows, :],
        scale=1.0 / hdim,
    )
    nisa.dma_copy(dst=rstd_out[r0 : r0 + rows * kk].reshape((rows, kk)), src=rstd[0:rows, :])

    # pass 2: y = x * rstd * w, chunk by chunk
    src2 = hv if hv is not None else xv
    for c0, cw in chunks:
        if x_res is not None:
            xc = x_res[0:rows, :, c0 : c0 + cw]
        else:
            xt = ring_alloc(rings["x"], depth, (P, kk, c_max), x.dtype)
            xc = xt[0:rows, :, 0:cw]
            nisa.dma_copy(dst=xc, src=src2[:, :, c0 : c0 + cw])
        yt = ring_alloc(rings["y"], depth, (P, kk, c_max), y.dtype)
        wc = w_sb[0:rows, c0 : c0 + cw] if w_sb is not None else None
        for j in range(kk):
            scale_rows(yt[0:rows, j, 0:cw], xc[:, j, :], rstd[0:rows, j : j + 1], wc, plan, rings)
        nisa.dma_copy(dst=yv[:, :, c0 : c0 + cw], src=yt[0:rows, :, 0:cw])


def scale_rows(
    dst: Any, data: Any, col: Any, wc: Any, plan: dict[str, Any], rings: dict[str, list[Any]]
) -> None:
    """dst = data * col * wc (col: [rows, 1] fp32 per-row scale; wc: [rows, cw] or None)."""
    mode = plan["scale_mode"]
    if wc is None:
        if mode == SCALE_SCALAR:
            nisa.activation(dst=dst, op=nl.copy, data=data, scale=col)
        else:
            nisa.tensor_scalar(dst=dst, data=data, op0=nl.multiply, operand0=col)
        return
    if mode == SCALE_FUSED:
        nisa.scalar_tensor_tensor(
            dst=dst, data=data, op0=nl.multiply, operand0=col, op1=nl.multiply, operand1=wc
        )
        return
    rows, cw = dst.shape[0], dst.free_size
    tmp = ring_alloc(rings["tmp"], 2, (P, cw), dst.dtype)
    xn = tmp[0:rows, 0:cw]
    if mode == SCALE_SCALAR:
        nisa.activation(dst=xn, op=nl.copy, data=data, scale=col)
    else:
        nisa.tensor_scalar(dst=xn, data=data, op0=nl.multiply, operand0=col)
    mul_by(dst, xn, wc, plan["mul_engine"])
