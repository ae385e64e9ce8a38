"""fp32 PyTorch references of the fused-norm kernels, written for clarity, not speed.

Inputs of any float dtype are upcast to fp32, every statistic and every product is
computed in fp32, and results are returned in fp32 (callers cast when they compare a
low-precision kernel against them). Shapes follow the kernels: `x` is [N, H] (or any
[..., H]); `weight` and `bias` are [H] or None; per-row statistics are [N] (or [...]).

Backward formulas (per row, H = hidden size, g = dy * weight):
- RMSNorm: xhat = x * rstd, dx = rstd * (g - xhat * mean(g * xhat)), dweight = sum_rows(dy * xhat).
- LayerNorm: xhat = (x - mean) * rstd,
  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
  dweight = sum_rows(dy * xhat), dbias = sum_rows(dy).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _f32(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.to(torch.float32)


def rms_norm_ref(x: Tensor, weight: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    """y = x / sqrt(mean(x^2) + eps) * weight; returns (y, rstd), both fp32."""
    xf = x.to(torch.float32)
    rstd = torch.rsqrt(xf.square().mean(dim=-1) + eps)
    y = xf * rstd.unsqueeze(-1)
    w = _f32(weight)
    if w is not None:
        y = y * w
    return y, rstd


def rms_norm_bwd_ref(
    dy: Tensor, x: Tensor, weight: Tensor | None, eps: float
) -> tuple[Tensor, Tensor | None]:
    """(dx, dweight) of `rms_norm_ref` in fp32, by the closed form above."""
    xf, dyf = x.to(torch.float32), dy.to(torch.float32)
    _, rstd = rms_norm_ref(xf, None, eps)
    rstd = rstd.unsqueeze(-1)
    xhat = xf * rstd
    w = _f32(weight)
    g = dyf * w if w is not None else dyf
    dx = rstd * (g - xhat * (g * xhat).mean(dim=-1, keepdim=True))
    dw = (dyf * xhat).reshape(-1, x.shape[-1]).sum(dim=0) if w is not None else None
    return dx, dw


def add_rms_norm_ref(
    x: Tensor, residual: Tensor, weight: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """h = x + residual rounded to x.dtype (the new residual stream), y = rms_norm(h).

    Returns (y fp32, h in x.dtype, rstd fp32): the kernel normalizes the rounded h it
    writes back, exactly like the unfused `h = x + residual; y = rms_norm(h)`.
    """
    h = (x.to(torch.float32) + residual.to(torch.float32)).to(x.dtype)
    y, rstd = rms_norm_ref(h, weight, eps)
    return y, h, rstd


def layer_norm_ref(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """y = (x - mean) / sqrt(var + eps) * weight + bias (population variance).

    Returns (y, mean, rstd), all fp32.
    """
    xf = x.to(torch.float32)
    mean = xf.mean(dim=-1)
    var = (xf - mean.unsqueeze(-1)).square().mean(dim=-1)
    rstd = torch.rsqrt(var + eps)
    y = (xf - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    w, b = _f32(weight), _f32(bias)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y, mean, rstd


def layer_norm_bwd_ref(
    dy: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(dx, dweight, dbias) of `layer_norm_ref` in fp32, by the closed form above."""
    xf, dyf = x.to(torch.float32), dy.to(torch.float32)
    _, mean, rstd = layer_norm_ref(xf, None, None, eps)
    rstd = rstd.unsqueeze(-1)
    xhat = (xf - mean.unsqueeze(-1)) * rstd
    w = _f32(weight)
    g = dyf * w if w is not None else dyf
    dx = rstd * (g - g.mean(dim=-1, keepdim=True) - xhat * (g * xhat).mean(dim=-1, keepdim=True))
    h = x.shape[-1]
    dw = (dyf * xhat).reshape(-1, h).sum(dim=0) if weight is not None else None
    db = dyf.reshape(-1, h).sum(dim=0) if bias is not None else None
    return dx, dw, db
