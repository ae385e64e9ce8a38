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
        masks.segment_runs(segment_ids.detach().cpu().numpy())


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

    @property
    def kind(self) -> str:
        """The mask kind a config is chosen for (`AttentionProblem.mask`)."""
        if self.kv_lens is not None or self.segment_ids is not None:
            return "data"
        if self.sliding_window is not None:
            return "window"
        return "causal" if self.causal else "none"


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

    @property
    def sqb(self) -> int:
        return int(self.qp.shape[2])

    @property
    def skb(self) -> int:
        return int(self.kp.shape[2])


def _pad(q: Tensor, k: Tensor, v: Tensor, m: MaskArgs) -> _Padded:
    """The prologue of both directions: data checks, bucket padding, key bounds."""
    sk = k.shape[2]
    check_data(m.kv_lens, m.segment_ids, sk)
    qp, _ = pad_to_bucket(q, dim=2)
    kp, _ = pad_to_bucket(k, dim=2)
    lo, hi = _bounds(q.shape[0], qp.shape[2], kp.shape[2], q.shape[2], sk, m)
    scale = softmax_scale_of(q, m.softmax_scale)
    vp = pad_dim(v, 2, kp.shape[2])
    return _Padded(qp, kp, vp, q.shape[2], sk, lo, hi, scale, get_target(None))


def _bounds(
    b: int, sqb: int, skb: int, sq: int, sk: int, m: MaskArgs
) -> tuple[np.ndarray, np.ndarray]:
    seg = None
    if m.segment_ids is not None:
        s = m.segment_ids.detach().cpu().numpy().astype(np.int64)
        fill = int(s.min()) - 1 if s.size else 0  # padded positions: a document of their own
        seg = np.concatenate([s, np.full((b, sqb - sq), fill, dtype=np.int64)], axis=1)
    kl = m.kv_lens.detach().cpu().numpy() if m.kv_lens is not None else None
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


def forward(q: Tensor, k: Tensor, v: Tensor, m: MaskArgs) -> tuple[Tensor, Tensor]:
    """(out, lse [B, Hq, Sq]) of the op: padded, chunked over keys, merged, unpadded."""
    x = _pad(q, k, v, m)
    sq, sqb, skb, lo, hi, target = x.sq, x.sqb, x.skb, x.lo, x.hi, x.target
    qp, kp, vp, scale, mask = x.qp, x.kp, x.vp, x.scale, m.kind
    chunk = _key_chunk(q, k, sqb, skb, mask, target)
    parts = []
    for c0 in range(0, skb, chunk):
        c1 = min(skb, c0 + chunk)
        clo, chi = np.clip(lo - c0, 0, c1 - c0), np.clip(hi - c0, 0, c1 - c0)
        plan, bounds = _plan_and_bounds(clo, chi, c1 - c0, q.device)
        problem = _problem(q, k, sqb, c1 - c0, mask)
        cfg = lookup_config("flash_attention", problem, flash_attention_fwd, target=target)
        assert isinstance(cfg, FlashFwdConfig)
        cfg = with_kv_overlap(cfg, problem, target)
        out_c, lse_c = launch(
            flash_attention_fwd,
            qp,
            kp[:, :, c0:c1].contiguous(),
            vp[:, :, c0:c1].contiguous(),
            bounds,
            scale,
            plan,
            config=cfg,
            target=target,
        )
        lse_c = lse_from_kernel(lse_c)
        empty = torch.from_numpy(clo >= chi).to(q.device)[:, None, :]
        parts.append((out_c, lse_c.masked_fill(empty, float("-inf"))))
    out, lse = parts[0] if len(parts) == 1 else _merge(parts)
    out, lse = out[:, :, :sq], lse[:, :, :sq]
    empty = torch.from_numpy(lo[:, :sq] >= hi[:, :sq]).to(q.device)[:, None, :]
    if bool(empty.any()):
        out = out.masked_fill(empty[..., None], 0.0)
        lse = lse.masked_fill(empty, float("-inf"))
    return out.contiguous(), lse.contiguous()


def _key_chunk(q: Tensor, k: Tensor, sqb: int, skb: int, mask: str, target: Any) -> int:
    """Keys per forward call: all of them, or the longest range whose K^T / V fit in
    SBUF under the config that will run it (re-checked for the chunk's own config)."""
    chunk = skb
    for _ in range(4):
        problem = _problem(q, k, sqb, chunk, mask)
        cfg = lookup_config("flash_attention", problem, flash_attention_fwd, target=target)
        assert isinstance(cfg, FlashFwdConfig)
        limit = max_resident_keys(cfg, problem, target)
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
    """Combine per-key-chunk results: lse = logsumexp(lse_c), out = sum w_c * out_c."""
    lses = torch.stack([p[1] for p in parts])
    lse = torch.logsumexp(lses, dim=0)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    out = torch.zeros_like(parts[0][0], dtype=torch.float32)
    for out_c, lse_c in parts:
        out += torch.exp(lse_c - safe).unsqueeze(-1) * out_c.float()
    return out.to(parts[0][0].dtype), lse


def bwd_kernel_rows(
    lo: np.ndarray, hi: np.ndarray, sk: int, lse: Tensor, dlse: Tensor | None = None
) -> tuple[Any, Tensor | None, Tensor, Tensor | None]:
    """The backward kernel's row-indexed operands from natural-order ones: tile plan,
    bounds and partition-major lse / dlse, all in `bwd_row_order` (lo, hi: [B, Sq]
    key bounds; lse, dlse: [B, H, Sq] fp32 with Sq a multiple of 128)."""
    perm = np.asarray(bwd_row_order(lo.shape[1]), dtype=np.int64)
    plan, bounds = _plan_and_bounds(lo[:, perm], hi[:, perm], sk, lse.device, diagonal=True)
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
    x = _pad(q, k, v, m)
    sq, sk, sqb, skb, lo, hi = x.sq, x.sk, x.sqb, x.skb, x.lo, x.hi
    op, dop = pad_dim(out, 2, sqb), pad_dim(grad_out.to(q.dtype), 2, sqb)
    # rows without an allowed key (and padded rows) get lse = +inf: their P is exactly 0
    empty = torch.from_numpy(lo >= hi).to(q.device)[:, None, :]
    lse_p = pad_dim(lse.float(), 2, sqb).masked_fill(empty, float("inf"))
    dlse = None
    if grad_lse is not None:
        dlse = pad_dim(grad_lse.float(), 2, sqb).masked_fill(empty, 0.0)
    plan, bounds, lse_p, dlse = bwd_kernel_rows(lo, hi, skb, lse_p, dlse)
    problem = _problem(q, k, sqb, skb, m.kind)
    cfg = lookup_config("flash_attention_bwd", problem, flash_attention_bwd, target=x.target)
    dq, dk, dv = launch(
        flash_attention_bwd,
        x.qp,
        x.kp,
        x.vp,
        op.contiguous(),
        dop.contiguous(),
        lse_p,
        dlse,
        bounds,
        x.scale,
        plan,
        config=cfg,
        target=x.target,
    )
    return dq[:, :, :sq].contiguous(), dk[:, :, :sk].contiguous(), dv[:, :, :sk].contiguous()


__all__ = [
    "MaskArgs",
    "backward",
    "bwd_kernel_rows",
    "check_data",
    "forward",
    "lse_from_kernel",
    "lse_to_kernel",
]
