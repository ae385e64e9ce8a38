"""torch.compile over a model-shaped block: projection -> view -> transpose -> attention
-> norm, forward and backward, with aot_eager and inductor, on CPU and the emulated
neuron device. q / k / v come out of `proj(x).view(...).transpose(1, 2)`, which is not
contiguous: the fakes must report the strides the kernels really produce.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import nki_kernels

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)

# fp32 end to end; the compiled graph runs the same kernels, only the glue differs
ATOL, RTOL = 1e-5, 1e-5


class Block(nn.Module):
    """A pre-norm attention block with GQA (2 query heads per key head)."""

    def __init__(self, hidden: int = 64, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, hidden // heads
        self.norm = nki_kernels.nn.RMSNorm(hidden, eps=1e-6)
        self.q = nn.Linear(hidden, heads * self.d, bias=False)
        self.kv = nn.Linear(hidden, 2 * kv_heads * self.d, bias=False)
        self.o = nn.Linear(heads * self.d, hidden, bias=False)
        self.out_norm = nki_kernels.nn.RMSNorm(hidden, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.norm(x)
        q = self.q(h).view(b, s, self.heads, self.d).transpose(1, 2)
        k, v = self.kv(h).view(b, s, 2 * self.kv_heads, self.d).transpose(1, 2).chunk(2, dim=1)
        a = nki_kernels.flash_attention(q, k, v, causal=True)
        return self.out_norm(x + self.o(a.transpose(1, 2).reshape(b, s, -1)))


def _run(block: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    block.zero_grad()
    x = x.detach().requires_grad_()
    y = block(x)
    y.pow(2).sum().backward()
    grads = [x.grad] + [p.grad for p in block.parameters()]
    return y.detach().cpu(), [g.detach().cpu() for g in grads]


# Inductor has no code generator for the emulated device (KeyError 'neuron' in its
# backend table); on hardware, TorchNeuron's own backend="neuron" takes that role.
@pytest.mark.parametrize(
    "device,backend",
    [("cpu", "aot_eager"), ("cpu", "inductor"), ("neuron", "aot_eager")],
)
def test_compiled_block_matches_eager(device: str, backend: str, request: pytest.FixtureRequest):
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch.manual_seed(0)
    block = Block().to(device)
    x = torch.randn(2, 19, 64).to(device)
    y_ref, g_ref = _run(block, x)
    torch._dynamo.reset()
    compiled = torch.compile(block, backend=backend, fullgraph=True)
    y, g = _run(compiled, x)
    torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=RTOL)
    for got, want in zip(g, g_ref, strict=True):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


class FloatOptions(nn.Module):
    """Every op with a float option held as a module attribute, the way models keep
    `eps` and `scaling`: under `dynamic=True` dynamo hands these to the ops as SymFloat."""

    def __init__(self, hidden: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.d = heads, hidden // heads
        self.scaling, self.softcap, self.eps, self.capacity = self.d**-0.5, 20.0, 1e-5, 2.0
        self.w = nn.Parameter(torch.randn(hidden))
        self.ln = nki_kernels.nn.LayerNorm(hidden)
        self.rms = nki_kernels.nn.RMSNorm(hidden, eps=1e-6)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.router = nn.Linear(hidden, 4, bias=False)
        self.w_gate_up = nn.Parameter(torch.randn(4, hidden, 16) * 0.2)
        self.w_down = nn.Parameter(torch.randn(4, 8, hidden) * 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, hidden = x.shape
        h = self.ln(x)
        q, k, v = self.qkv(h).view(b, s, 3 * self.heads, self.d).transpose(1, 2).chunk(3, 1)
        a = nki_kernels.flash_attention(
            q, k, v, causal=True, softmax_scale=self.scaling, softcap=self.softcap
        )
        y, r = torch.ops.nki.add_rms_norm(a.transpose(1, 2).reshape(b, s, -1), x, self.w, self.eps)
        y = torch.ops.nki.layer_norm(self.rms(y), self.w, None, self.eps)
        t = y.reshape(b * s, hidden)
        m = torch.ops.nki.moe_mlp(
            t, self.router(t), self.w_gate_up, self.w_down, top_k=2,
            capacity_factor=self.capacity,
        )  # fmt: skip
        return r + m.view(b, s, hidden)


def test_dynamic_compile_takes_float_options():
    """`torch.compile(dynamic=True)` used to fail in every op's fake with
    "eps: expected a float; got SymFloat": symbolic numbers are now specialized before
    the checks. Two sequence lengths through one dynamic graph, forward and backward."""
    torch.manual_seed(0)
    block = FloatOptions()
    torch._dynamo.reset()
    compiled = torch.compile(block, backend="aot_eager", dynamic=True, fullgraph=True)
    for s in (7, 11):
        x = torch.randn(2, s, 32)
        y_ref, g_ref = _run(block, x)
        y, g = _run(compiled, x)
        torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=RTOL)
        for got, want in zip(g, g_ref, strict=True):
            torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
