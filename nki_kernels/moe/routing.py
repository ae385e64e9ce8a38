"""Router variants of the MoE models in use (2026).

`route(logits, top_k=..., ...)` -> (weights [T, k] fp32, ids [T, k] int64), the input of
`torch.ops.nki.moe_experts`, runs on the NKI router kernel (`torch.ops.nki.
moe_route_options`, `moe/router_options.py`; forward and backward), on every device;
`route_reference` is the same routing as differentiable torch code (the specification
the kernel is tested against). Options (each model's setting in `ROUTERS`):

- scoring: "softmax" over the E experts, or "sigmoid" per expert;
- softmax_after_topk: select on the logits, then softmax over the k selected (GPT-OSS;
  scoring "softmax", no groups: other combinations are refused, naming the argument);
- bias [E]: added to the scores for *selection only* (DeepSeek-V3's
  e_score_correction_bias); the weights are the unbiased scores of the selected experts;
- n_group / topk_group: group-limited top-k (DeepSeek-V3): experts form n_group equal
  groups, a group's score is the sum of its two best (biased) scores, only the topk_group
  best groups are eligible;
- renormalize: divide the k weights by their sum (DeepSeek-V3 adds 1e-20 to the sum);
- scaling: routed scaling factor, multiplies the final weights.

Selection keys (both implementations): a NaN key counts as -FLT_MAX, the lowest finite
fp32 value, everywhere it is compared -- in the top-k and in a group's top-2 sum (fp32) --
and an expert outside the kept groups ranks below every eligible one. So a NaN score is
picked only when fewer than k eligible non-NaN keys remain, and a group holding a NaN is
ranked on its two best keys (the NaN counting only when it is one of them). Ties go to
the lower expert (and group) index (a stable descending sort). transformers' routers
(torch.topk) differ on two kinds of token only. Ties: torch.topk leaves the order of
tied values unspecified (on CPU an all-equal row of 8 experts gives index 6 for k = 1),
so on a token with tied keys (or tied group scores) the ids can differ from theirs.
NaN: torch.topk ranks NaN first, in a group's top-2 and among the groups too, so on a
token with a NaN score the ids can differ from theirs; the weights are the selected
scores as ever: with softmax scoring a NaN logit makes the whole row's scores and so its
k weights NaN; with sigmoid only the NaN expert's score is NaN, so the row's weights are
NaN when that expert is picked (renormalization then spreads it over the row) and
finite otherwise. Either way no other token changes. The kernel also clamps its keys to
[-FLT_MAX, FLT_MAX] when they can be infinite (a bias, or keys on the logits), so there
a +-inf key ties with +-FLT_MAX, where the reference
keeps them apart; nothing else differs. Up to 512 experts, k <= 16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

MAX_EXPERTS, MAX_TOP_K = 512, 16
FLT_MAX = torch.finfo(torch.float32).max  # a NaN selection key counts as -FLT_MAX
SCORINGS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class Router:
    """One model family's routing options (the keyword arguments of `route`)."""

    top_k: int
    scoring: str = "softmax"
    softmax_after_topk: bool = False
    n_group: int | None = None
    topk_group: int | None = None
    renormalize: bool = True
    scaling: float = 1.0


ROUTERS = {
    "mixtral": Router(top_k=2),
    "qwen3-moe": Router(top_k=8),
    "deepseek-v3": Router(top_k=8, scoring="sigmoid", n_group=8, topk_group=4, scaling=2.5),
    "gpt-oss": Router(top_k=4, softmax_after_topk=True, renormalize=False),
}


def _check(
    logits: Tensor,
    top_k: int,
    scoring: str,
    bias: Tensor | None,
    groups: tuple,
    softmax_after_topk: bool = False,
) -> None:
    if not isinstance(logits, Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits: expected a float tensor [T, E]; got {logits!r:.80}")
    e = logits.shape[1]
    if not 1 <= e <= MAX_EXPERTS:
        raise ValueError(f"logits: expected E (dim 1) in 1..{MAX_EXPERTS}; got {e}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= min(e, MAX_TOP_K):
        raise ValueError(
            f"top_k: expected 1..{min(e, MAX_TOP_K)} (<= E = {e} and <= 16); got {top_k}"
        )
    if scoring not in SCORINGS:
        raise ValueError(f"scoring: expected one of {SCORINGS}; got {scoring!r}")
    if softmax_after_topk and scoring != "softmax":
        raise ValueError(
            f"scoring: expected 'softmax' with softmax_after_topk=True (the k selected "
            f"logits are softmaxed); got {scoring!r}"
        )
    if softmax_after_topk and groups != (None, None):
        raise ValueError(
            f"n_group / topk_group: expected none with softmax_after_topk=True (group-limited "
            f"top-k ranks groups by their scores); got {groups[0]} / {groups[1]}"
        )
    if bias is not None and not isinstance(bias, Tensor):
        raise TypeError(
            f"bias: expected a tensor of shape ({e},) or None; got {type(bias).__name__}"
        )
    if bias is not None and tuple(bias.shape) != (e,):
        raise ValueError(f"bias: expected shape ({e},) (one per expert); got {tuple(bias.shape)}")
    n_group, topk_group = groups
    if (n_group is None) != (topk_group is None):
        raise ValueError(
            f"n_group / topk_group: give both or neither; got {n_group} / {topk_group}"
        )
    if n_group is not None:
        assert topk_group is not None
        if n_group < 1 or e % n_group:
            raise ValueError(f"n_group: expected a divisor of E = {e}; got {n_group}")
        if not 1 <= topk_group <= n_group or topk_group * (e // n_group) < top_k:
            raise ValueError(
                f"topk_group: expected 1..{n_group} groups holding >= top_k = {top_k} experts; "
                f"got {topk_group}"
            )


def _keys(scores: Tensor) -> Tensor:
    """Selection keys: NaN -> -FLT_MAX (the kernel's select before any comparison)."""
    return torch.where(torch.isnan(scores), torch.full_like(scores, -FLT_MAX), scores)


def _topk(keys: Tensor, k: int, eligible: Tensor | None = None) -> Tensor:
    """ids of the k largest keys, ties to the lower index (a stable descending sort);
    with `eligible`, every ineligible position after every eligible one."""
    order = torch.sort(keys, dim=-1, descending=True, stable=True).indices
    if eligible is not None:  # a second stable sort: eligibility first, then the key order
        rank = eligible.gather(1, order).to(torch.float32)
        order = order.gather(1, torch.sort(rank, dim=-1, descending=True, stable=True).indices)
    return order[:, :k]


def route(
    logits: Tensor,
    *,
    top_k: int,
    scoring: str = "softmax",
    softmax_after_topk: bool = False,
    bias: Tensor | None = None,
    n_group: int | None = None,
    topk_group: int | None = None,
    renormalize: bool = True,
    scaling: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """(weights [T, k] fp32, ids [T, k] int64) on the NKI router (`moe_route_options`);
    differentiable in logits. See the module docstring."""
    _check(logits, top_k, scoring, bias, (n_group, topk_group), softmax_after_topk)
    from ..ops import moe_routing  # noqa: F401  (registers the op; ops sit above moe/)

    weights, ids = torch.ops.nki.moe_route_options(
        logits,
        bias,
        top_k=top_k,
        scoring=scoring,
        softmax_after_topk=softmax_after_topk,
        n_group=n_group or 0,
        topk_group=topk_group or 0,
        renormalize=renormalize,
        scaling=scaling,
    )
    return weights, ids.to(torch.int64)


def route_reference(
    logits: Tensor,
    *,
    top_k: int,
    scoring: str = "softmax",
    softmax_after_topk: bool = False,
    bias: Tensor | None = None,
    n_group: int | None = None,
    topk_group: int | None = None,
    renormalize: bool = True,
    scaling: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """`route` as torch code (autograd for the backward): the kernel's specification."""
    _check(logits, top_k, scoring, bias, (n_group, topk_group), softmax_after_topk)
    lf = logits.to(torch.float32)
    if softmax_after_topk:
        ids = _topk(_keys(lf.detach() if bias is None else lf.detach() + bias.float()), top_k)
        weights = torch.softmax(lf.gather(1, ids), dim=-1)
    else:
        scores = torch.softmax(lf, dim=-1) if scoring == "softmax" else torch.sigmoid(lf)
        keys = _keys(scores.detach() if bias is None else scores.detach() + bias.float())
        eligible = None
        if n_group is not None:
            assert topk_group is not None
            t, e = keys.shape
            grouped = keys.view(t, n_group, e // n_group)
            best2 = torch.sort(grouped, dim=-1, descending=True).values[..., : min(2, e // n_group)]
            group_score = best2.sum(-1)  # fp32: two NaN keys (-FLT_MAX each) give -inf
            keep_groups = _topk(_keys(group_score), topk_group)
            eligible = torch.zeros(t, n_group, dtype=torch.bool, device=lf.device)
            eligible.scatter_(1, keep_groups, True)
            eligible = eligible.unsqueeze(-1).expand(t, n_group, e // n_group).reshape(t, e)
        ids = _topk(keys, top_k, eligible)
        weights = scores.gather(1, ids)
    if renormalize and not softmax_after_topk:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    if scaling != 1.0:
        weights = weights * scaling
    return weights, ids
