"""The expert_act kernels directly: every activation and layout, bias gathered per row,
output chunks past the 2048-column tile (ragged), ragged row tiles, LNC 1 and 2, forward
and backward against float64 torch (autograd of the reference)."""

from __future__ import annotations

import pytest
import torch

from nki_kernels.moe.expert_act import COLS, expert_act_bwd, expert_act_fwd
from nki_kernels.moe.gated_reference import activate
from nki_kernels.runtime import launch
from nki_kernels.targets import get_target

TOL = 2e-5  # fp32, relative to the largest magnitude: a handful of fp32 roundings


def _launch(kernel, *args, lnc: int, **opts):  # type: ignore[no-untyped-def]
    return launch(kernel, *args, target=get_target("trn2"), lnc=lnc, **opts)


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize(
    ("activation", "interleaved"),
    [("swiglu", False), ("geglu", True), ("gpt_oss", True), ("gpt_oss", False)],
)
def test_kernels_match_float64(activation: str, interleaved: bool, lnc: int) -> None:
    g = torch.Generator().manual_seed(0)
    m, i, groups = 300, COLS + 37, 3  # 3 row tiles (ragged), 2 column chunks (ragged)
    h = torch.randn(m, 2 * i, generator=g) * 4
    b = torch.randn(groups, 2 * i, generator=g)
    rg = torch.randint(0, groups, (m, 1), generator=g, dtype=torch.int32)
    opts = dict(activation=activation, interleaved=interleaved, alpha=1.702, limit=7.0)
    out = _launch(expert_act_fwd, h, b, rg, lnc=lnc, **opts)
    hd = h.double().requires_grad_()
    ref = activate(hd + b.double()[rg[:, 0].long()], activation, interleaved, 1.702, 7.0)
    scale = float(ref.detach().abs().max())
    assert float((out.double() - ref.detach()).abs().max()) <= TOL * scale
    d = torch.randn(m, i, generator=g)
    ref.backward(d.double())
    dh = _launch(expert_act_bwd, h, b, rg, d, lnc=lnc, **opts)
    assert hd.grad is not None
    assert float((dh.double() - hd.grad).abs().max()) <= TOL * float(hd.grad.abs().max())


def test_bias_only_pass_and_no_bias() -> None:
    g = torch.Generator().manual_seed(1)
    h = torch.randn(130, 70, generator=g)
    b = torch.randn(5, 70, generator=g)
    rg = torch.tensor([[r % 5] for r in range(130)], dtype=torch.int32)
    opts = dict(interleaved=False, alpha=1.0, limit=1.0)
    out = _launch(expert_act_fwd, h, b, rg, activation="none", lnc=1, **opts)
    assert torch.equal(out, h + b[rg[:, 0].long()])  # one fp32 add: exact
    out = _launch(expert_act_fwd, h, None, rg, activation="swiglu", lnc=1, **opts)
    ref = activate(h.double(), "swiglu", False, 1.0, 1.0)
    assert float((out.double() - ref).abs().max()) <= TOL * float(ref.abs().max())


def test_clamp_boundaries_select_like_torch() -> None:
    """At |up| = L and gate = L torch's clamp passes the gradient (inclusive bounds); past
    them it is 0, selected, even where the incoming gradient is Inf."""
    lim = 7.0
    gate = torch.tensor([lim, lim + 1, -20.0, 3.0])
    up = torch.tensor([lim, -lim, lim + 0.5, -lim - 0.5])
    h = torch.stack([gate, up], 1).reshape(1, 8).repeat(2, 1)  # interleaved pairs
    rg = torch.zeros(2, 1, dtype=torch.int32)
    d = torch.tensor([[1.0, 1.0, 1.0, 1.0], [float("inf")] * 4])
    opts = dict(activation="gpt_oss", interleaved=True, alpha=1.702, limit=lim)
    dh = _launch(expert_act_bwd, h, None, rg, d, lnc=1, **opts)
    hd = h.double().requires_grad_()
    activate(hd[:1], "gpt_oss", True, 1.702, lim).backward(d[:1].double())
    assert hd.grad is not None
    torch.testing.assert_close(dh[0].double(), hd.grad[0], atol=1e-6, rtol=1e-6)
    # Inf gradient: the clamped-away positions are exactly 0, never 0 * Inf = NaN
    assert dh[1, 5] == 0 and dh[1, 7] == 0  # up past +-L (pairs 2, 3)
    assert dh[1, 2] == 0  # gate past L (pair 1)
