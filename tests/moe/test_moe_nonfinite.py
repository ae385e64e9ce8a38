"""Non-finite values stay in their token (issue 15, cases 3 and 4).

- moe_mlp: a NaN / Inf in one token's hidden row, or in one row of grad_out, reaches
  that token's output and d hidden row only (and, as in torch, the weight gradients,
  which sum over tokens).
- moe_route: NaN, +inf and all -inf logits give NaN weights for that token and ids
  that exist (the top-k of its finite scores, ties to lower ids).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import nki_kernels  # noqa: F401  (registers torch.ops.nki.*)

NAN, INF = float("nan"), float("inf")


def _moe_inputs(t: int, h: int, e: int, i: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    lg = torch.randn(t, e, generator=g)
    wg = torch.randn(e, h, 2 * i, generator=g) * 0.1
    wd = torch.randn(e, i, h, generator=g) * 0.1
    return x, lg, wg, wd


def _bad_rows(t: torch.Tensor) -> list[int]:
    return (~torch.isfinite(t)).any(dim=1).nonzero().flatten().tolist()


@pytest.mark.parametrize("bad", [NAN, INF])
@pytest.mark.parametrize("top_k", [1, 2])
def test_moe_mlp_nonfinite_token_stays_in_its_row(bad: float, top_k: int) -> None:
    x, lg, wg, wd = _moe_inputs(300, 64, 4, 32)
    x[3, 0] = bad
    x.requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = torch.ops.nki.moe_mlp(x, lg, wg, wd, top_k=top_k)
        assert _bad_rows(y) == [3]
        g = torch.randn(300, 64, generator=torch.Generator().manual_seed(1))
        g[5, 1] = bad
        y.backward(g)
    assert _bad_rows(x.grad) == [3, 5]
    clean = x.detach().clone()
    clean[3] = 0.0
    clean.requires_grad_(True)
    g_clean = g.clone()
    g_clean[5] = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y_clean = torch.ops.nki.moe_mlp(clean, lg, wg, wd, top_k=top_k)
        y_clean.backward(g_clean)
    keep = [r for r in range(300) if r not in (3, 5)]
    torch.testing.assert_close(y[keep], y_clean[keep], atol=0.0, rtol=0.0)
    torch.testing.assert_close(x.grad[keep], clean.grad[keep], atol=0.0, rtol=0.0)


def test_moe_mlp_nonfinite_logits_stay_in_their_row() -> None:
    x, lg, wg, wd = _moe_inputs(140, 32, 4, 16, seed=2)
    lg[7, 1] = NAN
    lg[130, 2] = INF
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = torch.ops.nki.moe_mlp(x, lg, wg, wd, top_k=2)
    assert _bad_rows(y) == [7, 130]


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("e", [4, 12])
def test_moe_route_nonfinite_logits(scoring: str, renormalize: bool, e: int) -> None:
    g = torch.Generator().manual_seed(e)
    lg = torch.randn(6, e, generator=g)
    lg[0, 1] = NAN
    lg[1, 2] = INF
    lg[2] = -INF
    lg[3, 0] = -INF  # one -inf logit is an ordinary (zero-probability) score
    w, ids = torch.ops.nki.moe_route(lg, top_k=2, scoring=scoring, renormalize=renormalize)
    assert int(ids.min()) >= 0 and int(ids.max()) < e, ids
    for row in range(6):
        assert len(set(ids[row].tolist())) == 2, f"row {row}: repeated ids {ids[row]}"
    ref = torch.softmax(lg, dim=1) if scoring == "softmax" else torch.sigmoid(lg)
    bad_ref = torch.isnan(ref).any(dim=1)
    if renormalize:
        top = ref.topk(2, dim=1).values
        bad_ref |= ~torch.isfinite(top / top.sum(dim=1, keepdim=True)).all(dim=1)
    assert torch.isnan(w).all(dim=1).tolist() == bad_ref.tolist()
    finite = ~bad_ref
    ref_w = ref[finite].topk(2, dim=1).values
    # ties (an all -inf sigmoid row scores 0 everywhere) may pick either id: compare scores
    torch.testing.assert_close(ref[finite].gather(1, ids[finite].long()), ref_w)
    if renormalize:
        ref_w = ref_w / ref_w.sum(dim=1, keepdim=True)
    torch.testing.assert_close(w[finite], ref_w, atol=1e-6, rtol=1e-6)
    # a NaN score is never selected: the selection is over the finite scores
    if scoring == "sigmoid":
        assert 1 not in ids[0].tolist()


@pytest.mark.parametrize("bad", [NAN, INF])
def test_nan_token_of_one_expert_leaves_the_other_experts_weight_gradients_finite(
    bad: float,
) -> None:
    """Issue 31: a NaN token routed to expert 0 only made experts 1 and 2's weight
    gradients NaN (the on-chip sum restarted at an expert's first block by multiplying the
    previous expert's sum by 0). torch: only expert 0's gradients are non-finite."""
    t, h, e, i = 200, 32, 4, 24
    x, lg, wg, wd = _moe_inputs(t, h, e, i, seed=3)
    lg[:, 0] = -10.0
    lg[7] = torch.tensor([10.0, -10.0, -10.0, -10.0])  # token 7: expert 0 only
    x[7, 4] = bad
    wg.requires_grad_(True)
    wd.requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = torch.ops.nki.moe_mlp(x, lg, wg, wd, top_k=1)
        y.backward(torch.ones_like(y))
    assert wg.grad is not None and wd.grad is not None
    assert not torch.isfinite(wg.grad[0]).all()
    assert torch.isfinite(wg.grad[1:]).all() and torch.isfinite(wd.grad[1:]).all()
    ids = lg.argmax(dim=1)
    xr, wgr, wdr = x.clone(), wg.detach().clone(), wd.detach().clone()
    xr[7] = 0.0
    wgr.requires_grad_(True)
    wdr.requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yr = torch.ops.nki.moe_mlp(xr, lg, wgr, wdr, top_k=1)
        yr.backward(torch.ones_like(yr))
    assert wgr.grad is not None and wdr.grad is not None
    used = sorted(set(ids.tolist()) - {0})
    assert used, "the routing should reach experts other than 0"
    for ex in used:  # the other experts' gradients are those of the clean batch
        torch.testing.assert_close(wg.grad[ex], wgr.grad[ex], atol=0.0, rtol=0.0)
        torch.testing.assert_close(wd.grad[ex], wdr.grad[ex], atol=0.0, rtol=0.0)
