"""Tile-level building blocks shared by the MoE expert kernels (forward and backward).

Block metadata and scratch rows are addressed with run-time registers: a block index is
a Python int in a static loop and a loop register in a device loop, and `as_register`
turns the former into an immediate register, so both issue the same DMA instructions
(`.ap(scalar_offset=...)`) and a trace of static blocks prices what the device loop runs.

Weights stream from HBM [E, rows, cols] with the expert picked by `.ap(scalar_offset=
expert)`. `load_weight_rows` keeps the HBM row layout (rows on partitions, a contiguous
run of `ncols` elements per partition and row tile); `load_weight_cols` puts the columns
on partitions: for 2-byte dtypes an indirect DMA transpose (a gather of the expert's rows
through a uint32 row index, `expert_row_index`; the source rows stay contiguous runs of
128 elements), else a natural load and PE transposes.

An indirect DMA transpose obeys NKI's documented limits (nki.isa.dma_transpose, "DMA
Indirect Transpose Constraints"): a vector-offset uint32 index on SBUF, gathered rows a
multiple of 16, an index of [16..128 (multiple of 16), 1] or [128, k] (read column-major),
at most 128 source elements per row. A dynamic `scalar_offset` source is not among the
documented indirect forms, so the expert is folded into the index instead; the rows past
the last multiple of 16 (ragged test shapes only) take the PE path.
"""

from __future__ import annotations

from typing import Any

from ..dtypes import dtype_bytes
from ..nki import nisa, nl

# ---- limits ---------------------------------------------------------------------------
P = 128  # partitions: tokens per sub-tile, contraction rows per matmul
PSUM_FP32 = 512  # fp32 elements per PSUM bank row: the matmul N limit with an fp32 dst
# ---- tile sizes -----------------------------------------------------------------------
TRANSPOSE_GROUP = 4  # PE transposes evacuated by one copy: [128, 4 x 128] fits one bank
GATHER_ROW_GRID = 16  # an indirect DMA transpose gathers a multiple of 16 rows
INDEX_EXACT = 1 << 24  # VectorE computes the row index in fp32: exact below 2**24


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def tile_rows(total: int, tile: int) -> int:
    """Rows of tile `tile` (0-based, 128-row tiles) of a dimension of size `total`."""
    return min(P, total - tile * P)


def program_columns(h: int) -> tuple[int, int]:
    """The hidden columns [c0, c1) an LNC program owns (all of them under LNC 1): halves
    in whole 512-column PSUM banks (the backward's LNC split)."""
    if nl.program_ndim() == 0 or nl.num_programs(0) == 1:
        return 0, h
    nprog, pid = nl.num_programs(0), nl.program_id(0)
    share = cdiv(cdiv(h, nprog), PSUM_FP32) * PSUM_FP32
    return min(h, pid * share), min(h, (pid + 1) * share)


def as_register(b: Any) -> Any:
    """A block index as a register: ints become immediates, registers pass through."""
    return nisa.register_alloc(b) if isinstance(b, int) else b


def block_ap(t: Any, addr: tuple[Any, int], pat: list[list[int]], offset: int = 0) -> Any:
    """`t.ap(pat)` at block addr = (register, static extra blocks) of t [NB, ...]."""
    reg, extra = addr
    stride = 1
    for n in t.shape[1:]:
        stride *= n
    return t.ap(pat, offset=offset + extra * stride, scalar_offset=reg, indirect_dim=0)


def used_block_register(block_count: Any, cnt: Any | None = None) -> Any:
    """A register holding block_count [1, 1] (HBM int32), loaded through SBUF (`cnt`)."""
    if cnt is None:
        cnt = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cnt, src=block_count)
    count = nisa.register_alloc()
    nisa.register_load(count, cnt)
    return count


def device_bounds(block_count: Any, static_blocks: int) -> tuple[Any, Any]:
    """Registers (used blocks, end of the pairs) for `block_loop`'s device loops.

    The pairs end at S + 2 * floor((count - S) / 2), computed on chip (S = static_blocks).
    """
    cnt = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    count = used_block_register(block_count, cnt)
    end = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=end, data=cnt, op0=nl.subtract, operand0=static_blocks)
    nisa.tensor_scalar(dst=end, data=end, op0=nl.bitwise_and, operand0=-2)
    nisa.tensor_scalar(dst=end, data=end, op0=nl.add, operand0=static_blocks)
    pairs = nisa.register_alloc()
    nisa.register_load(pairs, end)
    return count, pairs


def block_loop(body: Any, static_blocks: int, nb: int, bounds: Any) -> None:
    """body(addr, parity, first) for every used block, in order.

    Blocks [0, S) run as a static loop (addr = (immediate b, 0), parity b % 2), the rest
    as a device loop over pairs (addr = (i, 0) then (i, 1): the second block of a pair is
    addressed by a static offset) and a 0/1-trip device loop for an odd last block, so
    the parity (which buffer set a block uses) is static in every body. `first` is True
    for block 0 only (always static: S >= 1 for every plan).
    """
    for b in range(min(static_blocks, nb)):
        body((as_register(b), 0), b % 2, b == 0)
    if static_blocks >= nb:
        return
    count, pairs = bounds
    p0 = static_blocks % 2

    def pair(i: Any) -> None:
        body((i, 0), p0, False)
        body((i, 1), 1 - p0, False)

    def last(i: Any) -> None:
        body((i, 0), p0, False)

    nl.fori_loop(static_blocks, pairs, pair, step=2)
    nl.fori_loop(pairs, count, last)


def block_meta(ns: int, slot_token: Any, block_expert: Any, addr: Any) -> tuple[Any, Any]:
    """Load block addr's slot tokens [128, NS] and expert id [1, 1]."""
    tok = nl.ndarray((P, ns), dtype=nl.int32, buffer=nl.sbuf)
    exp = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tok, src=block_ap(slot_token, addr, [[ns, P], [1, ns]]))
    nisa.dma_copy(dst=exp, src=block_ap(block_expert, addr, [[1, 1], [1, 1]]))
    return tok, exp


def block_row0(addr: Any, block_size: int) -> Any:
    """[1, 1] int32 SBUF tile holding (register) * block_size; add addr[1] * block_size rows
    to the static offset of a view that uses it."""
    row0 = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.register_store(row0, addr[0])
    nisa.tensor_scalar(dst=row0, data=row0, op0=nl.multiply, operand0=block_size)
    return row0


def slot_tiles(t: Any, addr: Any, r0: int, ntiles: int, c0: int, ncols: int) -> Any:
    """View of scratch t [NB, B, W]: [p, j, c] = t[block, r0 + j*128 + p, c0 + c]."""
    w = t.shape[2]
    return block_ap(t, addr, [[w, P], [P * w, ntiles], [1, ncols]], r0 * w + c0)


def gather_rows(src: Any, index_col: Any, dst: Any, cols: int) -> None:
    """dst[p, :cols] = src[index_col[p], :cols]; out-of-range rows (padding) give zeros."""
    nisa.memset(dst=dst[:, 0:cols], value=0.0)
    view = src.ap([[cols, P], [1, cols]], offset=0, vector_offset=index_col, indirect_dim=0)
    nisa.dma_copy(dst=dst[:, 0:cols], src=view, oob_mode=nisa.oob_mode.skip)


def transpose_into(dt: Any, srcs: list[Any], dst: Any, parity: int = 0) -> int:
    """dst[:, sum(p_<j) + q] = srcs[j][q, :]^T: PE transposes of [p_j, f] views side by side.

    `dst` is an SBUF view [f, sum p_j]; only the last source may have p_j < 128. Groups of
    TRANSPOSE_GROUP transposes share one PSUM bank and one evacuating copy, alternating
    VectorE / ScalarE (starting from `parity`). Returns the parity for the next call.
    """
    f = srcs[0].shape[1] if len(srcs[0].shape) == 2 else srcs[0].free_size
    col = 0
    for g0 in range(0, len(srcs), TRANSPOSE_GROUP):
        group = srcs[g0 : g0 + TRANSPOSE_GROUP]
        tp = nl.ndarray((P, TRANSPOSE_GROUP * P), dtype=dt, buffer=nl.psum)
        width = 0
        for src in group:
            p = src.shape[0]
            nisa.nc_transpose(dst=tp[0:f, width : width + p], data=src)
            width += p
        eng = nisa.engine.vector if parity % 2 == 0 else nisa.engine.scalar
        nisa.tensor_copy(dst=dst[0:f, col : col + width], src=tp[0:f, 0:width], engine=eng)
        parity += 1
        col += width
    return parity


def load_weight_rows(
    w: Any, exp: Any, row0: int, nrows: int, col0: int, ncols: int, dst: Any
) -> None:
    """dst[0:128, j, 0:ncols] = w[exp, row0 + j*128 + p, col0 : col0 + ncols] (one DMA).

    `nrows` rows are loaded as ceil(nrows/128) stacked 128-row tiles; a ragged last tile
    gets its own DMA (only its first rows exist).
    """
    width = w.shape[2]
    full = nrows // P
    if full:
        pat = [[width, P], [P * width, full], [1, ncols]]
        src = w.ap(pat, offset=row0 * width + col0, scalar_offset=exp, indirect_dim=0)
        nisa.dma_copy(dst=dst[:, 0:full, 0:ncols], src=src)
    rest = nrows - full * P
    if rest:
        pat = [[width, rest], [1, ncols]]
        off = (row0 + full * P) * width + col0
        src = w.ap(pat, offset=off, scalar_offset=exp, indirect_dim=0)
        nisa.dma_copy(dst=dst[0:rest, full, 0:ncols], src=src)


def row_index_ok(w: Any) -> bool:
    """True when w [E, R, C]'s column loads are indirect DMA transposes through a row index
    (2-byte dtype, every row index below E * R exact in fp32)."""
    return dtype_bytes(w.dtype) == 2 and w.shape[0] * w.shape[1] < INDEX_EXACT


def row_ramp(ncols: int) -> Any:
    """int32 [128, ncols] SBUF: ramp[p, c] = c * 128 + p (built once per kernel)."""
    ramp = nl.ndarray((P, ncols), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=ramp, pattern=[[P, ncols]], offset=0, channel_multiplier=1)
    return ramp


def expert_column(table: Any, addr: Any, dst: Any, oob_skip: bool = False) -> None:
    """dst [128, 1] int32 <- table [NB, 1]'s entry of block addr, on every partition."""
    src = block_ap(table, addr, [[0, P], [1, 1]])
    mode = nisa.oob_mode.skip if oob_skip else nisa.oob_mode.error
    nisa.dma_copy(dst=dst, src=src, oob_mode=mode)


def expert_row_index(w: Any, exp_col: Any, ramp: Any, dst: Any) -> None:
    """dst [128, k] uint32 = exp * R + c * 128 + p: row c * 128 + p of expert exp's
    [R, C] slice of w [E, R, C] seen as [E * R, C] (a [128, k] index is read column-major).
    `exp_col`: [128, 1] int32, the expert id on every partition (`expert_column`)."""
    base = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=base, data=exp_col, op0=nl.multiply, operand0=float(w.shape[1]))
    k = dst.shape[1]
    nisa.tensor_scalar(dst=dst, data=ramp[:, 0:k], op0=nl.add, operand0=base)


def load_weight_cols(
    w: Any, ex: tuple[Any, Any], row0: int, nrows: int, col0: int, ncols: int, dst: Any
) -> None:
    """dst[p, j, r] = w[exp, row0 + r, col0 + j*128 + p]: columns on partitions.

    ex = (exp [1, 1] int32, expert exp's row index or None): with an index (2-byte dtypes,
    `expert_row_index` covering `nrows` rows), indirect DMA transposes of the rows up to
    the last multiple of 16 (one for the full 128-column tiles, one for a ragged last
    tile); the other rows, and everything without an index, are loaded as they lie and
    PE-transposed.
    """
    exp, index = ex
    n16 = nrows - nrows % GATHER_ROW_GRID if index is not None else 0
    if n16:
        e, r, width = w.shape
        rows = w.reshape((e * r, width))
        k = cdiv(n16, P)
        assert index.shape[1] >= k, "load_weight_cols: the row index is too short"
        ix = index[0:n16, 0:1] if k == 1 else index[:, 0:k]
        full, rest = ncols // P, ncols % P
        off = row0 * width + col0
        if full:
            pat = [[width, n16], [P, full], [1, P]]
            src = rows.ap(pat, offset=off, vector_offset=ix, indirect_dim=0)
            nisa.dma_transpose(dst=dst[:, 0:full, 0:n16], src=src)
        if rest:
            pat = [[width, n16], [1, rest]]
            src = rows.ap(pat, offset=off + full * P, vector_offset=ix, indirect_dim=0)
            nisa.dma_transpose(dst=dst[0:rest, full, 0:n16], src=src)
    if nrows > n16:
        _load_cols_pe(w, exp, row0 + n16, nrows - n16, col0, ncols, dst[:, :, n16:nrows])


def _load_cols_pe(w: Any, exp: Any, row0: int, nrows: int, col0: int, ncols: int, dst: Any) -> None:
    """load_weight_cols by a natural load and PE transposes."""
    nrt = cdiv(nrows, P)
    tmp = nl.ndarray((P, nrt, ncols), dtype=w.dtype, buffer=nl.sbuf)
    load_weight_rows(w, exp, row0, nrows, col0, ncols, tmp)
    parity = 0
    for j in range(cdiv(ncols, P)):
        cw = min(P, ncols - j * P)
        srcs = [tmp[0 : tile_rows(nrows, r), r, j * P : j * P + cw] for r in range(nrt)]
        parity = transpose_into(w.dtype, srcs, dst[0:cw, j, 0:nrows], parity)


def psum_accumulators(n: int, bsz: int) -> list[Any]:
    """n fp32 PSUM accumulators [128, bsz], packed 512 // bsz to a bank when bsz < 512.

    Small blocks leave most of a bank unused otherwise; packing lets a pass keep more
    accumulators in flight in the same 8 banks.
    """
    if bsz >= PSUM_FP32:
        return [nl.ndarray((P, bsz), dtype=nl.float32, buffer=nl.psum) for _ in range(n)]
    per = PSUM_FP32 // bsz
    views = []
    for t0 in range(0, n, per):
        tile = nl.ndarray((P, per, bsz), dtype=nl.float32, buffer=nl.psum)
        for j in range(min(per, n - t0)):
            views.append(tile[:, j, :])
    return views


def matmul(dst: Any, stationary: Any, moving: Any, accumulate: bool) -> None:
    """dst (PSUM) (+)= stationary^T @ moving."""
    nisa.nc_matmul(dst=dst, stationary=stationary, moving=moving, accumulate=accumulate)
