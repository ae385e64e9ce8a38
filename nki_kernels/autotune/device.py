"""Device launchers for `HardwareMeasurer`: run one config of a kernel on a neuron device.

Kept thin on purpose (there is no device where this project is built): seeded inputs are
copied to the `neuron` device once, and the returned callable launches the kernel through
the runtime (`runtime.launch`, which compiles it with `nki.jit` via TorchNeuron on a real
device and caches the compiled kernel) and waits for it -- `torch.neuron.synchronize()`
when TorchNeuron provides it, else by reading one output element back. On the emulated
neuron device of the tests the same path runs the interpreter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..kernel_config import KernelConfig
from ..targets import Target

DEVICE = "neuron"


def to_device(a: np.ndarray, device: str = DEVICE) -> Any:
    """A torch tensor on `device` holding `a` (ml_dtypes bfloat16 arrays included)."""
    import torch

    from ..interp import dtypes

    if a.dtype == dtypes.bfloat16:
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16).to(device)
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def _first_tensor(out: Any) -> Any:
    if isinstance(out, tuple | list):
        for o in out:
            t = _first_tensor(o)
            if t is not None:
                return t
        return None
    return out if hasattr(out, "device") else None


def device_runner(
    kernel: Any,
    args: Sequence[Any],
    config: KernelConfig,
    target: Target,
    device: str = DEVICE,
) -> Callable[[], None]:
    """A callable that runs `kernel(*args, **config)` once on `device` and waits for it.

    NumPy arrays in `args` are copied to the device now; other values pass through as
    specialization-time arguments.
    """
    import torch

    from ..runtime import launch

    moved = tuple(to_device(a, device) if isinstance(a, np.ndarray) else a for a in args)
    sync = getattr(getattr(torch, "neuron", None), "synchronize", None)

    def run() -> None:
        out = launch(kernel, *moved, config=config, target=target)
        if callable(sync):
            sync()
        else:
            t = _first_tensor(out)
            if t is not None:
                t.reshape(-1)[:1].cpu()

    return run
