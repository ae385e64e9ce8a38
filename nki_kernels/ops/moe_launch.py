"""Kernel launches of the MoE ops: the NKI router and the blockwise expert kernels
(forward, backward) on padded rows and a block plan, the weights read in their own
layouts (`kernel_weights`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..moe.blockwise_mlp import moe_mlp_fwd
from ..moe.blockwise_mlp_bwd import moe_mlp_bwd
from ..moe.config import MoEMLPBwdConfig, MoEMLPConfig
from ..moe.reference import MoERouting
from ..moe.router import moe_router_fwd
from ..moe.split_kernels import moe_mlp_bwd_split, moe_mlp_fwd_split
from ..runtime import launch, lookup_config
from ..targets import get_target
from .moe_decode import kernel_layout, like_layout
from .moe_plans import _plan, _problem


def _route(logits: Tensor, top_k: int, scoring: str, renormalize: bool) -> tuple[Tensor, Tensor]:
    return launch(moe_router_fwd, logits, top_k, scoring, renormalize, target=get_target(None))


def _routed_plan(
    op: str,
    kernel: Any,
    hidden: Tensor,
    lp: Tensor,
    w_gate_up: Tensor,
    r: MoERouting,
    w_up: Tensor | None = None,
) -> tuple[Any, int, dict[str, Tensor], Tensor]:
    """Route the padded logits `lp`, look up `op`'s config for the bucket and plan its
    blocks: (config, static blocks, plan tensors on hidden's device, expert ids)."""
    weights, ids = _route(lp, r.top_k, r.scoring, r.renormalize)
    problem = _problem(lp.shape[0], w_gate_up, r.top_k, w_up)
    cfg = lookup_config(op, problem, kernel, target=get_target(None))
    t, e = hidden.shape[0], w_gate_up.shape[0]
    assert isinstance(cfg, MoEMLPConfig | MoEMLPBwdConfig)
    sized = isinstance(cfg, MoEMLPConfig)  # the forward runs variable-size blocks
    meta, static = _plan(weights, ids, t, e, cfg.block_size, r.capacity_factor, sized)
    return cfg, static, meta, ids


def kernel_weights(
    w_gate_up: Tensor, w_down: Tensor, w_up: Tensor | None, dt: torch.dtype
) -> tuple[tuple[Tensor, Tensor, Tensor | None], tuple[bool, bool]]:
    """((gate/up, down, up or None) as the blockwise kernels read them, (gate/up, down)
    stored transposed): row-major weights and transposed views of row-major storage
    (transformers' [E, 2I, H] / [E, H, I], TorchTitan's w1 / w3 [E, I, H] and w2
    [E, H, I]) reach the kernels as they lie, no copy (`moe_decode.kernel_layout`,
    `moe/param_layout.py`); another layout is copied row-major on each call."""
    wgu, gu_t = kernel_layout(w_gate_up.detach(), dt)
    wd, dn_t = kernel_layout(w_down.detach(), dt)
    wup = None if w_up is None else like_layout(w_up.detach(), gu_t, dt)
    return (wgu, wd, wup), (gu_t, dn_t)


def launch_experts_fwd(
    hp: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    cfg: MoEMLPConfig,
    m: dict[str, Tensor],
    save: tuple[Tensor, Tensor] | None = None,
    w_up: Tensor | None = None,
) -> Any:
    """The forward expert kernel on padded rows `hp` and a sized block plan `m` (the
    launch `moe_mlp` and `moe_experts` share); with `save` = (save_cols, save_holes)
    (`_save_plan`), (out, gate_up) with the pre-activation gate / up saved. The weights
    are read in their own layouts (`kernel_weights`); `w_up`: the up weight alone
    (w_gate_up then the gate's)."""
    cols, holes = (None, None) if save is None else save
    (wgu, wd, wup), transposed = kernel_weights(w_gate_up, w_down, w_up, hp.dtype)
    kernel, ws = (moe_mlp_fwd, (wgu,)) if wup is None else (moe_mlp_fwd_split, (wgu, wup))
    return launch(
        kernel,
        hp,
        *ws,
        wd,
        m["slot_token"],
        m["block_expert"],
        m["kind_bounds"],
        m["token_slot"],
        m["token_weight"],
        cols,
        holes,
        config=cfg,
        target=get_target(None),
        static_kinds=None,  # one device loop per block size over kind_bounds
        may_drop=True,  # static per bucket: padded tokens (and drops) have no slot
        transposed=transposed,
    )


def launch_experts_bwd(
    hp: Tensor,
    gp: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    cfg: MoEMLPBwdConfig,
    plan: tuple[dict[str, Tensor], int],
    gate_up: Tensor | None = None,
    w_up: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """(d hidden, d weights per slot [T, k] fp32, d w_gate_up, d w_down, d w_up or None)
    of the expert kernels on padded rows / grads and a fixed block plan (the launch
    `moe_mlp` and `moe_experts` share). The weights are read in their own layouts
    (`kernel_weights`) and each weight gradient is written in its weight's layout (a
    transposed view of the same storage layout: no transpose copy), in place for every
    expert with a block (fp32 sums on chip, one rounding); the others stay zero.
    `gate_up`: the forward's saved gate / up for this plan (None: recomputed)."""
    m, static = plan
    (wgu, wd, wup), transposed = kernel_weights(w_gate_up, w_down, w_up, hp.dtype)

    def zeros(w: Tensor) -> Tensor:
        return torch.zeros(w.shape, dtype=w.dtype, device=hp.device)

    dgu, dd = zeros(wgu), zeros(wd)
    dup = None if wup is None else zeros(wup)
    ws: tuple[Tensor, ...] = (wgu,)
    dws: tuple[Tensor | None, ...] = (dgu,)
    kernel = moe_mlp_bwd
    if wup is not None:
        kernel, ws, dws = moe_mlp_bwd_split, (wgu, wup), (dgu, dup)
    dh, dw = launch(
        kernel,
        hp,
        *ws,
        wd,
        gp,
        m["slot_token"],
        m["slot_weight"],
        m["block_expert"],
        m["block_keep"],
        m["block_count"],
        m["token_slot"],
        *dws,
        dd,
        gate_up,
        config=cfg,
        target=get_target(None),
        mutated=tuple(range(len(ws) + 9, 2 * len(ws) + 10)),
        static_blocks=static,
        may_drop=True,  # static per bucket: padded tokens (and drops) have no slot
        transposed=transposed,
    )

    def as_param(g: Tensor, t: bool) -> Tensor:  # the parameter's view of the storage
        return g.transpose(1, 2) if t else g

    gu_t, dn_t = transposed
    dup = None if dup is None else as_param(dup, gu_t)
    return dh, dw, as_param(dgu, gu_t), as_param(dd, dn_t), dup
