"""Plain PyTorch references of the serving ops, written for clarity (float64 math).

`reference_cache_write` quantizes exactly as the kernel does (fp32 x * (1 / scale),
saturated to the fp8 format's largest finite value, rounded to nearest even), so the
caches it returns are the kernel's bit for bit. `reference_serving_attention` writes,
then attends every query over its sequence's keys read back from the cache (dequantized
with their scales), causal, with an optional sliding window and attention sinks.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .host import FP8_MAX


def _per_head(scale: Tensor | None, hkv: int) -> Tensor:
    if scale is None:
        return torch.ones(hkv, dtype=torch.float64)
    return scale.detach().to("cpu", torch.float64).reshape(-1).expand(hkv).clone()


def _view_rows(cache: Tensor, layout: str) -> Tensor:
    """[num_blocks * block_size, Hkv, D] view of the cache's slots (a copy for "hnd")."""
    if layout == "nhd":
        nb, bs, h, d = cache.shape
        return cache.reshape(nb * bs, h, d)
    nb, h, bs, d = cache.shape
    return cache.permute(0, 2, 1, 3).reshape(nb * bs, h, d)


def reference_cache_write(
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    layout: str = "nhd",
) -> tuple[Tensor, Tensor]:
    """New caches (copies) with k, v [T, Hkv, D] written at their slots (-1 skipped)."""
    outs = []
    hkv = k.shape[1]
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        new = cache.detach().cpu().clone()
        rows = _view_rows(new, layout).clone()
        slots = slot_mapping.detach().cpu().long()
        keep = slots >= 0
        vals = x.detach().cpu()[keep]
        fmax = FP8_MAX.get(cache.dtype)
        if fmax is not None:
            inv = (1.0 / _per_head(scale, hkv)).to(torch.float32)  # the kernel's fp32 reciprocal
            q = vals.to(torch.float32) * inv[None, :, None]
            vals = torch.clamp(q, -fmax, fmax)  # clamp keeps NaN
        rows[slots[keep]] = vals.to(cache.dtype)
        if layout == "nhd":
            new = rows.reshape(new.shape)
        else:
            nb, h, bs, d = new.shape
            new = rows.reshape(nb, bs, h, d).permute(0, 2, 1, 3).contiguous()
        outs.append(new)
    return outs[0], outs[1]


def reference_serving_attention(
    q: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor | None,
    block_table: Tensor,
    cached_seq_len: Tensor,
    query_start_loc: Tensor,
    *,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    sinks: Tensor | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    layout: str = "nhd",
) -> tuple[Tensor, Tensor, Tensor]:
    """(out [T, Hq, D] float64, k_cache, v_cache after the write)."""
    if k is not None and v is not None and slot_mapping is not None:
        k_cache, v_cache = reference_cache_write(
            k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, layout
        )
    t_tok, hq, d = q.shape
    krows, vrows = _view_rows(k_cache.cpu(), layout), _view_rows(v_cache.cpu(), layout)
    hkv = krows.shape[1]
    bs = k_cache.shape[1] if layout == "nhd" else k_cache.shape[2]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    ks, vs = _per_head(k_scale, hkv), _per_head(v_scale, hkv)
    out = torch.zeros(t_tok, hq, d, dtype=torch.float64)
    qsl = query_start_loc.cpu().long().tolist()
    ctx = cached_seq_len.cpu().long().tolist()
    bt = block_table.cpu().long()
    for s in range(len(qsl) - 1):
        n = qsl[s + 1] - qsl[s]
        if n == 0:
            continue
        total = ctx[s] + n
        j = torch.arange(total)
        slots = bt[s, j // bs] * bs + j % bs
        kk = krows[slots].double() * ks[None, :, None]  # [total, Hkv, D] dequantized
        vv = vrows[slots].double() * vs[None, :, None]
        kk = kk.repeat_interleave(hq // hkv, dim=1)
        vv = vv.repeat_interleave(hq // hkv, dim=1)
        qq = q[qsl[s] : qsl[s + 1]].detach().cpu().double()  # [n, Hq, D]
        scores = torch.einsum("nhd,khd->hnk", qq, kk) * scale
        pos = ctx[s] + torch.arange(n)
        allowed = j[None, :] <= pos[:, None]
        if sliding_window is not None:
            allowed &= j[None, :] > pos[:, None] - sliding_window
        scores = scores.masked_fill(~allowed[None], -math.inf)
        if sinks is not None:
            sink = sinks.detach().cpu().double()[:, None, None].expand(hq, n, 1)
            scores = torch.cat([scores, sink], dim=-1)
        # rows with no key and no sink: softmax of all -inf is NaN; their out is 0
        p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        if sinks is not None:
            p = p[..., :-1]
        # keys a row may not attend never contribute (select, not multiply)
        contrib = torch.where(
            allowed[None, :, :, None], p[..., None] * vv.permute(1, 0, 2)[:, None], 0.0
        )
        out[qsl[s] : qsl[s + 1]] = contrib.sum(2).permute(1, 0, 2)
    return out, k_cache, v_cache


__all__ = ["reference_cache_write", "reference_serving_attention"]
