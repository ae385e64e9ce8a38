"""Weight-unit loads of the decode MoE kernel (`decode_mlp.py`): a [128, tiles, columns]
SBUF unit of a weight's K rows (the matmuls' contraction dim on partitions), from
row-major storage [E, K, N] (`load_rows`: contiguous runs per partition, p-major for
narrow rows) or from transposed storage [E, N, K] (`load_cols`: DMA transposes -- for a
routed expert an indirect transpose through a uint32 row index, within
nki.isa.dma_transpose's documented limits (`tiles.load_weight_cols`); for the shared
expert, which has no id, direct transposes of 2-byte elements). Both fill the same unit,
so the matmuls that read it are the same.
"""

from __future__ import annotations

from typing import Any

from ..dtypes import dtype_bytes
from ..nki import nisa
from .tiles import P, load_weight_cols


def runs(lo: int, hi: int, d: int) -> list[tuple[int, int, int]]:
    """Tiles [lo, hi) of a dim of size d as (first, count, rows) runs: the full tiles, then
    the ragged last one on its own (an op over it must not touch its missing rows)."""
    full_end = min(hi, d // P)
    out = []
    if full_end > lo:
        out.append((lo, full_end - lo, P))
    if hi > full_end and hi > lo:
        out.append((max(lo, full_end), 1, min(P, d - (hi - 1) * P)))
    return out


def load_rows(w: Any, e1: Any, d_rows: int, t0: int, tw: int, cols: list[tuple[int, int, int]],
               wu: Any, pmajor: bool = False) -> None:  # fmt: skip
    """wu[p, t * uw + c] = w[e, (t0 + t) * 128 + p, columns] (`pmajor`: row p * tiles +
    t0 + t), uw = wu's columns per tile: `cols` = (source column, width, destination
    column) runs; the full tiles in one DMA per run, a ragged last tile in its own (only
    its rows exist)."""
    width = w.shape[2]
    uw = wu.shape[2]
    pst = wu.shape[1] * uw  # the unit tile's elements per partition
    for first, count, rows in runs(t0, t0 + tw, d_rows):
        t = first - t0
        for c_src, cw, c_dst in cols:
            off = first * P * width + c_src
            if pmajor:
                tiles = d_rows // P
                pat = [[tiles * width, P], [width, count], [1, cw]]
                off = first * width + c_src
            elif rows == P:
                pat = [[width, P], [P * width, count], [1, cw]]
            else:
                pat = [[width, rows], [1, cw]]
            src = w.ap(pat, offset=off, scalar_offset=e1, indirect_dim=0)
            if pmajor and cw == width == uw:
                # whole rows, p-major: one contiguous run per partition on both sides
                src = w.ap([[tiles * width, P], [1, count * cw]], offset=off,
                           scalar_offset=e1, indirect_dim=0)  # fmt: skip
                dst = wu.ap([[pst, P], [1, count * cw]], offset=t * uw)
            else:
                dst = wu[0:rows, t : t + count, c_dst : c_dst + cw]
            nisa.dma_copy(dst=dst, src=src)


def load_cols(parts: list[tuple[Any, int, int, int]], ex: tuple[Any, Any], t0: int, tw: int,
               d_rows: int, wu: Any) -> None:  # fmt: skip
    """wu[p, t, c_dst + r] = w[e, row0 + r, (t0 + t) * 128 + p] for each (w, row0, nrows,
    c_dst) of `parts`: weights stored transposed ([E, N, K], K = the contraction dim of
    size d_rows) loaded as the row-major unit _load_rows would give. ex = (e [1, 1], this
    expert's row index | None | "direct" (the shared expert: no id))."""
    c0 = t0 * P
    ncols = min(d_rows, (t0 + tw) * P) - c0
    e1, index = ex
    for w, row0, nrows, c_dst in parts:
        dst = wu[:, 0:tw, c_dst : c_dst + nrows]
        if index == "direct" and dtype_bytes(w.dtype) == 2:
            transpose_direct(w, row0, nrows, c0, ncols, dst)
        else:
            load_weight_cols(w, (e1, None if index == "direct" else index), row0, nrows, c0,
                             ncols, dst)  # fmt: skip


def transpose_direct(w: Any, row0: int, nrows: int, c0: int, ncols: int, dst: Any) -> None:
    """dst[p, j, r] = w[0, row0 + r, c0 + j * 128 + p]: direct DMA transposes (2-byte
    elements), one for the full 128-column tiles, one for a ragged last tile."""
    width = w.shape[2]
    full, rest = ncols // P, ncols % P
    off = row0 * width + c0
    if full:
        src = w.ap([[width, nrows], [P, full], [1, P]], offset=off)
        nisa.dma_transpose(dst=dst[:, 0:full, 0:nrows], src=src, axes=(2, 1, 0))
    if rest:
        src = w.ap([[width, nrows], [1, rest]], offset=off + full * P)
        nisa.dma_transpose(dst=dst[0:rest, full, 0:nrows], src=src)
