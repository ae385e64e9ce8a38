"""`launch` on NumPy arrays, CPU tensors and emulated-neuron tensors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from kernels_for_tests import add_one_in_place, copy_kernel

from nki_kernels.kernel_config import KernelConfig
from nki_kernels.runtime.kernel_cache import KernelCache
from nki_kernels.runtime.launch import launch


def test_numpy_in_numpy_out() -> None:
    x = np.arange(24, dtype=np.float32).reshape(3, 8)
    out = launch(copy_kernel, x, 0.5, cache=KernelCache())
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, x * 0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_cpu_and_neuron(dtype: torch.dtype, neuron: str) -> None:
    x = torch.randn(7, 16).to(dtype)
    for device in ("cpu", neuron):
        out = launch(copy_kernel, x.to(device), 2.0, cache=KernelCache())
        assert out.device.type == device and out.dtype == dtype
        torch.testing.assert_close(out.cpu(), x * 2, rtol=0, atol=0)  # exact: x2 is exact


def test_config_fields_become_kernel_keywords() -> None:
    @dataclasses.dataclass(frozen=True)
    class ScaleConfig(KernelConfig):
        scale: float = 3.0

    out = launch(
        copy_kernel, np.ones((2, 4), np.float32), config=ScaleConfig(), cache=KernelCache()
    )
    np.testing.assert_array_equal(out, np.full((2, 4), 3.0, np.float32))
    with pytest.raises(ValueError, match=r"\['scale'\] given both in config and as keyword"):
        launch(copy_kernel, np.ones((2, 4), np.float32), config=ScaleConfig(), scale=1.0)


def test_mutated_inputs_are_written_back(neuron: str) -> None:
    for device in ("cpu", neuron):
        x = torch.zeros(4, 8, device=device)
        launch(add_one_in_place, x, mutated=(0,), cache=KernelCache())
        assert x.device.type == device
        torch.testing.assert_close(x.cpu(), torch.ones(4, 8))


def test_mixed_devices_and_kinds_are_rejected(neuron: str) -> None:
    with pytest.raises(ValueError, match="expected all tensors on one device"):
        launch(copy_kernel, torch.ones(2, 2), torch.ones(2, 2, device=neuron))
    with pytest.raises(ValueError, match="torch tensors or NumPy arrays, not both"):
        launch(copy_kernel, torch.ones(2, 2), np.ones((2, 2), np.float32))
