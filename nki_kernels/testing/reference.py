"""Reference helpers: run a plain-torch reference in fp32 on CPU and compare gradients."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def fp32_cpu(x: Any) -> Any:
    """A detached fp32 CPU copy of `x` (tensors only; other values pass through)."""
    if isinstance(x, torch.Tensor):
        out = x.detach().to("cpu")
        return out.float() if out.is_floating_point() else out
    return x


def reference(
    fn: Callable[..., Any], *args: Any, grad_outputs: Any = None
) -> tuple[Any, list[Any]]:
    """Run `fn` on fp32 CPU copies of `args`; returns (outputs, grads of tensor args).

    When `grad_outputs` is given (a tensor or a tuple matching the outputs), the inputs
    that are floating tensors get gradients; `grads` lists them (None for other args).
    """
    inputs = [fp32_cpu(a) for a in args]
    if grad_outputs is not None:
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                t.requires_grad_(True)
    out = fn(*inputs)
    grads: list[Any] = [None] * len(inputs)
    if grad_outputs is not None:
        outs: Sequence[torch.Tensor] = out if isinstance(out, tuple) else (out,)
        gos = grad_outputs if isinstance(grad_outputs, tuple) else (grad_outputs,)
        diff = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
        g = torch.autograd.grad(outs, diff, [fp32_cpu(go) for go in gos], allow_unused=True)
        it = iter(g)
        grads = [
            next(it) if isinstance(t, torch.Tensor) and t.requires_grad else None for t in inputs
        ]
        out = tuple(o.detach() for o in outs) if isinstance(out, tuple) else out.detach()
    return out, grads


__all__ = ["fp32_cpu", "reference"]
