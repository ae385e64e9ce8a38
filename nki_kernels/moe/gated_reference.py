"""Reference of `moe_gated_experts` (torch, any dtype; tests run it in float64): a plain
loop over tokens and their k experts, written for clarity."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def activate(z: Tensor, activation: str, interleaved: bool, alpha: float, limit: float) -> Tensor:
    """The gated activation of the pre-activations z [..., 2I] -> [..., I]."""
    i = z.shape[-1] // 2
    gate, up = (z[..., 0::2], z[..., 1::2]) if interleaved else (z[..., :i], z[..., i:])
    if activation == "swiglu":
        return F.silu(gate) * up
    if activation == "geglu":
        return F.gelu(gate) * up
    if activation == "gpt_oss":  # transformers' GptOssExperts._apply_gate
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))
    raise ValueError(f"activation: {activation!r}")


def gated_experts_reference(
    hidden: Tensor,
    weights: Tensor,
    ids: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    *,
    b_gate_up: Tensor | None = None,
    b_down: Tensor | None = None,
    activation: str = "swiglu",
    interleaved: bool = False,
    alpha: float = 1.702,
    limit: float = 7.0,
    shared_gate_up: Tensor | None = None,
    shared_down: Tensor | None = None,
    shared_gate: Tensor | None = None,
) -> Tensor:
    """out[t] = sum_j w[t, j] expert_{ids[t, j]}(x_t) + gate_t * shared(x_t); a slot with
    id E (not on this rank) is skipped."""
    o: Any = (activation, interleaved, alpha, limit)
    rows = []
    for t in range(hidden.shape[0]):
        acc = torch.zeros(w_down.shape[2], dtype=hidden.dtype)
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e == w_gate_up.shape[0]:  # not on this rank: no contribution
                continue
            z = hidden[t] @ w_gate_up[e]
            if b_gate_up is not None:
                z = z + b_gate_up[e]
            y = activate(z, *o) @ w_down[e]
            if b_down is not None:
                y = y + b_down[e]
            acc = acc + weights[t, j] * y
        if shared_gate_up is not None and shared_down is not None:
            s = activate(hidden[t] @ shared_gate_up, *o) @ shared_down
            if shared_gate is not None:
                s = torch.sigmoid(hidden[t] @ shared_gate.reshape(-1)) * s
            acc = acc + s
        rows.append(acc)
    return torch.stack(rows)
