"""`define_op`: what it registers and how it refuses bad definitions."""

from __future__ import annotations

import pytest
import scaled_add_op
import torch
from torch import Tensor

from nki_kernels.ops import define_op, registered_ops
from nki_kernels.ops.registry import _unsupported


def test_the_op_is_registered_once_with_an_inferred_schema() -> None:
    entry = registered_ops()["testonly_scaled_add"]
    assert entry is scaled_add_op.scaled_add and entry.differentiable
    assert entry.qualname == "nki::testonly_scaled_add"
    schema = str(torch.ops.nki.testonly_scaled_add.default._schema)
    # `alpha: float` is declared Scalar (strict options: the validator sees what was passed)
    assert schema == (
        "nki::testonly_scaled_add(Tensor x, Tensor y, Scalar alpha, *, str? bucket_policy=None)"
        " -> Tensor"
    )
    x = torch.ones(2, 3)
    torch.testing.assert_close(entry(x, x, 2.0), torch.full((2, 3), 3.0))


def test_kernels_registered_for_cpu_and_privateuse1() -> None:
    name = "nki::testonly_scaled_add"
    for key in ("CPU", "PrivateUse1", "Meta"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), key


def test_fake_runs_validation() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 8)
        out = torch.ops.nki.testonly_scaled_add(x, x, 1.0)
        assert out.shape == (4, 8)
        with pytest.raises(ValueError, match="y: expected shape"):
            torch.ops.nki.testonly_scaled_add(x, torch.empty(4, 9), 1.0)


def test_other_devices_get_a_clear_error() -> None:
    def impl(x: Tensor) -> Tensor:
        return x

    with pytest.raises(RuntimeError, match="expected tensors on one of cpu, neuron; got meta"):
        _unsupported("op", impl)(torch.empty(1, device="meta"))


def _impl(x: Tensor) -> Tensor:
    return x.clone()


def test_bad_definitions_are_refused() -> None:
    with pytest.raises(ValueError, match="already defined"):
        define_op("testonly_scaled_add", _impl, fake=lambda x: x)
    with pytest.raises(ValueError, match="expected a Python identifier"):
        define_op("bad-name", _impl, fake=lambda x: x)
    with pytest.raises(ValueError, match="backward and setup_context: expected both"):
        define_op("testonly_half", _impl, fake=lambda x: x, backward=lambda ctx, g: g)
    with pytest.raises(ValueError, match=r"kernels: expected keys among .* got \['cuda'\]"):
        define_op("testonly_cuda", _impl, fake=lambda x: x, kernels={"cuda": _impl})
    assert "testonly_half" not in registered_ops()
