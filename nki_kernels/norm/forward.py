"""The row-tile pipeline shared by the RMSNorm and LayerNorm forward kernels (inlined).

A kernel supplies four hooks, stored in the context:
    init(ctx, tile) -> acc                      per-tile statistics accumulators
    chunk(ctx, tile, ci, c0, views, acc)        partial statistics of one column chunk
    finish(ctx, tile, acc, sbufs) -> cols       per-row statistics ([rows, kk] columns,
                                                written into the segment buffers `sbufs`)
    scale(ctx, xc, cols)                        xc = normalized xc, in place
and this module runs every row tile through three stages (tiling.run_rows; step t runs
A(t), B(t-1), C(t-2)):
    A: load x [and the residual]; the statistics' partial sums per chunk (`chunk`)
    B: the statistics (`finish`); for a resident tile the normalization in place (`scale`)
    C: y = xn * w + b per chunk, the columns split between VectorE and GpSimd; store y
A streamed tile (rows too wide for SBUF) loads its chunks in A and again in C, where the
residual is re-added (bit-identically) and the chunk normalized before the affine step.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nl
from .tiling import (
    P,
    col_chunks,
    each_chunk,
    load_row_vector,
    prefetch_take,
    programs,
    ring,
    ring_alloc,
    rings,
    row_plan,
    row_segments,
    rows_view,
    run_rows,
    scratch,
    stats_alloc,
    stats_store,
    tt_split,
)

NSTAGES = 3  # A: load + sums, B: statistics + normalization, C: affine + store


def fwd_plan(
    hdim: int,
    rows_per_partition: int,
    chunk: int,
    resident: bool,
    bufs: int,
    gpsimd_eighths: int,
    **choices: tuple[str, tuple[str, ...]],
) -> dict[str, Any]:
    """Check a forward kernel's schedule arguments (`choices`: name=(value, allowed)) and
    resolve the defaults (chunk 0 = the whole row)."""
    assert 0 <= gpsimd_eighths <= 8, f"gpsimd_eighths: 0..8; got {gpsimd_eighths}"
    for name, (value, allowed) in choices.items():
        assert value in allowed, f"{name} must be one of {allowed}; got {value}"
    fields: dict[str, Any] = {name: value for name, (value, _) in choices.items()}
    fields["gpsimd_eighths"] = gpsimd_eighths
    return row_plan(hdim, rows_per_partition, chunk, resident, bufs, NSTAGES, **fields)


def fwd_rows(
    hooks: dict[str, Any],
    x: Any,
    plan: dict[str, Any],
    eps: float,
    nstats: int,
    y: bool = False,
    res: Any = None,
    w: Any = None,
    b: Any = None,
    junk_dtype: Any = None,
) -> dict[str, Any]:
    """Every row tile of this program through the pipeline; returns the outputs:
    "stats" (`nstats` per-row [N] fp32 HBM vectors, filled by the `finish` hook in its
    order), "y" ([N, H] in x's dtype, when `y`; else stages A and B only) and "h" (x + res,
    when `res` is given). `junk_dtype` is the dtype of the statistics passes' discarded
    outputs (default x's).
    """
    n, hdim = x.shape
    outs: dict[str, Any] = {
        "stats": tuple(
            [nl.ndarray((n,), dtype=nl.float32, buffer=nl.shared_hbm) for _ in range(nstats)]
        ),
        "y": nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm) if y else None,
        "h": nl.ndarray((n, hdim), dtype=x.dtype, buffer=nl.shared_hbm)
        if res is not None
        else None,
    }
    ctx = {
        "x": x,
        "y": outs["y"],
        "h": outs["h"],
        "stats": outs["stats"],
        "eps": eps,
        "plan": plan,
        "chunks": col_chunks(hdim, plan["chunk"]),
        "w_sb": load_row_vector(w, hdim),
        "b_sb": load_row_vector(b, hdim),
        "junk": scratch(plan["chunk"], junk_dtype or x.dtype),
        "rings": rings(),
        "loads": (("x", x), ("res", res)),
        "hooks": hooks,
    }
    stages = [_stage_a, _stage_b, _stage_c] if y else [_stage_a, _stage_b]
    segs = row_segments(n, plan["k"], *programs())
    run_rows(ctx, segs, stages, stats_alloc, stats_store, reload_last=y)
    return outs


def _stage_a(ctx: dict[str, Any], tile: Any, sbufs: Any) -> dict[str, Any]:
    """Load the tile (resident) and accumulate its statistics' partial sums."""
    acc = ctx["hooks"]["init"](ctx, tile)
    ld = prefetch_take(ctx["pf"]) if ctx["plan"]["resident"] else None
    each_chunk(ctx, tile, ld, ctx["hooks"]["chunk"], acc)
    return {"tile": tile, "ld": ld, "acc": acc, "sbufs": sbufs}


def _stage_b(ctx: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """The statistics; for a resident tile also the normalization in place."""
    tile, ld = st["tile"], st["ld"]
    rows = tile[1]
    cols = ctx["hooks"]["finish"](ctx, tile, st["acc"], st["sbufs"])
    if ld is not None and ctx["y"] is not None:
        for c0, cw in ctx["chunks"]:
            ctx["hooks"]["scale"](ctx, ld["x"][0:rows, :, c0 : c0 + cw], cols)
    return {"tile": tile, "ld": ld, "cols": cols}


def _stage_c(ctx: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """y per chunk and its store (streaming: reload, re-add, normalize first)."""
    each_chunk(ctx, st["tile"], st["ld"], _out_chunk, st["cols"], st["ld"] is None)
    return st


def _out_chunk(
    ctx: dict[str, Any], tile: Any, ci: int, c0: int, v: dict[str, Any], cols: Any, streamed: bool
) -> None:
    xc = v["x"]
    if streamed:
        if "res" in v:  # h = x + residual again, bit-identical to the h stored in stage A
            nisa.tensor_tensor(dst=xc, data1=xc, data2=v["res"], op=nl.add)
        ctx["hooks"]["scale"](ctx, xc, cols)
    _affine_store(ctx, tile, xc, c0)


def _affine_store(ctx: dict[str, Any], tile: Any, xc: Any, c0: int) -> None:
    """y[tile, c0:c0+cw] = xc * w + b (either may be absent), then its store."""
    rows, kk = tile[1], tile[2]
    cw = xc.shape[2]
    plan, w_sb, b_sb, y = ctx["plan"], ctx["w_sb"], ctx["b_sb"], ctx["y"]
    yv = rows_view(y, tile)[:, :, c0 : c0 + cw]
    if w_sb is None and b_sb is None:
        nisa.dma_copy(dst=yv, src=xc)
        return
    eng = plan["gpsimd_eighths"]
    yt = ring_alloc(ring(ctx, "y"), 2, (P, kk, plan["chunk"]), y.dtype)
    for j in range(kk):
        dst, src = yt[0:rows, j, 0:cw], xc[:, j, :]
        if w_sb is not None:
            tt_split(dst, src, w_sb[0:rows, c0 : c0 + cw], nl.multiply, eng)
            src = dst
        if b_sb is not None:
            tt_split(dst, src, b_sb[0:rows, c0 : c0 + cw], nl.add, eng)
    nisa.dma_copy(dst=yv, src=yt[0:rows, :, 0:cw])
