"""MoE routing with every option of 2026's routers, in NKI; and its backward.

Forward (`moe_route_options_fwd`), per tile of 128 tokens (tokens on partitions, experts
on the free dim, fp32; LNC 2: the programs take alternate tiles):

    l      = logits (fp32)
    s      = softmax(l) (ScalarE exp with the row sum in its accumulator, * 1/sum)
           | sigmoid(l)                              scores (not with softmax_after_topk)
    key    = (s | l) + bias                          selection key; bias: selection only
    key    = NaN -> -FLT_MAX (a select); with a bias or on logits, clamped to +-FLT_MAX
    groups (n_group, topk_group): per group, top-2 sum of key (max, and the second best
           counting a tied max twice); a group is kept when fewer than topk_group groups
           beat it (a higher score, or an equal one at a lower group index); the other
           groups' keys -> -inf
    top-k  = ceil(k / 8) rounds of max8 (8 largest, descending) + nc_find_index8 (first
           occurrences; tied values take successive, ascending positions) and, between
           rounds, nc_match_replace8 (the 8 found positions -> -inf)
    w      = s[ids] (renormalize: / (sum + 1e-20))   | softmax(l[ids])  (after top-k)
    w      = w * scaling

Invariants. Every candidate key is >= -FLT_MAX and every removed / ineligible / padding
position is -inf, so a removed position is never found again and ids stay in [0, E) for
any logits; ties go to the lower expert (and the lower group) index. A NaN key is
-FLT_MAX in every comparison (the top-k and the group top-2 sums: two NaN keys sum to
-inf), below every non-NaN eligible key and above every ineligible position, as
`moe.routing.route_reference` orders them (stable descending sorts of those keys).
Clamping makes +-inf keys tie with +-FLT_MAX, where the reference keeps them apart
(nothing else differs). The weights are read from the unbiased values by selects (no multiply by
a 0 / 1 mask), so a NaN / Inf reaches only its own token's row: with softmax scoring a
NaN or +inf logit makes the row's scores NaN (its weights are NaN), as in torch.

Backward (`moe_route_options_bwd`: d weights [T, k] -> d logits [T, E]; the selection
`ids` comes from the forward; bias and groups only select, so they have no gradient):

    dw    = d_weights * scaling
    after top-k: w = softmax(l[ids]), d l[ids_j] = w_j (dw_j - sum_i w_i dw_i)
    scores: renormalize: dw_j <- (dw_j - sum_i dw_i w_i) / Z, Z = sum_i s[ids_i] + 1e-20;
            g[ids_j] = dw_j (0 elsewhere);
            softmax: d l = s * (g - sum_m s_m g_m);  sigmoid: d l = g * s * (1 - s)

Gathers (l[ids_j], s[ids_j]) and the scatter into g are per-slot selects against an
expert-index iota: a select_reduce (max-reduced, -inf elsewhere) for a gather, a
select_reduce keeping g except at ids_j for the scatter.

Limits: E in 1..512 (max8 sources are >= 8 wide: narrower rows are padded with -inf),
k in 1..min(E, 16), groups dividing E with topk_group groups holding >= k experts; any T
(the ragged last tile sliced).
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl

P = 128
EIGHT = 8  # max8 / nc_find_index8 / nc_match_replace8 handle 8 values per partition
MAX_EXPERTS, MAX_TOP_K = 512, 16
FLT_MAX = 3.4028234663852886e38  # fp32 max: the floor of every candidate key
NEG_INF = float("-inf")  # removed, ineligible and padding positions
RENORM_EPS = 1e-20  # DeepSeek-V3's denominator term (transformers' DeepseekV3TopkRouter)


def _programs() -> tuple[int, int]:
    if nl.program_ndim() == 0:
        return 0, 1
    return nl.program_id(0), nl.num_programs(0)


@nki.jit
def moe_route_options_fwd(
    logits, bias, top_k, scoring, softmax_after_topk, n_group, topk_group, renormalize, scaling
):
    """(weights [T, k] fp32, ids [T, k] int32) from logits [T, E] (any float dtype) and
    bias [E] (or None); n_group = 0: no groups."""
    t_count, e = logits.shape
    assert 1 <= e <= MAX_EXPERTS, "moe_route_options_fwd: E must be in 1..512"
    assert 1 <= top_k <= min(e, MAX_TOP_K), "moe_route_options_fwd: top_k in 1..min(E, 16)"
    assert scoring in ("softmax", "sigmoid"), "moe_route_options_fwd: unknown scoring"
    if n_group:
        assert e % n_group == 0 and 1 <= topk_group <= n_group, "moe_route_options_fwd: groups"
        assert topk_group * (e // n_group) >= top_k, "moe_route_options_fwd: too few experts"
    weights = nl.ndarray((t_count, top_k), dtype=nl.float32, buffer=nl.shared_hbm)
    ids = nl.ndarray((t_count, top_k), dtype=nl.int32, buffer=nl.shared_hbm)
    width = max(e, EIGHT)
    iota = None
    if bias is not None or softmax_after_topk:  # gathers by expert index
        iota = nl.ndarray((P, e), dtype=nl.float32, buffer=nl.sbuf)
        nisa.iota(dst=iota, pattern=[[1, e]], offset=0, channel_multiplier=0)
    bias_sb = None
    if bias is not None:
        bias_sb = nl.ndarray((P, e), dtype=nl.float32, buffer=nl.sbuf)
        # one HBM row to every partition (stride-0 partition dim on the HBM side)
        nisa.dma_copy(dst=bias_sb, src=bias.reshape((1, e)).broadcast(0, P))
    pid, nprog = _programs()
    for t0 in range(pid * P, t_count, nprog * P):
        rows = min(P, t_count - t0)
        r = slice(0, rows)
        lg = _load_logits(logits, t0, rows)
        vals = lg if softmax_after_topk else _scores(lg, rows, e, scoring)
        key = nl.ndarray((P, width), dtype=nl.float32, buffer=nl.sbuf)
        if width > e:
            nisa.memset(dst=key[r, e:width], value=NEG_INF)
        if bias_sb is not None:
            nisa.tensor_tensor(dst=key[r, 0:e], data1=vals[r], data2=bias_sb[r], op=nl.add)
        else:
            nisa.tensor_copy(dst=key[r, 0:e], src=vals[r])
        _sanitize(key, rows, e, clamp=iota is not None)
        if n_group:
            _limit_groups(key, rows, e, n_group, topk_group)
        top, sel = _select(key, rows, top_k)
        w = nl.ndarray((P, top_k), dtype=nl.float32, buffer=nl.sbuf)
        if iota is None:
            # no bias: the selected keys are the scores themselves; a selected -FLT_MAX
            # key can only be a NaN score (scores lie in [0, 1])
            nan_sel = nl.ndarray((P, top_k), dtype=nl.uint8, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=nan_sel[r], data=top[r], op0=nl.equal, operand0=-FLT_MAX)
            nisa.select_reduce(
                dst=w[r], predicate=nan_sel[r], on_true=top[r], on_false=float("nan"),
                reverse_pred=True,
            )  # fmt: skip
        else:
            _gather(w, vals, iota, sel, rows, e, top_k)
        if softmax_after_topk:
            _softmax_rows(w, rows)
        elif renormalize:
            _renormalize(w, rows)
        if scaling != 1.0:
            nisa.tensor_scalar(dst=w[r], data=w[r], op0=nl.multiply, operand0=scaling)
        ids_i = nl.ndarray((P, top_k), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=ids_i[r], src=sel[r])
        nisa.dma_copy(dst=weights[t0 : t0 + rows, :], src=w[r])
        nisa.dma_copy(dst=ids[t0 : t0 + rows, :], src=ids_i[r])
    return weights, ids


def _load_logits(logits: Any, t0: int, rows: int) -> Any:
    e = logits.shape[1]
    lg = nl.ndarray((P, e), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=lg[0:rows], src=logits[t0 : t0 + rows, :])
    return lg


def _scores(lg: Any, rows: int, e: int, scoring: str) -> Any:
    """fp32 scores [128, E]: softmax over the row, or sigmoid per expert."""
    r = slice(0, rows)
    sc = nl.ndarray((P, e), dtype=nl.float32, buffer=nl.sbuf)
    if scoring == "sigmoid":
        nisa.activation(dst=sc[r], op=nl.sigmoid, data=lg[r])
        return sc
    neg_max = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=neg_max[r], op=nl.maximum, data=lg[r], axis=(1,), negate=True)
    total = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(
        dst=sc[r], op=nl.exp, data=lg[r], bias=neg_max[r], reduce_op=nl.add,
        reduce_res=total[r], reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )  # fmt: skip
    nisa.reciprocal(dst=total[r], data=total[r])
    nisa.tensor_scalar(dst=sc[r], data=sc[r], op0=nl.multiply, operand0=total[r])
    return sc


def _sanitize(key: Any, rows: int, e: int, clamp: bool) -> None:
    """NaN keys -> -FLT_MAX (a select), then (`clamp`) every key clamped to [-FLT_MAX,
    FLT_MAX]; unbiased scores lie in [0, 1] or are NaN, so they need the select alone."""
    r = slice(0, rows)
    k = key[r, 0:e]
    is_nan = nl.ndarray((P, e), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=is_nan[r], data1=k, data2=k, op=nl.not_equal)
    nisa.select_reduce(dst=k, predicate=is_nan[r], on_true=k, on_false=-FLT_MAX, reverse_pred=True)
    if not clamp:
        return
    nisa.tensor_scalar(
        dst=k, data=k, op0=nl.maximum, operand0=-FLT_MAX, op1=nl.minimum, operand1=FLT_MAX
    )


def _limit_groups(key: Any, rows: int, e: int, n_group: int, topk_group: int) -> None:
    """Keys of the experts outside the topk_group best groups -> -inf."""
    r = slice(0, rows)
    size = e // n_group
    kv = key[r, 0:e].reshape_dim(1, (n_group, size))  # [rows, group, expert in group]
    best = nl.ndarray((P, n_group), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=best[r], op=nl.maximum, data=kv, axis=(2,))
    score = nl.ndarray((P, n_group), dtype=nl.float32, buffer=nl.sbuf)
    if size == 1:
        nisa.tensor_copy(dst=score[r], src=best[r])
    else:
        best_b = best[r].expand_dim(2).broadcast(2, size)
        is_best = nl.ndarray((P, n_group, size), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=is_best[r], data1=kv, data2=best_b, op=nl.equal)
        ties = nl.ndarray((P, n_group), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=ties[r], op=nl.add, data=is_best[r], axis=(2,))
        rest = nl.ndarray((P, n_group, size), dtype=nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(
            dst=rest[r], predicate=is_best[r], on_true=kv, on_false=NEG_INF, reverse_pred=True
        )
        second = nl.ndarray((P, n_group), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=second[r], op=nl.maximum, data=rest[r], axis=(2,))
        # a maximum held twice is also the second best
        twice = nl.ndarray((P, n_group), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=twice[r], data=ties[r], op0=nl.greater_equal, operand0=2.0)
        nisa.tensor_copy_predicated(dst=second[r], src=best[r], predicate=twice[r])
        nisa.tensor_tensor(dst=score[r], data1=best[r], data2=second[r], op=nl.add)
    # rank[g] = #{h : score[h] > score[g]} + #{h < g : score[h] == score[g]}
    rank = nl.ndarray((P, n_group), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=rank[r], value=0.0)
    for h in range(n_group):
        nisa.scalar_tensor_tensor(
            dst=rank[r], data=score[r], op0=nl.less, operand0=score[r, h : h + 1],
            op1=nl.add, operand1=rank[r],
        )  # fmt: skip
        if h + 1 < n_group:
            later = slice(h + 1, n_group)
            nisa.scalar_tensor_tensor(
                dst=rank[r, later], data=score[r, later], op0=nl.equal,
                operand0=score[r, h : h + 1], op1=nl.add, operand1=rank[r, later],
            )  # fmt: skip
    dropped = nl.ndarray((P, n_group), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.tensor_scalar(
        dst=dropped[r], data=rank[r], op0=nl.greater_equal, operand0=float(topk_group)
    )
    dropped_b = dropped[r].expand_dim(2).broadcast(2, size)
    nisa.select_reduce(dst=kv, predicate=dropped_b, on_true=kv, on_false=NEG_INF, reverse_pred=True)


def _select(key: Any, rows: int, k: int) -> tuple[Any, Any]:
    """(the k best keys, descending [128, k] fp32; their expert ids [128, k] fp32)."""
    r = slice(0, rows)
    rounds = (k + EIGHT - 1) // EIGHT
    top = nl.ndarray((P, rounds * EIGHT), dtype=nl.float32, buffer=nl.sbuf)
    idx = nl.ndarray((P, rounds * EIGHT), dtype=nl.uint32, buffer=nl.sbuf)
    for i in range(rounds):
        c = slice(i * EIGHT, (i + 1) * EIGHT)
        nisa.max8(dst=top[r, c], src=key[r])
        nisa.nc_find_index8(dst=idx[r, c], data=key[r], vals=top[r, c])
        if i + 1 < rounds:
            # the 8 found positions leave the race (-inf is below every candidate)
            nisa.nc_match_replace8(dst=key[r], data=key[r], vals=top[r, c], imm=NEG_INF)
    sel = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=sel[r], src=idx[r, 0:k])
    return top[:, 0:k], sel


def _gather(out: Any, vals: Any, iota: Any, sel: Any, rows: int, e: int, k: int) -> None:
    """out[:, j] = vals[:, sel[:, j]] for each slot j (select + max-reduce, exact)."""
    r = slice(0, rows)
    is_j = nl.ndarray((P, e), dtype=nl.uint8, buffer=nl.sbuf)
    picked = nl.ndarray((P, e), dtype=nl.float32, buffer=nl.sbuf)
    for j in range(k):
        nisa.tensor_scalar(dst=is_j[r], data=iota[r], op0=nl.equal, operand0=sel[r, j : j + 1])
        nisa.select_reduce(
            dst=picked[r], predicate=is_j[r], on_true=vals[r, 0:e], on_false=NEG_INF,
            reduce_res=out[r, j : j + 1], reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )  # fmt: skip


def _softmax_rows(w: Any, rows: int) -> None:
    """w <- softmax(w) over its k columns, in place."""
    r = slice(0, rows)
    neg_max = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=neg_max[r], op=nl.maximum, data=w[r], axis=(1,), negate=True)
    total = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(
        dst=w[r], op=nl.exp, data=w[r], bias=neg_max[r], reduce_op=nl.add, reduce_res=total[r],
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )  # fmt: skip
    nisa.reciprocal(dst=total[r], data=total[r])
    nisa.tensor_scalar(dst=w[r], data=w[r], op0=nl.multiply, operand0=total[r])


def _renormalize(w: Any, rows: int) -> None:
    """w <- w / (sum(w) + 1e-20), in place."""
    r = slice(0, rows)
    total = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=total[r], op=nl.add, data=w[r], axis=(1,))
    nisa.tensor_scalar(dst=total[r], data=total[r], op0=nl.add, operand0=RENORM_EPS)
    nisa.reciprocal(dst=total[r], data=total[r])
    nisa.tensor_scalar(dst=w[r], data=w[r], op0=nl.multiply, operand0=total[r])


@nki.jit
def moe_route_options_bwd(
    logits, ids, d_weights, scoring, softmax_after_topk, renormalize, scaling
):
    """d_logits [T, E] (logits' dtype) from the selection ids [T, k] int32 and the
    gradient of the weights d_weights [T, k] fp32."""
    t_count, e = logits.shape
    k = ids.shape[1]
    d_logits = nl.ndarray((t_count, e), dtype=logits.dtype, buffer=nl.shared_hbm)
    iota = nl.ndarray((P, e), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=iota, pattern=[[1, e]], offset=0, channel_multiplier=0)
    pid, nprog = _programs()
    for t0 in range(pid * P, t_count, nprog * P):
        rows = min(P, t_count - t0)
        r = slice(0, rows)
        lg = _load_logits(logits, t0, rows)
        sel_i = nl.ndarray((P, k), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sel_i[r], src=ids[t0 : t0 + rows, :])
        sel = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sel[r], src=sel_i[r])
        dw = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=dw[r], src=d_weights[t0 : t0 + rows, :])
        if scaling != 1.0:
            nisa.tensor_scalar(dst=dw[r], data=dw[r], op0=nl.multiply, operand0=scaling)
        dl = nl.ndarray((P, e), dtype=nl.float32, buffer=nl.sbuf)
        if softmax_after_topk:
            w = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
            _gather(w, lg, iota, sel, rows, e, k)
            _softmax_rows(w, rows)
            _centered(dw, w, rows, k)  # dw_j - sum_i w_i dw_i
            nisa.tensor_tensor(dst=dw[r], data1=dw[r], data2=w[r], op=nl.multiply)
            _scatter(dl, dw, iota, sel, rows, e, k)
        else:
            sc = _scores(lg, rows, e, scoring)
            if renormalize:
                s_sel = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
                _gather(s_sel, sc, iota, sel, rows, e, k)
                z_inv = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_reduce(dst=z_inv[r], op=nl.add, data=s_sel[r], axis=(1,))
                nisa.tensor_scalar(dst=z_inv[r], data=z_inv[r], op0=nl.add, operand0=RENORM_EPS)
                nisa.reciprocal(dst=z_inv[r], data=z_inv[r])
                # w_i = s_i / Z;  dw_j <- (dw_j - sum_i w_i dw_i) / Z
                nisa.tensor_scalar(dst=s_sel[r], data=s_sel[r], op0=nl.multiply, operand0=z_inv[r])
                _centered(dw, s_sel, rows, k)
                nisa.tensor_scalar(dst=dw[r], data=dw[r], op0=nl.multiply, operand0=z_inv[r])
            g = nl.ndarray((P, e), dtype=nl.float32, buffer=nl.sbuf)
            _scatter(g, dw, iota, sel, rows, e, k)
            tmp = nl.ndarray((P, e), dtype=nl.float32, buffer=nl.sbuf)
            if scoring == "softmax":
                dot = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=tmp[r], data1=g[r], data2=sc[r], op=nl.multiply)
                nisa.tensor_reduce(dst=dot[r], op=nl.add, data=tmp[r], axis=(1,))
                nisa.scalar_tensor_tensor(
                    dst=dl[r], data=g[r], op0=nl.subtract, operand0=dot[r], op1=nl.multiply,
                    operand1=sc[r],
                )  # fmt: skip
            else:
                # s * (1 - s) = s - s^2
                nisa.tensor_tensor(dst=tmp[r], data1=sc[r], data2=sc[r], op=nl.multiply)
                nisa.tensor_tensor(dst=tmp[r], data1=sc[r], data2=tmp[r], op=nl.subtract)
                nisa.tensor_tensor(dst=dl[r], data1=g[r], data2=tmp[r], op=nl.multiply)
        if logits.dtype == nl.float32:
            nisa.dma_copy(dst=d_logits[t0 : t0 + rows, :], src=dl[r])
        else:
            out = nl.ndarray((P, e), dtype=logits.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=out[r], src=dl[r])  # one rounding
            nisa.dma_copy(dst=d_logits[t0 : t0 + rows, :], src=out[r])
    return d_logits


def _centered(dw: Any, w: Any, rows: int, k: int) -> None:
    """dw_j <- dw_j - sum_i w_i dw_i, in place."""
    r = slice(0, rows)
    prod = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
    dot = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod[r], data1=dw[r], data2=w[r], op=nl.multiply)
    nisa.tensor_reduce(dst=dot[r], op=nl.add, data=prod[r], axis=(1,))
    nisa.tensor_scalar(dst=dw[r], data=dw[r], op0=nl.subtract, operand0=dot[r])


def _scatter(dst: Any, vals: Any, iota: Any, sel: Any, rows: int, e: int, k: int) -> None:
    """dst [128, E] = vals[:, j] at expert sel[:, j] for each slot j, 0 elsewhere (selects:
    an unselected expert's entry is never touched by a slot's value)."""
    r = slice(0, rows)
    nisa.memset(dst=dst[r], value=0.0)
    is_j = nl.ndarray((P, e), dtype=nl.uint8, buffer=nl.sbuf)
    for j in range(k):
        nisa.tensor_scalar(dst=is_j[r], data=iota[r], op0=nl.equal, operand0=sel[r, j : j + 1])
        nisa.select_reduce(
            dst=dst[r], predicate=is_j[r], on_true=dst[r], on_false=vals[r, j : j + 1],
            reverse_pred=True,
        )  # fmt: skip
