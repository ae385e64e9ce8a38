"""Pad a dynamic dimension up to its bucket before a kernel call, slice it back after.

Padding is done with torch ops on the tensor's own device (CPU, emulated or real neuron),
so the kernel only ever sees bucket shapes. Padded entries are zeros unless the op asks
for another value; each op makes the padding harmless (norms drop padded rows, attention
masks padded keys, MoE routes padded tokens nowhere).
"""

from __future__ import annotations

import torch

from .buckets import BucketPolicy, bucket


def _dim(x: torch.Tensor, dim: int, arg: str) -> int:
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"{arg}: expected a dim in [{-x.dim()}, {x.dim()}); got {dim}")
    return dim % x.dim()


def pad_dim(x: torch.Tensor, dim: int, size: int, value: float = 0.0) -> torch.Tensor:
    """`x` with dimension `dim` padded at the end up to `size` (x itself if already there)."""
    d = _dim(x, dim, "dim")
    n = x.shape[d]
    if size < n:
        raise ValueError(f"size: expected >= x.shape[{d}] = {n}; got {size}")
    if size == n:
        return x
    fill_shape = list(x.shape)
    fill_shape[d] = size - n
    fill = torch.full(fill_shape, value, dtype=x.dtype, device=x.device)
    return torch.cat([x, fill], dim=d)


def pad_to_bucket(
    x: torch.Tensor, dim: int = 0, policy: BucketPolicy | None = None, value: float = 0.0
) -> tuple[torch.Tensor, int]:
    """Pad `x` along `dim` to `bucket(x.shape[dim], policy)` (default: the current policy,
    `runtime.buckets.current_policy()`); returns (padded, original size)."""
    d = _dim(x, dim, "dim")
    n = x.shape[d]
    return pad_dim(x, d, bucket(n, policy), value), n


def unpad(y: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    """The first `n` entries of `y` along `dim` (a view; `y` itself when nothing to drop)."""
    d = _dim(y, dim, "dim")
    if n > y.shape[d]:
        raise ValueError(f"n: expected <= y.shape[{d}] = {y.shape[d]}; got {n}")
    if n == y.shape[d]:
        return y
    return y.narrow(d, 0, n)


__all__ = ["pad_dim", "pad_to_bucket", "unpad"]
