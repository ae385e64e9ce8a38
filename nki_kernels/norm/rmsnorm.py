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
    issue_rows_load,
    load_row_vector,
    mul_by,
    prefetch_start,
    prefetch_take,
    programs,
    ring_alloc,
    row_segments,
    rows_view,
    stat_tile,
    stat_view,
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
    """All row tiles of this program, their loads issued `bufs - 1` jobs ahead."""
    n, hdim = x.shape
    pid, nprog = programs()
    segs = row_segments(n, plan["k"], pid, nprog)
    chunks = col_chunks(hdim, plan["chunk"])
    jobs = []
    for seg in segs:
        for t in seg["tiles"]:
            if plan["resident"]:
                jobs.append((t, None))
            else:
                jobs.extend((t, ch) for _ in range(2) for ch in chunks)
    ctx = {
        "x": x,
        "res": res,
        "y": y,
        "h": h_out,
        "plan": plan,
        "chunks": chunks,
        "w_sb": load_row_vector(w, hdim) if w is not None else None,
        "eps_sb": const_column(eps),
        "rings": {"x": [], "res": [], "y": [], "tmp": []},
    }
    ctx["loads"] = (("x", x), ("res", res))
    pf = prefetch_start(jobs, plan["bufs"] - 1, issue_rows_load, ctx)
    for seg in segs:
        rbuf = stat_tile(seg)
        for t in seg["tiles"]:
            if plan["resident"]:
                _rms_resident(ctx, t, prefetch_take(pf), rbuf)
            else:
                _rms_streaming(ctx, t, pf, rbuf)
        nisa.dma_copy(dst=stat_view(rstd_out, seg), src=rbuf[0 : seg["rows"], 0 : seg["cols"]])


def _rms_resident(ctx: dict[str, Any], tile: Any, ld: dict[str, Any], rbuf: Any) -> None:
    """One row tile held in SBUF: statistics chunk by chunk, then the output chunks."""
    rows, kk = tile[1], tile[2]
    chunks = ctx["chunks"]
    part = nl.ndarray((P, kk, len(chunks)), dtype=nl.float32, buffer=nl.sbuf)
    for ci, (c0, cw) in enumerate(chunks):
        rc = ld["res"][0:rows, :, c0 : c0 + cw] if "res" in ld else None
        _stats_chunk(ctx, tile, ld["x"][0:rows, :, c0 : c0 + cw], rc, c0, part, ci)
    rstd = _finish_rstd(ctx, tile, part, rbuf)
    for c0, cw in chunks:
        _out_chunk(ctx, tile, ld["x"][0:rows, :, c0 : c0 + cw], rstd, c0)


def _rms_streaming(ctx: dict[str, Any], tile: Any, pf: dict[str, Any], rbuf: Any) -> None:
    """One row tile streamed twice: chunk statistics, then reload (re-add) and output."""
    kk = tile[2]
    chunks = ctx["chunks"]
    part = nl.ndarray((P, kk, len(chunks)), dtype=nl.float32, buffer=nl.sbuf)
    for ci, (c0, cw) in enumerate(chunks):
        _stream_stats(ctx, tile, prefetch_take(pf), c0, cw, part, ci)
    rstd = _finish_rstd(ctx, tile, part, rbuf)
    for c0, cw in chunks:
        _stream_out(ctx, tile, prefetch_take(pf), c0, cw, rstd)


def _stream_stats(
    ctx: dict[str, Any], tile: Any, ld: dict[str, Any], c0: int, cw: int, part: Any, ci: int
) -> None:
    rows = tile[1]
    rc = ld["res"][0:rows, :, 0:cw] if "res" in ld else None
    _stats_chunk(ctx, tile, ld["x"][0:rows, :, 0:cw], rc, c0, part, ci)


def _stream_out(
    ctx: dict[str, Any], tile: Any, ld: dict[str, Any], c0: int, cw: int, rstd: Any
) -> None:
    rows = tile[1]
    xc = ld["x"][0:rows, :, 0:cw]
    if "res" in ld:  # h = x + residual again, bit-identical to the h stored in pass 1
        nisa.tensor_tensor(dst=xc, data1=xc, data2=ld["res"][0:rows, :, 0:cw], op=nl.add)
    _out_chunk(ctx, tile, xc, rstd, c0)


def _stats_chunk(
    ctx: dict[str, Any], tile: Any, xc: Any, rc: Any, c0: int, part: Any, ci: int
) -> None:
    """[fused: xc += rc, store h]; part[:, j, ci] = sum(xc[:, j, :]^2) per row group j."""
    rows, kk = tile[1], tile[2]
    cw = xc.shape[2]
    if rc is not None:
        nisa.tensor_tensor(dst=xc, data1=xc, data2=rc, op=nl.add)
        hv = rows_view(ctx["h"], tile)
        nisa.dma_copy(dst=hv[:, :, c0 : c0 + cw], src=xc)
    junk = nl.ndarray((P, cw), dtype=xc.dtype, buffer=nl.sbuf)
    for j in range(kk):
        nisa.activation(
            dst=junk[0:rows, :],
            op=nl.square,
            data=xc[:, j, :],
            reduce_op=nl.add,
            reduce_res=part[0:rows, j, ci : ci + 1],
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )


def _finish_rstd(ctx: dict[str, Any], tile: Any, part: Any, rbuf: Any) -> Any:
    """rstd = rsqrt(sum of the chunk sums / H + eps), written into the segment buffer."""
    rows, kk, off = tile[1], tile[2], tile[4]
    hdim = ctx["x"].shape[1]
    ssum = part
    if part.shape[2] > 1:
        ssum = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=ssum[0:rows, :], op=nl.add, data=part[0:rows, :, :], axis=(2,))
    rstd = rbuf[0:rows, off : off + kk]
    nisa.activation(
        dst=rstd,
        op=nl.rsqrt,
        data=ssum[0:rows, :],
        bias=ctx["eps_sb"][0:rows, :],
        scale=1.0 / hdim,
    )
    return rstd


def _out_chunk(ctx: dict[str, Any], tile: Any, xc: Any, rstd: Any, c0: int) -> None:
    """y[tile, c0:c0+cw] = xc * rstd * w, then its store."""
    rows, kk = tile[1], tile[2]
    cw = xc.shape[2]
    plan = ctx["plan"]
    yt = ring_alloc(ctx["rings"]["y"], plan["bufs"], (P, kk, plan["chunk"]), ctx["y"].dtype)
    w_sb = ctx["w_sb"]
    wc = w_sb[0:rows, c0 : c0 + cw] if w_sb is not None else None
    for j in range(kk):
        scale_rows(yt[0:rows, j, 0:cw], xc[:, j, :], rstd[:, j : j + 1], wc, plan, ctx["rings"])
    yv = rows_view(ctx["y"], tile)
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
