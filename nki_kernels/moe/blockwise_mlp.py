"""Blockwise grouped expert MLP (SwiGLU), forward, with the routing-weighted combine.

Inputs come from the block plan (grouping.py): blocks of B token slots, every block one
expert. Per block b with expert e (slot layout s = b*B + c*128 + p):

    x      = hidden[slot_token[b]]                  gather, indirect DMA (padding -> 0)
    xT     = x^T                                    PE transposes, [H, B], H on partitions
    for each chunk of tile_i intermediate columns:
        gT = Wg_e[:, chunk]^T @ xT,  uT = Wu_e[:, chunk]^T @ xT     PSUM, [chunk, B]
        actT = silu(gT) * uT                        ScalarE + VectorE, rounded to dtype
        y   += actT^T @ Wd_e[chunk, :]              [B, H] (fp32 SBUF across chunks)
    y_slots[b*B : (b+1)*B] = y                       unweighted expert outputs (HBM scratch)

then the combine, per 128-token tile: out[t] = sum_j token_weight[t, j] * y_slots[token_slot
[t, j]] (gathers by slot, fp32 sums, one rounding). Summation order is fixed (j ascending),
so results are deterministic; dropped assignments (slot out of range) are skipped.

Weights stream from HBM once per block: `.ap(scalar_offset=expert)` picks the expert's
slice at run time. Loop orders for the gate/up projections (config `loop_order`):
- "h_outer": weight tiles [128 H-rows x dma_h, tile_i] stream in H order; all 2*tile_i/128
  accumulators of the chunk stay in PSUM while H is contracted;
- "i_outer": the chunk's whole [H, tile_i] gate and up strips are loaded, then each
  128-column I tile is contracted over H with only 2 accumulators live.
`w_bufs` weight units are in flight (prefetch depth w_bufs - 1, across chunk boundaries).

Blocks [0, static_blocks) are a static loop (every routing uses them); the rest run in a
device loop (`nl.fori_loop`) up to `block_count`, so a kernel is specialized on shapes
only, never on the routing. Ragged H / I (not multiples of 128) are sliced.

Limits: B in {128, 256, 512, 1024}; H, I any size (SBUF/PSUM fit is checked by
config.validate); dtype bf16 or fp32 for hidden and weights alike.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl

# ---- limits ---------------------------------------------------------------------------
P = 128  # partitions: tokens per sub-tile, contraction rows per matmul
PSUM_FP32 = 512  # fp32 elements per PSUM bank row: the matmul N limit with an fp32 dst
# ---- tile sizes -----------------------------------------------------------------------
TRANSPOSE_GROUP = 4  # PE transposes evacuated by one copy: [128, 4 x 128] fits one bank
COMBINE_COLS = 2048  # hidden columns per combine step (bounds its SBUF use)


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


@nki.jit
def moe_mlp_fwd(
    hidden,
    w_gate_up,
    w_down,
    slot_token,
    block_expert,
    block_count,
    token_slot,
    token_weight,
    static_blocks,
    may_drop,
    block_size,
    tile_i,
    loop_order,
    down_n,
    w_bufs,
    dma_h,
):
    """out [T, H] = sum_j token_weight[:, j] * SwiGLU-expert outputs (see module doc).

    hidden [T, H]; w_gate_up [E, H, 2I] (gate = columns :I, up = I:); w_down [E, I, H];
    slot_token [NB, 128, B/128] int32; block_expert [NB, 1] int32; block_count [1, 1]
    int32; token_slot [T, k] int32; token_weight [T, k] fp32. `static_blocks` (int) blocks
    always run; `may_drop` (bool) is True when some token_slot may be out of range.
    """
    t_count, h = hidden.shape
    _, h2, i2 = w_gate_up.shape
    nb, parts, ns = slot_token.shape
    assert parts == P and h2 == h and i2 % 2 == 0, "moe_mlp_fwd: inconsistent shapes"
    assert block_size == P * ns, "moe_mlp_fwd: block_size does not match slot_token"
    assert loop_order in ("h_outer", "i_outer"), "moe_mlp_fwd: unknown loop_order"
    d = _dims(hidden, w_gate_up, slot_token, token_slot)
    cfg = {"tile_i": tile_i, "loop_order": loop_order, "down_n": down_n, "w_bufs": w_bufs}
    cfg["dma_h"] = dma_h
    out = nl.ndarray((t_count, h), dtype=hidden.dtype, buffer=nl.shared_hbm)
    y_slots = nl.ndarray((nb * block_size, h), dtype=hidden.dtype, buffer=nl.hbm)
    ws = (hidden, w_gate_up, w_down, slot_token, block_expert, y_slots)

    for b in range(min(static_blocks, nb)):
        _fwd_block(d, cfg, ws, b)
    if static_blocks < nb:
        count = nisa.register_alloc()
        nisa.register_load(count, block_count)

        def body(i):
            _fwd_block(d, cfg, ws, i)

        nl.fori_loop(static_blocks, count, body)
    _combine(d, out, y_slots, token_slot, token_weight, may_drop)
    return out


def _dims(hidden: Any, w_gate_up: Any, slot_token: Any, token_slot: Any) -> dict[str, Any]:
    t_count, h = hidden.shape
    nb, _, ns = slot_token.shape
    return {
        "T": t_count,
        "H": h,
        "I": w_gate_up.shape[2] // 2,
        "NB": nb,
        "NS": ns,
        "B": ns * P,
        "HT": cdiv(h, P),
        "K": token_slot.shape[1],
        "dt": hidden.dtype,
    }


def tile_rows(total: int, tile: int) -> int:
    """Rows of tile `tile` (0-based, 128-row tiles) of a dimension of size `total`."""
    return min(P, total - tile * P)


# ---- per-block pieces (shared with the backward kernel) ---------------------------------
def block_meta(d: dict[str, Any], slot_token: Any, block_expert: Any, b: Any) -> tuple[Any, Any]:
    """Load block b's slot tokens [128, NS] and expert id [1, 1] (b: int or register)."""
    ns = d["NS"]
    tok = nl.ndarray((P, ns), dtype=nl.int32, buffer=nl.sbuf)
    exp = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    if isinstance(b, int):
        nisa.dma_copy(dst=tok, src=slot_token[b])
        nisa.dma_copy(dst=exp, src=block_expert[b : b + 1, :])
    else:
        pat = [[ns, P], [1, ns]]
        nisa.dma_copy(dst=tok, src=slot_token.ap(pat, offset=0, scalar_offset=b, indirect_dim=0))
        one = [[1, 1], [1, 1]]
        nisa.dma_copy(dst=exp, src=block_expert.ap(one, offset=0, scalar_offset=b, indirect_dim=0))
    return tok, exp


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


# ---- forward block ------------------------------------------------------------------------
def _fwd_block(d: dict[str, Any], cfg: dict[str, Any], ws: tuple[Any, ...], b: Any) -> None:
    hidden, w_gate_up, w_down, slot_token, block_expert, y_slots = ws
    h, ns, dt = d["H"], d["NS"], d["dt"]
    tok, exp = block_meta(d, slot_token, block_expert, b)
    xT = nl.ndarray((P, d["HT"], d["B"]), dtype=dt, buffer=nl.sbuf)
    _load_xT(d, hidden, tok, xT)
    y = _expert_mlp(d, cfg, w_gate_up, w_down, exp, xT)
    if not isinstance(b, int):
        row0 = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.register_store(row0, b)
        nisa.tensor_scalar(dst=row0, data=row0, op0=nl.multiply, operand0=d["B"])
    for c in range(ns):
        if isinstance(b, int):
            r0 = b * d["B"] + c * P
            nisa.dma_copy(dst=y_slots[r0 : r0 + P, :], src=y[c])
        else:
            view = y_slots.ap(
                [[h, P], [1, h]], offset=c * P * h, scalar_offset=row0, indirect_dim=0
            )
            nisa.dma_copy(dst=view, src=y[c])


def _load_xT(d: dict[str, Any], hidden: Any, tok: Any, xT: Any) -> None:
    """Gather the block's token rows and transpose them: xT[:, t, s] = hidden[tok[s], t*128 + :].

    Column tile t of every sub-tile is transposed before tile t+1, so the first matmul
    (contracting tile 0) can start after one group of transposes.
    """
    rows = []
    for c in range(d["NS"]):
        x_tok = nl.ndarray((P, d["H"]), dtype=d["dt"], buffer=nl.sbuf)
        gather_rows(hidden, tok[:, c : c + 1], x_tok, d["H"])
        rows.append(x_tok)
    parity = 0
    for t in range(d["HT"]):
        tr = tile_rows(d["H"], t)
        srcs = [r[:, t * P : t * P + tr] for r in rows]
        parity = transpose_into(d["dt"], srcs, xT[:, t, :], parity)


def _weight_units(d: dict[str, Any], cfg: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(chunk, first H tile, H tiles) of every gate/up weight load, in consumption order."""
    ht, ti = d["HT"], cfg["tile_i"]
    units = []
    for ic in range(cdiv(d["I"], ti)):
        if cfg["loop_order"] == "i_outer":
            units.append((ic, 0, ht))
        else:
            for h0 in range(0, ht, cfg["dma_h"]):
                units.append((ic, h0, min(cfg["dma_h"], ht - h0)))
    return units


def _load_gate_up(
    d: dict[str, Any], cfg: dict[str, Any], w_gate_up: Any, exp: Any, unit: tuple[int, int, int]
) -> tuple[Any, Any]:
    ic, h0, nh = unit
    ti = cfg["tile_i"]
    i0 = ic * ti
    icw = min(ti, d["I"] - i0)
    nrows = min(nh * P, d["H"] - h0 * P)
    wg = nl.ndarray((P, nh, ti), dtype=d["dt"], buffer=nl.sbuf)
    wu = nl.ndarray((P, nh, ti), dtype=d["dt"], buffer=nl.sbuf)
    load_weight_rows(w_gate_up, exp, h0 * P, nrows, i0, icw, wg)
    load_weight_rows(w_gate_up, exp, h0 * P, nrows, d["I"] + i0, icw, wu)
    return wg, wu


def _weight_stream(d: dict[str, Any], cfg: dict[str, Any], w_gate_up: Any, exp: Any) -> Any:
    """A `fetch()` returning the next gate/up weight unit, `w_bufs - 1` loads ahead.

    A unit dies when its consumer drops it, so at most `w_bufs` units are live: the one in
    use and the prefetched ones (on-chip buffers rotate through the allocator).
    """
    units = _weight_units(d, cfg)
    depth = max(1, cfg["w_bufs"] - 1)
    loaded: dict[str, Any] = {}
    state = {"next": 0}

    def issue(u: int) -> None:
        if u < len(units):
            loaded[str(u)] = _load_gate_up(d, cfg, w_gate_up, exp, units[u])

    for u in range(depth):
        issue(u)

    def fetch() -> Any:
        u = state["next"]
        state["next"] = u + 1
        issue(u + depth)
        return loaded.pop(str(u))

    return fetch


def _expert_mlp(
    d: dict[str, Any], cfg: dict[str, Any], w_gate_up: Any, w_down: Any, exp: Any, xT: Any
) -> list[Any]:
    """The block's unweighted expert outputs, NS tiles [128 tokens, H] in dtype."""
    h, ns, dt, ti = d["H"], d["NS"], d["dt"], cfg["tile_i"]
    nic = cdiv(d["I"], ti)
    fetch = _weight_stream(d, cfg, w_gate_up, exp)
    # one chunk: results go straight to dtype; several: fp32 sums, cast by the store DMA
    y_dt = dt if nic == 1 else nl.float32
    y = [nl.ndarray((P, h), dtype=y_dt, buffer=nl.sbuf) for _ in range(ns)]
    for ic in range(nic):
        i0 = ic * ti
        icw = min(ti, d["I"] - i0)
        nit = cdiv(icw, P)
        wd = nl.ndarray((P, nit, h), dtype=dt, buffer=nl.sbuf)
        load_weight_rows(w_down, exp, i0, icw, 0, h, wd)
        act = nl.ndarray((P, nit, d["B"]), dtype=dt, buffer=nl.sbuf)
        if cfg["loop_order"] == "h_outer":
            _gate_up_h_outer(d, cfg, fetch, xT, icw, act)
        else:
            _gate_up_i_outer(d, fetch(), xT, icw, act)
        _down_proj(d, cfg, act, wd, icw, ic, y)
        del act, wd
    return y


def _gate_up_h_outer(
    d: dict[str, Any], cfg: dict[str, Any], fetch: Any, xT: Any, icw: int, act: Any
) -> None:
    bsz, nit = d["B"], cdiv(icw, P)
    acc = psum_accumulators(2 * nit, bsz)
    g_ps, u_ps = acc[0::2], acc[1::2]
    for h0 in range(0, d["HT"], cfg["dma_h"]):
        wg, wu = fetch()
        for j in range(min(cfg["dma_h"], d["HT"] - h0)):
            ht = h0 + j
            hr = tile_rows(d["H"], ht)
            for it in range(nit):
                cw = min(P, icw - it * P)
                for n0 in range(0, bsz, PSUM_FP32):
                    nw = min(PSUM_FP32, bsz - n0)
                    mov = xT[0:hr, ht, n0 : n0 + nw]
                    cols = slice(it * P, it * P + cw)
                    _mm2(g_ps[it][0:cw, n0 : n0 + nw], wg[0:hr, j, cols], mov, ht != 0)
                    _mm2(u_ps[it][0:cw, n0 : n0 + nw], wu[0:hr, j, cols], mov, ht != 0)
        del wg, wu
    for it in range(nit):
        _swiglu(d, g_ps[it], u_ps[it], act, it, min(P, icw - it * P))


def _gate_up_i_outer(d: dict[str, Any], unit: tuple[Any, Any], xT: Any, icw: int, act: Any) -> None:
    wg, wu = unit
    bsz = d["B"]
    for it in range(cdiv(icw, P)):
        cw = min(P, icw - it * P)
        g_ps, u_ps = psum_accumulators(2, bsz)
        for ht in range(d["HT"]):
            hr = tile_rows(d["H"], ht)
            for n0 in range(0, bsz, PSUM_FP32):
                nw = min(PSUM_FP32, bsz - n0)
                mov = xT[0:hr, ht, n0 : n0 + nw]
                cols = slice(it * P, it * P + cw)
                _mm2(g_ps[0:cw, n0 : n0 + nw], wg[0:hr, ht, cols], mov, ht != 0)
                _mm2(u_ps[0:cw, n0 : n0 + nw], wu[0:hr, ht, cols], mov, ht != 0)
        _swiglu(d, g_ps, u_ps, act, it, cw)


def psum_accumulators(n: int, bsz: int) -> list[Any]:
    """n fp32 PSUM accumulators [128, bsz], packed 512 // bsz to a bank when bsz < 512.

    Small blocks leave most of a bank unused otherwise; packing lets a gate/up pass keep
    more I tiles in flight (wider weight DMA rows) in the same 8 banks.
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


def _mm2(dst: Any, stationary: Any, moving: Any, accumulate: bool) -> None:
    nisa.nc_matmul(dst=dst, stationary=stationary, moving=moving, accumulate=accumulate)


def _swiglu(d: dict[str, Any], g_ps: Any, u_ps: Any, act: Any, it: int, cw: int) -> None:
    """act[:, it, :] = silu(g) * u: ScalarE reads the gate PSUM, VectorE the up PSUM."""
    sg = nl.ndarray((P, d["B"]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sg[0:cw, :], op=nl.silu, data=g_ps[0:cw, :])
    nisa.tensor_tensor(dst=act[0:cw, it, :], data1=sg[0:cw, :], data2=u_ps[0:cw, :], op=nl.multiply)


def _down_proj(
    d: dict[str, Any], cfg: dict[str, Any], act: Any, wd: Any, icw: int, ic: int, y: list[Any]
) -> None:
    """y[c] (+)= act[:, :, c]^T @ wd over this chunk's I tiles, per 128-token sub-tile."""
    h, dn = d["H"], cfg["down_n"]
    nit = cdiv(icw, P)
    for c in range(d["NS"]):
        for n0 in range(0, h, dn):
            nw = min(dn, h - n0)
            ps = nl.ndarray((P, dn), dtype=nl.float32, buffer=nl.psum)
            for it in range(nit):
                cw = min(P, icw - it * P)
                nisa.nc_matmul(
                    dst=ps[:, 0:nw],
                    stationary=act[0:cw, it, c * P : (c + 1) * P],
                    moving=wd[0:cw, it, n0 : n0 + nw],
                    accumulate=it != 0,
                )
            dst = y[c][:, n0 : n0 + nw]
            if ic == 0:
                nisa.tensor_copy(dst=dst, src=ps[:, 0:nw], engine=nisa.engine.scalar)
            else:
                nisa.tensor_tensor(dst=dst, data1=dst, data2=ps[:, 0:nw], op=nl.add)


# ---- combine ------------------------------------------------------------------------------
def _combine(
    d: dict[str, Any], out: Any, y_slots: Any, token_slot: Any, token_weight: Any, may_drop: bool
) -> None:
    """out[t] = sum_j token_weight[t, j] * y_slots[token_slot[t, j]] (fp32, j ascending)."""
    h, k, dt = d["H"], d["K"], d["dt"]
    skip = nisa.oob_mode.skip if may_drop else nisa.oob_mode.error
    for t0 in range(0, d["T"], P):
        rows = min(P, d["T"] - t0)
        sl = nl.ndarray((P, k), dtype=nl.int32, buffer=nl.sbuf)
        wt = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sl[0:rows, :], src=token_slot[t0 : t0 + rows, :])
        nisa.dma_copy(dst=wt[0:rows, :], src=token_weight[t0 : t0 + rows, :])
        for c0 in range(0, h, COMBINE_COLS):
            cw = min(COMBINE_COLS, h - c0)
            acc = nl.ndarray((P, COMBINE_COLS), dtype=nl.float32, buffer=nl.sbuf)
            res = nl.ndarray((P, COMBINE_COLS), dtype=dt, buffer=nl.sbuf)
            for j in range(k):
                yj = nl.ndarray((P, COMBINE_COLS), dtype=dt, buffer=nl.sbuf)
                if may_drop:
                    nisa.memset(dst=yj[0:rows, 0:cw], value=0.0)
                view = y_slots.ap(
                    [[h, rows], [1, cw]],
                    offset=c0,
                    vector_offset=sl[0:rows, j : j + 1],
                    indirect_dim=0,
                )
                nisa.dma_copy(dst=yj[0:rows, 0:cw], src=view, oob_mode=skip)
                dst = res if j == k - 1 else acc
                w_col = wt[0:rows, j : j + 1]
                if j == 0:
                    nisa.tensor_scalar(
                        dst=dst[0:rows, 0:cw],
                        data=yj[0:rows, 0:cw],
                        op0=nl.multiply,
                        operand0=w_col,
                    )
                else:
                    nisa.scalar_tensor_tensor(
                        dst=dst[0:rows, 0:cw],
                        data=yj[0:rows, 0:cw],
                        op0=nl.multiply,
                        operand0=w_col,
                        op1=nl.add,
                        operand1=acc[0:rows, 0:cw],
                    )
            nisa.dma_copy(dst=out[t0 : t0 + rows, c0 : c0 + cw], src=res[0:rows, 0:cw])
