"""The real-hardware path (`runtime.neuron_device`), exercised with stand-ins for
TorchNeuron and the Neuron `nki` package: when it is chosen, and what it calls."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import ml_dtypes
import numpy as np
import pytest
import torch

from nki_kernels import nki as seam
from nki_kernels.runtime import neuron_device


def test_the_emulated_device_is_not_real_neuron(neuron: str) -> None:
    assert torch.neuron.emulated is True
    assert not neuron_device.is_real_neuron()


@pytest.fixture
def real_neuron(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A non-emulated torch.neuron, the real nki behind the seam and torch_neuronx."""
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "neuron")
    monkeypatch.setattr(torch, "neuron", types.SimpleNamespace(), raising=False)
    monkeypatch.setattr(seam, "BACKEND", "neuron")
    tnx = types.ModuleType("torch_neuronx")
    tnx.__spec__ = importlib.machinery.ModuleSpec("torch_neuronx", None)
    monkeypatch.setitem(sys.modules, "torch_neuronx", tnx)
    return tnx


def test_real_neuron_needs_the_device_the_real_nki_and_torch_neuronx(
    real_neuron: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert neuron_device.is_real_neuron()
    monkeypatch.setattr(seam, "BACKEND", "interpreter")
    assert not neuron_device.is_real_neuron()


def test_call_goes_through_wrap_nki_with_the_lnc(real_neuron: types.ModuleType) -> None:
    calls = []

    class Wrapped:
        def __init__(self, lnc: int = 1) -> None:
            self.lnc = lnc

        def __getitem__(self, lnc: int) -> Wrapped:
            return Wrapped(lnc)

        def __call__(self, *args: object, **kwargs: object) -> str:
            calls.append((self.lnc, args, kwargs))
            return "out"

    real_neuron.wrap_nki = lambda kernel: Wrapped()  # type: ignore[attr-defined]
    assert neuron_device.call("kernel", 1, 2, lnc=2, eps=0.5) == "out"
    assert neuron_device.call("kernel", 3) == "out"
    assert calls == [(2, (1, 2), {"eps": 0.5}), (1, (3,), {})]


def test_simulate_passes_numpy_arrays_and_returns_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def simulate(kernel: object):  # the official simulator: nki.simulate(kernel)(*arrays)
        def run(*arrays: object, **kwargs: object) -> tuple[np.ndarray, np.ndarray]:
            seen["kernel"], seen["arrays"], seen["kwargs"] = kernel, arrays, kwargs
            return arrays[0] * 2, arrays[1]

        return run

    monkeypatch.setattr(seam, "nki", types.SimpleNamespace(simulate=simulate))
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    b = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    out_x, out_b = neuron_device.simulate("kernel", x, b, 7, flag=True)
    assert seen["kernel"] == "kernel" and seen["kwargs"] == {"flag": True}
    arrays = seen["arrays"]
    assert isinstance(arrays[0], np.ndarray) and arrays[1].dtype == ml_dtypes.bfloat16
    assert arrays[2] == 7
    torch.testing.assert_close(out_x, x * 2)
    assert out_b.dtype == torch.bfloat16
    torch.testing.assert_close(out_b, b)
