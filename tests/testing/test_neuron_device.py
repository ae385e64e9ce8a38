"""The emulated neuron device: memory, views, autograd, modules, lifetime, safety."""

from __future__ import annotations

import gc
import importlib.machinery
import importlib.util

import pytest
import torch

from nki_kernels.testing import neuron_device as nd


@pytest.fixture(autouse=True)
def _emulated(neuron: str) -> None:
    del neuron


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_round_trip_keeps_values_and_dtype(dtype: torch.dtype) -> None:
    x = (torch.arange(35) - 17).reshape(5, 7).to(dtype)
    n = x.to("neuron")
    assert n.device.type == "neuron" and n.dtype == dtype
    back = n.cpu()
    assert back.device.type == "cpu"
    torch.testing.assert_close(back, x, rtol=0, atol=0)


def test_arithmetic_runs_on_host_and_stays_on_device() -> None:
    x = torch.randn(4, 6)
    n = x.to("neuron")
    y = (n * 3 - 1).exp().sum(dim=1)
    assert y.device.type == "neuron"
    torch.testing.assert_close(y.cpu(), (x * 3 - 1).exp().sum(dim=1))
    assert n.max().item() == x.max().item()


def test_in_place_writes_through_views_reach_the_base() -> None:
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    n = x.to("neuron")
    n[1].add_(100)  # select
    n.t()[0].fill_(-1)  # transposed view
    n[:, 2:].mul_(2)  # slice
    n.view(12)[11] = 7.0  # flat view, index_put
    expect = x.clone()
    expect[1] += 100
    expect[:, 0] = -1
    expect[:, 2:] *= 2
    expect.view(12)[11] = 7.0
    torch.testing.assert_close(n.cpu(), expect)


def test_views_share_storage_with_the_base() -> None:
    n = torch.zeros(2, 3, device="neuron")
    v = n.t()
    assert v.untyped_storage()._cdata == n.untyped_storage()._cdata
    assert v._base is n
    bits = n.view(torch.int32)
    bits.fill_(0x3F800000)  # bit pattern of 1.0f
    torch.testing.assert_close(n.cpu(), torch.ones(2, 3))


def test_metadata_in_place_ops_change_the_device_tensor() -> None:
    n = torch.zeros(2, 3, device="neuron")
    n.t_()
    assert n.shape == (3, 2) and n.stride() == (1, 3)
    n.unsqueeze_(0)
    assert n.shape == (1, 3, 2)


def test_resize_and_out_arguments() -> None:
    r = torch.ones(3, device="neuron")
    r.resize_(10)
    assert r.shape == (10,)
    torch.testing.assert_close(r.cpu()[:3], torch.ones(3))
    a = torch.randn(3, 4)
    out = torch.empty(0, device="neuron")
    res = torch.add(a.to("neuron"), a.to("neuron"), out=out)
    assert res is out and out.shape == (3, 4)
    torch.testing.assert_close(out.cpu(), 2 * a)


def test_factories_on_the_device() -> None:
    assert torch.arange(5, device="neuron").device.type == "neuron"
    torch.testing.assert_close(torch.full((2,), 3.0, device="neuron").cpu(), torch.full((2,), 3.0))
    torch.testing.assert_close(torch.zeros(2, 2, device="neuron").cpu(), torch.zeros(2, 2))


def test_module_to_neuron_forward_backward_and_step() -> None:
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    dev = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    dev.load_state_dict(ref.state_dict())
    dev.to("neuron")
    for p in dev.parameters():
        assert isinstance(p, torch.nn.Parameter) and p.device.type == "neuron"
    x = torch.randn(4, 6)
    ref(x).square().sum().backward()
    dev(x.to("neuron")).square().sum().backward()
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        assert p_dev.grad is not None and p_dev.grad.device.type == "neuron"
        torch.testing.assert_close(p_dev.grad.cpu(), p_ref.grad)
    torch.optim.SGD(dev.parameters(), lr=0.1).step()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.detach().cpu(), p_ref.detach())


def test_host_memory_is_freed_when_storages_die() -> None:
    gc.collect()
    before = nd.live_storages()
    tensors = [torch.randn(1000).to("neuron") for _ in range(8)]
    views = [t[:10] for t in tensors]
    assert nd.live_storages() >= before + 8
    del tensors
    gc.collect()
    assert nd.live_storages() >= before + 8  # the views still hold the storages
    del views
    gc.collect()
    assert nd.live_storages() <= before


def test_host_view_aliases_device_memory() -> None:
    n = torch.zeros(3, device="neuron")
    nd.host_view(n)[1] = 5.0
    torch.testing.assert_close(n.cpu(), torch.tensor([0.0, 5.0, 0.0]))
    with pytest.raises(ValueError, match="expected a neuron tensor"):
        nd.host_view(torch.zeros(1))


def test_install_is_idempotent() -> None:
    assert nd.install() is True
    assert nd.is_installed()
    assert torch.neuron.emulated is True


def test_never_renames_over_a_real_neuron_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nd, "_installed", False)
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "neuron")
    assert nd.real_neuron_backend_present()
    assert nd.install() is False


def test_never_renames_when_torch_neuronx_is_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nd, "_installed", False)
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "privateuseone")
    real_find_spec = importlib.util.find_spec

    def fake_find_spec(name: str, *args: object) -> object:
        if name == "torch_neuronx":
            return importlib.machinery.ModuleSpec("torch_neuronx", None)
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", fake_find_spec)
    assert nd.install() is False


def test_refuses_a_privateuse1_claimed_by_another_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nd, "_installed", False)
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "npu")
    with pytest.raises(RuntimeError, match="already registered as 'npu'"):
        nd.install()


FRESH_PROCESS = """
import sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {ops_dir!r})
import torch
import scaled_add_op  # defines ops before the device exists
from nki_kernels.testing import neuron_device as nd
{before}
try:
    ok = nd.install()
except RuntimeError as e:
    print("ERROR", e)
    raise SystemExit(0)
x = torch.randn(3, 5).to("neuron").requires_grad_()
out = torch.ops.nki.testonly_scaled_add(x, x, 2.0)
out.sum().backward()
print("OK", ok, out.device, x.grad.device, float(x.grad.cpu().sum()))
"""


def _fresh(before: str) -> str:
    import subprocess
    import sys
    from pathlib import Path

    ops_dir = str(Path(__file__).resolve().parent.parent / "ops")
    code = FRESH_PROCESS.format(ops_dir=ops_dir, before=before)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip().splitlines()[-1]


def test_fresh_process_ops_defined_before_install_dispatch_to_neuron() -> None:
    # 3x5 ones grads, each 1 + 2 = 3 -> 45
    assert _fresh("") == "OK True neuron:0 neuron:0 45.0"


def test_fresh_process_late_install_is_reported() -> None:
    line = _fresh("torch.ones(1, requires_grad=True).sum().backward()")
    assert line.startswith("ERROR install(): the autograd engine started before")


LATE_INSTALL = """
import warnings
warnings.simplefilter("ignore")
import torch
torch.ones(1, requires_grad=True).sum().backward()  # the autograd engine starts
from nki_kernels.testing import neuron_device as nd
for attempt in ("first", "second"):
    try:
        nd.install()
        print(attempt, "installed")
    except RuntimeError as e:
        print(attempt, "ERROR", str(e)[:40])
try:
    w = torch.ones(2, device="neuron", requires_grad=True)
    (w * 3).sum().backward()
    print("used")
except RuntimeError as e:
    print("use ERROR", str(e)[:60])
"""


def test_fresh_process_late_install_stays_unusable_with_a_clear_error() -> None:
    """After a late install() (issue 15, case 8) a retry raises the same error and any
    neuron tensor raises it too, instead of PyTorch's internal assert in backward."""
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-c", LATE_INSTALL], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("first ERROR install(): the autograd engine"), lines
    assert lines[1].startswith("second ERROR install(): the autograd engine"), lines
    assert lines[2].startswith("use ERROR neuron device unusable: install()"), lines
