"""The plain-PyTorch path: swap modules by class, sharing their parameters.

`swap_modules(model, {torch.nn.RMSNorm: factory, ...})` replaces every instance of each
class (exact type, not subclasses) with `factory(old)`; the default table turns
`torch.nn.RMSNorm` / `torch.nn.LayerNorm` into `nki_kernels.nn.RMSNorm` / `LayerNorm`
holding the same weight and bias Parameters, so state_dict keys, optimizers and
checkpoints are unaffected. Attention in plain models: call `nki_kernels.sdpa` (or assign
it to `F.scaled_dot_product_attention`, which is safe: its fallback keeps torch's own).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from ..nn.norm import LayerNorm, RMSNorm
from .hf import PatchReport, Replacement, _set_child

Factory = Callable[[nn.Module], nn.Module]


def _rms(old: Any) -> nn.Module:
    new = RMSNorm(old.normalized_shape, eps=old.eps, elementwise_affine=False)
    new.elementwise_affine = old.elementwise_affine
    new.weight = old.weight
    return new


def _ln(old: Any) -> nn.Module:
    new = LayerNorm(old.normalized_shape, eps=old.eps, elementwise_affine=False)
    new.elementwise_affine = old.elementwise_affine
    new.weight, new.bias = old.weight, old.bias
    return new


DEFAULT_SWAPS: dict[type[nn.Module], Factory] = {nn.RMSNorm: _rms, nn.LayerNorm: _ln}


def swap_modules(
    model: nn.Module, mapping: Mapping[type[nn.Module], Factory] | None = None
) -> PatchReport:
    """Replace every module whose exact class is in `mapping` (default: torch's norms)."""
    if getattr(model, "_nki_patch", None) is not None:
        raise RuntimeError("model: already patched by nki_kernels.patch (unpatch it first)")
    table = dict(DEFAULT_SWAPS if mapping is None else mapping)
    report = PatchReport()
    undo: list[tuple[str, nn.Module]] = []
    for path, m in list(model.named_modules()):
        factory = table.get(type(m))
        if factory is None or not path:
            continue
        new = factory(m)
        undo.append((path, _set_child(model, path, new)))
        report.replaced.append(Replacement(path, type(m).__qualname__, type(new).__qualname__))
    model._nki_patch = (undo, None)  # type: ignore[assignment]
    return report


__all__ = ["DEFAULT_SWAPS", "swap_modules"]
