"""Blockwise grouped expert MLP (SwiGLU), backward: dgrad, per-expert wgrad, routing grads.

Same block plan as the forward. With do = dout rows of the block's tokens (unweighted),
w = the slots' routing weights and, per intermediate chunk (I-major, [chunk, B]):

    gT, uT   = Wg^T xT, Wu^T xT                  recomputed (gate/up are not saved)
    gaT      = Wd doT                            dL/d(act) before the routing weight
    actT     = silu(gT) * uT
    dws     += sum over I of actT * gaT          dL/d(weight) per slot (ones-vector matmul)
    dgT      = gaT * w * uT * silu'(gT),  duT = gaT * w * silu(gT)
    dWd[e]  += act (w * do)                      contraction over the block's tokens
    dWg[e]  += x^T dg,  dWu[e] += x^T du         contraction over the block's tokens
    dx      += dg Wg^T + du Wu^T                 contraction over I (fp32 SBUF over chunks)

Contractions over I need I on partitions, so the chunk's Wd is transposed to H-major and
Wg / Wu to I-major on the PE; token-major act / dg / du come from PE transposes too.

Weight gradients: every block adds its [rows, cols] partial into the fp32 HBM
accumulators `dw_gate_up` / `dw_down` (read-modify-write by DMA with the expert picked by
`.ap(scalar_offset=expert)`). They are kernel *inputs written in place*: the caller passes
zeros (or gradients to accumulate into), so experts without tokens keep exact zeros.
Blocks run in order, so the accumulation order is fixed (deterministic).

dx per slot goes to an HBM scratch; the combine sums each token's k slots (j ascending)
into dhidden and gathers d_weights[t, j] = dws[slot(t, j)] (0 for dropped assignments).
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl
from .blockwise_mlp import (
    PSUM_FP32,
    P,
    block_meta,
    cdiv,
    gather_rows,
    load_weight_rows,
    tile_rows,
    transpose_into,
)

RMW_COLS = 2048  # dw_down columns per read-modify-write DMA (8 KiB fp32 rows)
WGRAD_H = 4  # 128-row H tiles per dw_gate_up read-modify-write DMA
COMBINE_COLS = 2048  # hidden columns per combine step


@nki.jit
def moe_mlp_bwd(
    hidden,
    w_gate_up,
    w_down,
    dout,
    slot_token,
    slot_weight,
    slot_weight_row,
    block_expert,
    block_count,
    token_slot,
    dw_gate_up,
    dw_down,
    static_blocks,
    may_drop,
    block_size,
    tile_i,
):
    """(dhidden [T, H], d_weights [T, k] fp32); dw_gate_up / dw_down (fp32) += wgrads.

    Shapes as in `moe_mlp_fwd`, plus dout [T, H], slot_weight [NB, 128, B/128] fp32 and
    slot_weight_row [NB, B] fp32 (the same weights in slot order).
    """
    t_count, h = hidden.shape
    nb, parts, ns = slot_token.shape
    assert parts == P and block_size == P * ns, "moe_mlp_bwd: block_size does not match"
    assert dw_gate_up.shape == w_gate_up.shape and dw_down.shape == w_down.shape
    k = token_slot.shape[1]
    d = {
        "T": t_count,
        "H": h,
        "I": w_gate_up.shape[2] // 2,
        "NB": nb,
        "NS": ns,
        "B": block_size,
        "HT": cdiv(h, P),
        "K": k,
        "dt": hidden.dtype,
        "TI": tile_i,
    }
    dhidden = nl.ndarray((t_count, h), dtype=hidden.dtype, buffer=nl.shared_hbm)
    d_weights = nl.ndarray((t_count, k), dtype=nl.float32, buffer=nl.shared_hbm)
    dx_slots = nl.ndarray((nb * block_size, h), dtype=hidden.dtype, buffer=nl.hbm)
    dws_slots = nl.ndarray((nb * block_size, 1), dtype=nl.float32, buffer=nl.hbm)
    ws = (hidden, w_gate_up, w_down, dout, slot_token, slot_weight, slot_weight_row)
    ws = (*ws, block_expert, dw_gate_up, dw_down, dx_slots, dws_slots)

    for b in range(min(static_blocks, nb)):
        _bwd_block(d, ws, b)
    if static_blocks < nb:
        count = nisa.register_alloc()
        nisa.register_load(count, block_count)

        def body(i):
            _bwd_block(d, ws, i)

        nl.fori_loop(static_blocks, count, body)
    _combine_grads(d, dhidden, d_weights, dx_slots, dws_slots, token_slot, may_drop)
    return dhidden, d_weights


def _bwd_block(d: dict[str, Any], ws: tuple[Any, ...], b: Any) -> None:
    hidden, w_gate_up, w_down, dout, slot_token, slot_weight, slot_weight_row = ws[:7]
    block_expert, dw_gate_up, dw_down, dx_slots, dws_slots = ws[7:]
    h, ns, bsz = d["H"], d["NS"], d["B"]
    tok, exp = block_meta(d, slot_token, block_expert, b)
    wsl = nl.ndarray((P, ns), dtype=nl.float32, buffer=nl.sbuf)
    w_bc = nl.ndarray((P, bsz), dtype=nl.float32, buffer=nl.sbuf)
    if isinstance(b, int):
        nisa.dma_copy(dst=wsl, src=slot_weight[b])
        nisa.dma_copy(dst=w_bc, src=slot_weight_row[b : b + 1, :].broadcast(0, P))
    else:
        pat = [[ns, P], [1, ns]]
        nisa.dma_copy(dst=wsl, src=slot_weight.ap(pat, offset=0, scalar_offset=b, indirect_dim=0))
        bc = slot_weight_row.ap([[0, P], [1, bsz]], offset=0, scalar_offset=b, indirect_dim=0)
        nisa.dma_copy(dst=w_bc, src=bc)

    x_tok, dy_tok, xT, doT = _load_block_rows(d, hidden, dout, tok, wsl)

    dx = [nl.ndarray((P, h), dtype=nl.float32, buffer=nl.sbuf) for _ in range(ns)]
    dws = nl.ndarray((1, bsz), dtype=nl.float32, buffer=nl.psum)
    ones = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    tensors = (w_gate_up, w_down, dw_gate_up, dw_down, exp)
    acts = (x_tok, xT, doT, dy_tok, w_bc, ones, dws, dx)
    for ic in range(cdiv(d["I"], d["TI"])):
        _bwd_chunk(d, tensors, acts, ic)

    dws_sb = nl.ndarray((1, bsz), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=dws_sb, src=dws)
    if isinstance(b, int):
        r0 = b * bsz
        nisa.dma_copy(dst=dws_slots[r0 : r0 + bsz, :], src=dws_sb)
        for c in range(ns):
            nisa.dma_copy(dst=dx_slots[r0 + c * P : r0 + (c + 1) * P, :], src=dx[c])
    else:
        row0 = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.register_store(row0, b)
        nisa.tensor_scalar(dst=row0, data=row0, op0=nl.multiply, operand0=bsz)
        view = dws_slots.ap([[1, 1], [1, bsz]], offset=0, scalar_offset=row0, indirect_dim=0)
        nisa.dma_copy(dst=view, src=dws_sb)
        for c in range(ns):
            pat = [[h, P], [1, h]]
            view = dx_slots.ap(pat, offset=c * P * h, scalar_offset=row0, indirect_dim=0)
            nisa.dma_copy(dst=view, src=dx[c])


def _load_block_rows(
    d: dict[str, Any], hidden: Any, dout: Any, tok: Any, wsl: Any
) -> tuple[list[Any], list[Any], Any, Any]:
    """Token rows x and w * dout ([128, H] per sub-tile) and the transposes xT, doT."""
    h, dt, bsz = d["H"], d["dt"], d["B"]
    x_tok, dy_tok, do_tok = [], [], []
    xT = nl.ndarray((P, d["HT"], bsz), dtype=dt, buffer=nl.sbuf)
    doT = nl.ndarray((P, d["HT"], bsz), dtype=dt, buffer=nl.sbuf)
    for c in range(d["NS"]):
        x_tok.append(nl.ndarray((P, h), dtype=dt, buffer=nl.sbuf))
        gather_rows(hidden, tok[:, c : c + 1], x_tok[c], h)
        do_tok.append(nl.ndarray((P, h), dtype=dt, buffer=nl.sbuf))
        gather_rows(dout, tok[:, c : c + 1], do_tok[c], h)
        dy_tok.append(nl.ndarray((P, h), dtype=dt, buffer=nl.sbuf))
        w_col = wsl[:, c : c + 1]
        nisa.tensor_scalar(dst=dy_tok[c], data=do_tok[c], op0=nl.multiply, operand0=w_col)
    parity = 0
    for t in range(d["HT"]):
        tr = tile_rows(h, t)
        cols = slice(t * P, t * P + tr)
        parity = transpose_into(dt, [r[:, cols] for r in x_tok], xT[:, t, :], parity)
        parity = transpose_into(dt, [r[:, cols] for r in do_tok], doT[:, t, :], parity)
    return x_tok, dy_tok, xT, doT


def _bwd_chunk(d: dict[str, Any], tensors: tuple[Any, ...], acts: tuple[Any, ...], ic: int) -> None:
    w_gate_up, w_down, dw_gate_up, dw_down, exp = tensors
    x_tok, xT, doT, dy_tok, w_bc, ones, dws, dx = acts
    h, ht, bsz, dt, ti = d["H"], d["HT"], d["B"], d["dt"], d["TI"]
    i0 = ic * ti
    icw = min(ti, d["I"] - i0)
    nit = cdiv(icw, P)

    # chunk phases keep at most three weight copies live: Wd -> H-major WdT, then the
    # recompute with Wg / Wu (H-major), then Wg / Wu -> I-major for dx
    wd = nl.ndarray((P, nit, h), dtype=dt, buffer=nl.sbuf)
    load_weight_rows(w_down, exp, i0, icw, 0, h, wd)
    wdT = _h_major(d, wd, icw)
    del wd
    wg = nl.ndarray((P, ht, ti), dtype=dt, buffer=nl.sbuf)
    wu = nl.ndarray((P, ht, ti), dtype=dt, buffer=nl.sbuf)
    load_weight_rows(w_gate_up, exp, 0, h, i0, icw, wg)
    load_weight_rows(w_gate_up, exp, 0, h, d["I"] + i0, icw, wu)

    dgT = nl.ndarray((P, nit, bsz), dtype=dt, buffer=nl.sbuf)
    duT = nl.ndarray((P, nit, bsz), dtype=dt, buffer=nl.sbuf)
    actT = nl.ndarray((P, nit, bsz), dtype=dt, buffer=nl.sbuf)
    for it in range(nit):
        ins = (wg, wu, wdT, xT, doT, w_bc, ones, dws)
        _pointwise(d, ins, it, _cw(icw, it), ic == 0 and it == 0, (dgT, duT, actT))
        del ins
    del wdT
    wgT = _i_major(d, wg, icw)
    del wg
    wuT = _i_major(d, wu, icw)
    del wu

    # token-major act / dg / du for the weight gradients (contraction over tokens)
    act_tok = _token_major(d, actT, icw)
    del actT
    dg_tok = _token_major(d, dgT, icw)
    du_tok = _token_major(d, duT, icw)

    _wgrad_down(d, dw_down, exp, act_tok, dy_tok, i0, icw)
    _wgrad_gate_up(d, dw_gate_up, exp, x_tok, dg_tok, i0, icw)
    _wgrad_gate_up(d, dw_gate_up, exp, x_tok, du_tok, d["I"] + i0, icw)
    _dgrad(d, dgT, duT, wgT, wuT, icw, ic, dx)


def _h_major(d: dict[str, Any], wd: Any, icw: int) -> Any:
    """The chunk's Wd rows [I rows, nit, H] transposed to [H rows, HT, tile_i] (PE)."""
    h, dt = d["H"], d["dt"]
    nit = cdiv(icw, P)
    wdT = nl.ndarray((P, d["HT"], d["TI"]), dtype=dt, buffer=nl.sbuf)
    parity = 0
    for t in range(d["HT"]):
        tr = tile_rows(h, t)
        srcs = [wd[0 : _cw(icw, it), it, t * P : t * P + tr] for it in range(nit)]
        parity = transpose_into(dt, srcs, wdT[0:tr, t, 0:icw], parity)
    return wdT


def _i_major(d: dict[str, Any], w: Any, icw: int) -> Any:
    """A chunk of Wg or Wu [H rows, HT, tile_i] transposed to [I rows, nit, H] (PE)."""
    h, dt = d["H"], d["dt"]
    nit = cdiv(icw, P)
    wT = nl.ndarray((P, nit, h), dtype=dt, buffer=nl.sbuf)
    parity = 0
    for it in range(nit):
        cw = _cw(icw, it)
        srcs = [w[0 : tile_rows(h, t), t, it * P : it * P + cw] for t in range(d["HT"])]
        parity = transpose_into(dt, srcs, wT[0:cw, it, :], parity)
    return wT


def _token_major(d: dict[str, Any], src: Any, icw: int) -> Any:
    """[128 tokens, NS, tile_i] transposes of an I-major [I rows, nit, B] chunk tile."""
    dst = nl.ndarray((P, d["NS"], d["TI"]), dtype=d["dt"], buffer=nl.sbuf)
    parity = 1
    for c in range(d["NS"]):
        srcs = [src[0 : _cw(icw, it), it, c * P : (c + 1) * P] for it in range(cdiv(icw, P))]
        parity = transpose_into(d["dt"], srcs, dst[:, c, 0:icw], parity)
    return dst


def _cw(icw: int, it: int) -> int:
    return min(P, icw - it * P)


def _pointwise(
    d: dict[str, Any], ins: tuple[Any, ...], it: int, cw: int, first: bool, outs: tuple[Any, ...]
) -> None:
    """Recompute gT / uT, form gaT and the SwiGLU derivatives for one 128-row I tile."""
    wg, wu, wdT, xT, doT, w_bc, ones, dws = ins
    dgT, duT, actT = outs
    h, bsz = d["H"], d["B"]
    g_ps = nl.ndarray((P, bsz), dtype=nl.float32, buffer=nl.psum)
    u_ps = nl.ndarray((P, bsz), dtype=nl.float32, buffer=nl.psum)
    ga_ps = nl.ndarray((P, bsz), dtype=nl.float32, buffer=nl.psum)
    cols = slice(it * P, it * P + cw)
    for t in range(d["HT"]):
        tr = tile_rows(h, t)
        for n0 in range(0, bsz, PSUM_FP32):
            nw = min(PSUM_FP32, bsz - n0)
            n = slice(n0, n0 + nw)
            _mm(g_ps[0:cw, n], wg[0:tr, t, cols], xT[0:tr, t, n], t != 0)
            _mm(u_ps[0:cw, n], wu[0:tr, t, cols], xT[0:tr, t, n], t != 0)
            _mm(ga_ps[0:cw, n], wdT[0:tr, t, cols], doT[0:tr, t, n], t != 0)
    f32 = nl.float32
    sg = nl.ndarray((P, bsz), dtype=f32, buffer=nl.sbuf)
    sd = nl.ndarray((P, bsz), dtype=f32, buffer=nl.sbuf)
    ga = nl.ndarray((P, bsz), dtype=f32, buffer=nl.sbuf)
    tmp = nl.ndarray((P, bsz), dtype=f32, buffer=nl.sbuf)
    r = slice(0, cw)
    nisa.activation(dst=sg[r], op=nl.silu, data=g_ps[r])
    nisa.activation(dst=sd[r], op=nl.silu_dx, data=g_ps[r])
    nisa.tensor_copy(dst=ga[r], src=ga_ps[r])
    # actT = silu(g) * u ; dws += ones^T (actT * ga)  (fp32 sum over the I rows)
    nisa.tensor_tensor(dst=actT[r, it, :], data1=sg[r], data2=u_ps[r], op=nl.multiply)
    nisa.tensor_tensor(dst=tmp[r], data1=sg[r], data2=u_ps[r], op=nl.multiply)
    nisa.tensor_tensor(dst=tmp[r], data1=tmp[r], data2=ga[r], op=nl.multiply)
    for n0 in range(0, bsz, PSUM_FP32):
        nw = min(PSUM_FP32, bsz - n0)
        _mm(dws[:, n0 : n0 + nw], ones[r], tmp[r, n0 : n0 + nw], not first)
    # dg = ga * w * u * silu'(g) ; du = ga * w * silu(g)
    nisa.tensor_tensor(dst=ga[r], data1=ga[r], data2=w_bc[r], op=nl.multiply)
    nisa.tensor_tensor(dst=duT[r, it, :], data1=ga[r], data2=sg[r], op=nl.multiply)
    nisa.tensor_tensor(dst=tmp[r], data1=ga[r], data2=u_ps[r], op=nl.multiply)
    nisa.tensor_tensor(dst=dgT[r, it, :], data1=tmp[r], data2=sd[r], op=nl.multiply)


def _mm(dst: Any, stationary: Any, moving: Any, accumulate: bool) -> None:
    nisa.nc_matmul(dst=dst, stationary=stationary, moving=moving, accumulate=accumulate)


def _wgrad_down(
    d: dict[str, Any], dw_down: Any, exp: Any, act_tok: Any, dy_tok: list[Any], i0: int, icw: int
) -> None:
    """dw_down[e, i0 + r, :] += sum over the block's tokens of act[tok, r] * dy[tok, :]."""
    h, ns = d["H"], d["NS"]
    for it in range(cdiv(icw, P)):
        cw = _cw(icw, it)
        for c0 in range(0, h, RMW_COLS):
            rw = min(RMW_COLS, h - c0)
            acc = nl.ndarray((P, 1, RMW_COLS), dtype=nl.float32, buffer=nl.sbuf)
            weight_rows_dma(dw_down, exp, i0 + it * P, cw, c0, rw, acc, store=False)
            for n0 in range(c0, c0 + rw, PSUM_FP32):
                nw = min(PSUM_FP32, c0 + rw - n0)
                ps = nl.ndarray((P, PSUM_FP32), dtype=nl.float32, buffer=nl.psum)
                for c in range(ns):
                    stat = act_tok[:, c, it * P : it * P + cw]
                    _mm(ps[0:cw, 0:nw], stat, dy_tok[c][:, n0 : n0 + nw], c != 0)
                a = acc[0:cw, 0, n0 - c0 : n0 - c0 + nw]
                nisa.tensor_tensor(dst=a, data1=a, data2=ps[0:cw, 0:nw], op=nl.add)
            weight_rows_dma(dw_down, exp, i0 + it * P, cw, c0, rw, acc, store=True)


def _wgrad_gate_up(
    d: dict[str, Any], dw_gate_up: Any, exp: Any, x_tok: list[Any], dg_tok: Any, col0: int, icw: int
) -> None:
    """dw_gate_up[e, :, col0 : col0 + icw] += x^T dg over the block's tokens (fp32 RMW)."""
    h, ht, ns, ti = d["H"], d["HT"], d["NS"], d["TI"]
    for t0 in range(0, ht, WGRAD_H):
        nt = min(WGRAD_H, ht - t0)
        nrows = min(nt * P, h - t0 * P)
        acc = nl.ndarray((P, WGRAD_H, ti), dtype=nl.float32, buffer=nl.sbuf)
        weight_rows_dma(dw_gate_up, exp, t0 * P, nrows, col0, icw, acc, store=False)
        for j in range(nt):
            t = t0 + j
            tr = tile_rows(h, t)
            for n0 in range(0, icw, PSUM_FP32):
                nw = min(PSUM_FP32, icw - n0)
                ps = nl.ndarray((P, PSUM_FP32), dtype=nl.float32, buffer=nl.psum)
                for c in range(ns):
                    stat = x_tok[c][:, t * P : t * P + tr]
                    _mm(ps[0:tr, 0:nw], stat, dg_tok[:, c, n0 : n0 + nw], c != 0)
                a = acc[0:tr, j, n0 : n0 + nw]
                nisa.tensor_tensor(dst=a, data1=a, data2=ps[0:tr, 0:nw], op=nl.add)
        weight_rows_dma(dw_gate_up, exp, t0 * P, nrows, col0, icw, acc, store=True)


def weight_rows_dma(
    w: Any, exp: Any, row0: int, nrows: int, col0: int, ncols: int, tile: Any, store: bool
) -> None:
    """Move w[exp, row0 + j*128 + p, col0 : col0 + ncols] <-> tile[p, j, :ncols]."""
    width = w.shape[2]
    full = nrows // P
    pieces = []
    if full:
        pat = [[width, P], [P * width, full], [1, ncols]]
        pieces.append((pat, row0 * width + col0, tile[:, 0:full, 0:ncols]))
    rest = nrows - full * P
    if rest:
        pat = [[width, rest], [1, ncols]]
        pieces.append((pat, (row0 + full * P) * width + col0, tile[0:rest, full, 0:ncols]))
    for pat, off, part in pieces:
        view = w.ap(pat, offset=off, scalar_offset=exp, indirect_dim=0)
        if store:
            nisa.dma_copy(dst=view, src=part)
        else:
            nisa.dma_copy(dst=part, src=view)


def _dgrad(
    d: dict[str, Any], dgT: Any, duT: Any, wgT: Any, wuT: Any, icw: int, ic: int, dx: list[Any]
) -> None:
    """dx[c] (+)= dg Wg^T + du Wu^T over this chunk's I tiles (fp32 SBUF across chunks)."""
    h = d["H"]
    nit = cdiv(icw, P)
    for c in range(d["NS"]):
        tok = slice(c * P, (c + 1) * P)
        for n0 in range(0, h, PSUM_FP32):
            nw = min(PSUM_FP32, h - n0)
            ps = nl.ndarray((P, PSUM_FP32), dtype=nl.float32, buffer=nl.psum)
            for it in range(nit):
                cw = _cw(icw, it)
                n = slice(n0, n0 + nw)
                _mm(ps[:, 0:nw], dgT[0:cw, it, tok], wgT[0:cw, it, n], it != 0)
                _mm(ps[:, 0:nw], duT[0:cw, it, tok], wuT[0:cw, it, n], True)
            dst = dx[c][:, n0 : n0 + nw]
            if ic == 0:
                nisa.tensor_copy(dst=dst, src=ps[:, 0:nw], engine=nisa.engine.scalar)
            else:
                nisa.tensor_tensor(dst=dst, data1=dst, data2=ps[:, 0:nw], op=nl.add)


def _combine_grads(
    d: dict[str, Any],
    dhidden: Any,
    d_weights: Any,
    dx_slots: Any,
    dws_slots: Any,
    token_slot: Any,
    may_drop: bool,
) -> None:
    """dhidden[t] = sum_j dx_slots[slot(t, j)]; d_weights[t, j] = dws_slots[slot(t, j)]."""
    h, k, dt = d["H"], d["K"], d["dt"]
    skip = nisa.oob_mode.skip if may_drop else nisa.oob_mode.error
    for t0 in range(0, d["T"], P):
        rows = min(P, d["T"] - t0)
        sl = nl.ndarray((P, k), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sl[0:rows, :], src=token_slot[t0 : t0 + rows, :])
        dwt = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
        if may_drop:
            nisa.memset(dst=dwt[0:rows, :], value=0.0)
        for j in range(k):
            idx = sl[0:rows, j : j + 1]
            view = dws_slots.ap([[1, rows], [1, 1]], offset=0, vector_offset=idx, indirect_dim=0)
            nisa.dma_copy(dst=dwt[0:rows, j : j + 1], src=view, oob_mode=skip)
        nisa.dma_copy(dst=d_weights[t0 : t0 + rows, :], src=dwt[0:rows, :])
        for c0 in range(0, h, COMBINE_COLS):
            cw = min(COMBINE_COLS, h - c0)
            acc = nl.ndarray((P, COMBINE_COLS), dtype=nl.float32, buffer=nl.sbuf)
            res = nl.ndarray((P, COMBINE_COLS), dtype=dt, buffer=nl.sbuf)
            for j in range(k):
                yj = nl.ndarray((P, COMBINE_COLS), dtype=dt, buffer=nl.sbuf)
                if may_drop:
                    nisa.memset(dst=yj[0:rows, 0:cw], value=0.0)
                idx = sl[0:rows, j : j + 1]
                view = dx_slots.ap(
                    [[h, rows], [1, cw]], offset=c0, vector_offset=idx, indirect_dim=0
                )
                nisa.dma_copy(dst=yj[0:rows, 0:cw], src=view, oob_mode=skip)
                dst = res[0:rows, 0:cw] if j == k - 1 else acc[0:rows, 0:cw]
                if j == 0:
                    nisa.tensor_copy(dst=dst, src=yj[0:rows, 0:cw])
                else:
                    nisa.tensor_tensor(
                        dst=dst, data1=acc[0:rows, 0:cw], data2=yj[0:rows, 0:cw], op=nl.add
                    )
            nisa.dma_copy(dst=dhidden[t0 : t0 + rows, c0 : c0 + cw], src=res[0:rows, 0:cw])
