"""Grouped matmul kernels: out[rows of g] = x[rows of g] @ W[g], and its weight gradient.

Forward (`grouped_mm_fwd`), from the block plan of group_plan.py (blocks of s <= NS
128-row sub-tiles, one group each, ordered by s):

    for s = NS .. 1, then the zero blocks:             static: one device loop per kind
        for block b of s sub-tiles (program p of n: b = lo + p, lo + p + n, ...):
            xT  = x[slot_rows[b, :, c]]^T  for c < s     gathers (padding -> 0) in column
                                                         chunks, PE transposes: [K, s*128]
            for each group of 512 * max(1, 4 // s) columns of N:
                acc[c] = 0 for c < s                     PSUM, [128 rows, <= 2048] fp32
                for each chunk of k_tiles K tiles:
                    Wu = W[g][K chunk, cols]             one weight unit (3 in flight)
                    acc[c] += xT[chunk, c]^T @ Wu        per sub-tile c
                out[slot_rows[b, :, c], cols] = acc[c]   scatter, padding skipped

The rows are the partitions of the result, so no output transpose is needed. `s` is
static in every loop body (the plan sorts blocks by s), so a block costs exactly its
sub-tiles: 128-row padding granularity, and the group's weights stream once per block.
The weight layout is "kn" (W [G, K, N]) or "nk" (W [G, N, K], i.e. the transpose is
wanted: the backward's dx = dy @ W^T, and TorchTitan's `w.transpose(-2, -1)` without a
copy); "nk" loads put K on partitions with DMA transposes (2-byte dtypes: gathers of the
group's rows through a uint32 row index built once per block, within NKI's documented
indirect-transpose limits, see tiles.py) or PE transposes.

Weight gradient (`grouped_mm_wgrad`), dW[g] = x_g^T @ dy_g, from the 128-row tile plan:

    for g in 0 .. G-1:                                 static
        for each panel [k0 : k0 + 128, n0 : n0 + PANEL_N] of dW[g]:
            acc = 0 @ 0                                PSUM fp32 (a zero matmul opens it)
            for tile t of group g:                     device loop, run-time bounds
                acc += x[rows_t, k-panel]^T @ dy[rows_t, n-panel]   rows contracted on partitions
            dW[g, panel] = acc

An empty group's loop runs no trip and stores zeros. Each group's sum reads only its own
rows (padding rows are zero-filled gathers), so a NaN in a row of group g reaches dW[g]
only. Under LNC 2 the programs split the N columns (halves in whole PSUM banks), which
balances any routing. Limits: K, N any size (ragged tiles sliced); bf16, fp16 or fp32.
"""

from __future__ import annotations

from typing import Any

from ..dtypes import dtype_bytes
from ..nki import nisa, nki, nl
from .tiles import (
    PSUM_FP32,
    P,
    as_register,
    block_ap,
    cdiv,
    expert_column,
    expert_row_index,
    load_weight_cols,
    load_weight_rows,
    program_columns,
    row_index_ok,
    row_ramp,
    tile_rows,
    transpose_into,
)

# ---- tile sizes -------------------------------------------------------------------------
WGRAD_N_BANKS = 4  # PSUM banks of one weight-gradient panel (the other 4 double-buffer it)
ZERO_COLS = 2048  # columns of the zero tile the zero blocks store (bounds its SBUF)
GATHER_COLS = 2048  # columns of x gathered per DMA chunk before the PE transposes
W_BUFS = 3  # weight units in flight: a unit's load overlaps two units of matmuls
ACC_BANKS = 4  # PSUM banks of one column group's accumulators (the other 4: the next group)


def _program() -> tuple[int, int]:
    if nl.program_ndim() == 0 or nl.num_programs(0) == 1:
        return 0, 1
    return nl.program_id(0), nl.num_programs(0)


@nki.jit
def grouped_mm_fwd(
    x, w, slot_rows, block_group, kind_bounds, w_layout, unit_bytes, static_kinds=None
):
    """out [M, N] = grouped x @ W (zeros in the zero blocks' rows).

    x [M, K]; w [G, K, N] ("kn") or [G, N, K] ("nk"); slot_rows [NB, 128, NS] int32;
    block_group [NB, 1] int32; kind_bounds [1, NS + 2] int32; unit_bytes: bytes per
    partition of one weight unit (its K rows follow from its width). `static_kinds`
    (pricing: the plan known when specializing): the block count of each kind, run as
    static loops instead of device loops over kind_bounds (the same loop bodies).
    """
    m, k = x.shape
    assert w_layout in ("kn", "nk"), "grouped_mm_fwd: w_layout is 'kn' or 'nk'"
    n = w.shape[2] if w_layout == "kn" else w.shape[1]
    kw_ = w.shape[1] if w_layout == "kn" else w.shape[2]
    assert kw_ == k, "grouped_mm_fwd: inconsistent shapes"
    _, parts, ns = slot_rows.shape
    assert parts == P, "grouped_mm_fwd: slot_rows is [NB, 128, NS]"
    pid, nprog = _program()
    d = {"M": m, "K": k, "N": n, "NS": ns, "KT": cdiv(k, P), "dt": x.dtype}
    d["layout"], d["unit_bytes"] = w_layout, unit_bytes
    out = nl.ndarray((m, n), dtype=x.dtype, buffer=nl.shared_hbm)
    ts = (x, w, out, slot_rows, block_group)
    d["ramp"] = None
    if w_layout == "nk" and row_index_ok(w):  # the widest unit's N rows
        d["ramp"] = row_ramp(cdiv(min(n, PSUM_FP32 * ACC_BANKS), P))
    if static_kinds is not None:
        start = 0
        for j, count in enumerate(static_kinds):
            for b in range(start + pid, start + count, nprog):
                _kind_block(d, ts, (as_register(b), 0), ns - j)
            start += count
        return out
    bnd = nl.ndarray((1, ns + 2), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=bnd, src=kind_bounds)
    for j in range(ns + 1):
        lo = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=lo, data=bnd[0:1, j : j + 1], op0=nl.add, operand0=pid)
        lo_r = nisa.register_alloc()
        nisa.register_load(lo_r, lo)
        hi_r = nisa.register_alloc()
        nisa.register_load(hi_r, bnd[0:1, j + 1 : j + 2])

        def body(i: Any, s: int = ns - j) -> None:
            _kind_block(d, ts, (i, 0), s)

        nl.fori_loop(lo_r, hi_r, body, step=nprog)
    return out


def _kind_block(d: dict[str, Any], ts: tuple[Any, ...], addr: Any, s: int) -> None:
    if s:
        _fwd_block(d, ts, addr, s)
    else:
        _zero_block(d, ts[2], ts[3], addr)


def _zero_block(d: dict[str, Any], out: Any, slot_rows: Any, addr: Any) -> None:
    """out[rows of a zero block] = 0 (rows past offs[-1])."""
    n, ns = d["N"], d["NS"]
    tok = nl.ndarray((P, ns), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tok, src=block_ap(slot_rows, addr, [[ns, P], [1, ns]]))
    cols = min(n, ZERO_COLS)
    z = nl.ndarray((P, cols), dtype=out.dtype, buffer=nl.sbuf)
    nisa.memset(dst=z, value=0.0)
    for c in range(ns):
        for n0 in range(0, n, cols):
            nw = min(cols, n - n0)
            view = out.ap(
                [[n, P], [1, nw]], offset=n0, vector_offset=tok[:, c : c + 1], indirect_dim=0
            )
            nisa.dma_copy(dst=view, src=z[:, 0:nw], oob_mode=nisa.oob_mode.skip)


def _fwd_block(d: dict[str, Any], ts: tuple[Any, ...], addr: Any, s: int) -> None:
    x, w, out, slot_rows, block_group = ts
    k, n, ns, kt, dt = d["K"], d["N"], d["NS"], d["KT"], d["dt"]
    tok = nl.ndarray((P, ns), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tok, src=block_ap(slot_rows, addr, [[ns, P], [1, ns]]))
    grp = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=grp, src=block_ap(block_group, addr, [[1, 1], [1, 1]]))
    index = None
    if d["ramp"] is not None:
        grp_col = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
        expert_column(block_group, addr, grp_col)
        index = nl.ndarray(d["ramp"].shape, dtype=nl.uint32, buffer=nl.sbuf)
        expert_row_index(w, grp_col, d["ramp"], index)
    xT = nl.ndarray((P, kt, s * P), dtype=dt, buffer=nl.sbuf)
    parity = 0
    for g0 in range(0, k, GATHER_COLS):  # rows gathered in column chunks (bounds SBUF)
        gw = min(GATHER_COLS, k - g0)
        xs = nl.ndarray((P, s, GATHER_COLS), dtype=dt, buffer=nl.sbuf)
        for c in range(s):  # padding rows keep stale values: their outputs are never stored
            _gather_cols(x, tok[:, c : c + 1], xs[:, c, :], g0, gw, zero=False)
        for t in range(g0 // P, cdiv(g0 + gw, P)):
            cols = slice(t * P - g0, t * P - g0 + tile_rows(k, t))
            parity = transpose_into(dt, [xs[:, c, cols] for c in range(s)], xT[:, t, :], parity)
    # weight units [K chunk of kc * 128 rows, width columns] in (column group, K chunk)
    # order, W_BUFS buffers; unit u + W_BUFS - 1's load is issued before unit u's matmuls
    # (the DMA queues run in issue order: issued after a tile's output stores, a load would
    # wait on them). Small blocks take wider units (longer contiguous DMA runs): their
    # s x width / 512 accumulators stay within ACC_BANKS PSUM banks.
    width = min(n, PSUM_FP32 * max(1, ACC_BANKS // s))
    kc = max(1, min(kt, d["unit_bytes"] // (width * dtype_bytes(dt))))
    units = [
        (n0, min(width, n - n0), t0, min(kc, kt - t0))
        for n0 in range(0, n, width)
        for t0 in range(0, kt, kc)
    ]
    wbufs = [nl.ndarray((P, kc, width), dtype=dt, buffer=nl.sbuf) for _ in range(W_BUFS)]
    for u in range(min(W_BUFS - 1, len(units))):
        _load_unit(d, w, (grp, index), units[u], wbufs[u])
    acc: list[list[Any]] = []
    for u, (n0, nw, t0, tw) in enumerate(units):
        ahead = u + W_BUFS - 1
        if ahead < len(units):
            _load_unit(d, w, (grp, index), units[ahead], wbufs[ahead % W_BUFS])
        wt = wbufs[u % W_BUFS]
        nq = cdiv(nw, PSUM_FP32)
        if t0 == 0:
            acc = [
                [nl.ndarray((P, PSUM_FP32), dtype=nl.float32, buffer=nl.psum) for _ in range(nq)]
                for _ in range(s)
            ]
        for c in range(s):
            for q in range(nq):
                qw = min(PSUM_FP32, nw - q * PSUM_FP32)
                for t in range(t0, t0 + tw):
                    nisa.nc_matmul(
                        dst=acc[c][q][:, 0:qw],
                        stationary=xT[0 : tile_rows(k, t), t, c * P : (c + 1) * P],
                        moving=wt[0 : tile_rows(k, t), t - t0, q * PSUM_FP32 : q * PSUM_FP32 + qw],
                        accumulate=t != 0,
                    )
        if t0 + tw == kt:
            _store_rows(d, out, tok, acc, n0, nw)


def _load_unit(d: dict[str, Any], w: Any, ex: Any, unit: tuple[int, ...], dst: Any) -> None:
    """dst[:, 0:tw, 0:nw] = W[grp][K tiles t0 .. t0 + tw, n0 : n0 + nw], K on partitions
    (ex = (grp, its row index or None))."""
    n0, nw, t0, tw = unit
    rows = min(tw * P, d["K"] - t0 * P)
    if d["layout"] == "kn":
        load_weight_rows(w, ex[0], t0 * P, rows, n0, nw, dst[:, 0:tw, 0:nw])
    else:
        load_weight_cols(w, ex, n0, nw, t0 * P, rows, dst[:, 0:tw, 0:nw])


def _store_rows(
    d: dict[str, Any], out: Any, tok: Any, acc: list[list[Any]], n0: int, nw: int
) -> None:
    """out[block rows, n0 : n0 + nw] = acc (PSUM -> dtype -> scatter; padding skipped)."""
    n = d["N"]
    for c, banks in enumerate(acc):
        o = nl.ndarray((P, len(banks) * PSUM_FP32), dtype=out.dtype, buffer=nl.sbuf)
        for q, ps in enumerate(banks):
            qw = min(PSUM_FP32, nw - q * PSUM_FP32)
            eng = nisa.engine.scalar if (c + q) % 2 else nisa.engine.vector
            cols = slice(q * PSUM_FP32, q * PSUM_FP32 + qw)
            nisa.tensor_copy(dst=o[:, cols], src=ps[:, 0:qw], engine=eng)
        view = out.ap([[n, P], [1, nw]], offset=n0, vector_offset=tok[:, c : c + 1], indirect_dim=0)
        nisa.dma_copy(dst=view, src=o[:, 0:nw], oob_mode=nisa.oob_mode.skip)


@nki.jit
def grouped_mm_wgrad(x, dy, tile_rows_, group_bounds):
    """dW [G, K, N] (dtype of x) = per group x_g^T @ dy_g (module docstring).

    x [M, K]; dy [M, N]; tile_rows_ [NT, 128, 1] int32; group_bounds [1, G + 1] int32.
    """
    k, n = x.shape[1], dy.shape[1]
    g_count = group_bounds.shape[1] - 1
    dw = nl.ndarray((g_count, k, n), dtype=x.dtype, buffer=nl.shared_hbm)
    bnd = nl.ndarray((1, g_count + 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=bnd, src=group_bounds)
    c_lo, c_hi = program_columns(n)
    panel_n = WGRAD_N_BANKS * PSUM_FP32
    zeros = nl.ndarray((P, PSUM_FP32), dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zeros, value=0.0)
    for g in range(g_count):
        lo_r = nisa.register_alloc()
        nisa.register_load(lo_r, bnd[0:1, g : g + 1])
        hi_r = nisa.register_alloc()
        nisa.register_load(hi_r, bnd[0:1, g + 1 : g + 2])
        for k0 in range(0, k, P):
            kw = min(P, k - k0)
            for n0 in range(c_lo, c_hi, panel_n):
                nw = min(panel_n, c_hi - n0)
                acc = nl.ndarray((P, WGRAD_N_BANKS, PSUM_FP32), dtype=nl.float32, buffer=nl.psum)
                nbank = cdiv(nw, PSUM_FP32)
                for q in range(nbank):  # opens the accumulation: the group may have no tile
                    qw = min(PSUM_FP32, nw - q * PSUM_FP32)
                    nisa.nc_matmul(
                        dst=acc[0:kw, q, 0:qw],
                        stationary=zeros[:, 0:kw],
                        moving=zeros[:, 0:qw],
                        accumulate=False,
                    )

                def body(i: Any, pan: tuple[int, ...] = (k0, kw, n0, nw), acc: Any = acc) -> None:
                    _wgrad_tile(x, dy, tile_rows_, (i, 0), pan, acc)

                nl.fori_loop(lo_r, hi_r, body)
                res = nl.ndarray((P, panel_n), dtype=x.dtype, buffer=nl.sbuf)
                for q in range(nbank):
                    qw = min(PSUM_FP32, nw - q * PSUM_FP32)
                    eng = nisa.engine.scalar if q % 2 else nisa.engine.vector
                    cols = slice(q * PSUM_FP32, q * PSUM_FP32 + qw)
                    nisa.tensor_copy(dst=res[0:kw, cols], src=acc[0:kw, q, 0:qw], engine=eng)
                nisa.dma_copy(dst=dw[g, k0 : k0 + kw, n0 : n0 + nw], src=res[0:kw, 0:nw])
    return dw


def _wgrad_tile(x: Any, dy: Any, rows: Any, addr: Any, panel: tuple[int, ...], acc: Any) -> None:
    k0, kw, n0, nw = panel
    idx = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=block_ap(rows, addr, [[1, P], [1, 1]]))
    xt = nl.ndarray((P, P), dtype=x.dtype, buffer=nl.sbuf)
    _gather_cols(x, idx, xt, k0, kw)
    dyt = nl.ndarray((P, WGRAD_N_BANKS * PSUM_FP32), dtype=dy.dtype, buffer=nl.sbuf)
    _gather_cols(dy, idx, dyt, n0, nw)
    for q in range(cdiv(nw, PSUM_FP32)):
        qw = min(PSUM_FP32, nw - q * PSUM_FP32)
        nisa.nc_matmul(
            dst=acc[0:kw, q, 0:qw],
            stationary=xt[:, 0:kw],
            moving=dyt[:, q * PSUM_FP32 : q * PSUM_FP32 + qw],
            accumulate=True,
        )


def _gather_cols(src: Any, idx: Any, dst: Any, c0: int, cw: int, zero: bool = True) -> None:
    """dst[p, :cw] = src[idx[p], c0 : c0 + cw]; out-of-range rows (padding) give zeros
    (`zero`; else they keep what dst held)."""
    if zero:
        nisa.memset(dst=dst[:, 0:cw], value=0.0)
    width = src.shape[1]
    view = src.ap([[width, P], [1, cw]], offset=c0, vector_offset=idx, indirect_dim=0)
    nisa.dma_copy(dst=dst[:, 0:cw], src=view, oob_mode=nisa.oob_mode.skip)
