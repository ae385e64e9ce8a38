"""Meta-test: no op leaves its inputs' storage marked "not resizable".

`Tensor.numpy()` on a caller's tensor marks its storage not resizable for good; FSDP2
frees every unsharded parameter after its layer with `storage.resize_(0)` and then fails
("Trying to resize storage that is not resizable"). Every op's examples run forward and,
where an input requires grad, backward; each tensor argument's storage must stay
resizable.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nki_kernels.ops import load_all, registered_ops
from nki_kernels.runtime.host_array import host_numpy

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)

load_all()
OPS = {k: v for k, v in registered_ops().items() if v.examples is not None}


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    return [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]


def _fresh(x: Any) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    return x.detach().clone().requires_grad_(x.requires_grad)


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_inputs_stay_resizable(name: str) -> None:
    args0, kwargs0 = next(iter(OPS[name].examples()))  # type: ignore[misc]
    args = tuple(_fresh(a) for a in args0)
    kwargs = {k: _fresh(v) for k, v in kwargs0.items()}
    inputs = _tensors(args, kwargs)
    assert all(t.untyped_storage().resizable() for t in inputs)
    out = OPS[name].op(*args, **kwargs)
    outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if o is not None]
    diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    if diff:
        torch.autograd.backward(diff, [torch.ones_like(o) for o in diff])
    for i, t in enumerate(inputs):
        assert t.untyped_storage().resizable(), f"{name}: tensor argument {i} lost resizability"
        t.untyped_storage().resize_(0)  # what FSDP2 does to a freed unsharded parameter


def test_host_numpy_copies_and_keeps_the_storage_resizable() -> None:
    t = torch.arange(6.0).reshape(2, 3).t()
    a = host_numpy(t)
    assert a.flags.c_contiguous and a.tolist() == t.tolist()
    a[0, 0] = 99.0
    assert float(t[0, 0]) == 0.0
    assert t.untyped_storage().resizable()
