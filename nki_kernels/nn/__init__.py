"""`nki_kernels.nn`: torch modules built on the `torch.ops.nki.*` ops."""

from __future__ import annotations

from .moe import MoE
from .norm import LayerNorm, RMSNorm

__all__ = ["LayerNorm", "MoE", "RMSNorm"]
