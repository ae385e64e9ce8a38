"""Blockwise expert MLP kernels (forward + backward) against the fp32 reference loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from moe_cases import (
    assert_close_scaled,
    bwd_kernel,
    fwd_kernel,
    gate_up_reference,
    make_layer,
    mlp_with_routing,
    plan_for,
    random_routing,
    train_forward,
)

from nki_kernels.moe.blockwise_mlp import moe_mlp_fwd
from nki_kernels.moe.grouping import kind_counts

F32, BF16 = torch.float32, torch.bfloat16


def _routing(kind: str, t: int, e: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    ids, w = random_routing(t, e, k, seed)
    if kind == "skewed":  # every token's first choice is expert 0
        for row in ids:
            j = int(np.nonzero(row == 0)[0][0]) if 0 in row else 0
            row[j] = row[0]
            row[0] = 0
    elif kind == "sizes":  # expert 0 every token, 1 the first 2/3, 2 the rest, 3 none
        ids[:, 0], ids[:, 1] = 0, np.where(np.arange(t) < 2 * t // 3, 1, 2)
    elif kind == "half":  # experts e/2.. never chosen
        rng = np.random.default_rng(seed)
        ids = np.stack([rng.permutation(e // 2)[:k] for _ in range(t)])
    return ids, w


CASES = {
    # name: (T, H, I, E, k, B, dtype, routing, capacity_factor, config overrides)
    "ragged-fp32": (37, 200, 300, 4, 2, 128, F32, "random", None, {}),
    "ragged-bf16": (37, 200, 300, 4, 2, 128, BF16, "random", None, {}),
    "one-token": (1, 96, 160, 8, 2, 128, F32, "random", None, {}),
    "skewed-top1": (150, 64, 128, 8, 1, 128, BF16, "skewed", None, {}),
    "skewed-top2": (140, 64, 96, 8, 2, 128, F32, "skewed", None, {"loop_order": "i_outer"}),
    "top8": (60, 64, 96, 8, 8, 256, F32, "random", None, {"dma_h": 2}),
    "e64-empty-experts": (100, 64, 64, 64, 2, 128, BF16, "half", None, {}),
    "capacity": (200, 64, 128, 8, 3, 256, F32, "random", 0.5, {"tile_i": 128}),
    "big-block-i-outer": (300, 136, 200, 4, 2, 512, F32, "random", None, {"loop_order": "i_outer"}),
    "multi-chunk": (130, 64, 640, 4, 2, 128, BF16, "random", None, {"tile_i": 256, "w_bufs": 3}),
}

# backward tunables per case (others: moe_cases.BWD_DEFAULTS): ragged H / I tiles in weight
# units and strip pieces, chunks and wgrad panels; sub-blocks of 128, 256 and 512 tokens;
# two or three strip sets; rows gathered ahead or at the sub-block start
BWD_CASES: dict[str, dict[str, int]] = {
    "ragged-fp32": {"dma_h": 2, "wgrad_tiles": 2, "prefetch_rows": 0},
    "ragged-bf16": {"dma_h": 2, "wgrad_tiles": 2, "w_bufs": 3, "strip_bufs": 2, "tile_i": 128},
    "top8": {"sub_block": 256, "tile_i": 512},
    "capacity": {"sub_block": 128, "wgrad_cols": 1024, "strip_bufs": 2, "prefetch_rows": 0},
    "big-block-i-outer": {"sub_block": 512, "tile_i": 512, "dma_h": 2, "wgrad_tiles": 2},
    "multi-chunk": {"tile_i": 128, "w_bufs": 3, "wgrad_cols": 1024},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_backward_match_reference(name: str) -> None:
    t, h, i, e, k, b, dtype, kind, cf, cfg = CASES[name]
    layer = make_layer(t, h, i, e, dtype, seed=len(name))
    ids, w = _routing(kind, t, e, k, seed=len(name))
    plan = plan_for(ids, w, e, b, cf)
    if kind == "skewed":
        assert plan.expert_counts[0] >= t * 0.99
    if cf is not None:
        assert not plan.kept.all(), "the capacity case must drop something"

    out = fwd_kernel(layer, plan_for(ids, w, e, b, cf, sized=True), **cfg)
    assert out.dtype == dtype and out.shape == (t, h)

    x = layer["hidden"].float().clone().requires_grad_()
    wt = torch.from_numpy(w).clone().requires_grad_()
    wgu = layer["w_gate_up"].float().clone().requires_grad_()
    wd = layer["w_down"].float().clone().requires_grad_()
    ref_layer = {"hidden": x, "w_gate_up": wgu, "w_down": wd}
    ref = mlp_with_routing(ref_layer, ids, wt, cf)
    assert_close_scaled(out, ref, dtype, f"{name}: out")

    ref.backward(layer["dout"].float())
    # the training forward: the same output, and gate / up saved in the backward's layout
    trained, gate_up, bplan = train_forward(layer, ids, w, (b, b), cf, **cfg)
    assert torch.equal(trained, out)
    assert gate_up.shape == (2 * i, (bplan.num_blocks + 2) * b) and gate_up.dtype == dtype
    expect = gate_up_reference(layer, ids, bplan)  # padding and unused columns exactly 0
    assert_close_scaled(gate_up, expect, dtype, f"{name}: saved gate / up")
    assert (gate_up[expect == 0] == 0).all()
    bcfg = BWD_CASES.get(name, {})
    for saved in (None, gate_up):  # recomputed, and read from the forward's save
        dx, dw, dgu, dd = bwd_kernel(layer, plan, gate_up=saved, **bcfg)
        what = f"{name} ({'saved' if saved is not None else 'recomputed'})"
        assert_close_scaled(dx, x.grad, dtype, f"{what}: d hidden")
        assert_close_scaled(dgu, wgu.grad, dtype, f"{what}: d w_gate_up")
        assert_close_scaled(dd, wd.grad, dtype, f"{what}: d w_down")
        assert_close_scaled(dw, wt.grad, dtype, f"{what}: d routing weights")
        # experts without a kept token get exact zeros; dropped assignments zero weight grads
        empty = plan.expert_counts == 0
        if empty.any():
            assert (dgu[torch.from_numpy(empty)] == 0).all() and (
                dd[torch.from_numpy(empty)] == 0
            ).all()
        assert (dw[torch.from_numpy(~plan.kept)] == 0).all()


@pytest.mark.parametrize("blocks", [(512, 256), (128, 256), (256, 512)])
def test_saved_gate_up_maps_forward_blocks_onto_backward_slots(blocks: tuple[int, int]) -> None:
    """Forward blocks of one size and backward blocks of another: the forward writes each
    block's rows at the backward plan's slots and zeroes the holes (backward sub-tiles
    past an expert's last 128 rows; the interpreter's fresh HBM is NaN, so a missed hole
    shows), and the backward from that save matches the fp32 reference."""
    t, h, i, e, k = 300, 64, 160, 6, 2
    layer = make_layer(t, h, i, e, BF16, seed=3)
    ids, w = _routing("sizes", t, e, k, seed=3)
    out, gate_up, bplan = train_forward(layer, ids, w, blocks, tile_i=128)
    expect = gate_up_reference(layer, ids, bplan)
    assert torch.isfinite(gate_up.float()).all()
    assert (gate_up[expect == 0] == 0).all()
    assert_close_scaled(gate_up, expect, BF16, "saved gate / up")
    x = layer["hidden"].float().clone().requires_grad_()
    wt = torch.from_numpy(w).clone().requires_grad_()
    wgu = layer["w_gate_up"].float().clone().requires_grad_()
    wd = layer["w_down"].float().clone().requires_grad_()
    ref = mlp_with_routing({"hidden": x, "w_gate_up": wgu, "w_down": wd}, ids, wt, None)
    assert_close_scaled(out, ref, BF16, "out")
    ref.backward(layer["dout"].float())
    sb = min(256, blocks[1])
    dx, dw, dgu, dd = bwd_kernel(layer, bplan, gate_up=gate_up, sub_block=sb, tile_i=128)
    assert_close_scaled(dx, x.grad, BF16, "d hidden")
    assert_close_scaled(dgu, wgu.grad, BF16, "d w_gate_up")
    assert_close_scaled(dd, wd.grad, BF16, "d w_down")
    assert_close_scaled(dw, wt.grad, BF16, "d routing weights")


def test_padding_slots_never_contribute() -> None:
    # one token per expert: each block is 127/128 padding; NaN-free zeros must come out
    t, h, i, e = 4, 64, 64, 4
    layer = make_layer(t, h, i, e, F32, seed=5)
    ids = np.arange(4).reshape(4, 1)
    w = np.ones((4, 1), np.float32)
    plan = plan_for(ids, w, e, 128, sized=True)
    out = fwd_kernel(layer, plan)
    assert torch.isfinite(out).all()
    ref = mlp_with_routing(layer, ids, torch.from_numpy(w), None)
    assert_close_scaled(out, ref, F32, "out")


@pytest.mark.parametrize("device_blocks", [3, 4])
def test_device_loops_match_static_blocks_bit_for_bit(device_blocks: int) -> None:
    # the op runs blocks past the static lower bound in device loops (pairs + an odd tail);
    # pricing traces every block statically: both must compute the same thing
    t, h, i, e = 100, 72, 160, 4
    layer = make_layer(t, h, i, e, BF16, seed=device_blocks)
    ids, w = random_routing(t, e, 2, seed=device_blocks)
    plan = plan_for(ids, w, e, 128)
    assert plan.used_blocks - plan.static_blocks >= 2
    static = plan.used_blocks - device_blocks
    bcfg = {"tile_i": 256, "dma_h": 1}
    bwd_dev = bwd_kernel(layer, plan, static_blocks=static, **bcfg)
    bwd_all = bwd_kernel(layer, plan, static_blocks=plan.used_blocks, **bcfg)
    for a, b in zip(bwd_dev, bwd_all):
        assert torch.equal(a, b)


# name: (T, H, I, E, k, B, routing, capacity_factor)
LNC2_FWD_CASES = {
    # 5 used blocks: program 0 runs 3, program 1 runs 2
    "odd-blocks": (100, 200, 160, 5, 2, 128, "random", None),
    # skewed routing with capacity drops: the drop row is zeroed by program 0 only
    "skewed-drops": (140, 64, 96, 8, 2, 128, "skewed", 0.5),
    # one block in the plan: program 1 has no block, it only combines
    "one-block": (1, 96, 160, 8, 1, 128, "random", None),
    # blocks of 3, 2 and 1 sub-tiles (300 / 200 / 100 rows, B = 512 slots): the programs
    # alternate across the sizes, each block's rows prefetched by the previous larger one
    "three-sizes": (300, 64, 96, 4, 2, 512, "sizes", None),
}


@pytest.mark.parametrize("name", sorted(LNC2_FWD_CASES))
def test_forward_lnc2_splits_blocks_bit_for_bit(name: str) -> None:
    """kernel[2]: program p runs blocks p, p + 2, ... (one device loop per block size), a
    core_barrier, then combines every other token tile -- each block's and each token's
    arithmetic is LNC 1's, so the outputs are identical (and match the reference); the
    static loops pricing traces compute the same."""
    t, h, i, e, k, b, kind, cf = LNC2_FWD_CASES[name]
    layer = make_layer(t, h, i, e, BF16, seed=len(name))
    ids, w = _routing(kind, t, e, k, seed=len(name))
    plan = plan_for(ids, w, e, b, cf, sized=True)
    if cf is not None:
        assert not plan.kept.all(), "the capacity case must drop something"
    if name == "one-block":
        assert plan.num_blocks == 1
    if name.startswith("odd"):
        assert plan.used_blocks % 2 == 1
    if name == "three-sizes":
        assert kind_counts(plan.kind_bounds) == (0, 1, 1, 1)
    one = fwd_kernel(layer, plan, tile_i=128)
    two = fwd_kernel(layer, plan, lnc=2, tile_i=128)
    assert torch.equal(one, two)
    assert torch.equal(two, fwd_kernel(layer, plan, static=True, lnc=2, tile_i=128))
    # the training forward: the same output and the same saved gate / up at LNC 1 and 2
    one_t, gu_one, bplan = train_forward(layer, ids, w, (b, b), cf, tile_i=128)
    two_t, gu_two, _ = train_forward(layer, ids, w, (b, b), cf, lnc=2, tile_i=128)
    assert torch.equal(one_t, one) and torch.equal(two_t, one)
    assert torch.equal(gu_one, gu_two)
    assert (gu_one[gate_up_reference(layer, ids, bplan) == 0] == 0).all()
    ref = mlp_with_routing(layer, ids, torch.from_numpy(w), cf)
    assert_close_scaled(two, ref, BF16, f"{name}: out")


def test_forward_lnc2_programs_share_the_matmuls() -> None:
    """Trace-only: at LNC 2 the two programs issue the LNC 1 launch's TensorE FLOPs between
    them (no block is computed twice), program 0 one block more for an odd count."""
    from nki_kernels.interp import TensorSpec
    from nki_kernels.perfmodel import trace_kernel

    t, h, i, e, k, b, nb = 512, 256, 256, 4, 2, 128, 5
    specs = (
        TensorSpec((t, h), "bfloat16"),
        TensorSpec((e, h, 2 * i), "bfloat16"),
        TensorSpec((e, i, h), "bfloat16"),
        TensorSpec((nb, 128, b // 128), "int32"),
        TensorSpec((nb, 1), "int32"),
        TensorSpec((1, b // 128 + 1), "int32"),
        TensorSpec((t, k), "int32"),
        TensorSpec((t, k), "float32"),
    )
    cfg = (b, 128, "h_outer", 512, 2, 1)

    def flops(lnc: int) -> list[float]:
        trace = trace_kernel(
            moe_mlp_fwd, *specs, None, None, (nb,), True, *cfg, target="trn2", lnc=lnc
        )
        per = [0.0] * lnc
        for ins in trace.instrs:
            if ins.engine == "tensor":
                per[ins.program] += ins.flops
        return per

    (one,) = flops(1)
    p0, p1 = flops(2)
    assert p0 + p1 == pytest.approx(one)
    # every block is a full 128-row block of the same expert shapes: exactly 3 / 5 and 2 / 5
    assert p0 == pytest.approx(one * 3 / 5) and p1 == pytest.approx(one * 2 / 5)


# backward LNC 2 cases: (T, H, I, E, k, B, routing, capacity_factor, blocks left to device
# loops), as the forward's plus H = 1100 (phase B's columns 1024 | 76; at H <= 512
# program 1 has none); rows prefetched or not
LNC2_BWD_CASES = {
    "odd-blocks-device": ((*LNC2_FWD_CASES["odd-blocks"], 3), {"prefetch_rows": 1}),
    "skewed-drops": ((*LNC2_FWD_CASES["skewed-drops"], 2), {"prefetch_rows": 0}),
    "one-block": ((*LNC2_FWD_CASES["one-block"], 0), {"prefetch_rows": 1}),
    "wide-h1100": ((300, 1100, 160, 4, 2, 128, "random", None, 2), {"prefetch_rows": 1}),
}


@pytest.mark.parametrize("name", sorted(LNC2_BWD_CASES))
def test_backward_lnc2_splits_blocks_then_columns_bit_for_bit(name: str) -> None:
    """kernel[2] of the backward: phase A of blocks p, p + 2, ... per program (all of dx's
    columns), a barrier, phase B of the program's hidden columns of dW_gate_up / dW_down,
    then every other token tile of the combine -- the LNC 1 arithmetic, so every gradient
    is identical, and all match the fp32 reference."""
    (t, h, i, e, k, b, kind, cf, device_blocks), cfg = LNC2_BWD_CASES[name]
    layer = make_layer(t, h, i, e, BF16, seed=11 + len(name))
    ids, w = _routing(kind, t, e, k, seed=len(name))
    plan = plan_for(ids, w, e, b, cf)
    static = plan.used_blocks - device_blocks
    _, gate_up, _ = train_forward(layer, ids, w, (b, b), cf, tile_i=128)
    for saved in (None, gate_up):  # recomputed, and read from the forward's save
        one = bwd_kernel(layer, plan, static_blocks=static, tile_i=128, gate_up=saved, **cfg)
        two = bwd_kernel(layer, plan, static_blocks=static, lnc=2, tile_i=128, gate_up=saved, **cfg)
        for what, a, c in zip(("dx", "dw", "dgu", "dd"), one, two):
            assert torch.equal(a, c), what
    x = layer["hidden"].float().clone().requires_grad_()
    wt = torch.from_numpy(w).clone().requires_grad_()
    wgu = layer["w_gate_up"].float().clone().requires_grad_()
    wd = layer["w_down"].float().clone().requires_grad_()
    ref = mlp_with_routing({"hidden": x, "w_gate_up": wgu, "w_down": wd}, ids, wt, cf)
    ref.backward(layer["dout"].float())
    dx, dw, dgu, dd = two
    assert_close_scaled(dx, x.grad, BF16, "d hidden")
    assert_close_scaled(dgu, wgu.grad, BF16, "d w_gate_up")
    assert_close_scaled(dd, wd.grad, BF16, "d w_down")
    assert_close_scaled(dw, wt.grad, BF16, "d routing weights")
