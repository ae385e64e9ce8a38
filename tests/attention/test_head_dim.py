"""head_dim 192 and 256 (two contraction passes per tile) in the forward kernel, against
float64; the backward's limit (128) is a named error."""

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


def _inputs(d: int, dtype: torch.dtype, device: str = "cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(d)
    shapes = ((1, 4, 150, d), (1, 2, 300, d), (1, 2, 300, d))
    return [torch.randn(s, generator=g).to(dtype).to(device) for s in shapes]


def _ref(q, k, v, **kw):  # type: ignore[no-untyped-def]
    return F.scaled_dot_product_attention(
        q.double().cpu(), k.double().cpu(), v.double().cpu(), enable_gqa=True, **kw
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("d", [192, 256])
def test_large_head_dim_forward(d: int, dtype: torch.dtype) -> None:
    q, k, v = _inputs(d, dtype)
    causal = torch.arange(300)[None, :] <= torch.arange(150)[:, None] + 150  # bottom-right
    out = flash_attention(q, k, v, causal=True)
    assert_rel_close(out, _ref(q, k, v, attn_mask=causal), TOLERANCES[dtype][0], "causal")
    mask = torch.rand(1, 4, 150, 300, generator=torch.Generator().manual_seed(1)) > 0.3
    out = flash_attention(q, k, v, attn_mask=mask)
    assert_rel_close(out, _ref(q, k, v, attn_mask=mask), TOLERANCES[dtype][0], "dense mask")


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_large_head_dim_under_compile_and_on_device(
    device: str, request: pytest.FixtureRequest
) -> None:
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    q, k, v = _inputs(256, torch.bfloat16, device)

    def f(q, k, v):  # type: ignore[no-untyped-def]
        return flash_attention(q, k, v)

    out = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)
    assert out.device.type == q.device.type
    assert_rel_close(out, _ref(q, k, v), TOLERANCES[torch.bfloat16][0], "out")


def test_sdpa_serves_large_head_dim_without_gradients_only() -> None:
    q, k, v = _inputs(192, torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SdpaFallbackWarning)
        out = sdpa(q, k, v, enable_gqa=True)
    assert_rel_close(out, _ref(q, k, v), TOLERANCES[torch.float32][0], "out")
    qg = q.clone().requires_grad_()
    with pytest.warns(SdpaFallbackWarning, match="head_dim 192 .supported: <= 128 with gradients"):
        sdpa(qg, k, v, enable_gqa=True)


def test_backward_beyond_128_is_a_named_error() -> None:
    q, k, v = (t.requires_grad_() for t in _inputs(192, torch.float32))
    out = flash_attention(q, k, v)
    with pytest.raises(ValueError, match=r"q: the backward expects head_dim \(dim 3\) <= 128"):
        out.sum().backward()
