"""MoE router in NKI: scores, top-k selection and renormalization; and its backward.

Forward, per tile of 128 tokens (tokens on partitions, experts on the free dim, fp32):

    scores = softmax(logits)   exp(l - max) on ScalarE with the row sum in its accumulator,
                               then * 1/sum (VectorE reciprocal)
           | sigmoid(logits)   ScalarE
    top    = max8(scores)                  the 8 largest, descending (VectorE)
    idx    = nc_find_index8(scores, top)   first occurrence; equal scores take successive
                                           (ascending) positions: ties -> lower expert id
    w      = top[:, :k] (/ sum(top[:, :k]) when renormalize)

With E < 8 experts the scores are padded to 8 columns with -1, below every score (scores
are in [0, 1]), and k <= E keeps the padding out of the selection.

Non-finite logits: a NaN score (any NaN logit; with softmax also +inf or a row of only
-inf, which make the whole row NaN) is selected to -1 before max8, so the selection is
over the finite scores (ties -> lower ids) and ids stay in [0, E) whatever the engines
do with NaN; the token's weights become NaN (w + (s - s) with s its score sum), so the
NaN stays in that token, as torch's softmax / sigmoid + topk keep it there.

Backward (d_weights [T, k] -> d_logits [T, E]), with s the scores and S the selection:
- dense grad on the selected scores: g[id_j] = dw_j, or with renormalization
  g[id_j] = (dw_j - sum_i dw_i * w_i) / sum_i s[id_i];
- softmax: d_logits = s * (g - sum_m s_m g_m); sigmoid: d_logits = g * s * (1 - s).
The dense g is built with one-hot masks (iota == id_j) on VectorE.

Limits: E <= 16384 (max8 source size), k in 1..8, any T (ragged last tile sliced).
Under LNC 2 the two programs take alternate 128-token tiles (outputs in shared HBM).
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl

P = 128
TOPK_MAX = 8  # max8 / nc_find_index8 return 8 candidates per partition
PAD_SCORE = -1.0  # below every softmax / sigmoid score


@nki.jit
def moe_router_fwd(logits, top_k, scoring, renormalize):
    """(weights [T, k] fp32, ids [T, k] int32) from router logits [T, E] (any float dtype)."""
    t_count, e = logits.shape
    assert 1 <= top_k <= min(e, TOPK_MAX), "moe_router_fwd: top_k must be in 1..min(E, 8)"
    assert scoring in ("softmax", "sigmoid"), "moe_router_fwd: unknown scoring"
    weights = nl.ndarray((t_count, top_k), dtype=nl.float32, buffer=nl.shared_hbm)
    ids = nl.ndarray((t_count, top_k), dtype=nl.int32, buffer=nl.shared_hbm)
    pid, nprog = _programs()
    for t0 in range(pid * P, t_count, nprog * P):  # LNC 2: token tiles alternate cores
        rows = min(P, t_count - t0)
        sc = _scores(logits, t0, rows, scoring)
        r = slice(0, rows)
        poison = _select_nan_scores(sc, rows)
        top = nl.ndarray((P, TOPK_MAX), dtype=nl.float32, buffer=nl.sbuf)
        nisa.max8(dst=top[r], src=sc[r])
        idx = nl.ndarray((P, TOPK_MAX), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.nc_find_index8(dst=idx[r], data=sc[r], vals=top[r])
        w = nl.ndarray((P, top_k), dtype=nl.float32, buffer=nl.sbuf)
        if renormalize:
            total = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(dst=total[r], op=nl.add, data=top[r, 0:top_k], axis=(1,))
            nisa.reciprocal(dst=total[r], data=total[r])
            nisa.tensor_scalar(dst=w[r], data=top[r, 0:top_k], op0=nl.multiply, operand0=total[r])
        else:
            nisa.tensor_copy(dst=w[r], src=top[r, 0:top_k])
        nisa.tensor_scalar(dst=w[r], data=w[r], op0=nl.add, operand0=poison[r])
        ids_i = nl.ndarray((P, top_k), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=ids_i[r], src=idx[r, 0:top_k])
        nisa.dma_copy(dst=weights[t0 : t0 + rows, :], src=w[r])
        nisa.dma_copy(dst=ids[t0 : t0 + rows, :], src=ids_i[r])
    return weights, ids


def _select_nan_scores(sc: Any, rows: int) -> Any:
    """Scores that are NaN -> -1 (in place); returns [128, 1] fp32: 0 for a token whose
    scores were all finite, NaN otherwise (its score sum minus itself)."""
    r = slice(0, rows)
    width = sc.shape[1]
    total = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=total[r], op=nl.add, data=sc[r], axis=(1,))
    nisa.tensor_tensor(dst=total[r], data1=total[r], data2=total[r], op=nl.subtract)
    is_nan = nl.ndarray((P, width), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=is_nan[r], data1=sc[r], data2=sc[r], op=nl.not_equal)
    nisa.tensor_copy_predicated(dst=sc[r], src=PAD_SCORE, predicate=is_nan[r])
    return total


def _scores(logits: Any, t0: int, rows: int, scoring: str) -> Any:
    """fp32 scores [128, max(E, 8)] of tokens t0 .. t0 + rows (padding columns = -1)."""
    e = logits.shape[1]
    width = max(e, TOPK_MAX)
    r = slice(0, rows)
    lg = nl.ndarray((P, e), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=lg[r], src=logits[t0 : t0 + rows, :])
    sc = nl.ndarray((P, width), dtype=nl.float32, buffer=nl.sbuf)
    if width > e:
        nisa.memset(dst=sc[r, e:width], value=PAD_SCORE)
    if scoring == "softmax":
        neg_max = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max[r], op=nl.maximum, data=lg[r], axis=(1,), negate=True)
        total = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(
            dst=sc[r, 0:e],
            op=nl.exp,
            data=lg[r],
            bias=neg_max[r],
            reduce_op=nl.add,
            reduce_res=total[r],
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )
        nisa.reciprocal(dst=total[r], data=total[r])
        nisa.tensor_scalar(dst=sc[r, 0:e], data=sc[r, 0:e], op0=nl.multiply, operand0=total[r])
    else:
        nisa.activation(dst=sc[r, 0:e], op=nl.sigmoid, data=lg[r])
    return sc


@nki.jit
def moe_router_bwd(logits, ids, d_weights, scoring, renormalize):
    """d_logits [T, E] (logits' dtype) of the router, given the selection `ids` [T, k]
    int32 and the gradient of the routing weights `d_weights` [T, k] fp32."""
    t_count, e = logits.shape
    k = ids.shape[1]
    d_logits = nl.ndarray((t_count, e), dtype=logits.dtype, buffer=nl.shared_hbm)
    iota = nl.ndarray((P, e), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=iota, pattern=[[1, e]], offset=0, channel_multiplier=0)
    pid, nprog = _programs()
    for t0 in range(pid * P, t_count, nprog * P):  # LNC 2: token tiles alternate cores
        rows = min(P, t_count - t0)
        r = slice(0, rows)
        sc = _scores(logits, t0, rows, scoring)
        sel_i = nl.ndarray((P, k), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sel_i[r], src=ids[t0 : t0 + rows, :])
        sel = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sel[r], src=sel_i[r])
        dw = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=dw[r], src=d_weights[t0 : t0 + rows, :])
        if renormalize:
            _renorm_grad(sc, iota, sel, dw, rows, e, k)
        g = nl.ndarray((P, e), dtype=nl.float32, buffer=nl.sbuf)
        mask = nl.ndarray((P, e), dtype=nl.float32, buffer=nl.sbuf)
        for j in range(k):
            # mask = (iota == id_j) * dw_j; g accumulates the k one-hot rows
            dst = g if j == 0 else mask
            nisa.tensor_scalar(
                dst=dst[r],
                data=iota[r],
                op0=nl.equal,
                operand0=sel[r, j : j + 1],
                op1=nl.multiply,
                operand1=dw[r, j : j + 1],
            )
            if j > 0:
                nisa.tensor_tensor(dst=g[r], data1=g[r], data2=mask[r], op=nl.add)
        dl = nl.ndarray((P, e), dtype=nl.float32, buffer=nl.sbuf)
        s = sc[r, 0:e]
        if scoring == "softmax":
            dot = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=mask[r], data1=g[r], data2=s, op=nl.multiply)
            nisa.tensor_reduce(dst=dot[r], op=nl.add, data=mask[r], axis=(1,))
            nisa.scalar_tensor_tensor(
                dst=dl[r], data=g[r], op0=nl.subtract, operand0=dot[r], op1=nl.multiply, operand1=s
            )
        else:
            # s * (1 - s) = s - s^2
            nisa.tensor_tensor(dst=mask[r], data1=s, data2=s, op=nl.multiply)
            nisa.tensor_tensor(dst=mask[r], data1=s, data2=mask[r], op=nl.subtract)
            nisa.tensor_tensor(dst=dl[r], data1=g[r], data2=mask[r], op=nl.multiply)
        nisa.dma_copy(dst=d_logits[t0 : t0 + rows, :], src=dl[r])
    return d_logits


def _renorm_grad(sc: Any, iota: Any, sel: Any, dw: Any, rows: int, e: int, k: int) -> None:
    """dw_j <- (dw_j - sum_i dw_i w_i) / Z with Z = sum_i s[id_i] and w_i = s[id_i] / Z."""
    r = slice(0, rows)
    s_sel = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
    mask = nl.ndarray((P, e), dtype=nl.float32, buffer=nl.sbuf)
    for j in range(k):
        # s[id_j] = sum over experts of (iota == id_j) * scores
        nisa.tensor_scalar(dst=mask[r], data=iota[r], op0=nl.equal, operand0=sel[r, j : j + 1])
        nisa.tensor_tensor(dst=mask[r], data1=mask[r], data2=sc[r, 0:e], op=nl.multiply)
        nisa.tensor_reduce(dst=s_sel[r, j : j + 1], op=nl.add, data=mask[r], axis=(1,))
    z_inv = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=z_inv[r], op=nl.add, data=s_sel[r], axis=(1,))
    nisa.reciprocal(dst=z_inv[r], data=z_inv[r])
    # dot = sum_i dw_i * s_i / Z
    prod = nl.ndarray((P, k), dtype=nl.float32, buffer=nl.sbuf)
    dot = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod[r], data1=dw[r], data2=s_sel[r], op=nl.multiply)
    nisa.tensor_reduce(dst=dot[r], op=nl.add, data=prod[r], axis=(1,))
    nisa.tensor_tensor(dst=dot[r], data1=dot[r], data2=z_inv[r], op=nl.multiply)
    nisa.tensor_scalar(
        dst=dw[r], data=dw[r], op0=nl.subtract, operand0=dot[r], op1=nl.multiply, operand1=z_inv[r]
    )


def _programs() -> tuple[int, int]:
    """(program id, number of programs) of this LNC launch."""
    if nl.program_ndim() == 0:
        return 0, 1
    return nl.program_id(0), nl.num_programs(0)
