"""head_dim 192 and 256 (two contraction passes per tile) in the forward and the backward
kernels, against float64, eagerly and under torch.compile, on CPU and the neuron device."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from _helpers import TOLERANCES, assert_rel_close

from nki_kernels.ops.attention import SdpaFallbackWarning, flash_attention, sdpa

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)


def _inputs(
    d: int, dtype: torch.dtype, device: str = "cpu", sq: int = 150, sk: int = 300
) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(d)
    shapes = ((1, 4, sq, d), (1, 2, sk, d), (1, 2, sk, d))
    return [torch.randn(s, generator=g).to(dtype).to(device) for s in shapes]


def _ref(q, k, v, **kw):  # type: ignore[no-untyped-def]
    return F.scaled_dot_product_attention(
        q.double().cpu(), k.double().cpu(), v.double().cpu(), enable_gqa=True, **kw
    )


def _ref_grads(q, k, v, grad, **kw):  # type: ignore[no-untyped-def]
    """float64 (out, (dq, dk, dv)) of torch's SDPA on CPU copies."""
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, enable_gqa=True, **kw)
    return out, torch.autograd.grad(out, leaves, grad.double().cpu())


def _bottom_right(sq: int, sk: int) -> torch.Tensor:
    return torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)


def _check_grads(q, k, v, out, dtype, **kw):  # type: ignore[no-untyped-def]
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    got = torch.autograd.grad(out, (q, k, v), grad.to(out.device))
    ref_out, ref = _ref_grads(q, k, v, grad, **kw)
    tol_out, tol_grad = TOLERANCES[dtype]
    assert_rel_close(out, ref_out, tol_out, "out")
    for name, a, e in zip(("dq", "dk", "dv"), got, ref):
        assert a.device.type == q.device.type
        assert_rel_close(a, e, tol_grad, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("d", [192, 256])
def test_large_head_dim_forward(d: int, dtype: torch.dtype) -> None:
    q, k, v = _inputs(d, dtype)
    out = flash_attention(q, k, v, causal=True)
    causal = _bottom_right(150, 300)
    assert_rel_close(out, _ref(q, k, v, attn_mask=causal), TOLERANCES[dtype][0], "causal")
    mask = torch.rand(1, 4, 150, 300, generator=torch.Generator().manual_seed(1)) > 0.3
    out = flash_attention(q, k, v, attn_mask=mask)
    assert_rel_close(out, _ref(q, k, v, attn_mask=mask), TOLERANCES[dtype][0], "dense mask")


@pytest.mark.parametrize("mask", ["none", "causal", "dense"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("d", [192, 256])
def test_large_head_dim_backward(d: int, dtype: torch.dtype, mask: str) -> None:
    # 520 rows and 530 keys: one full 512-row unit and 512-key block (the interleaved
    # staging) plus ragged tiles; GQA 2:1
    q, k, v = (t.requires_grad_() for t in _inputs(d, dtype, sq=520, sk=530))
    if mask == "causal":
        out = flash_attention(q, k, v, causal=True)
        _check_grads(q, k, v, out, dtype, attn_mask=_bottom_right(520, 530))
    elif mask == "dense":
        allowed = torch.rand(1, 4, 520, 530, generator=torch.Generator().manual_seed(2)) > 0.3
        out = flash_attention(q, k, v, attn_mask=allowed)
        _check_grads(q, k, v, out, dtype, attn_mask=allowed)
    else:
        out = flash_attention(q, k, v)
        _check_grads(q, k, v, out, dtype)


@pytest.mark.parametrize(
    "backend,device",
    [("eager", "neuron"), ("aot_eager", "cpu"), ("aot_eager", "neuron")],
)
def test_large_head_dim_under_compile_and_on_device(
    backend: str, device: str, request: pytest.FixtureRequest
) -> None:
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    q, k, v = (t.requires_grad_() for t in _inputs(256, torch.bfloat16, device))
    mask = (torch.rand(1, 1, 150, 300, generator=torch.Generator().manual_seed(3)) > 0.3).to(device)

    def f(q, k, v, mask):  # type: ignore[no-untyped-def]
        return flash_attention(q, k, v, attn_mask=mask)

    fn = f if backend == "eager" else torch.compile(f, backend=backend, fullgraph=True)
    out = fn(q, k, v, mask)
    assert out.device.type == q.device.type
    _check_grads(q, k, v, out, torch.bfloat16, attn_mask=mask.cpu())


def test_sdpa_serves_large_head_dim_with_gradients() -> None:
    q, k, v = (t.requires_grad_() for t in _inputs(192, torch.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SdpaFallbackWarning)
        out = sdpa(q, k, v, enable_gqa=True)
    _check_grads(q, k, v, out, torch.float32)


def test_head_dim_beyond_256_is_a_named_error() -> None:
    q, k, v = _inputs(272, torch.float32, sq=8, sk=8)
    with pytest.raises(ValueError, match=r"q: expected head_dim \(dim 3\) <= 256; got 272"):
        flash_attention(q, k, v)


def test_large_head_dim_backward_over_several_sections(monkeypatch: pytest.MonkeyPatch) -> None:
    # one 4-tile unit per section: dK / dV partial sums go through the fp32 HBM scratch
    from nki_kernels.attention import config

    def small(cls, problem, target):  # type: ignore[no-untyped-def]
        return cls(section=4, dma_quarters=4, scalar_evac=8)

    monkeypatch.setattr(config.FlashBwdConfig, "heuristic", classmethod(small))
    from nki_kernels.runtime.config_store import recording_decisions

    q, k, v = (t.requires_grad_() for t in _inputs(256, torch.bfloat16, sq=600, sk=600))
    out = flash_attention(q, k, v, causal=True)
    with recording_decisions() as seen:
        _check_grads(q, k, v, out, torch.bfloat16, attn_mask=_bottom_right(600, 600))
    assert [d.config.section for d in seen if d.op == "flash_attention_bwd"] == [4]
