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
