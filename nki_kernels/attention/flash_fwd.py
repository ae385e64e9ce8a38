"""Flash attention forward as an NKI kernel: online softmax, mask-tile skipping, GQA.

Algorithm (per batch b and key/value head g; the G = Hq / Hkv query heads of the group
share g's K^T and V, staged once into SBUF):

    for each query head h of the group, each 128-row query tile t:
        Q^T_t = DMA-transpose(q[b, h, t])                      # D on partitions
        m = -inf, l = 0, O = 0
        for each step of `kv_tile` keys (only the sub-tiles the mask does not rule out):
            S   = Q^T_t.T @ K^T[:, step]                       # TensorE -> PSUM fp32
            S   = range_select(S, lo_t <= key < hi_t)          # partial sub-tiles only
            S'  = mu * S -> SBUF, m' = max(m, rowmax(S))       # VectorE, accumulator chain
            P   = exp(scale * S - scale * m'), rs = rowsum(P)  # ScalarE, sum for free
            a   = exp(scale * (m - m'));  l = a * l + rs
            P^T = transpose(P) per 128-key sub-tile            # DMA, or PE + PSUM evacuation
            O   = a * O + P^T.T @ V[step]                      # TensorE accumulates in PSUM
        out[b, h, t] = O / l;   lse[b, h, :, t] = scale * m + log(l)

Layout: q, k, v arrive in SDPA layout [B, H, S, D] (HBM). Scores keep queries on the 128
partitions so softmax statistics are per-partition scalars; keys sit on the free axis
(512 fp32 columns per PSUM bank). K^T and Q^T come straight from HBM through DMA
transposes (no TensorE work, no PSUM evacuation); V is staged with keys on partitions.
P @ V contracts over keys, so P is transposed per 128-key sub-tile: `dma_quarters` of
every 4 by the DMA engines SBUF -> SBUF, the rest by TensorE into PSUM, copied out by
ScalarE (`scalar_evac` eighths) and VectorE.

Why this shape: per 512 keys of one query tile TensorE needs 0.43 us (trn2), but VectorE
must read all scores once for the maximum (0.53 us) and ScalarE once for the exponential
(0.45 us); PE-transposing P would add a PSUM evacuation of the same size to one of them.
The DMA engines take most of the transposes instead, and VectorE copies the scores out of
PSUM into SBUF during its max pass, so a score bank is free again as soon as it is read
(the score banks form one ring, whatever the step size).

Schedule: the steps of all query tiles form a job list (`q_tiles` tiles interleaved),
run as a software pipeline in issue order: in iteration i TensorE computes the scores of
job i, VectorE the max of job i - 1, ScalarE the exponential of job i - 2, the
transposes of job i - 3 are issued, and P @ V and the O rescale run for job i - L (L
covers the DMA transposes' ~1.3 us trigger latency and transfer). Every buffer comes from
a ring, so an in-order engine never waits for a recent reader of the memory it is about
to overwrite. With `kv_buffers` = 2 the jobs of all (batch, kv-head) groups of a program
form one list over two K/V buffer sets, so the pipeline does not drain between groups.

Masks arrive as per-query key bounds (`bounds`, fp32 [B, 128, 2, nq]: lo, hi of query
t * 128 + p) and a static plan (`plan[b][t][u]` SKIP / PARTIAL / FULL per 128 x 128
tile, see masks.py); SKIP tiles issue no instruction at all. Rows whose interval is empty
produce unspecified values (the op replaces them). Statistics are fp32; matmul operands
are the input dtype (fp32 inputs run fp32 matmuls). Needs NeuronCore-v3+ (range_select,
DMA transposes of the 4-byte dtype).

Limits: D <= 256 (Q^T / K^T in 128-row chunks, one contraction pass each); K^T and V
of one head stay resident: 4 * Sk * itemsize bytes per
partition per buffer set (`config.py` checks the SBUF fit; the op splits longer key
ranges).

Files: this one holds the entry point, the job list and its software pipeline, and the
K/V and Q staging; `_fwd_plan.py` the pipeline constants and the static step layout
(plain Python); `_fwd_stages.py` the online-softmax stages from the max pass to the
final O / l and lse.
"""

from __future__ import annotations

from ..nki import nisa, nki, nl
from ._fwd_plan import (
    BANK_COLS,
    DMA_KEYS_IN_FLIGHT,
    EXP_LAG,
    MASK_PREFETCH,
    MAX_LAG,
    OUT_RING,
    PSUM_BANKS,
    Q_PREFETCH,
    TP_LAG,
    dchunks,
    dma_split,
    key_runs,
    n_dchunks,
    o_slots,
    tile_steps,
)
from ._fwd_stages import (
    dense_rings,
    prefetch_mask,
    stage_exp,
    stage_max,
    stage_pv,
    stage_rescale,
    stage_transpose,
)
from ._staging import GROUP, P, compute_dtype, stage_rows


@nki.jit
def flash_attention_fwd(
    q,
    k,
    v,
    bounds,
    softmax_scale,
    plan,
    kv_tile,
    q_tiles,
    dma_quarters,
    scalar_evac,
    kv_buffers=1,
    mask=None,
    bias=None,
    softcap=None,
):
    """out [B, Hq, Sq, D] (q.dtype), lse [B, Hq, 128, nq] fp32 = attention(q, k, v).

    lse is partition-major: lse[b, h, p, t] belongs to query t * 128 + p, so one DMA per
    head group stores it with a contiguous run per partition (a [Sq] row would need one
    4-byte descriptor per query).

    q: [B, Hq, Sq, D]; k, v: [B, Hkv, Sk, D]; bounds: None or fp32 [B, 128, 2, nq];
    plan: () (no mask) or per-batch (or one shared) tuples of tile classes [nq][nk];
    kv_tile: keys per online-softmax step (a multiple of 512 whose scores fit the PSUM
    banks left over; the config offers 512 and 1024); q_tiles: query tiles
    interleaved (1 or 2); dma_quarters: of every 4 P^T sub-tiles, how many the DMA
    engines transpose (0..4); scalar_evac: eighths of the PE-transposed sub-tiles that
    ScalarE copies out of PSUM (the rest VectorE); kv_buffers: K/V (and statistics)
    buffer sets -- with 2 the (batch, kv-head) groups of a program run as one pipeline,
    the next group's K/V staged while the current one finishes.

    Dense masks (`mask` given): PARTIAL tiles are masked from loaded tiles instead of the
    bounds: `mask` uint8 [B | 1, Hq | 1, Sq, Sk] (1 = allowed; select_reduce replaces
    the other scores, NaN included, by FP32_MIN) and optionally `bias` fp32 of the same
    shape, added to the unscaled scores (an additive mask divided by softmax_scale; 0
    where masked). Only the sub-tiles the plan marks PARTIAL are loaded. softcap: None
    or cap > 0: the softmax runs on z = cap * tanh(scale * S / cap) (ScalarE writes the
    tanh over the scores in PSUM, before any mask; the pipeline then treats T = tanh(..)
    as the scores with scale cap, and `bias` is divided by cap instead of scale).
    """
    batch, hq, sq, d = q.shape
    hkv = k.shape[1]
    out = nl.ndarray((batch, hq, sq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    nq = (sq + P - 1) // P
    lse = nl.ndarray((batch, hq, P, nq), dtype=nl.float32, buffer=nl.shared_hbm)
    nprog, pid = (nl.num_programs(0), nl.program_id(0)) if nl.program_ndim() != 0 else (1, 0)
    eff_scale = softmax_scale if softcap is None else softcap
    cfg = (eff_scale, kv_tile, q_tiles, dma_quarters, scalar_evac)
    items = [(b, g) for b in range(batch) for g in range(hkv)]
    mine = [items[i] for i in range(pid, len(items), nprog)]
    tanh_scale = None if softcap is None else softmax_scale / softcap
    _run_groups(q, k, v, bounds, out, lse, plan, mine, cfg, kv_buffers, (mask, bias, tanh_scale))
    return out, lse


def _run_groups(q, k, v, bounds, out, lse, plan, groups, cfg, kv_buffers, dense):
    """Plan the jobs of every (batch, kv-head) group, then run them through the pipeline.

    With `kv_buffers` = 2 the groups alternate between two K/V buffer sets and form one
    continuous job list, so the pipeline never drains between groups. That is safe in
    issue order only when every middle group has at least pv_lag + Q_PREFETCH jobs (a
    group's buffers are restaged only after the last P @ V of the group two back);
    otherwise each group runs as its own pipeline, as with one buffer set.
    """
    _, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    group = hq // hkv
    kv_tile, q_tiles = cfg[1], cfg[2]
    cdt = compute_dtype(q.dtype)
    nq, nk = (sq + P - 1) // P, (sk + P - 1) // P
    n_sub = kv_tile // P
    masked = len(plan) > 0
    sets = []
    for _ in range(kv_buffers):
        st = {
            "kt": nl.ndarray((min(d, P), n_dchunks(d), nk * P), dtype=cdt, buffer=nl.sbuf),
            "vt": nl.ndarray((P, nk, d), dtype=cdt, buffer=nl.sbuf),
            "lse": nl.ndarray((P, group, nq), dtype=nl.float32, buffer=nl.sbuf),
        }
        if masked and bounds is not None:
            st["bnd"] = nl.ndarray((P, 2, nq), dtype=nl.float32, buffer=nl.sbuf)
        sets.append(st)
    ctxs, jobs, tstate = [], [], []
    for gi, (b, g) in enumerate(groups):
        classes = plan[b if len(plan) > 1 else 0] if masked else ()
        ctx = {"b": b, "g": g, "h0": g * group, "set": sets[gi % kv_buffers], "open": False}
        ctx["staged"] = [False] * ((nk * P + kv_tile - 1) // kv_tile)
        tiles = []  # (head, q tile, steps)
        for h in range(g * group, (g + 1) * group):
            for t in range(nq):
                tiles.append((h, t, tile_steps(classes, t, nk, n_sub)))
        ctx["empty"] = [(h, t) for h, t, steps in tiles if len(steps) == 0]
        ctx["first"] = len(jobs)
        live = [x for x in tiles if len(x[2]) > 0]
        for c0 in range(0, len(live), q_tiles):
            chunk = live[c0 : c0 + q_tiles]
            base = len(tstate)
            for h, t, steps in chunk:
                tstate.append({"h": h, "t": t, "rows": min(P, sq - t * P), "n": len(steps)})
            longest = max([len(c[2]) for c in chunk])
            for s in range(longest):
                for a, (_, _, steps) in enumerate(chunk):
                    if s < len(steps):
                        jobs.append({"ti": base + a, "s": s, "slots": steps[s], "grp": ctx})
        ctx["last"] = len(jobs) - 1
        ctxs.append(ctx)

    pv_lag = TP_LAG + 1 + (-(-DMA_KEYS_IN_FLIGHT // kv_tile) if cfg[3] > 0 else 0)
    sizes = [c["last"] - c["first"] + 1 for c in ctxs]
    continuous = (
        kv_buffers > 1
        and len(ctxs) > 1
        and min(sizes) > 0
        and all([n >= pv_lag + Q_PREFETCH for n in sizes[1:-1]])
    )
    segments = [(0, len(jobs))] if continuous else [(c["first"], c["last"] + 1) for c in ctxs]
    rings = _rings(n_sub, d, cdt, q_tiles, pv_lag, cfg[3])
    dense_rings(rings, dense[:2], n_sub)
    rings["tanh_scale"] = dense[2]
    io = (q, k, v, bounds, out, lse, sq, sk, d, kv_tile)
    for si, (j0, j1) in enumerate(segments):
        if not continuous:
            _open_group(ctxs[si], io, rings)
        n = j1 - j0
        for i in range(n + pv_lag):
            if i < n:
                for a in range(0 if i == 0 else Q_PREFETCH, min(Q_PREFETCH, n - i - 1) + 1):
                    job = jobs[j0 + i + a]
                    if not job["grp"]["open"]:
                        _open_group(job["grp"], io, rings)
                    _prefetch_q(q, jobs, j0 + i + a, tstate, rings, d)
                    _stage_kv(k, v, job, sk, kv_tile)
                for a in range(0 if i == 0 else MASK_PREFETCH, min(MASK_PREFETCH, n - i - 1) + 1):
                    prefetch_mask(jobs[j0 + i + a], j0 + i + a, tstate, rings, sk)
                _stage_qk(jobs[j0 + i], j0 + i, tstate, rings, sk, d)
            j = i - MAX_LAG
            if 0 <= j < n:
                stage_max(jobs[j0 + j], j0 + j, tstate, rings, cfg[0], sk)
            j = i - EXP_LAG
            if 0 <= j < n:
                stage_exp(jobs[j0 + j], j0 + j, tstate, rings, cfg[0], sk)
            j = i - TP_LAG
            if 0 <= j < n:
                stage_transpose(jobs[j0 + j], j0 + j, tstate, rings, sk, cdt, cfg)
            j = i - pv_lag
            if 0 <= j < n:
                job = jobs[j0 + j]
                stage_pv(job, j0 + j, tstate, rings, sk, d)
                stage_rescale(job, j0 + j, tstate, rings, out, cfg[0], d)
                if j0 + j == job["grp"]["last"]:
                    _close_group(job["grp"], lse, group)
        if not continuous and n == 0:
            _close_group(ctxs[si], lse, group)


def _open_group(ctx, io, rings):
    """A group's first instructions: its bounds, zeroed statistics, empty tiles' zeros."""
    _, _, _, bounds, out, _, sq, _, d, _ = io
    ctx["open"] = True
    st = ctx["set"]
    if "bnd" in st:
        nisa.dma_copy(dst=st["bnd"], src=bounds[ctx["b"]])
    nisa.memset(dst=st["lse"], value=0.0, engine=nisa.engine.gpsimd)
    for h, t in ctx["empty"]:
        rings["zeros"] = _store_empty_tile(out, ctx["b"], h, t, sq, d, rings.get("zeros"))


def _close_group(ctx, lse, group):
    """One store for the group's statistics: partition p, head h -> nq contiguous floats."""
    b, h0 = ctx["b"], ctx["h0"]
    nisa.dma_copy(dst=lse[b, h0 : h0 + group].permute((1, 0, 2)), src=ctx["set"]["lse"])


def _rings(n_sub, d, cdt, q_tiles, pv_lag, dma_quarters):
    """Buffers rotated by job (or query-tile) index, sized from the pipeline lags.

    PSUM: one bank of P @ V slots, the PE-transposed P^T of two jobs, and every other
    bank a ring of 512-column score banks.
    """
    f32, sb, ps = nl.float32, nl.sbuf, nl.psum
    n_pe = n_sub - dma_split(n_sub, n_sub, dma_quarters)
    itemsize = 4 if cdt == nl.float32 else 2
    tp_banks = -(-2 * max(n_pe, 1) * P * itemsize // (BANK_COLS * 4))
    score_banks = PSUM_BANKS - 1 - tp_banks
    if score_banks < -(-n_sub // GROUP):
        raise ValueError(
            f"kv_tile: the scores of {n_sub * P} keys need {-(-n_sub // GROUP)} PSUM banks; "
            f"{score_banks} are left (use a smaller kv_tile or more dma_quarters)"
        )
    tile_ring = 2 * q_tiles + 2
    r = {
        "s": [nl.ndarray((P, BANK_COLS), dtype=f32, buffer=ps) for _ in range(score_banks)],
        "tp": nl.ndarray((P, 2, max(n_pe, 1), P), dtype=cdt, buffer=ps),
        "o_ps": nl.ndarray((P, o_slots(d), d), dtype=f32, buffer=ps),
        "s_sb": [nl.ndarray((P, n_sub * P), dtype=f32, buffer=sb) for _ in range(3)],
        "p": [nl.ndarray((P, n_sub * P), dtype=cdt, buffer=sb) for _ in range(pv_lag - EXP_LAG)],
        "pt": [nl.ndarray((P, n_sub, P), dtype=cdt, buffer=sb) for _ in range(pv_lag - TP_LAG + 1)],
        "qt": [
            nl.ndarray((min(d, P), n_dchunks(d), P), dtype=cdt, buffer=sb)
            for _ in range(Q_PREFETCH + tile_ring)
        ],
        "o_acc": [nl.ndarray((P, d), dtype=f32, buffer=sb) for _ in range(tile_ring)],
        "o_out": [nl.ndarray((P, d), dtype=cdt, buffer=sb) for _ in range(OUT_RING)],
        "bank": 0,  # next score bank of the ring
    }
    stat_ring = pv_lag + 2 * q_tiles + 2  # a tile's m, l are read until its last P @ V
    for name in ("m", "bias", "alpha", "rs", "l", "rl", "log_l"):
        r[name] = [nl.ndarray((P, 1), dtype=f32, buffer=sb) for _ in range(stat_ring)]
    return r


def _store_empty_tile(out, b, h, t, sq, d, zeros):
    """A query tile with no allowed key anywhere: write zeros (lse stays 0; the op fixes both)."""
    if zeros is None:
        zeros = nl.ndarray((P, d), dtype=out.dtype, buffer=nl.sbuf)
        nisa.memset(dst=zeros, value=0.0)
    rows = min(P, sq - t * P)
    nisa.dma_copy(dst=out[b, h, t * P : t * P + rows, :], src=zeros[:rows, :])
    return zeros


def _prefetch_q(q, jobs, i, tstate, rings, d):
    """Q^T of job i's query tile (first step only), transposed by the DMA engines."""
    if i >= len(jobs) or jobs[i]["s"] != 0:
        return
    ti, b = jobs[i]["ti"], jobs[i]["grp"]["b"]
    st = tstate[ti]
    rows, t0 = st["rows"], st["t"] * P
    qt = rings["qt"][ti % len(rings["qt"])]
    for c, c0, dc in dchunks(d):
        nisa.dma_transpose(dst=qt[:dc, c, :rows], src=q[b, st["h"], t0 : t0 + rows, c0 : c0 + dc])
    st["qt"] = qt


def _stage_kv(k, v, job, sk, kv_tile):
    """Stage (once) the kv_tile-key blocks of K^T (DMA transpose) and V the job touches."""
    ctx = job["grp"]
    staged, kt, vt, b, g = ctx["staged"], ctx["set"]["kt"], ctx["set"]["vt"], ctx["b"], ctx["g"]
    for _, u, _ in job["slots"]:
        blk = u * P // kv_tile
        if staged[blk]:
            continue
        staged[blk] = True
        k0 = blk * kv_tile
        n = min(kv_tile, sk - k0)
        for c, c0, dc in dchunks(k.shape[3]):
            nisa.dma_transpose(dst=kt[:dc, c, k0 : k0 + n], src=k[b, g, k0 : k0 + n, c0 : c0 + dc])
        stage_rows(v[b, g], vt, k0, n)


def _stage_qk(job, i, tstate, rings, sk, d):
    """TensorE: scores of one step into the next score banks (one per 4 slots)."""
    kt = job["grp"]["set"]["kt"]
    st = tstate[job["ti"]]
    rows = st["rows"]
    ring = rings["s"]
    banks = []
    for _ in range((len(job["slots"]) + GROUP - 1) // GROUP):
        banks.append(ring[rings["bank"] % len(ring)])
        rings["bank"] += 1
    job["banks"] = banks
    for j0, u0, cnt, _ in key_runs(job["slots"]):
        k0 = u0 * P
        ncols = min(cnt * P, sk - k0)
        c0 = (j0 % GROUP) * P
        for c, _, dc in dchunks(d):  # head_dim > 128: one contraction pass per 128
            nisa.nc_matmul(
                dst=banks[j0 // GROUP][:rows, c0 : c0 + ncols],
                stationary=st["qt"][:dc, c, :rows],
                moving=kt[:dc, c, k0 : k0 + ncols],
                accumulate=c > 0,
            )


__all__ = ["flash_attention_fwd"]
