"""Blockwise grouped expert MLP (SwiGLU), backward: dgrad, per-expert wgrad, routing grads.

Same block plan as the forward. With x / do the block's token rows (do unweighted), w the
slots' routing weights, per intermediate chunk (I-major tiles [chunk, tokens]):

    gT, uT   = Wg^T xT, Wu^T xT                  recomputed (gate/up are not saved)
    gaT      = Wd doT                            dL/d(act) before the routing weight
    actT     = silu(gT) * uT
    dws     += sum over I of actT * gaT          dL/d(weight) per slot (ones-vector matmul)
    dg'T     = gaT * uT * silu'(gT),  du'T = gaT * silu(gT)      (w not applied yet)
    dx'     += dg' Wg^T + du' Wu^T               contraction over I (fp32 SBUF over chunks)
    dx       = w * dx'                           per token, at the store

Phase A (`_bwd_block`; per block, in sub-blocks of `sub_block` tokens, chunks of `tile_i`
intermediate columns): each chunk's Wg / Wu columns are loaded once, I on partitions
(`tiles.load_weight_cols`: DMA transposes for 2-byte dtypes), into two strips [I, H]
that serve the dgrad directly; the recompute needs H on partitions and gets each 128-row
H tile by PE transposes of the strips, one tile ahead of its matmuls. Wd streams in units
of `dma_h` H tiles, also column-loaded, `w_bufs` units in flight. gT, uT, gaT accumulate
over H in PSUM (3 * tile_i/128 accumulators of [128, sub_block]). The next chunk's strip
pieces load behind the dgrad, which walks H in order. The chunk's act, dg', du' are
PE-transposed to token-major and stored, with the token rows w * x and w * do, to
slot-ordered HBM scratch.

Phase B (`wgrad.weight_grads`): the per-expert weight gradients as grouped matmuls over
that scratch, contracted over tokens, weight-panel outer and blocks inner, accumulated on
chip in fp32 across all blocks of an expert and never read back (see wgrad.py):

    dW_gate_up[e] = (w x)^T [dg' | du'],   dW_down[e] = act^T (w do)

dx per slot goes to an HBM scratch; the combine (combine.py, on TensorE) sums each
token's k slots (j ascending) into dhidden and gathers d_weights[t, j] = dws[slot(t, j)]
(0 for dropped assignments, which point at the scratch's zero row).

Blocks [0, static_blocks) are a static loop, the rest device loops up to `block_count`
(`tiles.block_loop`); both issue the same instructions (block indices as registers).

Limits: block_size in {128, 256, 512, 1024}, sub_block in {128, 256} (<= block_size);
H, I any size (ragged tiles sliced; the SBUF/PSUM fit is checked by config.validate);
bf16 or fp32 (fp32 column loads are natural loads + PE transposes). Tunables:
config.MoEMLPBwdConfig.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl
from .combine import combine, zero_row
from .tiles import (
    PSUM_FP32,
    P,
    block_ap,
    block_loop,
    block_meta,
    block_row0,
    cdiv,
    device_bounds,
    gather_rows,
    load_weight_cols,
    matmul,
    psum_accumulators,
    slot_tiles,
    tile_rows,
    transpose_into,
)
from .wgrad import weight_grads


@nki.jit
def moe_mlp_bwd(
    hidden,
    w_gate_up,
    w_down,
    dout,
    slot_token,
    slot_weight,
    block_expert,
    block_keep,
    block_count,
    token_slot,
    dw_gate_up,
    dw_down,
    static_blocks,
    may_drop,
    block_size,
    sub_block,
    tile_i,
    dma_h,
    w_bufs,
    wgrad_tiles,
    wgrad_cols,
):
    """(dhidden [T, H], d_weights [T, k] fp32); writes dw_gate_up / dw_down in place.

    Shapes as in `moe_mlp_fwd`, plus dout [T, H], slot_weight [NB, 128, B/128] fp32,
    and block_keep [NB, 1]
    fp32 (0 for the first block of each expert, else 1). dw_gate_up [E, H, 2I] and
    dw_down [E, I, H] (fp32 or the weights' dtype) get every expert that has a block;
    the others are left as passed (the caller passes zeros).
    """
    t_count, h = hidden.shape
    nb, parts, ns = slot_token.shape
    i = w_gate_up.shape[2] // 2
    assert parts == P and block_size == P * ns, "moe_mlp_bwd: block_size does not match"
    assert sub_block in (128, 256) and block_size % sub_block == 0, "moe_mlp_bwd: sub_block"
    assert dw_gate_up.shape == w_gate_up.shape and dw_down.shape == w_down.shape
    dt = hidden.dtype
    d = {
        "T": t_count,
        "H": h,
        "I": i,
        "NB": nb,
        "NS": ns,
        "B": block_size,
        "SB": sub_block,
        "HT": cdiv(h, P),
        "K": token_slot.shape[1],
        "dt": dt,
        "TI": tile_i,
        "DH": dma_h,
        "WB": w_bufs,
    }
    dhidden = nl.ndarray((t_count, h), dtype=dt, buffer=nl.shared_hbm)
    d_weights = nl.ndarray((t_count, d["K"]), dtype=nl.float32, buffer=nl.shared_hbm)
    # + one row for dropped assignments (combine.zero_row)
    dx_slots = nl.ndarray((nb * block_size + 1, h), dtype=dt, buffer=nl.hbm)
    dws_slots = nl.ndarray((nb * block_size + 1, 1), dtype=nl.float32, buffer=nl.hbm)
    # token-major rows for the wgrad, one spare block for its prefetch past the last block
    scratch = {
        "x": nl.ndarray((nb + 1, block_size, h), dtype=dt, buffer=nl.hbm),
        "dy": nl.ndarray((nb + 1, block_size, h), dtype=dt, buffer=nl.hbm),
        "act": nl.ndarray((nb + 1, block_size, i), dtype=dt, buffer=nl.hbm),
        "gu": nl.ndarray((nb + 1, block_size, 2 * i), dtype=dt, buffer=nl.hbm),
        "dx": dx_slots,
        "dws": dws_slots,
    }
    ws = (hidden, w_gate_up, w_down, dout, slot_token, slot_weight, block_expert, scratch)

    bounds = device_bounds(block_count, static_blocks) if static_blocks < nb else None
    block_loop(lambda addr, parity, first: _bwd_block(d, ws, addr), static_blocks, nb, bounds)
    grads = (
        (dw_gate_up, scratch["x"], scratch["gu"]),
        (dw_down, scratch["act"], scratch["dy"]),
    )
    panel = (wgrad_tiles, wgrad_cols)
    weight_grads(d, grads, block_expert, block_keep, panel, (static_blocks, nb, bounds))
    _combine_grads(d, dhidden, d_weights, dx_slots, dws_slots, token_slot, may_drop)
    return dhidden, d_weights


# ---- phase A: one block ------------------------------------------------------------------
def _bwd_block(d: dict[str, Any], ws: tuple[Any, ...], addr: Any) -> None:
    w_down, slot_token, slot_weight, block_expert = ws[2], ws[4], ws[5], ws[6]
    ns, bsz = d["NS"], d["B"]
    tok, exp = block_meta(ns, slot_token, block_expert, addr)
    wsl = nl.ndarray((P, ns), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=wsl, src=block_ap(slot_weight, addr, [[ns, P], [1, ns]]))
    row0 = block_row0(addr, bsz)
    ones = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    fetch = _weight_stream(d, w_down, exp)
    blk = {"addr": addr, "row0": row0, "exp": exp, "tok": tok, "wsl": wsl}
    blk["ones"] = ones
    for s in range(bsz // d["SB"]):
        _sub_block(d, ws, blk, fetch, s)


def _wd_units(d: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(chunk, first H tile, H tiles) of every Wd unit of one sub-block, in order."""
    units = []
    for ic in range(cdiv(d["I"], d["TI"])):
        for h0 in range(0, d["HT"], d["DH"]):
            units.append((ic, h0, min(d["DH"], d["HT"] - h0)))
    return units


def _weight_stream(d: dict[str, Any], w_down: Any, exp: Any) -> Any:
    """A `fetch()` returning the next Wd unit with H on partitions, `w_bufs - 1` ahead.

    The units of all sub-blocks of the block form one stream, so the first units of a
    chunk or sub-block load while the previous one finishes. A unit dies when its
    consumer drops it: at most `w_bufs` are live (buffers rotate through the allocator).
    """
    units = _wd_units(d) * (d["B"] // d["SB"])
    depth = max(1, d["WB"] - 1)
    loaded: dict[str, Any] = {}
    state = {"next": 0}

    def issue(u: int) -> None:
        if u >= len(units):
            return
        ic, h0, nh = units[u]
        i0 = ic * d["TI"]
        icw = min(d["TI"], d["I"] - i0)
        nrows = min(nh * P, d["H"] - h0 * P)
        wdT = nl.ndarray((P, nh, d["TI"]), dtype=d["dt"], buffer=nl.sbuf)
        load_weight_cols(w_down, exp, i0, icw, h0 * P, nrows, wdT)
        loaded[str(u)] = wdT

    for u in range(depth):
        issue(u)

    def fetch() -> Any:
        u = state["next"]
        state["next"] = u + 1
        issue(u + depth)
        return loaded.pop(str(u))

    return fetch


def _sub_block(
    d: dict[str, Any], ws: tuple[Any, ...], blk: dict[str, Any], fetch: Any, s: int
) -> None:
    """Sub-block s (tokens s*SB .. s*SB + SB of the block): all chunks, dx and dws."""
    hidden, w_gate_up, dout = ws[0], ws[1], ws[3]
    scr = ws[7]
    h, sb, ti, dt = d["H"], d["SB"], d["TI"], d["dt"]
    nsa, nti = sb // P, cdiv(ti, P)
    xT, doT = _load_rows(d, hidden, dout, scr, blk, s)
    dx = [nl.ndarray((P, h), dtype=nl.float32, buffer=nl.sbuf) for _ in range(nsa)]
    dws = nl.ndarray((1, sb), dtype=nl.float32, buffer=nl.sbuf)
    # [I rows, H, I tile]: one H piece of the strip is one contiguous range per partition
    strips = [nl.ndarray((P, h, nti), dtype=dt, buffer=nl.sbuf) for _ in range(2)]
    _load_strips(d, w_gate_up, blk["exp"], 0, strips)
    nic = cdiv(d["I"], ti)
    for ic in range(nic):
        i0 = ic * ti
        icw = min(ti, d["I"] - i0)
        nit = cdiv(icw, P)
        acc = psum_accumulators(3 * nit, sb)
        _gate_up_ga(d, fetch, xT, doT, icw, acc, strips)
        acts = [nl.ndarray((P, nti, sb), dtype=dt, buffer=nl.sbuf) for _ in range(3)]
        prod = nl.ndarray((P, nti, sb), dtype=nl.float32, buffer=nl.sbuf)
        for it in range(nit):
            _pointwise(d, acc[3 * it : 3 * it + 3], prod, it, icw, acts)
        del acc
        _dws(d, blk["ones"], prod, icw, ic == 0, dws)
        del prod
        _dgrad(d, acts[1], acts[2], strips, icw, ic, dx)
        # indirect DMAs get their descriptors in program order (software DGE): the
        # strip loads, ready as the dgrad passes, go before the stores that wait for it
        if ic + 1 < nic:
            _load_strips(d, w_gate_up, blk["exp"], ic + 1, strips)
        _store_acts(d, scr, blk["addr"], acts, s, i0, icw)
        del acts
    _store_dx(d, scr, blk, dx, dws, s)


def _load_rows(
    d: dict[str, Any], hidden: Any, dout: Any, scr: dict[str, Any], blk: dict[str, Any], s: int
) -> tuple[Any, Any]:
    """Gather x and do for the sub-block, store x and w * do to scratch, return xT, doT."""
    h, dt, sb = d["H"], d["dt"], d["SB"]
    nsa = sb // P
    xT = nl.ndarray((P, d["HT"], sb), dtype=dt, buffer=nl.sbuf)
    doT = nl.ndarray((P, d["HT"], sb), dtype=dt, buffer=nl.sbuf)
    x_tok, do_tok = [], []
    for c in range(nsa):
        col = s * nsa + c
        xr = nl.ndarray((P, h), dtype=dt, buffer=nl.sbuf)
        gather_rows(hidden, blk["tok"][:, col : col + 1], xr, h)
        dr = nl.ndarray((P, h), dtype=dt, buffer=nl.sbuf)
        gather_rows(dout, blk["tok"][:, col : col + 1], dr, h)
        w_col = blk["wsl"][:, col : col + 1]
        r0 = col * P
        for src, name in ((xr, "x"), (dr, "dy")):
            wrow = nl.ndarray((P, h), dtype=dt, buffer=nl.sbuf)
            nisa.activation(dst=wrow, op=nl.copy, data=src, scale=w_col)
            nisa.dma_copy(dst=slot_tiles(scr[name], blk["addr"], r0, 1, 0, h), src=wrow)
        x_tok.append(xr)
        do_tok.append(dr)
    parity = 0
    for t in range(d["HT"]):
        cols = slice(t * P, t * P + tile_rows(h, t))
        parity = transpose_into(dt, [r[:, cols] for r in x_tok], xT[:, t, :], parity)
        parity = transpose_into(dt, [r[:, cols] for r in do_tok], doT[:, t, :], parity)
    return xT, doT


def _load_strips(d: dict[str, Any], w_gate_up: Any, exp: Any, ic: int, strips: list[Any]) -> None:
    """strips[c, h, it] = chunk ic of Wg and Wu with I on partitions (I = it*128 + c).

    Loaded in pieces of `dma_h` H tiles into the same buffers the previous chunk used:
    a piece waits only for the dgrad matmuls that read its columns, which run in H order.
    """
    ti, h = d["TI"], d["H"]
    i0 = ic * ti
    icw = min(ti, d["I"] - i0)
    for h0 in range(0, d["HT"], d["DH"]):
        r0, nrows = h0 * P, min(d["DH"] * P, h - h0 * P)
        for strip, c0 in zip(strips, (i0, d["I"] + i0)):
            piece = strip[:, r0 : r0 + nrows, :].permute((0, 2, 1))
            load_weight_cols(w_gate_up, exp, r0, nrows, c0, icw, piece)


def _gate_up_ga(
    d: dict[str, Any], fetch: Any, xT: Any, doT: Any, icw: int, acc: list[Any], strips: Any
) -> None:
    """acc[3it + (0, 1, 2)] = (gT, uT, gaT) of the chunk's I tile it, contracted over H.

    Wg / Wu H tiles (H on partitions) are PE transposes of the I-major strips, made one
    tile ahead so their evacuating copies overlap the previous tile's matmuls.
    """
    h, ht, nit = d["H"], d["HT"], cdiv(icw, P)
    nxt = _h_major(d, strips, 0, icw, 0)
    wdT: Any = None
    j = 0
    for t in range(ht):
        cur = nxt
        if t + 1 < ht:
            nxt = _h_major(d, strips, t + 1, icw, t + 1)
        if t % d["DH"] == 0:
            wdT, j = fetch(), 0
        tr = tile_rows(h, t)
        wg, wu = cur
        for it in range(nit):
            cw = min(P, icw - it * P)
            cols = slice(it * P, it * P + cw)
            matmul(acc[3 * it][0:cw, :], wg[0:tr, cols], xT[0:tr, t, :], t != 0)
            matmul(acc[3 * it + 1][0:cw, :], wu[0:tr, cols], xT[0:tr, t, :], t != 0)
            matmul(acc[3 * it + 2][0:cw, :], wdT[0:tr, j, cols], doT[0:tr, t, :], t != 0)
        j += 1
        del cur, wg, wu


def _h_major(d: dict[str, Any], strips: list[Any], t: int, icw: int, parity: int) -> list[Any]:
    """H tile t of the chunk's Wg and Wu, [H rows, icw] each: PE transposes of the strips
    (one PSUM group per weight; VectorE and ScalarE take turns evacuating)."""
    tr, nit = tile_rows(d["H"], t), cdiv(icw, P)
    out = []
    for k, strip in enumerate(strips):
        tp = nl.ndarray((P, d["TI"]), dtype=d["dt"], buffer=nl.psum)
        for it in range(nit):
            cw = min(P, icw - it * P)
            src = strip[0:cw, t * P : t * P + tr, it]
            nisa.nc_transpose(dst=tp[0:tr, it * P : it * P + cw], data=src)
        w = nl.ndarray((P, d["TI"]), dtype=d["dt"], buffer=nl.sbuf)
        eng = nisa.engine.vector if (parity + k) % 2 == 0 else nisa.engine.scalar
        nisa.tensor_copy(dst=w[0:tr, 0:icw], src=tp[0:tr, 0:icw], engine=eng)
        out.append(w)
    return out


def _pointwise(
    d: dict[str, Any], acc: list[Any], prod: Any, it: int, icw: int, acts: list[Any]
) -> None:
    """SwiGLU derivatives of one 128-row I tile from its PSUM (g, u, ga) accumulators.

    act = silu(g) u; dg' = ga u silu'(g); du' = ga silu(g) (the routing weight is applied
    to the token rows instead: w * x in the wgrad scratch, w * dx at the store).
    ScalarE evaluates silu / silu' and rounds act; every VectorE op reads PSUM.
    """
    g_ps, u_ps, ga_ps = acc
    act_t, dg_t, du_t = acts
    sb, f32 = d["SB"], nl.float32
    r = slice(0, min(P, icw - it * P))
    sg = nl.ndarray((P, sb), dtype=f32, buffer=nl.sbuf)
    sd = nl.ndarray((P, sb), dtype=f32, buffer=nl.sbuf)
    au = nl.ndarray((P, sb), dtype=f32, buffer=nl.sbuf)
    nisa.activation(dst=sg[r], op=nl.silu, data=g_ps[r])
    nisa.activation(dst=sd[r], op=nl.silu_dx, data=g_ps[r])
    nisa.tensor_tensor(dst=au[r], data1=sg[r], data2=u_ps[r], op=nl.multiply)
    nisa.tensor_copy(dst=act_t[r, it, :], src=au[r], engine=nisa.engine.scalar)
    nisa.tensor_tensor(dst=prod[r, it, :], data1=au[r], data2=ga_ps[r], op=nl.multiply)
    nisa.tensor_tensor(dst=du_t[r, it, :], data1=sg[r], data2=ga_ps[r], op=nl.multiply)
    nisa.tensor_tensor(dst=sd[r], data1=sd[r], data2=u_ps[r], op=nl.multiply)
    nisa.tensor_tensor(dst=dg_t[r, it, :], data1=sd[r], data2=ga_ps[r], op=nl.multiply)


def _dws(d: dict[str, Any], ones: Any, prod: Any, icw: int, first: bool, dws: Any) -> None:
    """dws (+)= sum over the chunk's I rows of act * ga (ones-vector matmuls, fp32)."""
    ps = nl.ndarray((1, d["SB"]), dtype=nl.float32, buffer=nl.psum)
    nit = cdiv(icw, P)
    for it in range(nit):
        cw = min(P, icw - it * P)
        matmul(ps, ones[0:cw, :], prod[0:cw, it, :], it != 0)
    if first:
        nisa.tensor_copy(dst=dws, src=ps)
    else:
        nisa.tensor_tensor(dst=dws, data1=dws, data2=ps, op=nl.add)


def _dgrad(
    d: dict[str, Any], dgT: Any, duT: Any, strips: Any, icw: int, ic: int, dx: list[Any]
) -> None:
    """dx[c] (+)= dg Wg^T + du Wu^T over this chunk's I tiles (fp32 SBUF across chunks).

    H columns outer: the strips are read in H order, so the next chunk's pieces can
    replace them behind the dgrad.
    """
    wgT, wuT = strips
    h, nit = d["H"], cdiv(icw, P)
    for n0 in range(0, h, PSUM_FP32):
        nw = min(PSUM_FP32, h - n0)
        n = slice(n0, n0 + nw)
        for c in range(d["SB"] // P):
            tok = slice(c * P, (c + 1) * P)
            ps = nl.ndarray((P, PSUM_FP32), dtype=nl.float32, buffer=nl.psum)
            for it in range(nit):
                cw = min(P, icw - it * P)
                matmul(ps[:, 0:nw], dgT[0:cw, it, tok], wgT[0:cw, n, it], it != 0)
                matmul(ps[:, 0:nw], duT[0:cw, it, tok], wuT[0:cw, n, it], True)
            dst = dx[c][:, n]
            if ic == 0:
                nisa.tensor_copy(dst=dst, src=ps[:, 0:nw], engine=nisa.engine.scalar)
            else:
                nisa.tensor_tensor(dst=dst, data1=dst, data2=ps[:, 0:nw], op=nl.add)


def _store_acts(
    d: dict[str, Any], scr: dict[str, Any], addr: Any, acts: list[Any], s: int, i0: int, icw: int
) -> None:
    """Token-major act, dg, du of the chunk -> scratch act[:, i0:], gu[:, i0:], gu[:, I+i0:]."""
    sb, ti, dt = d["SB"], d["TI"], d["dt"]
    nsa, nit = sb // P, cdiv(icw, P)
    dests = ((scr["act"], i0), (scr["gu"], i0), (scr["gu"], d["I"] + i0))
    parity = 1
    tms = [nl.ndarray((P, nsa, ti), dtype=dt, buffer=nl.sbuf) for _ in acts]
    for src, tm, (dst, c0) in zip(acts, tms, dests):
        for c in range(nsa):
            srcs = [src[0 : min(P, icw - it * P), it, c * P : (c + 1) * P] for it in range(nit)]
            parity = transpose_into(dt, srcs, tm[:, c, 0:icw], parity)
        view = slot_tiles(dst, addr, s * sb, nsa, c0, icw)
        nisa.dma_copy(dst=view, src=tm[:, :, 0:icw])


def _store_dx(
    d: dict[str, Any], scr: dict[str, Any], blk: dict[str, Any], dx: list[Any], dws: Any, s: int
) -> None:
    h, sb = d["H"], d["SB"]
    r0 = blk["addr"][1] * d["B"] + s * sb  # rows past (register) * B
    view = scr["dws"].ap([[1, 1], [1, sb]], offset=r0, scalar_offset=blk["row0"])
    nisa.dma_copy(dst=view, src=dws)
    nsa = sb // P
    for c in range(nsa):
        out = nl.ndarray((P, h), dtype=d["dt"], buffer=nl.sbuf)
        w_col = blk["wsl"][:, s * nsa + c : s * nsa + c + 1]
        nisa.activation(dst=out, op=nl.copy, data=dx[c], scale=w_col)
        off = (r0 + c * P) * h
        view = scr["dx"].ap([[h, P], [1, h]], offset=off, scalar_offset=blk["row0"])
        nisa.dma_copy(dst=view, src=out)


# ---- combine ------------------------------------------------------------------------------
def _combine_grads(
    d: dict[str, Any],
    dhidden: Any,
    d_weights: Any,
    dx_slots: Any,
    dws_slots: Any,
    token_slot: Any,
    may_drop: bool,
) -> None:
    """d_weights[t, j] = dws_slots[slot(t, j)] (0 when dropped); dhidden[t] = sum_j
    dx_slots[slot(t, j)] (`combine.combine`, identity stationaries)."""
    k = d["K"]
    if may_drop:
        zero_row(dx_slots)
        zero_row(dws_slots)
    for t0 in range(0, d["T"], P):
        rows = min(P, d["T"] - t0)
        sl = nl.ndarray((P, k), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sl[0:rows, :], src=token_slot[t0 : t0 + rows, :])
        dwt = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
        for j in range(k):
            idx = sl[0:rows, j : j + 1]
            view = dws_slots.ap([[1, rows], [1, 1]], offset=0, vector_offset=idx, indirect_dim=0)
            nisa.dma_copy(dst=dwt[0:rows, j : j + 1], src=view)
        nisa.dma_copy(dst=d_weights[t0 : t0 + rows, :], src=dwt[0:rows, :])
    combine(dhidden, dx_slots, token_slot, None)
