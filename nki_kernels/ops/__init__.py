"""PyTorch custom ops `torch.ops.nki.*`: the registration helper and the op families.

`registry.define_op` defines an op once (schema from type hints, fake, autograd, device
kernels); `checks` holds the argument checks every op uses. Each op family lives in its
own module here (`norm.py`, `attention.py`, `moe.py`, ...); `load_all()` imports them all,
which registers their ops, and installs their autocast rules (`_autocast.py`).
"""

from __future__ import annotations

import importlib
import pkgutil

from . import _autocast
from .registry import NAMESPACE, SUPPORTED_DEVICES, Example, NkiOp, define_op, registered_ops

_FRAMEWORK_MODULES = {"registry", "checks"}


def load_all() -> dict[str, NkiOp]:
    """Import every op-family module of this package; returns the registered ops."""
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _FRAMEWORK_MODULES and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    ops = registered_ops()
    _autocast.register(ops)
    return ops


__all__ = [
    "NAMESPACE",
    "SUPPORTED_DEVICES",
    "Example",
    "NkiOp",
    "define_op",
    "load_all",
    "registered_ops",
]
