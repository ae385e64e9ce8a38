"""torch.ops.nki.sink_attention (flash attention with sinks, forward and backward)
against float64 autograd of the plain formula."""

from __future__ import annotations

import math

import pytest
import torch
from _steps import TOLERANCES, assert_rel_close

from nki_kernels.ops.sinks import sink_attention

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)


def _reference(q, k, v, sinks, causal, window, scale):  # type: ignore[no-untyped-def]
    b, hq, sq, _ = q.shape
    sk = k.shape[2]
    kk = k.repeat_interleave(hq // k.shape[1], 1)
    vv = v.repeat_interleave(hq // k.shape[1], 1)
    s = q @ kk.transpose(-1, -2) * scale
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    allowed = torch.ones(sq, sk, dtype=torch.bool)
    if causal or window:
        allowed = j <= i + sk - sq
    if window:
        allowed &= j > i + sk - sq - window
    s = s.masked_fill(~allowed, -math.inf)
    s = torch.cat([s, sinks[None, :, None, None].expand(b, hq, sq, 1)], -1)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None])[..., :sk]
    return p @ vv, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("window", [None, 7])
def test_sink_attention_forward_backward(window: int | None, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 37, 32, generator=g).to(dtype).requires_grad_()
    k = torch.randn(2, 2, 45, 32, generator=g).to(dtype).requires_grad_()
    v = torch.randn(2, 2, 45, 32, generator=g).to(dtype).requires_grad_()
    sinks = torch.randn(4, generator=g).requires_grad_()
    out, lse = sink_attention(q, k, v, sinks, causal=True, sliding_window=window, return_lse=True)
    go = torch.randn(out.shape, generator=g).to(dtype)
    gl = torch.randn(lse.shape, generator=g)
    (out.float() * go.float()).sum().backward(retain_graph=True)
    (lse * gl).sum().backward()
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
    ro, rl = _reference(*leaves, True, window, 1 / math.sqrt(32))
    ((ro * go.double()).sum() + (rl * gl.double()).sum()).backward()
    tol_o, tol_g = TOLERANCES[dtype], 2 * TOLERANCES[dtype]
    assert_rel_close(out, ro, tol_o, "out")
    torch.testing.assert_close(lse.double(), rl.detach(), atol=1e-4, rtol=1e-5)
    for name, t, r in zip(("dq", "dk", "dv", "dsinks"), (q, k, v, sinks), leaves):
        assert_rel_close(t.grad, r.grad, tol_g, name)


def test_sink_attention_compiled() -> None:
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 20, 16, generator=g) for _ in range(3))
    sinks = torch.zeros(2)
    fn = torch.compile(lambda *a: sink_attention(*a, causal=True), backend="aot_eager",
                       fullgraph=True)  # fmt: skip
    ref, _ = _reference(q.double(), k.double(), v.double(), sinks.double(), True, None, 0.25)
    assert_rel_close(fn(q, k, v, sinks), ref, TOLERANCES[torch.float32])


def test_sink_attention_return_lse_must_be_a_bool() -> None:
    q, k, v = (torch.randn(1, 2, 5, 16) for _ in range(3))
    with pytest.raises(TypeError, match="return_lse: expected a bool; got int"):
        sink_attention(q, k, v, torch.zeros(2), return_lse=1)
