"""MoE kernel configs: the search-space walk, heuristics, validity checks and the SBUF plan."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from moe_cases import (
    assert_close_scaled,
    bwd_kernel,
    fwd_kernel,
    make_layer,
    mlp_with_routing,
    plan_for,
    random_routing,
)

from nki_kernels.interp import TensorSpec, run
from nki_kernels.kernel_config import InvalidConfig
from nki_kernels.moe.blockwise_mlp import moe_mlp_fwd
from nki_kernels.moe.blockwise_mlp_bwd import moe_mlp_bwd
from nki_kernels.moe.config import MoEMLPBwdConfig, MoEMLPConfig, MoEProblem
from nki_kernels.targets import TRN2, TRN3

# the walk shape: T*k = 600 slots (blocks 128..1024 all useful, two experts keep the
# padding small), one ragged H tile, I = 200 (one or two chunks)
T, H, I, E, K = 300, 100, 200, 2, 2
WALK = MoEProblem(512, H, I, E, K, "float32")


@pytest.fixture(scope="module")
def walk_case():
    layer = make_layer(T, H, I, E, torch.float32, seed=9)
    ids, w = random_routing(T, E, K, seed=9)
    x = layer["hidden"].clone().requires_grad_()
    wt = torch.from_numpy(w).clone().requires_grad_()
    wgu = layer["w_gate_up"].clone().requires_grad_()
    wd = layer["w_down"].clone().requires_grad_()
    ref = mlp_with_routing({"hidden": x, "w_gate_up": wgu, "w_down": wd}, ids, wt, None)
    ref.backward(layer["dout"])
    grads = (x.grad, wt.grad, wgu.grad, wd.grad)
    return layer, ids, w, ref.detach(), grads


def test_every_valid_forward_config_is_correct(walk_case) -> None:
    layer, ids, w, ref, _ = walk_case
    space = list(MoEMLPConfig.space(WALK, TRN2))
    valid = [c for c in space if c.is_valid(WALK, TRN2)]
    # blocks 128..1024 x tile_i 128, 256 x loop orders x down_n 256 x w_bufs 2..4 x dma_h 1
    assert len(space) == 48 and len(valid) == 48
    assert {c.block_size for c in valid} == {128, 256, 512, 1024}
    plans = {}
    for cfg in valid:
        plan = plans.setdefault(cfg.block_size, plan_for(ids, w, E, cfg.block_size))
        fields = {k: v for k, v in cfg.to_dict().items() if k != "block_size"}
        out = fwd_kernel(layer, plan, **fields)
        assert_close_scaled(out, ref, torch.float32, f"{cfg}")


def test_every_valid_backward_config_is_correct(walk_case) -> None:
    layer, ids, w, _, grads = walk_case
    space = list(MoEMLPBwdConfig.space(WALK, TRN2))
    valid = [c for c in space if c.is_valid(WALK, TRN2)]
    # blocks 128..1024 x sub-blocks 128..512 x tile_i 128, 256 x w_bufs 2..4 x strip_bufs
    # 2, 3 x prefetch_rows 0, 1 (one useful value for the other fields at H = 100,
    # I = 200); sub_block > block: 72 invalid
    assert len(space) == 288 and len(valid) == 216
    for cfg in valid:
        plan = plan_for(ids, w, E, cfg.block_size)
        fields = {k: v for k, v in cfg.to_dict().items() if k != "block_size"}
        got = bwd_kernel(layer, plan, **fields)
        for name, a, r in zip(("dx", "dw", "dgu", "dd"), got, grads):
            assert_close_scaled(a, r, torch.float32, f"{cfg}: {name}")


PROBLEMS = [
    MoEProblem(4096, 4096, 14336, 8, 2),  # Mixtral-8x7B-like
    MoEProblem(4096, 2048, 1408, 64, 6),  # fine-grained
    MoEProblem(128, 8192, 16384, 8, 2),  # the largest supported H / I
    MoEProblem(512, 4096, 14336, 8, 2, "float32"),
]


@pytest.mark.parametrize(
    "problem", PROBLEMS, ids=lambda p: f"{p.hidden}x{p.intermediate}-{p.dtype}"
)
@pytest.mark.parametrize("target", [TRN2, TRN3], ids=lambda t: t.name)
def test_heuristics_are_valid(problem: MoEProblem, target) -> None:
    fwd = MoEMLPConfig.heuristic(problem, target)
    bwd = MoEMLPBwdConfig.heuristic(problem, target)
    assert fwd.is_valid(problem, target) and bwd.is_valid(problem, target)


def test_mixtral_heuristic_and_plan_estimate_is_an_upper_bound() -> None:
    p = PROBLEMS[0]
    cfg = MoEMLPConfig.heuristic(p, TRN2)
    assert (cfg.block_size, cfg.tile_i, cfg.loop_order) == (512, 512, "h_outer")
    i_outer = dataclasses.replace(cfg, block_size=256, loop_order="i_outer", tile_i=256, w_bufs=2)
    for c in (cfg, i_outer):
        est_sbuf, est_psum = c.usage(p, TRN2)
        spec = [
            TensorSpec((256, p.hidden), "bfloat16"),
            TensorSpec((8, p.hidden, 2 * p.intermediate), "bfloat16"),
        ]
        spec += [
            TensorSpec((8, p.intermediate, p.hidden), "bfloat16"),
            TensorSpec((1, 128, c.block_size // 128), "int32"),
        ]
        ns = c.block_size // 128
        spec += [
            TensorSpec((1, 1), "int32"),
            TensorSpec((1, ns + 1), "int32"),
            TensorSpec((256, 2), "int32"),
            TensorSpec((256, 2), "float32"),
        ]
        kinds = (1,) + (0,) * (ns - 1)
        vals = c.to_dict().values()
        r = run(moe_mlp_fwd, *spec, None, None, kinds, False, *vals, trace_only=True, target=TRN2)
        assert r.peak_sbuf_bytes <= est_sbuf <= r.peak_sbuf_bytes * 1.05
        assert r.peak_psum_banks <= est_psum


def test_backward_plan_estimate_is_an_upper_bound() -> None:
    p = PROBLEMS[0]
    cfg = MoEMLPBwdConfig.heuristic(p, TRN2)
    assert (cfg.block_size, cfg.sub_block, cfg.tile_i) == (512, 256, 256)
    assert (cfg.strip_bufs, cfg.prefetch_rows) == (2, 0)
    small = dataclasses.replace(cfg, block_size=256, sub_block=128, tile_i=256, wgrad_tiles=8)
    # the prefetching plan keeps rows, xT / doT and the head buffers through phase A
    ahead = dataclasses.replace(small, tile_i=128, prefetch_rows=1)
    for c, slack in ((cfg, 1.05), (small, 1.2), (ahead, 1.05)):
        t, b, e, h, i, dt = 256, c.block_size, p.experts, p.hidden, p.intermediate, p.dtype
        spec = [TensorSpec((t, h), dt), TensorSpec((e, h, 2 * i), dt), TensorSpec((e, i, h), dt)]
        spec += [TensorSpec((t, h), dt), TensorSpec((1, 128, b // 128), "int32")]
        spec += [TensorSpec((1, 128, b // 128), "float32"), TensorSpec((1, 1), "int32")]
        spec += [TensorSpec((1, 1), "float32"), TensorSpec((1, 1), "int32")]
        spec += [TensorSpec((t, p.top_k), "int32"), TensorSpec((e, h, 2 * i), dt)]
        spec += [TensorSpec((e, i, h), dt)]
        # gate / up read from the forward's save (moe_mlp), and recomputed (moe_experts)
        for saved in (TensorSpec((2 * i, 3 * b), dt), None):
            vals = c.to_dict().values()
            r = run(moe_mlp_bwd, *spec, saved, 1, False, *vals, trace_only=True, target=TRN2)
            est_sbuf, est_psum = c.usage(p, TRN2, saved=saved is not None)
            assert r.peak_sbuf_bytes <= est_sbuf <= r.peak_sbuf_bytes * slack, saved
            assert r.peak_psum_banks <= est_psum


def test_validate_rejects_with_reasons() -> None:
    p = PROBLEMS[0]
    with pytest.raises(
        InvalidConfig, match=r"block_size: expected one of \(128, 256, 512, 1024\); got 384"
    ):
        MoEMLPConfig(block_size=384).validate(p, TRN2)
    with pytest.raises(InvalidConfig, match="loop_order: expected one of"):
        MoEMLPConfig(loop_order="k_outer").validate(p, TRN2)
    with pytest.raises(InvalidConfig, match=r"PSUM: the tile plan needs 16 banks; trn2 has 8"):
        MoEMLPConfig(block_size=1024, tile_i=512).validate(MoEProblem(4096, 512, 2048, 8, 2), TRN2)
    with pytest.raises(
        InvalidConfig, match=r"SBUF: the tile plan needs \d+ B per partition; trn2 has 212984"
    ):
        MoEMLPBwdConfig(block_size=1024, sub_block=256, tile_i=1024).validate(p, TRN2)
    with pytest.raises(InvalidConfig, match="no backward MoE config fits"):
        MoEMLPBwdConfig.heuristic(MoEProblem(128, 8192, 16384, 8, 2, "float32"), TRN2)
