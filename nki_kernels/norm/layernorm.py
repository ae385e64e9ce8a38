"""LayerNorm forward in NKI (weight and bias optional), fp32 statistics.

Algorithm (per row of x [N, H]):
    K     = x[:, 0]                          shift: sums of x - K do not cancel
    S1    = sum_h (x - K)                    ScalarE activation(copy, bias=-K) + add-reduce
    S2    = sum_h (x - K)^2                  ScalarE activation(square, bias=-K) + add-reduce
    mean  = K + S1 / H ;  var = max(S2 / H - (S1 / H)^2, 0) ;  rstd = rsqrt(var + eps)
    y     = (x - mean) * rstd * w + b        engines chosen by `scale_mode`
The shifted sums give the exact centered variance whenever the row's spread is small
next to its mean (the case where E[x^2] - E[x]^2 would lose every digit) while reading
x once; with `stats="bn"` VectorE's bn_stats / bn_aggr (per 512-column chunk) compute
mean and variance instead, leaving ScalarE free.

Loop nest (the row tiles and column chunks of rmsnorm.py):
    for each row tile (rows partitions x kk rows per partition):
        pass 1, per chunk: load x; per row group j: S1, S2 partial sums (or bn_stats)
        mean, rstd (small [rows, kk] ops) -> HBM (saved for backward)
        pass 2, per chunk: [streaming: reload x]; per j: y = affine(x); store y

Limits: any N >= 1 and H >= 1 (wide rows stream); x, w, b in fp32 / bf16 / fp16.
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

# --- schedule choices -------------------------------------------------------------------
# stats: how the per-row mean and variance are formed
STATS_SCALAR = "scalar"  # two ScalarE add-reduce passes over the shifted row
STATS_BN = "bn"  # VectorE bn_stats per <= 512 columns, then bn_aggr
STATS_MODES = (STATS_SCALAR, STATS_BN)
# scale_mode: how y = (x - mean) * rstd * w + b is formed
LN_FUSED = "fused"  # two VectorE scalar_tensor_tensor: ((x - mean) * w) then (* rstd + b)
LN_SCALAR = "scalar"  # ScalarE activation for (x - mean) * rstd, tensor_tensor for w, b
LN_VECTOR = "vector"  # VectorE tensor_scalar for (x - mean) * rstd, tensor_tensor for w, b
LN_MODES = (LN_FUSED, LN_SCALAR, LN_VECTOR)
BN_FMAX = 512  # bn_stats reads at most 512 elements per partition (nl.tile_size.bn_stats_fmax)


@nki.jit
def layer_norm_fwd(
    x: Any,
    w: Any,
    b: Any,
    eps: float,
    rows_per_partition: int = 1,
    chunk: int = 0,
    resident: bool = True,
    bufs: int = 2,
    scale_mode: str = LN_FUSED,
    mul_engine: str = "vector",
    stats: str = STATS_SCALAR,
) -> Any:
    """LayerNorm forward: returns (y [N, H] in x.dtype, mean [N] fp32, rstd [N] fp32).

    x: [N, H] in HBM; w, b: [H] in HBM or None; eps > 0. Schedule arguments are the fields
    of `LayerNormConfig` (see `rms_norm_fwd`; `stats` picks the statistics engine).

        for tile in row tiles:
            mean, var = stats(x) ; rstd = rsqrt(var + eps)
            y = (x - mean) * rstd * w + b
    """
    assert scale_mode in LN_MODES, f"scale_mode must be one of {LN_MODES}; got {scale_mode}"
    assert stats in STATS_MODES, f"stats must be one of {STATS_MODES}; got {stats}"
    assert rows_per_partition >= 1 and bufs >= 2
    n, hdim = x.shape
    y = nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm)
    mean = nl.ndarray((n,), dtype=nl.float32, buffer=nl.shared_hbm)
    rstd = nl.ndarray((n,), dtype=nl.float32, buffer=nl.shared_hbm)
    c = hdim if chunk <= 0 else min(chunk, hdim)
    plan = {
        "chunk": c,
        "resident": resident,
        "bufs": bufs,
        "scale_mode": scale_mode,
        "mul_engine": mul_engine,
        "stats": stats,
    }
    pid, nprog = programs()
    segs = row_segments(n, rows_per_partition, pid, nprog)
    chunks = col_chunks(hdim, c)
    jobs = []
    for seg in segs:
        for t in seg["tiles"]:
            if resident:
                jobs.append((t, None))
            else:
                jobs.extend((t, ch) for _ in range(2) for ch in chunks)
    ctx = {
        "y": y,
        "plan": plan,
        "chunks": chunks,
        "w_sb": load_row_vector(w, hdim) if w is not None else None,
        "b_sb": load_row_vector(b, hdim) if b is not None else None,
        "eps_sb": const_column(eps),
        "rings": {"x": [], "y": []},
        "loads": (("x", x),),
    }
    pf = prefetch_start(jobs, bufs - 1, issue_rows_load, ctx)
    for seg in segs:
        bufs_seg = (stat_tile(seg), stat_tile(seg))  # mean, rstd of the segment's rows
        for t in seg["tiles"]:
            if resident:
                _ln_resident(ctx, t, prefetch_take(pf), bufs_seg)
            else:
                _ln_streaming(ctx, t, pf, bufs_seg)
        rows, cols = seg["rows"], seg["cols"]
        nisa.dma_copy(dst=stat_view(mean, seg), src=bufs_seg[0][0:rows, 0:cols])
        nisa.dma_copy(dst=stat_view(rstd, seg), src=bufs_seg[1][0:rows, 0:cols])
    return y, mean, rstd


# --- private helpers ---------------------------------------------------------------------
def _ln_resident(ctx: dict[str, Any], tile: Any, ld: dict[str, Any], sbufs: Any) -> None:
    rows = tile[1]
    acc = _stats_init(ctx, tile)
    for ci, (c0, cw) in enumerate(ctx["chunks"]):
        _stats_chunk(ctx, tile, ld["x"][0:rows, :, c0 : c0 + cw], ci, acc)
    cols = _finish_stats(ctx, tile, acc, sbufs)
    for c0, cw in ctx["chunks"]:
        _out_chunk(ctx, tile, ld["x"][0:rows, :, c0 : c0 + cw], cols, c0)


def _ln_streaming(ctx: dict[str, Any], tile: Any, pf: dict[str, Any], sbufs: Any) -> None:
    rows = tile[1]
    acc = _stats_init(ctx, tile)
    for ci, (_, cw) in enumerate(ctx["chunks"]):
        ld = prefetch_take(pf)
        _stats_chunk(ctx, tile, ld["x"][0:rows, :, 0:cw], ci, acc)
        ld = None  # release the chunk's buffer before the next take (double buffering)
    cols = _finish_stats(ctx, tile, acc, sbufs)
    for c0, cw in ctx["chunks"]:
        ld = prefetch_take(pf)
        _out_chunk(ctx, tile, ld["x"][0:rows, :, 0:cw], cols, c0)
        ld = None


def _stats_init(ctx: dict[str, Any], tile: Any) -> dict[str, Any]:
    """Per-tile accumulators: bn_stats records, or the shifted sums and the shift."""
    kk = tile[2]
    chunks = ctx["chunks"]
    if ctx["plan"]["stats"] == STATS_BN:
        nsub = sum((cw + BN_FMAX - 1) // BN_FMAX for _, cw in chunks)
        st = nl.ndarray((P, kk, nsub * 6), dtype=nl.float32, buffer=nl.sbuf)
        return {"st": st, "sub": [0]}
    nch = len(chunks)
    return {
        "s1": nl.ndarray((P, kk, nch), dtype=nl.float32, buffer=nl.sbuf),
        "s2": nl.ndarray((P, kk, nch), dtype=nl.float32, buffer=nl.sbuf),
        "negk": nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf),
    }


def _stats_chunk(ctx: dict[str, Any], tile: Any, xc: Any, ci: int, acc: dict[str, Any]) -> None:
    """Statistics of one column chunk `xc` ([rows, kk, cw]) into the tile's accumulators."""
    rows, kk = tile[1], tile[2]
    cw = xc.shape[2]
    if "st" in acc:
        sub = acc["sub"][0]
        for j in range(kk):
            for s0 in range(0, cw, BN_FMAX):
                k0 = (sub + s0 // BN_FMAX) * 6
                nisa.bn_stats(
                    dst=acc["st"][0:rows, j, k0 : k0 + 6],
                    data=xc[:, j, s0 : s0 + min(BN_FMAX, cw - s0)],
                )
        acc["sub"][0] = sub + (cw + BN_FMAX - 1) // BN_FMAX
        return
    negk = acc["negk"]
    if ci == 0:
        nisa.tensor_scalar(dst=negk[0:rows, :], data=xc[:, :, 0:1], op0=nl.multiply, operand0=-1.0)
    junk = nl.ndarray((P, cw), dtype=nl.float32, buffer=nl.sbuf)
    for j in range(kk):
        for key, fn in (("s1", nl.copy), ("s2", nl.square)):
            nisa.activation(
                dst=junk[0:rows, :],
                op=fn,
                data=xc[:, j, :],
                bias=negk[0:rows, j : j + 1],
                reduce_op=nl.add,
                reduce_res=acc[key][0:rows, j, ci : ci + 1],
                reduce_cmd=nisa.reduce_cmd.reset_reduce,
            )


def _finish_stats(
    ctx: dict[str, Any], tile: Any, acc: dict[str, Any], sbufs: Any
) -> tuple[Any, Any, Any]:
    """mean, rstd (into the segment buffers) and -mean*rstd (for ScalarE), as [rows, kk]."""
    rows, kk, off = tile[1], tile[2], tile[4]
    hdim = ctx["y"].shape[1]
    mean = sbufs[0][0:rows, off : off + kk]
    rstd = sbufs[1][0:rows, off : off + kk]
    var = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    if "st" in acc:
        mv = nl.ndarray((P, kk, 2), dtype=nl.float32, buffer=nl.sbuf)
        for j in range(kk):
            nisa.bn_aggr(dst=mv[0:rows, j, :], data=acc["st"][0:rows, j, :])
        nisa.tensor_copy(dst=mean, src=mv[0:rows, :, 0:1])
        nisa.tensor_scalar(
            dst=var[0:rows, :], data=mv[0:rows, :, 1:2], op0=nl.maximum, operand0=0.0
        )
    else:
        _shifted_moments(acc["s1"], acc["s2"], acc["negk"], mean, var, rows, hdim)
    nisa.activation(dst=rstd, op=nl.rsqrt, data=var[0:rows, :], bias=ctx["eps_sb"][0:rows, :])
    nmr = None
    if ctx["plan"]["scale_mode"] == LN_SCALAR:
        nmr = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(
            dst=nmr[0:rows, :],
            data=mean,
            op0=nl.multiply,
            operand0=-1.0,
            op1=nl.multiply,
            operand1=rstd,
        )
        nmr = nmr[0:rows, :]
    return mean, rstd, nmr


def _out_chunk(
    ctx: dict[str, Any], tile: Any, xc: Any, cols: tuple[Any, Any, Any], c0: int
) -> None:
    """y = (xc - mean) * rstd * w + b for one column chunk, then its store."""
    rows, kk = tile[1], tile[2]
    cw = xc.shape[2]
    plan, y = ctx["plan"], ctx["y"]
    yt = ring_alloc(ctx["rings"]["y"], plan["bufs"], (P, kk, plan["chunk"]), y.dtype)
    w_sb, b_sb = ctx["w_sb"], ctx["b_sb"]
    wc = w_sb[0:rows, c0 : c0 + cw] if w_sb is not None else None
    bc = b_sb[0:rows, c0 : c0 + cw] if b_sb is not None else None
    mean, rstd, nmr = cols
    for j in range(kk):
        jcols = (
            mean[:, j : j + 1],
            rstd[:, j : j + 1],
            nmr[:, j : j + 1] if nmr is not None else None,
        )
        _affine(yt[0:rows, j, 0:cw], xc[:, j, :], jcols, wc, bc, plan)
    nisa.dma_copy(dst=rows_view(y, tile)[:, :, c0 : c0 + cw], src=yt[0:rows, :, 0:cw])


def _shifted_moments(
    s1: Any, s2: Any, negk: Any, mean: Any, var: Any, rows: int, hdim: int
) -> None:  # mean: a [rows, kk] view
    """mean = K + S1/H, var = max(S2/H - (S1/H)^2, 0) from per-chunk shifted sums."""
    kk = s1.shape[1]
    m1 = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    m2 = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=m1[0:rows, :], op=nl.add, data=s1[0:rows, :, :], axis=(2,))
    nisa.tensor_reduce(dst=m2[0:rows, :], op=nl.add, data=s2[0:rows, :, :], axis=(2,))
    nisa.tensor_scalar(dst=m1[0:rows, :], data=m1[0:rows, :], op0=nl.multiply, operand0=1.0 / hdim)
    sq = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=sq[0:rows, :], data1=m1[0:rows, :], data2=m1[0:rows, :], op=nl.multiply)
    nisa.scalar_tensor_tensor(
        dst=var[0:rows, :],
        data=m2[0:rows, :],
        op0=nl.multiply,
        operand0=1.0 / hdim,
        op1=nl.subtract,
        operand1=sq[0:rows, :],
    )
    nisa.tensor_scalar(dst=var[0:rows, :], data=var[0:rows, :], op0=nl.maximum, operand0=0.0)
    nisa.tensor_tensor(dst=mean, data1=m1[0:rows, :], data2=negk[0:rows, :], op=nl.subtract)


def _affine(
    dst: Any, xc: Any, cols: tuple[Any, Any, Any], wc: Any, bc: Any, plan: dict[str, Any]
) -> None:
    """dst = (xc - mean) * rstd * wc + bc for one row group (wc, bc may be None)."""
    mean, rstd, nmr = cols
    rows, cw = dst.shape[0], dst.free_size
    mode, eng = plan["scale_mode"], plan["mul_engine"]
    if wc is None and bc is None:
        if mode == LN_SCALAR:
            nisa.activation(dst=dst, op=nl.copy, data=xc, scale=rstd, bias=nmr)
        else:
            nisa.tensor_scalar(
                dst=dst, data=xc, op0=nl.subtract, operand0=mean, op1=nl.multiply, operand1=rstd
            )
        return
    if mode == LN_FUSED and wc is not None:
        t = nl.ndarray((P, cw), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(
            dst=t[0:rows, :],
            data=xc,
            op0=nl.subtract,
            operand0=mean,
            op1=nl.multiply,
            operand1=wc,
        )
        if bc is None:
            nisa.tensor_scalar(dst=dst, data=t[0:rows, :], op0=nl.multiply, operand0=rstd)
        else:
            nisa.scalar_tensor_tensor(
                dst=dst,
                data=t[0:rows, :],
                op0=nl.multiply,
                operand0=rstd,
                op1=nl.add,
                operand1=bc,
            )
        return
    # (x - mean) * rstd first, then the weight and / or bias with tensor_tensor
    xn_dtype = nl.float32 if mode == LN_FUSED else dst.dtype
    xn = nl.ndarray((P, cw), dtype=xn_dtype, buffer=nl.sbuf)
    if mode == LN_SCALAR:
        nisa.activation(dst=xn[0:rows, :], op=nl.copy, data=xc, scale=rstd, bias=nmr)
    else:
        nisa.tensor_scalar(
            dst=xn[0:rows, :],
            data=xc,
            op0=nl.subtract,
            operand0=mean,
            op1=nl.multiply,
            operand1=rstd,
        )
    if wc is None:
        nisa.tensor_tensor(dst=dst, data1=xn[0:rows, :], data2=bc, op=nl.add)
        return
    if bc is None:
        mul_by(dst, xn[0:rows, :], wc, eng)
        return
    t = nl.ndarray((P, cw), dtype=dst.dtype, buffer=nl.sbuf)
    mul_by(t[0:rows, :], xn[0:rows, :], wc, eng)
    nisa.tensor_tensor(dst=dst, data1=t[0:rows, :], data2=bc, op=nl.add)
