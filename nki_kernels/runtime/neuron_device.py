"""The real-hardware path: the one module that touches TorchNeuron and the real `nki`.

Nothing here can run on the machines this project is built on (no Trainium, no Neuron
pip repository), so it is kept to a few lines that follow the documented TorchNeuron
route (Neuron SDK 2.33+, `torch-neuronx` 2.14, see `NKI_API.md` section E):

* `is_real_neuron()` -- a `neuron` device registered by TorchNeuron (not the emulated one
  from `nki_kernels.testing.neuron_device`, whose `torch.neuron` says `emulated = True`)
  and the real `nki` behind the `nki_kernels.nki` seam;
* `call(kernel, *args, lnc=, **kwargs)` -- runs an `nki.jit` kernel on tensors that live
  on the device through `torch_neuronx.wrap_nki(kernel)` (`[lnc]` for LNC > 1), the
  documented way to call a kernel so that a surrounding `torch.compile` trace can capture
  it; TorchNeuron compiles per (shapes, dtypes, non-tensor values) and caches the NEFF;
* `simulate(kernel, *args, **kwargs)` -- CPU tensors when the seam is the real `nki`: the
  official simulator, `nki.simulate(kernel)(numpy arrays)`.

Unverified (no hardware): whether `torch.compile(backend="neuron")` lowers our custom ops
(`torch.ops.nki.*`, whose neuron kernel calls `call()` eagerly) into one NEFF or runs them
as opaque nodes between compiled graphs. `torch_neuronx.nki_op` is the documented way to
make an op traceable into its kernel; moving the op definitions onto it is the first thing
to try on hardware if the opaque route breaks graphs.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ..targets import Target


def is_real_neuron() -> bool:
    """True when `neuron` tensors live on a real device driven by TorchNeuron."""
    import torch

    from .. import nki as seam

    if torch._C._get_privateuse1_backend_name() != "neuron":
        return False
    module = getattr(torch, "neuron", None)
    if module is None or getattr(module, "emulated", False):
        return False
    return seam.BACKEND == "neuron" and importlib.util.find_spec("torch_neuronx") is not None


def call(kernel: Any, *args: Any, target: Target | None = None, lnc: int = 1, **kwargs: Any) -> Any:
    """Run `kernel` on neuron-device tensors through TorchNeuron (`wrap_nki`)."""
    del target  # the device is the target; NEURON_PLATFORM_TARGET_OVERRIDE is read by nki
    from torch_neuronx import wrap_nki  # type: ignore[import-not-found]

    wrapped = wrap_nki(kernel)
    if lnc > 1:
        wrapped = wrapped[lnc]
    return wrapped(*args, **kwargs)


def simulate(
    kernel: Any, *args: Any, target: Target | None = None, lnc: int = 1, **kwargs: Any
) -> Any:
    """Run `kernel` on CPU tensors with the official simulator (`nki.simulate`)."""
    import numpy as np
    import torch

    from .. import nki as seam

    del target

    def to_np(a: Any) -> Any:
        if not isinstance(a, torch.Tensor):
            return a
        if a.dtype == torch.bfloat16:
            import ml_dtypes

            return a.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return a.contiguous().numpy()

    arrays = [to_np(a) for a in args]
    fn = seam.nki.simulate(kernel if lnc == 1 else kernel[lnc])
    out = fn(*arrays, **kwargs)

    def back(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            if x.dtype.name == "bfloat16":
                return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(x)
        if isinstance(x, tuple):
            return tuple(back(v) for v in x)
        return x

    return back(out)


__all__ = ["call", "is_real_neuron", "simulate"]
