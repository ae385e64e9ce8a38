"""Per-expert weight gradients of the blockwise MoE backward (phase B), accumulated on chip.

Each gradient is a grouped matmul contracted over the tokens of one expert:

    dW[e] [M, N] = sum over the blocks b of expert e of  L_b^T R_b,

L_b [B, M] and R_b [B, N] being the block's token-major scratch rows (phase A):
dW_gate_up = x^T [dg | du] (M = H, N = 2I) and dW_down = act^T (w * do) (M = I, N = H).

Loop nest (weight tile outer, blocks inner):

    for each panel [m0 : m0 + R, n0 : n0 + C] of dW:            static
        for each block b (blocks are grouped by expert):        tiles.block_loop
            prefetch block b+1: L[:, m0 : m0 + R], R[:, n0 : n0 + C], expert, keep
            for each 128-row tile r and 512-column tile q:
                ps = sum over the block's 128-token sub-tiles   PSUM, [128, 512] fp32
                acc[r, q] = (acc[r, q] AND mask[b]) + ps        VectorE: bit select, add
            store acc[r, :] -> dW[expert(b), rows r, n0 : n0 + C]

keep[b] is 0 on the first block of an expert and 1 otherwise, so `acc` holds the fp32 sum
over the expert's blocks so far. The restart is a select, never a multiply by 0: the fp32
sum's bits are ANDed with an int32 mask (0 at a restart, all ones otherwise; bitwise ops
run on VectorE only), so a NaN / Inf in one expert's sum cannot reach the next one. The
sum never leaves the chip until it is stored, and no gradient is read back from HBM.
Block 0 (always the first of its expert, and always in the static part) copies PSUM
instead, so `acc` needs no zero fill. The running sum is
stored after every block: the store of an expert's last block is the final value. A
kernel specialized on shapes only cannot skip the others (the expert boundaries are
run-time data); they cost HBM write bandwidth and no read, and the next block's update of
a row tile waits on its store (write-after-read on `acc`), which also orders two stores to
the same rows. Experts without blocks are not written.

Block b's inputs are loaded while block b-1 computes: two buffer sets alternate, and the
block loop runs device-loop blocks in pairs so that every body knows its set statically.
The prefetch after the last block reads one block past the used ones (the scratch has a
spare block; metadata reads past NB are skipped).
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nl
from .tiles import PSUM_FP32, P, block_ap, block_loop, cdiv, matmul, slot_tiles


def weight_grads(
    d: dict[str, Any],
    grads: tuple[tuple[Any, Any, Any, tuple[int, int], tuple[int, int]], ...],
    block_expert: Any,
    block_keep: Any,
    panel: tuple[int, int],
    blocks: tuple[int, int, Any],
) -> None:
    """Every (dW [E, M, N], L scratch [NB+1, B, M], R scratch [NB+1, B, N], rows
    (m_lo, m_hi), columns (n_lo, n_hi)) in `grads`: dW[:, m_lo:m_hi, n_lo:n_hi] (an LNC
    program's share; the whole of dW under LNC 1).

    `panel` = (row tiles R / 128, columns C); `blocks` = (static blocks, NB,
    `tiles.device_bounds` registers or None).
    """
    tiles, cols = panel
    static_blocks, nb, bounds = blocks
    ns, dt = d["NS"], d["dt"]
    lt_rows = min(tiles * P, max([g[0].shape[1] for g in grads]))
    rt_cols = min(cols, max([g[0].shape[2] for g in grads]))
    sets = [_buffers(ns, dt, lt_rows, rt_cols) for _ in range(2)]
    meta = (block_expert, block_keep)
    for dst, left, right, (m_lo, m_hi), (n_lo, n_hi) in grads:
        for m0 in range(m_lo, m_hi, tiles * P):
            rows = min(tiles * P, m_hi - m0)
            for n0 in range(n_lo, n_hi, cols):
                cw = min(cols, n_hi - n0)
                acc = nl.ndarray((P, cdiv(rows, P), cw), dtype=nl.float32, buffer=nl.sbuf)
                if static_blocks == 0:  # no static first block: start from zeros
                    nisa.memset(dst=acc, value=0.0)
                pan = (dst, left, right, m0, rows, n0, cw, acc)
                _prefetch(d, pan, meta, sets[0], (nisa.register_alloc(0), 0))

                def body(addr: Any, parity: int, first: bool, pan: Any = pan) -> None:
                    _panel_block(d, pan, meta, sets, addr, parity, first)

                block_loop(body, static_blocks, nb, bounds)
                del acc, pan, body


def _buffers(ns: int, dt: Any, rows: int, cols: int) -> dict[str, Any]:
    return {
        "lt": nl.ndarray((P, ns, rows), dtype=dt, buffer=nl.sbuf),
        "rt": nl.ndarray((P, ns, cols), dtype=dt, buffer=nl.sbuf),
        "exp": nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf),
        "keep1": nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf),
        "keep": nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf),
    }


def _prefetch(
    d: dict[str, Any], pan: tuple[Any, ...], meta: tuple[Any, Any], buf: dict[str, Any], addr: Any
) -> None:
    """Load block addr's panel inputs, expert id and keep flag into one buffer set."""
    _, left, right, m0, rows, n0, cw, _ = pan
    block_expert, block_keep = meta
    ns, skip = d["NS"], nisa.oob_mode.skip
    nisa.dma_copy(dst=buf["lt"][:, :, 0:rows], src=slot_tiles(left, addr, 0, ns, m0, rows))
    nisa.dma_copy(dst=buf["rt"][:, :, 0:cw], src=slot_tiles(right, addr, 0, ns, n0, cw))
    one = block_ap(block_expert, addr, [[1, 1], [1, 1]])
    nisa.dma_copy(dst=buf["exp"], src=one, oob_mode=skip)
    bc = block_ap(block_keep, addr, [[0, P], [1, 1]])
    nisa.dma_copy(dst=buf["keep1"], src=bc, oob_mode=skip)
    # keep 1.0 / 0.0 -> an int32 AND mask: -1 (all ones) / 0
    nisa.tensor_scalar(dst=buf["keep"], data=buf["keep1"], op0=nl.multiply, operand0=-1.0)


def _panel_block(
    d: dict[str, Any],
    pan: tuple[Any, ...],
    meta: tuple[Any, Any],
    sets: list[dict[str, Any]],
    addr: Any,
    parity: int,
    first: bool,
) -> None:
    """Prefetch block b+1, add block b's contribution to the panel accumulator and store
    the running sum."""
    dst, _, _, m0, rows, n0, cw, acc = pan
    n = dst.shape[2]
    reg, extra = addr
    _prefetch(d, pan, meta, sets[1 - parity], (reg, extra + 1))
    buf = sets[parity]
    lt, rt, keep = buf["lt"], buf["rt"], buf["keep"]
    for r in range(cdiv(rows, P)):
        rr = min(P, rows - r * P)
        for q0 in range(0, cw, PSUM_FP32):
            qw = min(PSUM_FP32, cw - q0)
            ps = nl.ndarray((P, PSUM_FP32), dtype=nl.float32, buffer=nl.psum)
            for c in range(d["NS"]):
                matmul(ps[0:rr, 0:qw], lt[:, c, r * P : r * P + rr], rt[:, c, q0 : q0 + qw], c != 0)
            a = acc[0:rr, r, q0 : q0 + qw]
            if first:
                nisa.tensor_copy(dst=a, src=ps[0:rr, 0:qw], engine=nisa.engine.scalar)
            else:  # select, never multiply: 0 * (a NaN of the previous expert) is NaN
                bits = a.view(nl.int32)  # AND with 0 / all ones: +0.0 or a, bit for bit
                nisa.tensor_scalar(
                    dst=bits,
                    data=bits,
                    op0=nl.bitwise_and,
                    operand0=keep[0:rr, :],
                )
                nisa.tensor_tensor(dst=a, data1=a, data2=ps[0:rr, 0:qw], op=nl.add)
        pat = [[n, rr], [1, cw]]
        view = dst.ap(pat, offset=(m0 + r * P) * n + n0, scalar_offset=buf["exp"], indirect_dim=0)
        nisa.dma_copy(dst=view, src=acc[0:rr, r, 0:cw])
