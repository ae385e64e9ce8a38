"""Blockwise grouped expert MLP (SwiGLU), forward, with the routing-weighted combine.

Inputs come from the variable-size block plan (grouping.py, `sized=True`): blocks of
s <= NS = B/128 sub-tiles of 128 token slots, every block one expert, ordered by s
(largest first). Per block b of s sub-tiles with expert e (slot layout s = b*B + c*128 +
p, c < s):

    x      = hidden[slot_token[b, :, :s]]           gather, indirect DMA (padding -> 0)
    xT     = x^T                                    PE transposes, [H, s*128]
    for each chunk of tile_i intermediate columns:
        gT = Wg_e[:, chunk]^T @ xT,  uT = Wu_e[:, chunk]^T @ xT     PSUM, [chunk, s*128]
        actT = silu(gT) * uT                        ScalarE + VectorE, rounded to dtype
        y   += actT^T @ Wd_e[chunk, :]              [s*128, H] (fp32 SBUF across chunks)
    y_slots[b*B : b*B + s*128] = y                   unweighted expert outputs (HBM scratch)

A block costs its s sub-tiles, so an expert's padding is at most 127 slots (the plan
splits its sub-tiles near-equally over its blocks), and the weights stream once per block.

then the combine (combine.py, ScalarE / VectorE), per 128-token tile: out[t] = sum_j
token_weight[t, j] * y_slots[token_slot[t, j]] (fp32 sums, j ascending, one rounding), so
results are deterministic; dropped assignments point at y_slots' zero row.

LNC 2 (kernel[2]): the programs split the blocks, not the columns. Program p runs blocks
b = p, p + 2, ... (for each size s a device loop of step 2 over that size's blocks,
`kind_bounds`; its first block computed on chip), writing their slot rows to the
shared-HBM `y_slots`; after a
`core_barrier` (every slot row written, the drop row zeroed by program 0) each program
combines every other 128-token tile. Each block's arithmetic and each token's combine are
those of LNC 1, so the outputs are bit-identical. Alternate blocks balance skewed
routing too (blocks are sorted by size); splitting the columns instead would make both
cores run every block's gate/up projection.

Weights stream from HBM once per block: `.ap(scalar_offset=expert)` picks the expert's
slice at run time. Weights stored as the parameters hold them (transposed; gate and up
possibly two tensors) fill the same units by DMA transposes (`param_layout.py`). Loop
orders for the gate/up projections (config `loop_order`):
- "h_outer": weight units [128 H-rows x dma_h, tile_i] stream in H order; all
  2*tile_i/128 accumulators of the chunk stay in PSUM while H is contracted;
- "i_outer": the chunk's whole [H, tile_i] gate and up strips are loaded (rows of
  tile_i * itemsize bytes), then each 128-column I tile is contracted over H with only 2
  accumulators live.
`w_bufs` weight units are in flight (prefetch depth w_bufs - 1, across chunk boundaries);
units of a ragged last chunk are sized to it.

Across blocks (fwd_stream.py): persistent "head" buffers hold the next block's slot
tokens, expert id, gathered token rows and first gate/up unit. A block takes its expert
id, transposes its rows out of the head and starts on the head unit; the head is
refilled for this program's next block (b + 1, or b + 2 at LNC 2: the next block in plan
order, of the same or a smaller size) as soon as each part is consumed (rows: s
sub-tiles, which cover the next block's, one sub-tile gather per chunk from chunk 1 on;
the unit when the block moves to its second unit), so the next block starts without
waiting for its gathers or weights.

Keeping TensorE busy (DMA queues run in issue order, and a tile allocated after a dead
one inherits that tile's last reader): the next block's row gathers are spread over
chunks 1..s rather than queued in front of the block's first weight units; each y[c] is
stored as soon as its last chunk is summed, so the block's output DMAs run during its
last down projection instead of in front of the next block's loads; SwiGLU's fp32
scratch lives across chunks (allocated per chunk it took a dead weight unit's SBUF and
waited for that unit's last matmul); the chunk's last weight unit is contracted one I
tile at a time, so ScalarE / VectorE evaluate SwiGLU of tile it while TensorE runs tile
it + 1, and the last tile's SwiGLU is split per sub-tile so the down projection starts
after a quarter of it. None of this changes an accumulation order: outputs are
bit-identical.

The op runs one device loop per block size, bounded by `kind_bounds` (run-time data), so
a kernel is specialized on shapes only, never on the routing. `static_kinds` (pricing:
the plan known when specializing) gives the block count of each size and runs the same
bodies as static loops (block indices are registers in both). Ragged H / I (not
multiples of 128) are sliced.

Saving gate / up (training: `save_cols` given; `moe_mlp_train`; gate_up_save.py). The
backward needs the pre-activation gate and up of every routed row; instead of
recomputing them (two matmul passes and PE transposes of the weights there), the forward
stores each I tile's g and u once its H contraction is done: rounded to the dtype (one
PSUM-to-SBUF copy each, ScalarE / VectorE) and DMA'd to gate_up [2I, NC] (gate rows :I,
up rows I:) at this block's column `save_cols[b]`, as [I rows, the block's slots] (runs
of s * 128 elements). The layout is I-major because that is how phase A of the backward
consumes gT / uT ([tile_i rows, sub_block tokens] per chunk: one DMA of runs of
sub_block elements, no transpose), and its columns are the backward plan's slots (a
forward block's rows are consecutive slots there too; `grouping.gate_up_columns`).
Padding rows are zeros, so their g = u = 0; the backward's sub-tiles past an expert's
last 128 rows (holes, `save_holes`) are zeroed after the blocks, so the backward reads
no stale HBM. The output and its arithmetic are unchanged (bit-identical to the
inference forward, which stores nothing).

Limits: B in {128, 256, 512, 1024}; H, I any size (SBUF/PSUM fit is checked by
config.validate); dtype bf16 or fp32 for hidden and weights alike.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl
from .combine import combine, zero_row
from .fwd_stream import (
    head_buffers,
    merged_chunks,
    prefetch_meta,
    prefetch_rows,
    prefetch_unit,
    row_indexes,
    weight_stream,
)
from .gate_up_save import keep_gate_up, zero_holes
from .param_layout import gate_up_parts, gate_up_width, index_cols, load_k_major, uses_index
from .tiles import (
    PSUM_FP32,
    P,
    as_register,
    block_ap,
    block_row0,
    cdiv,
    gather_rows,
    psum_accumulators,
    row_ramp,
    tile_rows,
    transpose_into,
)


def moe_mlp_fwd_body(
    hidden,
    w_gate_up,
    w_down,
    slot_token,
    block_expert,
    kind_bounds,
    token_slot,
    token_weight,
    save_cols,
    save_holes,
    static_kinds,
    may_drop,
    block_size,
    tile_i,
    loop_order,
    down_n,
    w_bufs,
    dma_h,
    static_holes=None,
    w_up=None,
    transposed=(False, False),
):
    """out [T, H] = sum_j token_weight[:, j] * SwiGLU-expert outputs (see module doc);
    (out, gate_up) when `save_cols` is given (training: see "Saving gate / up" above).

    hidden [T, H]; w_gate_up [E, H, 2I] (gate = columns :I, up = I:); w_down [E, I, H];
    slot_token [NB, 128, B/128] int32; block_expert [NB, 1] int32; kind_bounds
    [1, B/128 + 1] int32 (blocks of s = B/128 - j sub-tiles: [kind_bounds[j],
    kind_bounds[j + 1])); token_slot [T, k] int32; token_weight [T, k] fp32.
    `static_kinds` (None, or the block count of each size, largest first: static loops);
    `may_drop` (bool) is True when some token_slot may be out of range.
    save_cols [NB, 1] int32 (or None: nothing saved): the first column of each block's
    rows in `gate_up`; save_holes [NC/128 + 1, 1] int32: [0] = the number of 128-column
    holes, [1..] their first columns (NC, the saved width, from its shape);
    `static_holes` (pricing): that count as a static loop.
    Parameter layouts (param_layout.py): `transposed` = (gate/up, down) stored as W^T,
    w_gate_up [E, 2I, H] / w_down [E, H, I]; `w_up` (or None): the up weight alone,
    w_gate_up then the gate's alone ([E, H, I], or [E, I, H] transposed).
    """
    t_count, h = hidden.shape
    h2, i = gate_up_width(w_gate_up, w_up, transposed[0])
    nb, parts, ns = slot_token.shape
    assert parts == P and h2 == h, "moe_mlp_fwd: inconsistent shapes"
    assert w_up is None or w_up.shape == w_gate_up.shape, "moe_mlp_fwd: w_up is as w_gate_up"
    want = (w_gate_up.shape[0], h, i) if transposed[1] else (w_gate_up.shape[0], i, h)
    assert tuple(w_down.shape) == want, "moe_mlp_fwd: w_down is [E, I, H] ([E, H, I] stored)"
    assert block_size == P * ns, "moe_mlp_fwd: block_size does not match slot_token"
    assert loop_order in ("h_outer", "i_outer"), "moe_mlp_fwd: unknown loop_order"
    assert kind_bounds.shape == (1, ns + 1), "moe_mlp_fwd: kind_bounds is [1, B/128 + 1]"
    d = _dims(hidden, i, slot_token, token_slot)
    _layout(d, (w_gate_up, w_up, w_down), transposed, tile_i)
    pid, nprog = _program()
    d["step"] = nprog  # this program's blocks: pid, pid + nprog, ...
    cfg = {"tile_i": tile_i, "loop_order": loop_order, "down_n": down_n, "w_bufs": w_bufs}
    cfg["dma_h"] = dma_h
    out = nl.ndarray((t_count, h), dtype=hidden.dtype, buffer=nl.shared_hbm)
    # + one row for dropped assignments (combine.zero_row); shared: every program writes
    # the rows of its blocks and gathers any token's rows
    y_slots = nl.ndarray((nb * block_size + 1, h), dtype=hidden.dtype, buffer=nl.shared_hbm)
    ws = (hidden, w_gate_up, w_down, slot_token, block_expert, y_slots)
    gate_up = None
    if save_cols is not None:  # training: [2I, NC] pre-activation gate (rows :I) and up
        ncol = (save_holes.shape[0] - 1) * P
        gate_up = nl.ndarray((2 * d["I"], ncol), dtype=hidden.dtype, buffer=nl.shared_hbm)
        d["save"] = (gate_up, save_cols)

    if pid < nb:  # else (a one-block plan at LNC 2) this program has no block to run
        head = head_buffers(d, cfg)
        prefetch_meta(d, ws, head, (nisa.register_alloc(pid), 0))
        prefetch_rows(d, hidden, head, d["NS"])
        prefetch_unit(d, cfg, w_gate_up, head)
        _run_blocks(d, cfg, ws, head, (kind_bounds, static_kinds, pid))
        del head  # the combine reuses its SBUF
    if gate_up is not None:
        zero_holes(d, gate_up, save_holes, static_holes, (pid, nprog))
    if may_drop and pid == 0:
        zero_row(y_slots)
    if nprog > 1:  # every slot row (and the drop row) is in HBM before any core gathers
        nisa.core_barrier(data=y_slots, cores=tuple(range(nprog)))
    combine(out, y_slots, token_slot, token_weight, tiles=(pid, nprog))
    if gate_up is not None:
        return out, gate_up
    return out


def _program() -> tuple[int, int]:
    """(this LNC program's index, the number of programs): (0, 1) under LNC 1."""
    if nl.program_ndim() == 0 or nl.num_programs(0) == 1:
        return 0, 1
    return nl.program_id(0), nl.num_programs(0)


def _dims(hidden: Any, i: int, slot_token: Any, token_slot: Any) -> dict[str, Any]:
    t_count, h = hidden.shape
    nb, _, ns = slot_token.shape
    return {
        "T": t_count,
        "H": h,
        "I": i,
        "NB": nb,
        "NS": ns,
        "B": ns * P,
        "HT": cdiv(h, P),
        "K": token_slot.shape[1],
        "dt": hidden.dtype,
    }


def _layout(d: dict[str, Any], ws: tuple[Any, Any, Any], transposed: Any, tile_i: int) -> None:
    """The weights' layouts (param_layout.py) and, for transposed 2-byte weights, the
    ramp their per-expert row indexes are built from (once per kernel)."""
    w_gate_up, w_up, w_down = ws
    d["gu_t"], d["dn_t"] = bool(transposed[0]), bool(transposed[1])
    d["parts"] = gate_up_parts(w_gate_up, w_up, d["I"])
    d["ix_gu"] = uses_index(w_gate_up, d["gu_t"])
    d["ix_dn"] = uses_index(w_down, d["dn_t"])
    d["w_gu"], d["w_dn"] = w_gate_up, w_down
    d["ramp"] = None
    if d["ix_gu"] or d["ix_dn"]:
        k = max(index_cols(min(tile_i, d["I"])), index_cols(d["H"]) if d["ix_dn"] else 0)
        d["ramp"] = row_ramp(k)


# ---- cross-block prefetch -----------------------------------------------------------------


# ---- forward block ------------------------------------------------------------------------
def _run_blocks(
    d: dict[str, Any],
    cfg: dict[str, Any],
    ws: tuple[Any, ...],
    head: dict[str, Any],
    plan: tuple[Any, Any, int],
) -> None:
    """This program's blocks (pid, pid + step, ...) in plan order, size by size: static
    loops over `static_kinds`' counts, else one device loop per size over kind_bounds."""
    kind_bounds, static_kinds, pid = plan
    step, ns = d["step"], d["NS"]
    if static_kinds is not None:
        assert len(static_kinds) == ns, "moe_mlp_fwd: static_kinds has one count per size"
        size_of = [ns - j for j, c in enumerate(static_kinds) for _ in range(c)]
        for b in range(pid, len(size_of), step):
            _fwd_block(d, cfg, ws, head, (as_register(b), 0), size_of[b])
        return
    bnd = nl.ndarray((1, ns + 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=bnd, src=kind_bounds)
    for j in range(ns):
        lo = bnd[0:1, j : j + 1]
        start = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        if step == 1:
            nisa.tensor_copy(dst=start, src=lo)
        else:  # the first block >= lo of this program: lo + ((lo + pid) & 1)
            nisa.tensor_scalar(dst=start, data=lo, op0=nl.add, operand0=pid)
            nisa.tensor_scalar(dst=start, data=start, op0=nl.bitwise_and, operand0=1)
            nisa.tensor_tensor(dst=start, data1=start, data2=lo, op=nl.add)
        lo_r = nisa.register_alloc()
        nisa.register_load(lo_r, start)
        hi_r = nisa.register_alloc()
        nisa.register_load(hi_r, bnd[0:1, j + 1 : j + 2])

        def body(i: Any, s: int = ns - j) -> None:
            _fwd_block(d, cfg, ws, head, (i, 0), s)

        nl.fori_loop(lo_r, hi_r, body, step=step)


def _fwd_block(
    d: dict[str, Any],
    cfg: dict[str, Any],
    ws: tuple[Any, ...],
    head: dict[str, Any],
    addr: Any,
    s: int,
) -> None:
    """One block of s sub-tiles (its slots: addr's B-slot range, the first s * 128 used)."""
    hidden, w_gate_up, w_down, y_slots = ws[0], ws[1], ws[2], ws[5]
    h, dt, stride = d["H"], d["dt"], d["B"]
    dk = {**d, "NS": s, "B": s * P}  # the block's sub-tiles and slots
    exp = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=exp, src=head["exp"])
    exp_col = None
    if d["ramp"] is not None:
        exp_col = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=exp_col, src=head["col"])
    exp = row_indexes(d, exp, exp_col, cfg["tile_i"])
    reg, extra = addr
    prefetch_meta(d, ws, head, (reg, extra + d["step"]))  # this program's next block
    m, serial = merged_chunks(d, cfg, s)
    # blocks are sorted by size, so blocks of merged passes only follow one another: they
    # load their own first unit (the head holds an unmerged one)
    pcfg = cfg if m == 1 else {**cfg, "tile_i": m * cfg["tile_i"], "dma_h": cfg["dma_h"] // m}
    fetch = weight_stream(dk, pcfg, w_gate_up, exp, head if m == 1 else None)
    xT = nl.ndarray((P, d["HT"], s * P), dtype=dt, buffer=nl.sbuf)
    parity = 0
    for t in range(d["HT"]):
        cols = slice(t * P, t * P + tile_rows(h, t))
        srcs = [head["x"][:, c, cols] for c in range(s)]
        parity = transpose_into(dt, srcs, xT[:, t, :], parity)
    row0: list[Any] = []  # the block's first slot row, computed at its first store

    def gather_next(c: int) -> None:  # the next block has <= s sub-tiles
        gather_rows(hidden, head["tok"][:, c : c + 1], head["x"][:, c, :], h)

    # spread over chunks 1..s (h_outer, enough chunks), else gathered now as before
    spread = cfg["loop_order"] == "h_outer" and cdiv(d["I"], cfg["tile_i"]) > s
    if not spread:
        for c in range(s):
            gather_next(c)

    def store(c: int, yc: Any) -> None:
        if not row0:
            row0.append(block_row0(addr, stride))
        off = (extra * stride + c * P) * h
        view = y_slots.ap([[h, P], [1, h]], offset=off, scalar_offset=row0[0], indirect_dim=0)
        nisa.dma_copy(dst=view, src=yc)

    keep: Any = None
    if "save" in d:  # training: this block's first column in gate_up
        col = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=col, src=block_ap(d["save"][1], addr, [[1, 1], [1, 1]]))

        def keep(i_row: int, cw: int, g_ps: Any, u_ps: Any) -> None:
            keep_gate_up(dk, d["save"][0], col, (i_row, cw), (g_ps, u_ps))

    hooks = (fetch, gather_next if spread else None, store, keep)
    _expert_mlp(dk, cfg, w_down, exp, xT, hooks, (m, serial))


def _expert_mlp(
    d: dict[str, Any],
    cfg: dict[str, Any],
    w_down: Any,
    exp: Any,
    xT: Any,
    hooks: Any,
    merge: tuple[int, bool] = (1, False),
) -> None:
    """The block's unweighted expert outputs, NS tiles [128 tokens, H], each handed to
    `store(c, tile)` as soon as its last chunk is summed. `hooks` = (fetch, gather_next,
    store); `gather_next(c)` (the next block's rows of sub-tile c; None: gathered
    already) is issued one sub-tile per chunk from chunk 1 on, so those gathers do not
    queue in front of this block's first weight loads (DMA queues run in issue order).
    Gate/up passes span m chunks (`merge` = (m, serial), `merged_chunks`); the down
    projection runs per chunk (`serial`: one down-weight tile live at a time)."""
    fetch, gather_next, store, keep = hooks
    m, serial = merge
    h, ns, dt, ti = d["H"], d["NS"], d["dt"], cfg["tile_i"]
    nic = cdiv(d["I"], ti)
    # one chunk: results go straight to dtype; several: fp32 sums, cast by the store DMA
    y_dt = dt if nic == 1 else nl.float32
    y = [nl.ndarray((P, h), dtype=y_dt, buffer=nl.sbuf) for _ in range(ns)]
    # SwiGLU's fp32 scratch lives across chunks: allocated per chunk it would take a
    # dead weight unit's SBUF and wait for that unit's last matmul (write after read)
    # (i_outer: one per I tile, its units are whole strips)
    sg = None
    if cfg["loop_order"] == "h_outer":
        sg = nl.ndarray((P, d["B"]), dtype=nl.float32, buffer=nl.sbuf)
    pcfg = cfg if m == 1 else {**cfg, "tile_i": m * ti, "dma_h": cfg["dma_h"] // m}
    for ic0 in range(0, nic, m):
        chunks = range(ic0, min(ic0 + m, nic))
        # (no name may outlive the pass: a live tile keeps its SBUF, and the next pass's
        # tiles would take other buffers with other last readers). A merged pass loads
        # its other chunks' down weights after its gate/up units are issued: queued at
        # the pass start they delay the units TensorE waits for (DMA queues run in order)
        wds = [_load_down(d, ti, w_down, exp, ic0)]
        for ic in chunks:
            if gather_next is not None and 1 <= ic <= ns:
                gather_next(ic - 1)
        pw = min(m * ti, d["I"] - ic0 * ti)  # the pass's columns
        act = nl.ndarray((P, cdiv(pw, P), d["B"]), dtype=dt, buffer=nl.sbuf)
        if cfg["loop_order"] == "h_outer":
            _gate_up_h_outer(d, pcfg, fetch, xT, (ic0 * ti, pw), act, sg, keep)
        else:
            _gate_up_i_outer(d, fetch(), xT, (ic0 * ti, pw), act, keep)
        if chunks[-1] == nic - 1:
            fetch(last=True)
        if not serial:
            wds += [_load_down(d, ti, w_down, exp, ic) for ic in chunks[1:]]
        for q, ic in enumerate(chunks):
            if serial and q:  # the previous tile dies first: this one takes its SBUF
                wds.pop()
                wds.append(_load_down(d, ti, w_down, exp, ic))
            icw = min(ti, d["I"] - ic * ti)
            last = store if ic == nic - 1 else None
            _down_proj(d, cfg, act, wds[-1 if serial else q], (icw, q * cdiv(ti, P)), ic, y, last)
        del act, wds


def _load_down(d: dict[str, Any], ti: int, w_down: Any, exp: Any, ic: int) -> Any:
    """Chunk ic's down-projection weights [128 I rows, I tiles, H]."""
    icw = min(ti, d["I"] - ic * ti)
    wd = nl.ndarray((P, cdiv(icw, P), d["H"]), dtype=d["dt"], buffer=nl.sbuf)
    load_k_major(w_down, (exp["exp"], exp["dn"]), (ic * ti, icw), (0, d["H"]), wd, d["dn_t"])
    return wd


def _gate_up_h_outer(
    d: dict[str, Any],
    cfg: dict[str, Any],
    fetch: Any,
    xT: Any,
    chunk: tuple[int, int],
    act: Any,
    sg: Any,
    keep: Any,
) -> None:
    """act = SwiGLU of the chunk's gate/up projections, weight units in H order (and,
    with `keep`, the projections saved)."""
    i0, icw = chunk
    bsz, nit = d["B"], cdiv(icw, P)
    acc = psum_accumulators(2 * nit, bsz)
    g_ps, u_ps = acc[0::2], acc[1::2]
    for h0 in range(0, d["HT"], cfg["dma_h"]):
        wg, wu = fetch()
        nj = min(cfg["dma_h"], d["HT"] - h0)
        steps = [(j, it) for j in range(nj) for it in range(nit)]
        if h0 + nj == d["HT"]:
            # the last unit finishes one I tile at a time, so ScalarE / VectorE evaluate
            # SwiGLU of tile it while TensorE contracts the next (each accumulator still
            # sums its H tiles in ascending order: the same results)
            steps = [(j, it) for it in range(nit) for j in range(nj)]
        for j, it in steps:
            ht = h0 + j
            hr = tile_rows(d["H"], ht)
            cw = min(P, icw - it * P)
            for n0 in range(0, bsz, PSUM_FP32):
                nw = min(PSUM_FP32, bsz - n0)
                mov = xT[0:hr, ht, n0 : n0 + nw]
                cols = slice(it * P, it * P + cw)
                _mm2(g_ps[it][0:cw, n0 : n0 + nw], wg[0:hr, j, cols], mov, ht != 0)
                _mm2(u_ps[it][0:cw, n0 : n0 + nw], wu[0:hr, j, cols], mov, ht != 0)
        del wg, wu
    for it in range(nit):
        # the last I tile's SwiGLU is what the down projection waits for: per 128-token
        # sub-tile, so its first matmuls (sub-tile 0) start after a quarter of it
        pieces = d["NS"] if it == nit - 1 else 1
        _swiglu(g_ps[it], u_ps[it], act, it, min(P, icw - it * P), sg, pieces)
        if keep is not None:
            keep(i0 + it * P, min(P, icw - it * P), g_ps[it], u_ps[it])


def _gate_up_i_outer(
    d: dict[str, Any], unit: tuple[Any, Any], xT: Any, chunk: tuple[int, int], act: Any, keep: Any
) -> None:
    wg, wu = unit
    i0, icw = chunk
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
        sg = nl.ndarray((P, bsz), dtype=nl.float32, buffer=nl.sbuf)
        _swiglu(g_ps, u_ps, act, it, cw, sg)
        if keep is not None:
            keep(i0 + it * P, cw, g_ps, u_ps)
        del sg  # (a tile lives while referenced: not across the next I tile's matmuls)


def _mm2(dst: Any, stationary: Any, moving: Any, accumulate: bool) -> None:
    nisa.nc_matmul(dst=dst, stationary=stationary, moving=moving, accumulate=accumulate)


def _swiglu(g_ps: Any, u_ps: Any, act: Any, it: int, cw: int, sg: Any, pieces: int = 1) -> None:
    """act[:, it, :] = silu(g) * u: ScalarE reads the gate PSUM (into sg, fp32), VectorE
    the up PSUM; in `pieces` equal column ranges (elementwise: the same results)."""
    n = g_ps.shape[1]
    step = cdiv(n, pieces)
    for c0 in range(0, n, step):
        c = slice(c0, min(n, c0 + step))
        nisa.activation(dst=sg[0:cw, c], op=nl.silu, data=g_ps[0:cw, c])
        nisa.tensor_tensor(
            dst=act[0:cw, it, c], data1=sg[0:cw, c], data2=u_ps[0:cw, c], op=nl.multiply
        )


def _down_proj(
    d: dict[str, Any],
    cfg: dict[str, Any],
    act: Any,
    wd: Any,
    cols: tuple[int, int],
    ic: int,
    y: list[Any],
    store: Any,
) -> None:
    """y[c] (+)= act[:, it0 + it, c]^T @ wd over this chunk's I tiles (cols = (its
    columns, its first I tile in act)), per 128-token sub-tile;
    in the last chunk (`store` given) each finished y[c] is stored at once, so the
    block's output DMAs spread over its last down projection instead of queueing at
    its end in front of the next block's loads."""
    (icw, it0), (h, dn) = cols, (d["H"], cfg["down_n"])
    nit = cdiv(icw, P)
    for c in range(d["NS"]):
        for n0 in range(0, h, dn):
            nw = min(dn, h - n0)
            ps = nl.ndarray((P, dn), dtype=nl.float32, buffer=nl.psum)
            for it in range(nit):
                cw = min(P, icw - it * P)
                nisa.nc_matmul(
                    dst=ps[:, 0:nw],
                    stationary=act[0:cw, it0 + it, c * P : (c + 1) * P],
                    moving=wd[0:cw, it, n0 : n0 + nw],
                    accumulate=it != 0,
                )
            dst = y[c][:, n0 : n0 + nw]
            if ic == 0:
                nisa.tensor_copy(dst=dst, src=ps[:, 0:nw], engine=nisa.engine.scalar)
            else:
                nisa.tensor_tensor(dst=dst, data1=dst, data2=ps[:, 0:nw], op=nl.add)
        if store is not None:
            store(c, y[c])


@nki.jit
def moe_mlp_fwd(
    hidden,
    w_gate_up,
    w_down,
    slot_token,
    block_expert,
    kind_bounds,
    token_slot,
    token_weight,
    save_cols,
    save_holes,
    static_kinds,
    may_drop,
    block_size,
    tile_i,
    loop_order,
    down_n,
    w_bufs,
    dma_h,
    static_holes=None,
    w_up=None,
    transposed=(False, False),
):
    """The NKI entry point of `moe_mlp_fwd_body` (same arguments; see its docstring)."""
    return moe_mlp_fwd_body(
        hidden, w_gate_up, w_down, slot_token, block_expert, kind_bounds, token_slot, token_weight,
        save_cols, save_holes, static_kinds, may_drop, block_size, tile_i, loop_order, down_n,
        w_bufs, dma_h, static_holes, w_up, transposed,
    )  # fmt: skip
