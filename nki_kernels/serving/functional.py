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

Not provided: `attention_decode` (the plugin's fused QKV + RoPE + attention + output
megakernel), `qkv_proj`, `o_proj`, `mlp`; decode rows go through `segmented_attention`
(or `nki_kernels.ops.decode.decode_attention`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops.serving import kv_cache_write, serving_attention


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


__all__ = ["segmented_attention", "write_kv_cache"]
