"""flash_attention_varlen (flash-attn's packed-documents call) against per-document
float64 SDPA, forward and backward, with empty and one-token documents."""

from __future__ import annotations

import math
import re

import pytest
import torch
from _helpers import TOLERANCES, assert_rel_close

from nki_kernels.ops.attention import flash_attention_varlen

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)
HQ, HKV, D = 4, 2, 64


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def _reference(q, k, v, lq, lk, causal, grad):  # type: ignore[no-untyped-def]
    """Each document alone through float64 math (bottom-right causal), re-packed."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    outs, iq, ik = [], 0, 0
    for nq, nk in zip(lq, lk):
        qd = q64[iq : iq + nq].transpose(0, 1)
        kd = k64[ik : ik + nk].transpose(0, 1).repeat_interleave(HQ // HKV, 0)
        vd = v64[ik : ik + nk].transpose(0, 1).repeat_interleave(HQ // HKV, 0)
        s = qd @ kd.transpose(-1, -2) / math.sqrt(D)
        if causal:
            keep = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + (nk - nq)
            s = s.masked_fill(~keep, -math.inf)
        live = torch.isfinite(s).any(-1, keepdim=True)
        p = torch.softmax(s.masked_fill(~live, 0.0), -1).masked_fill(~live, 0.0)
        outs.append((p @ vd).transpose(0, 1))
        iq, ik = iq + nq, ik + nk
    out = torch.cat(outs)
    out.backward(grad.double())
    return out.detach(), (q64.grad, k64.grad, v64.grad)


def _inputs(tq: int, tk: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = ((tq, HQ, D), (tk, HKV, D), (tk, HKV, D))
    return [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in shapes]


CASES = [
    # (query lengths, key lengths, causal, dtype)
    ([5, 1, 0, 130, 64], None, True, torch.float32),
    ([5, 1, 0, 130, 64], None, False, torch.bfloat16),
    ([1, 3, 0, 40], [10, 3, 5, 200], True, torch.float32),  # chunked prefill / decode mix
    ([7, 0, 20], [0, 9, 20], False, torch.float32),  # a document without keys
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_varlen_matches_per_document_attention(case: tuple) -> None:
    lq, lk, causal, dtype = case
    lk = lq if lk is None else lk
    cq, ck = _cu(lq), _cu(lk)
    q, k, v = _inputs(sum(lq), sum(lk), dtype)
    out = flash_attention_varlen(
        q, k, v, cq, ck if lk is not lq else cq, max(lq), max(lk), causal=causal
    )
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    out.backward(grad)
    ref, ref_grads = _reference(q, k, v, lq, lk, causal, grad)
    tol_out, tol_grad = TOLERANCES[dtype]
    assert_rel_close(out, ref, tol_out, "out")
    for name, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref_grads):
        assert_rel_close(got, want, tol_grad, name)


@pytest.mark.parametrize(
    "backend,device", [("aot_eager", "cpu"), ("eager", "neuron"), ("aot_eager", "neuron")]
)
def test_varlen_on_devices_and_under_compile(
    backend: str, device: str, request: pytest.FixtureRequest
) -> None:
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    lens = [3, 1, 0, 60]
    cu = _cu(lens).to(device)
    q, k, v = (t.detach().to(device).requires_grad_() for t in _inputs(64, 64, torch.float32))

    def f(q, k, v):  # type: ignore[no-untyped-def]
        return flash_attention_varlen(q, k, v, cu, cu, 60, 60, causal=True)

    fn = f if backend == "eager" else torch.compile(f, backend=backend, fullgraph=True)
    out = fn(q, k, v)
    grad = torch.randn(out.shape)
    out.backward(grad.to(device))
    ref, ref_grads = _reference(q.cpu(), k.cpu(), v.cpu(), lens, lens, True, grad)
    assert_rel_close(out, ref, TOLERANCES[torch.float32][0], "out")
    for got, want in zip((q.grad, k.grad, v.grad), ref_grads):
        assert got is not None and got.device.type == q.device.type
        assert_rel_close(got, want, TOLERANCES[torch.float32][1], "grad")


def test_varlen_bad_offsets_name_the_argument() -> None:
    q, k, v = (t.detach() for t in _inputs(10, 10, torch.float32))
    with pytest.raises(
        ValueError, match=r"cu_seqlens_q: expected non-decreasing offsets .*; got \[0, 4, 9\]"
    ):
        flash_attention_varlen(q, k, v, _cu([4, 5]), _cu([4, 6]), 5, 6)
    with pytest.raises(
        ValueError, match=r"max_seqlen_k: expected >= the longest document \(6\); got 5"
    ):
        flash_attention_varlen(q, k, v, _cu([4, 6]), _cu([4, 6]), 6, 5)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"max_seqlen_q": None}, "max_seqlen_q: expected an int; got NoneType"),
        ({"max_seqlen_k": "6"}, "max_seqlen_k: expected an int; got str"),
        ({"max_seqlen_q": 5.5}, "max_seqlen_q: expected an int; got float"),
        ({"causal": "no"}, "causal: expected a bool; got str"),
        ({"return_lse": 1}, "return_lse: expected a bool; got int"),
    ],
)
def test_varlen_bad_options_name_the_argument(kw: dict, message: str) -> None:
    q, k, v = (t.detach() for t in _inputs(10, 10, torch.float32))
    args = {"max_seqlen_q": 6, "max_seqlen_k": 6, **kw}
    with pytest.raises(TypeError, match=re.escape(message)):
        # different query and key offsets: the mask path, which reads `causal` as a truth value
        flash_attention_varlen(q, k, v, _cu([4, 6]), _cu([3, 7]), **args)
