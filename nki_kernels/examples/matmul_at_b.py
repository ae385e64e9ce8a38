"""Tiled matrix multiplication `C = A^T @ B` with PSUM accumulation, in NKI.

Algorithm: A is [K, M] and B is [K, N], both with the contraction dim K first, which is
exactly the layout TensorE wants: `nc_matmul(dst, stationary, moving)` computes
`stationary.T @ moving` with K on the partitions of both operands. C is [M, N].

Loop nest (per LNC program; program p owns a contiguous range of 512-column blocks):
    for each column block n (TILE_N = 512 columns of C):
        load B[:, n] once, as K/128 SBUF tiles [128, 512]       (resident for the block)
        for each row tile m (TILE_M = 128 rows of C):
            acc = PSUM [128, 512] fp32                           (one bank)
            for each contraction tile k (TILE_K = 128):
                load A[k, m] -> SBUF [128, 128]
                acc (+)= A[k, m].T @ B[k, n]                     accumulate=(k > 0)
            C[m, n] = acc                      (tensor_copy PSUM -> SBUF, cast; DMA out)
Ragged edges (M, N or K not multiples of the tile sizes) are handled by slicing both
sides of every instruction to the valid rows/columns; unused partitions are never read.

Limits: any K, M, N >= 1. The resident B block takes ceil(K / 128) * 512 * itemsize bytes
per partition (8 KiB for K = 1024 in bf16), so K up to ~20k fits trn2's SBUF in bf16.
Inputs in fp32 / bf16 / fp16 / fp8 (both the same kind: TensorE pairs fp32 only with
fp32); C has A's dtype. Tested on odd shapes (300 x 1000, K = 77) and with `kernel[2]`.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl

# --- tile sizes ----------------------------------------------------------------------------
TILE_K = 128  # contraction rows per matmul: the partition count of both operands
TILE_M = 128  # stationary free size = output partitions: the PE array is 128 wide
TILE_N = 512  # moving free size: 512 fp32 results fill exactly one 2 KiB PSUM bank


@nki.jit
def matmul_at_b(a: Any, b: Any) -> Any:
    """C[M, N] = A[K, M]^T @ B[K, N], accumulated in fp32 PSUM, returned in A's dtype.

    Under `matmul_at_b[2](a, b)` the two programs split the 512-column blocks of C.
    """
    assert a.ndim == 2 and b.ndim == 2, f"A and B must be 2-D; got {a.shape} and {b.shape}"
    k_dim, m_dim = a.shape
    k_b, n_dim = b.shape
    assert k_dim == k_b, f"A is [{k_dim}, {m_dim}] and B is [{k_b}, {n_dim}]: K differs"
    c = nl.ndarray((m_dim, n_dim), dtype=a.dtype, buffer=nl.shared_hbm)

    n_programs = nl.num_programs(0) if nl.program_ndim() != 0 else 1
    pid = nl.program_id(0) if nl.program_ndim() != 0 else 0
    n_blocks = (n_dim + TILE_N - 1) // TILE_N
    first, last = pid * n_blocks // n_programs, (pid + 1) * n_blocks // n_programs

    k_tiles = (k_dim + TILE_K - 1) // TILE_K
    for nb in range(first, last):
        n0 = nb * TILE_N
        ns = min(TILE_N, n_dim - n0)
        b_tiles = _load_column_block(b, n0, ns, k_tiles)
        for m0 in range(0, m_dim, TILE_M):
            ms = min(TILE_M, m_dim - m0)
            acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
            for kt in range(k_tiles):
                k0 = kt * TILE_K
                ks = min(TILE_K, k_dim - k0)
                a_sb = nl.ndarray((TILE_K, TILE_M), dtype=a.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a_sb[0:ks, 0:ms], src=a[k0 : k0 + ks, m0 : m0 + ms])
                nisa.nc_matmul(
                    dst=acc[0:ms, 0:ns],
                    stationary=a_sb[0:ks, 0:ms],
                    moving=b_tiles[kt][0:ks, 0:ns],
                    accumulate=kt > 0,
                )
            _store_tile(c, acc, m0, ms, n0, ns)
    return c


def _load_column_block(b: Any, n0: int, ns: int, k_tiles: int) -> list[Any]:
    """B[:, n0:n0+ns] as a list of [TILE_K, TILE_N] SBUF tiles, one per contraction tile."""
    k_dim = b.shape[0]
    tiles = []
    for kt in range(k_tiles):
        k0 = kt * TILE_K
        ks = min(TILE_K, k_dim - k0)
        t = nl.ndarray((TILE_K, TILE_N), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:ks, 0:ns], src=b[k0 : k0 + ks, n0 : n0 + ns])
        tiles.append(t)
    return tiles


def _store_tile(c: Any, acc: Any, m0: int, ms: int, n0: int, ns: int) -> None:
    """Evacuate PSUM through SBUF (DMA cannot read PSUM) and write C[m0:, n0:]."""
    c_sb = nl.ndarray((TILE_M, TILE_N), dtype=c.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=c_sb[0:ms, 0:ns], src=acc[0:ms, 0:ns])
    nisa.dma_copy(dst=c[m0 : m0 + ms, n0 : n0 + ns], src=c_sb[0:ms, 0:ns])
