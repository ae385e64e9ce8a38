"""Host side of the flash-attention op (torch + NumPy, no registration): bucket padding,
mask bounds and tile plans, config lookup, kernel launches, key chunking and merging,
and the kernels' partition-major lse layout. `nki_kernels.ops.attention` registers the
torch ops on top of `forward` / `backward`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..runtime import launch, lookup_config, pad_dim, pad_to_bucket
from ..runtime.buckets import current_policy
from ..runtime.host_array import host_numpy
from ..targets import get_target
from . import masks
from ._bwd_plan import bwd_row_order, mark_diagonal
from .config import AttentionProblem, FlashFwdConfig, max_resident_keys, with_kv_overlap
from .flash_bwd import flash_attention_bwd
from .flash_fwd import flash_attention_fwd


def check_data(kv_lens: Tensor | None, segment_ids: Tensor | None, sk: int) -> None:
    """Checks that read tensor values (run in the kernels' host code, not in fakes)."""
    if kv_lens is not None and kv_lens.numel():
        lo, hi = int(kv_lens.min()), int(kv_lens.max())
        if lo < 0 or hi > sk:
            raise ValueError(f"kv_lens: expected values in [0, {sk}] (Sk); got min {lo}, max {hi}")
    if segment_ids is not None:
        masks.segment_runs(host_numpy(segment_ids))


def softmax_scale_of(q: Tensor, softmax_scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)


@dataclass(frozen=True)
class MaskArgs:
    """The op's mask and scale options (its keyword arguments and optional tensors)."""

    causal: bool = False
    softmax_scale: float | None = None
    sliding_window: int | None = None
    kv_lens: Tensor | None = None
    segment_ids: Tensor | None = None
    attn_mask: Tensor | None = None
    softcap: float | None = None

    @property
    def kind(self) -> str:
        """The mask kind a config is chosen for (`AttentionProblem.mask`)."""
        if self.kv_lens is not None or self.segment_ids is not None or self.attn_mask is not None:
            return "data"
        if self.sliding_window is not None:
            return "window"
        return "causal" if self.causal else "none"


@dataclass(frozen=True)
class DenseMask:
    """A dense attn_mask combined with the interval masks, at the bucketed lengths.

    allowed: bool [B | 1, H | 1, Sqb, Skb]; bias: None or fp32 (the additive mask divided
    by the softmax scale, 0 where not allowed).
    """

    allowed: np.ndarray
    bias: np.ndarray | None

    def empty_rows(self, c0: int = 0, c1: int | None = None) -> np.ndarray:
        """bool [B | 1, H | 1, Sqb]: rows with no allowed key in keys [c0, c1)."""
        return np.asarray(~self.allowed[..., c0:c1].any(axis=-1))


def dense_of(attn_mask: Tensor, sq: int, sk: int, scale: float) -> DenseMask:
    """`attn_mask` (bool, or additive float; broadcastable to [B, H, Sq, Sk]) as allowed
    keys and a bias at the unpadded lengths."""
    am = attn_mask.detach().cpu()
    while am.dim() < 4:
        am = am.unsqueeze(0)
    bm, hm = am.shape[0], am.shape[1]
    am = am.expand(bm, hm, sq, sk)
    if am.dtype == torch.bool:
        allowed_u = host_numpy(am)
        add = None
    else:
        af = host_numpy(am.to(torch.float64))
        bad = np.isnan(af) | (af == np.inf)
        if bad.any():  # not a mask value: SDPA would turn the row into NaN
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"attn_mask: expected an additive mask of finite values or -inf (masked); "
                f"got {af[at]} at [b, h, q, k] = {list(at)}"
            )
        allowed_u = af > -np.inf
        add = np.where(allowed_u, af / scale, 0.0)
        add = np.maximum(add, -1e30).astype(np.float32)  # stays finite for the kernels
        if not add.any():
            add = None
    return DenseMask(allowed_u, add)


def _pad_dense(d: DenseMask, lo: np.ndarray, hi: np.ndarray, skb: int) -> DenseMask:
    """`d` padded to [.., Sqb, Skb] and intersected with the intervals lo / hi."""
    sqb = lo.shape[1]
    bm, hm, sq, sk = d.allowed.shape
    keys = np.arange(skb)
    inter = (keys[None, None, :] >= lo[:, :, None]) & (keys[None, None, :] < hi[:, :, None])
    if bm == 1 and (inter == inter[:1]).all():
        inter = inter[:1]
    nb = max(bm, inter.shape[0])
    allowed = np.zeros((nb, hm, sqb, skb), dtype=bool)
    allowed[:, :, :sq, :sk] = d.allowed
    allowed &= inter[:, None]
    bias = None
    if d.bias is not None:
        bias = np.zeros((nb, hm, sqb, skb), dtype=np.float32)
        bias[:, :, :sq, :sk] = d.bias
        bias = np.where(allowed, bias, np.float32(0.0))
    return DenseMask(allowed, bias)


@dataclass(frozen=True)
class _Padded:
    """Inputs padded to their length buckets, with the per-query key bounds."""

    qp: Tensor
    kp: Tensor
    vp: Tensor
    sq: int
    sk: int
    lo: np.ndarray
    hi: np.ndarray
    scale: float
    target: Any
    dense: DenseMask | None = None

    @property
    def sqb(self) -> int:
        return int(self.qp.shape[2])

    @property
    def skb(self) -> int:
        return int(self.kp.shape[2])


def _pad(q: Tensor, k: Tensor, v: Tensor, m: MaskArgs, clean_k: bool = False) -> _Padded:
    """The prologue of both directions: data checks, bucket padding, key bounds.

    Keys that no query may attend (beyond `kv_lens`) but that share a 128-key tile with
    attended keys are selected to 0 in V (and K with `clean_k`): the kernels multiply
    their zero probabilities with those rows, and 0 * NaN / Inf would reach every row
    of the tile. Masked keys in SKIP tiles are never read; K rows feed only scores,
    which the forward's mask selects away (the backward's dS @ K needs `clean_k`).
    """
    sk = k.shape[2]
    check_data(m.kv_lens, m.segment_ids, sk)
    qp, _ = pad_to_bucket(q, dim=2)
    kp, _ = pad_to_bucket(k, dim=2)
    _check_tile_grid(qp.shape[2], q.shape[2], "Sq")
    _check_tile_grid(kp.shape[2], sk, "Sk")
    lo, hi = _bounds(q.shape[0], qp.shape[2], kp.shape[2], q.shape[2], sk, m)
    scale = softmax_scale_of(q, m.softmax_scale)
    vp = pad_dim(v, 2, kp.shape[2])
    dense = None
    if m.attn_mask is not None:
        # the kernels add the bias to the scores in the units their softmax scale applies
        # to: raw scores (scale), or tanh(scale * S / cap) when soft-capped (cap)
        d = dense_of(m.attn_mask, q.shape[2], sk, scale if m.softcap is None else m.softcap)
        iv = (
            masks.row_intervals(d.allowed[:, 0])
            if d.bias is None and d.allowed.shape[1] == 1
            else None
        )
        if iv is None:
            dense = _pad_dense(d, lo, hi, kp.shape[2])
        else:  # one key range per row, the same for every head: bounds, range_select
            sqv = q.shape[2]
            lo[:, :sqv] = np.maximum(lo[:, :sqv], iv[0])
            hi[:, :sqv] = np.minimum(hi[:, :sqv], iv[1])
            hi[:] = np.maximum(hi, lo)
    if dense is not None:
        dead = _dense_dead_keys(dense, k.shape[1], kp.shape[2])
    else:
        dead = _dead_keys_in_live_tiles(lo, hi, kp.shape[2])
        dead = dead[:, None] if dead is not None else None
    if dead is not None:
        sel = torch.from_numpy(dead).to(v.device)[..., None]
        vp = vp.masked_fill(sel, 0.0)
        if clean_k:
            kp = kp.masked_fill(sel, 0.0)
    return _Padded(qp, kp, vp, q.shape[2], sk, lo, hi, scale, get_target(None), dense)


def _check_tile_grid(bucket: int, n: int, what: str) -> None:
    """The kernels tile queries and keys by 128 (the partitions): a bucket policy may
    give other sizes (explicit buckets: the norms and MoE take any row count)."""
    if bucket % masks.TILE:
        raise ValueError(
            f"bucket_policy: expected buckets that are multiples of {masks.TILE} for "
            f"flash_attention ({current_policy().name()}); got {bucket} for {what} = {n}"
        )


def _dead_keys_in_live_tiles(lo: np.ndarray, hi: np.ndarray, skb: int) -> np.ndarray | None:
    """bool [B, Skb]: keys outside every query's [lo, hi) whose 128-key tile holds an
    attended key (None when there is none). The union of the rows' intervals may have
    holes (a dense mask read back as intervals: a varlen document with keys but no
    queries), so it is counted exactly: +1 at each lo, -1 at each hi, a running sum."""
    b = lo.shape[0]
    live = lo < hi
    edges = np.zeros((b, skb + 1), dtype=np.int64)
    rows = np.broadcast_to(np.arange(b)[:, None], lo.shape)
    np.add.at(edges, (rows[live], lo[live]), 1)
    np.add.at(edges, (rows[live], hi[live]), -1)
    dead = np.cumsum(edges[:, :skb], axis=1) == 0
    return _dead_in_live_tiles(dead, skb)


def _dense_dead_keys(dense: DenseMask, hkv: int, skb: int) -> np.ndarray | None:
    """bool [B | 1, Hkv | 1, Skb]: keys of each KV head that no query of its group
    attends, in the tiles the kernels read (a per-head mask may mask a key for one head
    and not another: the KV head's group decides). A tile is read for every head when
    any head attends a key of it (one tile plan for all heads), so liveness is the
    union over heads and batch rows."""
    seen = dense.allowed.any(axis=2)  # [B | 1, H | 1, Skb]
    if seen.shape[1] > 1:
        seen = seen.reshape(seen.shape[0], hkv, -1, skb).any(axis=2)
    dead = ~seen.reshape(-1, skb)
    tile = 128
    nk = -(-skb // tile)
    attended = np.zeros(nk * tile, dtype=bool)
    attended[:skb] = ~dead.all(axis=0)
    read = np.repeat(attended.reshape(nk, tile).any(axis=1), tile)[:skb]
    dead &= read[None, :]
    return dead.reshape(seen.shape) if dead.any() else None


def _dead_in_live_tiles(dead: np.ndarray, skb: int) -> np.ndarray | None:
    """`dead` (bool [B | 1, Skb]: keys no query attends) restricted to 128-key tiles that
    hold an attended key (None when there is none): the rows the kernels read."""
    tile = 128
    nk = -(-skb // tile)
    padded = np.ones((dead.shape[0], nk * tile), dtype=bool)
    padded[:, :skb] = dead
    live_tile = ~padded.reshape(dead.shape[0], nk, tile).all(axis=2)
    dead &= np.repeat(live_tile, tile, axis=1)[:, :skb]
    return dead if dead.any() else None


def _bounds(
    b: int, sqb: int, skb: int, sq: int, sk: int, m: MaskArgs
) -> tuple[np.ndarray, np.ndarray]:
    seg = None
    if m.segment_ids is not None:
        s = host_numpy(m.segment_ids).astype(np.int64)
        # ids as ranks 0..n-1 (equal ids stay equal; any int64 value is fine), so the
        # padded positions' document of their own, -1, never collides or overflows
        s = np.unique(s, return_inverse=True)[1].reshape(s.shape)
        seg = np.concatenate([s, np.full((b, sqb - sq), -1, dtype=np.int64)], axis=1)
    kl = host_numpy(m.kv_lens) if m.kv_lens is not None else None
    return masks.query_bounds(
        b,
        sqb,
        skb,
        causal=m.causal,
        sliding_window=m.sliding_window,
        kv_lens=kl,
        segment_ids=seg,
        sq_valid=sq,
        sk_valid=sk,
    )


def _plan_and_bounds(
    lo: np.ndarray, hi: np.ndarray, sk: int, device: torch.device, diagonal: bool = False
) -> tuple[Any, Tensor | None]:
    """Static tile plan (() when every tile is FULL) and the kernels' bounds operand;
    `diagonal`: mark the backward's causal-diagonal sub-tiles (`_bwd_plan.DIAG`)."""
    classes = masks.classify_tiles(lo, hi, sk)
    if (classes == masks.FULL).all():
        return (), None
    if diagonal:
        mark_diagonal(classes, lo, hi, sk)
    if (classes == classes[:1]).all():
        classes = classes[:1]  # the same plan for every batch row: one shared table
    bounds = torch.from_numpy(masks.kernel_bounds(lo, hi)).to(device)
    return masks.tile_plan(classes), bounds


def _problem(q: Tensor, k: Tensor, sqb: int, skb: int, mask: str) -> AttentionProblem:
    return AttentionProblem(
        seq_q=sqb,
        seq_k=skb,
        head_dim=q.shape[3],
        q_heads=q.shape[1],
        kv_heads=k.shape[1],
        batch=q.shape[0],
        dtype=str(q.dtype).removeprefix("torch."),
        mask=mask,
    )


def dense_operands(
    dense: DenseMask, c0: int, c1: int, device: torch.device, rows: np.ndarray | None = None
) -> tuple[Any, Tensor, Tensor | None]:
    """Tile plan, uint8 mask and fp32 bias operands of keys [c0, c1) of a dense mask
    (`rows`: a row permutation, the backward's row order)."""
    allowed = dense.allowed[..., c0:c1]
    bias = dense.bias[..., c0:c1] if dense.bias is not None else None
    if rows is not None:
        allowed = allowed[:, :, rows]
        bias = bias[:, :, rows] if bias is not None else None
    classes = masks.classify_dense(allowed, bias)
    if (classes == classes[:1]).all():
        classes = classes[:1]
    mask_t = torch.from_numpy(np.ascontiguousarray(allowed, dtype=np.uint8)).to(device)
    bias_t = torch.from_numpy(np.ascontiguousarray(bias)).to(device) if bias is not None else None
    return masks.tile_plan(classes), mask_t, bias_t


def _launch_fwd(
    qp: Tensor,
    kc: Tensor,
    vc: Tensor,
    m: MaskArgs,
    scale: float,
    cfg: FlashFwdConfig,
    target: Any,
    ops: Any,
) -> tuple[Tensor, Tensor]:
    """The forward kernel on one key chunk; `ops`: (bounds, plan, mask, bias)."""
    bounds, plan, mask_t, bias_t = ops
    if mask_t is None and m.softcap is None:
        return launch(
            flash_attention_fwd, qp, kc, vc, bounds, scale, plan, config=cfg, target=target
        )
    c = cfg.to_dict()
    fields = ("kv_tile", "q_tiles", "dma_quarters", "scalar_evac", "kv_buffers")
    args = (qp, kc, vc, bounds, scale, plan, *(c[f] for f in fields), mask_t, bias_t, m.softcap)
    return launch(flash_attention_fwd, *args, target=target)


def forward(q: Tensor, k: Tensor, v: Tensor, m: MaskArgs) -> tuple[Tensor, Tensor]:
    """(out, lse [B, Hq, Sq]) of the op: padded, chunked over keys, merged, unpadded."""
    x = _pad(q, k, v, m)
    sq, sqb, skb, lo, hi, target = x.sq, x.sqb, x.skb, x.lo, x.hi, x.target
    qp, kp, vp, scale, mask = x.qp, x.kp, x.vp, x.scale, m.kind
    chunk = _key_chunk(q, k, sqb, skb, mask, target, dense=x.dense is not None)
    parts = []
    for c0 in range(0, skb, chunk):
        c1 = min(skb, c0 + chunk)
        clo, chi = np.clip(lo - c0, 0, c1 - c0), np.clip(hi - c0, 0, c1 - c0)
        if x.dense is not None:
            plan, mask_t, bias_t = dense_operands(x.dense, c0, c1, q.device)
            ops: Any = (None, plan, mask_t, bias_t)
            empty_c = x.dense.empty_rows(c0, c1)
        else:
            plan, bounds = _plan_and_bounds(clo, chi, c1 - c0, q.device)
            ops = (bounds, plan, None, None)
            empty_c = (clo >= chi)[:, None, :]
        problem = _problem(q, k, sqb, c1 - c0, mask)
        cfg = lookup_config("flash_attention", problem, flash_attention_fwd, target=target)
        assert isinstance(cfg, FlashFwdConfig)
        cfg = with_kv_overlap(cfg, problem, target)
        kc, vc = kp[:, :, c0:c1].contiguous(), vp[:, :, c0:c1].contiguous()
        out_c, lse_c = _launch_fwd(qp, kc, vc, m, scale, cfg, target, ops)
        lse_c = lse_from_kernel(lse_c)
        empty = torch.from_numpy(empty_c).to(q.device)
        parts.append((out_c, lse_c.masked_fill(empty, float("-inf"))))
    out, lse = parts[0] if len(parts) == 1 else _merge(parts)
    out, lse = out[:, :, :sq], lse[:, :, :sq]
    empty_rows = _empty_rows(x)[:, :, :sq]
    if empty_rows.any():  # decided on the host plan (no tensor data read: traceable)
        empty = torch.from_numpy(empty_rows).to(q.device)
        out = out.masked_fill(empty[..., None], 0.0)
        lse = lse.masked_fill(empty, float("-inf"))
    return out.contiguous(), lse.contiguous()


def _empty_rows(x: _Padded) -> np.ndarray:
    """bool [B | 1, H | 1, Sqb]: rows with no allowed key at all (out 0, lse -inf)."""
    if x.dense is not None:
        return x.dense.empty_rows()
    return (x.lo >= x.hi)[:, None, :]


DENSE_RESERVE_KEYS = 8192  # resident keys given up for a dense mask's SBUF tile rings


def _key_chunk(
    q: Tensor, k: Tensor, sqb: int, skb: int, mask: str, target: Any, dense: bool = False
) -> int:
    """Keys per forward call: all of them, or the longest range whose K^T / V fit in
    SBUF under the config that will run it (re-checked for the chunk's own config).

    With a dense mask the kernel also keeps rings of loaded mask / bias tiles (up to
    20 KiB per partition), which the config's dry run does not see: the chunk leaves
    room for them."""
    chunk = skb
    for _ in range(4):
        problem = _problem(q, k, sqb, chunk, mask)
        cfg = lookup_config("flash_attention", problem, flash_attention_fwd, target=target)
        assert isinstance(cfg, FlashFwdConfig)
        limit = max_resident_keys(cfg, problem, target)
        if dense and limit < chunk + DENSE_RESERVE_KEYS:
            limit = max(1024, limit - DENSE_RESERVE_KEYS)
        if limit >= chunk:
            return chunk
        chunk = limit
    return chunk


def lse_from_kernel(lse_pm: Tensor) -> Tensor:
    """[B, H, 128, nq] partition-major (the kernels' layout) -> [B, H, nq * 128]."""
    b, h, p, nq = lse_pm.shape
    return lse_pm.transpose(2, 3).reshape(b, h, nq * p)


def lse_to_kernel(lse: Tensor) -> Tensor:
    """[B, H, nq * 128] -> the kernels' partition-major [B, H, 128, nq] (contiguous)."""
    b, h, s = lse.shape
    return lse.reshape(b, h, s // 128, 128).transpose(2, 3).contiguous()


def _merge(parts: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Combine per-key-chunk results: lse = logsumexp(lse_c), out = sum w_c * out_c.

    A chunk with no allowed key for a row (lse_c = -inf) is selected out, not weighted
    by 0: the kernel leaves such rows unspecified (possibly non-finite)."""
    lses = torch.stack([p[1] for p in parts])
    lse = torch.logsumexp(lses, dim=0)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    out = torch.zeros_like(parts[0][0], dtype=torch.float32)
    for out_c, lse_c in parts:
        w = torch.exp(lse_c - safe).unsqueeze(-1) * out_c.float()
        out += torch.where(torch.isneginf(lse_c).unsqueeze(-1), 0.0, w)
    return out.to(parts[0][0].dtype), lse


def bwd_kernel_rows(
    lo: np.ndarray,
    hi: np.ndarray,
    sk: int,
    lse: Tensor,
    dlse: Tensor | None = None,
    diagonal: bool = True,
) -> tuple[Any, Tensor | None, Tensor, Tensor | None]:
    """The backward kernel's row-indexed operands from natural-order ones: tile plan,
    bounds and partition-major lse / dlse, all in `bwd_row_order` (lo, hi: [B, Sq]
    key bounds; lse, dlse: [B, H, Sq] fp32 with Sq a multiple of 128)."""
    perm = np.asarray(bwd_row_order(lo.shape[1]), dtype=np.int64)
    plan, bounds = _plan_and_bounds(lo[:, perm], hi[:, perm], sk, lse.device, diagonal=diagonal)
    index = torch.from_numpy(perm).to(lse.device)
    lse_k = lse_to_kernel(lse.index_select(2, index))
    dlse_k = lse_to_kernel(dlse.index_select(2, index)) if dlse is not None else None
    return plan, bounds, lse_k, dlse_k


def backward(
    grad_out: Tensor,
    grad_lse: Tensor | None,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    m: MaskArgs,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of the op from its saved output and lse (and their gradients)."""
    x = _pad(q, k, v, m, clean_k=True)
    sq, sk, sqb, skb, lo, hi = x.sq, x.sk, x.sqb, x.skb, x.lo, x.hi
    op, dop = pad_dim(out, 2, sqb), pad_dim(grad_out.to(q.dtype), 2, sqb)
    # rows without an allowed key (and padded rows) get lse = +inf: their P is exactly 0
    empty = torch.from_numpy(_empty_rows(x)).to(q.device)
    if _empty_rows(x)[..., :sq].any():  # decided on the host plan (traceable)
        # their output is 0 whatever the inputs: their grad_out must not reach dV
        dop = dop.masked_fill(empty[..., None], 0.0)
    lse_p = pad_dim(lse.float(), 2, sqb).masked_fill(empty, float("inf"))
    dlse = None
    if grad_lse is not None:
        dlse = pad_dim(grad_lse.float(), 2, sqb).masked_fill(empty, 0.0)
    # soft-capped scores: a causal-diagonal bias added before the tanh would be capped
    plan, bounds, lse_p, dlse = bwd_kernel_rows(lo, hi, skb, lse_p, dlse, m.softcap is None)
    dense: tuple[Any, ...] = ()
    if x.dense is not None:
        perm = np.asarray(bwd_row_order(sqb), dtype=np.int64)
        plan, mask_t, bias_t = dense_operands(x.dense, 0, skb, q.device, rows=perm)
        bounds, dense = None, (mask_t, bias_t)
    problem = _problem(q, k, sqb, skb, m.kind)
    cfg = lookup_config("flash_attention_bwd", problem, flash_attention_bwd, target=x.target)
    args = (x.qp, x.kp, x.vp, op.contiguous(), dop.contiguous(), lse_p, dlse, bounds, x.scale)
    if dense or m.softcap is not None:
        c = cfg.to_dict()
        fields = ("section", "dma_quarters", "scalar_evac")
        extra = (*(dense or (None, None)), m.softcap)
        dq, dk, dv = launch(
            flash_attention_bwd, *args, plan, *(c[f] for f in fields), *extra, target=x.target
        )
    else:
        dq, dk, dv = launch(flash_attention_bwd, *args, plan, config=cfg, target=x.target)
    return dq[:, :, :sq].contiguous(), dk[:, :, :sk].contiguous(), dv[:, :, :sk].contiguous()


__all__ = [
    "DenseMask",
    "MaskArgs",
    "backward",
    "bwd_kernel_rows",
    "check_data",
    "dense_of",
    "dense_operands",
    "forward",
    "lse_from_kernel",
    "lse_to_kernel",
]
