"""Non-finite values at keys the mask rules out never reach the output (issue 15, case 5),
and a softmax_scale too small to mask with is rejected up front (case 6).

The kernels multiply zero probabilities with every V row of a computed 128-key tile
(and dS with K rows in the backward): a NaN in a row no query may attend must be
selected away before, wherever it sits relative to the tiles.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import TOLERANCES, assert_rel_close

import nki_kernels  # noqa: F401  (registers torch.ops.nki.*)
from nki_kernels.ops.attention import flash_attention


def _inputs(sk: int = 256, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, 200, 32, generator=g)
    k = torch.randn(1, 1, sk, 32, generator=g)
    v = torch.randn(1, 1, sk, 32, generator=g)
    return q, k, v


@pytest.mark.parametrize("key", [90, 100, 127, 200])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("causal", [False, True])
def test_nonfinite_kv_beyond_kv_lens_forward(key: int, bad: float, causal: bool) -> None:
    """kv_lens = 90: keys 90..255 are never attended; poisoning one of them (inside the
    first key tile, at its edge, or in a skipped tile) leaves out and lse unchanged."""
    q, k, v = _inputs()
    kv_lens = torch.tensor([90])
    clean_out, clean_lse = flash_attention(q, k, v, causal=causal, kv_lens=kv_lens, return_lse=True)
    k2, v2 = k.clone(), v.clone()
    k2[0, 0, key, 3] = bad
    v2[0, 0, key, 5] = bad
    out, lse = flash_attention(q, k2, v2, causal=causal, kv_lens=kv_lens, return_lse=True)
    assert torch.isfinite(out).all(), f"{int((~torch.isfinite(out)).sum())} non-finite outputs"
    torch.testing.assert_close(out, clean_out, atol=0.0, rtol=0.0)
    torch.testing.assert_close(lse, clean_lse, atol=0.0, rtol=0.0)


@pytest.mark.parametrize("key", [100, 127])
def test_nonfinite_kv_beyond_kv_lens_backward(key: int) -> None:
    q, k, v = _inputs(seed=1)
    kv_lens = torch.tensor([90])
    grads = []
    for poison in (False, True):
        qq, kk, vv = (t.clone() for t in (q, k, v))
        if poison:
            kk[0, 0, key, 0] = float("nan")
            vv[0, 0, key, 1] = float("inf")
        for t in (qq, kk, vv):
            t.requires_grad_(True)
        out = flash_attention(qq, kk, vv, causal=True, kv_lens=kv_lens)
        out.backward(torch.ones_like(out))
        grads.append((qq.grad, kk.grad, vv.grad))
    for name, clean, got in zip(("dq", "dk", "dv"), grads[0], grads[1]):
        assert torch.isfinite(got).all(), f"{name}: non-finite gradients"
        torch.testing.assert_close(got, clean, atol=0.0, rtol=0.0, msg=name)
    assert float(grads[1][1][0, 0, 90:].abs().max()) == 0.0, "dk of unattended keys"


def test_nonfinite_at_attended_key_stays_in_attending_rows() -> None:
    """A NaN in V at key 10 with kv_lens: every row attends it (no causal): all NaN;
    a row of another batch element is untouched."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 1, 130, 16, generator=g) for _ in range(3))
    v[0, 0, 10, 0] = float("nan")
    out = flash_attention(q, k, v, kv_lens=torch.tensor([100, 130]))
    assert torch.isnan(out[0, 0, :, 0]).all()
    assert torch.isfinite(out[1]).all()
    ref = torch.nn.functional.scaled_dot_product_attention(q[1:], k[1:], v[1:])
    assert_rel_close(out[1:], ref, TOLERANCES[torch.float32][0], "batch 1")


@pytest.mark.parametrize("scale", [1e-38, 1e-31, 0.0])
def test_tiny_softmax_scale_rejected(scale: float) -> None:
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"softmax_scale: expected a number >=? ?[01]"):
        flash_attention(q, k, v, kv_lens=torch.tensor([90]), softmax_scale=scale)


def test_small_softmax_scale_masks_exactly() -> None:
    """At the smallest accepted scale masked keys still get exactly zero weight:
    the output is the plain mean of V over the attended keys."""
    q, k, v = _inputs()
    out = flash_attention(q, k, v, kv_lens=torch.tensor([90]), softmax_scale=1e-30)
    mean = v[:, :, :90].mean(dim=2, keepdim=True).expand_as(out)
    assert_rel_close(out, mean, TOLERANCES[torch.float32][0], "out")
