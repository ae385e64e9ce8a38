"""Small helpers the tuner families share: NumPy dtypes and arrays, model shapes by
name, and an op's registered config class."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kernel_config import KernelConfig


def np_dtype(name: str) -> Any:
    from ..interp import dtypes

    return dtypes.as_dtype(name)


def to_numpy(t: Any) -> np.ndarray:
    return t.detach().to("cpu").float().numpy()


def by_model(table: Any, name: str) -> Any:
    """A named model of `table`, or explicit dimensions (`shapes.resolve_shape`)."""
    from .shapes import resolve_shape

    return resolve_shape(table, name)


def config_cls(op: str) -> type[KernelConfig]:
    from ..runtime.config_store import config_class_for

    if op == "flash_attention":
        from ..attention import config as _attn  # noqa: F401  (registers the classes)
    if op == "moe_mlp":
        from ..moe import config as _moe  # noqa: F401
    return config_class_for(op)
