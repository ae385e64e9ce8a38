"""Tiling helpers shared by the norm kernels (inlined into them at specialization).

Row tiles: rows are laid out `kk` per partition (partition p of a tile holds rows
r0 + p*kk .. r0 + p*kk + kk - 1, one contiguous HBM run), with a ragged tail taken by
slicing. Column chunks split the hidden dim. `ring_alloc` gives explicit multi-buffering.
`colsum_*` reduce values across rows (partitions) on TensorE: each [rows, 128] column
block is the stationary operand of a matmul against a ones column, accumulating its
column sums into one PSUM bank for the whole kernel ([128, ceil(H/128)] fp32, column c at
partition c % 128, column c // 128); at the end the bank is transposed on TensorE so the
result leaves in contiguous 512 B rows.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nl

# --- limits ---------------------------------------------------------------------------
P = 128  # partitions
# One fp32 PSUM bank holds 512 columns of the [128, ceil(H/128)] column-sum layout.
COLSUM_MAX_H = P * 512


def row_tiles(n: int, k: int, pid: int = 0, nprog: int = 1) -> list[tuple[int, int, int]]:
    """Row tiles (r0, rows, kk) covering [0, n): rows partitions x kk rows per partition.

    Full tiles take P x k rows; the tail takes P x (remaining // P) rows, then one last
    tile of fewer than P partitions. Program `pid` of `nprog` takes every nprog-th tile.
    """
    tiles = []
    r0 = 0
    while r0 < n:
        rem = n - r0
        if rem >= P * k:
            rows, kk = P, k
        elif rem >= P:
            rows, kk = P, rem // P
        else:
            rows, kk = rem, 1
        tiles.append((r0, rows, kk))
        r0 += rows * kk
    return tiles[pid::nprog]


def col_chunks(hdim: int, chunk: int) -> list[tuple[int, int]]:
    """Column chunks (c0, width) covering [0, hdim)."""
    return [(c0, min(chunk, hdim - c0)) for c0 in range(0, hdim, chunk)]


def programs() -> tuple[int, int]:
    """(program id, number of programs) of this LNC launch."""
    if nl.program_ndim() == 0:
        return 0, 1
    return nl.program_id(0), nl.num_programs(0)


def ring_alloc(ring: list[Any], depth: int, shape: tuple[int, ...], dtype: Any) -> Any:
    """Allocate an SBUF tile that rotates through `depth` buffers.

    `ring` holds the tiles still in flight; the oldest is dropped first so its buffer can
    be reused (depth 1: one buffer, no overlap; depth 2: double buffering; ...).
    """
    while len(ring) >= depth:
        ring.pop(0)
    t = nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)
    ring.append(t)
    return t


def load_row_vector(v: Any, hdim: int) -> Any:
    """A [H] HBM vector broadcast to every partition: [P, H] in SBUF (one DMA)."""
    t = nl.ndarray((P, hdim), dtype=v.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=v.reshape((1, hdim)).broadcast(0, P))
    return t


def const_column(value: float) -> Any:
    """A [P, 1] fp32 SBUF column filled with `value` (activation bias on every NC version)."""
    t = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=float(value))
    return t


def tile_view(t: Any, r0: int, rows: int, kk: int) -> Any:
    """HBM rows [r0, r0 + rows*kk) of a [N, H] tensor as [rows, kk, H]."""
    hdim = t.shape[1]
    return t[r0 : r0 + rows * kk, :].reshape((rows, kk, hdim))


def mul_by(dst: Any, a: Any, b: Any, engine: str) -> None:
    """dst = a * b element-wise on `engine` ('split': first half VectorE, rest GpSimd)."""
    if engine == "split" and dst.free_size >= 2:
        half = dst.free_size // 2
        cw = dst.free_size
        nisa.tensor_tensor(
            dst=dst[:, 0:half],
            data1=a[:, 0:half],
            data2=b[:, 0:half],
            op=nl.multiply,
            engine=nisa.engine.vector,
        )
        nisa.tensor_tensor(
            dst=dst[:, half:cw],
            data1=a[:, half:cw],
            data2=b[:, half:cw],
            op=nl.multiply,
            engine=nisa.engine.gpsimd,
        )
        return
    eng = nisa.engine.gpsimd if engine == "gpsimd" else nisa.engine.vector
    nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=nl.multiply, engine=eng)


def colsum_init(hdim: int) -> dict[str, Any]:
    """A column-sum accumulator for an [*, hdim] operand: one PSUM bank, nothing written yet."""
    assert hdim <= COLSUM_MAX_H, f"column sums support H <= {COLSUM_MAX_H}; got {hdim}"
    ncol = (hdim + P - 1) // P
    acc = nl.ndarray((P, ncol), dtype=nl.float32, buffer=nl.psum)
    return {"acc": acc, "hdim": hdim, "ncol": ncol, "started": [False] * ncol, "ones": {}}


def _ones(state: dict[str, Any], dtype: Any) -> Any:
    key = str(dtype)
    if key not in state["ones"]:
        t = nl.ndarray((P, 1), dtype=dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=1.0)
        state["ones"][key] = t
    return state["ones"][key]


def colsum_add(state: dict[str, Any], data: Any, c0: int, row_weight: Any = None) -> None:
    """Add the column sums of `data` ([rows, cw] SBUF, columns c0.., c0 % 128 == 0).

    With `row_weight` ([rows, 1] SBUF, data's dtype class) the sums are weighted per row:
    sum_r data[r, c] * row_weight[r] -- the matmul applies a per-row scale for free.
    """
    assert c0 % P == 0, f"column blocks start at multiples of {P}; got {c0}"
    rows, cw = data.shape[0], data.shape[1]
    ones = _ones(state, data.dtype) if row_weight is None else row_weight
    for s0 in range(0, cw, P):
        m = min(P, cw - s0)
        ci = (c0 + s0) // P
        nisa.nc_matmul(
            dst=state["acc"][0:m, ci : ci + 1],
            stationary=data[0:rows, s0 : s0 + m],
            moving=ones[0:rows, 0:1] if row_weight is None else ones,
            accumulate=state["started"][ci],
        )
        state["started"][ci] = True


def colsum_store(state: dict[str, Any], out: Any) -> None:
    """Write the accumulated column sums to `out` ([hdim] HBM, cast by the DMA)."""
    hdim, ncol = state["hdim"], state["ncol"]
    assert all(state["started"]), "every column block must have received a sum"
    prows = min(P, hdim)
    sb = nl.ndarray((P, ncol), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=sb[0:prows, :], src=state["acc"][0:prows, :])
    tail = hdim - (ncol - 1) * P  # width of the last column block (1..128)
    for b0 in range(0, ncol, P):
        nb = min(P, ncol - b0)
        tp = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=tp[0:nb, 0:prows], data=sb[0:prows, b0 : b0 + nb])
        ts = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=ts[0:nb, 0:prows], src=tp[0:nb, 0:prows])
        nfull = nb if (b0 + nb < ncol or tail == P) else nb - 1
        if nfull > 0:
            nisa.dma_copy(
                dst=out[b0 * P : (b0 + nfull) * P].reshape((nfull, P)), src=ts[0:nfull, 0:P]
            )
        if nfull < nb:
            lo = (ncol - 1) * P
            nisa.dma_copy(dst=out[lo:hdim].reshape((1, tail)), src=ts[nb - 1 : nb, 0:tail])
