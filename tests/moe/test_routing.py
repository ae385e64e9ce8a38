"""moe.routing.route: every router option against float64 references written from the
models' definitions (transformers' DeepSeek-V3, Qwen3-MoE, GPT-OSS routers), forward and
backward, ties, NaN, and composed with torch.ops.nki.moe_experts."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import nki_kernels.ops.moe_experts  # noqa: F401
from nki_kernels.moe.routing import ROUTERS, route

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)


def _by_id(w: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows sorted by expert id (references built on unsorted top-k)."""
    order = ids.argsort(dim=-1)
    return w.gather(1, order), ids.gather(1, order)


def deepseek_reference(lg: Any, bias: Any, k: int, n_group: int, topk_group: int, scale: float):
    scores = lg.double().sigmoid()
    choice = scores + bias.double()
    t, e = choice.shape
    gs = choice.view(t, n_group, e // n_group).topk(2, dim=-1)[0].sum(-1)
    gi = gs.topk(topk_group, dim=-1)[1]
    mask = torch.zeros_like(gs).scatter_(1, gi, 1.0).bool()
    mask = mask.unsqueeze(-1).expand(t, n_group, e // n_group).reshape(t, e)
    ids = choice.masked_fill(~mask, float("-inf")).topk(k, dim=-1)[1]
    w = scores.gather(1, ids)
    return w / (w.sum(-1, keepdim=True) + 1e-20) * scale, ids


def softmax_topk_reference(lg: Any, k: int, renorm: bool):
    p = lg.double().softmax(-1)
    w, ids = p.topk(k, dim=-1)
    return (w / w.sum(-1, keepdim=True) if renorm else w), ids


def gpt_oss_reference(lg: Any, k: int):
    v, ids = lg.double().topk(k, dim=-1)
    return v.softmax(-1), ids


CASES = {
    "deepseek-v3": (
        dict(top_k=4, scoring="sigmoid", n_group=4, topk_group=2, scaling=2.5),
        lambda lg, b: deepseek_reference(lg, b, 4, 4, 2, 2.5),
    ),
    "qwen3-moe": (dict(top_k=3), lambda lg, b: softmax_topk_reference(lg, 3, True)),
    "qwen3-moe-no-renorm": (
        dict(top_k=3, renormalize=False),
        lambda lg, b: softmax_topk_reference(lg, 3, False),
    ),
    "gpt-oss": (
        dict(top_k=4, softmax_after_topk=True, renormalize=False),
        lambda lg, b: gpt_oss_reference(lg, 4),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_backward_match_the_float64_reference(name: str) -> None:
    opts, ref_fn = CASES[name]
    g = torch.Generator().manual_seed(0)
    lg = torch.randn(33, 16, generator=g)
    bias = torch.randn(16, generator=g) * 0.3 if "deepseek" in name else None
    lf = lg.clone().requires_grad_()
    w, ids = route(lf, bias=bias, **opts)
    lr = lg.double().requires_grad_()
    wr, idr = ref_fn(lr, bias if bias is not None else torch.zeros(16))
    w_s, ids_s = _by_id(w, ids)
    wr_s, idr_s = _by_id(wr, idr)
    assert torch.equal(ids_s, idr_s)
    torch.testing.assert_close(w_s.double(), wr_s.detach(), atol=1e-6, rtol=1e-6)
    gw = torch.randn(w.shape, generator=g)
    (w_s * gw).sum().backward()
    (wr_s * gw.double()).sum().backward()
    assert lf.grad is not None and lr.grad is not None
    torch.testing.assert_close(lf.grad.double(), lr.grad, atol=1e-6, rtol=1e-5)


def test_bias_selects_but_does_not_weigh() -> None:
    lg = torch.zeros(1, 8)
    bias = torch.tensor([0.0, 0, 0, 0, 0, 0, 1.0, 0])
    w, ids = route(lg, top_k=2, scoring="sigmoid", bias=bias, renormalize=False)
    assert ids.tolist() == [[6, 0]]  # the bias picks 6; the tie after it goes to 0
    assert torch.equal(w, torch.full((1, 2), 0.5))  # sigmoid(0), unbiased


def test_ties_go_to_the_lower_expert_and_nan_is_never_selected() -> None:
    lg = torch.zeros(2, 10)
    lg[1, 0] = float("nan")
    _, ids = route(lg, top_k=3)
    assert ids[0].tolist() == [0, 1, 2]
    _, ids = route(lg, top_k=3, scoring="sigmoid")
    assert ids[1].tolist() == [1, 2, 3]


def test_group_limited_top_k_keeps_only_the_best_groups() -> None:
    lg = torch.full((1, 16), -4.0)
    lg[0, 12:14] = torch.tensor([3.0, 2.9])  # group 3: the best pair
    lg[0, 0] = 2.5  # group 0: one good expert (pair sum sigmoid(2.5) + sigmoid(-4))
    lg[0, 5] = 2.0
    lg[0, 6] = 1.9  # group 1: two good experts, a larger pair sum than group 0
    _, ids = route(lg, top_k=4, scoring="sigmoid", n_group=4, topk_group=2)
    assert sorted(ids[0].tolist()) == [5, 6, 12, 13]  # groups 1 and 3: expert 0 is out
    _, ids = route(lg, top_k=4, scoring="sigmoid")
    assert sorted(ids[0].tolist()) == [0, 5, 12, 13]  # without the group limit


def test_limits_and_bad_options_name_the_argument() -> None:
    lg = torch.randn(3, 512)
    _, ids = route(lg, top_k=16)
    assert ids.shape == (3, 16) and int(ids.max()) < 512
    with pytest.raises(ValueError, match=r"top_k: expected 1\.\.16"):
        route(lg, top_k=17)
    with pytest.raises(ValueError, match="n_group: expected a divisor"):
        route(torch.randn(3, 10), top_k=2, n_group=3, topk_group=1)
    with pytest.raises(ValueError, match="bias: expected shape"):
        route(torch.randn(3, 8), top_k=2, bias=torch.zeros(7))
    with pytest.raises(ValueError, match="logits: expected E"):
        route(torch.randn(3, 513), top_k=2)


def test_deepseek_routing_into_the_expert_kernels() -> None:
    """route + moe_experts against the float64 routing and expert loop, with gradients
    for the router logits through the routing weights."""
    g = torch.Generator().manual_seed(1)
    t, h, i, e = 30, 16, 24, 16
    x = torch.randn(t, h, generator=g)
    lg = torch.randn(t, e, generator=g)
    bias = torch.randn(e, generator=g) * 0.2
    wgu = torch.randn(e, h, 2 * i, generator=g) / h**0.5
    wd = torch.randn(e, i, h, generator=g) / i**0.5
    opts = ROUTERS["deepseek-v3"]
    kw = dict(top_k=4, scoring=opts.scoring, n_group=4, topk_group=2, scaling=opts.scaling)
    lf = lg.clone().requires_grad_()
    w, ids = route(lf, bias=bias, **kw)
    out = torch.ops.nki.moe_experts(x, w, ids, wgu, wd)
    out.sum().backward()
    lr = lg.double().requires_grad_()
    wr, idr = deepseek_reference(lr, bias, 4, 4, 2, 2.5)
    ref = torch.zeros(t, h, dtype=torch.float64)
    for tt in range(t):
        for j in range(4):
            ex = int(idr[tt, j])
            gu = x[tt].double() @ wgu[ex].double()
            act = torch.nn.functional.silu(gu[:i]) * gu[i:]
            ref[tt] = ref[tt] + wr[tt, j] * (act @ wd[ex].double())
    ref.sum().backward()
    torch.testing.assert_close(out.double(), ref.detach(), atol=2e-5, rtol=1e-4)
    assert lf.grad is not None and lr.grad is not None
    torch.testing.assert_close(lf.grad.double(), lr.grad, atol=2e-5, rtol=1e-4)
