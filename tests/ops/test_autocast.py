"""Autocast: every op behaves inside `torch.autocast` as its torch counterpart does, and
`F.scaled_dot_product_attention = nki_kernels.sdpa` is a safe monkeypatch."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import nki_kernels
from nki_kernels.ops import _autocast, registered_ops
from nki_kernels.ops.attention import SdpaFallbackWarning

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)

LOW = (torch.bfloat16, torch.float16)
# bf16 / fp16 results of the same computation, compared with torch's (same rounding of
# the inputs, then each library's own accumulation order)
TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


def test_every_library_op_has_an_autocast_rule() -> None:
    library = {n for n in registered_ops() if not n.startswith("testonly")}
    assert library <= set(_autocast.RULES), sorted(library - set(_autocast.RULES))


@pytest.mark.parametrize("dtype", LOW)
def test_flash_attention_follows_sdpa(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 33, 16, generator=g, requires_grad=True) for _ in range(3))
    with torch.autocast("cpu", dtype=dtype):
        out = nki_kernels.flash_attention(q, k, v, causal=True)
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == ref.dtype == dtype
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.float32


@pytest.mark.parametrize("dtype", LOW)
def test_moe_mlp_runs_in_the_autocast_dtype(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    moe = nki_kernels.nn.MoE(32, 48, 4, top_k=2)
    x = torch.randn(2, 5, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=dtype):
        y = moe(x)
        # the same experts in plain torch under the same autocast region
        ref = _moe_reference(moe, x)
    assert y.dtype == ref.dtype == dtype
    torch.testing.assert_close(y.float(), ref.float(), atol=3e-2, rtol=3e-2)
    y.float().sum().backward()
    assert moe.w_gate_up.grad is not None and moe.w_gate_up.grad.dtype == torch.float32


def _moe_reference(moe: nki_kernels.nn.MoE, x: torch.Tensor) -> torch.Tensor:
    t = x.reshape(-1, x.shape[-1])
    w, ids = torch.softmax(moe.gate(t).float(), -1).topk(moe.routing.top_k, -1)
    w = w / w.sum(-1, keepdim=True)
    i = moe.intermediate_size
    out = torch.zeros(t.shape, dtype=torch.get_autocast_dtype("cpu"))
    for e in range(moe.num_experts):
        rows, slot = (ids == e).nonzero(as_tuple=True)
        gu = t[rows] @ moe.w_gate_up[e]
        h = (F.silu(gu[:, :i]) * gu[:, i:]) @ moe.w_down[e]
        out = out.index_add(0, rows, (h * w[rows, slot, None]).to(out.dtype))
    return out.reshape(x.shape)


@pytest.mark.parametrize("dtype", LOW)
def test_norms_compute_in_the_input_dtype(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, generator=g)  # fp32 master weight
    for x in (torch.randn(3, 24, generator=g), torch.randn(3, 24, generator=g).to(dtype)):
        with torch.autocast("cpu", dtype=dtype):
            y = torch.ops.nki.rms_norm(x, w, 1e-6)
            ref = F.rms_norm(x, (24,), w, 1e-6)
            ln = torch.ops.nki.layer_norm(x, w, w, 1e-5)
            ln_ref = F.layer_norm(x, (24,), w, w, 1e-5)
        assert y.dtype == ref.dtype == x.dtype and ln.dtype == ln_ref.dtype == x.dtype
        atol, rtol = TOL.get(x.dtype, (1e-5, 1e-5))
        torch.testing.assert_close(y, ref, atol=atol, rtol=rtol)
        torch.testing.assert_close(ln, ln_ref, atol=atol, rtol=rtol)


def test_add_rms_norm_promotes_like_addition() -> None:
    x = torch.randn(4, 16).bfloat16()
    r = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, h = torch.ops.nki.add_rms_norm(x, r, torch.ones(16).bfloat16(), 1e-6)
    assert h.dtype == y.dtype == (x + r).dtype == torch.float32
    torch.testing.assert_close(h, x + r)


def test_outside_autocast_mixed_dtypes_still_fail_by_name() -> None:
    with pytest.raises(TypeError, match="weight: expected dtype bfloat16"):
        torch.ops.nki.rms_norm(torch.randn(3, 8).bfloat16(), torch.ones(8), 1e-6)


def test_autocast_on_the_neuron_device(neuron: str) -> None:
    q = torch.randn(1, 1, 9, 8).to(neuron)
    with torch.autocast(neuron, dtype=torch.bfloat16):
        out = nki_kernels.flash_attention(q, q, q)
    assert out.dtype == torch.bfloat16 and out.device.type == neuron


def test_sdpa_monkeypatch_falls_back_to_torch_without_recursion(monkeypatch) -> None:
    from nki_kernels.ops import attention as attention_ops

    original = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", nki_kernels.sdpa)
    # the warning is once per reason per process: start from none warned, whatever ran before
    monkeypatch.setattr(attention_ops, "_WARNED", set())
    q = torch.randn(1, 2, 5, 8)
    mask = torch.rand(5, 5) > 0.3
    # a dense mask stays on the kernel now; a 3-D call is one that really falls back
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = F.scaled_dot_product_attention(q[0], q[0], q[0], attn_mask=mask)
    assert any(issubclass(w.category, SdpaFallbackWarning) for w in rec)
    torch.testing.assert_close(out, original(q[0], q[0], q[0], attn_mask=mask))
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask),
        original(q, q, q, attn_mask=mask),
        atol=1e-5,
        rtol=1e-5,
    )
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, q, q), original(q, q, q), atol=1e-5, rtol=1e-5
    )
