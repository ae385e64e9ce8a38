"""The training forward's gate / up save (`moe_mlp_fwd` with `save_cols`): each I tile's
pre-activation gate and up copied out of PSUM and stored at the block's columns of the
saved [2I, NC] array, and the zero stores of what no block writes (the holes inside the
backward's blocks and the tail past them). See blockwise_mlp.py, "Saving gate / up".
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nl
from .tiles import P, as_register, block_ap, cdiv

HOLE_TILES = 16  # 128-row tiles of zeros per hole DMA (a 4 KiB bf16 tile per partition)
TAIL_COLS = 2048  # columns per tail DMA: runs of 4 KiB in bf16
TAIL_TILE_BYTES = 16384  # the tail's zero tile per partition in fp32 (half of it in bf16)


def keep_gate_up(d: dict[str, Any], gate_up: Any, col: Any, rows: Any, accs: Any) -> None:
    """gate_up[i_row + r, col + c] = g[r, c] and gate_up[I + i_row + r, col + c] = u[r, c]
    for one I tile of the block (r < cw, c < the block's slots), rounded to the dtype as
    one PSUM-to-SBUF copy each (ScalarE: g, VectorE: u; the SwiGLU read them already)."""
    i_row, cw = rows
    bsz, ncol = d["B"], gate_up.shape[1]
    engines = (nisa.engine.scalar, nisa.engine.vector)
    for ps, r0, eng in zip(accs, (i_row, d["I"] + i_row), engines):
        sb = nl.ndarray((P, bsz), dtype=d["dt"], buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb[0:cw, :], src=ps[0:cw, 0:bsz], engine=eng)
        view = gate_up.ap(
            [[ncol, cw], [1, bsz]], offset=r0 * ncol, scalar_offset=col, indirect_dim=1
        )
        nisa.dma_copy(dst=view, src=sb[0:cw, :])


def zero_holes(
    d: dict[str, Any], gate_up: Any, save_holes: Any, static_holes: Any, prog: Any
) -> None:
    """Zero what no block of gate_up's writes (`save_holes`, `grouping.gate_up_columns`):
    the holes, 128 columns each, and the tail from column save_holes[-1] on, in chunks of
    TAIL_COLS columns while they fit (runs of TAIL_COLS elements; a 128-column hole's
    runs are 128), then 128-column pieces. Program p takes every other hole, chunk and
    piece. `static_holes` (pricing): (holes, tail column) known when specializing."""
    pid, step = prog
    nh = min(cdiv(gate_up.shape[0], P), HOLE_TILES)
    zero = nl.ndarray((P, nh, P), dtype=d["dt"], buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)

    def hole(i: Any) -> None:
        col = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=col, src=block_ap(save_holes, (i, 0), [[1, 1], [1, 1]]))
        _zero_columns(gate_up, zero, col, P)

    ncol = gate_up.shape[1]
    width = 1 << (min(TAIL_COLS, ncol).bit_length() - 1)  # a power of two, >= 256
    tiles = max(1, TAIL_TILE_BYTES // (width * 4))
    wide = nl.ndarray((P, tiles, width), dtype=d["dt"], buffer=nl.sbuf)
    nisa.memset(dst=wide, value=0.0)

    def chunk(i: Any) -> None:  # columns [i, i + width)
        _zero_columns(gate_up, wide, i, width)

    def piece(i: Any) -> None:  # columns [i, i + 128): the tail's last, short part
        _zero_columns(gate_up, zero, i, P)

    # the tail [start, ncol) in whole chunks while they fit, then 128-column pieces from
    # rest = ncol - ((ncol - start) mod width) (width a power of two, the tail whole
    # 128-column sub-tiles)
    if static_holes is not None:  # pricing: the count and the tail known when specializing
        holes, start = static_holes
        for j in range(pid, holes, step):
            hole(as_register(j + 1))
        rest = ncol - (ncol - start) % width
        for c in range(start + pid * width, rest, step * width):
            chunk(as_register(c))
        for c in range(rest + pid * P, ncol, step * P):
            piece(as_register(c))
        return
    cnt = nl.ndarray((1, 3), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cnt[0:1, 0:1], src=save_holes[0:1, 0:1])
    nisa.tensor_scalar(dst=cnt[0:1, 0:1], data=cnt[0:1, 0:1], op0=nl.add, operand0=1)
    hi = nisa.register_alloc()
    nisa.register_load(hi, cnt[0:1, 0:1])
    nl.fori_loop(nisa.register_alloc(pid + 1), hi, hole, step=step)
    last = save_holes.shape[0] - 1
    start = cnt[0:1, 1:2]
    nisa.dma_copy(dst=start, src=save_holes[last : last + 1, 0:1])
    rest = cnt[0:1, 2:3]  # ncol - ((ncol - start) & (width - 1))
    nisa.tensor_scalar(dst=rest, data=start, op0=nl.multiply, operand0=-1)
    nisa.tensor_scalar(dst=rest, data=rest, op0=nl.add, operand0=ncol)
    nisa.tensor_scalar(dst=rest, data=rest, op0=nl.bitwise_and, operand0=width - 1)
    nisa.tensor_scalar(dst=rest, data=rest, op0=nl.multiply, operand0=-1)
    nisa.tensor_scalar(dst=rest, data=rest, op0=nl.add, operand0=ncol + pid * P)
    nisa.tensor_scalar(dst=start, data=start, op0=nl.add, operand0=pid * width)
    lo, mid = nisa.register_alloc(), nisa.register_alloc()
    nisa.register_load(lo, start)
    nisa.register_load(mid, rest)
    # chunks i < rest (this program's: from start + pid * width), pieces from rest on
    nl.fori_loop(lo, ncol - width + 1, chunk, step=step * width)
    nl.fori_loop(mid, ncol, piece, step=step * P)


def _zero_columns(gate_up: Any, zero: Any, col: Any, width: int) -> None:
    """gate_up[:, col : col + width] = 0 from `zero` [128, row tiles, width] (SBUF); col: a
    [1, 1] SBUF int or a register."""
    rows, ncol = gate_up.shape
    nj = zero.shape[1]
    for j0 in range(0, rows // P, nj):  # whole 128-row tiles, nj per DMA
        n = min(nj, rows // P - j0)
        pat = [[ncol, P], [P * ncol, n], [1, width]]
        view = gate_up.ap(pat, offset=j0 * P * ncol, scalar_offset=col, indirect_dim=1)
        nisa.dma_copy(dst=view, src=zero[:, 0:n, 0:width])
    if rows % P:
        r0 = rows - rows % P
        pat = [[ncol, rows % P], [1, width]]
        view = gate_up.ap(pat, offset=r0 * ncol, scalar_offset=col, indirect_dim=1)
        nisa.dma_copy(dst=view, src=zero[0 : rows % P, 0, 0:width])
