"""Shared inputs and comparisons for the MoE tests (tolerance table, routing builders)."""

from __future__ import annotations

import numpy as np
import torch

from nki_kernels.interp import run
from nki_kernels.moe.blockwise_mlp import moe_mlp_fwd
from nki_kernels.moe.blockwise_mlp_bwd import moe_mlp_bwd
from nki_kernels.moe.grouping import BlockPlan, gate_up_columns, kind_counts, plan_blocks
from nki_kernels.moe.reference import capacity, capacity_keep, expert_mlp_reference

# Normalized max error max|actual - ref| / max|ref| against the fp32 reference.
# fp32: fp32 engine math, sums of <= a few hundred products in another order:
#   sqrt(n) * 4 * 2^-24 ~ 1e-6, with 10x headroom for transcendental (silu) error.
# bf16: inputs are exact in the reference; the kernel rounds the SwiGLU activations, the
#   per-slot expert outputs and the final result to bf16: 3 roundings of unit roundoff
#   u = 2^-8 each (relative to the output scale) -> 3u ~ 1.2e-2, rounded up to 4u.
TOL = {torch.float32: 1e-5, torch.bfloat16: 4 * 2.0**-8}


def max_rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected| (0 when both are all zero)."""
    a, e = actual.detach().float(), expected.detach().float()
    scale = float(e.abs().max())
    diff = float((a - e).abs().max())
    return diff / scale if scale else diff


def assert_close_scaled(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str
) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} vs {expected.shape}"
    err = max_rel_err(actual, expected)
    assert err <= TOL[dtype], f"{what}: normalized error {err:.3g} > {TOL[dtype]:.3g} ({dtype})"


def make_layer(
    t: int, h: int, i: int, e: int, dtype: torch.dtype, seed: int = 0
) -> dict[str, torch.Tensor]:
    """hidden, router logits, weights and an output gradient with unit-scale outputs."""
    g = torch.Generator().manual_seed(seed)
    return {
        "hidden": torch.randn(t, h, generator=g).to(dtype),
        "logits": torch.randn(t, e, generator=g),
        "w_gate_up": (torch.randn(e, h, 2 * i, generator=g) / h**0.5).to(dtype),
        "w_down": (torch.randn(e, i, h, generator=g) / i**0.5).to(dtype),
        "dout": torch.randn(t, h, generator=g).to(dtype),
    }


def random_routing(t: int, e: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """k distinct experts per token and positive weights."""
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.permutation(e)[:k] for _ in range(t)]).astype(np.int64)
    w = rng.uniform(0.1, 1.0, size=(t, k)).astype(np.float32)
    return ids.reshape(t, k), w


def mlp_with_routing(
    layer: dict[str, torch.Tensor], ids: np.ndarray, w: torch.Tensor, cf: float | None
) -> torch.Tensor:
    """fp32 reference output for a given routing (plain loop over experts), differentiable."""
    x, wgu, wd = layer["hidden"], layer["w_gate_up"], layer["w_down"]
    t, h = x.shape
    e = wgu.shape[0]
    ids_t = torch.from_numpy(ids)
    cap = None if cf is None else capacity(t, e, ids.shape[1], cf)
    keep = capacity_keep(ids_t, e, cap)
    out = torch.zeros(t, h)
    for ex in range(e):
        sel = ((ids_t == ex) & keep).nonzero()
        if sel.numel():
            tok, j = sel[:, 0], sel[:, 1]
            y = expert_mlp_reference(x[tok], wgu, wd, ex)
            out = out.index_add(0, tok, y * w[tok, j].unsqueeze(1))
    return out


def fwd_kernel(
    layer: dict[str, torch.Tensor],
    plan: BlockPlan,
    static: bool = False,
    lnc: int = 1,
    save: tuple[np.ndarray, np.ndarray] | None = None,
    **cfg: object,
) -> torch.Tensor:
    """Run the forward kernel (at `lnc`) on `plan`: one device loop per block size over
    its kind_bounds, or (`static`) static loops over its block counts (pricing's form);
    `save` = (save_cols, save_holes) (`grouping.gate_up_columns`): the training forward,
    outputs (out, gate_up)."""
    args = {"tile_i": 256, "loop_order": "h_outer", "down_n": 512, "w_bufs": 2, "dma_h": 1}
    args.update(cfg)
    t = torch.from_numpy
    res = run(
        moe_mlp_fwd,
        layer["hidden"],
        layer["w_gate_up"],
        layer["w_down"],
        t(plan.slot_token),
        t(plan.block_expert),
        t(plan.kind_bounds),
        t(plan.token_slot),
        t(plan.token_weight),
        None if save is None else t(save[0]),
        None if save is None else t(save[1]),
        kind_counts(plan.kind_bounds) if static else None,
        plan.may_drop,
        plan.block_size,
        *args.values(),
        lnc=lnc,
    )
    return res.outputs


BWD_DEFAULTS = {
    "sub_block": 128,
    "tile_i": 256,
    "dma_h": 1,
    "w_bufs": 2,
    "wgrad_tiles": 1,
    "wgrad_cols": 512,
    "strip_bufs": 3,
    "prefetch_rows": 1,
}


def bwd_kernel(
    layer: dict[str, torch.Tensor],
    plan: BlockPlan,
    dw_dtype: torch.dtype | None = None,
    static_blocks: int | None = None,
    lnc: int = 1,
    gate_up: torch.Tensor | None = None,
    **cfg: int,
) -> tuple[torch.Tensor, ...]:
    """Run the backward kernel (at `lnc`); dw_gate_up / dw_down start as zeros of
    `dw_dtype` (default: the weights' dtype); `static_blocks` overrides the plan's;
    `gate_up`: the training forward's save for this plan (None: recomputed)."""
    e, h, i2 = layer["w_gate_up"].shape
    wdt = dw_dtype or layer["w_gate_up"].dtype
    dgu = torch.zeros(e, h, i2, dtype=wdt)
    dd = torch.zeros(e, i2 // 2, h, dtype=wdt)
    args = dict(BWD_DEFAULTS)
    args.update(cfg)
    args["sub_block"] = min(args["sub_block"], plan.block_size)
    t = torch.from_numpy
    res = run(
        moe_mlp_bwd,
        layer["hidden"],
        layer["w_gate_up"],
        layer["w_down"],
        layer["dout"],
        t(plan.slot_token),
        t(plan.slot_weight),
        t(plan.block_expert),
        t(plan.block_keep),
        t(plan.block_count),
        t(plan.token_slot),
        dgu,
        dd,
        gate_up,
        plan.static_blocks if static_blocks is None else static_blocks,
        plan.may_drop,
        plan.block_size,
        *args.values(),
        lnc=lnc,
    )
    dx, dw = res.outputs
    return dx, dw, dgu, dd


def plan_for(
    ids: np.ndarray,
    w: np.ndarray,
    e: int,
    block: int,
    cf: float | None = None,
    sized: bool = False,
) -> BlockPlan:
    """The op's plan: `sized` (variable-size blocks) for the forward, fixed for the backward."""
    return plan_blocks(ids, w, e, block, cf, sized=sized)


def train_forward(
    layer: dict[str, torch.Tensor],
    ids: np.ndarray,
    w: np.ndarray,
    blocks: tuple[int, int],
    cf: float | None = None,
    lnc: int = 1,
    static: bool = False,
    **cfg: object,
) -> tuple[torch.Tensor, torch.Tensor, BlockPlan]:
    """The training forward (gate / up saved) on the sized plan of block size blocks[0],
    laid out for the backward's fixed plan of blocks[1]: (out, gate_up, that plan)."""
    e = layer["w_gate_up"].shape[0]
    fplan = plan_for(ids, w, e, blocks[0], cf, sized=True)
    bplan = plan_for(ids, w, e, blocks[1], cf)
    out, gate_up = fwd_kernel(layer, fplan, static, lnc, save=gate_up_columns(fplan, bplan), **cfg)
    return out, gate_up, bplan


def gate_up_reference(
    layer: dict[str, torch.Tensor], ids: np.ndarray, plan: BlockPlan
) -> torch.Tensor:
    """float64 x W_gate_up of every kept assignment at its slot of `plan` (the saved
    layout [2I, (NB + 2) * B]); 0 everywhere else."""
    x = layer["hidden"].double()
    wgu = layer["w_gate_up"].double()
    e = wgu.shape[0]
    ncol = (plan.num_blocks + 2) * plan.block_size
    ref = torch.zeros(wgu.shape[2], ncol, dtype=torch.float64)
    for ex in range(e):
        tok, j = np.nonzero((ids == ex) & plan.kept)
        if tok.size:
            ref[:, torch.from_numpy(plan.token_slot[tok, j]).long()] = (x[tok] @ wgu[ex]).T
    return ref
