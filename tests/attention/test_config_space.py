"""Every config in the search space that passes validate() runs the kernels correctly on a
small problem; invalid ones say why; the heuristic default is always valid."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from _helpers import TOLERANCES, assert_lse_close, assert_rel_close, make_inputs, reference_grads

from nki_kernels.attention import masks
from nki_kernels.attention.config import (
    FWD_ARGS,
    AttentionProblem,
    FlashBwdConfig,
    FlashFwdConfig,
    with_kv_overlap,
)
from nki_kernels.attention.flash_bwd import flash_attention_bwd
from nki_kernels.attention.flash_fwd import flash_attention_fwd
from nki_kernels.attention.host import lse_from_kernel, lse_to_kernel
from nki_kernels.interp import run
from nki_kernels.interp.trace import HBM
from nki_kernels.kernel_config import InvalidConfig
from nki_kernels.targets import get_target

# Sq = 260 (3 query tiles, the last ragged), Sk = 1100 (a 1024-key step plus a ragged
# one), GQA 2:1, causal bottom-right: FULL, PARTIAL and SKIP tiles all occur.
B, HQ, HKV, SQ, SK, D = 1, 2, 1, 260, 1100, 64
TARGET = get_target("trn2")


def _problem(dtype: torch.dtype) -> AttentionProblem:
    name = str(dtype).removeprefix("torch.")
    return AttentionProblem(SQ, SK, D, HQ, HKV, B, name, "causal")


def _masks():  # type: ignore[no-untyped-def]
    lo, hi = masks.query_bounds(B, SQ, SK, causal=True)
    plan = masks.tile_plan(masks.classify_tiles(lo, hi, SK))
    return plan, torch.from_numpy(masks.kernel_bounds(lo, hi)), torch.from_numpy(lo >= hi)


def _valid(cls, dtype):  # type: ignore[no-untyped-def]
    problem = _problem(dtype)
    configs = list(cls.space(problem, TARGET))
    valid = [c for c in configs if c.is_valid(problem, TARGET)]
    assert valid, "the search space has no valid config"
    return configs, valid


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_valid_forward_config_is_correct(dtype: torch.dtype) -> None:
    configs, valid = _valid(FlashFwdConfig, dtype)
    plan, bounds, _ = _masks()
    q, k, v = (t.detach() for t in make_inputs(B, HQ, HKV, SQ, SK, D, dtype))
    g = torch.zeros(B, HQ, SQ, D)
    ref_out, ref_lse, _ = reference_grads(q, k, v, g, causal=True)
    for cfg in valid:
        c = cfg.to_dict()
        out, lse = run(
            flash_attention_fwd,
            q,
            k,
            v,
            bounds,
            D**-0.5,
            plan,
            *(c[name] for name in FWD_ARGS),
            target=TARGET,
        ).outputs
        assert_rel_close(out, ref_out, TOLERANCES[dtype][0], f"out {cfg}")
        assert_lse_close(lse_from_kernel(lse)[..., :SQ], ref_lse)
    for cfg in configs:
        if cfg not in valid:
            with pytest.raises(InvalidConfig) as err:
                cfg.validate(_problem(dtype), TARGET)
            assert err.value.reason


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_valid_backward_config_is_correct(dtype: torch.dtype) -> None:
    _, valid = _valid(FlashBwdConfig, dtype)
    plan, bounds, empty = _masks()
    q, k, v = (t.detach() for t in make_inputs(B, HQ, HKV, SQ, SK, D, dtype))
    g = torch.randn(B, HQ, SQ, D, generator=torch.Generator().manual_seed(5)).to(dtype)
    ref_out, ref_lse, ref_grads = reference_grads(q, k, v, g, causal=True)
    out = ref_out.to(dtype)
    lse = ref_lse.masked_fill(empty[:, None, :], float("inf"))
    lse = lse_to_kernel(torch.nn.functional.pad(lse, (0, 3 * 128 - SQ), value=float("inf")))
    for cfg in valid:
        c = cfg.to_dict()
        grads = run(
            flash_attention_bwd,
            q,
            k,
            v,
            out,
            g,
            lse,
            None,
            bounds,
            D**-0.5,
            plan,
            c["section"],
            c["dma_quarters"],
            c["scalar_evac"],
            target=TARGET,
        ).outputs
        for name, got, ref in zip(("dq", "dk", "dv"), grads, ref_grads):
            assert_rel_close(got, ref, TOLERANCES[dtype][1], f"{name} {cfg}")


@pytest.mark.parametrize("target", ["trn2", "trn3"])
@pytest.mark.parametrize("seq", [128, 2048, 8192, 32768])
def test_heuristics_are_valid(target: str, seq: int) -> None:
    tgt = get_target(target)
    for dtype in ("bfloat16", "float16"):
        p = AttentionProblem(seq, seq, 128, 32, 8, 1, dtype, "causal")
        FlashFwdConfig.heuristic(p, tgt).validate(p, tgt)
        FlashBwdConfig.heuristic(p, tgt).validate(p, tgt)


def test_fp32_restrictions_are_explained() -> None:
    p = _problem(torch.float32)
    with pytest.raises(InvalidConfig, match="fp32 P\\^T"):
        FlashFwdConfig(kv_tile=1024).validate(p, TARGET)
    with pytest.raises(InvalidConfig, match="2-byte dtypes only"):
        FlashFwdConfig(kv_tile=512, dma_quarters=2).validate(p, TARGET)


def test_long_keys_do_not_fit_resident_and_say_so() -> None:
    p = AttentionProblem(256, 64 * 1024, 128, dtype="bfloat16")
    with pytest.raises(InvalidConfig, match="SBUF overflow on trn2"):
        FlashFwdConfig().validate(p, TARGET)


def test_bounds_rows_match_kernel_layout() -> None:
    plan, bounds, empty = _masks()
    assert bounds.shape == (B, 128, 2, 3) and not bool(empty.any())
    assert np.asarray(plan).shape == (B, 3, 9)


@pytest.mark.parametrize("causal", [False, True])
def test_two_kv_buffers_run_the_groups_as_one_pipeline(causal: bool) -> None:
    """kv_buffers=2: the four (batch, kv-head) groups form one pipeline -- the second
    group's first scores are issued before the first group's last P @ V -- and the
    results are bit-identical to one buffer set (groups one after the other)."""
    b, hq, hkv, sq, sk = 2, 4, 2, 520, 1100
    q, k, v = (t.detach() for t in make_inputs(b, hq, hkv, sq, sk, D, torch.bfloat16))
    plan, bounds = (), None
    if causal:
        lo, hi = masks.query_bounds(b, sq, sk, causal=True)
        plan = masks.tile_plan(masks.classify_tiles(lo, hi, sk))
        bounds = torch.from_numpy(masks.kernel_bounds(lo, hi))
    res = [
        run(flash_attention_fwd, q, k, v, bounds, D**-0.5, plan, 512, 2, 3, 6, kvb, target=TARGET)
        for kvb in (1, 2)
    ]
    for one, two in zip(res[0].outputs, res[1].outputs):
        torch.testing.assert_close(one, two, rtol=0, atol=0)
    ref_out, ref_lse, _ = reference_grads(q, k, v, torch.zeros_like(q), causal=causal)
    assert_rel_close(res[1].outputs[0], ref_out, TOLERANCES[torch.bfloat16][0], "out")
    assert_lse_close(lse_from_kernel(res[1].outputs[1])[..., :sq], ref_lse)
    for r, interleaved in zip(res, (False, True)):
        qk = [i.index for i in r.trace if i.opcode == "nc_matmul" and i.attrs["N"] != D]
        stores = [i.index for i in r.trace if i.opcode == "dma_copy" and i.dtype == "float32"]
        first_lse_store = next(x for x in stores if r.trace.instrs[x].writes[0][0] == HBM)
        before = sum(1 for x in qk if x < first_lse_store)
        # one buffer set: exactly group 0's scores precede its statistics store
        assert (before > len(qk) // 4) == interleaved, (before, len(qk))


def test_kv_overlap_needs_several_groups_and_room_for_a_second_kv_set() -> None:
    cfg = FlashFwdConfig(kv_tile=1024, q_tiles=2, dma_quarters=3, scalar_evac=6)
    several = AttentionProblem(8192, 8192, 128, 32, 8, 1, "bfloat16", "none")
    assert with_kv_overlap(cfg, several, TARGET).kv_buffers == 2
    one_group = AttentionProblem(8192, 8192, 128, 4, 1, 1, "bfloat16", "none")
    assert with_kv_overlap(cfg, one_group, TARGET) == cfg
    # 32 K keys: one K^T + V set is 4 * 32768 * 2 B = 128 KiB per partition; two do not fit
    long = AttentionProblem(8192, 32768, 128, 32, 8, 1, "bfloat16", "none")
    assert cfg.is_valid(long, TARGET) and with_kv_overlap(cfg, long, TARGET) == cfg


def test_kernel_refuses_a_step_whose_scores_do_not_fit_psum() -> None:
    # 2048 keys all PE-transposed: P^T of two jobs takes 4 banks, O one, 3 left < 4
    q = torch.zeros(1, 1, 128, D, dtype=torch.bfloat16)
    kv = torch.zeros(1, 1, 2048, D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="kv_tile: the scores of 2048 keys need 4 PSUM banks"):
        run(flash_attention_fwd, q, kv, kv, None, 0.125, (), 2048, 1, 0, 6, target=TARGET)


def test_lnc2_splits_the_work_and_matches_lnc1() -> None:
    """kernel[2]: the (batch, kv-head) pairs are split over two cores (shared HBM)."""
    q, k, v = (t.detach() for t in make_inputs(2, 2, 1, 130, 200, 64, torch.bfloat16))
    args = (q, k, v, None, D**-0.5, (), 512, 1, 0, 4)
    one = run(flash_attention_fwd, *args, target=TARGET).outputs
    two = run(flash_attention_fwd, *args, target=TARGET, lnc=2).outputs
    for a, b in zip(one, two):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    out, lse = one
    g = torch.randn(out.shape).to(torch.bfloat16)
    bargs = (q, k, v, out, g, lse, None, None, D**-0.5, (), 16, 0, 8)
    grads1 = run(flash_attention_bwd, *bargs, target=TARGET).outputs
    grads2 = run(flash_attention_bwd, *bargs, target=TARGET, lnc=2).outputs
    for a, b in zip(grads1, grads2):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_every_parameter_set_of_a_band_dry_runs_on_the_shared_target(monkeypatch) -> None:
    from nki_kernels.attention import config
    from nki_kernels.perfmodel.band import parameter_sets

    sets = parameter_sets("trn2")
    assert any(t != sets[0] for t in sets[1:])  # the band spans other parameter sets
    # the cost model's module cannot be imported at call time (a broken install, a cycle):
    # the dry run's target must not silently become each parameter set's own
    monkeypatch.setitem(sys.modules, "nki_kernels.perfmodel.band", None)
    assert {config._limits(t) for t in sets} == {config._limits(sets[0])}
