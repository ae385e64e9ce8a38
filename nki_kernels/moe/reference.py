"""fp32 PyTorch reference of the MoE layer: a plain loop over experts, written for clarity.

This is the specification the NKI kernels are tested against (forward through torch
autograd for the backward). Every input is upcast to fp32 and every product is fp32.

Routing (`route_reference`):
- scores = softmax(logits) over the E experts, or sigmoid(logits) element-wise;
- top-k: the k highest scores of each token in descending order; equal scores go to the
  lower expert index first (a stable sort), which is what max8 + nc_find_index8 give;
- weights = the selected scores, divided by their sum when `renormalize`.

Capacity (`capacity_keep`, only when `capacity_factor` is given):
- capacity C = max(1, ceil(capacity_factor * T * k / E)) assignments per expert;
- each expert keeps its first C assignments in priority order (choice rank j, then token
  index t): every token's first choice is served before any second choice, and among equal
  ranks the earlier token wins. Dropped assignments contribute nothing to the output; the
  kept weights are not renormalized again.

Expert MLP (SwiGLU): y_e(x) = (silu(x @ Wg_e) * (x @ Wu_e)) @ Wd_e with
Wg_e = w_gate_up[e, :, :I], Wu_e = w_gate_up[e, :, I:], Wd_e = w_down[e];
out[t] = sum over kept j of weights[t, j] * y_{ids[t, j]}(hidden[t]).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class MoERouting:
    """The MoE layer's routing options: the keyword arguments of `torch.ops.nki.moe_mlp`,
    `nn.MoE` and `moe_reference` (one definition; defaults as documented above)."""

    top_k: int
    renormalize: bool = True
    scoring: str = "softmax"
    capacity_factor: float | None = None

    def kwargs(self) -> dict[str, Any]:
        """{'top_k': ..., 'renormalize': ..., 'scoring': ..., 'capacity_factor': ...}."""
        return asdict(self)


def capacity(num_tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Assignments an expert can take: max(1, ceil(capacity_factor * T * k / E))."""
    return max(1, math.ceil(capacity_factor * num_tokens * top_k / num_experts))


def route_reference(
    logits: Tensor, top_k: int, scoring: str = "softmax", renormalize: bool = True
) -> tuple[Tensor, Tensor]:
    """(weights [T, k] fp32, ids [T, k] int64) of the router, differentiable in `logits`."""
    lf = logits.to(torch.float32)
    scores = torch.softmax(lf, dim=-1) if scoring == "softmax" else torch.sigmoid(lf)
    order = torch.sort(scores.detach(), dim=-1, descending=True, stable=True).indices
    ids = order[:, :top_k]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def capacity_keep(ids: Tensor, num_experts: int, cap: int | None) -> Tensor:
    """[T, k] bool: which assignments survive the per-expert capacity (all when cap is None)."""
    keep = torch.ones(ids.shape, dtype=torch.bool)
    if cap is None:
        return keep
    used = [0] * num_experts
    t_count, k = ids.shape
    for j in range(k):
        for t in range(t_count):
            e = int(ids[t, j])
            keep[t, j] = used[e] < cap
            used[e] += 1
    return keep


def expert_mlp_reference(x: Tensor, w_gate_up: Tensor, w_down: Tensor, e: int) -> Tensor:
    """SwiGLU expert e on rows x [n, H] in fp32: (silu(x Wg) * (x Wu)) Wd."""
    inter = w_gate_up.shape[-1] // 2
    xf = x.to(torch.float32)
    gate = xf @ w_gate_up[e, :, :inter].to(torch.float32)
    up = xf @ w_gate_up[e, :, inter:].to(torch.float32)
    return (F.silu(gate) * up) @ w_down[e].to(torch.float32)


def moe_reference(
    hidden: Tensor,
    router_logits: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    top_k: int,
    **opts: Any,
) -> Tensor:
    """The MoE layer's output [T, H] in fp32 (differentiable in every float input).

    `opts`: the other `MoERouting` fields (renormalize, scoring, capacity_factor).
    """
    r = MoERouting(top_k, **opts)
    t_count, h = hidden.shape
    num_experts = router_logits.shape[1]
    weights, ids = route_reference(router_logits, top_k, r.scoring, r.renormalize)
    cf = r.capacity_factor
    cap = None if cf is None else capacity(t_count, num_experts, top_k, cf)
    keep = capacity_keep(ids, num_experts, cap)
    out = torch.zeros(t_count, h, dtype=torch.float32)
    for e in range(num_experts):
        sel = ((ids == e) & keep).nonzero()
        if sel.numel() == 0:
            continue
        tok, slot = sel[:, 0], sel[:, 1]
        y = expert_mlp_reference(hidden[tok], w_gate_up, w_down, e)
        out = out.index_add(0, tok, y * weights[tok, slot].unsqueeze(1))
    return out
