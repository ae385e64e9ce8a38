"""Second derivatives through the ops are refused loudly, never silently zero."""

from __future__ import annotations

import pytest
import torch

import nki_kernels


def test_double_backward_through_rms_norm_raises_naming_the_backward_op() -> None:
    x = torch.randn(4, 128, requires_grad=True)
    w = torch.ones(128, requires_grad=True)
    y = torch.ops.nki.rms_norm(x, w, 1e-6)
    (g,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="rms_norm_backward"):
        g.sum().backward()


def test_double_backward_through_flash_attention_raises_naming_the_backward_op() -> None:
    q = torch.randn(1, 2, 128, 64, requires_grad=True)
    o = nki_kernels.flash_attention(q, q, q)
    (g,) = torch.autograd.grad(o.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="flash_attention_backward"):
        g.sum().backward()
