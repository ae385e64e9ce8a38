"""The decode mode of `moe_mlp` / `moe_experts`: decode-sized batches (T <= 64 tokens,
dropless) through two grouped matmul launches (`torch.ops.nki.grouped_mm`'s kernel)
instead of the blockwise kernel.

At decode sizes an MoE layer is bound by streaming the touched experts' weights: each
touched expert has a few rows, so what matters is that its weights are read once, in
long contiguous runs, and that untouched experts cost nothing. The grouped matmul does
exactly that: its row plan (`moe/group_plan.py`) gives every non-empty expert one
128-row block (empty experts get none), each block streams its expert's weights once in
units up to 2048 columns wide, and under LNC 2 the two programs take alternate blocks,
so the touched experts' weights are split over both cores. The steps:

    order  = the T*k assignments sorted by expert (stable: token order within an expert)
    x_s    = hidden[token of each assignment]           [T*k, H]
    offs   = cumulative assignments per expert          [E] int32
    gu     = grouped_mm(x_s, w_gate_up, offs)           [T*k, 2I]   NKI
    act    = silu(gate) * up, rounded to the dtype      [T*k, I]
    y      = grouped_mm(act, w_down, offs)              [T*k, H]    NKI
    out[t] = sum_j weights[t, j] * y[slot of (t, j)]    fp32 sums, one rounding

The gather, the activation and the combine are torch ops on T*k rows (a few hundred
KiB at most); a NaN / Inf in a token's row or weights stays in that token's output row
(each y row is one assignment's, and the combine adds only a token's own rows).
Shapes depend on (T, k, E, H, I) only, so the mode traces under `torch.compile`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .grouped_mm import grouped_mm_forward

DECODE_MAX_TOKENS = 64  # batches up to this many tokens (and dropless) take the decode mode


def use_decode_mode(tokens: int, capacity_factor: float | None) -> bool:
    """True when a call of `tokens` tokens runs the decode mode (dropless only: the
    capacity order is the blockwise plan's)."""
    return tokens <= DECODE_MAX_TOKENS and capacity_factor is None


def decode_experts(
    hidden: Tensor, weights: Tensor, ids: Tensor, w_gate_up: Tensor, w_down: Tensor
) -> Tensor:
    """out [T, H] (hidden's dtype) = sum_j weights[:, j] * SwiGLU expert ids[:, j] of hidden
    (module docstring); weights [T, k] float, ids [T, k] int in [0, E)."""
    k = ids.shape[1]
    e, _, i2 = w_gate_up.shape
    flat = ids.reshape(-1).to(torch.int64)
    order = torch.argsort(flat, stable=True)
    token = torch.div(order, k, rounding_mode="floor")
    counts = torch.zeros(e, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    x_sorted = hidden.index_select(0, token)
    gu = grouped_mm_forward(x_sorted, w_gate_up, offs)
    gate, up = gu[:, : i2 // 2].float(), gu[:, i2 // 2 :].float()
    act = (F.silu(gate) * up).to(hidden.dtype)
    y = grouped_mm_forward(act, w_down, offs)
    w_sorted = weights.reshape(-1).to(torch.float32).index_select(0, order)
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    out.index_add_(0, token, y.float() * w_sorted.unsqueeze(1))
    return out.to(hidden.dtype)
