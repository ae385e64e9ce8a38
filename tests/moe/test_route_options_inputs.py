"""Inputs the NKI router (`torch.ops.nki.moe_route_options`, behind `moe.routing.route`)
cannot take are refused by name before the kernel runs."""

from __future__ import annotations

import pytest
import torch

from nki_kernels.moe.routing import route


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
