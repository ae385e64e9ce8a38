"""Kernel layers on the NKI ops, in the form `kernels.kernelize` requires: stateless
classes (no constructor, no members beyond `has_backward` / `can_torch_compile`) whose
`forward` has the replaced layer's signature and reads that layer's parameters.

- `RMSNorm`: transformers' `*RMSNorm` (weight, variance_epsilon) on torch.ops.nki.rms_norm;
- `LlamaAttention` / `MixtralAttention`: the attention layer's projections, rotary
  embedding and cache as transformers does, the attention itself on the NKI flash
  attention (`hf_attention.nki_attention_forward`, whatever mask the model built);
- `MixtralSparseMoeBlock`: the router's logits and the fused experts on
  torch.ops.nki.moe_mlp, the experts' [E, 2I, H] / [E, H, I] Parameters passed as
  transposed views: at decode sizes the decode kernel reads that storage (DMA
  transposes), no per-call copy.

All four differentiate (NKI backward kernels) and compile (`torch.compile`, fullgraph),
so each declares both.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

import nki_kernels  # noqa: F401  (registers torch.ops.nki.*)
from nki_kernels.integrations import hf_attention


def _attention(
    module: Any,
    hidden_states: Tensor,
    position_embeddings: Any,
    attention_mask: Any,
    cache: Any,
    sliding_window: int | None,
    kwargs: dict[str, Any],
) -> tuple[Tensor, None]:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    cache = cache if cache is not None else kwargs.pop("past_key_values", None)
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, module.head_dim)
    q = module.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    k = module.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    v = module.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if cache is not None:
        k, v = cache.update(k, v, module.layer_idx, kwargs=kwargs)
    if sliding_window is not None:
        kwargs["sliding_window"] = sliding_window
    out, _ = hf_attention.nki_attention_forward(
        module, q, k, v, attention_mask,
        dropout=0.0 if not module.training else module.attention_dropout,
        scaling=module.scaling, **kwargs,
    )  # fmt: skip
    return module.o_proj(out.reshape(*input_shape, -1).contiguous()), None


class RMSNorm(nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: Tensor) -> Tensor:
        x, w = hidden_states, self.weight
        flat = x.reshape(-1, x.shape[-1])
        w = w if w.dtype == x.dtype else w.to(x.dtype)
        return torch.ops.nki.rms_norm(flat, w, float(self.variance_epsilon)).reshape(x.shape)


class LlamaAttention(nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: Tensor, position_embeddings: Any = None,
                attention_mask: Any = None, cache: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        return _attention(self, hidden_states, position_embeddings, attention_mask, cache,
                          None, kwargs)  # fmt: skip


class MixtralAttention(nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: Tensor, position_embeddings: Any = None,
                attention_mask: Any = None, cache: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        window = getattr(self.config, "sliding_window", None)
        return _attention(self, hidden_states, position_embeddings, attention_mask, cache,
                          window, kwargs)  # fmt: skip


class MixtralSparseMoeBlock(nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: Tensor) -> Tensor:
        b, s, h = hidden_states.shape
        if self.training and self.jitter_noise > 0:
            hidden_states = hidden_states * torch.empty_like(hidden_states).uniform_(
                1.0 - self.jitter_noise, 1.0 + self.jitter_noise
            )
        tokens = hidden_states.reshape(-1, h)
        logits = self.gate(tokens)[0]
        out = torch.ops.nki.moe_mlp(
            tokens, logits,
            self.experts.gate_up_proj.transpose(1, 2), self.experts.down_proj.transpose(1, 2),
            top_k=int(self.top_k), renormalize=True,
        )  # fmt: skip
        return out.reshape(b, s, h)
