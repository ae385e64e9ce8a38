"""The backward pipeline shared by the RMSNorm and LayerNorm backward kernels (inlined).

Per row (stats saved by the forward; RMSNorm is the case mean = 0 without A and db;
g = dy * w, H = hidden size):
    p     = (x - mean) * dy                  VectorE (LayerNorm: one scalar_tensor_tensor)
                                             or VectorE + GpSimd (RMSNorm: tensor_tensor)
    dw   += sum_rows(p * rstd)               TensorE: p block^T @ rstd column (PSUM)
    db   += sum_rows(dy)                     TensorE: dy block^T @ ones column (PSUM)
    B     = sum_h(p * w)                     GpSimd product, ScalarE add-reduce
    A     = sum_h(g)                         ScalarE add-reduce (LayerNorm)
    c1    = -rstd^3 * B / H ;  c0 = -rstd * A / H - c1 * mean       per row (VectorE)
    dx    = g * rstd + (x * c1 + c0)         ScalarE into PSUM, then one VectorE STT
Engines: VectorE's shares of the products with dy read dy from a PSUM copy made on
TensorE (an identity matmul, exact for bf16 / fp16): a VectorE instruction with a PSUM
operand costs 1 cycle per element instead of 2. GpSimd, which cannot read PSUM, takes
the last `gpsimd_eighths` / 8 of each row's columns from SBUF, one instruction per row
(its start-up paid once), and most of p * w (two SBUF operands: as slow on VectorE,
which has the PSUM-fed work). x * c1 + c0 goes to a PSUM bank (ScalarE), so the final
combine reads one PSUM operand as well. Every intermediate is fp32 (bf16 * bf16 products
are exact there); dx is rounded once.

Statistics: a resident plan computes the row statistics itself from the x tile it holds
(`stats` None: the forward's own statistics hooks, `rmsnorm.HOOKS` / `layernorm.HOOKS`,
so eps and the formulas are the forward's): their partial sums in a first stage S one
step ahead of A, the per-row rstd / mean at the head of A. A streamed plan loads the
statistics saved by a statistics kernel (x is read once more there).

Pipeline (tiling.run_pipeline; per step the oldest tile's D first, then S, A of the newest):
    S: (inline statistics) load; the statistics' partial sums (ScalarE, LayerNorm's sum
       of x on VectorE)
    A: [loads]; [rstd, mean]; per chunk and row group: p (into the kept row-sum tile),
       the column sums on TensorE one PSUM bank behind the products, LayerNorm's g (kept)
    Q: RMSNorm: p * w in place                      (deferred row sums with a weight)
    R: the row sums on ScalarE, one step after their operands
    D: c1, c0; [RMSNorm: g again]; x * c1 + c0; dx; store
Wide row tiles (see DEFER_MAX_BYTES) take their row sums chunk by chunk in A instead.
"""

from __future__ import annotations

from typing import Any

from ..dtypes import dtype_bytes
from ..nki import nisa, nl
from .layernorm import HOOKS as LN_HOOKS
from .layernorm import LN_VECTOR, STATS_MIXED, STATS_SCALAR
from .rmsnorm import HOOKS as RMS_HOOKS
from .rmsnorm import SCALE_VECTOR
from .tiling import (
    P,
    col_chunks,
    colsum_add,
    colsum_init,
    each_chunk,
    identity,
    issue_rows_load,
    load_row_vector,
    pipeline_jobs,
    prefetch_depth,
    prefetch_start,
    prefetch_take,
    programs,
    ring,
    ring_alloc,
    rings,
    row_segments,
    rows_view,
    run_pipeline,
    scratch,
    stats_alloc,
    stats_load,
    temp,
    tt_split,
)

PSUM_COLS = 512  # fp32 columns of one PSUM bank
PSUM_RING = 3  # PSUM banks x * c1 + c0 rotates through
DY_RING = 2  # PSUM banks the dy copies rotate through (with the column sums: <= 7 of 8)
NSTAGES = 3  # A: loads, gradient terms; R: row sums; D: dx coefficients, dx, its store


# A resident tile's row sums are deferred to stage R (from fp32 [P, kk, H] tiles kept in
# SBUF, LayerNorm also keeping g) when one such tile takes at most this many bytes per
# partition; wider tiles take their row sums chunk by chunk in stage A, g is recomputed.
DEFER_MAX_BYTES = 16384
# In-kernel statistics pass over at most this many bytes of columns per instruction: their
# discarded output (x's dtype for RMSNorm, fp32 for LayerNorm) stays small next to the
# row tiles (4096 bf16 / 2048 fp32 columns).
STATS_JUNK_BYTES = 8192


def stats_cols(chunk: int, junk_bytes: int) -> int:
    """Columns per instruction of the in-kernel statistics pass (`junk_bytes` per element
    of its discarded output)."""
    return min(chunk, STATS_JUNK_BYTES // junk_bytes)


def bwd_defer(resident: bool, kk: int, hdim: int) -> bool:
    """Whether a plan defers its row sums to stage R (see DEFER_MAX_BYTES)."""
    return resident and kk * hdim * 4 <= DEFER_MAX_BYTES


def bwd_inline(resident: bool) -> bool:
    """Whether a plan computes the row statistics itself (resident plans: x is in SBUF)."""
    return resident


def bwd_stages(
    ln: bool, resident: bool, has_weight: bool, kk: int, hdim: int, inline: bool | None = None
) -> int:
    """Pipeline stages of a backward plan: statistics computed in the kernel (`inline`,
    default `bwd_inline(resident)`) add a stage S before A; RMSNorm with a weight and
    deferred row sums adds a stage Q (p * w on GpSimd) between A and R; every resident
    tile is held through all."""
    q = not ln and has_weight and bwd_defer(resident, kk, hdim)
    return NSTAGES + q + (bwd_inline(resident) if inline is None else inline)


def inline_stats_mode(dtype: Any) -> str:
    """LayerNorm's statistics method when the backward computes them (the forward
    heuristic's choice: shifted ScalarE sums for fp32, VectorE's plain sum of x with
    ScalarE's shifted squares otherwise)."""
    return STATS_SCALAR if dtype == nl.float32 else STATS_MIXED


def bwd_rows(
    dy: Any,
    x: Any,
    w: Any,
    stats: tuple[Any, ...] | None,
    plan: dict[str, Any],
    dh: Any = None,
    has_bias: bool = False,
    ln: bool = False,
    eps: float = 0.0,
) -> dict[str, Any]:
    """Run the backward over every row tile; returns the context: ctx["dx"] ([N, H] HBM),
    ctx["acc_w"] / ctx["acc_b"] (column-sum accumulators of dw / db, or None).

    `stats` is (rstd,) for RMSNorm or (mean, rstd) for LayerNorm ([N] fp32 HBM each), or
    None: a resident plan computes them from x with the forward's statistics and `eps`;
    `dh` (RMSNorm only) is added to dx.
    """
    n, hdim = x.shape
    inline = stats is None
    assert not inline or plan["resident"], "statistics computed in-kernel need a resident plan"
    assert not inline or eps > 0, f"eps: expected > 0 with in-kernel statistics; got {eps}"
    nstats = 2 if ln else 1
    if inline:  # the forward hooks read these plan fields
        plan = {**plan, "scale_mode": LN_VECTOR if ln else SCALE_VECTOR}
        plan["stats"] = inline_stats_mode(x.dtype)
    ctx = {
        "dx": nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm),
        "ln": ln,
        "plan": plan,
        "chunks": col_chunks(hdim, plan["chunk"]),
        "w_sb": load_row_vector(w, hdim),
        "acc_w": colsum_init(hdim) if w is not None else None,
        "acc_b": colsum_init(hdim) if has_bias else None,
        "eye": identity(dy.dtype) if dy.dtype != nl.float32 else None,
        "junk_dy": scratch(plan["chunk"], x.dtype) if ln and w is None else None,
        # the forward's statistics hooks (inline): their discarded outputs, eps, x
        "hooks": (LN_HOOKS if ln else RMS_HOOKS) if inline else None,
        "x": x,
        "eps": eps,
        # row sums one step later (stage R) from kept tiles, or chunk by chunk in A
        "defer": bwd_defer(plan["resident"], plan["k"], hdim),
        "keep_g": ln and w is not None and bwd_defer(plan["resident"], plan["k"], hdim),
        "split_q": not ln and w is not None and bwd_defer(plan["resident"], plan["k"], hdim),
        "rings": rings(),
        "stats": stats if stats is not None else (None,) * nstats,
        "loads": (("x", x), ("dy", dy), ("dh", dh)),
        "has_dh": dh is not None,
    }
    # per step: dx of the oldest tile, the products of the newest, then the rest, so that
    # each engine's share of one stage waits on other engines only for work of earlier
    # steps (or, within dx, for the few coefficient instructions VectorE issues first)
    if inline:  # what the statistics hooks read: column pieces of <= STATS_JUNK_BYTES
        jdt = nl.float32 if ln else x.dtype
        scols = stats_cols(plan["chunk"], 4 if ln else dtype_bytes(x.dtype))
        ctx["sctx"] = {
            "x": x,
            "eps": eps,
            "plan": plan,
            "chunks": col_chunks(hdim, scols),
            "junk": scratch(scols, jdt),
        }
    stages = [_stage_a, _stage_r, _stage_d]
    if ctx["split_q"]:
        stages.insert(1, _stage_q)
    if inline:
        stages[0:1] = [_stage_s, _stage_a_inline]
    order = (len(stages) - 1, *range(len(stages) - 1))
    seg_begin = stats_alloc if inline else stats_load
    segs = row_segments(n, plan["k"], *programs())
    jobs = pipeline_jobs(segs, len(stages), plan["resident"], ctx["chunks"], step_order=order)
    ahead = prefetch_depth(plan["resident"], plan["bufs"], len(stages))
    if ctx["hooks"] is not None:
        # with in-kernel statistics dy and dh, first read in stage A, have one buffer
        # fewer than x: a slot is refilled while its tile is in stage D (the DMA waits for
        # D's reads), where x must be in SBUF a step earlier, for stage S
        ctx["ring_depths"] = {n: plan["bufs"] - 1 for n, _ in ctx["loads"] if n != "x"}
    ctx["pf"] = prefetch_start(jobs, ahead, issue_rows_load, ctx)
    run_pipeline(ctx, segs, stages, seg_begin, step_order=order)
    return ctx


# --- stages ----------------------------------------------------------------------------
def _stage_s(ctx: dict[str, Any], tile: Any, sbufs: Any) -> dict[str, Any]:
    """Load the tile; the partial sums of its statistics (the forward's hooks)."""
    hooks = ctx["hooks"]
    acc = hooks["init"](ctx["sctx"], tile)
    ld = prefetch_take(ctx["pf"])
    each_chunk(ctx["sctx"], tile, ld, hooks["chunk"], acc)
    return {"tile": tile, "ld": ld, "acc": acc, "sbufs": sbufs}


def _stage_a_inline(ctx: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """The statistics from stage S's sums (VectorE, [rows, kk]), then stage A."""
    out = ctx["hooks"]["finish"](ctx["sctx"], st["tile"], st["acc"], st["sbufs"])
    cols = out[:2] if ctx["ln"] else (out,)
    return _gradient_terms(ctx, st["tile"], cols, st["ld"])


def _stage_a(ctx: dict[str, Any], tile: Any, sbufs: Any) -> dict[str, Any]:
    """Load (resident); the loaded statistics; then the gradient terms."""
    rows, kk, off = tile[1], tile[2], tile[4]
    cols = tuple([s[0:rows, off : off + kk] for s in sbufs])
    ld = prefetch_take(ctx["pf"]) if ctx["plan"]["resident"] else None
    return _gradient_terms(ctx, tile, cols, ld)


def _gradient_terms(ctx: dict[str, Any], tile: Any, cols: Any, ld: Any) -> dict[str, Any]:
    """Per chunk: p, the column sums (TensorE), g and the row-sum operands."""
    kk = tile[2]
    hdim = ctx["dx"].shape[1]
    st = {
        "tile": tile,
        "cols": cols,
        "sums": tuple(
            [
                nl.ndarray((P, kk, len(ctx["chunks"])), dtype=nl.float32, buffer=nl.sbuf)
                for _ in range(2 if ctx["ln"] else 1)
            ]
        ),
        # operands of the row sums, reduced in stage R so that ScalarE never waits for
        # this tile's products within a step; g is also dx's (stage D)
        "q": None,
        "g": None,
    }
    if ctx["defer"]:  # held until stage R
        depth = 4 if ctx["split_q"] else 2
        st["q"] = ring_alloc(ring(ctx, "q"), depth, (P, kk, hdim), nl.float32)
    if ctx["keep_g"]:
        st["g"] = ring_alloc(ring(ctx, "g"), NSTAGES, (P, kk, hdim), nl.float32)  # to D
    st["ld"] = ld
    each_chunk(ctx, tile, ld, _pass1_chunk, st)
    return st


def _stage_q(ctx: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """q = p * w in place (RMSNorm, deferred row sums), mostly on GpSimd."""
    rows, kk = st["tile"][1], st["tile"][2]
    # GpSimd takes 6/8 of p * w (VectorE the rest, at 2 cycles per element), all of it
    # when VectorE also adds dh (modeled best, cost model v1)
    eng = (8 if ctx["has_dh"] else 6) if ctx["plan"]["gpsimd_eighths"] > 0 else 0
    for j in range(kk):
        q = st["q"][0:rows, j, :]
        tt_split(q, q, ctx["w_sb"][0:rows, :], nl.multiply, eng)
    return st


def _stage_r(ctx: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """The row sums of a resident tile (ScalarE)."""
    rows, kk = st["tile"][1], st["tile"][2]
    for ci, (c0, cw) in enumerate(ctx["chunks"] if ctx["defer"] else ()):
        for j in range(kk):
            col = (slice(0, rows), j, slice(ci, ci + 1))
            _row_sum(st["sums"][0][col], st["q"][0:rows, j, c0 : c0 + cw])
            if st["g"] is not None:
                _row_sum(st["sums"][1][col], st["g"][0:rows, j, c0 : c0 + cw])
    return st


def _stage_d(ctx: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """The per-row coefficients of dx (VectorE, [rows, kk]), then dx per chunk and its
    store (streaming: reloading x and dy)."""
    st["coefs"] = _coefs(ctx, st["tile"], st["sums"], st["cols"])
    each_chunk(ctx, st["tile"], st["ld"], _pass2_chunk, st)
    return st


# --- pass 1: gradient terms ------------------------------------------------------------
def _pass1_chunk(
    ctx: dict[str, Any], tile: Any, ci: int, c0: int, v: dict[str, Any], st: dict[str, Any]
) -> None:
    rows, kk = tile[1], tile[2]
    xc, dyc = v["x"], v["dy"]
    cw = xc.shape[2]
    ln, w_sb, cols = ctx["ln"], ctx["w_sb"], st["cols"]
    wc = w_sb[0:rows, c0 : c0 + cw] if w_sb is not None else None
    # p * w: all on GpSimd when deferred (stage R waits a step for it); else split like
    # the dy products, so that this chunk's row sums (ScalarE) follow at once
    eng = ctx["plan"]["gpsimd_eighths"]
    gpsimd = (8 if eng > 0 else 0) if ctx["defer"] else eng
    rcol, (vw, blocks) = cols[-1], _split(ctx, cw)
    for j in range(kk):
        q = st["q"][0:rows, j, c0 : c0 + cw] if ctx["defer"] else temp(ctx, "q")[0:rows, 0:cw]
        # p: its own row-sum operand without a weight, and stage Q's (in place)
        # (and, deferred, p * w in place once the column sums have read p)
        p = q if w_sb is None or ctx["defer"] else temp(ctx, "p")[0:rows, 0:cw]
        gj = None
        if st["g"] is not None:
            gj = st["g"][0:rows, j, c0 : c0 + cw]
        elif ln and w_sb is not None:
            gj = temp(ctx, "g")[0:rows, 0:cw]
        mcol = cols[0][:, j : j + 1] if ln else None
        xj, dyj = xc[:, j, :], dyc[:, j, :]
        _gpsimd_products(None if ln else p, gj, xj, dyj, wc, vw)
        # per PSUM bank of columns, what consumes block b-1 is issued after the products
        # of block b: TensorE copies dy ahead of the column sums, which wait for p
        for b in range(len(blocks) + 1):
            if b < len(blocks):
                _products(ctx, p, gj, xj, dyj, wc, mcol, blocks[b], vw)
            if b == 0:
                continue
            s0, m = blocks[b - 1]
            sl = slice(s0, s0 + m)
            if ctx["acc_b"] is not None:
                colsum_add(ctx["acc_b"], dyj[:, sl], c0 + s0)
            if w_sb is not None:
                colsum_add(ctx["acc_w"], p[:, sl], c0 + s0, rcol[:, j : j + 1])
        if w_sb is not None and not ctx["split_q"]:
            tt_split(q, p, wc, nl.multiply, gpsimd)
        col = (slice(0, rows), j, slice(ci, ci + 1))
        if not ctx["defer"]:
            _row_sum(st["sums"][0][col], q)
            if gj is not None:
                _row_sum(st["sums"][1][col], gj)
        if ln and w_sb is None:  # no weight: A = sum(dy) now (the copy is discarded)
            _row_sum(st["sums"][1][col], dyj, ctx["junk_dy"][0:rows, 0:cw])


def _split(ctx: dict[str, Any], cw: int) -> tuple[int, list[tuple[int, int]]]:
    """(vw, blocks) for a chunk of cw columns: VectorE takes the products with dy on
    columns [0, vw), GpSimd on [vw, cw) (`gpsimd_eighths` / 8 of them, in whole 128-column
    blocks, one instruction per operand: its 150-cycle start-up is paid once per row);
    `blocks` are the PSUM-bank column blocks of [0, vw), then those of [vw, cw)."""
    e = ctx["plan"]["gpsimd_eighths"]
    vw = cw if cw <= P else min(cw, (cw * (8 - e) // 8 + P // 2) // P * P)
    tail = [(vw + s0, m) for s0, m in col_chunks(cw - vw, PSUM_COLS)] if cw > vw else []
    return vw, (col_chunks(vw, PSUM_COLS) if vw else []) + tail


def _gpsimd_products(p: Any, g: Any, xj: Any, dyj: Any, wc: Any, vw: int) -> None:
    """GpSimd's columns [vw, cw) of p = x * dy and g = dy * w (either may be None)."""
    cw = dyj.shape[1]
    if vw == cw:
        return
    sl = slice(vw, cw)
    for dst, other in ((p, xj), (g, wc)):
        if dst is not None:
            nisa.tensor_tensor(
                dst=dst[:, sl],
                data1=dyj[:, sl],
                data2=other[:, sl],
                op=nl.multiply,
                engine=nisa.engine.gpsimd,
            )


def _products(
    ctx: dict[str, Any], p: Any, g: Any, xj: Any, dyj: Any, wc: Any, mcol: Any, block: Any, vw: int
) -> None:
    """VectorE's share of p = (x - mean) * dy (p None: skipped; mean None: x * dy) and of
    g = dy * w (g None: skipped) on the columns `block` = (s0, m), m <= one PSUM bank,
    reading dy from a TensorE copy in PSUM. LayerNorm's p (a scalar_tensor_tensor, which
    GpSimd lacks) is VectorE's on every block; the rest only on blocks below vw."""
    rows = dyj.shape[0]
    s0, m = block
    sl = slice(s0, s0 + m)
    ln_p = p is not None and mcol is not None
    if s0 >= vw and not ln_p:
        return
    dy_v = dyj[:, sl]
    if ctx["eye"] is not None:
        dyp = ring_alloc(ring(ctx, "dyp"), DY_RING, (P, PSUM_COLS), nl.float32, nl.psum)
        dy_v = dyp[0:rows, 0:m]
        nisa.nc_matmul(
            dst=dy_v, stationary=ctx["eye"][0:rows, 0:rows], moving=dyj[:, sl], accumulate=False
        )
    if ln_p:
        nisa.scalar_tensor_tensor(
            dst=p[:, sl],
            data=xj[:, sl],
            op0=nl.subtract,
            operand0=mcol,
            op1=nl.multiply,
            operand1=dy_v,
        )
    if s0 >= vw:
        return
    for dst, other in ((None if ln_p else p, xj), (g, wc)):
        if dst is not None:
            nisa.tensor_tensor(dst=dst[:, sl], data1=dy_v, data2=other[:, sl], op=nl.multiply)


def _row_sum(dst_col: Any, t: Any, out: Any = None) -> None:
    """dst_col = the sum of t over its free dim (ScalarE copy with add-reduce, written
    back over t -- the same fp32 values -- or into `out`)."""
    nisa.activation(
        dst=t if out is None else out,
        op=nl.copy,
        data=t,
        reduce_op=nl.add,
        reduce_res=dst_col,
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )


def _coefs(ctx: dict[str, Any], tile: Any, sums: Any, cols: Any) -> tuple[Any, Any]:
    """(c0 or None, c1) as [P, kk] fp32: c1 = -rstd^3 * B / H; LayerNorm:
    c0 = -rstd * A / H - c1 * mean."""
    rows, kk = tile[1], tile[2]
    hdim = ctx["dx"].shape[1]
    rcol = cols[-1]
    tot = []
    for s in sums:
        if s.shape[2] == 1:
            tot.append(s[0:rows, :, 0])
            continue
        t = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=t[0:rows, :], op=nl.add, data=s[0:rows, :, :], axis=(2,))
        tot.append(t[0:rows, :])
    c1 = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(
        dst=c1[0:rows, :],
        data=rcol,
        op0=nl.multiply,
        operand0=-1.0 / hdim,
        op1=nl.multiply,
        operand1=rcol,
    )  # -rstd^2 / H
    nisa.tensor_tensor(dst=c1[0:rows, :], data1=c1[0:rows, :], data2=rcol, op=nl.multiply)
    nisa.tensor_tensor(dst=c1[0:rows, :], data1=c1[0:rows, :], data2=tot[0], op=nl.multiply)
    if not ctx["ln"]:
        return None, c1
    mcol = cols[0]
    c0 = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(
        dst=c0[0:rows, :],
        data=tot[1],
        op0=nl.multiply,
        operand0=-1.0 / hdim,
        op1=nl.multiply,
        operand1=rcol,
    )  # -rstd * A / H
    cm = nl.ndarray((P, kk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=cm[0:rows, :], data1=c1[0:rows, :], data2=mcol, op=nl.multiply)
    nisa.tensor_tensor(dst=c0[0:rows, :], data1=c0[0:rows, :], data2=cm[0:rows, :], op=nl.subtract)
    return c0, c1


# --- pass 2: dx ------------------------------------------------------------------------
def _pass2_chunk(
    ctx: dict[str, Any], tile: Any, ci: int, c0: int, v: dict[str, Any], st: dict[str, Any]
) -> None:
    """dx = g * rstd + (x * c1 + c0) [+ dh] for one chunk, then its store."""
    rows, kk = tile[1], tile[2]
    xc, dyc, dhc = v["x"], v["dy"], v.get("dh")
    cw = xc.shape[2]
    w_sb, dx = ctx["w_sb"], ctx["dx"]
    c0_col, c1_col = st["coefs"]
    rcol = st["cols"][-1]
    dxt = ring_alloc(ring(ctx, "dx"), 2, (P, kk, ctx["plan"]["chunk"]), dx.dtype)
    vw, blocks = _split(ctx, cw)
    for j in range(kk):
        gj, recompute = dyc[:, j, :], False
        if st["g"] is not None:
            gj = st["g"][0:rows, j, c0 : c0 + cw]
        elif w_sb is not None:
            # g recomputed: over the tile's row-sum operands when they are kept (stage R
            # has reduced them; the slot's next tile is taken in a later step), else in a
            # temporary
            g2 = st["q"][0:rows, j, :] if st["q"] is not None else temp(ctx, "g2")[0:rows, :]
            gj, recompute = g2[:, c0 : c0 + cw] if st["q"] is not None else g2[:, 0:cw], True
            wc = w_sb[0:rows, c0 : c0 + cw]
            _gpsimd_products(None, gj, None, dyc[:, j, :], wc, vw)
        bias = c0_col[0:rows, j : j + 1] if c0_col is not None else None
        for b in range(len(blocks) + 1):
            if recompute and b < len(blocks):  # g one block ahead of its use
                _products(ctx, None, gj, None, dyc[:, j, :], wc, None, blocks[b], vw)
            if b == 0:
                continue
            s0, m = blocks[b - 1]
            # x * c1 + c0 lands in a PSUM bank so that the VectorE combine below reads one
            # PSUM operand (half the cycles of two SBUF operands)
            xs = ring_alloc(ring(ctx, "xs"), PSUM_RING, (P, PSUM_COLS), nl.float32, nl.psum)
            xsv = xs[0:rows, 0:m]
            nisa.activation(
                dst=xsv,
                op=nl.copy,
                data=xc[:, j, s0 : s0 + m],
                scale=c1_col[0:rows, j : j + 1],
                bias=bias,
            )
            if dhc is not None:
                nisa.tensor_tensor(dst=xsv, data1=xsv, data2=dhc[:, j, s0 : s0 + m], op=nl.add)
            nisa.scalar_tensor_tensor(
                dst=dxt[0:rows, j, s0 : s0 + m],
                data=gj[:, s0 : s0 + m],
                op0=nl.multiply,
                operand0=rcol[:, j : j + 1],
                op1=nl.add,
                operand1=xsv,
            )
    nisa.dma_copy(dst=rows_view(dx, tile)[:, :, c0 : c0 + cw], src=dxt[0:rows, :, 0:cw])
