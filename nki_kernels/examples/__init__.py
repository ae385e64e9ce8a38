"""Demo kernels in the NKI 0.6 dialect: a tiled `C = A^T @ B` and a row-wise RMSNorm.

They show the dialect the project's kernels use (destination-passing `nisa` calls, explicit
SBUF/PSUM tiles, ragged edges by slicing, LNC2 work splitting by `program_id`) and are the
workload of the interpreter benchmark. `reference.py` holds their NumPy references.
"""

from __future__ import annotations

from .matmul_at_b import matmul_at_b
from .reference import matmul_at_b_reference, rmsnorm_reference
from .rmsnorm import rmsnorm

__all__ = ["matmul_at_b", "matmul_at_b_reference", "rmsnorm", "rmsnorm_reference"]
