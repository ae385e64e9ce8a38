"""The real-hardware path: the one module that touches TorchNeuron and the real `nki`.

Nothing here can run on the machines this project is built on (no Trainium, no Neuron
pip repository). It follows the documented calls only, and the test doubles in
`nki_kernels.testing.torch_neuronx_standin` behave as those documents say, so that CI
runs every call made here (at LNC 1 and 2, eager and under `torch.compile`):

* `is_real_neuron()` -- a `neuron` device registered by TorchNeuron (not the emulated one
  from `nki_kernels.testing.neuron_device`, whose `torch.neuron` says `emulated = True`)
  and the real `nki` behind the `nki_kernels.nki` seam.
* `launcher(kernel, lnc)` -- what runs `kernel` on neuron tensors: `kernel[lnc]`, the
  documented direct call (`nki.jit`: "The LNC ... degree can be set at the callsite
  using bracket syntax: kernel[lnc](args)"; TorchNeuron `torch/guides/how-to-work-with-nki`:
  a kernel called with neuron tensors is handled by torch-neuronx -- eager compiles once
  per shapes, dtypes and non-tensor values, and "inside torch.compile(backend="neuron")
  the kernel call becomes one node in the captured graph"). The kernel cache creates it
  once per specialization (`KernelCache.wraps` counts them).

  Why not `torch_neuronx.wrap_nki(kernel)[lnc]`: in the pre-release source
  (`torch_neuronx/nki_hop.py`) `wrap_nki` reads `kernel.sign`, which the NKI 0.6 `Kernel`
  object does not have, registers a new kernel entry per call, and its `__getitem__`
  does `tuple(map(int, grid))`, so an int grid raises. The direct call has none of the
  three problems.
* `call(handle, *args, lnc=, **statics)` -- runs a launcher made by `launcher`.
* `simulate(kernel, *args, lnc=, **kwargs)` -- CPU tensors when the seam is the real
  `nki`: the official simulator, `nki.simulate(kernel[lnc])(numpy arrays)` (the
  `nki.simulate` docstring's LNC2 form).

Under `torch.compile` the op body runs on FakeTensors (TorchNeuron's `nki_op` registers
the body itself as the fake, see `ops/registry.py`), so nothing here reads tensor data.
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


def launcher(kernel: Any, lnc: int) -> Any:
    """`kernel[lnc]`: the documented direct call at `lnc` logical cores (made once per
    specialization by the kernel cache)."""
    return kernel[lnc]


def call(handle: Any, *args: Any, target: Target | None = None, lnc: int = 1, **kwargs: Any) -> Any:
    """Run a launcher from `launcher()` on neuron-device tensors."""
    del target, lnc  # the device is the target; the launcher carries the LNC
    return handle(*args, **kwargs)


def simulate(
    kernel: Any, *args: Any, target: Target | None = None, lnc: int = 1, **kwargs: Any
) -> Any:
    """Run `kernel` on CPU tensors with the official simulator (`nki.simulate`)."""
    import numpy as np
    import torch

    from .. import nki as seam
    from .host_array import host_numpy

    del target

    def to_np(a: Any) -> Any:
        if not isinstance(a, torch.Tensor):
            return a
        if a.dtype == torch.bfloat16:
            import ml_dtypes

            return host_numpy(a.view(torch.int16)).view(ml_dtypes.bfloat16)
        return host_numpy(a)

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


__all__ = ["call", "is_real_neuron", "launcher", "simulate"]
