"""Online-softmax stages of the flash-attention forward (inlined NKI helpers; see
flash_fwd.py for the pipeline that calls them): the VectorE max pass with the masks,
the ScalarE exponential, the P^T transposes, P @ V, the O rescale and the tile's final
O / l and lse.
"""

from __future__ import annotations

from ..nki import nisa, nl
from ._fwd_plan import (
    FP32_MIN,
    MASK_RING,
    OUT_RING,
    chain_scale,
    dma_split,
    key_runs,
    o_slots,
    step_cols,
)
from ._staging import GROUP, P, copy_engine


def ring_slot(rings, name, i):
    """The ring buffer `name` of job (or query tile) i."""
    ring = rings[name]
    return ring[i % len(ring)]


def stage_max(job, i, tstate, rings, scale, sk):
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
    s_sb = ring_slot(rings, "s_sb", i)
    mu, _ = chain_scale(scale)
    runs = key_runs(job["slots"], split_masked=True)
    nb = ring_slot(rings, "m", i)
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


def dense_rings(rings, dense, n_sub):
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


def prefetch_mask(job, i, tstate, rings, sk):
    """DMA the PARTIAL sub-tiles of job i's dense mask (and bias) into its ring slot."""
    if "mk" not in rings or job.get("mask_loaded", False):
        return
    job["mask_loaded"] = True
    mask, bias = rings["dense"]
    st = tstate[job["ti"]]
    rows, t0 = st["rows"], st["t"] * P
    mb = job["grp"]["b"] if mask.shape[0] > 1 else 0
    mh = st["h"] if mask.shape[1] > 1 else 0
    for j0, u0, cnt, partial in key_runs(job["slots"], split_masked=True):
        if not partial:
            continue
        k0 = u0 * P
        ncols = min(cnt * P, sk - k0)
        src = (mb, mh, slice(t0, t0 + rows), slice(k0, k0 + ncols))
        nisa.dma_copy(dst=ring_slot(rings, "mk", i)[:rows, j0 * P : j0 * P + ncols], src=mask[src])
        if bias is not None:
            nisa.dma_copy(
                dst=ring_slot(rings, "bs", i)[:rows, j0 * P : j0 * P + ncols], src=bias[src]
            )


def _apply_dense(rings, i, s_view, rows, c0, ncols):
    """Scores of masked keys -> FP32_MIN (whatever they were, NaN included); + bias."""
    nisa.select_reduce(
        dst=s_view,
        predicate=ring_slot(rings, "mk", i)[:rows, c0 : c0 + ncols],
        on_true=s_view,
        on_false=FP32_MIN,
        reduce_cmd=nisa.reduce_cmd.idle,
    )
    if "bs" in rings:
        nisa.tensor_tensor(
            dst=s_view,
            data1=s_view,
            data2=ring_slot(rings, "bs", i)[:rows, c0 : c0 + ncols],
            op=nl.add,
        )


def stage_exp(job, i, tstate, rings, scale, sk):
    """ScalarE exp of the whole step with row sums; the rescale factor; GpSimd l update."""
    st = tstate[job["ti"]]
    rows = st["rows"]
    _, r = chain_scale(scale)
    nb = ring_slot(rings, "m", i)
    bias = nb
    if r != 1.0:
        bias = ring_slot(rings, "bias", i)
        nisa.activation(dst=bias[:rows, :], op=nl.copy, data=nb[:rows, :], scale=r)
    first = job["s"] == 0
    if not first:
        alpha = ring_slot(rings, "alpha", i)
        nisa.activation(
            dst=alpha[:rows, :],
            op=nl.exp,
            data=job["nb_prev"][:rows, :],
            bias=bias[:rows, :],
            scale=-r,
        )
        job["alpha"] = alpha
    ncols = step_cols(job["slots"], sk)
    p_sb = ring_slot(rings, "p", i)
    rs = ring_slot(rings, "rs", i)
    nisa.activation(
        dst=p_sb[:rows, :ncols],
        op=nl.exp,
        data=ring_slot(rings, "s_sb", i)[:rows, :ncols],
        bias=bias[:rows, :],
        scale=-r,
        reduce_op=nl.add,
        reduce_res=rs[:rows, :],
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )
    if first:
        st["l"] = rs
    else:
        l_new = ring_slot(rings, "l", i)
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


def stage_transpose(job, i, tstate, rings, sk, cdt, cfg):
    """P^T per 128-key sub-tile: the DMA engines take the first slots (one instruction),
    TensorE the rest into PSUM, copied out by ScalarE (first `scalar_evac` eighths) and
    VectorE."""
    dma_quarters, scalar_evac = cfg[3], cfg[4]
    rows = tstate[job["ti"]]["rows"]
    slots = job["slots"]
    p_sb = ring_slot(rings, "p", i)
    pt = ring_slot(rings, "pt", i)
    n_full = len(slots) if min(P, sk - slots[-1][1] * P) == P else len(slots) - 1
    n_dma = dma_split(len(slots), n_full, dma_quarters)
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


def stage_pv(job, i, tstate, rings, sk, d):
    """This step's P @ V, accumulated over its sub-tiles in one PSUM slot."""
    vt = job["grp"]["set"]["vt"]
    rows = tstate[job["ti"]]["rows"]
    pt = ring_slot(rings, "pt", i)
    o_ps = rings["o_ps"][:, i % o_slots(d), :]
    for idx, (j, u, _) in enumerate(job["slots"]):
        kr = min(P, sk - u * P)
        nisa.nc_matmul(
            dst=o_ps[:rows, :d],
            stationary=pt[:kr, j, :rows],
            moving=vt[:kr, u, :d],
            accumulate=idx > 0,
        )


def stage_rescale(job, i, tstate, rings, out, scale, d):
    """O = alpha * O + (P @ V)_step (fp32 SBUF); after the last step, finalize the tile."""
    ti = job["ti"]
    st = tstate[ti]
    rows = st["rows"]
    o_ps = rings["o_ps"][:, i % o_slots(d), :]
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
    rl = ring_slot(rings, "rl", ti)
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
    log_l = ring_slot(rings, "log_l", ti)
    nisa.activation(dst=log_l[:rows, :], op=nl.log, data=st["l"][:rows, :])
    t = st["t"]
    nisa.tensor_scalar(
        dst=lse_all[:rows, h - h0, t : t + 1],
        data=st["nb"][:rows, :],
        op0=nl.multiply,
        operand0=-chain_scale(scale)[1],
        op1=nl.add,
        operand1=log_l[:rows, :],
        engine=nisa.engine.gpsimd,
    )
