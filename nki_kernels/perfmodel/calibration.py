"""Calibration kernels: the four matmuls of the NKI matmul tutorial, and a DMA-size sweep.

The tutorial optimizes `C[M, N] = A[M, K] @ B[K, N]` (A given transposed, `lhsT = A.T`
of shape [K, M]) in four steps and publishes trn1 hardware latencies for
[4096, 8192] @ [8192, 8192] bf16 (HARDWARE.md, calibration anchors):

==========================  ======================================================  =========
kernel                      loop nest                                               published
==========================  ======================================================  =========
`matmul_tiled`              m, n, k: load both tiles, matmul, evacuate, store       51.80 ms
`matmul_hoisted`            m: load lhsT column; n: load rhs column; k: matmul      42.96 ms
`matmul_block_free`         m-block (2 tiles): lhsT; n-block (2 tiles): rhs; tiles  22.07 ms
`matmul_fully_blocked`      n-block, k-block, m-block (16 x 2 x 8 tiles); SBUF acc   6.97 ms
==========================  ======================================================  =========

These are this project's own kernels written from that description in the NKI 0.6
dialect; the cost model is judged by how it ranks and prices them. `dma_sweep` moves
`total_bytes` from HBM to SBUF in [128, bytes_per_partition] transfers, the shape of the
DMA efficiency curve in HARDWARE.md.
"""

from __future__ import annotations

from typing import Any

from ..dtypes import dtype_bytes
from ..nki import nisa, nki, nl

# ---- tile sizes: the TensorE limits (stationary 128 x 128, moving 128 x 512) -----------
TILE_K = 128  # contraction rows = SBUF partitions
TILE_M = 128  # stationary free size = PSUM output partitions
TILE_N = 512  # moving free size = one 2 KiB fp32 PSUM bank

# ---- the published shape: [4096, 8192] @ [8192, 8192] bf16 on trn1 ----------------------
PUBLISHED_M, PUBLISHED_K, PUBLISHED_N = 4096, 8192, 8192
PUBLISHED_MS = {
    "matmul_tiled": 51.80,
    "matmul_hoisted": 42.96,
    "matmul_block_free": 22.07,
    "matmul_fully_blocked": 6.97,
}


def _dims(lhsT: Any, rhs: Any, bm: int, bn: int, bk: int) -> tuple[int, int, int]:
    k, m = lhsT.shape
    k2, n = rhs.shape
    if k != k2:
        raise ValueError(f"rhs: expected {k} rows (the contraction size of lhsT); got {k2}")
    for arg, size, block in (("lhsT dim 1 (M)", m, bm), ("rhs dim 1 (N)", n, bn), ("K", k, bk)):
        if size % block:
            raise ValueError(f"{arg}: expected a multiple of {block}; got {size}")
    return k, m, n


def _load_k_tiles(src: Any, col0: int, width: int) -> list[Any]:
    """src[:, col0:col0+width] as one [TILE_K, width] SBUF tile per contraction tile."""
    tiles = []
    for ki in range(src.shape[0] // TILE_K):
        t = nl.ndarray((TILE_K, width), dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src[ki * TILE_K : (ki + 1) * TILE_K, col0 : col0 + width])
        tiles.append(t)
    return tiles


@nki.jit
def matmul_tiled(lhsT: Any, rhs: Any) -> Any:
    """C = lhsT.T @ rhs, one output tile at a time; both operand tiles loaded per k step.

    lhsT: [K, M], rhs: [K, N] in HBM; K, M multiples of 128, N a multiple of 512.
    Every matmul needs two fresh DMAs (a 256 B and a 1 KiB row per partition in bf16), so
    the kernel is bound by DMA descriptors.
    """
    k, m, n = _dims(lhsT, rhs, TILE_M, TILE_N, TILE_K)
    out = nl.ndarray((m, n), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for mi in range(m // TILE_M):
        ms = slice(mi * TILE_M, (mi + 1) * TILE_M)
        for ni in range(n // TILE_N):
            ns = slice(ni * TILE_N, (ni + 1) * TILE_N)
            acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
            for ki in range(k // TILE_K):
                ks = slice(ki * TILE_K, (ki + 1) * TILE_K)
                a = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                b = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhsT[ks, ms])
                nisa.dma_copy(dst=b, src=rhs[ks, ns])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b, accumulate=ki > 0)
            c = nl.ndarray((TILE_M, TILE_N), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=c, src=acc)
            nisa.dma_copy(dst=out[ms, ns], src=c)
    return out


@nki.jit
def matmul_hoisted(lhsT: Any, rhs: Any) -> Any:
    """C = lhsT.T @ rhs with the loads hoisted out of the k loop.

    For each 128-row output stripe the whole lhsT column ([K, 128]) is loaded once; for
    each 512-wide output tile the whole rhs column ([K, 512]) is loaded, then K/128
    matmuls accumulate in one PSUM bank. rhs is still read M/128 times from HBM.
    """
    k, m, n = _dims(lhsT, rhs, TILE_M, TILE_N, TILE_K)
    nk = k // TILE_K
    out = nl.ndarray((m, n), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for mi in range(m // TILE_M):
        ms = slice(mi * TILE_M, (mi + 1) * TILE_M)
        a_col = _load_k_tiles(lhsT, mi * TILE_M, TILE_M)
        for ni in range(n // TILE_N):
            ns = slice(ni * TILE_N, (ni + 1) * TILE_N)
            b_col = _load_k_tiles(rhs, ni * TILE_N, TILE_N)
            acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
            for ki in range(nk):
                nisa.nc_matmul(dst=acc, stationary=a_col[ki], moving=b_col[ki], accumulate=ki > 0)
            c = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=c, src=acc)
            nisa.dma_copy(dst=out[ms, ns], src=c)
            del b_col  # its SBUF is free before the next rhs column loads
        del a_col
    return out


@nki.jit
def matmul_block_free(lhsT: Any, rhs: Any, tiles_m: int = 2, tiles_n: int = 2) -> Any:
    """C = lhsT.T @ rhs with both free dims blocked (`tiles_m` x `tiles_n` output tiles).

    An M-block of lhsT ([K, 128 * tiles_m]) stays in SBUF while the rhs N-blocks
    ([K, 512 * tiles_n]) stream past it, so rhs is read M / (128 * tiles_m) times.
    """
    bm, bn = TILE_M * tiles_m, TILE_N * tiles_n
    k, m, n = _dims(lhsT, rhs, bm, bn, TILE_K)
    nk = k // TILE_K
    out = nl.ndarray((m, n), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for mb in range(m // bm):
        a_blk = [_load_k_tiles(lhsT, mb * bm + t * TILE_M, TILE_M) for t in range(tiles_m)]
        for nb in range(n // bn):
            b_blk = [_load_k_tiles(rhs, nb * bn + t * TILE_N, TILE_N) for t in range(tiles_n)]
            for tm in range(tiles_m):
                for tn in range(tiles_n):
                    acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                    for ki in range(nk):
                        nisa.nc_matmul(
                            dst=acc,
                            stationary=a_blk[tm][ki],
                            moving=b_blk[tn][ki],
                            accumulate=ki > 0,
                        )
                    c = nl.ndarray((TILE_M, TILE_N), dtype=out.dtype, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=c, src=acc)
                    m0, n0 = mb * bm + tm * TILE_M, nb * bn + tn * TILE_N
                    nisa.dma_copy(dst=out[m0 : m0 + TILE_M, n0 : n0 + TILE_N], src=c)
            del b_blk  # its SBUF is free before the next N-block loads
        del a_blk
    return out


@nki.jit
def matmul_fully_blocked(
    lhsT: Any, rhs: Any, tiles_m: int = 16, tiles_n: int = 2, tiles_k: int = 8
) -> Any:
    """C = lhsT.T @ rhs blocked on all three dims, accumulating K-blocks in SBUF.

    Loop nest: N-block (512 * tiles_n) -> K-block (128 * tiles_k) -> M-block
    (128 * tiles_m). Each output row-tile of the N-block lives in SBUF as
    [128, tiles_n, 512] for the whole K loop; each K-block's PSUM partial sum is added
    into it on VectorE, and it is stored with one [128, 512 * tiles_n] DMA at the end.
    rhs is read once, lhsT N / (512 * tiles_n) times, with 2 KiB and 4 KiB rows.
    """
    bm, bn, bk = TILE_M * tiles_m, TILE_N * tiles_n, TILE_K * tiles_k
    k, m, n = _dims(lhsT, rhs, bm, bn, bk)
    out = nl.ndarray((m, n), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    # Two explicitly rotating operand buffers each: the next block's loads overlap this
    # block's matmuls, and the plan does not depend on how freed tiles fragment SBUF.
    b_bufs = [nl.ndarray((TILE_K, tiles_k, bn), dtype=rhs.dtype, buffer=nl.sbuf) for _ in "ab"]
    a_bufs = [nl.ndarray((TILE_K, tiles_k, bm), dtype=lhsT.dtype, buffer=nl.sbuf) for _ in "ab"]
    a_turn = 0
    for nb in range(n // bn):
        n0 = nb * bn
        res = []
        for _ in range(m // TILE_M):
            r = nl.ndarray((TILE_M, tiles_n, TILE_N), dtype=out.dtype, buffer=nl.sbuf)
            nisa.memset(dst=r, value=0.0)
            res.append(r)
        for kb in range(k // bk):
            b = b_bufs[(nb * (k // bk) + kb) % 2]
            for t in range(tiles_k):
                k0 = kb * bk + t * TILE_K
                nisa.dma_copy(dst=b[:, t, :], src=rhs[k0 : k0 + TILE_K, n0 : n0 + bn])
            for mb in range(m // bm):
                a = a_bufs[a_turn % 2]
                a_turn += 1
                for t in range(tiles_k):
                    k0 = kb * bk + t * TILE_K
                    nisa.dma_copy(
                        dst=a[:, t, :], src=lhsT[k0 : k0 + TILE_K, mb * bm : (mb + 1) * bm]
                    )
                for tn in range(tiles_n):
                    for tm in range(tiles_m):
                        acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                        for t in range(tiles_k):
                            nisa.nc_matmul(
                                dst=acc,
                                stationary=a[:, t, tm * TILE_M : (tm + 1) * TILE_M],
                                moving=b[:, t, tn * TILE_N : (tn + 1) * TILE_N],
                                accumulate=t > 0,
                            )
                        r = res[mb * tiles_m + tm]
                        nisa.tensor_tensor(dst=r[:, tn, :], data1=r[:, tn, :], data2=acc, op=nl.add)
        for mi, r in enumerate(res):
            nisa.dma_copy(
                dst=out[mi * TILE_M : (mi + 1) * TILE_M, n0 : n0 + bn],
                src=r.reshape((TILE_M, bn)),
            )
    return out


@nki.jit
def dma_sweep(src: Any, bytes_per_partition: int, slots: int) -> Any:
    """Copy `src` ([128, total]) HBM -> SBUF in [128, bytes_per_partition] DMAs.

    Destinations rotate over `slots` disjoint SBUF slices, so consecutive transfers are
    independent (a slot is rewritten only `slots` transfers later), as in a bandwidth
    microbenchmark. Returns a small tensor so the launch has an output.
    """
    p, total = src.shape
    nbytes = dtype_bytes(src.dtype)
    width = bytes_per_partition // nbytes
    if width <= 0 or total % width:
        raise ValueError(
            f"bytes_per_partition: expected a divisor of {total * nbytes}; "
            f"got {bytes_per_partition}"
        )
    buf = nl.ndarray((p, slots, width), dtype=src.dtype, buffer=nl.sbuf)
    for i in range(total // width):
        nisa.dma_copy(dst=buf[:, i % slots, :], src=src[:, i * width : (i + 1) * width])
    out = nl.ndarray((p, width), dtype=src.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=buf[:, 0, :])
    return out


MATMULS = {
    "matmul_tiled": matmul_tiled,
    "matmul_hoisted": matmul_hoisted,
    "matmul_block_free": matmul_block_free,
    "matmul_fully_blocked": matmul_fully_blocked,
}


# ---- the DMA efficiency curve (HARDWARE.md, read off an unlabeled plot: L) -------------
# bytes per partition -> efficiency relative to 32 KiB per partition, percent
PUBLISHED_DMA_EFFICIENCY = {
    256: 10.0,
    512: 21.0,
    1024: 42.0,
    2048: 81.0,
    4096: 97.0,
    8192: 99.0,
    16384: 99.0,
    32768: 100.0,
}
SWEEP_BYTES_PER_PARTITION = 1 << 20  # 1 MiB per partition per size: >= 32 transfers each
