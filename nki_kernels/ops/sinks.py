"""`torch.ops.nki.sink_attention`: flash attention with attention sinks (GPT-OSS), forward
and backward, on the training kernels.

    sink_attention(q [B, Hq, Sq, D], k, v [B, Hkv, Sk, D], sinks [Hq] fp32, *, causal=False,
                   softmax_scale=None, sliding_window=None) -> (out [B, Hq, Sq, D], lse)

A sink is one learnable logit per head that joins the softmax denominator and carries no
value: out = sum_j e^(s_j) v_j / (sum_j e^(s_j) + e^(sink)). The flash kernels run
unchanged; the sink enters through the log-sum-exp:

    forward:  (out0, lse0) = flash_attention(...)        # without the sink
              lse = logaddexp(lse0, sink);  out = out0 * exp(lse0 - lse)
    backward: flash_attention_backward(dout, dlse, q, k, v, out, lse)
              # with the sink's lse, its P = exp(scale * S - lse) are the probabilities
              # with the sink in the denominator, and Delta = rowsum(dO * out) is exact
              # (the sink has no value), so dq, dk, dv are exact
              dsink[h] = sum over (b, q) of exp(sink[h] - lse) * (dlse - Delta)

Rows with no key (causal / window) have out = 0 and lse = sink (the sink alone).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..attention.host import MaskArgs, forward
from .attention import _fwd_validate
from .checks import check_is_tensor, check_tensor
from .registry import define_op


def _validate(q: Tensor, k: Tensor, v: Tensor, sinks: Tensor, **kw: Any) -> None:
    _fwd_validate(q, k, v, **kw)  # flash_attention's checks (shapes, dtypes, GQA, options)
    check_tensor("sinks", sinks, dtypes=(torch.float32,))
    if tuple(sinks.shape) != (q.shape[1],):
        raise ValueError(f"sinks: expected shape ({q.shape[1]},) [Hq]; got {tuple(sinks.shape)}")


def _fake(q: Tensor, *args: Any, **kw: Any) -> tuple[Tensor, Tensor]:
    b, h, s, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, h, s), dtype=torch.float32)


def _with_sink(out0: Tensor, lse0: Tensor, sinks: Tensor) -> tuple[Tensor, Tensor]:
    sink = sinks.to(torch.float32)[None, :, None].expand_as(lse0)
    lse = torch.logaddexp(lse0, sink)
    out = (out0.to(torch.float32) * torch.exp(lse0 - lse)[..., None]).to(out0.dtype)
    return out, lse


def _sink_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sinks: Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
) -> tuple[Tensor, Tensor]:
    """(out, lse) of attention with one sink logit per head; see the module docstring."""
    out0, lse0 = forward(q, k, v, MaskArgs(causal, softmax_scale, sliding_window))
    return _with_sink(out0, lse0, sinks)


def _setup(ctx: Any, inputs: Any, keyword_only_inputs: Any, output: Any) -> None:
    q, k, v, sinks = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, sinks, out, lse)
    ctx.opts = dict(keyword_only_inputs)


def _grad(ctx: Any, grad_out: Tensor | None, grad_lse: Tensor | None) -> tuple[Any, ...]:
    q, k, v, sinks, out, lse = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv = torch.ops.nki.flash_attention_backward(
        grad_out, grad_lse, q, k, v, out, lse, **ctx.opts
    )
    delta = (grad_out.to(torch.float32) * out.to(torch.float32)).sum(-1)  # [B, Hq, Sq]
    p_sink = torch.exp(sinks.to(torch.float32)[None, :, None] - lse)
    dl = -delta if grad_lse is None else grad_lse - delta
    dsink = (p_sink * dl).sum((0, 2)).to(sinks.dtype)
    return dq, dk, dv, dsink


def _examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 37, 32, generator=g, requires_grad=True)
    k = torch.randn(1, 1, 45, 32, generator=g, requires_grad=True)
    v = torch.randn(1, 1, 45, 32, generator=g, requires_grad=True)
    sinks = torch.randn(2, generator=g, requires_grad=True)
    return [((q, k, v, sinks), {"causal": True, "sliding_window": 9})]


define_op("sink_attention", _sink_attention, fake=_fake, validate=_validate, backward=_grad,
          setup_context=_setup, examples=_examples, traceable=True)  # fmt: skip


def sink_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sinks: Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """`torch.ops.nki.sink_attention`: out (or (out, lse)); differentiable in q, k, v and
    sinks. Layout and options as `flash_attention` (bottom-right causal, window W)."""
    check_is_tensor(q=q, k=k, v=v, sinks=sinks)
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected a bool; got {type(return_lse).__name__}")
    out, lse = torch.ops.nki.sink_attention(
        q, k, v, sinks, causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window
    )
    return (out, lse) if return_lse else out


__all__ = ["sink_attention"]
