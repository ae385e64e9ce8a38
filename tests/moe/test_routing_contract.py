"""moe.routing.route (the NKI router) against float64 references transcribed from
transformers 5.25.0's own routers -- DeepseekV3TopkRouter, Qwen3MoeTopKRouter (Qwen2-MoE's
is the same), GptOssTopKRouter -- on configurations beside test_routing_options.py's:
n_group = 1, topk_group = n_group, a group of one expert, k = E, k = 16 on 512 experts,
renormalization off, negative and zero scaling, fp16 / bf16 logits; forward and backward.

torch.topk leaves the order of tied values unspecified (transformers' routers call it):
the references select with a stable descending sort (ties to the lower index, ours) and
the tie test pins that rule on rows where torch.topk itself picks otherwise. Option
combinations no model uses and no definition covers are refused by name."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nki_kernels.moe.routing import route, route_reference

F64 = torch.float64


def _topk(keys: torch.Tensor, k: int) -> torch.Tensor:
    """torch.topk's indices, ties to the lower index."""
    return torch.sort(keys, dim=-1, descending=True, stable=True).indices[..., :k]


def deepseek_v3(lg: torch.Tensor, bias: torch.Tensor, c: dict[str, Any]) -> tuple[Any, Any]:
    """DeepseekV3TopkRouter.forward after its linear, in float64."""
    scores = lg.sigmoid()
    choice = scores + bias
    t, e, n = lg.shape[0], lg.shape[1], c["n_group"]
    group_scores = torch.sort(choice.view(t, n, e // n), -1, descending=True).values[..., :2]
    group_idx = _topk(group_scores.sum(-1), c["topk_group"])
    group_mask = torch.zeros(t, n, dtype=F64).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(t, n, e // n).reshape(t, e)
    choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
    ids = _topk(choice, c["top_k"])
    w = scores.gather(1, ids)
    if c["norm_topk_prob"]:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return w * c["routed_scaling_factor"], ids


def qwen3_moe(lg: torch.Tensor, c: dict[str, Any]) -> tuple[Any, Any]:
    """Qwen3MoeTopKRouter.forward after its linear, in float64."""
    probs = torch.softmax(lg, dim=-1)
    ids = _topk(probs, c["top_k"])
    w = probs.gather(1, ids)
    if c["norm_topk_prob"]:
        w = w / w.sum(-1, keepdim=True)
    return w, ids


def gpt_oss(lg: torch.Tensor, c: dict[str, Any]) -> tuple[Any, Any]:
    """GptOssTopKRouter.forward after its linear (the router bias is in the logits)."""
    ids = _topk(lg, c["top_k"])
    return torch.softmax(lg.gather(1, ids), dim=1), ids


# (model, E, config): configurations the existing tests do not use
CASES: dict[str, tuple[str, int, dict[str, Any]]] = {
    "dsv3-one-group": (
        "deepseek-v3",
        24,
        dict(top_k=5, n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0),
    ),
    "dsv3-all-groups-kept": (
        "deepseek-v3",
        32,
        dict(top_k=6, n_group=4, topk_group=4, norm_topk_prob=True, routed_scaling_factor=2.5),
    ),
    "dsv3-no-renorm-k-fills-groups": (
        "deepseek-v3",
        36,
        dict(top_k=8, n_group=9, topk_group=2, norm_topk_prob=False, routed_scaling_factor=1.8),
    ),
    "dsv3-512-k16": (
        "deepseek-v3",
        512,
        dict(top_k=16, n_group=16, topk_group=5, norm_topk_prob=True, routed_scaling_factor=2.5),
    ),
    "dsv3-k-equals-E": (
        "deepseek-v3",
        12,
        dict(top_k=12, n_group=3, topk_group=3, norm_topk_prob=True, routed_scaling_factor=0.5),
    ),
    "qwen3-k-equals-E-no-renorm": ("qwen3-moe", 10, dict(top_k=10, norm_topk_prob=False)),
    "qwen3-60-k4-renorm": ("qwen3-moe", 60, dict(top_k=4, norm_topk_prob=True)),
    "qwen3-256-k16": ("qwen3-moe", 256, dict(top_k=16, norm_topk_prob=True)),
    "gpt-oss-k1": ("gpt-oss", 32, dict(top_k=1)),
    "gpt-oss-128-k16": ("gpt-oss", 128, dict(top_k=16)),
    "gpt-oss-k-equals-E": ("gpt-oss", 9, dict(top_k=9)),
}


def _route_kwargs(model: str, c: dict[str, Any]) -> dict[str, Any]:
    if model == "deepseek-v3":
        return dict(
            top_k=c["top_k"],
            scoring="sigmoid",
            n_group=c["n_group"],
            topk_group=c["topk_group"],
            renormalize=c["norm_topk_prob"],
            scaling=c["routed_scaling_factor"],
        )
    if model == "qwen3-moe":
        return dict(top_k=c["top_k"], renormalize=c["norm_topk_prob"])
    return dict(top_k=c["top_k"], softmax_after_topk=True, renormalize=False)


def _hf(model: str, lg: torch.Tensor, bias: torch.Tensor, c: dict[str, Any]) -> tuple[Any, Any]:
    if model == "deepseek-v3":
        return deepseek_v3(lg, bias, c)
    return qwen3_moe(lg, c) if model == "qwen3-moe" else gpt_oss(lg, c)


def _inputs(e: int, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, e, generator=g) * 2, torch.randn(e, generator=g) * 0.05


def _check(
    name: str, fn: Any, t: int = 11, dtype: torch.dtype = torch.float32, seed: int = 0
) -> None:
    model, e, c = CASES[name]
    lg, bias = _inputs(e, t, seed)
    lg = lg.to(dtype)
    kw = _route_kwargs(model, c)
    if model == "deepseek-v3":
        kw["bias"] = bias
    lf = lg.clone().requires_grad_()
    w, ids = fn(lf, **kw)
    lr = lg.double().requires_grad_()
    wr, idr = _hf(model, lr, bias.double(), c)
    # ids in the same order (descending selection key, ties to the lower index)
    assert torch.equal(ids.long(), idr), f"{name}: ids differ from transformers' routing"
    assert w.dtype == torch.float32
    torch.testing.assert_close(w.double(), wr.detach(), atol=2e-7, rtol=1e-6)
    dw = torch.randn(w.shape, generator=torch.Generator().manual_seed(seed + 1))
    (w * dw).sum().backward()
    (wr * dw.double()).sum().backward()
    assert lf.grad is not None and lr.grad is not None and lf.grad.dtype == dtype
    tol = {torch.float32: 1e-6, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-10}[dtype]
    torch.testing.assert_close(lf.grad.double(), lr.grad, atol=tol, rtol=tol * 4)


@pytest.mark.parametrize("impl", [route, route_reference], ids=["nki", "torch"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_transformers_routers(name: str, impl: Any) -> None:
    _check(name, impl)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["dsv3-all-groups-kept", "qwen3-60-k4-renorm", "gpt-oss-k1"])
def test_16_bit_logits(name: str, dtype: torch.dtype) -> None:
    _check(name, route, t=7, dtype=dtype, seed=3)


@pytest.mark.parametrize("scaling", [0.0, -1.5])
def test_zero_and_negative_scaling(scaling: float) -> None:
    lg, bias = _inputs(16, 9, seed=5)
    kw = dict(top_k=3, scoring="sigmoid", bias=bias, n_group=4, topk_group=2)
    lf, lr = lg.clone().requires_grad_(), lg.clone().requires_grad_()
    w, ids = route(lf, scaling=scaling, **kw)
    wr, idr = route_reference(lr, scaling=scaling, **kw)
    assert torch.equal(ids, idr)
    torch.testing.assert_close(w, wr, atol=1e-7, rtol=1e-6)
    w.sum().backward()
    wr.sum().backward()
    assert lf.grad is not None and lr.grad is not None
    torch.testing.assert_close(lf.grad, lr.grad, atol=1e-7, rtol=1e-6)


def test_ties_go_to_the_lower_index_where_torch_topk_picks_otherwise() -> None:
    e = 8
    lg = torch.zeros(3, e)
    lg[1, [2, 5]] = 1.0  # a tie between two of the best
    lg[2] = torch.tensor([0.0, 3.0, 1.0, 3.0, 3.0, 1.0, 1.0, 0.5])
    _, theirs = torch.topk(lg[0:1], 1)  # torch.topk does not take the lower index here
    assert int(theirs) != 0, "torch.topk now breaks this tie by index: update the docs"
    plain = dict(top_k=3)
    # groups of 2: row 2's groups 1 and 2 tie on their top-2 sums and are both kept
    grouped = dict(top_k=3, scoring="sigmoid", n_group=4, topk_group=2)
    for kw, row2 in ((plain, [1, 3, 4]), (grouped, [3, 4, 2])):
        _, ids = route(lg, **kw)
        _, idr = route_reference(lg, **kw)
        assert torch.equal(ids, idr)
        assert ids[0].tolist() == [0, 1, 2]
        assert ids[2].tolist() == row2
    _, ids = route(lg, top_k=2)
    assert ids[1].tolist() == [2, 5]
    # groups tied on their top-2 sums: the lower group wins
    _, ids = route(lg, top_k=2, scoring="sigmoid", n_group=4, topk_group=1)
    assert ids[0].tolist() == [0, 1]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(softmax_after_topk=True, scoring="sigmoid"), r"scoring: expected 'softmax'"),
        (dict(softmax_after_topk=True, n_group=2, topk_group=1), r"n_group / topk_group: "),
    ],
)
@pytest.mark.parametrize("impl", [route, route_reference], ids=["nki", "torch"])
def test_combinations_without_a_definition_are_refused(kw: Any, match: str, impl: Any) -> None:
    """softmax over the k selected logits has no score to apply sigmoid or groups to:
    the kernel grouped the logits where the reference ignored the groups."""
    with pytest.raises(ValueError, match=match):
        impl(torch.randn(4, 16), top_k=2, **kw)
    with pytest.raises(ValueError, match=match):
        torch.ops.nki.moe_route_options(torch.randn(4, 16), None, top_k=2, **kw)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("name", ["dsv3-512-k16", "gpt-oss-128-k16", "qwen3-256-k16"])
def test_a_non_finite_logit_stays_in_its_row(name: str, bad: float) -> None:
    """Other tokens exactly as transformers route them; the token itself gets k distinct
    ids in [0, E) and its gradient stays in its row."""
    model, e, c = CASES[name]
    lg, bias = _inputs(e, 6, seed=9)
    lg[3, 17] = bad
    kw = _route_kwargs(model, c)
    if model == "deepseek-v3":
        kw["bias"] = bias
    lf = lg.clone().requires_grad_()
    w, ids = route(lf, **kw)
    wr, idr = _hf(model, lg.double(), bias.double(), c)
    rows = [0, 1, 2, 4, 5]
    assert torch.equal(ids[rows], idr[rows])
    torch.testing.assert_close(w[rows].double(), wr[rows], atol=2e-7, rtol=1e-6)
    assert len(set(ids[3].tolist())) == c["top_k"] and 0 <= int(ids.min()) <= int(ids.max()) < e
    w.sum().backward()
    assert lf.grad is not None and torch.isfinite(lf.grad[rows]).all()


@pytest.mark.parametrize(("e", "k", "norm"), [(2, 2, False), (60, 8, True), (128, 8, False)])
def test_moe_route_matches_qwen3_and_mixtral_routers(e: int, k: int, norm: bool) -> None:
    """moe_mlp's own router (`torch.ops.nki.moe_route`, softmax top-k): Qwen3-MoE's
    router, and Mixtral's (always renormalized), forward and backward."""
    import nki_kernels.ops.moe  # noqa: F401  (registers moe_route)

    lg, _ = _inputs(e, 13, seed=11)
    lg[5] = lg[5].round()  # ties
    lf = lg.clone().requires_grad_()
    w, ids = torch.ops.nki.moe_route(lf, top_k=k, renormalize=norm, scoring="softmax")
    lr = lg.double().requires_grad_()
    wr, idr = qwen3_moe(lr, dict(top_k=k, norm_topk_prob=norm))
    assert torch.equal(ids.long(), idr)
    torch.testing.assert_close(w.double(), wr.detach(), atol=2e-7, rtol=1e-6)
    dw = torch.randn(w.shape, generator=torch.Generator().manual_seed(12))
    (w * dw).sum().backward()
    (wr * dw.double()).sum().backward()
    assert lf.grad is not None and lr.grad is not None
    torch.testing.assert_close(lf.grad.double(), lr.grad, atol=1e-6, rtol=4e-6)
