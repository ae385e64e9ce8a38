"""Row-wise RMSNorm `y = x / sqrt(mean(x^2) + eps) * w`, in NKI.

Algorithm, per row of x [N, H] (statistics in fp32):
    ssum = sum_h x^2                  ScalarE activation(square) + its add-reduce registers
    rstd = rsqrt(ssum / H + eps)      ScalarE activation(rsqrt, scale=1/H, bias=eps column)
    y    = (x * rstd) * w             VectorE scalar_tensor_tensor, rounded once to x.dtype

Loop nest (per LNC program; program p owns a contiguous range of 128-row tiles):
    w is loaded once, broadcast to all 128 partitions (a stride-0 HBM view)
    for each row tile (128 rows, one row per partition; the last tile is ragged):
        load x tile
        for each column chunk of the square (CHUNK columns): accumulate into the
            ScalarE registers (reset_reduce on the first chunk, reduce after it), read
            them out on the last chunk
        rstd, then y, then store y
Chunking keeps the fp32 scratch of x^2 small whatever H is; x and y stay whole rows.

Limits: N >= 1, H >= 1. SBUF per partition ~ H * (2 * itemsize(x) * 2 + itemsize(w))
(x and y double-buffered, w resident) + CHUNK * 4: H up to ~16k in bf16 on trn2. x and w
in fp32 / bf16 / fp16; eps a positive float. Tested on odd shapes (300 x 1000) and with
`kernel[2]`.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl

# --- tile sizes ----------------------------------------------------------------------------
P = 128  # rows per tile: one row per partition
CHUNK = 2048  # columns of fp32 x^2 scratch per activation: 8 KiB per partition


@nki.jit
def rmsnorm(x: Any, w: Any, eps: float = 1e-6) -> Any:
    """y[N, H] = x[N, H] * rsqrt(mean(x^2, axis=1) + eps) * w[H], in x's dtype.

    Under `rmsnorm[2](x, w)` the two programs split the 128-row tiles.
    """
    assert x.ndim == 2, f"x must be 2-D [N, H]; got {x.shape}"
    n_rows, h = x.shape
    assert w.shape == (h,), f"w must be [{h}]; got {w.shape}"
    assert isinstance(eps, (int, float)) and eps > 0, f"eps must be a number > 0; got {eps!r}"
    y = nl.ndarray((n_rows, h), dtype=x.dtype, buffer=nl.shared_hbm)

    n_programs = nl.num_programs(0) if nl.program_ndim() != 0 else 1
    pid = nl.program_id(0) if nl.program_ndim() != 0 else 0
    n_tiles = (n_rows + P - 1) // P
    first, last = pid * n_tiles // n_programs, (pid + 1) * n_tiles // n_programs

    w_sb = nl.ndarray((P, h), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_sb, src=w.reshape((1, h)).broadcast(0, P))
    # a (P, 1) bias column instead of a scalar bias: scalar biases need NC-v3+
    eps_sb = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=eps_sb, value=float(eps))

    for tile in range(first, last):
        r0 = tile * P
        rows = min(P, n_rows - r0)
        x_sb = nl.ndarray((P, h), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_sb[0:rows], src=x[r0 : r0 + rows])
        rstd = _rstd(x_sb, rows, h, eps_sb)
        y_sb = nl.ndarray((P, h), dtype=x.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(
            dst=y_sb[0:rows],
            data=x_sb[0:rows],
            op0=nl.multiply,
            operand0=rstd[0:rows],
            op1=nl.multiply,
            operand1=w_sb[0:rows],
        )
        nisa.dma_copy(dst=y[r0 : r0 + rows], src=y_sb[0:rows])
    return y


def _rstd(x_sb: Any, rows: int, h: int, eps_sb: Any) -> Any:
    """rsqrt(mean(x^2) + eps) per row, as an fp32 (P, 1) column."""
    ssum = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    n_chunks = (h + CHUNK - 1) // CHUNK
    for c in range(n_chunks):
        c0 = c * CHUNK
        cs = min(CHUNK, h - c0)
        sq = nl.ndarray((P, CHUNK), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(
            dst=sq[0:rows, 0:cs],
            op=nl.square,
            data=x_sb[0:rows, c0 : c0 + cs],
            reduce_op=nl.add,
            reduce_res=ssum[0:rows] if c == n_chunks - 1 else None,
            reduce_cmd=nisa.reduce_cmd.reset_reduce if c == 0 else nisa.reduce_cmd.reduce,
        )
    rstd = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(
        dst=rstd[0:rows], op=nl.rsqrt, data=ssum[0:rows], scale=1.0 / h, bias=eps_sb[0:rows]
    )
    return rstd
