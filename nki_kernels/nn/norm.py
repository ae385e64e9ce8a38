"""`RMSNorm` and `LayerNorm`: drop-in replacements for `torch.nn.RMSNorm` / `torch.nn.LayerNorm`.

Same constructor arguments, parameters (`weight`, `bias`) and state_dict keys as the
torch modules, so checkpoints load either way; the forward runs `torch.ops.nki.rms_norm`
/ `torch.ops.nki.layer_norm` (NKI kernels, NKI backward). A multi-dim `normalized_shape`
normalizes over the flattened trailing dims, exactly as torch does. Parameters in a
different dtype than the input (e.g. fp32 master weights with bf16 activations) are cast
to the input's dtype for the kernel; their gradients flow back in their own dtype.
An input without rows (a zero-size leading dim) gives an empty output, as the torch
modules do (torch's own function computes it: the ops take non-empty tensors only).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..ops import norm as _ops  # noqa: F401  (registers torch.ops.nki.* norm ops)
from ..ops.checks import check_tensor

_Shape = int | Sequence[int] | torch.Size


def _shape(normalized_shape: _Shape) -> tuple[int, ...]:
    """The trailing dims as a tuple; a ValueError naming the argument unless it is a
    positive int or a non-empty sequence of them (a str would be split into digits)."""
    given = normalized_shape
    dims: object = (given,) if isinstance(given, numbers.Integral) else given
    if not (
        isinstance(dims, Sequence)
        and not isinstance(dims, str)
        and len(dims) > 0
        and all(
            isinstance(s, numbers.Integral) and not isinstance(s, bool) and int(s) >= 1
            for s in dims
        )
    ):
        raise ValueError(
            f"normalized_shape: expected a positive int or a sequence of them; got {given!r}"
        )
    return tuple(int(s) for s in dims)


def _flatten(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    """x [..., *shape] as [..., prod(shape)] (checking the trailing dims)."""
    k = len(shape)
    if x.dim() < k or tuple(x.shape[-k:]) != shape:
        raise ValueError(
            f"input: expected trailing dims {shape} (normalized_shape); got shape {tuple(x.shape)}"
        )
    return x.reshape(*x.shape[: x.dim() - k], math.prod(shape))


def _eps(eps: float) -> float:
    """A NumPy float (a config read through NumPy) as the Python float the op's schema
    takes, as torch's modules accept it; anything else as given, for the op to check
    (a bool or a str is refused there, naming eps)."""
    if isinstance(eps, numbers.Real) and not isinstance(eps, (bool, int, float)):
        return float(eps)
    return eps


def _param(p: Tensor | None, x: Tensor) -> Tensor | None:
    if p is None:
        return None
    p = p.reshape(-1)
    return p if p.dtype == x.dtype else p.to(x.dtype)


def _shaped(p: Tensor | None, shape: tuple[int, ...]) -> Tensor | None:
    return None if p is None else p.reshape(shape)


def default_rms_eps(dtype: torch.dtype) -> float:
    """The epsilon of `torch.nn.RMSNorm(eps=None)` for inputs of `dtype`: torch's rms_norm
    takes the machine epsilon of the type it computes in (its "opmath" type), which is
    float32 for bfloat16 and float16 inputs -- not the input dtype's own, far larger one
    (`torch.finfo(torch.bfloat16).eps` = 2**-7)."""
    compute = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    return float(torch.finfo(compute).eps)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight over the trailing `normalized_shape` dims.

    `eps=None` uses `default_rms_eps(x.dtype)` at each call, as `torch.nn.RMSNorm` does.
    """

    def __init__(
        self,
        normalized_shape: _Shape,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(
                torch.empty(self.normalized_shape, device=device, dtype=dtype)
            )
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        check_tensor("input", x, nonempty=False)
        eps = _eps(self.eps) if self.eps is not None else default_rms_eps(x.dtype)
        flat, w = _flatten(x, self.normalized_shape), _param(self.weight, x)
        if x.numel() == 0:
            shape = self.normalized_shape
            return F.rms_norm(x, shape, _shaped(w, shape), eps)
        return torch.ops.nki.rms_norm(flat, w, eps).reshape(x.shape)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )


class LayerNorm(nn.Module):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the trailing dims."""

    def __init__(
        self,
        normalized_shape: _Shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            kw = {"device": device, "dtype": dtype}
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, **kw))  # type: ignore[arg-type]
            if bias:
                self.bias = nn.Parameter(torch.empty(self.normalized_shape, **kw))  # type: ignore[arg-type]
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        check_tensor("input", x, nonempty=False)
        flat, w, b = (
            _flatten(x, self.normalized_shape),
            _param(self.weight, x),
            _param(self.bias, x),
        )
        if x.numel() == 0:
            shape = self.normalized_shape
            return F.layer_norm(x, shape, _shaped(w, shape), _shaped(b, shape), self.eps)
        return torch.ops.nki.layer_norm(flat, w, b, _eps(self.eps)).reshape(x.shape)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )


__all__ = ["LayerNorm", "RMSNorm", "default_rms_eps"]
