"""Gemma-2's logit softcap on the "nki" attention function: every plan runs the op's
softcap (no fallback), and what must still fall back (head_dim > 256) keeps the cap: each
against the model's eager formula (scale, cap c * tanh(s / c), mask, softmax)."""

from __future__ import annotations

import pytest
import torch

from nki_kernels.integrations import hf_attention
from nki_kernels.ops.attention import HEAD_DIM_MAX

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)

CAP, SCALE = 2.0, 0.5  # a cap that binds: |scaled scores| reach several times it
ATOL, RTOL = 2e-5, 1e-4  # fp32 kernels vs a float64 reference (the test_hf_patch bound)


def _eager(q, k, v, allowed, sinks=None):  # type: ignore[no-untyped-def]
    """Gemma-2 / GPT-OSS eager attention in float64: [B, Sq, Hq, D]."""
    q, k, v = (t.double() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.tanh(q @ k.transpose(2, 3) * SCALE / CAP) * CAP
    s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        b, h, sq, _ = s.shape
        col = sinks.double().reshape(1, h, 1, 1).expand(b, h, sq, 1)
        p = torch.softmax(torch.cat([s, col], -1), -1)[..., :-1]
    else:
        p = torch.where(allowed.any(-1, keepdim=True), torch.softmax(s, -1), 0.0)
    return (p @ v).transpose(1, 2)


def _inputs(d: int = 16, sq: int = 7, sk: int = 7, seed: int = 0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    q = 3 * torch.randn(2, 4, sq, d, generator=g)
    k, v = (3 * torch.randn(2, 2, sk, d, generator=g) for _ in range(2))
    return q, k, v


def _causal(sq: int, sk: int) -> torch.Tensor:
    return torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)[None, None]


def _run(q, k, v, plan, **kw):  # type: ignore[no-untyped-def]
    out, _ = hf_attention.nki_attention_forward(
        torch.nn.Module(), q, k, v, plan, scaling=SCALE, softcap=CAP, **kw
    )
    return out


@pytest.mark.parametrize("sinks", [False, True], ids=["plain", "sinks"])
def test_softcap_runs_in_the_op_and_matches_eager_with_gradients(sinks: bool) -> None:
    q, k, v = (t.requires_grad_() for t in _inputs())
    s_aux = torch.randn(4, generator=torch.Generator().manual_seed(1)) if sinks else None
    before = hf_attention.fallbacks()
    out = _run(q, k, v, None, s_aux=s_aux)
    assert hf_attention.fallbacks() == before  # the op ran, nothing fell back
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = _eager(qd, kd, vd, _causal(7, 7), s_aux)
    torch.testing.assert_close(out.double(), ref, atol=ATOL, rtol=RTOL)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    out.backward(g)
    ref.backward(g.double())
    for got, want in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


def test_softcap_on_a_padded_dense_plan_and_a_decode_step() -> None:
    q, k, v = _inputs()
    allowed = _causal(7, 7).expand(2, 1, 7, 7).clone()
    allowed[1, :, :, :3] = False  # row 1 left-padded by 3
    allowed[1, :, :3, :] = False
    plan = hf_attention.plan(allowed, None, 2, 7, 7, 0, None, "cpu")
    torch.testing.assert_close(
        _run(q, k, v, plan).double(), _eager(q, k, v, allowed), atol=ATOL, rtol=RTOL
    )
    q1, k1, v1 = _inputs(sq=1, sk=9, seed=3)  # one new token over a padded KV cache
    seen = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    seen[0, ..., :4] = False
    plan = hf_attention.plan(seen, None, 2, 1, 9, 0, None, "cpu")
    assert plan.kind == "decode"
    with torch.no_grad():
        out = _run(q1, k1, v1, plan)
    torch.testing.assert_close(out.double(), _eager(q1, k1, v1, seen), atol=ATOL, rtol=RTOL)


def test_a_fallback_keeps_the_softcap() -> None:
    d = HEAD_DIM_MAX + 8  # past the op: the torch fallback, which must still cap
    q, k, v = (t / 4 for t in _inputs(d=d))
    before = hf_attention.fallbacks().get(f"head_dim {d} > {HEAD_DIM_MAX}", 0)
    out = _run(q, k, v, None)
    assert hf_attention.fallbacks()[f"head_dim {d} > {HEAD_DIM_MAX}"] == before + 1
    torch.testing.assert_close(out.double(), _eager(q, k, v, _causal(7, 7)), atol=ATOL, rtol=RTOL)
