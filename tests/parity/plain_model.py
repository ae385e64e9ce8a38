"""A small plain-PyTorch model and data factory for the harness tests (entry points)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Tiny(nn.Module):
    """Linear -> torch RMSNorm -> Linear, mean-squared-error loss."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.norm = nn.RMSNorm(32, eps=1e-6)
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (self.out(self.norm(self.inp(x))) - y).pow(2).mean()


def model(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    return Tiny().to(dtype)


def data(seed: int, step: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed * 7919 + step)
    return {"x": torch.randn(8, 16, generator=g), "y": torch.randn(8, 4, generator=g)}
