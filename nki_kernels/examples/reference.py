"""NumPy references of the demo kernels (fp32 math, one rounding to the output dtype)."""

from __future__ import annotations

import numpy as np


def matmul_at_b_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A^T @ B of the fp32-converted operands, rounded to A's dtype."""
    return (a.astype(np.float32).T @ b.astype(np.float32)).astype(a.dtype)


def rmsnorm_reference(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x * rsqrt(mean(x^2) + eps) * w per row, in fp32, rounded to x's dtype."""
    xf = x.astype(np.float32)
    rstd = 1.0 / np.sqrt((xf * xf).mean(axis=1, keepdims=True) + np.float32(eps))
    return (xf * rstd * w.astype(np.float32)).astype(x.dtype)
