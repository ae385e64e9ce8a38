"""Tiny NKI kernels for the runtime tests."""

from __future__ import annotations

from nki_kernels.nki import nisa, nki, nl


@nki.jit
def copy_kernel(x, scale):
    """out = scale * x for a 2-D x with at most 128 rows."""
    n, h = x.shape
    out = nl.ndarray((n, h), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((n, h), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=scale)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def add_one_in_place(x):
    """x += 1 in place (x has at most 128 rows); returns nothing."""
    n, h = x.shape
    t = nl.ndarray((n, h), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=x, src=t)


@nki.jit
def split_rows_scale(x, scale):
    """out = scale * x, rows split between the LNC programs (x: [n, h], n <= 128)."""
    n, h = x.shape
    out = nl.ndarray((n, h), dtype=x.dtype, buffer=nl.shared_hbm)
    nprog = nl.num_programs(0) if nl.program_ndim() != 0 else 1
    pid = nl.program_id(0) if nl.program_ndim() != 0 else 0
    per = (n + nprog - 1) // nprog
    r0, r1 = pid * per, min(n, (pid + 1) * per)
    if r1 > r0:
        t = nl.ndarray((r1 - r0, h), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r0:r1])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=scale)
        nisa.dma_copy(dst=out[r0:r1], src=t)
    return out
