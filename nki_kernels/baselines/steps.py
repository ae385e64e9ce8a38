"""Well-tiled NKI kernels for the unfused steps of the compiler's native lowering.

The native-lowering baseline of an op is its plain PyTorch composition compiled step by
step: every step that the compiler does not fuse (a matmul, a softmax, a reduction, a
gather) is its own kernel with an HBM round trip in between. Chains of element-wise ops
are assumed fused into one streaming step -- the generous reading of the compiler.

Each kernel here is written the way a good compiler would tile that step: 128-row
partition tiles, free-dim chunks of `CHUNK_BYTES` per partition (large enough for
efficient DMA, small enough to double-buffer), loads and stores on the DMA queues, work
on the engine that does it fastest. They are priced by the same cost model as the
hand-written kernels (trace-only runs), so the comparison is like for like.
"""

from __future__ import annotations

from typing import Any

from ..dtypes import dtype_bytes
from ..nki import nisa, nki, nl

P = 128  # partitions
# 8 KiB per partition per DMA: ~99% of peak DMA efficiency (HARDWARE.md) and small enough
# that three streams double-buffered stay far below the SBUF budget.
CHUNK_BYTES = 8192


def _chunk_cols(cols: int, nbytes: int) -> int:
    return max(1, min(cols, CHUNK_BYTES // nbytes))


@nki.jit
def stream_rows(
    x: Any,
    other: Any,
    row_vec: Any,
    col_vec: Any,
    n_scalar_ops: int,
    n_vector_ops: int,
    out_dtype: Any,
) -> Any:
    """One fused element-wise step: out[r, c] = f(x[r, c], other[r, c], row_vec[r], col_vec[c]).

    x, other: [R, C] (other may be None); row_vec: [R, 1] (or None); col_vec: [C] (or
    None). `n_scalar_ops` ScalarE and `n_vector_ops` VectorE passes over each tile stand
    for the fused chain's arithmetic (the values are a representative combination; the
    cost is what this kernel is for).
    """
    rows, cols = x.shape
    out = nl.ndarray((rows, cols), dtype=out_dtype, buffer=nl.shared_hbm)
    fc = _chunk_cols(cols, dtype_bytes(x.dtype))
    for c0 in range(0, cols, fc):
        cs = min(fc, cols - c0)
        colt = None
        if col_vec is not None:
            colt = nl.ndarray((P, fc), dtype=col_vec.dtype, buffer=nl.sbuf)
            nisa.dma_copy(
                dst=colt[:, 0:cs], src=col_vec[c0 : c0 + cs].reshape((1, cs)).broadcast(0, P)
            )
        # Software pipelining: the next row tile's loads are issued before this tile's
        # compute and store, so DMA-in, compute and DMA-out of neighbouring tiles overlap.
        row_starts = list(range(0, rows, P))
        loaded = _load_row_tile(x, other, row_vec, row_starts[0], c0, cs, fc)
        for ti, r0 in enumerate(row_starts):
            rs = min(P, rows - r0)
            xt, ot, rt = loaded
            if ti + 1 < len(row_starts):
                loaded = _load_row_tile(x, other, row_vec, row_starts[ti + 1], c0, cs, fc)
            # The fused chain as passes split between ScalarE (row scale, unary
            # functions) and VectorE (tile-tile ops), each pass one read and one write of
            # the tile; the first reads the loaded tile, the last writes the output tile.
            passes = [("scalar", None)] * (int(rt is not None) + n_scalar_ops)
            passes += [("vector", ot)] if ot is not None else []
            passes += [("vector", colt)] if colt is not None else []
            passes += [("vector", None)] * n_vector_ops
            # intermediates in the tensors' own dtype, as the PyTorch composition rounds them
            acc = nl.ndarray((P, fc), dtype=out_dtype, buffer=nl.sbuf)
            yt = nl.ndarray((P, fc), dtype=out_dtype, buffer=nl.sbuf)
            src = xt[0:rs, 0:cs]
            if not passes:
                nisa.tensor_copy(dst=yt[0:rs, 0:cs], src=src)
            for i, (eng, operand) in enumerate(passes):
                dst = yt[0:rs, 0:cs] if i == len(passes) - 1 else acc[0:rs, 0:cs]
                if eng == "scalar":
                    scale = rt[0:rs, :] if (i == 0 and rt is not None) else 1.0
                    nisa.activation(dst=dst, op=nl.copy, data=src, scale=scale)
                elif operand is not None:
                    nisa.tensor_tensor(
                        dst=dst, data1=src, data2=operand[0:rs, 0:cs], op=nl.multiply
                    )
                else:
                    nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=1.0)
                src = acc[0:rs, 0:cs]
            nisa.dma_copy(dst=out[r0 : r0 + rs, c0 : c0 + cs], src=yt[0:rs, 0:cs])
    return out


def _load_row_tile(
    x: Any, other: Any, row_vec: Any, r0: int, c0: int, cs: int, fc: int
) -> tuple[Any, Any, Any]:
    rows = x.shape[0]
    rs = min(P, rows - r0)
    xt = nl.ndarray((P, fc), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt[0:rs, 0:cs], src=x[r0 : r0 + rs, c0 : c0 + cs])
    ot = rt = None
    if other is not None:
        ot = nl.ndarray((P, fc), dtype=other.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ot[0:rs, 0:cs], src=other[r0 : r0 + rs, c0 : c0 + cs])
    if row_vec is not None:
        rt = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=rt[0:rs, :], src=row_vec[r0 : r0 + rs, :])
    return xt, ot, rt


@nki.jit
def reduce_rows(x: Any, square: bool, n_outputs: int) -> Any:
    """A row reduction step: out[r, j] = sum_c f_j(x[r, c]), fp32, one pass over x.

    f_0 is x^2 when `square` else x; with `n_outputs` = 2, f_1 is x^2 (the sum and sum of
    squares behind mean and variance). Chunk reductions alternate between ScalarE
    (activation with its accumulator) and VectorE (square, then tensor_reduce), two to
    one, so neither engine caps the HBM stream; chunk partial sums are added at the end.
    """
    rows, cols = x.shape
    out = nl.ndarray((rows, n_outputs), dtype=nl.float32, buffer=nl.shared_hbm)
    fc = _chunk_cols(cols, dtype_bytes(x.dtype))
    nch = (cols + fc - 1) // fc
    turn = 0
    for r0 in range(0, rows, P):
        rs = min(P, rows - r0)
        parts = nl.ndarray((P, n_outputs, nch), dtype=nl.float32, buffer=nl.sbuf)
        for ci in range(nch):
            c0 = ci * fc
            cs = min(fc, cols - c0)
            xt = nl.ndarray((P, fc), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xt[0:rs, 0:cs], src=x[r0 : r0 + rs, c0 : c0 + cs])
            for j in range(n_outputs):
                squared = square or j == 1
                part = parts[0:rs, j, ci : ci + 1]
                if turn % 3 == 2:
                    src = xt[0:rs, 0:cs]
                    if squared:
                        sq = nl.ndarray((P, fc), dtype=x.dtype, buffer=nl.sbuf)
                        nisa.tensor_tensor(dst=sq[0:rs, 0:cs], data1=src, data2=src, op=nl.multiply)
                        src = sq[0:rs, 0:cs]
                    nisa.tensor_reduce(dst=part, op=nl.add, data=src, axis=(1,))
                else:
                    junk = nl.ndarray((P, fc), dtype=x.dtype, buffer=nl.sbuf)
                    nisa.activation(
                        dst=junk[0:rs, 0:cs],
                        op=nl.square if squared else nl.copy,
                        data=xt[0:rs, 0:cs],
                        reduce_op=nl.add,
                        reduce_res=part,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce,
                    )
                turn += 1
        stats = nl.ndarray((P, n_outputs), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=stats[0:rs, :], op=nl.add, data=parts[0:rs, :, :], axis=(2,))
        nisa.dma_copy(dst=out[r0 : r0 + rs, :], src=stats[0:rs, :])
    return out


@nki.jit
def softmax_rows(x: Any, scale: float, out_dtype: Any) -> Any:
    """Row softmax step: out = softmax(scale * x) along the last dim, fp32 statistics.

    Each 128-row tile is read once when a full row fits the SBUF budget, else twice
    (a max/sum pass and a normalize pass), as a compiler's tiled softmax would.
    """
    rows, cols = x.shape
    out = nl.ndarray((rows, cols), dtype=out_dtype, buffer=nl.shared_hbm)
    fc = _chunk_cols(cols, dtype_bytes(x.dtype))
    nch = (cols + fc - 1) // fc
    resident = cols * (dtype_bytes(x.dtype) + 4) <= 96 * 1024
    for r0 in range(0, rows, P):
        rs = min(P, rows - r0)
        mx = nl.ndarray((P, nch), dtype=nl.float32, buffer=nl.sbuf)
        tiles = []
        for ci in range(nch):
            c0 = ci * fc
            cs = min(fc, cols - c0)
            xt = nl.ndarray((P, fc), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xt[0:rs, 0:cs], src=x[r0 : r0 + rs, c0 : c0 + cs])
            nisa.tensor_reduce(
                dst=mx[0:rs, ci : ci + 1], op=nl.maximum, data=xt[0:rs, 0:cs], axis=(1,)
            )
            if resident:
                tiles.append(xt)
        rowmax = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=rowmax[0:rs, :], op=nl.maximum, data=mx[0:rs, :], axis=(1,))
        negmax = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(
            dst=negmax[0:rs, :], data=rowmax[0:rs, :], op0=nl.multiply, operand0=-scale
        )
        rowsum = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        exps = []
        for ci in range(nch):
            c0 = ci * fc
            cs = min(fc, cols - c0)
            if resident:
                xt = tiles[ci]
            else:
                xt = nl.ndarray((P, fc), dtype=x.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=xt[0:rs, 0:cs], src=x[r0 : r0 + rs, c0 : c0 + cs])
            et = nl.ndarray((P, fc), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(
                dst=et[0:rs, 0:cs],
                op=nl.exp,
                data=xt[0:rs, 0:cs],
                bias=negmax[0:rs, :],
                scale=scale,
                reduce_op=nl.add,
                reduce_res=rowsum[0:rs, :] if ci == nch - 1 else None,
                reduce_cmd=nisa.reduce_cmd.reset_reduce if ci == 0 else nisa.reduce_cmd.reduce,
            )
            exps.append(et if resident else None)
            if not resident:
                yt = nl.ndarray((P, fc), dtype=out_dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=yt[0:rs, 0:cs], src=et[0:rs, 0:cs])
                nisa.dma_copy(dst=out[r0 : r0 + rs, c0 : c0 + cs], src=yt[0:rs, 0:cs])
        inv = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv[0:rs, :], data=rowsum[0:rs, :])
        for ci in range(nch):
            c0 = ci * fc
            cs = min(fc, cols - c0)
            yt = nl.ndarray((P, fc), dtype=out_dtype, buffer=nl.sbuf)
            et = exps[ci]
            if et is not None:
                src = et[0:rs, 0:cs]
            else:
                src = nl.ndarray((P, fc), dtype=out_dtype, buffer=nl.sbuf)[0:rs, 0:cs]
                nisa.dma_copy(dst=src, src=out[r0 : r0 + rs, c0 : c0 + cs])
            nisa.tensor_scalar(dst=yt[0:rs, 0:cs], data=src, op0=nl.multiply, operand0=inv[0:rs, :])
            nisa.dma_copy(dst=out[r0 : r0 + rs, c0 : c0 + cs], src=yt[0:rs, 0:cs])
    return out


@nki.jit
def gather_rows(src: Any, index: Any) -> Any:
    """Gather step: out[i, :] = src[index[i], :] through indirect DMA, 128 rows at a time."""
    n = index.shape[0]
    _, cols = src.shape
    out = nl.ndarray((n, cols), dtype=src.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, n, P):
        rs = min(P, n - r0)
        it = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=it[0:rs, :], src=index[r0 : r0 + rs, :])
        rt = nl.ndarray((P, cols), dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(
            dst=rt[0:rs, :],
            src=src.ap(
                [[cols, rs], [1, cols]], offset=0, vector_offset=it[0:rs, :], indirect_dim=0
            ),
        )
        nisa.dma_copy(dst=out[r0 : r0 + rs, :], src=rt[0:rs, :])
    return out


# Block sizes of the matmul step: 2 KiB rows for both operands' DMAs (~81% DMA
# efficiency and up), 8 K-tiles per block so a block's operands double-buffer in 64 KiB
# per partition, and 2 PSUM banks per output tile so PSUM double-buffers in 4 banks.
MM_BLOCK_M = 1024
MM_BLOCK_N = 1024
MM_BLOCK_K_TILES = 8
PSUM_BANK = 512


@nki.jit
def matmul_step(a_t: Any, b: Any, out_dtype: Any) -> Any:
    """A matmul step: out[m, n] = sum_k a_t[k, m] * b[k, n] (the compiler picks A's layout).

    Loop nest (blocked on all three dims, ragged edges sliced): N block -> M block ->
    K block (8 tiles of 128) -> 128-row M tile -> 512-column PSUM bank. Each K block's
    partial product is accumulated in PSUM, then added into an fp32 SBUF result tile
    (one per 128-row M tile of the block); the result is cast and stored once. A is read
    once per N block and B once per M block, with 2 KiB rows.
    """
    k_dim, m_dim = a_t.shape
    _, n_dim = b.shape
    out = nl.ndarray((m_dim, n_dim), dtype=out_dtype, buffer=nl.shared_hbm)
    nk = (k_dim + P - 1) // P
    kbt = max(1, MM_BLOCK_K_TILES * 2 // dtype_bytes(b.dtype))  # same bytes per block for fp32
    single_k_block = nk <= kbt
    for n0 in range(0, n_dim, MM_BLOCK_N):
        ns = min(MM_BLOCK_N, n_dim - n0)
        for m0 in range(0, m_dim, MM_BLOCK_M):
            ms = min(MM_BLOCK_M, m_dim - m0)
            mtiles = (ms + P - 1) // P
            res = []
            if not single_k_block:
                for _ in range(mtiles):
                    r = nl.ndarray((P, MM_BLOCK_N), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.memset(dst=r[:, 0:ns], value=0.0)
                    res.append(r)
            for kb0 in range(0, nk, kbt):
                kts = min(kbt, nk - kb0)
                # one allocation for both operands, so a block's buffer rotates as a unit
                blk = nl.ndarray((P, kbt, MM_BLOCK_M + MM_BLOCK_N), dtype=b.dtype, buffer=nl.sbuf)
                at = blk[:, :, 0:MM_BLOCK_M]
                bt = blk[:, :, MM_BLOCK_M : MM_BLOCK_M + MM_BLOCK_N]
                for t in range(kts):
                    k0 = (kb0 + t) * P
                    ks = min(P, k_dim - k0)
                    nisa.dma_copy(dst=at[0:ks, t, 0:ms], src=a_t[k0 : k0 + ks, m0 : m0 + ms])
                    nisa.dma_copy(dst=bt[0:ks, t, 0:ns], src=b[k0 : k0 + ks, n0 : n0 + ns])
                for mt in range(mtiles):
                    mm0 = mt * P
                    mms = min(P, ms - mm0)
                    acc = nl.ndarray((P, MM_BLOCK_N), dtype=nl.float32, buffer=nl.psum)
                    for j0 in range(0, ns, PSUM_BANK):
                        js = min(PSUM_BANK, ns - j0)
                        for t in range(kts):
                            ks = min(P, k_dim - (kb0 + t) * P)
                            nisa.nc_matmul(
                                dst=acc[0:mms, j0 : j0 + js],
                                stationary=at[0:ks, t, mm0 : mm0 + mms],
                                moving=bt[0:ks, t, j0 : j0 + js],
                                accumulate=t > 0,
                            )
                    if single_k_block:
                        yt = nl.ndarray((P, MM_BLOCK_N), dtype=out_dtype, buffer=nl.sbuf)
                        # alternate the PSUM evacuation between ScalarE and VectorE
                        if mt % 2:
                            nisa.activation(dst=yt[0:mms, 0:ns], op=nl.copy, data=acc[0:mms, 0:ns])
                        else:
                            nisa.tensor_copy(dst=yt[0:mms, 0:ns], src=acc[0:mms, 0:ns])
                        nisa.dma_copy(
                            dst=out[m0 + mm0 : m0 + mm0 + mms, n0 : n0 + ns], src=yt[0:mms, 0:ns]
                        )
                    else:
                        r = res[mt]
                        nisa.tensor_tensor(
                            dst=r[0:mms, 0:ns],
                            data1=r[0:mms, 0:ns],
                            data2=acc[0:mms, 0:ns],
                            op=nl.add,
                        )
            for mt, r in enumerate(res):
                mm0 = mt * P
                mms = min(P, ms - mm0)
                yt = nl.ndarray((P, MM_BLOCK_N), dtype=out_dtype, buffer=nl.sbuf)
                nisa.activation(dst=yt[0:mms, 0:ns], op=nl.copy, data=r[0:mms, 0:ns])
                nisa.dma_copy(dst=out[m0 + mm0 : m0 + mm0 + mms, n0 : n0 + ns], src=yt[0:mms, 0:ns])
    return out
