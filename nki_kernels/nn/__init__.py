"""`nki_kernels.nn`: torch modules built on the `torch.ops.nki.*` ops."""

from __future__ import annotations

from .moe import MoE

__all__ = ["MoE"]
