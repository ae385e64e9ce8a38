"""nki_kernels.nn.MoE loaded from a Mixtral-style sparse-MoE block (written here)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from moe_cases import assert_close_scaled
from torch import nn

from nki_kernels.nn import MoE

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)


class _Expert(nn.Module):
    """w2(silu(w1 x) * w3 x), the Mixtral expert."""

    def __init__(self, h: int, i: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(h, i, bias=False)
        self.w2 = nn.Linear(i, h, bias=False)
        self.w3 = nn.Linear(h, i, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoeBlock(nn.Module):
    """A Mixtral-style sparse MoE block: softmax router, top-k, renormalized weights."""

    def __init__(self, h: int, i: int, e: int, k: int) -> None:
        super().__init__()
        self.top_k = k
        self.gate = nn.Linear(h, e, bias=False)
        self.experts = nn.ModuleList(_Expert(h, i) for _ in range(e))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = F.softmax(self.gate(x), dim=1, dtype=torch.float)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.where(chosen == e)
            if tok.numel():
                out.index_add_(0, tok, expert(x[tok]) * weights[tok, slot, None].to(x.dtype))
        return out.reshape(shape)


def test_mixtral_block_weights_load_and_match() -> None:
    torch.manual_seed(0)
    block = SparseMoeBlock(64, 96, 8, 2)
    moe = MoE.from_mixtral(block, top_k=2)
    x = torch.randn(2, 19, 64)
    xr = x.clone().requires_grad_()
    xm = x.clone().requires_grad_()
    ref = block(xr)
    out = moe(xm)
    assert out.shape == x.shape
    assert_close_scaled(out, ref, torch.float32, "output")
    g = torch.randn_like(ref)
    ref.backward(g)
    out.backward(g)
    assert_close_scaled(xm.grad, xr.grad, torch.float32, "d x")
    assert_close_scaled(moe.gate.weight.grad, block.gate.weight.grad, torch.float32, "d gate")
    for e, ex in enumerate(block.experts):
        assert_close_scaled(
            moe.w_gate_up.grad[e, :, :96], ex.w1.weight.grad.T, torch.float32, "d w1"
        )
        assert_close_scaled(
            moe.w_gate_up.grad[e, :, 96:], ex.w3.weight.grad.T, torch.float32, "d w3"
        )
        assert_close_scaled(moe.w_down.grad[e], ex.w2.weight.grad.T, torch.float32, "d w2")


def test_module_on_the_emulated_neuron_device(neuron: str) -> None:
    torch.manual_seed(1)
    block = SparseMoeBlock(32, 64, 4, 2).bfloat16()
    moe = MoE.from_mixtral(block, top_k=2).to(neuron)
    assert moe.w_gate_up.device.type == neuron and moe.w_gate_up.dtype == torch.bfloat16
    x = torch.randn(10, 32).bfloat16()
    out = moe(x.to(neuron))
    out.float().sum().backward()
    assert moe.w_down.grad is not None and moe.w_down.grad.device.type == neuron
    assert_close_scaled(out.cpu(), block(x), torch.bfloat16, "output")


def test_load_rejects_mismatched_blocks() -> None:
    moe = MoE(32, 64, 4, 2)
    with pytest.raises(ValueError, match=r"block.experts: expected 4 experts; got 3"):
        moe.load_mixtral(SparseMoeBlock(32, 64, 3, 2))
    with pytest.raises(
        ValueError, match=r"block.experts\[0\].w1.weight: expected \(64, 32\); got \(48, 32\)"
    ):
        moe.load_mixtral(SparseMoeBlock(32, 48, 4, 2))


def test_module_rejects_bad_arguments_by_name() -> None:
    """Routing options are checked when the module is built (top_k > E used to be
    accepted and fail at the first forward), and an input of the wrong hidden size
    names the argument instead of failing inside the router's matmul."""
    with pytest.raises(ValueError, match=r"top_k: expected 1..4 \(<= E = 4 and <= 8\); got 5"):
        MoE(16, 24, 4, 5)
    with pytest.raises(ValueError, match=r"num_experts: expected 2..128; got 1"):
        MoE(16, 24, 1, 1)
    with pytest.raises(ValueError, match=r"scoring: expected one of"):
        MoE(16, 24, 4, 2, scoring="relu")
    moe = MoE(16, 24, 4, 2)
    with pytest.raises(
        ValueError, match=r"x: expected hidden size \(last dim\) 16; got \(2, 3, 17\)"
    ):
        moe(torch.randn(2, 3, 17))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 24, 4, 2), "hidden_size: expected a positive int; got 0"),
        ((16, -1, 4, 2), "intermediate_size: expected a positive int; got -1"),
        ((16, 24.0, 4, 2), "intermediate_size: expected a positive int; got 24.0"),
        ((16, 24, "4", 2), "num_experts: expected a positive int; got '4'"),
    ],
)
def test_module_sizes_are_checked_by_name(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        MoE(*args)


def test_module_input_must_be_a_float_tensor() -> None:
    moe = MoE(16, 24, 4, 2)
    with pytest.raises(TypeError, match="x: expected a tensor; got list"):
        moe([[0.0] * 16])
    with pytest.raises(TypeError, match="x: expected dtype float32, bfloat16, float16; got int32"):
        moe(torch.ones(3, 16, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"x: expected at least 1 dim\(s\); got shape \(\)"):
        moe(torch.tensor(1.0))
