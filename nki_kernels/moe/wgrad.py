"""Per-expert weight gradients of the blockwise MoE backward (phase B), accumulated on chip.

Each gradient is a grouped matmul contracted over the tokens of one expert:

    dW[e] [M, N] = sum over the blocks b of expert e of  L_b^T R_b,

L_b [B, M] and R_b [B, N] being the block's token-major scratch rows (phase A):
dW_gate_up = x^T [dg | du] (M = H, N = 2I) and dW_down = act^T (w * do) (M = I, N = H).

Loop nest (weight tile outer, blocks inner):

    for each panel [m0 : m0 + R, n0 : n0 + C] of dW:            static
        for each block b (blocks are grouped by expert):        tiles.block_loop
            prefetch block b+1: L[:, m0 : m0 + R], R[:, n0 : n0 + C], expert, keep
                (when the panel starts, also the next panel's block 0)
            for each 128-row tile r and 512-column tile q (tile j):
                ps = sum over the block's 128-token sub-tiles   PSUM ring, [128, 512] fp32
                acc[j] = select(keep[b], acc[j], 0) + ps        VectorE, one pass
                stage[r, q] = round(acc[j])                     ScalarE (2-byte dW)
            store stage[r, :] -> dW[expert(b), rows r, n0 : n0 + C]

keep[b] is 0 on the first block of an expert and 1 otherwise, so `acc` holds the fp32 sum
over the expert's blocks so far. The restart is a select, never a multiply by 0 (0 * a
NaN of the previous expert is NaN): the accumulators are 512-column slots of two SBUF
tensors (tile j in slot 1 + j // 2 of tensor j % 2), whose slot 0 is a zero tile that is
never written; block b's add reads slot keep[b] * (1 + j // 2) (a run-time index; one
small VectorE op per block builds them) and writes slot 1 + j // 2, so a restart adds
PSUM to +0.0. One VectorE pass per element, reading PSUM, and bit for bit the sum an AND
mask would give. Two tensors because a run-time slot read counts as a read of its whole
tensor: consecutive adds alternate tensors, so an add never reads what the add just
before it wrote (which would drain VectorE's pipeline). Block 0 (always the first of its
expert, and always in the static part) copies PSUM instead: on VectorE for a 2-byte dW
(ScalarE rounds every tile), else on ScalarE. For a 2-byte dW,
ScalarE rounds each tile into a row staging tile (two in turn), so the store DMA moves
2 bytes per element rather than reading fp32 and converting. The sum never leaves the
chip until it is stored, and no gradient is read back from HBM. The running sum is
stored after every block: the store of an expert's last block is the final value. A
kernel specialized on shapes only cannot skip the others (the expert boundaries are
run-time data); they cost HBM write bandwidth and no read. Experts without blocks are
not written.

Block b's inputs are loaded while block b-1 computes: two buffer sets alternate, and the
block loop runs device-loop blocks in pairs so that every body knows its set statically.
A third set takes the next panel's block 0 when a panel starts, and becomes the next
panel's first set, so a panel does not start by waiting for its loads. The adds' slot
indexes of block b+1 are computed after block b's adds: VectorE runs in program order,
and they wait for the keep flag, which loads behind block b+1's rows. The prefetch
after the last block reads one block past the used ones (the scratch has a spare block;
metadata reads past NB are skipped).
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nl
from .tiles import PSUM_FP32, P, block_ap, block_loop, cdiv, matmul, slot_tiles

WGRAD_PSUM = 4  # PSUM tiles in turn (phase A's accumulators are dead by then)
SLOTS_MAX = 64  # PSUM tiles of one panel: (rows / 128) * (columns / 512), 16 * 4 at most


def grad_panels(
    d: dict[str, Any], dws: tuple[Any, Any, Any], scratch: dict[str, Any], cols: tuple[int, int]
) -> tuple[tuple[Any, ...], ...]:
    """`weight_grads`' entries for dW_gate_up (or the gate's and up's, `dws[1]` not None)
    and dW_down, each in its weight's layout: a weight stored transposed (d "gu_t" /
    "dn_t") gets dW^T = R^T L, the same matmuls with the operands swapped, so the
    gradient lands in the parameter's layout without a transpose. `cols`: this
    program's H columns (LNC split)."""
    dw_gu, dw_up, dw_down = dws
    i, x, gu = d["I"], scratch["x"], scratch["gu"]
    halves = [(dw_gu, (0, 2 * i), (0, 0))]
    if dw_up is not None:  # gate and up as two tensors: columns I.. of gu are the up's
        halves = [(dw_gu, (0, i), (0, 0)), (dw_up, (i, 2 * i), (i, 0))]
    out: list[tuple[Any, ...]] = []
    for dst, span, (base, _) in halves:
        if d["gu_t"]:  # dst [E, N, H]
            out.append((dst, gu, x, span, cols, (base, 0)))
        else:  # dst [E, H, N]
            out.append((dst, x, gu, cols, span, (0, base)))
    if d["dn_t"]:  # dst [E, H, I]
        out.append((dw_down, scratch["dy"], scratch["act"], cols, (0, i), (0, 0)))
    else:
        out.append((dw_down, scratch["act"], scratch["dy"], (0, i), cols, (0, 0)))
    return tuple(out)


def weight_grads(
    d: dict[str, Any],
    grads: tuple[tuple[Any, Any, Any, tuple[int, int], tuple[int, int]], ...],
    block_expert: Any,
    block_keep: Any,
    panel: tuple[int, int],
    blocks: tuple[int, int, Any],
) -> None:
    """Every (dW [E, M, N], L scratch [NB+1, B, M], R scratch [NB+1, B, N], rows
    (m_lo, m_hi), columns (n_lo, n_hi)[, origin]) in `grads`: dW[:, m_lo:m_hi, n_lo:n_hi]
    (an LNC program's share; the whole of dW under LNC 1); with `origin` = (m0, n0),
    scratch row / column (m, n) lands at dW's (m - m0, n - n0).

    `panel` = (row tiles R / 128, columns C); `blocks` = (static blocks, NB,
    `tiles.device_bounds` registers or None).
    """
    tiles, cols = panel
    static_blocks, nb, bounds = blocks
    ns, dt = d["NS"], d["dt"]
    lt_rows = min(tiles * P, max([g[0].shape[1] for g in grads]))
    rt_cols = min(cols, max([g[0].shape[2] for g in grads]))
    nt = cdiv(lt_rows, P) * cdiv(rt_cols, PSUM_FP32)
    assert nt <= SLOTS_MAX, "weight_grads: panel"
    # panel tile j in slot 1 + j // 2 of acc[j % 2]; slot 0: zeros (what a restart reads,
    # never written). Two tensors: an add's run-time slot read covers its whole tensor,
    # which the add before it (the other tensor) did not write. Allocated first (the
    # phase's largest tiles must not wait for a hole between smaller ones) and once for
    # all panels, as the rings below
    acc = [
        nl.ndarray((P, 1 + (nt + 1 - h) // 2, PSUM_FP32), dtype=nl.float32, buffer=nl.sbuf)
        for h in range(min(2, nt))
    ]
    for a in acc:
        nisa.memset(dst=a[:, 0, :], value=0.0)
    # two sets alternate between a panel's blocks; the third ("head") takes the next
    # panel's first block while this panel runs, so a panel does not start on its loads
    sets = [_buffers(ns, dt, lt_rows, rt_cols) for _ in range(3)]
    ramp = nl.ndarray((1, SLOTS_MAX), dtype=nl.float32, buffer=nl.sbuf)  # 1, 1, 2, 2, ...
    nisa.iota(dst=ramp, pattern=[[1, SLOTS_MAX // 2], [0, 2]], offset=1)
    # a tile's matmul waits for the add WGRAD_PSUM tiles back, not the previous one; a
    # row's rounded copy (2-byte dW) for the store two rows back
    ring = [nl.ndarray((P, PSUM_FP32), dtype=nl.float32, buffer=nl.psum) for _ in range(WGRAD_PSUM)]
    ddt = grads[0][0].dtype
    narrow = ddt != nl.float32
    stages = [nl.ndarray((P, rt_cols), dtype=ddt, buffer=nl.sbuf) for _ in range(2 * narrow)]
    meta = (block_expert, block_keep)
    pans = []
    for dst, left, right, (m_lo, m_hi), (n_lo, n_hi), *at in grads:
        origin = at[0] if at else (0, 0)
        assert dst.dtype == ddt, "weight_grads: one dW dtype"
        for m0 in range(m_lo, m_hi, tiles * P):
            rows = min(tiles * P, m_hi - m0)
            for n0 in range(n_lo, n_hi, cols):
                cw = min(cols, n_hi - n0)
                pans.append((dst, left, right, m0, rows, n0, cw, acc, ramp, ring, stages, origin))
    first_block = (nisa.register_alloc(0), 0)
    _load_block(d, pans[0], meta, sets[0], first_block)
    for k, pan in enumerate(pans):
        if k + 1 < len(pans):  # the next panel's first block, into the head set
            _load_block(d, pans[k + 1], meta, sets[2], first_block)
        if static_blocks == 0:  # no static first block: start from zeros
            for a in acc:
                nisa.memset(dst=a, value=0.0)
        _slots(pan, sets[0])

        def body(addr: Any, parity: int, first: bool, pan: Any = pan, sets: Any = sets) -> None:
            _panel_block(d, pan, meta, sets, addr, parity, first)

        block_loop(body, static_blocks, nb, bounds)
        del body
        sets = [sets[2], sets[1], sets[0]]  # the head set holds the next panel's block 0


def _buffers(ns: int, dt: Any, rows: int, cols: int) -> dict[str, Any]:
    return {
        "lt": nl.ndarray((P, ns, rows), dtype=dt, buffer=nl.sbuf),
        "rt": nl.ndarray((P, ns, cols), dtype=dt, buffer=nl.sbuf),
        "exp": nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf),
        "keep1": nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf),
        "slot": nl.ndarray((1, 1 + SLOTS_MAX), dtype=nl.int32, buffer=nl.sbuf),
    }


def _load_block(
    d: dict[str, Any], pan: tuple[Any, ...], meta: tuple[Any, Any], buf: dict[str, Any], addr: Any
) -> None:
    """Load block addr's panel inputs, expert id and keep flag into one buffer set."""
    _, left, right, m0, rows, n0, cw = pan[:7]
    block_expert, block_keep = meta
    ns, skip = d["NS"], nisa.oob_mode.skip
    nisa.dma_copy(dst=buf["lt"][:, :, 0:rows], src=slot_tiles(left, addr, 0, ns, m0, rows))
    nisa.dma_copy(dst=buf["rt"][:, :, 0:cw], src=slot_tiles(right, addr, 0, ns, n0, cw))
    one = block_ap(block_expert, addr, [[1, 1], [1, 1]])
    nisa.dma_copy(dst=buf["exp"], src=one, oob_mode=skip)
    bc = block_ap(block_keep, addr, [[0, P], [1, 1]])
    nisa.dma_copy(dst=buf["keep1"], src=bc, oob_mode=skip)


def _slots(pan: tuple[Any, ...], buf: dict[str, Any]) -> None:
    """The slots the adds of the block in `buf` read: keep * (1 + j // 2) for panel tile
    j (0: the zero tile). Issued after the previous block's adds: VectorE runs in
    program order, and this waits for the keep flag's load (behind the block's rows)."""
    rows, cw, ramp = pan[4], pan[6], pan[8]
    nt = cdiv(rows, P) * cdiv(cw, PSUM_FP32)
    nisa.tensor_scalar(
        dst=buf["slot"][0:1, 0:nt],
        data=ramp[0:1, 0:nt],
        op0=nl.multiply,
        operand0=buf["keep1"][0:1, :],
    )


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
    dst, _, _, m0, rows, n0, cw, acc = pan[:8]
    n = dst.shape[2]
    reg, extra = addr
    _load_block(d, pan, meta, sets[1 - parity], (reg, extra + 1))
    buf = sets[parity]
    lt, rt, slot = buf["lt"], buf["rt"], buf["slot"]
    nq = cdiv(cw, PSUM_FP32)
    ring, stages, (om, on) = pan[9], pan[10], pan[11]
    narrow = bool(stages)  # 2-byte dW: stored from a rounded copy, not through the DMA
    copier = nisa.engine.vector if narrow else nisa.engine.scalar  # block 0's PSUM copies
    for r in range(cdiv(rows, P)):
        rr = min(P, rows - r * P)
        stage = stages[r % 2] if narrow else None
        for q in range(nq):
            q0 = q * PSUM_FP32
            qw = min(PSUM_FP32, cw - q0)
            j = r * nq + q
            ps = ring[j % WGRAD_PSUM]
            for c in range(d["NS"]):
                matmul(ps[0:rr, 0:qw], lt[:, c, r * P : r * P + rr], rt[:, c, q0 : q0 + qw], c != 0)
            half = acc[j % 2]
            a = half[0:rr, 1 + j // 2, 0:qw]
            if first:
                nisa.tensor_copy(dst=a, src=ps[0:rr, 0:qw], engine=copier)
            else:  # select, never multiply: 0 * (a NaN of the previous expert) is NaN
                prev = half[0:rr, :, 0:qw].select(1, slot[0:1, j : j + 1])  # zeros or a
                nisa.tensor_tensor(dst=a, data1=prev, data2=ps[0:rr, 0:qw], op=nl.add)
            if narrow:
                nisa.activation(dst=stage[0:rr, q0 : q0 + qw], op=nl.copy, data=a)
        row0 = (m0 - om + r * P) * n + n0 - on
        if narrow:
            view = dst.ap([[n, rr], [1, cw]], offset=row0, scalar_offset=buf["exp"], indirect_dim=0)
            nisa.dma_copy(dst=view, src=stage[0:rr, 0:cw])
            continue
        for q in range(nq):  # fp32: each tile straight from its slot
            q0 = q * PSUM_FP32
            qw = min(PSUM_FP32, cw - q0)
            j = r * nq + q
            view = dst.ap(
                [[n, rr], [1, qw]], offset=row0 + q0, scalar_offset=buf["exp"], indirect_dim=0
            )
            nisa.dma_copy(dst=view, src=acc[j % 2][0:rr, 1 + j // 2, 0:qw])
    _slots(pan, sets[1 - parity])
