"""Put the NKI ops into existing models with one call.

    report = nki_kernels.patch(model)     # returns what it replaced
    ...
    nki_kernels.unpatch(model)            # everything back

A Hugging Face transformers model (Llama, Mistral, Qwen2 / Qwen3, Mixtral, Qwen-MoE) gets
its norms, attention ("nki" attention implementation with its mask function) and MoE
blocks replaced (`hf.py`); any other `nn.Module` gets torch's norm modules swapped by
class (`swap.py`). Parameters are shared, never copied.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .hf import (
    SUPPORTED_MODEL_TYPES,
    HFSparseMoeBlock,
    PatchReport,
    is_hf_model,
    patch_hf,
    unpatch_hf,
)
from .swap import DEFAULT_SWAPS, swap_modules


def patch(model: nn.Module, **options: Any) -> PatchReport:
    """Run `model` on the NKI ops (in place); returns what was replaced.

    transformers models: `attention`, `norms`, `moe` (each True by default) choose what to
    patch. Other modules: `mapping` {class: factory(old) -> new} (default: torch's
    RMSNorm / LayerNorm to `nki_kernels.nn`'s)."""
    if is_hf_model(model):
        return patch_hf(model, **options)
    return swap_modules(model, **options)


def unpatch(model: nn.Module) -> PatchReport:
    """Undo `patch(model)`; returns what was restored."""
    if is_hf_model(model):
        return unpatch_hf(model)
    state = getattr(model, "_nki_patch", None)
    if state is None:
        raise RuntimeError("model: not patched by nki_kernels.patch")
    from .hf import Replacement, _set_child

    report = PatchReport()
    for path, old in reversed(state[0]):
        new = _set_child(model, path, old)
        report.replaced.append(Replacement(path, type(new).__qualname__, type(old).__qualname__))
    model._nki_patch = None  # type: ignore[assignment]
    return report


__all__ = [
    "DEFAULT_SWAPS",
    "SUPPORTED_MODEL_TYPES",
    "HFSparseMoeBlock",
    "PatchReport",
    "patch",
    "swap_modules",
    "unpatch",
]
