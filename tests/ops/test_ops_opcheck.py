"""Meta-test: every op defined through `define_op` has examples and passes opcheck.

Covers the library's op families (`nki_kernels.ops.load_all()`) and the test-only ops.
"""

from __future__ import annotations

from typing import Any

import pytest
import scaled_add_op  # noqa: F401  (registers the test-only ops)
import torch

from nki_kernels.ops import load_all, registered_ops

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)

load_all()
OPS = registered_ops()

# opcheck's autograd-registration check only supports CPU/CUDA/XPU tensors.
DEVICE_UTILS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


def _examples(name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    op = OPS[name]
    assert op.examples is not None, f"torch.ops.nki.{name}: define_op(examples=...) is required"
    examples = list(op.examples())
    assert examples, f"torch.ops.nki.{name}: examples() returned nothing"
    return examples


@pytest.mark.parametrize("name", sorted(OPS))
def test_opcheck_cpu(name: str) -> None:
    for args, kwargs in _examples(name):
        torch.library.opcheck(OPS[name].op.default, args, kwargs)


def _to(x: Any, device: str) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().to(device).requires_grad_(x.requires_grad)
    return x


@pytest.mark.parametrize("name", sorted(OPS))
def test_opcheck_neuron(name: str, neuron: str) -> None:
    for args, kwargs in _examples(name):
        args = tuple(_to(a, neuron) for a in args)
        kwargs = {k: _to(v, neuron) for k, v in kwargs.items()}
        torch.library.opcheck(OPS[name].op.default, args, kwargs, test_utils=DEVICE_UTILS)
