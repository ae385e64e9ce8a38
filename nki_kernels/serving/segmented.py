"""Serving attention as one NKI kernel: write the new tokens' K / V into the cache, then
attend every packed query over its sequence's cached prefix plus its own new tokens.

One launch serves a whole scheduler step: chunked-prefill chunks, prefix-cache hits,
decode rows and speculative drafts are all "queries of sequence s at positions
[cached_seq_len[s], cached_seq_len[s] + query_len[s])", causal among themselves and
seeing the whole prefix. The host (`serving/host.py`) plans the step into work items.

Phase 1 (cache write; skipped when `k_new` is None), every program alike:

    for each 128-token tile of the new rows:
        X = k_new[tile]  (q.dtype)  -> fp8 caches: X = clamp(X * (1 / k_scale[g]), +-fp8_max)
        cache rows[write_rows[tile]] = X        # indirect DMA scatter, slot -1 skipped
    (V alike). Each program writes every new row: the writes are idempotent, so the
    programs of kernel[2] need no barrier before reading them back.

Phase 2, per work item (one sequence's query tile) and KV head g; the G = Hq / Hkv query
heads of the group and the item's TQ tokens are one tile of R = G * TQ <= 128 rows:

    m = rowinfo.m0, l = rowinfo.l0, O = 0       # sinks: m0 = sink / sc, l0 = 1
    for step t (kv_tile key positions, gathered through key_rows: one vector_select DMA
               per 128 rows each for K and V; positions past the sequence's length carry
               a negative row, are skipped by the DMA, and their V rows are zeros):
        K, V  = gathered rows (fp8: converted to the compute dtype on VectorE / GpSimd)
        K^T   = PE transposes of K (128 keys each)
        S     = Q^T.T @ K^T                                       # PSUM [R, kv_tile]
        S, mx = range_select(S, lo_r <= key < hi_r), rowmax          # masked keys selected away
        m' = max(m, mx); P = exp(sc (S - m')), rs = rowsum(P)  # sc = scale * k_scale[g]
        a = exp(sc (m - m')); l = a l + rs; O = a O + P^T.T @ V
    out = O * (v_scale[g] / l)

Scales fold into the softmax (k_scale into sc) and the output (v_scale): the cached
fp8 values are never multiplied by their scale element by element.

Layouts (`layout`): "nhd" = [num_blocks, block_size, Hkv, D] (vLLM): a key's row is
block * block_size + offset in the [num_blocks * block_size, Hkv * D] view, head g its
columns g * D ...; "hnd" = [num_blocks, Hkv, block_size, D] (vLLM-Neuron; a contiguous
[B, Hkv, S_max, D] cache is this layout with one block per sequence): row
block * Hkv * block_size + offset of the [num_blocks * Hkv * block_size, D] view,
shifted by g * block_size for head g.

Inputs: q_t [n_items, Hkv, D, R] (Q^T, packed by the host); k_new, v_new [T, Hkv * D]
(or None); write_rows int32 [T, 1]; key_rows int32 [n_items, n_steps, 128, kv_tile / 128]
(key u * 128 + p of step s at [s, p, u]: each step's index tile is one contiguous load)
and key_mask None -- or, grouped gathers (512-key steps, block sizes divisible by 4),
key_rows [n_items, n_steps, 128, 1] (partition p: the row / 4 of key 4p, its group of 4
consecutive keys one row of the grouped view; key rows of whole 32-bit words) and key_mask
int32 [n_items, n_steps, 128, 4] (-1: a key of the sequence, 0: not; the V rows of the
others are zeroed by a bitwise AND of their words with the mask, on GpSimd);
rowinfo fp32 [n_items, Hkv, 128, 4] = (lo, hi, m0, l0) per packed row; scales fp32 [Hkv, 4] =
(softmax_scale * k_scale, v_scale, 1 / k_scale, 1 / v_scale). Output [n_items, Hkv, R, D]
in q's dtype. Rows with no key and no sink have l = 0 (their out is not finite: the host
selects them to 0).

Schedule: one three-stage software pipeline in issue order over every (work unit, step)
of a program (scores of pipeline step k, exponent of k - 1, P @ V of k - 2; a unit's
first steps overlap the previous units' last ones, UNITS slots of per-unit state), the
gathers LOOKAHEAD steps ahead into a ring of buffers, so the DMA queues, TensorE,
ScalarE and VectorE work on different steps at once.

Limits: D <= 256 (Q^T / K^T in 128-row chunks); R <= 128; kv_tile a multiple of 128,
<= 512 (one fp32 PSUM bank of scores).
"""

from __future__ import annotations

from ..attention._staging import compute_dtype
from ..nki import nisa, nki, nl

P = 128  # partitions; also the rows of one gather DMA
M_INIT = -1.0e30  # running-max start without a sink: finite, and sc * M_INIT stays finite
# for any sc < 3e8, so exp(sc (S - m')) of a fully masked step is exp(-inf) = 0, never NaN
FP32_MIN = -3.4028235e38  # range_select's required fill (hardware constraint)
GROUP = 4  # keys per partition of a grouped gather (512-key steps: 128 partitions x 4)
LOOKAHEAD = 2  # steps ahead that K / V are gathered (hides the DMAs' fixed latency)
RING = LOOKAHEAD + 3  # gather slots: a step's V is read two iterations after its scores
UNITS = 3  # work-unit state slots: units of one step each overlap three deep (A, B, C)


@nki.jit
def serving_attention_fwd(
    q_t, k_new, v_new, k_cache, v_cache, write_rows, key_rows, key_mask, rowinfo, scales,
    layout, n_steps, kv_tile, fp8_max,
):  # fmt: skip
    """The NKI entry point of `serving_attention_body` (same arguments)."""
    return serving_attention_body(
        q_t, k_new, v_new, k_cache, v_cache, write_rows, key_rows, key_mask, rowinfo, scales,
        layout, n_steps, kv_tile, fp8_max,
    )  # fmt: skip


def serving_attention_body(
    q_t, k_new, v_new, k_cache, v_cache, write_rows, key_rows, key_mask, rowinfo, scales,
    layout, n_steps, kv_tile, fp8_max,
):  # fmt: skip
    """out [n_items, Hkv, R, D] (q_t.dtype); see the module docstring for the arguments.
    Undecorated: `serving_attention_fwd` and the mixed serving step trace it inline."""
    n_items, hkv, d, rows = q_t.shape
    cdt = compute_dtype(q_t.dtype)
    out = nl.ndarray((n_items, hkv, rows, d), dtype=q_t.dtype, buffer=nl.shared_hbm)
    kf, vf, bs = _flat_views(k_cache, v_cache, layout, hkv, d)
    if k_new is not None:
        _write_new_rows(k_new, kf, write_rows, scales, 2, layout, bs, hkv, d, fp8_max)
        _write_new_rows(v_new, vf, write_rows, scales, 3, layout, bs, hkv, d, fp8_max)
    nprog, pid = (nl.num_programs(0), nl.program_id(0)) if nl.program_ndim() != 0 else (1, 0)
    t = _tiles(d, rows, cdt, k_cache.dtype, kv_tile)
    t["grouped"] = key_mask is not None
    work = [(i, g) for i in range(n_items) for g in range(hkv)][pid::nprog]
    # one software pipeline over every (work unit, step) of this program: a unit's
    # first steps overlap the previous units' last ones (UNITS state slots in flight)
    steps = [(n, s) for n in range(len(work)) for s in range(n_steps)]
    view = _head_views if key_mask is None else _group_views
    views = [view(kf, vf, layout, bs, g, d) for g in range(hkv)]
    src = (work, steps, views, key_rows, key_mask, kv_tile)
    for k in range(min(LOOKAHEAD, len(steps))):
        _load(t, *_step_io(src, k), k)
    for k in range(len(steps) + 2):  # A of step k, B of k - 1, C of k - 2
        if k < len(steps):
            n, s_ = steps[k]
            if s_ == 0:
                _start_unit(t, n % UNITS, q_t, rowinfo, scales, work[n], rows, d)
            _stage_scores(t, k, s_, n % UNITS, rows, d, kv_tile)
        if 0 <= k - 1 < len(steps):
            _stage_exp(t, k - 1, steps[k - 1][0] % UNITS, rows, kv_tile)
        if 0 <= k - 2 < len(steps):
            n, s_ = steps[k - 2]
            _stage_pv(t, k - 2, n % UNITS, rows, d, kv_tile)
            if s_ == n_steps - 1:
                _finish_unit(t, n % UNITS, out, work[n], rows, d)
        if k + LOOKAHEAD < len(steps):
            _load(t, *_step_io(src, k + LOOKAHEAD), k + LOOKAHEAD)
    return out


def _step_io(src, k):
    """(gather arguments, the unit's step) of pipeline step k."""
    work, steps, views, key_rows, key_mask, kv_tile = src
    n, s = steps[k]
    i, g = work[n]
    kg, vg = views[g]
    return (kg, vg, key_rows, key_mask, i, kv_tile), s


def _start_unit(t, u, q_t, rowinfo, scales, unit, rows, d):
    """Load work unit (item i, KV head g)'s Q^T, row bounds and scales into state slot u;
    the running max / sum start at the rows' softmax start, O at 0."""
    i, g = unit
    for c, c0, dc in _dchunks(d):
        nisa.dma_copy(dst=t["qt"][u][:dc, c, :rows], src=q_t[i, g, c0 : c0 + dc, :])
    info = t["info"][u]
    nisa.dma_copy(dst=info, src=rowinfo[i, g])
    nisa.dma_copy(dst=t["sc"][u], src=scales[g : g + 1, :].broadcast(0, P))
    nisa.tensor_copy(dst=t["m"][u][:rows, :], src=info[:rows, 2:3])
    nisa.tensor_copy(dst=t["l"][u][:rows, :], src=info[:rows, 3:4])
    nisa.memset(dst=t["o"][u][:rows, :d], value=0.0)


def _finish_unit(t, u, out, unit, rows, d):
    """out[i, g] = O * (v_scale / l) of the unit in state slot u."""
    i, g = unit
    rl = t["rl"][u]
    nisa.reciprocal(dst=rl[:rows, :], data=t["l"][u][:rows, :])
    nisa.tensor_scalar(
        dst=rl[:rows, :], data=rl[:rows, :], op0=nl.multiply, operand0=t["sc"][u][:rows, 1:2]
    )
    res = t["out"][u]
    nisa.tensor_scalar(
        dst=res[:rows, :d], data=t["o"][u][:rows, :d], op0=nl.multiply, operand0=rl[:rows, :]
    )
    nisa.dma_copy(dst=out[i, g], src=res[:rows, :d])


def _flat_views(k_cache, v_cache, layout, hkv, d):
    """2-D row views of the caches (see the module docstring) and the block size."""
    if layout == "nhd":
        nb, bs = k_cache.shape[0], k_cache.shape[1]
        shape = (nb * bs, hkv * d)
    else:
        nb, bs = k_cache.shape[0], k_cache.shape[2]
        shape = (nb * hkv * bs, d)
    return k_cache.reshape(shape), v_cache.reshape(shape), bs


def _head_views(kf, vf, layout, bs, g, d):
    """Row views whose row r is key row r of KV head g."""
    if layout == "nhd":
        return kf[:, g * d : (g + 1) * d], vf[:, g * d : (g + 1) * d]
    n = kf.shape[0]
    return kf[g * bs : n, :], vf[g * bs : n, :]


def _group_views(kf, vf, layout, bs, g, d):
    """Row views whose row r holds keys 4r .. 4r + 3 of KV head g (block sizes divisible by
    4: the four keys share a block; "hnd": one 4 * D run, "nhd": four D runs)."""
    if layout == "nhd":
        n, w = kf.shape
        k4 = kf.reshape((n // GROUP, GROUP, w))[:, :, g * d : (g + 1) * d]
        v4 = vf.reshape((n // GROUP, GROUP, w))[:, :, g * d : (g + 1) * d]
        return k4, v4
    n = kf.shape[0] // GROUP
    k4, v4 = kf.reshape((n, GROUP * d)), vf.reshape((n, GROUP * d))
    return k4[g * bs // GROUP : n, :], v4[g * bs // GROUP : n, :]


def _write_new_rows(x, flat, write_rows, scales, inv_col, layout, bs, hkv, d, fp8_max):
    """Scatter the new rows x [T, Hkv * D] into the cache rows named by write_rows (rows
    with a negative index are skipped); quantized with 1 / scale when fp8_max > 0."""
    n_tok = x.shape[0]
    width = hkv * d
    cache_dt = flat.dtype
    sc = nl.ndarray((P, hkv, 4), dtype=nl.float32, buffer=nl.sbuf)
    if fp8_max > 0.0:
        for g in range(hkv):
            nisa.dma_copy(dst=sc[:, g, :], src=scales[g : g + 1, :].broadcast(0, P))
    for t0 in range(0, n_tok, P):
        n = min(P, n_tok - t0)
        idx = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx[:n, :], src=write_rows[t0 : t0 + n, :])
        raw = nl.ndarray((P, width), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=raw[:n, :], src=x[t0 : t0 + n, :])
        rows = raw
        if fp8_max > 0.0:
            # quantize: x / scale, saturated to the format's largest finite value (NaN
            # stays NaN: min / max propagate it)
            tmp = nl.ndarray((P, width), dtype=nl.float32, buffer=nl.sbuf)
            rows = nl.ndarray((P, width), dtype=cache_dt, buffer=nl.sbuf)
            for g in range(hkv):
                cols = slice(g * d, (g + 1) * d)
                nisa.tensor_scalar(
                    dst=tmp[:n, cols], data=raw[:n, cols], op0=nl.multiply,
                    operand0=sc[:n, g, inv_col : inv_col + 1], op1=nl.minimum, operand1=fp8_max,
                )  # fmt: skip
            nisa.tensor_scalar(dst=rows[:n, :], data=tmp[:n, :], op0=nl.maximum, operand0=-fp8_max)
        if layout == "nhd":
            nisa.dma_copy(
                dst=flat.vector_select(0, idx[:n, :]), src=rows[:n, :width],
                oob_mode=nisa.oob_mode.skip,
            )  # fmt: skip
        else:
            total = flat.shape[0]
            for g in range(hkv):
                nisa.dma_copy(
                    dst=flat[g * bs : total, :].vector_select(0, idx[:n, :]),
                    src=rows[:n, g * d : (g + 1) * d], oob_mode=nisa.oob_mode.skip,
                )  # fmt: skip


def _tiles(d, rows, cdt, cache_dt, kv_tile):
    """On-chip buffers: rings of RING slots for what the loads fill (written LOOKAHEAD steps
    ahead), two or more slots for each pipeline stage's results."""
    f32, sb, ps = nl.float32, nl.sbuf, nl.psum
    nc, n_sub, dp = _chunks(d), kv_tile // P, min(d, P)
    convert = cache_dt != cdt
    t = {
        "qt": [nl.ndarray((dp, nc, P), dtype=cdt, buffer=sb) for _ in range(UNITS)],
        "info": [nl.ndarray((P, 4), dtype=f32, buffer=sb) for _ in range(UNITS)],
        "sc": [nl.ndarray((P, 4), dtype=f32, buffer=sb) for _ in range(UNITS)],
        "idx": [nl.ndarray((P, n_sub), dtype=nl.int32, buffer=sb) for _ in range(RING)],
        "vmask": [nl.ndarray((P, n_sub), dtype=nl.int32, buffer=sb) for _ in range(RING)],
        "kraw": [nl.ndarray((P, n_sub, d), dtype=cache_dt, buffer=sb) for _ in range(RING)],
        "vraw": [nl.ndarray((P, n_sub, d), dtype=cache_dt, buffer=sb) for _ in range(RING)],
        "kt_ps": [nl.ndarray((dp, kv_tile), dtype=cdt, buffer=ps) for _ in range(2)],
        "kt": [nl.ndarray((dp, nc, kv_tile), dtype=cdt, buffer=sb) for _ in range(2)],
        "s_ps": [nl.ndarray((P, kv_tile), dtype=f32, buffer=ps) for _ in range(2)],
        "s": [nl.ndarray((P, kv_tile), dtype=f32, buffer=sb) for _ in range(2)],
        "p": [nl.ndarray((P, kv_tile), dtype=cdt, buffer=sb) for _ in range(3)],
        "pt_ps": [nl.ndarray((P, n_sub, P), dtype=cdt, buffer=ps) for _ in range(2)],
        "pt": [nl.ndarray((P, n_sub, P), dtype=cdt, buffer=sb) for _ in range(2)],
        "o_ps": [nl.ndarray((P, d), dtype=f32, buffer=ps) for _ in range(2)],
        "o": [nl.ndarray((P, d), dtype=f32, buffer=sb) for _ in range(UNITS)],
        "out": [nl.ndarray((P, d), dtype=cdt, buffer=sb) for _ in range(UNITS)],
    }
    for name in ("m", "l", "rl"):
        t[name] = [nl.ndarray((P, 1), dtype=f32, buffer=sb) for _ in range(UNITS)]
    if convert:  # fp8 cache: the compute-dtype copies of the gathered K / V
        t["k"] = [nl.ndarray((P, n_sub, d), dtype=cdt, buffer=sb) for _ in range(2)]
        t["v"] = [nl.ndarray((P, n_sub, d), dtype=cdt, buffer=sb) for _ in range(3)]
    for name, depth in (("mx", 3), ("mn", 2), ("nb", 2), ("a", 4), ("rs", 2)):
        t[name] = [nl.ndarray((P, 1), dtype=f32, buffer=sb) for _ in range(depth)]
    t["convert"] = convert
    return t


def _chunks(d):
    return (d + P - 1) // P


def _dchunks(d):
    """(chunk, first column, rows) of each 128-row head_dim chunk of Q^T / K^T."""
    return [(c, c * P, min(P, d - c * P)) for c in range(_chunks(d))]


def _load(t, io, s, k):
    """Gather the K and V rows of step s (kv_tile key positions) into ring slot s % RING.

    Positions past the sequence's length never contribute, whatever the cache holds there
    (NaN included): their K rows may hold anything (their scores are selected away by the
    range_select before any arithmetic); their V rows are set to 0 (P, 0 there, times NaN
    would be NaN). Per-row gathers: such rows carry a negative index, which the DMA skips,
    over a tile cleared first. Grouped gathers (partition p holds keys 4p .. 4p + 3, one
    descriptor per group in "hnd"): a group past the length is skipped likewise, and the
    V rows of a group that straddles the end are zeroed by an AND with key_mask."""
    kg, vg, key_rows, key_mask, i, kv_tile = io
    n_sub = kv_tile // P
    idx, kraw, vraw = t["idx"][k % RING], t["kraw"][k % RING], t["vraw"][k % RING]
    if key_mask is not None:
        nisa.dma_copy(dst=idx[:, 0:1], src=key_rows[i, s])
        col = idx[:, 0:1]
        if kg.ndim == 2:  # "hnd": a group is one 4 * D run on both sides
            kraw, vraw = (
                kraw.reshape((P, n_sub * kraw.shape[2])),
                vraw.reshape((P, n_sub * vraw.shape[2])),
            )
        nisa.dma_copy(dst=kraw, src=kg.vector_select(0, col), oob_mode=nisa.oob_mode.skip)
        nisa.dma_copy(dst=vraw, src=vg.vector_select(0, col), oob_mode=nisa.oob_mode.skip)
        nisa.dma_copy(dst=t["vmask"][k % RING], src=key_mask[i, s])
        return  # V's rows past the length are zeroed in stage A, when the gather is done
    nisa.dma_copy(dst=idx, src=key_rows[i, s])  # one contiguous row of n_sub per partition
    nisa.memset(dst=vraw, value=0.0, engine=nisa.engine.vector)
    for u in range(n_sub):
        col = idx[:, u : u + 1]
        nisa.dma_copy(dst=kraw[:, u, :], src=kg.vector_select(0, col), oob_mode=nisa.oob_mode.skip)
        nisa.dma_copy(dst=vraw[:, u, :], src=vg.vector_select(0, col), oob_mode=nisa.oob_mode.skip)


def _stage_scores(t, s, step, u, rows, d, kv_tile):
    """Stage A of pipeline step s (the unit's step `step`, state slot u): K^T (PE
    transposes), S = Q K^T, masked copy with the row max."""
    n_sub = kv_tile // P
    k = t["kraw"][s % RING]
    if t["grouped"]:  # (issued here, not with the gather: the engines run in order)
        vraw, mask = t["vraw"][s % RING], t["vmask"][s % RING].reshape((P, n_sub, 1))
        if t["convert"]:
            # fp8: VectorE also converts K, so V's rows past the length go to +0.0 on
            # GpSimd: their 32-bit words ANDed with the key's mask word (0 or all ones),
            # exact on integers, NaN bits cleared as a select would
            vw = vraw.view(nl.int32)
            nisa.tensor_tensor(
                dst=vw, data1=vw, data2=mask.broadcast(2, vw.shape[2]), op=nl.bitwise_and,
                engine=nisa.engine.gpsimd,
            )  # fmt: skip
        else:  # GpSimd carries the step's [R, 1] statistics: a predicated copy on VectorE
            nisa.tensor_copy_predicated(
                dst=vraw, src=0.0, predicate=mask.view(nl.uint32).broadcast(2, d),
                reverse_pred=True,
            )  # fmt: skip
    if t["convert"]:  # fp8 cache: to the compute dtype (scale folded elsewhere)
        k = t["k"][s % 2]
        nisa.tensor_copy(dst=k, src=t["kraw"][s % RING], engine=nisa.engine.vector)
        nisa.tensor_copy(dst=t["v"][s % 3], src=t["vraw"][s % RING], engine=nisa.engine.gpsimd)
    kt_ps, kt, s_ps = t["kt_ps"][s % 2], t["kt"][s % 2], t["s_ps"][s % 2]
    for c, c0, dc in _dchunks(d):
        for j in range(n_sub):
            nisa.nc_transpose(dst=kt_ps[:dc, j * P : (j + 1) * P], data=k[:, j, c0 : c0 + dc])
        if t["grouped"]:  # PSUM column u * 128 + p holds key 4p + u: back to key order
            src = kt_ps[:dc, :].reshape((dc, n_sub, P)).permute((0, 2, 1))
            dst = kt[:dc, c, :].reshape((dc, P, n_sub))
        else:
            src, dst = kt_ps[:dc, :], kt[:dc, c, :]
        nisa.tensor_copy(dst=dst, src=src, engine=nisa.engine.scalar)
    for c, _, dc in _dchunks(d):
        nisa.nc_matmul(
            dst=s_ps[:rows, :], stationary=t["qt"][u][:dc, c, :rows], moving=kt[:dc, c, :],
            accumulate=c > 0,
        )  # fmt: skip
    info = t["info"][u]
    nisa.range_select(
        dst=t["s"][s % 2][:rows, :],
        on_true_tile=s_ps[:rows, :],
        comp_op0=nl.greater_equal,
        comp_op1=nl.less,
        bound0=info[:rows, 0:1],
        bound1=info[:rows, 1:2],
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
        reduce_res=t["mx"][s % 3][:rows, :],
        reduce_op=nl.maximum,
        range_start=step * kv_tile,
        on_false_value=FP32_MIN,
    )


def _stage_exp(t, s, u, rows, kv_tile):
    """Stage B of pipeline step s (state slot u): m' = max(m, mx), P = exp(sc (S - m'))
    with row sums, the rescale a = exp(sc (m - m')), l = a l + rowsum."""
    sc, m, l = t["sc"][u], t["m"][u], t["l"][u]
    mx, mn, nb = t["mx"][s % 3], t["mn"][s % 2], t["nb"][s % 2]
    a, rs = t["a"][s % 4], t["rs"][s % 2]
    # the [R, 1] statistics: on GpSimd with grouped gathers (VectorE carries the step's
    # full-width work), else on VectorE (GpSimd generates the per-row gathers' descriptors)
    eng = nisa.engine.gpsimd if t["grouped"] else nisa.engine.vector
    nisa.tensor_tensor(
        dst=mn[:rows, :], data1=m[:rows, :], data2=mx[:rows, :], op=nl.maximum, engine=eng
    )
    nisa.tensor_scalar(
        dst=nb[:rows, :], data=mn[:rows, :], op0=nl.multiply, operand0=sc[:rows, 0:1],
        op1=nl.multiply, operand1=-1.0, engine=eng,
    )  # fmt: skip
    nisa.activation(
        dst=t["p"][s % 3][:rows, :], op=nl.exp, data=t["s"][s % 2][:rows, :],
        bias=nb[:rows, :], scale=sc[:rows, 0:1], reduce_op=nl.add, reduce_res=rs[:rows, :],
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )  # fmt: skip
    nisa.activation(
        dst=a[:rows, :], op=nl.exp, data=m[:rows, :], bias=nb[:rows, :], scale=sc[:rows, 0:1]
    )
    nisa.tensor_scalar(
        dst=l[:rows, :], data=l[:rows, :], op0=nl.multiply, operand0=a[:rows, :],
        op1=nl.add, operand1=rs[:rows, :], engine=eng,
    )  # fmt: skip
    nisa.tensor_copy(dst=m[:rows, :], src=mn[:rows, :], engine=eng)


def _stage_pv(t, s, u, rows, d, kv_tile):
    """Stage C of pipeline step s (state slot u): P^T per 128 keys (PE), O = a O + P^T.T @ V."""
    n_sub = kv_tile // P
    p, a = t["p"][s % 3], t["a"][s % 4]
    v = t["v"][s % 3] if t["convert"] else t["vraw"][s % RING]
    pt_ps, pt, o_ps = t["pt_ps"][s % 2], t["pt"][s % 2], t["o_ps"][s % 2]
    for j in range(n_sub):  # grouped: V's partition p of sub-tile j is key 4p + j
        cols = p[:rows, j:kv_tile:n_sub] if t["grouped"] else p[:rows, j * P : (j + 1) * P]
        nisa.nc_transpose(dst=pt_ps[:, j, :rows], data=cols)
    nisa.tensor_copy(dst=pt[:, :, :rows], src=pt_ps[:, :, :rows], engine=nisa.engine.scalar)
    for j in range(n_sub):
        nisa.nc_matmul(
            dst=o_ps[:rows, :d], stationary=pt[:, j, :rows], moving=v[:, j, :d],
            accumulate=j > 0,
        )  # fmt: skip
    o = t["o"][u]
    nisa.scalar_tensor_tensor(
        dst=o[:rows, :d], data=o[:rows, :d], op0=nl.multiply, operand0=a[:rows, :],
        op1=nl.add, operand1=o_ps[:rows, :d],
    )  # fmt: skip


__all__ = ["M_INIT", "serving_attention_body", "serving_attention_fwd"]
