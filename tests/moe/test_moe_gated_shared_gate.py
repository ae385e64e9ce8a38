"""moe_gated_experts: `shared_gate` must be exactly [H]; any other shape (even one with
H elements, such as [1, H] or [H, 1]) is refused with the expected and received shapes."""

from __future__ import annotations

import pytest
import torch

from nki_kernels.ops.moe_gated_experts import moe_gated_experts

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)


def _case(t: int = 5, h: int = 24, i: int = 8, e: int = 3, k: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "hidden": torch.randn(t, h, generator=g),
        "weights": torch.rand(t, k, generator=g),
        "ids": torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]),
        "w_gate_up": torch.randn(e, h, 2 * i, generator=g) / h**0.5,
        "w_down": torch.randn(e, i, h, generator=g) / i**0.5,
        "shared_gate_up": torch.randn(h, 2 * 4, generator=g) / h**0.5,
        "shared_down": torch.randn(4, h, generator=g) / 2,
    }


@pytest.mark.parametrize("shape", [(1, 24), (24, 1), (2, 12), (4, 3, 2)])
def test_shared_gate_with_h_elements_but_another_shape_is_refused(shape: tuple[int, ...]) -> None:
    c = _case()
    c["shared_gate"] = torch.randn(shape)
    received = str(tuple(shape)).replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ValueError, match=rf"shared_gate: expected \[H=24\] .*; got {received}"):
        moe_gated_experts(**c)


def test_shared_gate_of_shape_h_is_accepted() -> None:
    c = _case()
    c["shared_gate"] = torch.randn(24)
    out = moe_gated_experts(**c)
    assert out.shape == (5, 24)
    assert torch.isfinite(out).all()
