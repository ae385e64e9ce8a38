"""LayerNorm backward in NKI: dx, dweight and dbias, the cross-row sums reduced on chip.

Algorithm (per row; mean, rstd from the statistics kernel or, resident plans, computed
here from the x tile in SBUF as the forward does; g = dy * w, H = hidden size):
    p     = (x - mean) * dy                    VectorE scalar_tensor_tensor (dy from PSUM)
    dw   += sum_rows(p * rstd)                 TensorE: p block^T @ rstd column (PSUM)
    db   += sum_rows(dy)                       TensorE: dy block^T @ ones column (PSUM)
    g     = dy * w                             VectorE (dy from PSUM) + GpSimd, kept in SBUF
                                               for dx when the row tile is resident
    B     = sum_h(p * w) ;  A = sum_h(g)       GpSimd product, ScalarE add-reduces
    c1    = -rstd^3 * B / H ;  c0 = -rstd * A / H - c1 * mean          per row
    dx    = g * rstd + (x * c1 + c0)           ScalarE (PSUM) + VectorE STT
which is dx = rstd * (g - mean_h(g) - xhat * mean_h(g * xhat)) with
xhat = (x - mean) * rstd, rearranged so each full-width step is one instruction. The
pipeline is `backward.py`'s, shared with the RMSNorm backward.

Limits: any N >= 1; 1 <= H <= 65536; chunk % 128 == 0 or chunk = H. Under LNC 2 the
programs split the row tiles; dw / db come back as [2, H] fp32 per-program column sums
that the caller adds (the cores do not synchronize).
"""

from __future__ import annotations

from typing import Any

from ..nki import nki, nl
from .backward import bwd_rows, bwd_stages
from .tiling import colsum_store, programs, row_plan


@nki.jit
def layer_norm_bwd(
    dy: Any,
    x: Any,
    w: Any,
    has_bias: bool,
    mean: Any = None,
    rstd: Any = None,
    eps: float = 0.0,
    rows_per_partition: int = 1,
    chunk: int = 0,
    resident: bool = True,
    bufs: int = 4,
    gpsimd_eighths: int = 0,
) -> Any:
    """LayerNorm backward: returns (dx, dw, db); dw / db are None when w / the bias is absent.

    dy, x: [N, H] in HBM; w: [H] or None; `has_bias` whether the forward had a bias (db in
    w's dtype, else in x's); mean, rstd: [N] fp32 from `layer_norm_fwd` /
    `layer_norm_stats`, or both None: a resident plan then computes them itself from x
    with the forward's statistics and `eps` (> 0). Schedule arguments as in `rms_norm_bwd`.

        for tile in row tiles:
            p = (x - mean) * dy ; dw += colsum(p * rstd) ; db += colsum(dy)
            A = rowsum(dy * w) ; B = rowsum(p * w)
            dx = rstd * dy * w + c1 * x + c0
    """
    hdim = x.shape[1]
    assert (mean is None) == (rstd is None), "mean and rstd: both given or both None"
    inline = rstd is None
    plan = row_plan(
        hdim,
        rows_per_partition,
        chunk,
        resident,
        bufs,
        bwd_stages(True, resident, w is not None, rows_per_partition, hdim, inline),
        True,
        gpsimd_eighths=gpsimd_eighths,
    )
    stats = None if inline else (mean, rstd)
    ctx = bwd_rows(dy, x, w, stats, plan, has_bias=has_bias, ln=True, eps=eps)
    gdtype = w.dtype if w is not None else x.dtype
    pid, nprog = programs()
    grads = []
    for acc in (ctx["acc_w"], ctx["acc_b"]):
        out = None
        if acc is not None and nprog == 1:
            out = nl.ndarray((hdim,), dtype=gdtype, buffer=nl.shared_hbm)
            colsum_store(acc, out)
        elif acc is not None:
            # LNC 2: per-program fp32 column sums, one row each (no barrier); caller adds
            out = nl.ndarray((nprog, hdim), dtype=nl.float32, buffer=nl.shared_hbm)
            colsum_store(acc, out[pid])
        grads.append(out)
    return ctx["dx"], grads[0], grads[1]
