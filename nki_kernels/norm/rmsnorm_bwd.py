"""RMSNorm backward in NKI: dx and the weight gradient, both reduced on chip.

Algorithm (per row; rstd from the statistics kernel or, resident plans, computed here
from the x tile in SBUF as the forward does; g = dy * w, H = hidden size):
    p     = dy * x                             VectorE (dy from PSUM) + GpSimd
    dw   += sum_rows(p * rstd)                 TensorE: p block^T @ rstd column into one
                                               PSUM bank, accumulated over the whole kernel
    s     = sum_h(g * x) = sum_h(p * w)        GpSimd product + ScalarE add-reduce
    coef  = -rstd^3 * s / H                    per row, [rows, kk] fp32
    dx    = g * rstd + x * coef                ScalarE (x * coef, PSUM) + VectorE STT
which is dx = rstd * (g - xhat * mean(g * xhat)) with xhat = x * rstd, rearranged so that
every full-width step is one instruction and the row reduction needs one product. The
pipeline, the engine split and the PSUM tricks are `backward.py`'s (shared with the
LayerNorm backward, of which this is the case mean = 0).

Limits: any N >= 1 (ragged tail sliced) and 1 <= H <= 65536 (the column sums must fit one
PSUM bank); column chunks must start at multiples of 128 (chunk % 128 == 0 or chunk = H);
under LNC 2 the programs split the row tiles and dw comes back as [2, H] fp32 per-program
column sums, which the caller adds (the cores do not synchronize).
"""

from __future__ import annotations

from typing import Any

from ..nki import nki, nl
from .backward import bwd_rows, bwd_stages
from .tiling import colsum_store, programs, row_plan


@nki.jit
def rms_norm_bwd(
    dy: Any,
    x: Any,
    w: Any,
    rstd: Any = None,
    dh: Any = None,
    eps: float = 0.0,
    rows_per_partition: int = 1,
    chunk: int = 0,
    resident: bool = True,
    bufs: int = 4,
    gpsimd_eighths: int = 0,
) -> Any:
    """RMSNorm backward: returns (dx [N, H] in x.dtype, dw [H] in w.dtype), or dx if w is None.

    Under LNC 2, dw is [2, H] fp32: each program's column sums (add the rows).

    With `dh` ([N, H], x.dtype) the kernel is the backward of the fused residual add +
    RMSNorm (x is then h = x + residual, dh the gradient of the h output): dx + dh is the
    gradient of both x and the residual.

    dy, x: [N, H] in HBM; w: [H] or None; rstd: [N] fp32 from `rms_norm_fwd` /
    `rms_norm_stats`, or None: a resident plan then computes rstd itself from x with the
    forward's statistics and `eps` (> 0), x read once for the whole backward. Schedule
    arguments as in `rms_norm_fwd`; `gpsimd_eighths` is GpSimd's share of the products
    with dy (VectorE reads dy from PSUM for the rest); any share > 0 also puts p * w on
    GpSimd.

        for tile in row tiles:
            p = dy * x ; dw += colsum(p * rstd) ; s = rowsum(p * w)
            dx = dy * w * rstd - x * rstd^3 * s / H
    """
    hdim = x.shape[1]
    plan = row_plan(
        hdim,
        rows_per_partition,
        chunk,
        resident,
        bufs,
        bwd_stages(False, resident, w is not None, rows_per_partition, hdim, rstd is None),
        True,
        gpsimd_eighths=gpsimd_eighths,
    )
    stats = (rstd,) if rstd is not None else None
    ctx = bwd_rows(dy, x, w, stats, plan, dh=dh, eps=eps)
    if w is None:
        return ctx["dx"]
    pid, nprog = programs()
    if nprog == 1:
        dw = nl.ndarray((hdim,), dtype=w.dtype, buffer=nl.shared_hbm)
        colsum_store(ctx["acc_w"], dw)
        return ctx["dx"], dw
    # LNC 2: each program wrote dx for its own rows; its fp32 column sums go to its own
    # row of dw (no barrier between the cores), and the caller adds the rows
    parts = nl.ndarray((nprog, hdim), dtype=nl.float32, buffer=nl.shared_hbm)
    colsum_store(ctx["acc_w"], parts[pid])
    return ctx["dx"], parts
