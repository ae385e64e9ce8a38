"""Meta-test: every op defined through `define_op` has examples and passes opcheck.

Covers the library's op families (`nki_kernels.ops.load_all()`) and the test-only ops,
on each op's own examples and on layout variants of them: every floating-point tensor
argument transposed in memory, sliced out of a wider buffer, or broadcast by `expand`
(stride 0). opcheck's fake-tensor test compares the fake's output strides with the
kernel's, which is what `torch.compile` relies on (the layout contract in
`ops/registry.py`).
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


def _transposed(t: torch.Tensor) -> torch.Tensor:
    """Same values, column-major in the last two dims (as `x.view(...).transpose(1, 2)`)."""
    return t.detach().transpose(-1, -2).contiguous().transpose(-1, -2)


def _sliced(t: torch.Tensor) -> torch.Tensor:
    """Same values, a view into a buffer twice as wide (row stride 2x, an offset)."""
    wide = torch.cat([torch.zeros_like(t.detach()), t.detach()], dim=-1)
    return wide[..., t.shape[-1] :]


def _expanded(t: torch.Tensor) -> torch.Tensor:
    """Values broadcast from index 0 along the first dim of size > 1 (stride 0 there)."""
    d = next(i for i, n in enumerate(t.shape) if n > 1)
    return t.detach().narrow(d, 0, 1).expand(t.shape)


LAYOUTS = {"transposed": _transposed, "sliced": _sliced, "expanded": _expanded}


def _applies(layout: str, t: Any) -> bool:
    if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 1):
        return False
    return t.dim() >= 2 or layout != "transposed"


def _relayout(layout: str, x: Any) -> Any:
    if not _applies(layout, x):
        return x
    return LAYOUTS[layout](x).requires_grad_(x.requires_grad)


@pytest.mark.parametrize("name", sorted(OPS))
def test_opcheck_cpu(name: str) -> None:
    for args, kwargs in _examples(name):
        torch.library.opcheck(OPS[name].op.default, args, kwargs)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", sorted(OPS))
def test_opcheck_cpu_layouts(name: str, layout: str) -> None:
    """Non-contiguous inputs: the kernel and its fake agree on the output strides."""
    args, kwargs = _examples(name)[0]
    assert any(_applies(layout, a) for a in [*args, *kwargs.values()]), "no tensor to re-lay"
    # an argument the op writes in place cannot be a broadcast view (torch refuses writes
    # to overlapping memory): it keeps its layout there
    schema = OPS[name].op.default._schema.arguments
    written = {i for i, a in enumerate(schema) if a.name in OPS[name].mutates_args}
    args = tuple(
        a if layout == "expanded" and i in written else _relayout(layout, a)
        for i, a in enumerate(args)
    )
    kwargs = {k: _relayout(layout, v) for k, v in kwargs.items()}
    assert not all(a.is_contiguous() for a in args if _applies(layout, a))
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


@pytest.mark.parametrize("name", sorted(OPS))
def test_opcheck_neuron_transposed(name: str, neuron: str) -> None:
    args, kwargs = _examples(name)[0]
    args = tuple(_relayout("transposed", _to(a, neuron)) for a in args)
    kwargs = {k: _relayout("transposed", _to(v, neuron)) for k, v in kwargs.items()}
    torch.library.opcheck(OPS[name].op.default, args, kwargs, test_utils=DEVICE_UTILS)
