"""The op on the emulated neuron device and under torch.compile(fullgraph=True),
forward and .backward(), against the fp32 reference."""

from __future__ import annotations

import pytest
import torch
from _helpers import TOLERANCES, assert_rel_close, make_inputs, reference_grads

from nki_kernels.ops.attention import flash_attention, sdpa

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)

SHAPE = (1, 4, 2, 77, 140, 64)  # b, hq, hkv, sq, sk, d


def _attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return flash_attention(q, k, v, causal=True)


def _check(q, k, v, out, g, device):  # type: ignore[no-untyped-def]
    ref_out, _, ref_grads = reference_grads(q, k, v, g, causal=True)
    tol_out, tol_grad = TOLERANCES[q.dtype]
    assert out.device.type == device
    assert_rel_close(out, ref_out, tol_out, "out")
    for name, got, ref in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref_grads):
        assert got is not None and got.device.type == device
        assert_rel_close(got, ref, tol_grad, name)


def test_neuron_device_forward_backward(neuron: str) -> None:
    q, k, v = make_inputs(*SHAPE, torch.bfloat16, device=neuron)
    out = _attn(q, k, v)
    g = torch.randn(out.shape, dtype=out.dtype).to(neuron)
    out.backward(g)
    _check(q, k, v, out, g, neuron)


def test_neuron_device_masks_on_device(neuron: str) -> None:
    q, k, v = make_inputs(2, 2, 1, 100, 100, 64, torch.float32, device=neuron)
    kv_lens = torch.tensor([100, 31]).to(neuron)
    out = flash_attention(q, k, v, kv_lens=kv_lens)
    g = torch.randn(out.shape).to(neuron)
    out.backward(g)
    ref_out, _, ref_grads = reference_grads(q, k, v, g, kv_lens=kv_lens.cpu())
    assert_rel_close(out, ref_out, TOLERANCES[torch.float32][0], "out")
    assert_rel_close(k.grad, ref_grads[1], TOLERANCES[torch.float32][1], "dk")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "backend,device", [("aot_eager", "cpu"), ("inductor", "cpu"), ("aot_eager", "neuron")]
)
def test_torch_compile_fullgraph(backend: str, device: str, request: pytest.FixtureRequest) -> None:
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    q, k, v = make_inputs(*SHAPE, torch.bfloat16, device=device)
    compiled = torch.compile(_attn, backend=backend, fullgraph=True)
    out = compiled(q, k, v)
    g = torch.randn(out.shape, dtype=out.dtype).to(device)
    out.backward(g)
    _check(q, k, v, out, g, device)


def test_sdpa_under_torch_compile() -> None:
    torch._dynamo.reset()
    q, k, v = make_inputs(1, 2, 2, 64, 64, 64, torch.float32)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return sdpa(q, k, v, is_causal=True)

    out = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.detach(), k.detach(), v.detach(), is_causal=True
    )
    assert_rel_close(out, ref, TOLERANCES[torch.float32][0], "out")


class Block(torch.nn.Module):
    """A tiny attention block: projections in torch, attention by the NKI op."""

    def __init__(self, d_model: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d_model // heads
        self.q = torch.nn.Linear(d_model, d_model, bias=False)
        self.kv = torch.nn.Linear(d_model, 2 * kv_heads * self.hd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.hd).permute(2, 0, 3, 1, 4)
        return sdpa(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).reshape(b, s, -1)


def test_module_on_neuron_trains(neuron: str) -> None:
    torch.manual_seed(0)
    cpu = Block(128, 2, 1)
    dev = Block(128, 2, 1)
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to(neuron)
    x = torch.randn(2, 50, 128)
    dev(x.to(neuron)).square().mean().backward()
    assert dev.q.weight.grad is not None and dev.q.weight.grad.device.type == neuron

    def ref_forward(m: Block, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = m.q(x).view(b, s, 2, 64).transpose(1, 2)
        k, v = m.kv(x).view(b, s, 2, 1, 64).permute(2, 0, 3, 1, 4)
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True
        )
        return o.transpose(1, 2).reshape(b, s, -1)

    ref_forward(cpu, x).square().mean().backward()
    assert_rel_close(dev.q.weight.grad, cpu.q.weight.grad, TOLERANCES[torch.float32][1], "dWq")  # type: ignore[arg-type]
    assert_rel_close(dev.kv.weight.grad, cpu.kv.weight.grad, TOLERANCES[torch.float32][1], "dWkv")  # type: ignore[arg-type]
