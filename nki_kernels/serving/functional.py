"""Functional names shaped like the vLLM Neuron plugin's `vllm_neuron.functional` (NF).

A model written against NF's segmented-prefill call switches by changing the import::

    import nki_kernels.serving.functional as NF

    out = NF.segmented_attention(q, k_cache=k_cache, v_cache=v_cache,
                                 block_tables=block_table, prior_tokens=cached_seq_len,
                                 block_size=block_size, kv_segment_size=kv_segment_size,
                                 scale=scaling, sliding_window=window, sink=sinks.unsqueeze(1),
                                 tp_q=True, tp_out=True)          # [Nh, Dh, T]

Conventions read from the plugin's design docs and the models that call it
(aws-neuron-sdk `vllm-neuron/docs`, 2026): q [Nh, T, Dh] (`tp_q=True`), caches
[num_blocks, Hkv, block_size, Dh], `prior_tokens` [B, 1] (cached_seq_len), `sink`
[Nh, 1], output [Nh, Dh, T] with `tp_out=True` (else [Nh, T, Dh]). The plugin's kernel
serves one sequence per call (B = 1); here B sequences of T / B tokens each are served.
`kv_segment_size` is accepted (the plugin's prior-KV step; its segments of 512..4096
keys) and not needed: the kernel steps through the keys 128 to 512 at a time.
`fp8_packed=True` (the plugin's packed fp8 K layout) is not supported. FP8 caches
(float8_e4m3fn / float8_e5m2) take their scales as `k_scale` / `v_scale` keywords
instead of the plugin's folding by hand (`scale / k_scale`, `out / v_scale`).

`write_kv_cache(k, v, k_cache, v_cache, slot_mapping, block_size)`: the model-owned cache
write (k, v [Hkv, T, Dh] as the plugin's models hold them; slot -1 skipped).

`flash_attention(q, k, v, scale=1.0, causal_mask=True, sink=None, sliding_window=None,
tp_q=True, tp_k=False, tp_out=False)`: prefill attention without a cache. The plugin's
docs name `NF.flash_attention` and its kernel (nki-library `core/attention/
attention_cte.py`) but print no signature, so the arguments, order and layouts are that
kernel's: q [B, S, Dh] (`tp_q`) or [B, Dh, S], k [B_kv, Dh, S] (or [B_kv, S, Dh] with
`tp_k`), v [B_kv, S, Dh], heads folded into the batch (B = Hq, B_kv = Hkv, query b
on KV b // (B / B_kv)), `sink` [B, 1], out [B, S, Dh] or [B, Dh, S] (`tp_out`).

`attention_decode(X, *, W_qkv, K_cache, V_cache, block_tables, cached_seq_len,
slot_mapping, ...)`: the decode attention block (QKV projection, RoPE, cache write,
attention, output projection). The plugin's `NF.attention_decode` calls nki-library's
fused megakernel (`experimental/transformer/attention_block_tkg.py`); its docs print
only the keywords `softmax_scale`, `W_out`, `k_scale`, `v_scale` (FP8 KV: k_scale /
v_scale are quantization multipliers, X * k_scale; the caller folds the dequantization
into `softmax_scale = scaling / k_scale` and `W_out = o_proj / v_scale`). Here every
argument is a keyword named as the megakernel names it, the FP8 convention is the
plugin's, the projections and RoPE are torch ops, and the write + attention is one
`serving_attention` launch (not the megakernel's single launch; FP8 caches too: the op's
scales are the reciprocals, softmax_scale passed times k_scale, the output multiplied by
v_scale on return).

Not provided: `qkv_proj`, `o_proj`, `mlp`, `gen_attention_decode_mask` (no mask tensor:
the positions follow from `cached_seq_len`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..ops.attention import flash_attention as _flash_attention
from ..ops.serving import KV_SCALE_MIN, kv_cache_write, serving_attention
from ..ops.sinks import sink_attention


def _check_block_size(block_size: int, k_cache: Tensor) -> None:
    if block_size != k_cache.shape[2]:
        raise ValueError(
            f"block_size: expected {k_cache.shape[2]} (k_cache [num_blocks, Hkv, block_size, "
            f"Dh]); got {block_size}"
        )


def segmented_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    prior_tokens: Tensor,
    block_size: int,
    kv_segment_size: int = 0,
    scale: float | None = None,
    sliding_window: int | None = None,
    sink: Tensor | None = None,
    tp_q: bool = True,
    tp_out: bool = True,
    fp8_packed: bool = False,
    *,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> Tensor:
    """Attention of T new tokens over their cached prefix plus themselves (causal).

    q [Nh, T, Dh] (`tp_q=True`) or [Nh, Dh, T]; the T tokens are B equal runs, run b
    at positions prior_tokens[b] + i of sequence b (block_tables row b). The cache must
    already hold the new tokens' K / V (`write_kv_cache`). Returns [Nh, Dh, T]
    (`tp_out=True`) or [Nh, T, Dh].
    """
    if fp8_packed:
        raise ValueError("fp8_packed: expected False (the packed fp8 K layout is not supported)")
    if isinstance(kv_segment_size, bool) or not isinstance(kv_segment_size, int):
        raise ValueError(f"kv_segment_size: expected an int >= 0; got {kv_segment_size!r}")
    _check_block_size(block_size, k_cache)
    qt = q if tp_q else q.transpose(1, 2)  # [Nh, T, Dh]
    nh, t_tok, _ = qt.shape
    b = block_tables.shape[0]
    if t_tok % b:
        raise ValueError(
            f"q: expected T divisible by the {b} sequences of block_tables; got T = {t_tok}"
        )
    per = t_tok // b
    qsl = torch.arange(b + 1, device=q.device) * per
    out = serving_attention(
        qt.transpose(0, 1).contiguous(), k_cache, v_cache, block_tables,
        prior_tokens.reshape(-1), qsl, sinks=None if sink is None else sink.reshape(nh).float(),
        k_scale=k_scale, v_scale=v_scale, softmax_scale=scale, sliding_window=sliding_window,
        layout="hnd",
    )  # fmt: skip
    out = out.transpose(0, 1)  # [Nh, T, Dh]
    return out.transpose(1, 2) if tp_out else out


def write_kv_cache(
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    block_size: int,
    *,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> None:
    """Write k, v [Hkv, T, Dh] at slot_mapping [T] (block * block_size + offset; -1 =
    skip) into k_cache, v_cache [num_blocks, Hkv, block_size, Dh], in place."""
    _check_block_size(block_size, k_cache)
    kv_cache_write(
        k.transpose(0, 1), v.transpose(0, 1), k_cache, v_cache, slot_mapping,
        k_scale=k_scale, v_scale=v_scale, layout="hnd",
    )  # fmt: skip


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float = 1.0,
    causal_mask: bool = True,
    sink: Tensor | None = None,
    sliding_window: int | None = None,
    tp_q: bool = True,
    tp_k: bool = False,
    tp_out: bool = False,
) -> Tensor:
    """Prefill attention with nki-library attention_cte's arguments and layouts (see the
    module docstring): heads folded into the batch, GQA by B // B_kv; `sliding_window`
    W keeps the W most recent keys (causal); `sink` [B, 1] joins each row's softmax
    denominator. The training kernels (`flash_attention`, `sink_attention`) serve it."""
    qt = q if tp_q else q.transpose(1, 2)  # [B, S, Dh]
    kt = k if tp_k else k.transpose(1, 2)  # [B_kv, S, Dh]
    if v.dim() != 3 or kt.shape != v.shape:
        raise ValueError(
            f"v: expected [B_kv, S, Dh] = {tuple(kt.shape)} (as k); got {tuple(v.shape)}"
        )
    b, b_kv = qt.shape[0], kt.shape[0]
    if b % b_kv:
        raise ValueError(f"k: expected a batch dividing q's {b} (GQA); got {b_kv}")
    if sliding_window == 0:  # attention_cte: None or 0 is no window
        sliding_window = None
    qh, kh, vh = qt.unsqueeze(0), kt.unsqueeze(0), v.unsqueeze(0)  # [1, heads, S, Dh]
    if sink is not None:
        if sink.numel() != b:
            raise ValueError(f"sink: expected shape ({b}, 1) [B, 1]; got {tuple(sink.shape)}")
        out = sink_attention(qh, kh, vh, sink.reshape(b).float(), causal=causal_mask,
                             softmax_scale=scale, sliding_window=sliding_window)  # fmt: skip
    else:
        out = _flash_attention(qh, kh, vh, causal=causal_mask, softmax_scale=scale,
                               sliding_window=sliding_window)  # fmt: skip
    assert isinstance(out, Tensor)
    out = out[0]  # [B, S, Dh]
    return out.transpose(1, 2) if tp_out else out


def _rope(x: Tensor, cos: Tensor, sin: Tensor, contiguous: bool) -> Tensor:
    """Rotary embedding of x [B, S, heads, Dh] with cos / sin [Dh / 2, B, S]: contiguous
    halves (x1, x2) = (x[:Dh/2], x[Dh/2:]) or interleaved pairs (x[0::2], x[1::2])."""
    c = cos.permute(1, 2, 0).unsqueeze(2).to(torch.float32)  # [B, S, 1, Dh / 2]
    s_ = sin.permute(1, 2, 0).unsqueeze(2).to(torch.float32)
    xf = x.float()
    half = x.shape[-1] // 2
    x1, x2 = (xf[..., :half], xf[..., half:]) if contiguous else (xf[..., 0::2], xf[..., 1::2])
    r1, r2 = x1 * c - x2 * s_, x2 * c + x1 * s_
    out = torch.cat([r1, r2], -1) if contiguous else torch.stack([r1, r2], -1).flatten(-2)
    return out.to(x.dtype)


def attention_decode(
    X: Tensor,
    *,
    W_qkv: Tensor,
    K_cache: Tensor,
    V_cache: Tensor,
    block_tables: Tensor,
    cached_seq_len: Tensor,
    slot_mapping: Tensor,
    q_heads: int,
    bias_qkv: Tensor | None = None,
    rmsnorm_X_gamma: Tensor | None = None,
    rmsnorm_X_eps: float = 1e-3,
    cos: Tensor | None = None,
    sin: Tensor | None = None,
    rope_contiguous_layout: bool = True,
    sink: Tensor | None = None,
    sliding_window: int | None = None,
    W_out: Tensor | None = None,
    bias_out: Tensor | None = None,
    softmax_scale: float | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> Tensor:
    """The decode attention block of S_tkg new tokens per sequence (see the module
    docstring). X [B, S_tkg, H]; W_qkv [H, Dh * (q_heads + 2 Hkv)] (Q, then K, then V
    columns), bias_qkv [1, ...]; optional RMSNorm of X (`rmsnorm_X_gamma` [1, H]); RoPE
    from cos / sin [Dh / 2, B, S_tkg] (None: none); caches [num_blocks, Hkv, block_size,
    Dh]; token i of sequence b at position cached_seq_len[b] + i, written at
    slot_mapping [B * S_tkg] (-1: skip); sink [q_heads, 1]. FP8 caches take k_scale /
    v_scale as the plugin does (multipliers, dequantization folded by the caller into
    softmax_scale and W_out; written, then attended: two launches). Returns
    [B, S_tkg, H] with W_out [q_heads * Dh, H] (+ bias_out [1, H]), else
    [B, q_heads, Dh, S_tkg]."""
    b, s_tkg, _h = X.shape
    hkv, dh = K_cache.shape[1], K_cache.shape[3]
    x = X
    if rmsnorm_X_gamma is not None:
        xf = X.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + rmsnorm_X_eps)
        x = (xf * rmsnorm_X_gamma.reshape(-1).float()).to(X.dtype)
    qkv = x @ W_qkv
    if bias_qkv is not None:
        qkv = qkv + bias_qkv.reshape(-1)
    width = dh * (q_heads + 2 * hkv)
    if qkv.shape[-1] != width:
        raise ValueError(
            f"W_qkv: expected {width} columns (Dh {dh} x (q_heads {q_heads} + 2 x Hkv "
            f"{hkv})); got {qkv.shape[-1]}"
        )
    q, k, v = qkv.split([q_heads * dh, hkv * dh, hkv * dh], dim=-1)
    q = q.reshape(b, s_tkg, q_heads, dh)
    k = k.reshape(b, s_tkg, hkv, dh)
    v = v.reshape(b, s_tkg, hkv, dh)
    if cos is not None and sin is not None:
        q = _rope(q, cos, sin, rope_contiguous_layout)
        k = _rope(k, cos, sin, rope_contiguous_layout)
    qf = q.reshape(b * s_tkg, q_heads, dh)
    kf, vf = k.reshape(b * s_tkg, hkv, dh), v.reshape(b * s_tkg, hkv, dh)
    slots = slot_mapping.reshape(-1)
    qsl = torch.arange(b + 1, device=X.device) * s_tkg
    sinks = None if sink is None else sink.reshape(q_heads).float()
    common = dict(sinks=sinks, softmax_scale=softmax_scale, sliding_window=sliding_window,
                  layout="hnd", max_query_len=s_tkg)  # fmt: skip
    if (k_scale is None) != (v_scale is None):
        raise ValueError(
            f"k_scale / v_scale: expected both (an fp8 cache) or neither; got k_scale "
            f"{'None' if k_scale is None else 'a tensor'}, v_scale "
            f"{'None' if v_scale is None else 'a tensor'}"
        )
    for arg, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        if sc is not None and sc.numel() != 1:
            # one multiplier: the caller folds its inverse into the scalar softmax_scale / W_out
            raise ValueError(f"{arg}: expected one value (per tensor); got shape {tuple(sc.shape)}")
        if sc is not None:
            # checked as the caller wrote it: the op below receives 1 / sc
            val = float(sc.detach().to("cpu", torch.float64).reshape(-1)[0])
            if not (math.isfinite(val) and KV_SCALE_MIN <= val <= 1.0 / KV_SCALE_MIN):
                raise ValueError(
                    f"{arg}: expected a finite multiplier in [{KV_SCALE_MIN:g}, "
                    f"{1.0 / KV_SCALE_MIN:g}] (the cache holds x * {arg}; 1 / {arg} is the "
                    f"write's scale); got {val:g}"
                )
    if k_scale is not None and v_scale is not None:
        # The plugin's FP8 convention: the cache holds x * k_scale and the caller folded
        # the dequantization into softmax_scale and W_out. One launch with this op's
        # scales 1 / k_scale, 1 / v_scale: its write stores x * k_scale, its read
        # multiplies the cached values by 1 / k_scale and the output by 1 / v_scale, so
        # softmax_scale goes in times k_scale (the same logits) and the output comes back
        # times v_scale (W_out keeps its 1 / v_scale)
        kmul = float(k_scale.detach().to("cpu", torch.float64).reshape(-1)[0])
        vmul = float(v_scale.detach().to("cpu", torch.float64).reshape(-1)[0])
        sm = dh**-0.5 if softmax_scale is None else float(softmax_scale)
        common["softmax_scale"] = sm * kmul
        out = serving_attention(qf, K_cache, V_cache, block_tables, cached_seq_len.reshape(-1),
                                qsl, k=kf, v=vf, slot_mapping=slots,
                                k_scale=1.0 / k_scale.reshape(-1).float(),
                                v_scale=1.0 / v_scale.reshape(-1).float(), **common)  # type: ignore[arg-type]  # fmt: skip
        out = out * vmul
    else:
        out = serving_attention(qf, K_cache, V_cache, block_tables, cached_seq_len.reshape(-1),
                                qsl, k=kf, v=vf, slot_mapping=slots, **common)  # type: ignore[arg-type]  # fmt: skip
    out = out.reshape(b, s_tkg, q_heads * dh)
    if W_out is None:
        return out.reshape(b, s_tkg, q_heads, dh).permute(0, 2, 3, 1)
    y = out @ W_out
    return y + bias_out.reshape(-1) if bias_out is not None else y


__all__ = ["attention_decode", "flash_attention", "segmented_attention", "write_kv_cache"]
