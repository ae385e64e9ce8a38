"""moe_gated_experts' optional tensor arguments (expert biases, shared expert) given as
something other than a tensor: refused with an error naming the argument, on the decode
launch (T <= 64, no gradients) and on the grouped composition alike."""

from __future__ import annotations

from typing import Any

import pytest
from test_moe_gated_experts import _case

from nki_kernels.ops.moe_gated_experts import moe_gated_experts


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize(
    ("arg", "value", "received"),
    [("b_gate_up", 0.5, "float"),
     ("b_down", [0.0] * 24, "list"),
     ("shared_gate_up", "w", "str"),
     ("shared_down", 1, "int"),
     ("shared_gate", [1.0] * 24, "list")],
)  # fmt: skip
def test_a_non_tensor_optional_argument_is_named(
    grad: bool, arg: str, value: Any, received: str
) -> None:
    c = _case(t=4, shared="gated")
    c[arg] = value
    c["hidden"].requires_grad_(grad)  # with a gradient: the grouped composition's call
    with pytest.raises(TypeError, match=f"{arg}: expected a tensor; got {received}"):
        moe_gated_experts(**c)
