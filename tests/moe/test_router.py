"""NKI router (forward and backward) against the fp32 reference."""

from __future__ import annotations

import pytest
import torch

from nki_kernels.moe.reference import route_reference
from nki_kernels.moe.router import moe_router_bwd, moe_router_fwd

# weights: fp32 math on the same logits; only the division order differs (~2 ulp of fp32).
# d_logits: stored in the logits' dtype (fp32: a few ulp over k + E terms; bf16: one
# rounding, u = 2^-8), compared against max |reference|.
W_ATOL = 4 * 2.0**-24
DL_TOL = {torch.float32: 1e-6, torch.bfloat16: 2.0**-8}

CASES = [
    # T, E, k, scoring, renormalize, logits dtype
    (37, 4, 2, "softmax", True, torch.float32),
    (200, 64, 6, "softmax", False, torch.bfloat16),
    (5, 8, 8, "sigmoid", True, torch.float32),
    (130, 3, 1, "sigmoid", False, torch.float32),
    (1, 128, 8, "softmax", True, torch.bfloat16),
    (129, 2, 2, "softmax", True, torch.float32),
]


@pytest.mark.parametrize("lnc", [1, 2])  # LNC 2: the cores take alternate token tiles
@pytest.mark.parametrize(("t", "e", "k", "scoring", "renorm", "dtype"), CASES)
def test_router_matches_reference(
    t: int, e: int, k: int, scoring: str, renorm: bool, dtype: torch.dtype, lnc: int
) -> None:
    g = torch.Generator().manual_seed(t * 7 + e)
    logits = torch.randn(t, e, generator=g).to(dtype)
    w, ids = moe_router_fwd[lnc](logits, k, scoring, renorm)
    lr = logits.float().clone().requires_grad_()
    w_ref, ids_ref = route_reference(lr, k, scoring, renorm)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert torch.equal(ids.long(), ids_ref)
    torch.testing.assert_close(w, w_ref.detach(), atol=W_ATOL, rtol=4 * 2.0**-24)

    dw = torch.randn(t, k, generator=g)
    w_ref.backward(dw)
    dl = moe_router_bwd[lnc](logits, ids, dw, scoring, renorm)
    assert dl.dtype == dtype
    err = (dl.float() - lr.grad).abs().max() / lr.grad.abs().max()
    assert err <= DL_TOL[dtype], f"d_logits error {err:.3g}"


def test_ties_go_to_the_lower_expert() -> None:
    # experts 1, 3 and 6 tie for the top score; the order must be 1, 3, 6 (stable)
    logits = torch.zeros(3, 8)
    logits[:, [1, 3, 6]] = 2.0
    logits[2, 6] = 2.5  # row 2: 6 wins outright, then 1, 3
    w, ids = moe_router_fwd(logits, 3, "softmax", True)
    assert ids.tolist() == [[1, 3, 6], [1, 3, 6], [6, 1, 3]]
    _, ids_ref = route_reference(logits, 3)
    assert torch.equal(ids.long(), ids_ref)
    assert torch.allclose(w[0], torch.full((3,), 1 / 3))
