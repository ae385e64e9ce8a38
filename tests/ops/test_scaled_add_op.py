"""The framework end to end through a test-only op: eager CPU, emulated neuron device,
autograd, nn.Module.to("neuron"), torch.compile, padding to buckets and the compile cache.
"""

from __future__ import annotations

import pytest
import torch
from scaled_add_op import scaled_add_kernel

from nki_kernels.runtime import KERNEL_CACHE, bucket, bucket_id
from nki_kernels.testing.tolerances import assert_close

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)

add = torch.ops.nki.testonly_scaled_add


def reference(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x.float() + alpha * y.float()


def _shape_id(shape: tuple[int, ...]) -> str:
    rows = 1
    for s in shape[:-1]:
        rows *= s
    return "x".join(map(str, shape)) + "-" + bucket_id(rows, prefix="rows")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(5, 40), (1, 7, 130), (300, 33)], ids=_shape_id)
def test_eager_cpu_matches_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    out = add(x, y, -0.75)
    assert out.shape == x.shape and out.dtype == dtype and out.device.type == "cpu"
    assert_close(out, reference(x, y, -0.75))


def test_backward_on_cpu_runs_the_nki_backward() -> None:
    x = torch.randn(3, 50, requires_grad=True)
    y = torch.randn(3, 50, requires_grad=True)
    g = torch.randn(3, 50)
    add(x, y, 0.25).backward(g)
    assert_close(x.grad, g)
    assert_close(y.grad, 0.25 * g)


def test_neuron_device_forward_backward(neuron: str) -> None:
    torch.manual_seed(1)
    x, y, g = torch.randn(9, 20), torch.randn(9, 20), torch.randn(9, 20)
    xn = x.to(neuron).requires_grad_()
    yn = y.to(neuron).requires_grad_()
    out = add(xn, yn, 2.0)
    assert out.device.type == neuron
    out.backward(g.to(neuron))
    assert xn.grad is not None and xn.grad.device.type == neuron
    assert yn.grad is not None and yn.grad.device.type == neuron
    assert_close(out, reference(x, y, 2.0))
    assert_close(yn.grad, 2.0 * g)


class Residual(torch.nn.Module):
    """x + 0.5 * linear(x) with the add done by the NKI op."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return add(x, self.lin(x), 0.5)


def test_module_to_neuron(neuron: str) -> None:
    torch.manual_seed(2)
    cpu = Residual(12)
    dev = Residual(12)
    dev.load_state_dict(cpu.state_dict())
    dev.to(neuron)
    x = torch.randn(4, 3, 12)
    y_dev = dev(x.to(neuron))
    y_dev.square().sum().backward()
    y_cpu = cpu(x)
    y_cpu.square().sum().backward()
    assert_close(y_dev, y_cpu)
    assert dev.lin.weight.grad is not None and dev.lin.weight.grad.device.type == neuron
    assert_close(dev.lin.weight.grad, cpu.lin.weight.grad, tol=None)


def _f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return add(a.sin(), b, 0.5).relu() * 2


@pytest.mark.parametrize(
    ("backend", "device"),
    [("aot_eager", "cpu"), ("inductor", "cpu"), ("aot_eager", "neuron")],
)
def test_torch_compile_fullgraph(backend: str, device: str, request: pytest.FixtureRequest) -> None:
    if device == "neuron":
        request.getfixturevalue("neuron")
    torch._dynamo.reset()
    torch.manual_seed(3)
    x, y = torch.randn(6, 10), torch.randn(6, 10)
    compiled = torch.compile(_f, backend=backend, fullgraph=True)
    a = x.detach().to(device).requires_grad_()
    out = compiled(a, y.to(device))
    out.sum().backward()
    a_ref = x.detach().clone().requires_grad_()
    ref = _f(a_ref, y)
    ref.sum().backward()
    assert out.device.type == device and a.grad is not None and a.grad.device.type == device
    assert_close(out, ref)
    assert_close(a.grad, a_ref.grad)


def test_lengths_inside_one_bucket_compile_once() -> None:
    hidden = 24  # unique to this test, so no other test has compiled these shapes
    lengths = [130, 150, 200, 222, 256]
    assert {bucket(n) for n in lengths} == {256}
    before = KERNEL_CACHE.compiles_for(scaled_add_kernel)
    for i in range(15):
        n = lengths[i % len(lengths)]
        x, y = torch.randn(n, hidden), torch.randn(n, hidden)
        out = add(x, y, 1.5)
        assert out.shape == (n, hidden)
        assert_close(out, reference(x, y, 1.5))
    assert KERNEL_CACHE.compiles_for(scaled_add_kernel) == before + 1
    add(torch.randn(300, hidden), torch.randn(300, hidden), 1.5)  # bucket 512
    assert KERNEL_CACHE.compiles_for(scaled_add_kernel) == before + 2
    shapes = [k.args[0] for k in KERNEL_CACHE.keys() if k.kernel.endswith("scaled_add_kernel")]
    assert ((256, hidden), "float32") in shapes and ((512, hidden), "float32") in shapes


def test_bad_input_names_the_argument_eagerly_and_under_compile() -> None:
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"y: expected shape \(4, 8\); got \(4, 9\)"):
        add(x, torch.randn(4, 9), 1.0)
    with pytest.raises(TypeError, match="x: expected dtype float32, bfloat16, float16; got int64"):
        add(torch.ones(4, 8, dtype=torch.int64), torch.ones(4, 8, dtype=torch.int64), 1.0)
    with pytest.raises(TypeError, match=r"y: expected dtype float32 \(as x\); got bfloat16"):
        add(x, x.bfloat16(), 1.0)
    with pytest.raises(ValueError, match="x: expected a non-empty tensor"):
        add(torch.empty(0, 8), torch.empty(0, 8), 1.0)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: add(a, b, 1.0), backend="aot_eager", fullgraph=True)
    # dynamo reports the fake function's ValueError as a TorchRuntimeError with its message
    with pytest.raises(RuntimeError, match=r"y: expected shape \(4, 8\); got \(4, 9\)"):
        compiled(x, torch.randn(4, 9))
