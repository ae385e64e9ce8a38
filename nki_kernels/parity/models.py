"""Tiny random-init Hugging Face models (no download): the harness's built-in model
factories and the integration tests' fixtures.

Each has 2 layers, hidden 64, 4 query / 2 key-value heads (GQA), head_dim 16, a
vocabulary of 128; the MoE ones have 4 experts, top-2. Sizes are odd where the kernels
care (intermediate 96, not a power of two) and small enough for CI on 2 cores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

VOCAB = 128
_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "attn_implementation": "sdpa",
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
_MOE: dict[str, Any] = {"num_experts_per_tok": 2}

# model_type -> (config class name, model class name, extra config)
_ZOO: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 8}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, **_MOE}),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        {
            "num_experts": 4,
            "moe_intermediate_size": 48,
            "shared_expert_intermediate_size": 80,
            **_MOE,
        },
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            "num_experts": 4,
            "moe_intermediate_size": 48,
            "head_dim": 16,
            "norm_topk_prob": True,
            **_MOE,
        },
    ),
}

MODEL_TYPES = tuple(_ZOO)


def tiny_model(
    model_type: str, *, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any
) -> nn.Module:
    """A tiny random-init transformers causal LM of `model_type` (one of MODEL_TYPES)."""
    try:
        import transformers
    except ImportError as exc:
        msg = "tiny_model needs transformers: pip install 'nki-kernels[hf]'"
        raise ImportError(msg, name="transformers") from exc

    if model_type not in _ZOO:
        raise ValueError(f"model_type: expected one of {MODEL_TYPES}; got {model_type!r}")
    config_name, model_name, extra = _ZOO[model_type]
    config = getattr(transformers, config_name)(**{**_COMMON, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config)
    return model.to(dtype).eval()


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The built-in dense model factory (`nki-kernels parity --model tiny-llama`)."""
    return tiny_model("llama", seed=seed, dtype=dtype)


def tiny_mixtral(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The built-in MoE model factory (`nki-kernels parity --model tiny-mixtral`)."""
    return tiny_model("mixtral", seed=seed, dtype=dtype)


BUILTIN: dict[str, Callable[..., nn.Module]] = {
    "tiny-llama": tiny_llama,
    "tiny-mixtral": tiny_mixtral,
}


def special_factory(spec: str) -> Callable[..., nn.Module] | None:
    """A factory for a TorchTitan config name (`llama3_debugmodel`, optionally
    `@<layers>` for its first blocks only) or a kernelized transformers model
    (`kernels:tiny-llama`); None for other specs."""
    name, _, layers = spec.partition("@")
    from . import titan

    if titan.parse(name) is not None:
        return titan.titan_factory(name, layers=int(layers) if layers else None)
    if name.startswith("kernels:"):
        return kernels_factory(name.removeprefix("kernels:"))
    return None


def kernels_factory(name: str) -> Callable[..., nn.Module]:
    """A built-in tiny model (`tiny-llama`, `tiny-mixtral`) whose NKI path is
    `kernels.kernelize` from the local layer repository (`integrations.hf_kernels`,
    device "cpu", Mode.TRAINING) instead of `nki_kernels.patch`."""
    if name not in BUILTIN:
        raise ValueError(f"model: expected kernels:<one of {', '.join(BUILTIN)}>; got {name!r}")
    base = BUILTIN[name]

    def factory(
        seed: int = 0, dtype: torch.dtype = torch.float32, nki: bool = False, alternative=False
    ) -> nn.Module:
        from ..integrations import hf_kernels
        from .harness import _alternative_impl

        model = base(seed=seed, dtype=dtype)
        if alternative:
            return _alternative_impl(model)
        if nki:
            hf_kernels.kernelize_model(model, device="cpu")
            model.nki_replaced = hf_kernels.kernelized(model)  # type: ignore[assignment]
        return model

    factory.builds_nki = True  # type: ignore[attr-defined]
    return factory


__all__ = [
    "BUILTIN",
    "MODEL_TYPES",
    "VOCAB",
    "kernels_factory",
    "special_factory",
    "tiny_llama",
    "tiny_mixtral",
    "tiny_model",
]
