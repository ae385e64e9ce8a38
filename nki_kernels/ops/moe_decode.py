"""The decode mode of `moe_mlp` / `moe_experts`: decode-sized batches (T <= 64 tokens,
dropless) through one launch of the decode MoE kernel (`moe/decode_mlp.py`) instead of
the blockwise kernel.

At decode sizes an MoE layer is bound by streaming the touched experts' weights: each
touched expert sees a few tokens, so what matters is that its weights are read once, in
long runs, that untouched experts cost nothing, and that the compute per weight byte
hides under the stream. The kernel runs every touched expert on all T tokens with the
weights as the matmuls' stationary operand (no per-expert gather or transposes), keeps
only the routed tokens' activations (a select), scales them by their routing weights and
sums the experts in fp32 on chip; under LNC 2 the two programs take alternate touched
experts. The host side is bookkeeping on E + 1 ints:

    present  = experts some assignment picks          [E] bool
    experts  = their ids first (stable)               [1, E] int32
    n        = how many                               [1, 1] int32
    out      = moe_decode_fwd(hidden, w_gate_up, w_down, ids, weights, experts, n)

The kernel reads the weights where they lie, chosen here by their strides: w_gate_up
[E, H, 2I] / w_down [E, I, H] row-major, or stored transposed -- [E, 2I, H] / [E, H, I]
storage, as transformers' experts hold them, passed as the `.transpose(1, 2)` views
`moe_mlp` / `moe_experts` take -- read by DMA transposes in the kernel (modeled at 90 %
of the copy rate on trn2: `dma_transpose_hbm_efficiency`); each weight's layout is
decided on its own. The same for the shared expert: [H, 2Is] / [Is, H] or transposed
(nn.Linear's [Is, H] / [H, Is] weights, gate and up as two tensors). Only another
layout (a strided slice, a permuted copy) or another dtype than hidden's is copied, on
each call -- the whole weight set, several times the kernel's own HBM traffic.

A NaN / Inf in a token's row or weights stays in that token's output row (a token is its
own column throughout, and a non-routed token's activation is selected to 0). Shapes
depend on (T, k, E, H, I) only, so the mode traces under `torch.compile`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..moe.decode_mlp import moe_decode_fwd
from ..runtime import launch
from ..targets import get_target

DECODE_MAX_TOKENS = 64  # batches up to this many tokens (and dropless) take the decode mode


def use_decode_mode(tokens: int, capacity_factor: float | None) -> bool:
    """True when a call of `tokens` tokens runs the decode mode (dropless only: the
    capacity order is the blockwise plan's)."""
    return tokens <= DECODE_MAX_TOKENS and capacity_factor is None


def decode_experts(
    hidden: Tensor,
    weights: Tensor,
    ids: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    w_up: Tensor | None = None,
) -> Tensor:
    """out [T, H] (hidden's dtype) = sum_j weights[:, j] * SwiGLU expert ids[:, j] of hidden
    (module docstring); weights [T, k] float, ids [T, k] int in [0, E); `w_up`: the up
    weight apart (w_gate_up then the gate's)."""
    return decode_gated_experts(hidden, weights, ids, w_gate_up, w_down, w_up=w_up)


def decode_gated_experts(
    hidden: Tensor,
    weights: Tensor,
    ids: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    b_gate_up: Tensor | None = None,
    b_down: Tensor | None = None,
    activation: str = "swiglu",
    interleaved: bool = False,
    alpha: float = 1.702,
    limit: float = 7.0,
    shared: tuple[Tensor | None, ...] | None = None,
    w_up: Tensor | None = None,
) -> Tensor:
    """The decode kernel with the expert options of `moe_gated_experts`: biases [E, 2I] /
    [E, H], swiglu / geglu / gpt_oss, interleaved gate/up columns, and `shared` =
    (shared_gate_up [H, 2Is], shared_down [Is, H], shared_gate [H] or None) in the same
    launch: out[t] = sum_j weights[t, j] * (act(x_t W_gu[e] + b_gu[e]) W_d[e] + b_d[e])
    + gate_t * act(x_t S_gu) S_d; a fourth entry of `shared`, shared_up [H, Is], makes the
    first the gate's [H, Is] alone (nn.Linear's weights, `.t()` views, need no stacking).
    Weights reach the kernel without a copy when row-major or transposed views of
    row-major storage (`kernel_layout`). An id E (not on this rank) matches no expert: its
    weight is selected to 0 here, and the kernel never routes the token to it. Forward
    only, detached tensors, T <= 64; the caller checks the arguments."""
    e = w_gate_up.shape[0]
    if hidden.shape[0] == 0:
        return hidden.new_zeros(hidden.shape)
    flat = ids.reshape(-1).to(torch.int64)
    present = torch.zeros(e + 1, dtype=torch.int32, device=ids.device)
    present.scatter_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    present = present[:e]
    experts = torch.argsort(1 - present, stable=True).to(torch.int32).reshape(1, e)
    n = present.sum().to(torch.int32).reshape(1, 1)
    w32 = weights.to(torch.float32)
    w32 = torch.where(ids == e, torch.zeros_like(w32), w32)
    dt = hidden.dtype

    def dense(x: Tensor | None, shape: tuple[int, ...] | None = None) -> Tensor | None:
        if x is None:
            return None
        x = x.to(dt).contiguous()
        return x if shape is None else x.reshape(shape)

    wgu, gu_t = kernel_layout(w_gate_up, dt)
    wd, dn_t = kernel_layout(w_down, dt)
    wup = None if w_up is None else like_layout(w_up, gu_t, dt)
    s_gu, s_d, s_g, s_up = (*shared, None)[:4] if shared is not None else (None,) * 4
    sgu_t = sdn_t = False
    if s_gu is not None and s_d is not None:
        s_gu, sgu_t = kernel_layout(s_gu, dt)
        if s_up is not None:
            s_up = like_layout(s_up, sgu_t, dt).unsqueeze(0)
        s_gu = s_gu.unsqueeze(0)
        s_d, sdn_t = kernel_layout(s_d, dt)
        s_d = s_d.unsqueeze(0)
    return launch(
        moe_decode_fwd,
        hidden.contiguous(),
        wgu,
        wd,
        ids.to(torch.int32).contiguous(),
        w32.contiguous(),
        experts,
        n,
        dense(b_gate_up),
        dense(b_down),
        s_gu,
        s_d,
        dense(s_g, (1, hidden.shape[1])),
        s_up,
        wup,
        target=get_target(None),
        activation=activation,
        interleaved=bool(interleaved),
        alpha=float(alpha),
        limit=float(limit),
        transposed=(gu_t, dn_t, sgu_t, sdn_t),
    )


def kernel_layout(w: Tensor, dt: torch.dtype) -> tuple[Tensor, bool]:
    """(what the kernel reads for weight `w` [.., K, N], stored transposed): `w` itself
    when row-major, the storage [.., N, K] (a view: no copy) when `w` is its transposed
    view; another dtype is cast (a copy every call, in w's layout), another layout
    copied row-major (every call)."""
    w = w.to(dt)  # a no-op in dt; else the cast keeps the strides
    if w.is_contiguous():
        return w, False
    storage = w.transpose(-2, -1)
    if storage.is_contiguous():
        return storage, True
    return w.contiguous(), False


def like_layout(w: Tensor, transposed: bool, dt: torch.dtype) -> Tensor:
    """`w` [.., K, N] in the layout another weight reached the kernel in (a copy only
    when its own layout differs)."""
    t, w_t = kernel_layout(w, dt)
    if w_t == transposed:
        return t
    return w.to(dt).transpose(-2, -1).contiguous() if transposed else w.to(dt).contiguous()
