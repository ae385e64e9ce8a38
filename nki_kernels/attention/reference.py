"""fp32 reference of the flash-attention op: plain SDPA math in torch, written for clarity.

The mask is built element by element from the definitions in `masks.py` (not from the
kernels' interval bounds), so the tests compare two independent readings of the same
contract. Rows without any allowed key produce 0 and lse = -inf.
"""

from __future__ import annotations

import math

import torch


def reference_mask(
    batch: int,
    sq: int,
    sk: int,
    *,
    causal: bool = False,
    sliding_window: int | None = None,
    kv_lens: torch.Tensor | None = None,
    segment_ids: torch.Tensor | None = None,
    causal_offset: int | None = None,
) -> torch.Tensor:
    """Boolean [batch, sq, sk]: True where query i may attend to key j."""
    i = torch.arange(sq).view(1, sq, 1)
    j = torch.arange(sk).view(1, 1, sk)
    allowed = torch.ones(batch, sq, sk, dtype=torch.bool)
    offset = sk - sq if causal_offset is None else causal_offset
    if causal or sliding_window is not None:
        allowed &= j <= i + offset
    if sliding_window is not None:
        allowed &= j > i + offset - sliding_window
    if kv_lens is not None:
        allowed &= j < kv_lens.view(batch, 1, 1).to(torch.int64)
    if segment_ids is not None:
        seg = segment_ids.to(torch.int64)
        allowed &= seg[:, :sq].view(batch, sq, 1) == seg[:, :sk].view(batch, 1, sk)
    return allowed


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    kv_lens: torch.Tensor | None = None,
    segment_ids: torch.Tensor | None = None,
    causal_offset: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, Hq, Sq, D], lse [B, Hq, Sq]) computed in fp32 (differentiable).

    q: [B, Hq, Sq, D]; k, v: [B, Hkv, Sk, D] with Hq a multiple of Hkv (GQA: query head
    h reads key/value head h // (Hq // Hkv)).
    """
    batch, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    qf, kf, vf = q.float(), k.float(), v.float()
    if hq != hkv:
        kf = kf.repeat_interleave(hq // hkv, dim=1)
        vf = vf.repeat_interleave(hq // hkv, dim=1)
    scores = torch.einsum("bhqd,bhkd->bhqk", qf, kf) * scale
    allowed = reference_mask(
        batch,
        sq,
        sk,
        causal=causal,
        sliding_window=sliding_window,
        kv_lens=kv_lens,
        segment_ids=segment_ids,
        causal_offset=causal_offset,
    ).unsqueeze(1)
    empty = ~allowed.any(dim=-1, keepdim=True)  # rows with no allowed key
    # empty rows see every key in this softmax (finite, gradient-safe), then are zeroed
    scores = scores.masked_fill(~allowed & ~empty, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.exp(scores - lse).masked_fill(empty, 0.0)
    out = torch.einsum("bhqk,bhkd->bhqd", probs, vf)
    lse = lse.masked_fill(empty, float("-inf")).squeeze(-1)
    return out, lse


__all__ = ["attention_reference", "reference_mask"]
