"""Flash attention backward as an NKI kernel: dq, dk, dv from the saved log-sum-exp.

Math (scale s, row statistics from the forward): P = exp(s * Q K^T - lse),
dV = P^T dO, dP = dO V^T, Delta = rowsum(dO * O) - dlse, dS = P * (dP - Delta),
dQ = s * dS K, dK = s * dS^T Q (dlse: gradient w.r.t. the returned lse, usually 0).

Layout: scores keep queries on partitions (as in the forward), so P and dS [q, k] are
directly the stationary operands of dV += P^T dO and dK += dS^T Q, and
exp(s * S - lse) takes -lse as a per-partition bias. Only dQ = dS K contracts over keys:
dS^T is transposed per 128-key slot (PE + PSUM evacuation, or DMA for 2-byte dtypes).

Work plan: _bwd_plan.py; operand staging (loads, statistics, transposes): _bwd_staging.py;
the four job stages: _bwd_stages.py; this file: the entry point, the pipeline, dQ / dK / dV
stores.
DMA shape: queries come in 512-row units and keys in 512-key blocks,
both staged interleaved (partition p holds 4 consecutive rows: 1 KiB descriptors for
bf16 D = 128 instead of 256 B), so the query tiles of a full unit are strided row sets
(the host supplies lse, bounds and the tile plan in that row order) and dK / dV / dS^T
slot j of a full key block holds keys k0 + 4p + j. dQ of a unit goes back with one
1 KiB-descriptor DMA as soon as its last key block is done.

Loops, per batch b and key/value head g (program = (b, g); LNC splits the list):

    sections of units (Q, dO, Q^T, dO^T, -lse, Delta, fp32 dQ resident in SBUF); the next
    section's units are loaded spread over the current section's jobs
    for each section: one software pipeline over all jobs (key block kb, query tile):
        stage 1: S = Q K^T, dP = dO V^T        (Q^T / dO^T of a tile transposed 2 jobs ahead)
        stage 2: mask, P = exp(s S - lse) (ScalarE), dS = P (dP - Delta) (VectorE)
        stage 3: dV += P^T dO, dK += dS^T Q in PSUM (the GQA heads of g accumulate
                 together), dS^T transposes; after a block's last job its dK, dV go out
                 (directly, or as fp32 partial sums through an HBM scratch across sections)
        stage 4: dQ += dS K (PSUM, then fp32 SBUF); a finished unit's dQ -> HBM

PSUM: S and dP double-buffered (4 banks), dK and dV (2), dS^T transposes (1), dQ and
the Q^T / dO^T transposes (1) = 8 banks. SKIP tiles issue nothing.
head_dim 129..256: Q^T, dO^T, K^T, V^T are kept in 128-row chunks of D (the partition
limit) and S, dP contract in one accumulating pass per chunk. dK and dV ([128, 4, D]
fp32) then take 2 banks each, so S and dP are single-buffered (2 + 4 + 2 = 8 banks) and
a job's softmax stage is issued before the next job's scores overwrite them; dQ
(D <= 256 fp32 columns) keeps one slot of its bank.
`lse` must hold +inf for rows without any allowed key (their P is then exactly 0).
Needs NeuronCore-v3+ (range_select). D <= 256.
"""

from __future__ import annotations

from ..nki import nisa, nki, nl
from ._bwd_plan import DIAG, GROUP, NONE, UNIT, P, head_group_plan
from ._bwd_stages import stage_dq, stage_grads, stage_scores, stage_softmax
from ._bwd_staging import (
    diag_tiles,
    load_kv,
    load_section_stats,
    load_unit,
    make_rings,
    prep_item,
    prep_kv,
    score_buffers,
    stats_product,
    unit_stats,
    write_zeros,
)
from ._staging import compute_dtype, load_bounds

DQ_LAG_DMA = 5  # jobs between S and dQ when DMA engines transpose dS (their ~2 us latency)
STATS_LAG = 8  # jobs between a prefetched unit's loads and its statistics
PREP_AHEAD = 2  # a tile's Q^T / dO^T are transposed this many jobs before its scores


@nki.jit
def flash_attention_bwd(
    q,
    k,
    v,
    o,
    do,
    lse,
    dlse,
    bounds,
    softmax_scale,
    plan,
    section,
    dma_quarters,
    scalar_evac,
    mask=None,
    bias=None,
    softcap=None,
):
    """dq [B, Hq, Sq, D], dk, dv [B, Hkv, Sk, D] (input dtypes) of attention(q, k, v).

    o, do: forward output and its gradient [B, Hq, Sq, D]; lse: fp32 [B, Hq, 128, nq],
    partition-major in the backward's row order (`_bwd_plan.bwd_row_order`; +inf on
    empty rows); dlse: None or the gradient of lse in the same layout (it enters as
    Delta - dlse); bounds / plan: as in the forward, in the same row order; section:
    query tiles whose operands stay resident (whole 4-tile units); dma_quarters: of
    every 4 dS^T slots, how many the DMA engines transpose (2-byte dtypes); scalar_evac:
    eighths of the PE-transposed slots that ScalarE copies out of PSUM (the rest VectorE);
    mask / bias: a dense mask as in the forward (uint8 / fp32 [B | 1, Hq | 1, Sq, Sk]),
    its rows in the backward's row order; PARTIAL sub-tiles load it instead of the bounds;
    softcap: None or cap > 0, the scores soft-capped as z = cap * tanh(scale * S / cap)
    (exp(z - lse) for P, dS scaled by dz/d(scale S) = 1 - tanh^2; no causal-diagonal bias).
    """
    batch, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    dq = nl.ndarray((batch, hq, sq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    dk = nl.ndarray((batch, hkv, sk, d), dtype=k.dtype, buffer=nl.shared_hbm)
    dv = nl.ndarray((batch, hkv, sk, d), dtype=v.dtype, buffer=nl.shared_hbm)
    nprog, pid = (nl.num_programs(0), nl.program_id(0)) if nl.program_ndim() != 0 else (1, 0)
    pairs = [(bb, gg) for bb in range(batch) for gg in range(hkv)]
    # causal-diagonal sub-tiles are masked by adding a constant bias to the scores on
    # TensorE (bf16: -1e30 is exact and vanishes in exp for any positive scale)
    diag = None
    if compute_dtype(q.dtype) == nl.bfloat16 and softmax_scale > 0 and _has_diag(plan):
        assert softcap is None, "softcap: the diagonal bias would be capped (host marks no DIAG)"
        diag = diag_tiles(nl.bfloat16)
    shared = {
        "rings": make_rings(compute_dtype(q.dtype), d, dk.dtype),
        "dense": (mask, bias),
        "softcap": softcap,
        "counters": {"prep": 0, "out": 0, "blk": 0, "kv": 0},
    }
    progs = []
    for i in range(pid, len(pairs), nprog):
        b, g = pairs[i]
        classes = plan[b if len(plan) > 1 else 0] if len(plan) > 0 else ()
        ctx = {
            "ins": (q, k, v, o, do, lse, dlse),
            "dq": dq[b],
            "dk": dk[b, g],
            "dv": dv[b, g],
            "b": b,
            "g": g,
            "cfg": (softmax_scale, section, dma_quarters, scalar_evac),
            "cdt": compute_dtype(q.dtype),
            "diag": diag,
            "sq": sq,
            "sk": sk,
            "d": d,
            "masked": len(classes) > 0 and bounds is not None,
            **shared,
        }
        heads = range(g * (hq // hkv), (g + 1) * (hq // hkv))
        ctx["plan"] = head_group_plan(classes, heads, sq, sk, section // GROUP, diag is not None)
        progs.append(ctx)
    if softcap is not None:
        shared["rings"]["w"] = [
            nl.ndarray((P, UNIT), dtype=nl.float32, buffer=nl.sbuf) for _ in range(2)
        ]
    if mask is not None:
        shared["rings"]["mk"] = [
            nl.ndarray((P, UNIT), dtype=nl.uint8, buffer=nl.sbuf) for _ in range(3)
        ]
        if bias is not None:
            shared["rings"]["bs"] = [
                nl.ndarray((P, UNIT), dtype=nl.float32, buffer=nl.sbuf) for _ in range(3)
            ]
    _run_pairs(progs, bounds)
    return dq, dk, dv


def _has_diag(plan) -> bool:
    return any([c == DIAG for per_b in plan for row in per_b for c in row])


def _run_pairs(progs, bounds):
    """All sections of a program's (batch, kv-head) pairs as one stream: the next
    section's operands (of the same pair or the next one) load during the current one."""
    flat = [(ctx, si) for ctx in progs for si in range(len(ctx["plan"]["sections"]))]
    for ctx in progs:
        if len(ctx["plan"]["sections"]) == 0:
            _setup_pair(ctx, bounds)
    if len(flat) == 0:
        return
    ctx0 = flat[0][0]
    _setup_pair(ctx0, bounds)
    staged = load_section_stats(_section_units(ctx0, 0), ctx0)
    kv_next = load_kv(ctx0, _active_blocks(ctx0, staged["units"])[0], 0)
    for unit in staged["units"]:
        load_unit(unit, ctx0)
    for f, (ctx, si) in enumerate(flat):
        cur = staged
        nxt = None
        if f + 1 < len(flat):
            nctx, nsi = flat[f + 1]
            if nsi == 0:
                _setup_pair(nctx, bounds)
            nxt = load_section_stats(_section_units(nctx, nsi), nctx)
        kv_next = _run_section(ctx, si, cur, nxt, kv_next)
        staged = nxt
    return None


def _section_units(ctx, si):
    units = ctx["plan"]["units"]
    return [units[u] for u in ctx["plan"]["sections"][si]]


def _active_blocks(ctx, units):
    nkb = len(ctx["plan"]["touch"])
    return [
        kb
        for kb in range(nkb)
        if any([it["work"][kb] is not None for u in units for it in u["items"]])
    ]


def _setup_pair(ctx, bounds):
    """Per-pair state: bounds, zero gradients of untouched rows / keys, dK / dV scratch."""
    sq, sk, d = ctx["sq"], ctx["sk"], ctx["d"]
    ctx["bnd"] = load_bounds(bounds, ctx["b"], -(-sq // P)) if ctx["masked"] else None
    ctx["touch"] = ctx["plan"]["touch"]
    write_zeros(ctx, ctx["plan"]["zero_tiles"])
    ctx["scratch"] = None
    if len(ctx["plan"]["sections"]) > 1:
        ctx["scratch"] = (
            nl.ndarray((sk, d), dtype=nl.float32, buffer=nl.hbm),
            nl.ndarray((sk, d), dtype=nl.float32, buffer=nl.hbm),
        )


def _run_section(ctx, si, cur, nxt, kv_first):
    """One software pipeline over every (key block, query tile) job of a section.

    kv_first: the staged K / V of its first block; returns those of the next section's
    first block (prefetched during this section's last block), or None.
    """
    units = cur["units"]
    active = _active_blocks(ctx, units)
    nxt_first = None
    if nxt is not None:
        nxt_active = _active_blocks(nxt["ctx"], nxt["units"])
        nxt_first = nxt_active[0] if len(nxt_active) > 0 else None
    jobs = []
    for a, kb in enumerate(active):
        for unit in units:
            for it in unit["items"]:
                if it["work"][kb] is not None:
                    jobs.append({"a": a, "kb": kb, "unit": unit, "it": it, "w": it["work"][kb]})
    # a full block whose jobs all mask alike (none, or all the causal-diagonal bias) keeps
    # its score columns in slot order: dS^T slot j is then a contiguous column range
    kinds: dict = {}
    for job in jobs:
        seen = kinds.setdefault(job["a"], [])
        for kind in [k for _, _, k in job["w"]["subs"]] + [
            "il" if job["w"]["slots"][0][2] else "natural"
        ]:
            if kind not in seen:
                seen.append(kind)
    slot_order = {}
    for a, ks in kinds.items():  # the distinct kinds are exactly {NONE, il} or {DIAG, il}
        slot_order[a] = len(ks) == 2 and "il" in ks and (NONE in ks or DIAG in ks)
    for i, job in enumerate(jobs):
        job["slot_order"] = slot_order[job["a"]]
        job["i"] = i
        job["it"]["last"] = i
        job["first"] = i == 0 or jobs[i - 1]["a"] != job["a"]
        job["last_in_block"] = i + 1 == len(jobs) or jobs[i + 1]["a"] != job["a"]
    pending = list(nxt["units"]) if nxt is not None else []
    # the next section's units load one every `stride` jobs (the DMA engines then never
    # hold a burst of loads in front of this section's K / V or dS^T transposes); their
    # statistics follow STATS_LAG jobs later, the GpSimd product one job before the
    # VectorE reduction
    stride = max(1, (len(jobs) - STATS_LAG) // max(1, len(pending)))
    loaded: list = []
    multiplied: list = []
    kvs: dict = {}
    kvs[0] = kv_first
    kv_out = None
    n = len(jobs)
    lag = DQ_LAG_DMA if ctx["cfg"][2] > 0 and ctx["rings"]["two_byte"] else 3
    # one S / dP buffer (D > 128): job i - 1's softmax reads it before job i's scores
    early_softmax = score_buffers(ctx["d"]) == 1
    for i in range(n + lag):
        if early_softmax and 0 <= i - 1 < n:
            stage_softmax(jobs[i - 1], ctx)
        if i < n:
            job = jobs[i]
            if job["first"]:
                a = job["a"]
                prep_kv(kvs[a], ctx, job["slot_order"])
                if a + 1 < len(active):
                    kvs[a + 1] = load_kv(ctx, active[a + 1], ctx["counters"]["kv"] + a + 1)
                elif nxt_first is not None:
                    slot = ctx["counters"]["kv"] + a + 1
                    kv_out = load_kv(nxt["ctx"], nxt_first, slot)
                job["written"] = [False] * GROUP
            else:
                job["written"] = jobs[i - 1]["written"]
            if len(pending) > 0 and i % stride == 0:
                load_unit(pending[0], nxt["ctx"])
                loaded.append((i, pending.pop(0)))
            if len(multiplied) > 0:
                unit_stats(multiplied.pop(0), nxt, ctx)
            if len(loaded) > 0 and loaded[0][0] + STATS_LAG <= i:
                multiplied.append(loaded.pop(0)[1])
                stats_product(multiplied[-1], ctx)
            for jj in range(i, min(n, i + PREP_AHEAD + 1)):
                prep_item(jobs[jj]["it"], jobs[jj]["unit"], cur, ctx)
            stage_scores(job, kvs[job["a"]], ctx)
        if not early_softmax and 0 <= i - 1 < n:
            stage_softmax(jobs[i - 1], ctx)
        if 0 <= i - 2 < n:
            job = jobs[i - 2]
            stage_grads(job, ctx)
            if job["last_in_block"]:
                _finish_block(ctx, job["written"], si, job["kb"])
        if 0 <= i - lag < n:
            job = jobs[i - lag]
            stage_dq(job, kvs[job["a"]], ctx)
            if job["last_in_block"]:
                del kvs[job["a"]]  # frees the block's K / V rows (read by stage 4 only)
            if job["it"]["last"] == job["i"]:
                job["unit"]["left"] -= 1
                if job["unit"]["left"] == 0:
                    _store_dq(job["unit"], ctx)
    for unit in pending:
        load_unit(unit, nxt["ctx"])
    if nxt is not None and kv_out is None and nxt_first is not None:
        kv_out = load_kv(nxt["ctx"], nxt_first, ctx["counters"]["kv"] + len(active))
    ctx["counters"]["kv"] += len(active)
    for unit in units:
        for name in ("q", "do", "qt", "dot", "dq_acc", "delta", "nlse"):
            unit.pop(name, None)
    return kv_out


def _store_dq(unit, ctx):
    """s * dQ of a finished unit -> HBM (one interleaved DMA for a complete full unit)."""
    d, h, r0 = ctx["d"], unit["h"], unit["r0"]
    c = ctx["counters"]
    out_t = ctx["rings"]["dq_out"][c["out"] % 2]
    c["out"] += 1
    items = unit["items"]
    if unit["il"] and len(items) == GROUP:
        nisa.activation(dst=out_t, op=nl.copy, data=unit["dq_acc"], scale=ctx["cfg"][0])
        nisa.dma_copy(dst=ctx["dq"][h, r0 : r0 + UNIT, :].reshape((P, GROUP, d)), src=out_t)
        return
    for it in items:
        rows, j = it["rows"], it["j"]
        nisa.activation(
            dst=out_t[:rows, j, :],
            op=nl.copy,
            data=unit["dq_acc"][:rows, j, :],
            scale=ctx["cfg"][0],
        )
        if unit["il"]:
            dst = ctx["dq"][h, r0 : r0 + UNIT, :].reshape((P, GROUP, d))[:, j, :]
        else:
            dst = ctx["dq"][h, it["t"] * P : it["t"] * P + rows, :]
        nisa.dma_copy(dst=dst, src=out_t[:rows, j, :])


def _finish_block(ctx, written, si, kb):
    """Write dK, dV of a block: directly, or through the fp32 HBM scratch across sections."""
    sk, d, scale = ctx["sk"], ctx["d"], ctx["cfg"][0]
    rings, touch = ctx["rings"], ctx["touch"][kb]
    c = ctx["counters"]
    k0 = kb * UNIT
    il = k0 + UNIT <= sk
    # (slot range, key row view): one piece for an interleaved block, else per sub-tile
    pieces = []
    if il:
        pieces.append(
            (0, GROUP, P, touch[0], lambda t: t[k0 : k0 + UNIT, :].reshape((P, GROUP, d)))
        )
    else:
        for ul in range(GROUP):
            if written[ul]:
                s0 = k0 + ul * P
                kr = min(P, sk - s0)
                pieces.append((ul, ul + 1, kr, touch[ul], _rows_view(s0, kr)))
    for w, dst_hbm in ((0, ctx["dk"]), (1, ctx["dv"])):
        ps = rings["dk"] if w == 0 else rings["dv"]
        sc = scale if w == 0 else 1.0
        out_t = rings["blk_out"][c["blk"] % 4]
        cur = rings["blk"][c["blk"] % 2]
        c["blk"] += 1
        for u0, u1, kr, secs, view in pieces:
            first, last = secs[0] == si, secs[-1] == si
            src_ps = ps[:kr, u0:u1, :d]
            if first and last:
                nisa.activation(dst=out_t[:kr, u0:u1, :], op=nl.copy, data=src_ps, scale=sc)
                nisa.dma_copy(dst=view(dst_hbm), src=_flat(out_t, kr, u0, u1))
                continue
            acc = view(ctx["scratch"][w])
            cur_v = cur[:kr, u0:u1, :]
            if first:
                nisa.tensor_copy(dst=cur_v, src=src_ps, engine=nisa.engine.scalar)
            else:
                nisa.dma_copy(dst=_flat(cur, kr, u0, u1), src=acc)
                nisa.tensor_tensor(dst=cur_v, data1=cur_v, data2=src_ps, op=nl.add)
            if last:
                nisa.activation(dst=out_t[:kr, u0:u1, :], op=nl.copy, data=cur_v, scale=sc)
                nisa.dma_copy(dst=view(dst_hbm), src=_flat(out_t, kr, u0, u1))
            else:
                nisa.dma_copy(dst=acc, src=_flat(cur, kr, u0, u1))


def _rows_view(s0, kr):
    return lambda t: t[s0 : s0 + kr, :]


def _flat(t, kr, u0, u1):
    """[kr, u1 - u0, D] slice of a slot tile, 2-D when it is one slot (an HBM row block)."""
    if u1 - u0 == 1:
        return t[:kr, u0, :]
    return t[:kr, u0:u1, :]


__all__ = ["flash_attention_bwd"]
