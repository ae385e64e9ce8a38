"""Argument checks shared by every op: each error names the argument, expected and got.

They read only metadata (dtype, shape, device), so they run unchanged on FakeTensors
inside an op's fake function (`define_op(validate=...)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DEVICE_TYPES = ("cpu", "neuron")


def _names(dtypes: Sequence[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(
    arg: str,
    t: Any,
    *,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    min_dim: int = 1,
    nonempty: bool = True,
) -> torch.Tensor:
    """`t` is a tensor of an allowed dtype with at least `min_dim` dims on a supported device."""
    check_is_tensor(**{arg: t})
    if t.dtype not in dtypes:
        raise TypeError(f"{arg}: expected dtype {_names(dtypes)}; got {_names([t.dtype])}")
    if t.device.type not in DEVICE_TYPES and t.device.type != "meta":
        raise ValueError(f"{arg}: expected a tensor on {' or '.join(DEVICE_TYPES)}; got {t.device}")
    if t.dim() < min_dim:
        raise ValueError(f"{arg}: expected at least {min_dim} dim(s); got shape {tuple(t.shape)}")
    if nonempty and t.numel() == 0:
        raise ValueError(f"{arg}: expected a non-empty tensor; got shape {tuple(t.shape)}")
    return t


def check_is_tensor(**named: Any) -> None:
    """Each named value is a tensor: for Python entry points, which would otherwise reach
    the op's schema check (a RuntimeError) or fail inside their own glue."""
    for arg, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{arg}: expected a tensor; got {type(t).__name__}")


def check_shape(arg: str, t: torch.Tensor, expected: Sequence[int]) -> None:
    """`t.shape == expected`."""
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{arg}: expected shape {tuple(expected)}; got {tuple(t.shape)}")


def check_same(arg: str, t: torch.Tensor, ref_arg: str, ref: torch.Tensor) -> None:
    """`t` has the device and dtype of `ref`."""
    if t.device != ref.device:
        raise ValueError(f"{arg}: expected device {ref.device} (as {ref_arg}); got {t.device}")
    if t.dtype != ref.dtype:
        raise TypeError(
            f"{arg}: expected dtype {_names([ref.dtype])} (as {ref_arg}); got {_names([t.dtype])}"
        )


def check_positive(arg: str, value: Any) -> None:
    """`value` is a real number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{arg}: expected a number; got {type(value).__name__}")
    if not value > 0:
        raise ValueError(f"{arg}: expected a number > 0; got {value}")


__all__ = [
    "DEVICE_TYPES",
    "FLOAT_DTYPES",
    "check_is_tensor",
    "check_positive",
    "check_same",
    "check_shape",
    "check_tensor",
]
