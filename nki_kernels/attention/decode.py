"""Decode attention as an NKI kernel: Sq = 1..k new queries over a (paged) KV cache.

Algorithm (per batch b and key/value head g; the G = Hq / Hkv query heads of the group
and their Sq new queries are packed into one tile of R = G * Sq <= 128 rows, so one
K^T / V load serves the whole group -- GQA packing):

    Q^T = DMA-transpose(q[b, heads of g])                      # [D, R]
    m_s = -big, l_s = 0, O_s = 0     for s in 0..splits-1        # independent accumulators
    for step t (kv_tile keys; step t belongs to split s = t % splits):
        K^T, V  = cache keys [t * kv_tile, ...)                  # contiguous slices, or
                                                                 # rows gathered by slot
        S  = Q^T.T @ K^T                                         # TensorE -> PSUM [R, kv_tile]
        S, mx = range_select(S, lo_r <= key < hi_r), rowmax      # VectorE, one instruction
        m' = max(m_s, mx); P = exp(scale (S - m')), rs = rowsum(P)   # ScalarE
        a = exp(scale (m_s - m')); l_s = a l_s + rs
        P^T per 128 keys (TensorE) ; O_s = a O_s + P^T.T @ V
    combine (on chip): m = max_s m_s, w_s = exp(scale (m_s - m)),
    out = sum_s w_s O_s / sum_s w_s l_s,  lse = scale m + log(sum_s w_s l_s)

Schedule: a three-stage software pipeline in issue order (scores + mask + max of step
i, exponent of step i - 1, P^T and P @ V of step i - 2), K / V loaded LOOKAHEAD steps
ahead. Split-K: a step's exponent needs the running max of its own split only, so with
`splits` > 1 consecutive steps carry no dependency through the statistics; the splits
are merged once, on chip, at the end. Contiguous 512-key steps load K and V with
partition p holding 4 consecutive keys (1 KiB descriptors) and build K^T on TensorE.

Layouts: q [B, Hq, Sq, D]; out the same; lse [B, Hq, Sq] fp32. Contiguous cache
(`slots` None): k, v [B, Hkv, S_max, D]. Paged (vLLM's layout): k, v [num_blocks,
block_size, Hkv, D] and `slots` int32 [B, n_steps * kv_tile, 1], the cache row
(block * block_size + offset) of each key position: 128 keys at a time are gathered by
`vector_select` (K^T through a gathering DMA transpose). `bounds` fp32 [B, 128, 2]: the
key interval [lo, hi) of packed row r = (head in group) * Sq + i (hi = cache_len - Sq +
i + 1: causal among the new tokens); keys past a row's hi are masked, so positions
beyond a sequence's length are computed and discarded (the static step count is the
longest sequence's, rounded up to kv_tile: one specialization per cache-length bucket,
not per length). Masked cache rows must hold finite values (0 * NaN is NaN in P @ V).

Limits: D <= 256 (Q^T / K^T in 128-row chunks, one accumulating contraction pass
each); G * Sq <= 128; kv_tile a multiple of 128, <= 512 (one PSUM bank).
"""

from __future__ import annotations

from ..nki import nisa, nki, nl
from ._staging import GROUP, P, compute_dtype, transpose_kt_group

BIG = 3.0e38  # running-max start: finite, so exp(scale (m_s - m')) is 0, never NaN
FP32_MIN = -3.4028235e38  # range_select's required fill (hardware constraint)
LOOKAHEAD = 3  # steps ahead that K / V are loaded (hides the DMA's ~2 us fixed latency)
RING = LOOKAHEAD + 3  # K / V slots: a step's V is read two iterations after its scores


@nki.jit
def decode_attention_fwd(q, k, v, slots, bounds, softmax_scale, n_steps, kv_tile, splits):
    """out [B, Hq, Sq, D] (q.dtype), lse [B, Hq, Sq] fp32 of decode attention.

    q: [B, Hq, Sq, D]; k, v: [B, Hkv, S_max, D] (slots None) or [NB, bs, Hkv, D] with
    slots int32 [B, n_steps * kv_tile, 1]; bounds: fp32 [B, 128, 2]; n_steps: key steps
    of kv_tile keys; splits: independent online-softmax accumulators (split-K).
    """
    batch, hq, sq, d = q.shape
    paged = slots is not None
    hkv = k.shape[2] if paged else k.shape[1]
    group = hq // hkv
    rows = group * sq
    cdt = compute_dtype(q.dtype)
    out = nl.ndarray((batch, hq, sq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((batch, hq, sq), dtype=nl.float32, buffer=nl.shared_hbm)
    nprog, pid = (nl.num_programs(0), nl.program_id(0)) if nl.program_ndim() != 0 else (1, 0)
    n_sub = kv_tile // P
    r = _rings(d, cdt, kv_tile, n_sub, splits)
    items = [(b, g) for b in range(batch) for g in range(hkv)]
    for idx in range(pid, len(items), nprog):
        b, g = items[idx]
        h0 = g * group
        qt = r["qt"]
        q_rows = q[b, h0 : h0 + group].reshape((rows, d))
        for c, c0, dc in _dchunks(d):
            nisa.dma_transpose(dst=qt[:dc, c, :rows], src=q_rows[:, c0 : c0 + dc])
        bnd = r["bnd"]
        nisa.dma_copy(dst=bnd, src=bounds[b])
        for s in range(splits):
            nisa.memset(dst=r["m"][s][:rows, :], value=-BIG)
            nisa.memset(dst=r["l"][s][:rows, :], value=0.0)
            nisa.memset(dst=r["o"][s][:rows, :d], value=0.0)
        n_keys = n_steps * kv_tile if paged else min(n_steps * kv_tile, k.shape[2])
        io = (k, v, slots, b, g, d, kv_tile, n_keys)
        for t in range(min(LOOKAHEAD, n_steps)):
            _load(io, r, t)
        ns = [min(kv_tile, n_keys - t * kv_tile) for t in range(n_steps)]
        for i in range(n_steps + 2):  # software pipeline: stage A of i, B of i - 1, C of i - 2
            if i < n_steps:
                _stage_scores(r, i, rows, d, kv_tile, ns[i])
            if 0 <= i - 1 < n_steps:
                _stage_exp(r, i - 1, (i - 1) % splits, rows, ns[i - 1], softmax_scale)
            if 0 <= i - 2 < n_steps:
                _stage_pv(r, i - 2, (i - 2) % splits, rows, d, ns[i - 2])
            if i + LOOKAHEAD < n_steps:
                _load(io, r, i + LOOKAHEAD)

        _combine(r, min(splits, n_steps), rows, d, softmax_scale)
        nisa.dma_copy(dst=out[b, h0 : h0 + group].reshape((rows, d)), src=r["out"][:rows, :d])
        nisa.dma_copy(dst=lse[b, h0 : h0 + group].reshape((rows, 1)), src=r["lse"][:rows, :])
    return out, lse


def _rings(d, cdt, kv_tile, n_sub, splits):
    f32, sb, ps = nl.float32, nl.sbuf, nl.psum
    r = {
        "qt": nl.ndarray((min(d, P), _chunks(d), P), dtype=cdt, buffer=sb),
        "bnd": nl.ndarray((P, 2), dtype=f32, buffer=sb),
        "kt": [
            nl.ndarray((min(d, P), _chunks(d), kv_tile), dtype=cdt, buffer=sb) for _ in range(RING)
        ],
        "vt": [nl.ndarray((P, n_sub, d), dtype=cdt, buffer=sb) for _ in range(RING)],
        "idx": [nl.ndarray((P, n_sub), dtype=nl.uint32, buffer=sb) for _ in range(RING)],
        "s_ps": [nl.ndarray((P, kv_tile), dtype=f32, buffer=ps) for _ in range(2)],
        "s": [nl.ndarray((P, kv_tile), dtype=f32, buffer=sb) for _ in range(2)],
        "p": [nl.ndarray((P, kv_tile), dtype=cdt, buffer=sb) for _ in range(3)],
        "tp": [nl.ndarray((P, n_sub, P), dtype=cdt, buffer=ps) for _ in range(2)],
        "pt": [nl.ndarray((P, n_sub, P), dtype=cdt, buffer=sb) for _ in range(2)],
        "o_ps": [nl.ndarray((P, d), dtype=f32, buffer=ps) for _ in range(2)],
        "out": nl.ndarray((P, d), dtype=cdt, buffer=sb),
        "kraw": [nl.ndarray((P, n_sub, d), dtype=cdt, buffer=sb) for _ in range(RING)],
        "ktp": [nl.ndarray((P, n_sub, P), dtype=cdt, buffer=ps) for _ in range(2)],
        "il": [False] * RING,  # ring slot holds an interleaved step (see _load)
        "lse": nl.ndarray((P, 1), dtype=f32, buffer=sb),
    }
    for name, depth in (("mx", 3), ("mn", 2), ("nb", 2), ("a", 4), ("rs", 2)):
        r[name] = [nl.ndarray((P, 1), dtype=f32, buffer=sb) for _ in range(depth)]
    for name in ("m", "l"):
        r[name] = [nl.ndarray((P, 1), dtype=f32, buffer=sb) for _ in range(splits)]
    r["o"] = [nl.ndarray((P, d), dtype=f32, buffer=sb) for _ in range(splits)]
    return r


def _chunks(d):
    return (d + P - 1) // P


def _dchunks(d):
    """(chunk, first column, rows) of each 128-row head_dim chunk of Q^T / K^T."""
    return [(c, c * P, min(P, d - c * P)) for c in range(_chunks(d))]


def _load(io, r, t):
    """Stage K^T [D, kv_tile] and V [128, n_sub, D] of step t into ring slot t % RING."""
    k, v, slots, b, g, d, kv_tile, n_keys = io
    kt, vt = r["kt"][t % RING], r["vt"][t % RING]
    k0 = t * kv_tile
    n_sub = kv_tile // P
    r["il"][t % RING] = False
    if slots is None and kv_tile == GROUP * P and n_keys - k0 >= kv_tile and d <= P:
        # 512 keys with partition p holding keys 4p .. 4p + 3 (1 KiB descriptors for bf16
        # D = 128, not 256 B rows): K^T by TensorE transposes (the DMA transpose of the
        # whole step kept the DMA engines ~96 % busy), V stays interleaved and the P^T
        # sub-tiles take P's matching strided columns
        src = (b, g, slice(k0, k0 + kv_tile), slice(0, d))
        raw = r["kraw"][t % RING]
        nisa.dma_copy(dst=raw[:, :, :d], src=k[src].reshape((P, GROUP, d)))
        nisa.dma_copy(dst=vt[:, :, :d], src=v[src].reshape((P, GROUP, d)))
        kt2 = kt[:d, 0, :]
        transpose_kt_group(raw[:, :, :d], kt2, 0, kv_tile, d, kt.dtype, True, r["ktp"][t % 2])
        r["il"][t % RING] = True
        return
    if slots is None:  # the last step may be ragged (S_max not a multiple of kv_tile)
        n = min(kv_tile, n_keys - k0)
        for c, c0, dc in _dchunks(d):
            nisa.dma_transpose(dst=kt[:dc, c, :n], src=k[b, g, k0 : k0 + n, c0 : c0 + dc])
        for u in range((n + P - 1) // P):
            kr = min(P, n - u * P)
            nisa.dma_copy(dst=vt[:kr, u, :d], src=v[b, g, k0 + u * P : k0 + u * P + kr, :])
        return
    idx = r["idx"][t % RING]
    nisa.dma_copy(
        dst=idx[:, :n_sub], src=slots[b, k0 : k0 + kv_tile, :].reshape((n_sub, P)).permute((1, 0))
    )
    nb, bs = k.shape[0], k.shape[1]
    kf = k.reshape((nb * bs, k.shape[2] * d))
    vf = v.reshape((nb * bs, v.shape[2] * d))
    two_byte = kt.dtype != nl.float32
    for u in range(n_sub):
        col = idx[:, u : u + 1]
        if two_byte:  # the DMA engines gather and transpose in one pass (2-byte elements)
            for c, c0, dc in _dchunks(d):
                krows = kf[:, g * d + c0 : g * d + c0 + dc].vector_select(0, col)
                nisa.dma_transpose(dst=kt[:dc, c, u * P : (u + 1) * P], src=krows)
        else:  # fp32: gather rows, transpose on TensorE (DMA transposes of gathered fp32
            # rows are not supported)
            kraw = r["kraw"][t % RING]
            nisa.dma_copy(dst=kraw[:, u, :d], src=kf[:, g * d : (g + 1) * d].vector_select(0, col))
        nisa.dma_copy(dst=vt[:, u, :d], src=vf[:, g * d : (g + 1) * d].vector_select(0, col))
    if not two_byte:
        for c, c0, dc in _dchunks(d):
            for u in range(n_sub):
                nisa.nc_transpose(
                    dst=r["ktp"][0][:dc, u, :], data=r["kraw"][t % RING][:, u, c0 : c0 + dc]
                )
            ktp = r["ktp"][0][:dc].reshape((dc, n_sub * P))
            nisa.tensor_copy(dst=kt[:dc, c, :kv_tile], src=ktp, engine=nisa.engine.vector)


def _stage_scores(r, t, rows, d, kv_tile, n):
    """Stage A of step t: S = Q K^T (PSUM), masked copy to SBUF with the row max."""
    s_ps, s_sb, mx = r["s_ps"][t % 2], r["s"][t % 2], r["mx"][t % 3]
    kt = r["kt"][t % RING]
    bnd = r["bnd"]
    for c, _, dc in _dchunks(d):  # head_dim > 128: one accumulating pass per 128 rows
        nisa.nc_matmul(
            dst=s_ps[:rows, :n],
            stationary=r["qt"][:dc, c, :rows],
            moving=kt[:dc, c, :n],
            accumulate=c > 0,
        )
    nisa.range_select(
        dst=s_sb[:rows, :n],
        on_true_tile=s_ps[:rows, :n],
        comp_op0=nl.greater_equal,
        comp_op1=nl.less,
        bound0=bnd[:rows, 0:1],
        bound1=bnd[:rows, 1:2],
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
        reduce_res=mx[:rows, :],
        reduce_op=nl.maximum,
        range_start=t * kv_tile,
        on_false_value=FP32_MIN,
    )


def _stage_exp(r, t, s, rows, n, scale):
    """Stage B of step t: new max of split s, P = exp(scale (S - m')), row sums, the
    rescale factor a and l = a l + rowsum."""
    s_sb, p_sb = r["s"][t % 2], r["p"][t % 3]
    mx, a = r["mx"][t % 3], r["a"][t % 4]
    mn, nb, rs = r["mn"][t % 2], r["nb"][t % 2], r["rs"][t % 2]
    m, l = r["m"][s], r["l"][s]
    nisa.tensor_tensor(dst=mn[:rows, :], data1=m[:rows, :], data2=mx[:rows, :], op=nl.maximum)
    nisa.activation(dst=nb[:rows, :], op=nl.copy, data=mn[:rows, :], scale=-scale)
    nisa.activation(
        dst=p_sb[:rows, :n],
        op=nl.exp,
        data=s_sb[:rows, :n],
        bias=nb[:rows, :],
        scale=scale,
        reduce_op=nl.add,
        reduce_res=rs[:rows, :],
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )
    nisa.activation(dst=a[:rows, :], op=nl.exp, data=m[:rows, :], bias=nb[:rows, :], scale=scale)
    nisa.tensor_scalar(
        dst=l[:rows, :],
        data=l[:rows, :],
        op0=nl.multiply,
        operand0=a[:rows, :],
        op1=nl.add,
        operand1=rs[:rows, :],
        engine=nisa.engine.gpsimd,
    )
    nisa.tensor_copy(dst=m[:rows, :], src=mn[:rows, :], engine=nisa.engine.gpsimd)


def _stage_pv(r, t, s, rows, d, n):
    """Stage C of step t: P^T per 128 keys (TensorE), O_s = a O_s + P^T.T @ V."""
    p_sb, a, o = r["p"][t % 3], r["a"][t % 4], r["o"][s]
    vt = r["vt"][t % RING]
    tp, pt, o_ps = r["tp"][t % 2], r["pt"][t % 2], r["o_ps"][t % 2]
    n_sub = (n + P - 1) // P
    last = n - (n_sub - 1) * P  # keys of the last (possibly ragged) sub-tile
    interleaved = r["il"][t % RING]
    for u in range(n_sub):
        kr = min(P, n - u * P)
        cols = p_sb[:rows, u:n:GROUP] if interleaved else p_sb[:rows, u * P : u * P + kr]
        nisa.nc_transpose(dst=tp[:kr, u, :rows], data=cols)
    full = n_sub if last == P else n_sub - 1
    if full > 0:
        nisa.tensor_copy(
            dst=pt[:, :full, :rows], src=tp[:, :full, :rows], engine=nisa.engine.scalar
        )
    if full < n_sub:
        nisa.tensor_copy(
            dst=pt[:last, full, :rows], src=tp[:last, full, :rows], engine=nisa.engine.scalar
        )
    for u in range(n_sub):
        kr = min(P, n - u * P)
        nisa.nc_matmul(
            dst=o_ps[:rows, :d],
            stationary=pt[:kr, u, :rows],
            moving=vt[:kr, u, :d],
            accumulate=u > 0,
        )
    nisa.scalar_tensor_tensor(
        dst=o[:rows, :d],
        data=o[:rows, :d],
        op0=nl.multiply,
        operand0=a[:rows, :],
        op1=nl.add,
        operand1=o_ps[:rows, :d],
    )


def _combine(r, n, rows, d, scale):
    """Merge the n split accumulators into out = O / l and lse = scale * m + log(l)."""
    m0, l0, o0 = r["m"][0], r["l"][0], r["o"][0]
    for s in range(1, n):
        ms, ls, os_ = r["m"][s], r["l"][s], r["o"][s]
        mn, nb, a = r["mn"][0], r["nb"][0], r["a"][0]
        w = r["a"][1]
        nisa.tensor_tensor(dst=mn[:rows, :], data1=m0[:rows, :], data2=ms[:rows, :], op=nl.maximum)
        nisa.activation(dst=nb[:rows, :], op=nl.copy, data=mn[:rows, :], scale=-scale)
        nisa.activation(
            dst=a[:rows, :], op=nl.exp, data=m0[:rows, :], bias=nb[:rows, :], scale=scale
        )
        nisa.activation(
            dst=w[:rows, :], op=nl.exp, data=ms[:rows, :], bias=nb[:rows, :], scale=scale
        )
        nisa.tensor_scalar(
            dst=ls[:rows, :], data=ls[:rows, :], op0=nl.multiply, operand0=w[:rows, :]
        )
        nisa.tensor_scalar(
            dst=l0[:rows, :],
            data=l0[:rows, :],
            op0=nl.multiply,
            operand0=a[:rows, :],
            op1=nl.add,
            operand1=ls[:rows, :],
        )
        nisa.tensor_scalar(
            dst=o0[:rows, :d], data=o0[:rows, :d], op0=nl.multiply, operand0=a[:rows, :]
        )
        nisa.scalar_tensor_tensor(
            dst=o0[:rows, :d],
            data=os_[:rows, :d],
            op0=nl.multiply,
            operand0=w[:rows, :],
            op1=nl.add,
            operand1=o0[:rows, :d],
        )
        nisa.tensor_copy(dst=m0[:rows, :], src=mn[:rows, :])
    rl = r["rs"][0]
    nisa.reciprocal(dst=rl[:rows, :], data=l0[:rows, :])
    nisa.tensor_scalar(
        dst=r["out"][:rows, :d], data=o0[:rows, :d], op0=nl.multiply, operand0=rl[:rows, :]
    )
    log_l = r["mx"][0]
    nisa.activation(dst=log_l[:rows, :], op=nl.log, data=l0[:rows, :])
    nisa.scalar_tensor_tensor(
        dst=r["lse"][:rows, :],
        data=m0[:rows, :],
        op0=nl.multiply,
        operand0=scale,
        op1=nl.add,
        operand1=log_l[:rows, :],
    )


__all__ = ["decode_attention_fwd"]
