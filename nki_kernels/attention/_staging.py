"""Operand staging shared by the flash-attention kernels (inlined NKI helpers, no torch).

- `load_kt_group` / `transpose_kt_group`: keys [k0, k0 + n) of one head as K^T (D on
  partitions) in SBUF, loaded with 1 KiB-per-partition DMA descriptors (partition p
  holds 4 consecutive keys) and turned with PE transposes whose PSUM results are
  scattered back into natural key order by the evacuating copy. Split in two so a
  kernel can issue the DMA early and the transposes when the data is needed.
- `stage_rows`: a [n, D] row block of an HBM tensor into [128, n / 128, D] SBUF
  (key or query on partitions), the layout the P @ V / dS @ K matmuls contract over.
- `transpose_rows`: a [rows, D] SBUF tile to [D, rows] through TensorE and PSUM.
- `compute_dtype`: matmul operand dtype (bf16/fp16 inputs stay; fp32 runs fp32 matmuls).
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nl

P = 128  # partitions
GROUP = 4  # 128-key sub-tiles per staging group (512 keys: one fp32 PSUM bank of scores)


def compute_dtype(dtype: Any) -> Any:
    """Matmul operand dtype for inputs of `dtype`: bf16 / fp16 stay, fp32 stays fp32."""
    if dtype == nl.bfloat16 or dtype == nl.float16:
        return dtype
    return nl.float32


def copy_engine(use_scalar: bool) -> Any:
    return nisa.engine.scalar if use_scalar else nisa.engine.vector


def load_kt_group(src: Any, k0: int, n: int, d: int, cdt: Any) -> Any:
    """DMA rows src[k0 : k0 + n, :d] (n <= 512) into SBUF for `transpose_kt_group`.

    A full 512-row group lands as [128, 4, D] with partition p holding rows k0 + 4p ..
    k0 + 4p + 3 (one contiguous 4 * D run per partition: 1 KiB descriptors for bf16
    D = 128, vs 256 B with one row per partition). A ragged group lands one row per
    partition, [128, ceil(n / 128), D].
    """
    if n == GROUP * P:
        raw = nl.ndarray((P, GROUP, d), dtype=cdt, buffer=nl.sbuf)
        nisa.dma_copy(dst=raw, src=src[k0 : k0 + n, :].reshape((P, GROUP, d)))
        return raw
    raw = nl.ndarray((P, (n + P - 1) // P, d), dtype=cdt, buffer=nl.sbuf)
    stage_rows(src, raw, k0, n, t0=0)
    return raw


def transpose_kt_group(
    raw: Any, dst_kt: Any, c0: int, n: int, d: int, cdt: Any, scalar: bool, tp: Any = None
) -> None:
    """dst_kt[:d, c0 : c0 + n] = (the rows `raw` holds).T, in natural row order.

    For an interleaved full group, PE-transposing slice j gives rows 4p + j (p = 0..127);
    the evacuating copy scatters them to columns c0 + 4p + j through a strided view.
    `tp` is an optional PSUM tile of at least [D, 4, 128] to transpose into.
    """
    if tp is None:
        tp = nl.ndarray((P, GROUP, P), dtype=cdt, buffer=nl.psum)
    tp = tp[:d, :, :]
    if n == GROUP * P:
        for j in range(GROUP):
            nisa.nc_transpose(dst=tp[:, j, :], data=raw[:, j, :])
        dst = dst_kt[:d, c0 : c0 + n].reshape((d, P, GROUP)).permute((0, 2, 1))
        nisa.tensor_copy(dst=dst, src=tp, engine=copy_engine(scalar))
        return
    for i in range((n + P - 1) // P):
        rows = min(P, n - i * P)
        nisa.nc_transpose(dst=tp[:, i, :rows], data=raw[:rows, i, :d])
    full = n // P
    if full:
        nisa.tensor_copy(
            dst=dst_kt[:d, c0 : c0 + full * P].reshape((d, full, P)),
            src=tp[:, 0:full, :],
            engine=copy_engine(scalar),
        )
    if n > full * P:
        rows = n - full * P
        nisa.tensor_copy(
            dst=dst_kt[:d, c0 + full * P : c0 + n],
            src=tp[:, full, :rows],
            engine=copy_engine(scalar),
        )


def stage_rows(src: Any, dst: Any, r0: int, n: int, t0: int | None = None) -> None:
    """Rows [r0, r0 + n) of HBM src [*, D] into dst[:, t0 + i, :] (128 rows each).

    `t0` defaults to r0 // 128 (dst indexed by absolute 128-row tile).
    """
    if t0 is None:
        t0 = r0 // P
    full = n // P
    if full:
        view = src[r0 : r0 + full * P, :].reshape((full, P, src.shape[-1])).permute((1, 0, 2))
        nisa.dma_copy(dst=dst[:, t0 : t0 + full, :], src=view)
    rest = n - full * P
    if rest:
        nisa.dma_copy(dst=dst[:rest, t0 + full, :], src=src[r0 + full * P : r0 + n, :])


def transpose_rows(
    rows_sb: Any, rows: int, d: int, dst: Any, cdt: Any, scalar: bool, tp: Any = None
) -> None:
    """dst[:d, :rows] = rows_sb[:rows, :d].T through a PE transpose and one evacuation.

    `tp` is an optional PSUM tile [>= D, >= 128] (2-D view) to transpose into.
    """
    if tp is None:
        tp = nl.ndarray((d, P), dtype=cdt, buffer=nl.psum)
    nisa.nc_transpose(dst=tp[:d, :rows], data=rows_sb[:rows, :d])
    nisa.tensor_copy(dst=dst[:d, :rows], src=tp[:d, :rows], engine=copy_engine(scalar))


def load_bounds(bounds: Any, b: int, nq: int) -> Any:
    """Per-query key bounds of batch b: SBUF [128, 2, nq] fp32 (lo, hi per query tile)."""
    bnd = nl.ndarray((P, 2, nq), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=bnd, src=bounds[b])
    return bnd


__all__ = [
    "GROUP",
    "P",
    "compute_dtype",
    "copy_engine",
    "load_bounds",
    "load_kt_group",
    "stage_rows",
    "transpose_kt_group",
    "transpose_rows",
]
