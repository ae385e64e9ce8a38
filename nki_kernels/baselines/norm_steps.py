"""Norm steps of TorchNeuron's native lowering: the fused forward pass and the backward.

TorchNeuron hands `aten::_fused_rms_norm` (what `F.rms_norm` / `nn.RMSNorm` call) to the
compiler as one unit (FACTS.md part 2, TorchNeuron), so the native forward is modeled as
one fused pass: each 128-row tile is read once, its statistics and the scaled output are
computed on chip, the output is written once. `layer_norm` is taken to lower the same
way (a single well-known pattern; generous to the compiler).

No public source says that the backward is one unit. Autograd's formula for the norm
backward needs a row reduction (c = sum(dy * w * x_hat)) before dx can be formed, and a
column reduction over all rows for dw; a fusing compiler without a resident row makes
that two passes over (dy, x): `norm_bwd_reduce` (both reductions, no intermediate in HBM)
and then a streaming dx step (`steps.stream_rows`). No fp32 intermediate goes through HBM.
"""

from __future__ import annotations

from typing import Any

from ..dtypes import dtype_bytes
from ..nki import nisa, nki, nl
from .steps import CHUNK_BYTES, P

RING = 3  # row-tile buffers: 3 x 16 KiB per partition at H = 8192 bf16


def _chunks(cols: int, dtype: Any) -> list[tuple[int, int]]:
    fc = max(1, min(cols, CHUNK_BYTES // dtype_bytes(dtype)))
    return [(c0, min(fc, cols - c0)) for c0 in range(0, cols, fc)]


@nki.jit
def norm_rows(
    x: Any,
    residual: Any,
    w: Any,
    centered: bool,
    out_dtype: Any,
    b: Any = None,
    eps: float = 1e-6,
) -> Any:
    """One fused norm pass: y = (x [+ residual] - mean?) * rstd * w [+ b], per 128-row tile.

    x, residual: [R, C] (residual may be None: then s = x); w, b: [C] (b may be None).
    `centered`: LayerNorm (mean subtracted, var = E[x^2] - mean^2, one pass over x);
    else RMSNorm (rstd = (E[x^2] + eps)^-1/2). Returns y [R, C] and, with a residual, also
    writes s = x + residual (what `add_rms_norm`'s composition returns). The row tile
    stays in SBUF between the statistics and the scale pass (rows up to 24 KiB per
    partition).
    """
    rows, cols = x.shape
    y = nl.ndarray((rows, cols), dtype=out_dtype, buffer=nl.shared_hbm)
    # the sum x + residual is an output too (y alone when there is no residual)
    s_out = nl.ndarray(
        (rows, cols) if residual is not None else (1, 1), dtype=x.dtype, buffer=nl.shared_hbm
    )
    chunks = _chunks(cols, x.dtype)
    fc = chunks[0][1]
    nch = len(chunks)
    wt = nl.ndarray((P, cols), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt[:, :], src=w.reshape((1, cols)).broadcast(0, P))
    bt = None
    if b is not None:
        bt = nl.ndarray((P, cols), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=bt[:, :], src=b.reshape((1, cols)).broadcast(0, P))
    nstat = 2 if centered else 1
    # row tiles rotate through RING buffers, so tile i + 1 loads while tile i computes
    ring = [nl.ndarray((P, cols), dtype=x.dtype, buffer=nl.sbuf) for _ in range(RING)]
    for ti, r0 in enumerate(range(0, rows, P)):
        rs = min(P, rows - r0)
        xt = ring[ti % RING]
        parts = nl.ndarray((P, nstat, nch), dtype=nl.float32, buffer=nl.sbuf)
        for ci in range(nch):
            c0, cs = chunks[ci]
            nisa.dma_copy(dst=xt[0:rs, c0 : c0 + cs], src=x[r0 : r0 + rs, c0 : c0 + cs])
            if residual is not None:
                rt = nl.ndarray((P, fc), dtype=x.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=rt[0:rs, 0:cs], src=residual[r0 : r0 + rs, c0 : c0 + cs])
                nisa.tensor_tensor(
                    dst=xt[0:rs, c0 : c0 + cs],
                    data1=xt[0:rs, c0 : c0 + cs],
                    data2=rt[0:rs, 0:cs],
                    op=nl.add,
                )
                nisa.dma_copy(dst=s_out[r0 : r0 + rs, c0 : c0 + cs], src=xt[0:rs, c0 : c0 + cs])
            junk = nl.ndarray((P, fc), dtype=x.dtype, buffer=nl.sbuf)
            nisa.activation(
                dst=junk[0:rs, 0:cs],
                op=nl.square,
                data=xt[0:rs, c0 : c0 + cs],
                reduce_op=nl.add,
                reduce_res=parts[0:rs, 0, ci : ci + 1],
                reduce_cmd=nisa.reduce_cmd.reset_reduce,
            )
            if centered:
                nisa.tensor_reduce(
                    dst=parts[0:rs, 1, ci : ci + 1],
                    op=nl.add,
                    data=xt[0:rs, c0 : c0 + cs],
                    axis=(1,),
                )
        stats = nl.ndarray((P, nstat), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=stats[0:rs, :], op=nl.add, data=parts[0:rs, :, :], axis=(2,))
        rstd = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(
            dst=rstd[0:rs, :],
            data=stats[0:rs, 0:1],
            op0=nl.multiply,
            operand0=1.0 / cols,
            op1=nl.add,
            operand1=eps,
        )
        # the shift subtracted before scaling: the mean (LayerNorm) or 0 (RMSNorm)
        shift = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(
            dst=shift[0:rs, :],
            data=stats[0:rs, nstat - 1 : nstat],
            op0=nl.multiply,
            operand0=1.0 / cols if centered else 0.0,
        )
        if centered:  # E[x^2] + eps - mean^2
            msq = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(
                dst=msq[0:rs, :], data1=shift[0:rs, :], data2=shift[0:rs, :], op=nl.multiply
            )
            nisa.tensor_tensor(
                dst=rstd[0:rs, :], data1=rstd[0:rs, :], data2=msq[0:rs, :], op=nl.subtract
            )
        nisa.tensor_scalar(dst=rstd[0:rs, :], data=rstd[0:rs, :], op0=nl.rsqrt, operand0=None)
        for ci in range(nch):
            c0, cs = chunks[ci]
            # VectorE: (x - mean) * rstd (one tensor_scalar, bf16 fast mode), then * w;
            # ScalarE keeps the statistics pass, so the two engines pipeline over tiles
            nt = nl.ndarray((P, fc), dtype=out_dtype, buffer=nl.sbuf)
            nisa.tensor_scalar(
                dst=nt[0:rs, 0:cs],
                data=xt[0:rs, c0 : c0 + cs],
                op0=nl.subtract,
                operand0=shift[0:rs, :],
                op1=nl.multiply,
                operand1=rstd[0:rs, :],
            )
            yt = nl.ndarray((P, fc), dtype=out_dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(
                dst=yt[0:rs, 0:cs],
                data1=nt[0:rs, 0:cs],
                data2=wt[0:rs, c0 : c0 + cs],
                op=nl.multiply,
            )
            if bt is not None:
                bc = bt[0:rs, c0 : c0 + cs]
                nisa.tensor_tensor(dst=yt[0:rs, 0:cs], data1=yt[0:rs, 0:cs], data2=bc, op=nl.add)
            nisa.dma_copy(dst=y[r0 : r0 + rs, c0 : c0 + cs], src=yt[0:rs, 0:cs])
    if residual is not None:
        return y, s_out
    return y


@nki.jit
def norm_bwd_reduce(dy: Any, x: Any, rstd: Any, w: Any, bias_grad: bool) -> Any:
    """The backward's reduction pass: c[r] = sum_c dy * w * x_hat and dw[c] = sum_r dy * x_hat
    (and, with `bias_grad`, LayerNorm's db[c] = sum_r dy).

    dy, x: [R, C]; rstd: [R, 1] fp32 (saved by the forward); w: [C]. Returns (c [R, 1]
    fp32, dw [C, 1] fp32[, db [C, 1] fp32]). Element-wise producers are fused into both
    reductions: VectorE forms dy * x, ScalarE scales it by rstd (x_hat * dy, kept in
    SBUF) and, from dy * x * w, accumulates the row sum; TensorE sums columns over rows by
    a matmul with a ones column, accumulated in PSUM across all row tiles ([128 columns,
    C/128] per bank).
    """
    rows, cols = x.shape
    c_out = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    dw_out = nl.ndarray((cols, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    nsum = 2 if bias_grad else 1
    db_out = nl.ndarray((cols, 1), dtype=nl.float32, buffer=nl.shared_hbm) if bias_grad else None
    chunks = _chunks(cols, x.dtype)
    fc = chunks[0][1]
    nch = len(chunks)
    ncb = (cols + P - 1) // P
    wt = nl.ndarray((P, cols), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt[:, :], src=w.reshape((1, cols)).broadcast(0, P))
    ones = nl.ndarray((P, 1), dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=ones[:, :], value=1.0)
    acc = nl.ndarray((P, nsum, ncb), dtype=nl.float32, buffer=nl.psum)
    # Every (row tile, chunk) step has two stages: A = loads, dy * x (VectorE), x_hat dy
    # (ScalarE); B = * w (VectorE), row-sum (ScalarE), column sums (TensorE). B of step i
    # is issued after A of step i + 1, as a scheduling compiler would, so the in-order
    # VectorE and ScalarE queues overlap instead of waiting on each other. Working tiles
    # rotate through RING sets (dy, x, dy x, x_hat dy, x_hat dy w).
    sets = [nl.ndarray((P, 5, fc), dtype=x.dtype, buffer=nl.sbuf) for _ in range(RING)]
    row_tiles = list(range(0, rows, P))
    rts = [nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf) for _ in range(2)]
    partss = [nl.ndarray((P, nch), dtype=nl.float32, buffer=nl.sbuf) for _ in range(2)]
    work = [(ri, ci) for ri in range(len(row_tiles)) for ci in range(nch)]
    for step in range(len(work) + 1):
        if step < len(work):
            ri, ci = work[step]
            _bwd_stage_a(dy, x, rstd, sets[step % RING], rts[ri % 2], row_tiles[ri], chunks[ci], ci)
        if step > 0:
            ri, ci = work[step - 1]
            r0 = row_tiles[ri]
            rs = min(P, rows - r0)
            parts = partss[ri % 2]
            _bwd_stage_b(
                sets[(step - 1) % RING], wt, ones, acc, parts, rs, chunks[ci], ci, ri, nsum
            )
            if ci == nch - 1:
                ct = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_reduce(dst=ct[0:rs, :], op=nl.add, data=parts[0:rs, :], axis=(1,))
                nisa.dma_copy(dst=c_out[r0 : r0 + rs, :], src=ct[0:rs, :])
    sums = nl.ndarray((P, nsum, ncb), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=sums[:, :, :], src=acc[:, :, :])
    outs = [dw_out, db_out] if bias_grad else [dw_out]
    for si in range(nsum):
        for cb in range(ncb):
            cs = min(P, cols - cb * P)
            nisa.dma_copy(dst=outs[si][cb * P : cb * P + cs, :], src=sums[0:cs, si, cb : cb + 1])
    if bias_grad:
        return c_out, dw_out, db_out
    return c_out, dw_out


def _bwd_stage_a(
    dy: Any, x: Any, rstd: Any, buf: Any, rt: Any, r0: int, chunk: tuple[int, int], ci: int
) -> None:
    rs = min(P, x.shape[0] - r0)
    c0, cs = chunk
    if ci == 0:
        nisa.dma_copy(dst=rt[0:rs, :], src=rstd[r0 : r0 + rs, :])
    dyt, xt, prod, xhat_dy = buf[:, 0, :], buf[:, 1, :], buf[:, 2, :], buf[:, 3, :]
    nisa.dma_copy(dst=dyt[0:rs, 0:cs], src=dy[r0 : r0 + rs, c0 : c0 + cs])
    nisa.dma_copy(dst=xt[0:rs, 0:cs], src=x[r0 : r0 + rs, c0 : c0 + cs])
    nisa.tensor_tensor(
        dst=prod[0:rs, 0:cs], data1=dyt[0:rs, 0:cs], data2=xt[0:rs, 0:cs], op=nl.multiply
    )
    nisa.activation(dst=xhat_dy[0:rs, 0:cs], op=nl.copy, data=prod[0:rs, 0:cs], scale=rt[0:rs, :])


def _bwd_stage_b(
    buf: Any,
    wt: Any,
    ones: Any,
    acc: Any,
    parts: Any,
    rs: int,
    chunk: tuple[int, int],
    ci: int,
    ri: int,
    nsum: int,
) -> None:
    c0, cs = chunk
    dyt, xhat_dy, pw = buf[:, 0, :], buf[:, 3, :], buf[:, 4, :]
    nisa.tensor_tensor(
        dst=pw[0:rs, 0:cs], data1=xhat_dy[0:rs, 0:cs], data2=wt[0:rs, c0 : c0 + cs], op=nl.multiply
    )
    # the element-wise result is discarded; only the accumulated row sum is kept
    nisa.activation(
        dst=buf[0:rs, 2, 0:cs],
        op=nl.copy,
        data=pw[0:rs, 0:cs],
        reduce_op=nl.add,
        reduce_res=parts[0:rs, ci : ci + 1],
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )
    for j0 in range(0, cs, P):
        js = min(P, cs - j0)
        cb = (c0 + j0) // P
        for si in range(nsum):
            src = xhat_dy if si == 0 else dyt
            nisa.nc_matmul(
                dst=acc[0:js, si, cb : cb + 1],
                stationary=src[0:rs, j0 : j0 + js],
                moving=ones[0:rs, 0:1],
                accumulate=ri > 0,
            )
