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
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl
from ._staging import GROUP, P, compute_dtype, copy_engine, stage_rows

BANK_COLS = 512  # fp32 score columns per PSUM bank (one matmul's N limit on trn2)
FP32_MIN = -3.4028235e38  # the fill value range_select requires (hardware constraint)
PSUM_BANKS = 8
# Pipeline: iterations behind the scores of job i at which each stage runs.
MAX_LAG = 1  # VectorE max pass (scores PSUM -> SBUF)
EXP_LAG = 2  # ScalarE exponential and row sums
TP_LAG = 3  # P^T: DMA transposes issued, PE transposes + evacuation
DMA_KEYS_IN_FLIGHT = 4096  # keys of P^T the DMA engines are given time for before P @ V
Q_PREFETCH = 4  # jobs ahead that a query tile's Q^T DMA is issued
OUT_RING = 6  # finalized tiles waiting for their store DMA
MASK_PREFETCH = 2  # jobs ahead that a dense mask's PARTIAL sub-tiles are loaded
MASK_RING = MASK_PREFETCH + MAX_LAG + 1  # loaded at job i - MASK_PREFETCH, read at i + 1


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


def _chunks(d: int) -> int:
    """128-row contraction chunks of head_dim (Q^T / K^T keep D on partitions)."""
    return (d + P - 1) // P


def _dchunks(d: int) -> list:
    """(chunk, first column, rows) of each 128-row head_dim chunk."""
    return [(c, c * P, min(P, d - c * P)) for c in range(_chunks(d))]


def _o_slots(d: int) -> int:
    """P @ V result slots in the one PSUM bank they share (512 fp32 per partition)."""
    return max(1, BANK_COLS // max(d, P))


def _tile_steps(classes: Any, t: int, nk: int, n_sub: int) -> list:
    """Steps of one query tile: lists of (slot, sub-tile u, partial) of <= n_sub slots."""
    subs = []
    for u in range(nk):
        c = classes[t][u] if len(classes) > 0 else 2
        if c != 0:
            subs.append((u, c == 1))
    steps = []
    for s0 in range(0, len(subs), n_sub):
        steps.append(
            [(j, subs[s0 + j][0], subs[s0 + j][1]) for j in range(min(n_sub, len(subs) - s0))]
        )
    return steps


def _runs(slots: list, split_masked: bool = False) -> list:
    """Maximal runs of consecutive keys inside one 512-slot group: (slot0, u0, count, partial).

    With `split_masked`, PARTIAL and FULL sub-tiles never share a run, so the mask
    instruction (range_select, 2 cycles per element) covers only what needs it.
    """
    runs: list[tuple[int, int, int, bool]] = []
    for j, u, part in slots:
        same = not split_masked or (runs and runs[-1][3] == part)
        if runs and same and runs[-1][1] + runs[-1][2] == u and runs[-1][0] // GROUP == j // GROUP:
            r = runs[-1]
            runs[-1] = (r[0], r[1], r[2] + 1, r[3] or part)
        else:
            runs.append((j, u, 1, part))
    return runs


def _split(n_slots: int, n_full: int, dma_quarters: int) -> int:
    """How many leading slots of a step the DMA engines transpose (the rest: TensorE).

    Only full 128-key sub-tiles (the first `n_full` slots) go to the DMA engines.
    """
    return min(n_full, (n_slots * dma_quarters + 2) // 4)


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
            "kt": nl.ndarray((min(d, P), _chunks(d), nk * P), dtype=cdt, buffer=nl.sbuf),
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
                tiles.append((h, t, _tile_steps(classes, t, nk, n_sub)))
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
    _dense_rings(rings, dense[:2], n_sub)
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
                    _prefetch_mask(jobs[j0 + i + a], j0 + i + a, tstate, rings, sk)
                _stage_qk(jobs[j0 + i], j0 + i, tstate, rings, sk, d)
            j = i - MAX_LAG
            if 0 <= j < n:
                _stage_max(jobs[j0 + j], j0 + j, tstate, rings, cfg[0], sk)
            j = i - EXP_LAG
            if 0 <= j < n:
                _stage_exp(jobs[j0 + j], j0 + j, tstate, rings, cfg[0], sk)
            j = i - TP_LAG
            if 0 <= j < n:
                _stage_transpose(jobs[j0 + j], j0 + j, tstate, rings, sk, cdt, cfg)
            j = i - pv_lag
            if 0 <= j < n:
                job = jobs[j0 + j]
                _stage_pv(job, j0 + j, tstate, rings, sk, d)
                _stage_rescale(job, j0 + j, tstate, rings, out, cfg[0], d)
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
    n_pe = n_sub - _split(n_sub, n_sub, dma_quarters)
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
        "o_ps": nl.ndarray((P, _o_slots(d), d), dtype=f32, buffer=ps),
        "s_sb": [nl.ndarray((P, n_sub * P), dtype=f32, buffer=sb) for _ in range(3)],
        "p": [nl.ndarray((P, n_sub * P), dtype=cdt, buffer=sb) for _ in range(pv_lag - EXP_LAG)],
        "pt": [nl.ndarray((P, n_sub, P), dtype=cdt, buffer=sb) for _ in range(pv_lag - TP_LAG + 1)],
        "qt": [
            nl.ndarray((min(d, P), _chunks(d), P), dtype=cdt, buffer=sb)
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
    for c, c0, dc in _dchunks(d):
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
        for c, c0, dc in _dchunks(k.shape[3]):
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
    for j0, u0, cnt, _ in _runs(job["slots"]):
        k0 = u0 * P
        ncols = min(cnt * P, sk - k0)
        c0 = (j0 % GROUP) * P
        for c, _, dc in _dchunks(d):  # head_dim > 128: one contraction pass per 128
            nisa.nc_matmul(
                dst=banks[j0 // GROUP][:rows, c0 : c0 + ncols],
                stationary=st["qt"][:dc, c, :rows],
                moving=kt[:dc, c, k0 : k0 + ncols],
                accumulate=c > 0,
            )


def _stat(rings, name, i):
    ring = rings[name]
    return ring[i % len(ring)]


def _chain_scale(scale: float) -> tuple[float, float]:
    """(mu, r): the max chain stores S' = mu * S (mu = -min(scale, 1), finite even for the
    FP32_MIN mask fill) and softmax uses scale * S = -r * S'."""
    mu = -min(scale, 1.0)
    return mu, scale / -mu


def _ncols(slots, sk):
    """Score columns of a step: full sub-tiles except possibly a ragged last one."""
    return (len(slots) - 1) * P + min(P, sk - slots[-1][1] * P)


def _stage_max(job, i, tstate, rings, scale, sk):
    """VectorE: masks, then S' = mu * S copied out to SBUF with the running max.

    The chain runs as a min over S' (mu < 0), so its result is directly
    nb = mu * max(S) -- with r = 1 (scale <= 1) the exp bias -- and
    P = exp(-r * S' + r * nb). The first chain instruction loads the previous nb, so
    the running maximum needs no separate merge.
    """
    st = tstate[job["ti"]]
    rows, t = st["rows"], st["t"]
    bnd = job["grp"]["set"].get("bnd")
    banks = job["banks"]
    s_sb = _stat(rings, "s_sb", i)
    mu, _ = _chain_scale(scale)
    runs = _runs(job["slots"], split_masked=True)
    nb = _stat(rings, "m", i)
    for idx, (j0, u0, cnt, partial) in enumerate(runs):
        k0 = u0 * P
        ncols = min(cnt * P, sk - k0)
        c0 = (j0 % GROUP) * P
        s_view = banks[j0 // GROUP][:rows, c0 : c0 + ncols]
        if rings["tanh_scale"] is not None:
            nisa.activation(dst=s_view, op=nl.tanh, data=s_view, scale=rings["tanh_scale"])
        if partial and "mk" in rings:
            _apply_dense(rings, i, s_view, rows, j0 * P, ncols)
        elif partial:
            nisa.range_select(
                dst=s_view,
                on_true_tile=s_view,
                comp_op0=nl.greater_equal,
                comp_op1=nl.less,
                bound0=bnd[:rows, 0, t : t + 1],
                bound1=bnd[:rows, 1, t : t + 1],
                reduce_cmd=nisa.reduce_cmd.idle,
                range_start=k0,
                on_false_value=FP32_MIN,
            )
        if idx == 0 and job["s"] != 0:
            cmd, init = nisa.reduce_cmd.load_reduce, st["nb"][:rows, :]
        else:
            cmd, init = (nisa.reduce_cmd.reset_reduce if idx == 0 else nisa.reduce_cmd.reduce), None
        nisa.tensor_scalar_reduce(
            dst=s_sb[:rows, j0 * P : j0 * P + ncols],
            data=s_view,
            op0=nl.multiply,
            operand0=mu,
            reduce_op=nl.minimum,
            reduce_res=nb[:rows, :] if idx == len(runs) - 1 else None,
            reduce_cmd=cmd,
            reduce_init=init,
        )
    job["nb_prev"] = st.get("nb")
    st["nb"] = nb


def _dense_rings(rings, dense, n_sub):
    """SBUF rings for the loaded PARTIAL sub-tiles of a dense mask (and its bias)."""
    mask, bias = dense
    if mask is None:
        return
    rings["dense"] = dense
    cols = n_sub * P
    rings["mk"] = [nl.ndarray((P, cols), dtype=nl.uint8, buffer=nl.sbuf) for _ in range(MASK_RING)]
    if bias is not None:
        rings["bs"] = [
            nl.ndarray((P, cols), dtype=nl.float32, buffer=nl.sbuf) for _ in range(MASK_RING)
        ]


def _prefetch_mask(job, i, tstate, rings, sk):
    """DMA the PARTIAL sub-tiles of job i's dense mask (and bias) into its ring slot."""
    if "mk" not in rings or job.get("mask_loaded", False):
        return
    job["mask_loaded"] = True
    mask, bias = rings["dense"]
    st = tstate[job["ti"]]
    rows, t0 = st["rows"], st["t"] * P
    mb = job["grp"]["b"] if mask.shape[0] > 1 else 0
    mh = st["h"] if mask.shape[1] > 1 else 0
    for j0, u0, cnt, partial in _runs(job["slots"], split_masked=True):
        if not partial:
            continue
        k0 = u0 * P
        ncols = min(cnt * P, sk - k0)
        src = (mb, mh, slice(t0, t0 + rows), slice(k0, k0 + ncols))
        nisa.dma_copy(dst=_stat(rings, "mk", i)[:rows, j0 * P : j0 * P + ncols], src=mask[src])
        if bias is not None:
            nisa.dma_copy(dst=_stat(rings, "bs", i)[:rows, j0 * P : j0 * P + ncols], src=bias[src])


def _apply_dense(rings, i, s_view, rows, c0, ncols):
    """Scores of masked keys -> FP32_MIN (whatever they were, NaN included); + bias."""
    nisa.select_reduce(
        dst=s_view,
        predicate=_stat(rings, "mk", i)[:rows, c0 : c0 + ncols],
        on_true=s_view,
        on_false=FP32_MIN,
        reduce_cmd=nisa.reduce_cmd.idle,
    )
    if "bs" in rings:
        nisa.tensor_tensor(
            dst=s_view, data1=s_view, data2=_stat(rings, "bs", i)[:rows, c0 : c0 + ncols], op=nl.add
        )


def _stage_exp(job, i, tstate, rings, scale, sk):
    """ScalarE exp of the whole step with row sums; the rescale factor; GpSimd l update."""
    st = tstate[job["ti"]]
    rows = st["rows"]
    _, r = _chain_scale(scale)
    nb = _stat(rings, "m", i)
    bias = nb
    if r != 1.0:
        bias = _stat(rings, "bias", i)
        nisa.activation(dst=bias[:rows, :], op=nl.copy, data=nb[:rows, :], scale=r)
    first = job["s"] == 0
    if not first:
        alpha = _stat(rings, "alpha", i)
        nisa.activation(
            dst=alpha[:rows, :],
            op=nl.exp,
            data=job["nb_prev"][:rows, :],
            bias=bias[:rows, :],
            scale=-r,
        )
        job["alpha"] = alpha
    ncols = _ncols(job["slots"], sk)
    p_sb = _stat(rings, "p", i)
    rs = _stat(rings, "rs", i)
    nisa.activation(
        dst=p_sb[:rows, :ncols],
        op=nl.exp,
        data=_stat(rings, "s_sb", i)[:rows, :ncols],
        bias=bias[:rows, :],
        scale=-r,
        reduce_op=nl.add,
        reduce_res=rs[:rows, :],
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )
    if first:
        st["l"] = rs
    else:
        l_new = _stat(rings, "l", i)
        nisa.tensor_scalar(
            dst=l_new[:rows, :],
            data=st["l"][:rows, :],
            op0=nl.multiply,
            operand0=alpha[:rows, :],
            op1=nl.add,
            operand1=rs[:rows, :],
            engine=nisa.engine.gpsimd,
        )
        st["l"] = l_new


def _stage_transpose(job, i, tstate, rings, sk, cdt, cfg):
    """P^T per 128-key sub-tile: the DMA engines take the first slots (one instruction),
    TensorE the rest into PSUM, copied out by ScalarE (first `scalar_evac` eighths) and
    VectorE."""
    dma_quarters, scalar_evac = cfg[3], cfg[4]
    rows = tstate[job["ti"]]["rows"]
    slots = job["slots"]
    p_sb = _stat(rings, "p", i)
    pt = _stat(rings, "pt", i)
    n_full = len(slots) if min(P, sk - slots[-1][1] * P) == P else len(slots) - 1
    n_dma = _split(len(slots), n_full, dma_quarters)
    if n_dma > 0:
        src = p_sb[:rows, : n_dma * P].reshape((rows, n_dma, P))
        nisa.dma_transpose(dst=pt[:, 0:n_dma, :rows], src=src, axes=(2, 1, 0))
    tp = rings["tp"][:, i % 2]
    pe = []
    for j, u, _ in slots[n_dma:]:
        kr = min(P, sk - u * P)
        nisa.nc_transpose(dst=tp[:kr, j - n_dma, :rows], data=p_sb[:rows, j * P : j * P + kr])
        pe.append((j, kr))
    n_s = (len(pe) * scalar_evac + 4) // 8
    for on_scalar, part in ((True, pe[:n_s]), (False, pe[n_s:])):
        if len(part) == 0:
            continue
        full = [x for x in part if x[1] == P]
        for grp in (full, [x for x in part if x[1] != P]):
            if len(grp) == 0:
                continue
            j0, j1, kr = grp[0][0], grp[-1][0] + 1, grp[0][1]
            nisa.tensor_copy(
                dst=pt[:kr, j0:j1, :rows],
                src=tp[:kr, j0 - n_dma : j1 - n_dma, :rows],
                engine=copy_engine(on_scalar),
            )


def _stage_pv(job, i, tstate, rings, sk, d):
    """This step's P @ V, accumulated over its sub-tiles in one PSUM slot."""
    vt = job["grp"]["set"]["vt"]
    rows = tstate[job["ti"]]["rows"]
    pt = _stat(rings, "pt", i)
    o_ps = rings["o_ps"][:, i % _o_slots(d), :]
    for idx, (j, u, _) in enumerate(job["slots"]):
        kr = min(P, sk - u * P)
        nisa.nc_matmul(
            dst=o_ps[:rows, :d],
            stationary=pt[:kr, j, :rows],
            moving=vt[:kr, u, :d],
            accumulate=idx > 0,
        )


def _stage_rescale(job, i, tstate, rings, out, scale, d):
    """O = alpha * O + (P @ V)_step (fp32 SBUF); after the last step, finalize the tile."""
    ti = job["ti"]
    st = tstate[ti]
    rows = st["rows"]
    o_ps = rings["o_ps"][:, i % _o_slots(d), :]
    last = job["s"] == st["n"] - 1
    if job["s"] == 0 and last:
        o_src = o_ps
    elif job["s"] == 0:
        o_acc = rings["o_acc"][ti % len(rings["o_acc"])]
        nisa.activation(dst=o_acc[:rows, :d], op=nl.copy, data=o_ps[:rows, :d])
        st["o"] = o_acc
        o_src = o_acc
    else:
        o_acc = st["o"]
        nisa.scalar_tensor_tensor(
            dst=o_acc[:rows, :d],
            data=o_acc[:rows, :d],
            op0=nl.multiply,
            operand0=job["alpha"][:rows, :],
            op1=nl.add,
            operand1=o_ps[:rows, :d],
        )
        o_src = o_acc
    job["alpha"] = None
    if last:
        in_psum = job["s"] == 0
        _finalize(st, o_src, in_psum, rings, ti, out, job["grp"], rows, scale, d)
        tstate[ti] = None


def _finalize(st, o_src, in_psum, rings, ti, out, ctx, rows, scale, d):
    """out = O / l (DMA'd to HBM), lse = scale * m + log(l) (kept in the group's SBUF
    statistics tile until its single store).

    O * (1 / l) runs on the otherwise idle GpSimd when O is in SBUF (tiles of several
    steps); a one-step tile's O is still in PSUM, which GpSimd cannot read: ScalarE.
    """
    b, h0, lse_all = ctx["b"], ctx["h0"], ctx["set"]["lse"]
    h, t0 = st["h"], st["t"] * P
    o_out = rings["o_out"][ti % OUT_RING]  # compute dtype == out dtype
    rl = _stat(rings, "rl", ti)
    nisa.reciprocal(dst=rl[:rows, :], data=st["l"][:rows, :])
    if in_psum:
        nisa.activation(dst=o_out[:rows, :d], op=nl.copy, data=o_src[:rows, :d], scale=rl[:rows, :])
    else:
        nisa.tensor_scalar(
            dst=o_out[:rows, :d],
            data=o_src[:rows, :d],
            op0=nl.multiply,
            operand0=rl[:rows, :],
            engine=nisa.engine.gpsimd,
        )
    nisa.dma_copy(dst=out[b, h, t0 : t0 + rows, :], src=o_out[:rows, :d])
    log_l = _stat(rings, "log_l", ti)
    nisa.activation(dst=log_l[:rows, :], op=nl.log, data=st["l"][:rows, :])
    t = st["t"]
    nisa.tensor_scalar(
        dst=lse_all[:rows, h - h0, t : t + 1],
        data=st["nb"][:rows, :],
        op0=nl.multiply,
        operand0=-_chain_scale(scale)[1],
        op1=nl.add,
        operand1=log_l[:rows, :],
        engine=nisa.engine.gpsimd,
    )


__all__ = ["flash_attention_fwd"]
