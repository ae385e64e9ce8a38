"""LayerNorm forward in NKI (weight and bias optional), fp32 statistics.

Algorithm (per row of x [N, H]):
    K     = x[:, 0]                          shift: sums of x - K do not cancel
    S1    = sum_h (x - K)                    ScalarE activation(copy, bias=-K) + add-reduce
    S2    = sum_h (x - K)^2                  ScalarE activation(square, bias=-K) + add-reduce
    mean  = K + S1 / H ;  var = max(S2 / H - (S1 / H)^2, 0) ;  rstd = (var + eps) ^ -1/2
    xn    = (x - mean) * rstd                ScalarE activation or VectorE tensor_scalar
    y     = xn * w + b                       tensor_tensor, columns split VectorE / GpSimd
The shifted sums give the centered variance even when a row's spread is tiny next to its
mean (where E[x^2] - E[x]^2 would lose every digit), reading x once. `stats="mixed"`
takes S1 as the plain sum of x on VectorE (tensor_reduce, half rate for bf16) and only
S2 on ScalarE: mean - K = sum(x)/H - K then carries an error relative to |mean|, harmless
at bf16 / fp16 output precision but not at fp32 (config.validate refuses it there).
`stats="bn"` uses VectorE's bn_stats (per <= 512 columns) and bn_aggr instead.

Loop nest: the row tiles of tiling.py through a three-stage software pipeline (step t
runs A(t), B(t-1), C(t-2)):
    A: load x; per chunk and row group: the statistics' partial sums
    B: mean, rstd (VectorE, into the segment buffers stored to HBM once per segment);
       for a resident tile xn in place
    C: y = xn * w + b per chunk; store y
Streaming mode (rows too wide for SBUF) loads column chunks in A and again in C.

Limits: any N >= 1 and H >= 1; x, w, b in fp32 / bf16 / fp16; bufs >= 3 resident, >= 2
streaming.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl
from .forward import fwd_plan, fwd_rows
from .tiling import P

# --- schedule choices -------------------------------------------------------------------
# stats: how the per-row mean and variance are formed
STATS_SCALAR = "scalar"  # two ScalarE add-reduce passes over the shifted row
STATS_MIXED = "mixed"  # VectorE tensor_reduce for S1 (unshifted), ScalarE for S2
STATS_BN = "bn"  # VectorE bn_stats per <= 512 columns, then bn_aggr
STATS_MODES = (STATS_SCALAR, STATS_MIXED, STATS_BN)
# scale_mode: which engine forms xn = (x - mean) * rstd
LN_SCALAR = "scalar"  # ScalarE activation(copy, scale=rstd, bias=-mean*rstd)
LN_VECTOR = "vector"  # VectorE tensor_scalar (subtract, multiply; bf16 perf mode)
LN_MODES = (LN_SCALAR, LN_VECTOR)
BN_FMAX = 512  # bn_stats reads at most 512 elements per partition (nl.tile_size.bn_stats_fmax)
F32 = nl.float32  # the statistics passes' discarded outputs (fp32: x - K is not bf16-exact)


@nki.jit
def layer_norm_fwd(
    x: Any,
    w: Any,
    b: Any,
    eps: float,
    rows_per_partition: int = 1,
    chunk: int = 0,
    resident: bool = True,
    bufs: int = 4,
    scale_mode: str = LN_VECTOR,
    gpsimd_eighths: int = 0,
    stats: str = STATS_SCALAR,
) -> Any:
    """LayerNorm forward: returns (y [N, H] in x.dtype, mean [N] fp32, rstd [N] fp32).

    x: [N, H] in HBM; w, b: [H] in HBM or None; eps > 0. Schedule arguments are the fields
    of `LayerNormConfig` (see `rms_norm_fwd`; `stats` picks the statistics engines).

        for tile in row tiles:
            mean, var = stats(x) ; rstd = (var + eps) ^ -1/2
            y = (x - mean) * rstd * w + b
    """
    plan = _plan(x, rows_per_partition, chunk, resident, bufs, scale_mode, gpsimd_eighths, stats)
    o = fwd_rows(HOOKS, x, plan, eps, 2, y=True, w=w, b=b, junk_dtype=F32)
    return o["y"], o["stats"][0], o["stats"][1]


@nki.jit
def layer_norm_stats(
    x: Any,
    eps: float,
    rows_per_partition: int = 1,
    chunk: int = 0,
    resident: bool = True,
    bufs: int = 4,
    scale_mode: str = LN_VECTOR,
    gpsimd_eighths: int = 0,
    stats: str = STATS_SCALAR,
) -> Any:
    """(mean [N], rstd [N]) fp32 of x [N, H] alone: the statistics the backward recomputes.

    Stages A and B of `layer_norm_fwd` (x read once); same schedule arguments.
    """
    plan = _plan(x, rows_per_partition, chunk, resident, bufs, scale_mode, gpsimd_eighths, stats)
    mean, rstd = fwd_rows(HOOKS, x, plan, eps, 2, junk_dtype=F32)["stats"]
    return mean, rstd


# --- private helpers ---------------------------------------------------------------------
def _plan(
    x: Any, k: int, chunk: int, resident: bool, bufs: int, mode: str, eng: int, stats: str
) -> Any:
    modes = {"scale_mode": (mode, LN_MODES), "stats": (stats, STATS_MODES)}
    return fwd_plan(x.shape[1], k, chunk, resident, bufs, eng, **modes)


def _sums_init(ctx: dict[str, Any], tile: Any) -> dict[str, Any]:
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


def _sums_chunk(
    ctx: dict[str, Any], tile: Any, ci: int, c0: int, v: dict[str, Any], acc: dict[str, Any]
) -> None:
    """Statistics of one column chunk of x ([rows, kk, cw]) into the tile's accumulators."""
    rows, kk = tile[1], tile[2]
    xc = v["x"]
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
    junk = ctx["junk"]
    mixed = ctx["plan"]["stats"] == STATS_MIXED
    for j in range(kk):
        if mixed:
            nisa.tensor_reduce(
                dst=acc["s1"][0:rows, j, ci : ci + 1], op=nl.add, data=xc[:, j, :], axis=(1,)
            )
        for key, fn in (("s2", nl.square),) if mixed else (("s1", nl.copy), ("s2", nl.square)):
            nisa.activation(
                dst=junk[0:rows, 0:cw],
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
    hdim = ctx["x"].shape[1]
    mean = sbufs[0][0:rows, off : off + kk]
    rstd = sbufs[1][0:rows, off : off + kk]
    var = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    if "st" in acc:
        mv = nl.ndarray((P, kk, 2), dtype=nl.float32, buffer=nl.sbuf)
        for j in range(kk):
            nisa.bn_aggr(dst=mv[0:rows, j, :], data=acc["st"][0:rows, j, :])
        nisa.tensor_copy(dst=mean, src=mv[0:rows, :, 0:1])
        nisa.tensor_copy(dst=var[0:rows, :], src=mv[0:rows, :, 1:2])
    else:
        raw = ctx["plan"]["stats"] == STATS_MIXED
        _shifted_moments(acc["s1"], acc["s2"], acc["negk"], mean, var, rows, hdim, raw)
    nisa.tensor_scalar(
        dst=rstd,
        data=var[0:rows, :],
        op0=nl.maximum,
        operand0=0.0,
        op1=nl.add,
        operand1=float(ctx["eps"]),
    )
    nisa.tensor_scalar(dst=rstd, data=rstd, op0=nl.rsqrt, operand0=None)
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


def _shifted_moments(
    s1: Any, s2: Any, negk: Any, mean: Any, var: Any, rows: int, hdim: int, raw_s1: bool
) -> None:
    """mean = K + S1/H and var = S2/H - (S1/H)^2 from per-chunk shifted sums.

    `mean` is a [rows, kk] view; with `raw_s1` the S1 partial sums are of x, not x - K.
    """
    kk = s1.shape[1]
    m1 = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    m2 = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=m1[0:rows, :], op=nl.add, data=s1[0:rows, :, :], axis=(2,))
    nisa.tensor_reduce(dst=m2[0:rows, :], op=nl.add, data=s2[0:rows, :, :], axis=(2,))
    if raw_s1:  # mean(x) - K
        nisa.scalar_tensor_tensor(
            dst=m1[0:rows, :],
            data=m1[0:rows, :],
            op0=nl.multiply,
            operand0=1.0 / hdim,
            op1=nl.add,
            operand1=negk[0:rows, :],
        )
    else:
        nisa.tensor_scalar(
            dst=m1[0:rows, :], data=m1[0:rows, :], op0=nl.multiply, operand0=1.0 / hdim
        )
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
    nisa.tensor_tensor(dst=mean, data1=m1[0:rows, :], data2=negk[0:rows, :], op=nl.subtract)


def _scale(ctx: dict[str, Any], xc: Any, cols: tuple[Any, Any, Any]) -> None:
    """xc[:, j, :] = (xc[:, j, :] - mean[:, j]) * rstd[:, j] in place."""
    mean, rstd, nmr = cols
    for j in range(xc.shape[1]):
        if ctx["plan"]["scale_mode"] == LN_SCALAR:
            nisa.activation(
                dst=xc[:, j, :],
                op=nl.copy,
                data=xc[:, j, :],
                scale=rstd[:, j : j + 1],
                bias=nmr[:, j : j + 1],
            )
        else:
            nisa.tensor_scalar(
                dst=xc[:, j, :],
                data=xc[:, j, :],
                op0=nl.subtract,
                operand0=mean[:, j : j + 1],
                op1=nl.multiply,
                operand1=rstd[:, j : j + 1],
            )


HOOKS = {"init": _sums_init, "chunk": _sums_chunk, "finish": _finish_stats, "scale": _scale}
