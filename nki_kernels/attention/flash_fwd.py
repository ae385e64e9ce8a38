"""Flash attention forward as an NKI kernel: online softmax, mask-tile skipping, GQA.

Algorithm (per batch b and key/value head g; the G = Hq / Hkv query heads of the group
share g's K^T and V, staged once into SBUF):

    for each query head h of the group, each 128-row query tile t:
        Q^T_t = PE-transpose(q[b, h, t])                       # D on partitions
        m = -inf, l = 0, O = 0
        for each step of `kv_tile` keys (only the sub-tiles the mask does not rule out):
            S   = Q^T_t.T @ K^T[:, step]                       # TensorE -> PSUM fp32
            S   = range_select(S, lo_t <= key < hi_t)          # partial sub-tiles only
            m'  = max(m, rowmax(S))                            # VectorE, accumulator chain
            P   = exp(scale * S - scale * m'), rs = rowsum(P)  # ScalarE, sum for free
            a   = exp(scale * (m - m'));  l = a * l + rs
            P^T = transpose(P) per 128-key sub-tile            # PE (+ PSUM evacuation) or DMA
            O   = a * O + P^T.T @ V[step]                      # TensorE accumulates in PSUM
        out[b, h, t] = O / l;   lse[b, h, :, t] = scale * m + log(l)

Layout: q, k, v arrive in SDPA layout [B, H, S, D] (HBM). Scores keep queries on the 128
partitions so softmax statistics are per-partition scalars; keys sit on the free axis
(up to 512 fp32 columns per PSUM bank). P @ V contracts over keys, so P is transposed per
128-key sub-tile: by TensorE (then copied out of PSUM by ScalarE or VectorE) or by the
DMA engines SBUF -> SBUF (`dma_quarters` of every 4 sub-tiles; 2-byte dtypes only).

Schedule: the steps of all query tiles form a job list (`q_tiles` tiles interleaved) run
as a three-stage software pipeline in issue order -- QK^T of job i, softmax of job i - 1,
transposes / P @ V / rescale of job i - 2 -- so TensorE computes the next scores while
VectorE / ScalarE work on the previous ones. PSUM: two score steps (kv_tile / 512 banks
each) + P^T + O + one staging bank <= 8 banks for kv_tile <= 1024.

Masks arrive as per-query key bounds (`bounds`, fp32 [B, 128, 2, nq]: lo, hi of query
t * 128 + p) and a static plan (`plan[b][t][u]` SKIP / PARTIAL / FULL per 128 x 128
tile, see masks.py); SKIP tiles issue no instruction at all. Rows whose interval is empty
produce unspecified values (the op replaces them). Statistics are fp32; matmul operands
are the input dtype (fp32 inputs run fp32 matmuls). Needs NeuronCore-v3+ (range_select).

Limits: D <= 128; K^T and V of one head stay resident: 4 * Sk * itemsize bytes per
partition (`config.py` checks the SBUF fit; the op splits longer key ranges).
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl
from ._staging import (
    GROUP,
    P,
    compute_dtype,
    copy_engine,
    load_bounds,
    load_kt_group,
    stage_rows,
    transpose_kt_group,
    transpose_rows,
)

BANK_COLS = 512  # fp32 score columns per PSUM bank (one matmul's N limit on trn2)
FP32_MIN = -3.4028235e38  # the fill value range_select requires (hardware constraint)
Q_PREFETCH = 3  # jobs ahead that a query tile's DMA load is issued (hides DMA latency)
# Ring depths: a buffer is rewritten only this many jobs (query tiles, finalized tiles)
# after it was last used, so its next writer does not wait on a recent reader.
JOB_RING = 3  # P and P^T of a step (written in stage 2 / 3, read in stage 3 / 4)
STAT_RING = 8  # [128, 1] statistics: a tile's m, l are read q_tiles jobs later
OUT_RING = 6  # finalized tiles waiting for their store DMA


@nki.jit
def flash_attention_fwd(
    q, k, v, bounds, softmax_scale, plan, kv_tile, q_tiles, dma_quarters, scalar_evac
):
    """out [B, Hq, Sq, D] (q.dtype), lse [B, Hq, 128, nq] fp32 = attention(q, k, v).

    lse is partition-major: lse[b, h, p, t] belongs to query t * 128 + p, so one DMA per
    head group stores it with a contiguous run per partition (a [Sq] row would need one
    4-byte descriptor per query).

    q: [B, Hq, Sq, D]; k, v: [B, Hkv, Sk, D]; bounds: None or fp32 [B, 128, 2, nq];
    plan: () (no mask) or per-batch (or one shared) tuples of tile classes [nq][nk];
    kv_tile: keys per online-softmax step (512 or 1024); q_tiles: query tiles
    interleaved (1 or 2); dma_quarters: of every 4 P^T sub-tiles, how many the DMA
    engines transpose (0..4); scalar_evac: eighths of the PE-transposed sub-tiles that
    ScalarE copies out of PSUM (the rest VectorE).
    """
    batch, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    out = nl.ndarray((batch, hq, sq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    nq = (sq + P - 1) // P
    lse = nl.ndarray((batch, hq, P, nq), dtype=nl.float32, buffer=nl.shared_hbm)
    nprog, pid = (nl.num_programs(0), nl.program_id(0)) if nl.program_ndim() != 0 else (1, 0)
    cfg = (softmax_scale, kv_tile, q_tiles, dma_quarters, scalar_evac)
    items = [(b, g) for b in range(batch) for g in range(hkv)]
    for i in range(pid, len(items), nprog):
        b, g = items[i]
        classes = plan[b if len(plan) > 1 else 0] if len(plan) > 0 else ()
        _head_group(q, k, v, bounds, out, lse, b, g, hq // hkv, classes, cfg, sq, sk, d)
    return out, lse


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
    """Maximal runs of consecutive keys inside one PSUM bank: (slot0, u0, count, partial).

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


def _head_group(q, k, v, bounds, out, lse, b, g, group, classes, cfg, sq, sk, d):
    softmax_scale, kv_tile, q_tiles = cfg[0], cfg[1], cfg[2]
    cdt = compute_dtype(q.dtype)
    nq, nk = (sq + P - 1) // P, (sk + P - 1) // P
    n_sub = kv_tile // P
    kt = nl.ndarray((d, nk * P), dtype=cdt, buffer=nl.sbuf)
    vt = nl.ndarray((P, nk, d), dtype=cdt, buffer=nl.sbuf)
    bnd = load_bounds(bounds, b, nq) if len(classes) > 0 else None
    lse_all = nl.ndarray((P, group, nq), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=lse_all, value=0.0, engine=nisa.engine.gpsimd)

    tiles = []  # (head, q tile, steps)
    for h in range(g * group, (g + 1) * group):
        for t in range(nq):
            tiles.append((h, t, _tile_steps(classes, t, nk, n_sub)))
    zeros = None
    for h, t, steps in tiles:
        if len(steps) == 0:
            zeros = _store_empty_tile(out, b, h, t, sq, d, zeros)
    jobs = []
    tstate = []  # per query tile, in order of first appearance
    live = [x for x in tiles if len(x[2]) > 0]
    for c0 in range(0, len(live), q_tiles):
        chunk = live[c0 : c0 + q_tiles]
        for h, t, steps in chunk:
            tstate.append({"h": h, "t": t, "rows": min(P, sq - t * P), "n": len(steps)})
        longest = max(len(c[2]) for c in chunk)
        for s in range(longest):
            for a, (_, _, steps) in enumerate(chunk):
                if s < len(steps):
                    jobs.append({"ti": c0 + a, "s": s, "slots": steps[s]})

    rings = _rings(n_sub, d, cdt, q_tiles)
    staged = [False] * ((nk + GROUP - 1) // GROUP)
    n = len(jobs)
    # A four-stage software pipeline, in issue order per iteration i: scores of job i
    # (TensorE), softmax of job i - 1 (VectorE max chain, ScalarE exp), P^T of job i - 2
    # (TensorE transposes + evacuation), P @ V and the O rescale of job i - 3. Every
    # cross-engine dependency then spans at least one iteration except max -> exp, and
    # each buffer comes from a ring, so it is rewritten only several jobs after its
    # last reader: in-order engines do not stall each other on write-after-read.
    for i in range(n + 3):
        if i < n:
            if i == 0:
                for a in range(min(Q_PREFETCH, n)):
                    _prefetch_q(q, jobs, a, tstate, rings, b, d, cdt)
            _prefetch_q(q, jobs, i + Q_PREFETCH, tstate, rings, b, d, cdt)
            _stage_kv(k, v, jobs[i], staged, kt, vt, rings, b, g, sk, d, cdt)
            _stage_qk(jobs[i], i, tstate, rings, kt, sk, d, cdt)
        if 0 <= i - 1 < n:
            _stage_softmax(jobs[i - 1], i - 1, tstate, rings, bnd, softmax_scale, cdt, sk)
        if 0 <= i - 2 < n:
            _stage_transpose(jobs[i - 2], i - 2, tstate, rings, sk, cdt, cfg)
        if 0 <= i - 3 < n:
            _stage_pv(jobs[i - 3], i - 3, tstate, rings, vt, sk, d)
            _stage_rescale(
                jobs[i - 3], i - 3, tstate, rings, out, lse_all, b, g * group, softmax_scale, d
            )
    # one store for the group's statistics: partition p, head h -> nq contiguous floats
    nisa.dma_copy(dst=lse[b, g * group : (g + 1) * group].permute((1, 0, 2)), src=lse_all)


def _rings(n_sub, d, cdt, q_tiles):
    """Buffers rotated by job (or query-tile) index; see the ring sizes above."""
    f32, sb, ps = nl.float32, nl.sbuf, nl.psum
    nbank = (n_sub + GROUP - 1) // GROUP
    tile_ring = 2 * q_tiles + 2
    r = {
        "s": [
            [nl.ndarray((P, BANK_COLS), dtype=f32, buffer=ps) for _ in range(nbank)]
            for _ in range(2)
        ],
        "tp": [nl.ndarray((P, n_sub, P), dtype=cdt, buffer=ps) for _ in range(2)],
        "o_ps": nl.ndarray((P, 2, d), dtype=f32, buffer=ps),
        "stage_ps": nl.ndarray((P, GROUP, P), dtype=cdt, buffer=ps),
        "p": [nl.ndarray((P, n_sub * P), dtype=cdt, buffer=sb) for _ in range(JOB_RING)],
        "pt": [nl.ndarray((P, n_sub, P), dtype=cdt, buffer=sb) for _ in range(JOB_RING)],
        "q_nat": [nl.ndarray((P, d), dtype=cdt, buffer=sb) for _ in range(Q_PREFETCH + tile_ring)],
        "qt": [nl.ndarray((d, P), dtype=cdt, buffer=sb) for _ in range(tile_ring)],
        "o_acc": [nl.ndarray((P, d), dtype=f32, buffer=sb) for _ in range(tile_ring)],
        "o_out": [nl.ndarray((P, d), dtype=cdt, buffer=sb) for _ in range(OUT_RING)],
    }
    for name in ("m", "bias", "alpha", "rs", "l", "rl", "log_l"):
        r[name] = [nl.ndarray((P, 1), dtype=f32, buffer=sb) for _ in range(STAT_RING)]
    return r


def _store_empty_tile(out, b, h, t, sq, d, zeros):
    """A query tile with no allowed key anywhere: write zeros (lse stays 0; the op fixes both)."""
    if zeros is None:
        zeros = nl.ndarray((P, d), dtype=out.dtype, buffer=nl.sbuf)
        nisa.memset(dst=zeros, value=0.0)
    rows = min(P, sq - t * P)
    nisa.dma_copy(dst=out[b, h, t * P : t * P + rows, :], src=zeros[:rows, :])
    return zeros


def _prefetch_q(q, jobs, i, tstate, rings, b, d, cdt):
    """DMA-load the query tile of job i (first step only) ahead of its use."""
    if i >= len(jobs) or jobs[i]["s"] != 0:
        return
    ti = jobs[i]["ti"]
    st = tstate[ti]
    rows, t0 = st["rows"], st["t"] * P
    q_nat = rings["q_nat"][ti % len(rings["q_nat"])]
    nisa.dma_copy(dst=q_nat[:rows, :], src=q[b, st["h"], t0 : t0 + rows, :])
    st["q_nat"] = q_nat


def _stage_kv(k, v, job, staged, kt, vt, rings, b, g, sk, d, cdt):
    """Stage (once) the 512-key groups of K^T and V that job touches."""
    for _, u, _ in job["slots"]:
        grp = u // GROUP
        if staged[grp]:
            continue
        staged[grp] = True
        k0 = grp * GROUP * P
        n = min(GROUP * P, sk - k0)
        raw = load_kt_group(k[b, g], k0, n, d, cdt)
        transpose_kt_group(raw, kt, k0, n, d, cdt, grp % 2 == 0, tp=rings["stage_ps"])
        stage_rows(v[b, g], vt, k0, n)


def _stage_qk(job, i, tstate, rings, kt, sk, d, cdt):
    """TensorE: scores of one step into PSUM (one bank per 4 slots)."""
    ti = job["ti"]
    st = tstate[ti]
    rows = st["rows"]
    if job["s"] == 0:
        qt = rings["qt"][ti % len(rings["qt"])]
        tp = rings["stage_ps"][:, 0, :]
        transpose_rows(st["q_nat"], rows, d, qt, cdt, st["t"] % 2 == 1, tp=tp)
        st["qt"] = qt
    banks = rings["s"][i % 2]
    for j0, u0, cnt, _ in _runs(job["slots"]):
        k0 = u0 * P
        ncols = min(cnt * P, sk - k0)
        c0 = (j0 % GROUP) * P
        nisa.nc_matmul(
            dst=banks[j0 // GROUP][:rows, c0 : c0 + ncols],
            stationary=st["qt"][:d, :rows],
            moving=kt[:d, k0 : k0 + ncols],
            accumulate=False,
        )


def _stat(rings, name, i):
    ring = rings[name]
    return ring[i % len(ring)]


def _chain_scale(scale: float) -> tuple[float, float]:
    """(mu, r): the max chain stores S' = mu * S in place (mu = -min(scale, 1), finite
    even for the FP32_MIN mask fill) and softmax uses scale * S = -r * S'."""
    mu = -min(scale, 1.0)
    return mu, scale / -mu


def _stage_softmax(job, i, tstate, rings, bnd, scale, cdt, sk):
    """VectorE max chain (+ masks), ScalarE exp with row sums, GpSimd l update.

    The chain runs as a min over S' = mu * S (mu < 0), so its result is directly
    nb = mu * max(S) -- with r = 1 (scale <= 1) the exp bias -- and
    P = exp(-r * S' + r * nb). The first chain instruction loads the previous nb, so
    the running maximum needs no separate merge.
    """
    st = tstate[job["ti"]]
    rows = st["rows"]
    t = st["t"]
    banks = rings["s"][i % 2]
    first = job["s"] == 0
    mu, r = _chain_scale(scale)
    runs = _runs(job["slots"], split_masked=True)
    nb = _stat(rings, "m", i)
    for idx, (j0, u0, cnt, partial) in enumerate(runs):
        k0 = u0 * P
        ncols = min(cnt * P, sk - k0)
        c0 = (j0 % GROUP) * P
        s_view = banks[j0 // GROUP][:rows, c0 : c0 + ncols]
        if partial:
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
        if idx == 0 and not first:
            cmd, init = nisa.reduce_cmd.load_reduce, st["nb"][:rows, :]
        else:
            cmd, init = (nisa.reduce_cmd.reset_reduce if idx == 0 else nisa.reduce_cmd.reduce), None
        nisa.tensor_scalar_reduce(
            dst=s_view,
            data=s_view,
            op0=nl.multiply,
            operand0=mu,
            reduce_op=nl.minimum,
            reduce_res=nb[:rows, :] if idx == len(runs) - 1 else None,
            reduce_cmd=cmd,
            reduce_init=init,
        )
    bias = nb
    if r != 1.0:
        bias = _stat(rings, "bias", i)
        nisa.activation(dst=bias[:rows, :], op=nl.copy, data=nb[:rows, :], scale=r)
    if not first:
        alpha = _stat(rings, "alpha", i)
        nisa.activation(
            dst=alpha[:rows, :], op=nl.exp, data=st["nb"][:rows, :], bias=bias[:rows, :], scale=-r
        )
    slots = job["slots"]
    p_sb = rings["p"][i % JOB_RING]
    rs = _stat(rings, "rs", i)
    nbank = (len(slots) + GROUP - 1) // GROUP
    for c in range(nbank):
        j0 = c * GROUP
        j1 = min(len(slots), j0 + GROUP)
        ncols = (j1 - j0 - 1) * P + min(P, sk - slots[j1 - 1][1] * P)
        nisa.activation(
            dst=p_sb[:rows, j0 * P : j0 * P + ncols],
            op=nl.exp,
            data=banks[c][:rows, 0:ncols],
            bias=bias[:rows, :],
            scale=-r,
            reduce_op=nl.add,
            reduce_res=rs[:rows, :] if c == nbank - 1 else None,
            reduce_cmd=nisa.reduce_cmd.reset_reduce if c == 0 else nisa.reduce_cmd.reduce,
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
        job["alpha"] = alpha
    st["nb"] = nb


def _stage_transpose(job, i, tstate, rings, sk, cdt, cfg):
    """P^T per 128-key sub-tile: PE transpose + PSUM evacuation, or DMA transpose.

    Of every 4 sub-tiles the last `dma_quarters` go through the DMA engines (2-byte
    dtypes, full sub-tiles); of the PE-transposed ones the first `scalar_evac` eighths
    are copied out of PSUM by ScalarE and the rest by VectorE.
    """
    dma_quarters, scalar_evac = cfg[3], cfg[4]
    rows = tstate[job["ti"]]["rows"]
    slots = job["slots"]
    p_sb = rings["p"][i % JOB_RING]
    pt = rings["pt"][i % JOB_RING]
    tp = rings["tp"][i % 2]
    pe = []
    for c0 in range(0, len(slots), GROUP):
        grp = slots[c0 : c0 + GROUP]
        full = min(P, sk - grp[-1][1] * P) == P
        n_dma = min(dma_quarters, len(grp)) if cdt != nl.float32 and full else 0
        n_pe = len(grp) - n_dma
        for j, u, _ in grp[:n_pe]:
            kr = min(P, sk - u * P)
            nisa.nc_transpose(dst=tp[:kr, j, :rows], data=p_sb[:rows, j * P : j * P + kr])
            pe.append((j, kr))
        if n_dma > 0:
            j0 = grp[n_pe][0]
            src = p_sb[:rows, j0 * P : (j0 + n_dma) * P].reshape((rows, n_dma, P))
            nisa.dma_transpose(dst=pt[:, j0 : j0 + n_dma, :rows], src=src, axes=(2, 1, 0))
    n_s = (len(pe) * scalar_evac + 4) // 8
    for on_scalar, part in ((True, pe[:n_s]), (False, pe[n_s:])):
        a = 0
        while a < len(part):
            b = a
            while (
                b + 1 < len(part)
                and part[b + 1][0] == part[b][0] + 1
                and part[b][1] == P
                and part[b + 1][1] == P
            ):
                b += 1
            j0, j1, kr = part[a][0], part[b][0] + 1, part[b][1]
            nisa.tensor_copy(
                dst=pt[:kr, j0:j1, :rows], src=tp[:kr, j0:j1, :rows], engine=copy_engine(on_scalar)
            )
            a = b + 1


def _stage_pv(job, i, tstate, rings, vt, sk, d):
    """This step's P @ V, accumulated over its sub-tiles in one PSUM tile."""
    rows = tstate[job["ti"]]["rows"]
    pt = rings["pt"][i % JOB_RING]
    o_ps = rings["o_ps"][:, i % 2, :]
    for idx, (j, u, _) in enumerate(job["slots"]):
        kr = min(P, sk - u * P)
        nisa.nc_matmul(
            dst=o_ps[:rows, :d],
            stationary=pt[:kr, j, :rows],
            moving=vt[:kr, u, :d],
            accumulate=idx > 0,
        )


def _stage_rescale(job, i, tstate, rings, out, lse_all, b, h0, scale, d):
    """O = alpha * O + (P @ V)_step (fp32 SBUF); after the last step, finalize the tile."""
    ti = job["ti"]
    st = tstate[ti]
    rows = st["rows"]
    o_ps = rings["o_ps"][:, i % 2, :]
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
        _finalize(st, o_src, rings, ti, out, lse_all, b, h0, rows, scale, d)
        tstate[ti] = None


def _finalize(st, o_src, rings, ti, out, lse_all, b, h0, rows, scale, d):
    """out = O / l (cast on ScalarE, DMA'd to HBM), lse = scale * m + log(l) (kept in the
    group's SBUF statistics tile until its single store)."""
    h, t0 = st["h"], st["t"] * P
    rl = _stat(rings, "rl", ti)
    nisa.reciprocal(dst=rl[:rows, :], data=st["l"][:rows, :])
    o_out = rings["o_out"][ti % OUT_RING]  # compute dtype == out dtype
    nisa.activation(dst=o_out[:rows, :d], op=nl.copy, data=o_src[:rows, :d], scale=rl[:rows, :])
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
