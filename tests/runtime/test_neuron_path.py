"""The real-hardware path (`runtime.neuron_device`, `runtime.launch`) against the
TorchNeuron / real-`nki` test doubles (`nki_kernels.testing.torch_neuronx_standin`): when
it is chosen, the documented direct call `kernel[lnc]` made once per specialization, the
runtime's LNC, and the LNC-must-match rule."""

from __future__ import annotations

import types

import ml_dtypes
import numpy as np
import pytest
import torch
from kernels_for_tests import copy_kernel, split_rows_scale

from nki_kernels import nki as seam
from nki_kernels.runtime import lnc as runtime_lnc
from nki_kernels.runtime import neuron_device
from nki_kernels.runtime.kernel_cache import KernelCache
from nki_kernels.runtime.launch import launch
from nki_kernels.testing import torch_neuronx_standin as standin


@pytest.fixture(autouse=True)
def _fresh_lnc() -> object:
    runtime_lnc.set_runtime_lnc(None)
    standin.STATE.reset()
    yield
    runtime_lnc.set_runtime_lnc(None)


def test_the_emulated_device_is_not_real_neuron(neuron: str) -> None:
    assert torch.neuron.emulated is True
    assert not neuron_device.is_real_neuron()


def test_real_device_double_needs_the_device_the_real_nki_and_torch_neuronx(
    neuron: str,
) -> None:
    with standin.real_device():
        assert neuron_device.is_real_neuron()
        seam.BACKEND = "interpreter"  # restored by real_device() on exit
        assert not neuron_device.is_real_neuron()
    assert not neuron_device.is_real_neuron() and seam.BACKEND == "interpreter"


@pytest.mark.parametrize("env", [None, 1, 2])
def test_runtime_lnc_is_the_variable_else_the_target_default(neuron: str, env: int | None) -> None:
    with standin.real_device(lnc=env):
        assert runtime_lnc.runtime_lnc("trn2") == (env or 2)
        assert runtime_lnc.runtime_lnc("trn1") == (env or 1)
    # no Neuron Runtime in this process: one logical core unless the variable says otherwise
    assert runtime_lnc.runtime_lnc("trn2") == 1


def test_the_variable_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runtime_lnc.LNC_ENV_VAR, "4")
    runtime_lnc.set_runtime_lnc(None)
    with pytest.raises(ValueError, match="NEURON_LOGICAL_NC_CONFIG: expected 1 or 2; got 4"):
        runtime_lnc.runtime_lnc()
    with pytest.raises(ValueError, match="lnc: expected 1 or 2; got 3"):
        runtime_lnc.set_runtime_lnc(3)


@pytest.mark.parametrize("lnc", [1, 2])
def test_device_launch_uses_kernel_lnc_once_per_specialization(neuron: str, lnc: int) -> None:
    cache = KernelCache()
    x = torch.randn(100, 64)
    with standin.real_device(lnc=lnc):
        for _ in range(3):
            out = launch(split_rows_scale, x.to(neuron), 2.0, cache=cache)
        launch(split_rows_scale, x[:60].to(neuron), 2.0, cache=cache)
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), x * 2, rtol=0, atol=0)  # x2 is exact
    # two shapes: two specializations, two launchers made, two hits
    assert (cache.compiles, cache.wraps, cache.hits) == (2, 2, 2)
    assert {k.lnc for k in cache.keys()} == {lnc} and {k.backend for k in cache.keys()} == {
        "neuron"
    }
    # what torch-neuronx saw: every call at the runtime's LNC, one compile per shape
    assert standin.STATE.calls_by_lnc == {lnc: 4}
    assert len(standin.STATE.compiles) == 2 and standin.STATE.reuses == 2


def test_device_launch_at_another_lnc_is_refused_before_the_runtime(neuron: str) -> None:
    with standin.real_device(lnc=2):
        with pytest.raises(ValueError, match=r"lnc: expected 2 on this neuron device .*got 1"):
            launch(copy_kernel, torch.ones(4, 4, device=neuron), 1.0, lnc=1, cache=KernelCache())


def test_the_double_raises_on_an_lnc_mismatch_as_documented(neuron: str) -> None:
    with standin.real_device(lnc=1):
        with pytest.raises(RuntimeError, match="LNC mismatch: kernel launched with LNC=2"):
            copy_kernel[2](torch.ones(4, 4, device=neuron), 1.0)


def test_wrap_nki_of_the_prerelease_source_fails_on_nki_06_kernels(neuron: str) -> None:
    """Why the runtime calls `kernel[lnc]` directly: wrap_nki reads `kernel.sign` (not on
    the NKI 0.6 Kernel) and takes the grid as a tuple only."""
    with standin.real_device(lnc=2) as tnx:
        with pytest.raises(AttributeError, match="sign"):
            tnx.wrap_nki(copy_kernel)
        caller = standin._HOPCaller(copy_kernel, ())
        with pytest.raises(TypeError):
            caller[2]
        out = caller[(2,)](torch.ones(4, 4, device=neuron), 3.0)
    torch.testing.assert_close(out.cpu(), torch.full((4, 4), 3.0))


def test_cpu_tensors_at_lnc2_follow_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = KernelCache()
    monkeypatch.setenv(runtime_lnc.LNC_ENV_VAR, "2")
    runtime_lnc.set_runtime_lnc(None)
    x = torch.randn(100, 8)
    torch.testing.assert_close(launch(split_rows_scale, x, 0.5, cache=cache), x * 0.5)
    assert [k.lnc for k in cache.keys()] == [2]


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
