"""Tiling helpers shared by the norm kernels (inlined into them at specialization).

Row tiles: partition p owns a contiguous block of rows and a tile takes `kk` of them per
partition (one contiguous HBM run per partition), with the ragged tail (fewer than 128
rows) taken by slicing; per-row statistics are gathered per segment of tiles so that
they too move in large DMAs. Column chunks split the hidden dim. `ring_alloc` gives
explicit multi-buffering and `prefetch_*` issues loads ahead of their use.
`colsum_*` reduce values across rows (partitions) on TensorE: each [rows, 128] column
block is the stationary operand of a matmul against a ones column, accumulating its
column sums into one PSUM bank for the whole kernel ([128, ceil(H/128)] fp32, column c at
partition c % 128, column c // 128); at the end the bank is transposed on TensorE so the
result leaves in contiguous 512 B rows.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nl

# --- limits ---------------------------------------------------------------------------
P = 128  # partitions
# One fp32 PSUM bank holds 512 columns of the [128, ceil(H/128)] column-sum layout.
COLSUM_MAX_H = P * 512
# Rows per partition per statistics segment: 8 KiB of fp32 per partition, large enough
# that the statistics move in efficient DMAs, small next to the data tiles.
SEG_COLS = 2048
# Buffers per fp32 temporary: engines chained through one run this far apart.
TEMP_RING = 2


def row_plan(
    hdim: int,
    rows_per_partition: int,
    chunk: int,
    resident: bool,
    bufs: int,
    nstages: int,
    aligned: bool = False,
    **fields: Any,
) -> dict[str, Any]:
    """Check the schedule arguments every row-tile kernel takes and resolve chunk 0 (the
    whole row); `aligned` requires chunks to start at multiples of 128 (column sums);
    `fields` (engine choices) are kept as given."""
    assert rows_per_partition >= 1, f"rows_per_partition must be >= 1; got {rows_per_partition}"
    need = nstages if resident else 2
    assert bufs >= need, f"bufs: >= {need} (resident={resident}); got {bufs}"
    c = hdim if chunk <= 0 else min(chunk, hdim)
    assert not aligned or c == hdim or c % P == 0, (
        f"chunk must be a multiple of {P} or H; got {chunk}"
    )
    return {"k": rows_per_partition, "chunk": c, "resident": resident, "bufs": bufs, **fields}


def rings() -> dict[str, dict[str, Any]]:
    """Named buffer rings for `ring_alloc` (see `ring`)."""
    return {}


def ring(ctx: dict[str, Any], name: str) -> dict[str, Any]:
    """The buffer ring `name` of ctx["rings"], created empty on first use."""
    return ctx["rings"].setdefault(name, {})  # type: ignore[no-any-return]


def row_segments(
    n: int, k: int, pid: int = 0, nprog: int = 1, seg_cols: int = 0
) -> list[dict[str, Any]]:
    """The row tiles of program `pid` of `nprog`, grouped into statistics segments.

    Main block: the first m*P rows (m = n // P); partition p owns rows p*m .. p*m + m - 1
    and tile i takes its rows i*k .. i*k + kk - 1 (kk = k, less at the end), so every
    partition's share of a tile is one contiguous HBM run of kk*H elements. Tiles form
    segments of at most `seg_cols` rows per partition (default 2048): a segment's per-row
    statistics are one [P, cols] SBUF buffer that moves to or from HBM in one DMA with a
    contiguous run per partition. Programs take contiguous ranges of main tiles; the tail
    (n % P rows, one row per partition) is one more segment, taken by the last program.

    A tile is (base, rows, kk, stride, off): partition p, row group j is row
    p*stride + base + j (main: stride = m; tail: base = m*P, stride = 1, kk = 1), and its
    statistics sit in columns off .. off + kk - 1 of its segment's buffer.
    """
    seg_cols = seg_cols or SEG_COLS
    m = n // P
    segs: list[dict[str, Any]] = []
    if m > 0:
        ntiles = (m + k - 1) // k
        per = (ntiles + nprog - 1) // nprog
        i, hi = pid * per, min(ntiles, (pid + 1) * per)
        while i < hi:
            tiles: list[tuple[int, int, int, int, int]] = []
            col0, cols = i * k, 0
            while i < hi and (not tiles or cols + k <= seg_cols):
                kk = min(k, m - i * k)
                tiles.append((i * k, P, kk, m, cols))
                cols += kk
                i += 1
            segs.append(
                {"main": True, "m": m, "col0": col0, "cols": cols, "rows": P, "tiles": tiles}
            )
    tail = n - m * P
    if tail and pid == nprog - 1:
        t = (m * P, tail, 1, 1, 0)
        segs.append({"main": False, "m": m, "col0": m * P, "cols": 1, "rows": tail, "tiles": [t]})
    return segs


def rows_view(t: Any, tile: tuple[int, int, int, int, int]) -> Any:
    """The rows of `tile` in the [N, H] HBM tensor `t`, as [rows, kk, H]."""
    base, rows, kk, stride, _ = tile
    hdim = t.shape[1]
    if stride == 1:
        return t[base : base + rows, :].reshape((rows, 1, hdim))
    return t[0 : P * stride, :].reshape((P, stride, hdim))[:, base : base + kk, :]


def stat_view(v: Any, seg: dict[str, Any]) -> Any:
    """A segment's entries of the per-row [N] HBM vector `v`, as [rows, cols]."""
    if not seg["main"]:
        return v[seg["col0"] : seg["col0"] + seg["rows"]].reshape((seg["rows"], 1))
    m = seg["m"]
    return v[0 : P * m].reshape((P, m))[:, seg["col0"] : seg["col0"] + seg["cols"]]


def stat_tile(seg: dict[str, Any]) -> Any:
    """An SBUF [P, cols] fp32 buffer for one per-row statistic of a segment."""
    return nl.ndarray((P, seg["cols"]), dtype=nl.float32, buffer=nl.sbuf)


def col_chunks(hdim: int, chunk: int) -> list[tuple[int, int]]:
    """Column chunks (c0, width) covering [0, hdim)."""
    return [(c0, min(chunk, hdim - c0)) for c0 in range(0, hdim, chunk)]


def programs() -> tuple[int, int]:
    """(program id, number of programs) of this LNC launch."""
    if nl.program_ndim() == 0:
        return 0, 1
    return nl.program_id(0), nl.num_programs(0)


def ring_alloc(
    ring: dict[str, Any], depth: int, shape: tuple[int, ...], dtype: Any, buffer: Any = None
) -> Any:
    """A tile of a ring of `depth` buffers allocated once and handed out in rotation
    (depth 1: one buffer, no overlap; depth 2: double buffering; ...).

    Each slot keeps its address for the whole kernel, so a tile only ever waits for the
    readers of the tile `depth` allocations earlier, never for an unrelated buffer that a
    fresh allocation could land on. A slot asked for another shape is reallocated.
    """
    slots = ring.setdefault("slots", [])
    i = ring.get("next", 0)
    ring["next"] = (i + 1) % depth
    buf = nl.sbuf if buffer is None else buffer
    if i < len(slots):
        t = slots[i]
        if tuple(t.shape) == tuple(shape) and t.dtype == dtype and t.buffer == buf:
            return t
    t = nl.ndarray(shape, dtype=dtype, buffer=buf)
    if i < len(slots):
        slots[i] = t
    else:
        slots.append(t)
    return t


def load_row_vector(v: Any, hdim: int) -> Any:
    """A [H] HBM vector broadcast to every partition: [P, H] in SBUF (one DMA); None
    for None (an absent weight or bias)."""
    if v is None:
        return None
    t = nl.ndarray((P, hdim), dtype=v.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=v.reshape((1, hdim)).broadcast(0, P))
    return t


def temp(ctx: dict[str, Any], name: str) -> Any:
    """A [P, chunk] fp32 temporary from its own TEMP_RING-buffer ring (stable addresses, so
    it only ever waits on its own previous use)."""
    return ring_alloc(ring(ctx, name), TEMP_RING, (P, ctx["plan"]["chunk"]), nl.float32)


def stats_alloc(ctx: dict[str, Any], seg: dict[str, Any]) -> tuple[Any, ...]:
    """One `stat_tile` per per-row statistic in ctx["stats"] ([N] HBM vectors)."""
    return tuple([stat_tile(seg) for _ in ctx["stats"]])


def stats_load(ctx: dict[str, Any], seg: dict[str, Any]) -> tuple[Any, ...]:
    """A segment's entries of each ctx["stats"] vector, loaded (one DMA each)."""
    bufs = stats_alloc(ctx, seg)
    for buf, src in zip(bufs, ctx["stats"]):
        nisa.dma_copy(dst=buf[0 : seg["rows"], 0 : seg["cols"]], src=stat_view(src, seg))
    return bufs


def stats_store(ctx: dict[str, Any], seg: dict[str, Any], bufs: tuple[Any, ...]) -> None:
    """Store a segment's statistics buffers to the ctx["stats"] vectors (one DMA each)."""
    for buf, dst in zip(bufs, ctx["stats"]):
        nisa.dma_copy(dst=stat_view(dst, seg), src=buf[0 : seg["rows"], 0 : seg["cols"]])


def scratch(width: int, dtype: Any) -> Any:
    """A [P, width] SBUF buffer for outputs that are discarded (an add-reduce's elementwise
    result), allocated once per kernel: one engine writes it, so its reuse orders nothing
    else, where a fresh allocation could land on a buffer another engine is still using."""
    return nl.ndarray((P, width), dtype=dtype, buffer=nl.sbuf)


def const_column(value: float) -> Any:
    """A [P, 1] fp32 SBUF column filled with `value` (activation bias on every NC version)."""
    t = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=float(value))
    return t


def tt_split(dst: Any, a: Any, b: Any, op: Any, gpsimd_eighths: int) -> None:
    """dst = a op b element-wise, `gpsimd_eighths`/8 of the columns on GpSimd, the rest VectorE.

    Both engines run tensor_tensor; splitting one instruction's columns between them lets
    a kernel balance the two (VectorE is faster per element, GpSimd otherwise idle).
    """
    cw = dst.free_size
    g = cw * gpsimd_eighths // 8
    if g == 0 or g == cw:
        eng = nisa.engine.gpsimd if g == cw else nisa.engine.vector
        nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=op, engine=eng)
        return
    v = cw - g
    nisa.tensor_tensor(
        dst=dst[:, 0:v], data1=a[:, 0:v], data2=b[:, 0:v], op=op, engine=nisa.engine.vector
    )
    nisa.tensor_tensor(
        dst=dst[:, v:cw], data1=a[:, v:cw], data2=b[:, v:cw], op=op, engine=nisa.engine.gpsimd
    )


def identity(dtype: Any) -> Any:
    """A [P, P] identity matrix in SBUF (GpSimd affine_select on a ones tile), once per kernel.

    As the stationary operand of a matmul it copies a bf16 / fp16 tile into PSUM exactly
    (fp32 products of 1 and 0, one nonzero term per sum) at TensorE's bf16 rate.
    """
    ones = nl.ndarray((P, P), dtype=dtype, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    eye = nl.ndarray((P, P), dtype=dtype, buffer=nl.sbuf)
    nisa.affine_select(
        dst=eye, pattern=[[-1, P]], channel_multiplier=1, on_true_tile=ones, on_false_value=0.0
    )
    return eye


def colsum_init(hdim: int) -> dict[str, Any]:
    """A column-sum accumulator for an [*, hdim] operand: one PSUM bank, nothing written yet."""
    assert hdim <= COLSUM_MAX_H, f"column sums support H <= {COLSUM_MAX_H}; got {hdim}"
    ncol = (hdim + P - 1) // P
    acc = nl.ndarray((P, ncol), dtype=nl.float32, buffer=nl.psum)
    return {"acc": acc, "hdim": hdim, "ncol": ncol, "started": [False] * ncol, "ones": {}}


def _ones(state: dict[str, Any], dtype: Any) -> Any:
    key = str(dtype)
    if key not in state["ones"]:
        t = nl.ndarray((P, 1), dtype=dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=1.0)
        state["ones"][key] = t
    return state["ones"][key]


def colsum_add(state: dict[str, Any], data: Any, c0: int, row_weight: Any = None) -> None:
    """Add the column sums of `data` ([rows, cw] SBUF, columns c0.., c0 % 128 == 0).

    With `row_weight` ([rows, 1] SBUF, data's dtype class) the sums are weighted per row:
    sum_r data[r, c] * row_weight[r] -- the matmul applies a per-row scale for free.
    """
    assert c0 % P == 0, f"column blocks start at multiples of {P}; got {c0}"
    rows, cw = data.shape[0], data.shape[1]
    ones = _ones(state, data.dtype) if row_weight is None else row_weight
    for s0 in range(0, cw, P):
        m = min(P, cw - s0)
        ci = (c0 + s0) // P
        nisa.nc_matmul(
            dst=state["acc"][0:m, ci : ci + 1],
            stationary=data[0:rows, s0 : s0 + m],
            moving=ones[0:rows, 0:1] if row_weight is None else ones,
            accumulate=state["started"][ci],
        )
        state["started"][ci] = True


def colsum_store(state: dict[str, Any], out: Any) -> None:
    """Write the accumulated column sums to `out` ([hdim] HBM, cast by the DMA); zeros
    when no rows were added (an LNC program that was given no row tiles)."""
    hdim, ncol = state["hdim"], state["ncol"]
    started = state["started"]
    empty = started.count(True) == 0
    assert empty or started.count(True) == len(started), "every column block must have a sum"
    prows = min(P, hdim)
    sb = nl.ndarray((P, ncol), dtype=nl.float32, buffer=nl.sbuf)
    if empty:
        nisa.memset(dst=sb[0:prows, :], value=0.0)
    else:
        nisa.tensor_copy(dst=sb[0:prows, :], src=state["acc"][0:prows, :])
    tail = hdim - (ncol - 1) * P  # width of the last column block (1..128)
    # one transpose bank for every block: the backward keeps up to 7 of the 8 banks live
    # (column sums, dy copies, dx parts), so a second one would not fit (H > 16384)
    tp = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
    for b0 in range(0, ncol, P):
        nb = min(P, ncol - b0)
        nisa.nc_transpose(dst=tp[0:nb, 0:prows], data=sb[0:prows, b0 : b0 + nb])
        ts = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=ts[0:nb, 0:prows], src=tp[0:nb, 0:prows])
        nfull = nb if (b0 + nb < ncol or tail == P) else nb - 1
        if nfull > 0:
            nisa.dma_copy(
                dst=out[b0 * P : (b0 + nfull) * P].reshape((nfull, P)), src=ts[0:nfull, 0:P]
            )
        if nfull < nb:
            lo = (ncol - 1) * P
            nisa.dma_copy(dst=out[lo:hdim].reshape((1, tail)), src=ts[nb - 1 : nb, 0:tail])


def prefetch_start(jobs: list[Any], ahead: int, issue: Any, ctx: Any) -> dict[str, Any]:
    """A load pipeline over `jobs`: `issue(ctx, job)` starts a job's DMAs, returns its tiles.

    `prefetch_take` hands the jobs out in order while keeping `ahead` later jobs issued,
    so in program order (the order DMA queues trigger in) the loads of the next tiles
    precede the compute and stores of the current one. With ring buffers of depth
    ahead + 1 the loads run as far ahead as the buffers allow. Callers must not keep
    references to a taken job's tiles past its use (its buffer is reused).
    """
    return {"jobs": jobs, "ahead": ahead, "issue": issue, "ctx": ctx, "next": 0, "ready": []}


def prefetch_take(pf: dict[str, Any]) -> Any:
    """The next job's tiles (issuing up to `ahead` further jobs first)."""
    while pf["next"] < len(pf["jobs"]) and len(pf["ready"]) <= pf["ahead"]:
        pf["ready"].append(pf["issue"](pf["ctx"], pf["jobs"][pf["next"]]))
        pf["next"] += 1
    return pf["ready"].pop(0)


def issue_rows_load(ctx: dict[str, Any], job: Any) -> dict[str, Any]:
    """Start the DMAs of one load job of a row-tile kernel; returns {name: SBUF tile}.

    `job` is (tile, None) for a whole row tile ([P, kk, H] per source) or (tile, (c0, cw))
    for one column chunk ([P, kk, chunk]); the sources are ctx["loads"], (name, [N, H]
    HBM tensor or None) pairs, each landing in its own ring of ctx["plan"]["bufs"] buffers
    (or of ctx["ring_depths"][name], where a kernel gives a source a shallower ring).
    """
    tile, ch = job
    rows, kk = tile[1], tile[2]
    plan = ctx["plan"]
    out = {}
    for name, src in ctx["loads"]:
        if src is None:
            continue
        width = src.shape[1] if ch is None else plan["chunk"]
        pieces = ctx["chunks"] if ch is None else [ch]
        depth = ctx.get("ring_depths", {}).get(name, plan["bufs"])
        t = ring_alloc(ring(ctx, name), depth, (P, kk, width), src.dtype)
        sv = rows_view(src, tile)
        for c0, cw in pieces:
            d0 = c0 if ch is None else 0
            nisa.dma_copy(dst=t[0:rows, :, d0 : d0 + cw], src=sv[:, :, c0 : c0 + cw])
        out[name] = t
    return out


def each_chunk(
    ctx: dict[str, Any], tile: Any, ld: dict[str, Any] | None, fn: Any, *args: Any
) -> None:
    """fn(ctx, tile, ci, c0, views, *args) per column chunk ci = (c0, cw) of ctx["chunks"],
    `views` {name: [rows, kk, cw] SBUF view} of the resident tile `ld` or, with `ld` None,
    of the next streamed chunk, taken from ctx["pf"] only when its turn comes.

    Nothing here outlives `fn`: a streamed chunk's buffer must be unreferenced before the
    next take reuses its ring slot (a live reference would move the next allocation).
    """
    rows = tile[1]
    for ci, (c0, cw) in enumerate(ctx["chunks"]):
        if ld is not None:
            fn(ctx, tile, ci, c0, _chunk_views(ld, rows, c0, cw), *args)
        else:
            fn(ctx, tile, ci, c0, _chunk_views(prefetch_take(ctx["pf"]), rows, 0, cw), *args)


def _chunk_views(ld: dict[str, Any], rows: int, d0: int, cw: int) -> dict[str, Any]:
    return {name: t[0:rows, :, d0 : d0 + cw] for name, t in ld.items()}


def pipeline_order(
    segs: list[dict[str, Any]], nstages: int, step_order: tuple[int, ...] = ()
) -> list[tuple[int, int]]:
    """Program order (stage, tile index) of a software pipeline over the tiles of `segs`.

    Step t runs stage 0 of tile t, stage 1 of tile t-1, ..., stage K-1 of tile t-K+1, in
    that order or in `step_order` (a permutation of the stage indices). Each stage hands
    work to other engines that the next stage of the same tile consumes one step later,
    so in every engine's in-order stream the instructions of one step depend only on what
    earlier steps produced: no engine waits on another across stages within a step, and
    the engines overlap across tiles.
    """
    ntiles = 0
    for seg in segs:
        ntiles += len(seg["tiles"])
    order = []
    ks = step_order or tuple(range(nstages))
    assert len(ks) == nstages and all_in(ks, nstages), f"step_order: a permutation; got {ks}"
    for step in range(ntiles + nstages - 1):
        for k in ks:
            i = step - k
            if 0 <= i < ntiles:
                order.append((k, i))
    return order


def pipeline_jobs(
    segs: list[dict[str, Any]],
    nstages: int,
    resident: bool,
    chunks: list[Any],
    reload_last: bool = True,
    step_order: tuple[int, ...] = (),
) -> list[Any]:
    """Load jobs in the order `run_pipeline` takes them: a whole tile at stage 0 (resident),
    or every column chunk at the first stage and, with `reload_last`, again at the last
    (streaming)."""
    tiles = [t for seg in segs for t in seg["tiles"]]
    jobs: list[Any] = []
    for k, i in pipeline_order(segs, nstages, step_order):
        if resident:
            if k == 0:
                jobs.append((tiles[i], None))
        elif k == 0 or (reload_last and k == nstages - 1):
            jobs.extend([(tiles[i], ch) for ch in chunks])
    return jobs


def all_in(ks: tuple[int, ...], n: int) -> bool:
    """Whether `ks` holds each of 0..n-1 exactly once (given len(ks) == n)."""
    for k in range(n):
        if k not in ks:
            return False
    return True


def prefetch_depth(resident: bool, bufs: int, nstages: int) -> int:
    """Jobs loaded ahead: a resident tile is held through all `nstages` stages, a streamed
    chunk only while one stage uses it."""
    return bufs - nstages if resident else bufs - 1


def run_rows(
    ctx: dict[str, Any],
    segs: list[dict[str, Any]],
    stages: list[Any],
    seg_begin: Any,
    seg_end: Any = None,
    reload_last: bool = True,
    step_order: tuple[int, ...] = (),
) -> None:
    """Run a row-tile kernel: its loads (ctx["loads"], see `issue_rows_load`) issued ahead
    through ctx["pf"], and `stages` over the tiles of `segs` (see `run_pipeline`)."""
    plan = ctx["plan"]
    n = len(stages)
    jobs = pipeline_jobs(segs, n, plan["resident"], ctx["chunks"], reload_last, step_order)
    ahead = prefetch_depth(plan["resident"], plan["bufs"], n)
    ctx["pf"] = prefetch_start(jobs, ahead, issue_rows_load, ctx)
    run_pipeline(ctx, segs, stages, seg_begin, seg_end, step_order)


def run_pipeline(
    ctx: dict[str, Any],
    segs: list[dict[str, Any]],
    stages: list[Any],
    seg_begin: Any,
    seg_end: Any = None,
    step_order: tuple[int, ...] = (),
) -> None:
    """Run the stages of every tile in `pipeline_order`.

    stages[0](ctx, tile, seg_state) returns a tile state; stages[k](ctx, state) for k > 0
    return the (updated) state. seg_begin(ctx, seg) -> seg_state runs before a segment's
    first tile, seg_end(ctx, seg, seg_state) (if given) after the last stage of its last
    tile.
    """
    flat = [(si, t) for si, seg in enumerate(segs) for t in seg["tiles"]]
    seg_states: dict[int, Any] = {}
    states: dict[int, Any] = {}
    last = len(stages) - 1
    for k, i in pipeline_order(segs, len(stages), step_order):
        si, t = flat[i]
        if k == 0:
            if si not in seg_states:
                seg_states[si] = seg_begin(ctx, segs[si])
            states[i] = stages[0](ctx, t, seg_states[si])
        else:
            states[i] = stages[k](ctx, states[i])
        if k == last:
            states.pop(i)
            if i + 1 == len(flat) or flat[i + 1][0] != si:
                if seg_end is None:
                    seg_states.pop(si)
                else:
                    seg_end(ctx, segs[si], seg_states.pop(si))
