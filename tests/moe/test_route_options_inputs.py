"""Bad inputs to `moe.routing.route` (the NKI router, `torch.ops.nki.moe_route_options`)
and `route_reference`: refused with the argument, what it expects and what it got."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nki_kernels.moe.routing import route, route_reference


@pytest.mark.parametrize(
    ("logits", "match"),
    [
        (torch.randn(3, 16, dtype=torch.float64), "router_logits: expected dtype .*; got float64"),
        (torch.randn(0, 16), r"router_logits: expected a non-empty tensor; got shape \(0, 16\)"),
    ],
    ids=["float64", "no-tokens"],
)
def test_logits_the_kernel_cannot_read_are_named(logits: torch.Tensor, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        route(logits, top_k=2)


@pytest.mark.parametrize("fn", [route, route_reference], ids=["nki", "torch"])
def test_a_bias_that_is_not_a_tensor_is_named(fn: Any) -> None:
    with pytest.raises(
        TypeError, match=r"bias: expected a tensor of shape \(16,\) or None; got list"
    ):
        fn(torch.randn(3, 16), top_k=2, bias=[0.1] * 16)
