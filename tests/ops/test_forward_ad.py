"""Forward-mode AD through a `define_op` op is an error naming the op, never a zero tangent.

No op has a forward-mode formula; `torch.library.custom_op` alone would run the kernel
below autograd for a dual input and hand back an output with no tangent (a silent zero
derivative). Every registered op is checked on its first example, through both public
forward-mode APIs.
"""

from __future__ import annotations

from typing import Any

import pytest
import scaled_add_op  # noqa: F401  (registers the test-only ops)
import torch
import torch.autograd.forward_ad as fwAD

from nki_kernels.ops import load_all, registered_ops

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)

load_all()
OPS = registered_ops()


def _first_float(args: tuple[Any, ...]) -> int:
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            return i
    raise AssertionError("no floating-point tensor argument to carry a tangent")


def _example(name: str) -> tuple[tuple[Any, ...], dict[str, Any], int]:
    op = OPS[name]
    assert op.examples is not None
    args, kwargs = next(iter(op.examples()))
    args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    return args, kwargs, _first_float(args)


def _expected(name: str, args: tuple[Any, ...], i: int) -> str:
    arg_name = OPS[name].op.default._schema.arguments[i].name
    return rf"torch\.ops\.nki\.{name}: forward-mode AD .* not supported; argument '{arg_name}'"


@pytest.mark.parametrize("name", sorted(OPS))
def test_jvp_raises_naming_the_op(name: str) -> None:
    args, kwargs, i = _example(name)

    def f(primal: torch.Tensor) -> Any:
        return OPS[name].op(*args[:i], primal, *args[i + 1 :], **kwargs)

    with pytest.raises(RuntimeError, match=_expected(name, args, i)):
        torch.func.jvp(f, (args[i],), (torch.ones_like(args[i]),))


@pytest.mark.parametrize("name", sorted(OPS))
def test_dual_tensor_raises_naming_the_op(name: str) -> None:
    args, kwargs, i = _example(name)
    with fwAD.dual_level():
        dual = fwAD.make_dual(args[i], torch.ones_like(args[i]))
        with pytest.raises(RuntimeError, match=_expected(name, args, i)):
            OPS[name].op(*args[:i], dual, *args[i + 1 :], **kwargs)


def test_tangent_on_a_later_argument_is_named() -> None:
    x, y = torch.randn(3, 8), torch.randn(3, 8)
    with fwAD.dual_level():
        dual = fwAD.make_dual(y, torch.ones_like(y))
        with pytest.raises(RuntimeError, match="argument 'y' carries a tangent"):
            torch.ops.nki.testonly_scaled_add(x, dual, 2.0)


def test_plain_and_reverse_mode_calls_are_unchanged_inside_a_dual_level() -> None:
    x = torch.randn(3, 8, requires_grad=True)
    y = torch.randn(3, 8)
    with fwAD.dual_level():
        out = torch.ops.nki.testonly_scaled_add(x, y, 2.0)
        (gy,) = torch.autograd.grad(out.sum(), [x])
    torch.testing.assert_close(out, x + 2.0 * y)
    torch.testing.assert_close(gy, torch.ones_like(x))


def test_dual_tensor_on_the_neuron_device_raises(neuron: str) -> None:
    x, y = torch.randn(3, 8, device=neuron), torch.randn(3, 8, device=neuron)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.ones_like(x))
        with pytest.raises(RuntimeError, match="testonly_scaled_add: forward-mode AD"):
            torch.ops.nki.testonly_scaled_add(dual, y, 2.0)


@pytest.mark.parametrize("transform", ["grad", "vjp"])
def test_torch_func_reverse_transforms_raise_rather_than_return_zero(transform: str) -> None:
    # torch's own refusal (custom_op's autograd.Function has no setup_context): an error,
    # as the manual says, never a silent zero gradient
    x, y = torch.randn(3, 8), torch.randn(3, 8)

    def f(a: torch.Tensor) -> torch.Tensor:
        return torch.ops.nki.testonly_scaled_add(a, y, 2.0).sum()

    with pytest.raises(RuntimeError, match="setup_context"):
        if transform == "grad":
            torch.func.grad(f)(x)
        else:
            torch.func.vjp(f, x)[1](torch.tensor(1.0))
