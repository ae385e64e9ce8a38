"""Reading a torch tensor's values as a NumPy array without touching its storage.

`Tensor.numpy()` (and `np.asarray(tensor)`) shares the tensor's memory and, to keep the
array valid, marks the storage as *not resizable*, for good. Frameworks that free and
re-allocate storage in place then fail on any tensor our host code has read: FSDP2
frees each unsharded parameter after its layer's forward with `storage.resize_(0)`
("Trying to resize storage that is not resizable"). So host code reads a private copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def host_numpy(t: Any) -> np.ndarray:
    """The values of torch tensor `t` (any device, any layout) as a fresh, contiguous
    NumPy array that owns its memory; `t`'s storage is left as it was."""
    return t.detach().cpu().clone(memory_format=_contiguous()).numpy()  # type: ignore[no-any-return]


def _contiguous() -> Any:
    import torch

    return torch.contiguous_format


__all__ = ["host_numpy"]
