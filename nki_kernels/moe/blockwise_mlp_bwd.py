"""Blockwise grouped expert MLP (SwiGLU), backward: dgrad, per-expert wgrad, routing grads.

Its own block plan (fixed B-slot blocks). With x / do the block's token rows (do
unweighted), w the slots' routing weights, per intermediate chunk (I-major tiles
[chunk, tokens]):

    gT, uT   = the forward's, loaded from `gate_up` (moe_mlp_fwd saved them, I-major, at
               this plan's slots); without it recomputed as Wg^T xT, Wu^T xT
    gaT      = Wd doT                            dL/d(act) before the routing weight
    actT     = silu(gT) * uT
    dws     += sum over I of actT * gaT          dL/d(weight) per slot (ones-vector matmul)
    dg'T     = gaT * uT * silu'(gT),  du'T = gaT * silu(gT)      (w not applied yet)
    dx'     += dg' Wg^T + du' Wu^T               contraction over I (fp32 SBUF over chunks)
    dx       = w * dx'                           per token, at the store

Phase A (`_bwd_block`; per block, in units of `sub_block` tokens, chunks of `tile_i`
intermediate columns). Each chunk's Wg / Wu columns are loaded once with I on partitions
(DMA transposes for 2-byte dtypes) into strips [I, H] that serve the dgrad directly.
With the forward's gate / up (`gate_up`, the training path of `moe_mlp`), the chunk's gT
/ uT of the unit are loaded with its strips (one DMA each: [tile_i rows, sub_block]
columns, runs of sub_block elements) and TensorE's per-chunk work is gaT and the dgrad:
no gate / up matmuls, no xT, no weight transposes. Without it (`moe_experts`) gT / uT
are recomputed: that needs H on partitions, from PE transposes of the strips, one tile
ahead of its matmuls. Wd streams in units of `dma_h` H tiles, `w_bufs - 1` ahead
(weights_bwd.py). gaT (and, recomputing, gT / uT) accumulate over H in PSUM (tile_i/128,
recomputing 3 * tile_i/128, accumulators of [128, sub_block]). The chunk loop is
software-pipelined by one chunk: TensorE issues chunk c's gaT (and recompute), then chunk
c-1's dgrad and act / dg / du transposes, so ScalarE / VectorE evaluate chunk c's SwiGLU
derivatives meanwhile; `strip_bufs` strip sets rotate (3: chunk c+1's strips load during
chunk c's matmuls). Transposes go through
rings of PSUM banks (rows_bwd.ring_transpose) so a group waits for the evacuation of an
older group, not the previous one; act / dg / du are stored to slot-ordered HBM scratch
in runs of >= 2 KiB (several chunks per DMA), and the token rows as w * x and w * do.
With `prefetch_rows` (rows_bwd.py) the next unit's rows are gathered and transposed, the
next block's metadata loaded, and the next unit's first strips / Wd units loaded, while
the current unit computes, so a unit does not start by waiting on DMAs.

Phase B (`wgrad.weight_grads`): the per-expert weight gradients as grouped matmuls over
that scratch, contracted over tokens, weight-panel outer and blocks inner, accumulated on
chip in fp32 across all blocks of an expert and never read back (see wgrad.py):

    dW_gate_up[e] = (w x)^T [dg' | du'],   dW_down[e] = act^T (w do)

dx per slot goes to an HBM scratch; the combine (combine.py, on TensorE) sums each
token's k slots (j ascending) into dhidden and gathers d_weights[t, j] = dws[slot(t, j)]
(0 for dropped assignments, which point at the scratch's zero row).

LNC 2 (`kernel[2]`): phase A splits the blocks, phase B the hidden columns. Program p
runs phase A for blocks p, p + 2, ... (`block_split`), all columns, writing the scratch
(shared HBM); after a `core_barrier` per scratch tensor it computes its hidden columns
(`tiles.program_columns`: halves in whole 512-column PSUM banks) of dW_gate_up's H rows
and dW_down's H columns over every block (a program with no columns, H <= 512, skips
phase B), then combines every other token tile of dhidden and d_weights. Every output
element is computed by one program with the LNC 1 arithmetic, so the results are
bit-identical.

Blocks [0, static_blocks) are a static loop, the rest device loops up to `block_count`
(`block_split`, `tiles.block_loop`); both issue the same instructions (block indices as
registers).

Limits: block_size in {128, 256, 512, 1024}, sub_block in {128, 256, 512} (<= block_size);
H, I any size (ragged tiles sliced; the SBUF/PSUM fit is checked by config.validate);
bf16 or fp32 (fp32 column loads are natural loads + PE transposes). Tunables:
config.MoEMLPBwdConfig.
"""

from __future__ import annotations

from typing import Any

from ..dtypes import dtype_bytes
from ..nki import nisa, nki, nl
from .block_split import program_blocks, split_block_loop, split_bounds
from .combine import combine, zero_row
from .config import STORE_RUN_BYTES
from .param_layout import gate_up_width
from .rows_bwd import (
    ACT_RING,
    block_start,
    gather_unit,
    load_meta,
    prefetch_next,
    psum_ring,
    ring_transpose,
    row_sets,
    store_scaled_rows,
    transpose_next,
    transposed_rows,
)
from .tiles import (
    PSUM_FP32,
    P,
    block_row0,
    cdiv,
    device_bounds,
    matmul,
    program_columns,
    psum_accumulators,
    row_index_ok,
    row_ramp,
    slot_tiles,
    tile_rows,
)
from .weights_bwd import (
    load_strips,
    load_wd_head,
    new_strips,
    wd_head,
    weight_layout,
    weight_stream,
)
from .wgrad import grad_panels, weight_grads


def moe_mlp_bwd_body(
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
    gate_up,
    static_blocks,
    may_drop,
    block_size,
    sub_block,
    tile_i,
    dma_h,
    w_bufs,
    wgrad_tiles,
    wgrad_cols,
    strip_bufs,
    prefetch_rows,
    w_up=None,
    dw_up=None,
    transposed=(False, False),
):
    """(dhidden [T, H], d_weights [T, k] fp32); writes dw_gate_up / dw_down in place.

    Shapes as in `moe_mlp_fwd`, plus dout [T, H], slot_weight [NB, 128, B/128] fp32,
    and block_keep [NB, 1]
    fp32 (0 for the first block of each expert, else 1). dw_gate_up [E, H, 2I] and
    dw_down [E, I, H] (fp32 or the weights' dtype) get every expert that has a block;
    the others are left as passed (the caller passes zeros). gate_up [2I, (NB + 2) * B]
    (or None: recomputed): the forward's pre-activation gate (rows :I) and up per slot of
    this plan (`moe_mlp_fwd`'s save; padding slots zero).
    Parameter layouts as in `moe_mlp_fwd` (`transposed`, `w_up`; param_layout.py); each
    gradient is written in its weight's layout (`dw_up`: the up weight's).
    """
    t_count, h = hidden.shape
    nb, parts, ns = slot_token.shape
    i = gate_up_width(w_gate_up, w_up, transposed[0])[1]
    assert parts == P and block_size == P * ns, "moe_mlp_bwd: block_size does not match"
    assert sub_block in (128, 256, 512) and block_size % sub_block == 0, "moe_mlp_bwd: sub_block"
    assert dw_gate_up.shape == w_gate_up.shape and dw_down.shape == w_down.shape
    assert (w_up is None) == (dw_up is None), "moe_mlp_bwd: w_up and dw_up together"
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
        "STB": strip_bufs,
        "PF": prefetch_rows,
        "GU": gate_up,
    }
    weight_layout(d, (w_gate_up, w_up), transposed)
    if gate_up is not None:
        want = (2 * i, (nb + 2) * block_size)
        assert tuple(gate_up.shape) == want, f"moe_mlp_bwd: gate_up is {want}"
    pid, nprog = program_blocks()
    d["PID"], d["STEP"] = pid, nprog
    d["C0"], d["C1"] = 0, h  # phase A: every column of its blocks' dx
    d["ramp"] = None  # the column loads' row indexes (tiles.load_weight_cols)
    if row_index_ok(w_gate_up) and row_index_ok(w_down) and not all(transposed):
        d["ramp"] = row_ramp(max(cdiv(min(tile_i, i), P), cdiv(min(dma_h * P, h), P)))
    dhidden = nl.ndarray((t_count, h), dtype=dt, buffer=nl.shared_hbm)
    d_weights = nl.ndarray((t_count, d["K"]), dtype=nl.float32, buffer=nl.shared_hbm)
    # + one row for dropped assignments (combine.zero_row)
    dx_slots = nl.ndarray((nb * block_size + 1, h), dtype=dt, buffer=nl.shared_hbm)
    dws_slots = nl.ndarray((nb * block_size + 1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    # token-major rows for the wgrad, one spare block for its prefetch past the last block;
    # shared: each program writes its blocks' rows, phase B reads every block's
    scratch = {
        "x": nl.ndarray((nb + 1, block_size, h), dtype=dt, buffer=nl.shared_hbm),
        "dy": nl.ndarray((nb + 1, block_size, h), dtype=dt, buffer=nl.shared_hbm),
        "act": nl.ndarray((nb + 1, block_size, i), dtype=dt, buffer=nl.shared_hbm),
        "gu": nl.ndarray((nb + 1, block_size, 2 * i), dtype=dt, buffer=nl.shared_hbm),
        "dx": dx_slots,
        "dws": dws_slots,
    }
    ws = (hidden, w_gate_up, w_down, dout, slot_token, slot_weight, block_expert, scratch)

    if pid < nb:  # else (a one-block plan at LNC 2) this program has no phase-A block
        _phase_a(d, ws, (static_blocks, nb, block_count))
    d["ramp"] = None  # phase A's row-index ramp dies here
    if may_drop and pid == 0 and nprog > 1:  # before the barrier (LNC 1: at the combine)
        zero_row(dx_slots)
        zero_row(dws_slots)
    if nprog > 1:  # every program's scratch rows are in HBM before phase B reads them
        for t in scratch.values():
            nisa.core_barrier(data=t, cores=tuple(range(nprog)))
    cols = program_columns(h)
    if cols[0] < cols[1]:
        bounds = device_bounds(block_count, static_blocks) if static_blocks < nb else None
        grads = grad_panels(d, (dw_gate_up, dw_up, dw_down), scratch, cols)
        panel = (wgrad_tiles, wgrad_cols)
        weight_grads(d, grads, block_expert, block_keep, panel, (static_blocks, nb, bounds))
    if may_drop and nprog == 1:
        zero_row(dx_slots)
        zero_row(dws_slots)
    _combine_grads(d, dhidden, d_weights, dx_slots, dws_slots, token_slot)
    return dhidden, d_weights


def _phase_a(d: dict[str, Any], ws: tuple[Any, ...], blocks: tuple[int, int, Any]) -> None:
    """Phase A over this program's blocks (`block_split`)."""
    static_blocks, nb, block_count = blocks
    pid, step = d["PID"], d["STEP"]
    w_gate_up, w_down = ws[1], ws[2]
    bounds = None
    if static_blocks < nb:
        bounds = split_bounds(block_count, static_blocks, pid, step)
    # phase-A row and metadata sets; they die before phase B (state.clear())
    state = {"sets": row_sets(d)}
    if d["PF"]:  # the first block's metadata, first chunk's weights and rows; see rows_bwd
        sets = state["sets"]
        sets["head_strips"], sets["wd_head"] = new_strips(d), wd_head(d)
        meta0 = sets["meta"][0]
        load_meta(d, ws, meta0, (nisa.register_alloc(pid), 0))
        load_strips(d, w_gate_up, meta0, 0, sets["head_strips"], 0)
        load_wd_head(d, w_down, meta0, sets["wd_head"])
        gather_unit(d, ws, meta0, sets["rows"], 0)
        transpose_next(d, sets)
        del sets, meta0

    def body(addr: Any, parity: int, first: bool) -> None:
        _bwd_block(d, ws, state["sets"], addr, parity)

    split_block_loop(body, static_blocks, nb, bounds, pid, step)
    state.clear()


# ---- phase A: one block ------------------------------------------------------------------
def _bwd_block(
    d: dict[str, Any], ws: tuple[Any, ...], sets: dict[str, Any], addr: Any, parity: int
) -> None:
    w_down = ws[2]
    meta = block_start(d, ws, sets, addr, parity)
    row0 = block_row0(addr, d["B"])
    ones = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    fetch = weight_stream(d, w_down, meta, sets.get("wd_head"))
    blk = {"addr": addr, "row0": row0, "exp": meta["exp"], "meta": meta, "parity": parity}
    blk["ones"] = ones
    for s in range(d["B"] // d["SB"]):
        _sub_block(d, ws, sets, blk, fetch, s)


def _sub_block(
    d: dict[str, Any],
    ws: tuple[Any, ...],
    sets: dict[str, Any],
    blk: dict[str, Any],
    fetch: Any,
    s: int,
) -> None:
    """Sub-block s (tokens s*SB .. s*SB + SB of the block): all chunks, dx and dws.

    Software-pipelined by one chunk: TensorE runs chunk c's recompute, then chunk c-1's
    dgrad and transposes, while ScalarE / VectorE evaluate chunk c's SwiGLU derivatives
    from its PSUM accumulators (which chunk c+1's recompute overwrites only after that).
    Strip sets (`strip_bufs`) rotate: with three, chunk c+1's strips load while chunk c
    recomputes and chunk c-1's dgrad reads its own; with two, they load behind chunk
    c-1's dgrad (piece by piece, in its H order).
    """
    w_gate_up, scr = ws[1], ws[7]
    h, sb, ti, dt, nsets = d["H"], d["SB"], d["TI"], d["dt"], d["STB"]
    nsa, nti = sb // P, cdiv(ti, P)
    xT, doT, rows = transposed_rows(d, ws, blk, sets, s)
    if not d["PF"]:  # the rows die before the strips exist (else after their scaled copies)
        store_scaled_rows(d, ws, blk, rows, s)
        del rows
    dx = [nl.ndarray((P, h), dtype=nl.float32, buffer=nl.sbuf) for _ in range(nsa)]
    dws = nl.ndarray((1, sb), dtype=nl.float32, buffer=nl.sbuf)
    local = [new_strips(d) for _ in range(nsets)]
    nic = cdiv(d["I"], ti)

    def strip_set(ic: int) -> list[Any]:  # with prefetching chunk 0 uses the head set
        if d["PF"]:
            return sets["head_strips"] if ic == 0 else local[(ic - 1) % nsets]
        return local[ic % nsets]

    def load_next(ic: int) -> None:
        if ic + 1 < nic:
            load_strips(d, w_gate_up, blk["meta"], ic + 1, strip_set(ic + 1), s)

    if not d["PF"]:
        load_strips(d, w_gate_up, blk["meta"], 0, strip_set(0), s)
    prev: tuple[Any, ...] | None = None
    grp: dict[str, Any] = {}  # the act / dg / du store group being filled
    for ic in range(nic):
        i0 = ic * ti
        icw = min(ti, d["I"] - i0)
        nit = cdiv(icw, P)
        strips = strip_set(ic)
        if nsets > 2:
            load_next(ic)
        per = 1 if d["GU"] is not None else 3  # accumulators per I tile
        acc = psum_accumulators(per * nit, sb)
        _gate_up_ga(d, fetch, xT, doT, icw, acc, strips)
        acts = [nl.ndarray((P, nti, sb), dtype=dt, buffer=nl.sbuf) for _ in range(3)]
        prod = nl.ndarray((P, nti, sb), dtype=nl.float32, buffer=nl.sbuf)
        for it in range(nit):
            if d["GU"] is not None:  # g, u: the forward's, [I rows, tokens] in SBUF
                gu = [strips[2][:, it, :], strips[3][:, it, :], acc[it]]
            else:
                gu = acc[3 * it : 3 * it + 3]
            _pointwise(d, gu, prod, it, icw, acts)
        del acc, gu
        if d["PF"] and ic == nic // 2:  # scaled rows feed phase B only; then gather next
            store_scaled_rows(d, ws, blk, rows, s)
            del rows
            prefetch_next(d, ws, blk, sets, s)
        if ic == nic - 1:  # the last reader of xT / doT is queued
            transpose_next(d, sets)
        if prev is not None:
            _dgrad(d, prev[0][1], prev[0][2], prev[1], prev[4], prev[2], dx)
        # indirect DMAs get their descriptors in program order (software DGE): the strip
        # loads go before the stores that wait for the transposes
        if nsets == 2:
            load_next(ic)
        if prev is not None:
            _store_acts(d, scr, blk["addr"], prev, s, grp)
        _dws(d, blk["ones"], prod, icw, ic == 0, dws)
        del prod
        prev = (acts, strips, ic, i0, icw)
        del acts, strips
    assert prev is not None
    _dgrad(d, prev[0][1], prev[0][2], prev[1], prev[4], prev[2], dx)
    if d["PF"]:  # the head strips' last reader is queued: the next unit's first chunk
        _load_heads(d, ws, sets, blk, s)
    _store_acts(d, scr, blk["addr"], prev, s, grp)
    _store_dx(d, scr, blk, dx, dws, s)


def _load_heads(
    d: dict[str, Any], ws: tuple[Any, ...], sets: dict[str, Any], blk: dict[str, Any], s: int
) -> None:
    """Chunk 0's strips of the next unit (and, at the end of a block, the next block's
    first Wd units) into the head buffers."""
    if s + 1 < d["B"] // d["SB"]:
        load_strips(d, ws[1], blk["meta"], 0, sets["head_strips"], s + 1)
        return
    nxt = sets["meta"][1 - blk["parity"]]  # prefetched with the next block's rows
    load_strips(d, ws[1], nxt, 0, sets["head_strips"], 0)
    load_wd_head(d, ws[2], nxt, sets["wd_head"])


def _gate_up_ga(
    d: dict[str, Any], fetch: Any, xT: Any, doT: Any, icw: int, acc: list[Any], strips: Any
) -> None:
    """acc[3it + (0, 1, 2)] = (gT, uT, gaT) of the chunk's I tile it, contracted over H
    (with gate / up saved: acc[it] = gaT only).

    Wg / Wu H tiles (H on partitions) are PE transposes of the I-major strips, made one
    tile ahead so their evacuating copies overlap the previous tile's matmuls.
    """
    h, ht, nit = d["H"], d["HT"], cdiv(icw, P)
    if d["GU"] is not None:
        _ga_only(d, fetch, doT, icw, acc)
        return
    nxt = _h_major(d, strips, 0, icw)
    wdT: Any = None
    j = 0
    for t in range(ht):
        cur = nxt
        if t + 1 < ht:
            nxt = _h_major(d, strips, t + 1, icw)
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


def _ga_only(d: dict[str, Any], fetch: Any, doT: Any, icw: int, acc: list[Any]) -> None:
    """acc[it] = gaT = (Wd do)^T of the chunk's I tile it, contracted over H (H order, as
    the Wd units stream)."""
    h, nit = d["H"], cdiv(icw, P)
    wdT: Any = None
    j = 0
    for t in range(d["HT"]):
        if t % d["DH"] == 0:
            wdT, j = fetch(), 0
        tr = tile_rows(h, t)
        for it in range(nit):
            cols = slice(it * P, it * P + min(P, icw - it * P))
            matmul(
                acc[it][0 : cols.stop - cols.start, :], wdT[0:tr, j, cols], doT[0:tr, t, :], t != 0
            )
        j += 1


def _h_major(d: dict[str, Any], strips: list[Any], t: int, icw: int) -> list[Any]:
    """H tile t of the chunk's Wg and Wu, [H rows, icw] each: PE transposes of the strips
    into one PSUM tile (one bank while 2 * tile_i fits), evacuated by ScalarE (VectorE
    carries the SwiGLU derivatives and the dgrad's sums)."""
    tr, nit, ti = tile_rows(d["H"], t), cdiv(icw, P), d["TI"]
    tp = nl.ndarray((P, 2, ti), dtype=d["dt"], buffer=nl.psum)
    out = []
    for k, strip in enumerate(strips):
        for it in range(nit):
            cw = min(P, icw - it * P)
            src = strip[0:cw, t * P : t * P + tr, it]
            nisa.nc_transpose(dst=tp[0:tr, k, it * P : it * P + cw], data=src)
        w = nl.ndarray((P, ti), dtype=d["dt"], buffer=nl.sbuf)
        nisa.tensor_copy(dst=w[0:tr, 0:icw], src=tp[0:tr, k, 0:icw], engine=nisa.engine.scalar)
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
    wgT, wuT = strips[0:2]
    nit = cdiv(icw, P)
    for n0 in range(d["C0"], d["C1"], PSUM_FP32):  # this LNC program's hidden columns
        nw = min(PSUM_FP32, d["C1"] - n0)
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


ACT_RING_ENGINES = (nisa.engine.vector, nisa.engine.scalar)  # a chunk's act / dg / du evacuations


def _store_group(d: dict[str, Any]) -> int:
    """Chunks whose token-major act / dg / du rows are stored by one DMA each."""
    per = d["TI"] * dtype_bytes(d["dt"])
    return max(1, min(cdiv(d["I"], d["TI"]), STORE_RUN_BYTES // per))


def _store_acts(
    d: dict[str, Any], scr: dict[str, Any], addr: Any, chunk: tuple[Any, ...], s: int, grp: Any
) -> None:
    """Token-major act, dg, du of the chunk (PE transposes) into the store group's tiles;
    the group's last chunk stores them to scratch act[:, i0:], gu[:, i0:], gu[:, I+i0:].

    A group of `_store_group` chunks is stored as one DMA per array, so each token row
    is one run of group * tile_i elements instead of tile_i.
    """
    acts, _, ic, i0, icw = chunk
    sb, ti, dt = d["SB"], d["TI"], d["dt"]
    nsa, nit, k = sb // P, cdiv(icw, P), _store_group(d)
    if ic % k == 0:
        grp["base"] = i0
        grp["tms"] = [nl.ndarray((P, nsa, k * ti), dtype=dt, buffer=nl.sbuf) for _ in acts]
    off, tms = i0 - grp["base"], grp["tms"]
    ring = psum_ring(dt, ACT_RING, ACT_RING_ENGINES)
    for src, tm in zip(acts, tms):
        for c in range(nsa):
            srcs = [src[0 : min(P, icw - it * P), it, c * P : (c + 1) * P] for it in range(nit)]
            ring_transpose(ring, srcs, tm[:, c, off : off + icw])
    if ic % k != k - 1 and i0 + icw < d["I"]:
        return
    base, width = grp["base"], off + icw
    dests = ((scr["act"], base), (scr["gu"], base), (scr["gu"], d["I"] + base))
    for tm, (dst, c0) in zip(tms, dests):
        view = slot_tiles(dst, addr, s * sb, nsa, c0, width)
        nisa.dma_copy(dst=view, src=tm[:, :, 0:width])
    grp.clear()


def _store_dx(
    d: dict[str, Any], scr: dict[str, Any], blk: dict[str, Any], dx: list[Any], dws: Any, s: int
) -> None:
    h, sb = d["H"], d["SB"]
    r0 = blk["addr"][1] * d["B"] + s * sb  # rows past (register) * B
    view = scr["dws"].ap([[1, 1], [1, sb]], offset=r0, scalar_offset=blk["row0"])
    nisa.dma_copy(dst=view, src=dws)
    nsa = sb // P
    c0, c1 = d["C0"], d["C1"]
    for c in range(nsa):
        out = nl.ndarray((P, h), dtype=d["dt"], buffer=nl.sbuf)
        w_col = blk["meta"]["wsl"][:, s * nsa + c : s * nsa + c + 1]
        nisa.activation(dst=out[:, c0:c1], op=nl.copy, data=dx[c][:, c0:c1], scale=w_col)
        off = (r0 + c * P) * h + c0
        view = scr["dx"].ap([[h, P], [1, c1 - c0]], offset=off, scalar_offset=blk["row0"])
        nisa.dma_copy(dst=view, src=out[:, c0:c1])


# ---- combine ------------------------------------------------------------------------------
def _combine_grads(
    d: dict[str, Any],
    dhidden: Any,
    d_weights: Any,
    dx_slots: Any,
    dws_slots: Any,
    token_slot: Any,
) -> None:
    """d_weights[t, j] = dws_slots[slot(t, j)] (0 when dropped); dhidden[t] = sum_j
    dx_slots[slot(t, j)] (`combine.combine`), this LNC program's token tiles of both
    (every other one at LNC 2)."""
    k = d["K"]
    for t0 in range(d["PID"] * P, d["T"], d["STEP"] * P):
        rows = min(P, d["T"] - t0)
        sl = nl.ndarray((P, k), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sl[0:rows, :], src=token_slot[t0 : t0 + rows, :])
        dwt = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
        for j in range(k):
            idx = sl[0:rows, j : j + 1]
            view = dws_slots.ap([[1, rows], [1, 1]], offset=0, vector_offset=idx, indirect_dim=0)
            nisa.dma_copy(dst=dwt[0:rows, j : j + 1], src=view)
        nisa.dma_copy(dst=d_weights[t0 : t0 + rows, :], src=dwt[0:rows, :])
    combine(dhidden, dx_slots, token_slot, None, tiles=(d["PID"], d["STEP"]))


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
    gate_up,
    static_blocks,
    may_drop,
    block_size,
    sub_block,
    tile_i,
    dma_h,
    w_bufs,
    wgrad_tiles,
    wgrad_cols,
    strip_bufs,
    prefetch_rows,
    w_up=None,
    dw_up=None,
    transposed=(False, False),
):
    """The NKI entry point of `moe_mlp_bwd_body` (same arguments; see its docstring)."""
    return moe_mlp_bwd_body(
        hidden, w_gate_up, w_down, dout, slot_token, slot_weight, block_expert, block_keep,
        block_count, token_slot, dw_gate_up, dw_down, gate_up, static_blocks, may_drop, block_size,
        sub_block, tile_i, dma_h, w_bufs, wgrad_tiles, wgrad_cols, strip_bufs, prefetch_rows, w_up,
        dw_up, transposed,
    )  # fmt: skip
