"""Representative-block pricing of the MoE kernels (the benchmark's method) is faithful."""

from __future__ import annotations

import numpy as np
import pytest

from nki_kernels.model_shapes import MoEShape
from nki_kernels.moe.config import MoEMLPConfig, MoEProblem
from nki_kernels.moe.pricing import (
    _price,
    bwd_trace_blocks,
    layer_row,
    price_blocks,
    price_kernel,
    routing,
    used_blocks,
)
from nki_kernels.targets import TRN2


def test_routings_are_balanced_or_skewed() -> None:
    uni = routing("uniform", 512, 8, 2)
    assert (np.sort(uni, axis=1)[:, 1:] != np.sort(uni, axis=1)[:, :-1]).all()  # distinct
    assert np.bincount(uni.ravel(), minlength=8).tolist() == [128] * 8
    sk = routing("skewed", 512, 8, 2)
    counts = np.bincount(sk.ravel(), minlength=8)
    assert (sk[:, 0] == 0).all() and counts[0] == 512 and counts[1:].sum() == 512
    assert used_blocks(uni, 8, 128) == 8
    with pytest.raises(ValueError, match="kind: expected 'uniform' or 'skewed'; got 'zipf'"):
        routing("zipf", 4, 4, 1)


@pytest.mark.parametrize("kind", ["fwd", "bwd"])
def test_extrapolated_latency_matches_the_full_trace(kind: str) -> None:
    p = MoEProblem(1024, 256, 512, 4, 2)
    cfg = MoEMLPConfig(128, 256, "h_outer", 256, 2, 2)
    if kind == "bwd":
        from nki_kernels.moe.config import MoEMLPBwdConfig

        cfg = MoEMLPBwdConfig(128, 128)
    blocks = 12
    est = price_blocks(kind, p, cfg, blocks, TRN2, exact_instructions=0)
    exact = _price(kind, p, cfg, (blocks,) if kind == "fwd" else blocks, TRN2)
    assert not est.exact
    assert abs(est.latency_ns / exact.latency_ns - 1) < 0.01
    assert est.busiest == exact.bottleneck


def test_a_small_backward_plan_is_traced_in_full() -> None:
    """Under the exact-trace budget the backward is priced by its full trace (its
    increments are not periodic on every shape); over it, by the 4-block window."""
    from nki_kernels.moe.config import MoEMLPBwdConfig

    p = MoEProblem(1024, 256, 512, 4, 2)
    cfg = MoEMLPBwdConfig(128, 128)
    est = price_blocks("bwd", p, cfg, 12, TRN2)
    full = _price("bwd", p, cfg, 12, TRN2)
    assert est.exact and est.latency_ns == full.latency_ns
    n0 = _price("bwd", p, cfg, 4, TRN2).instructions
    assert bwd_trace_blocks(12, n0, budget=3 * n0) == [12]
    assert bwd_trace_blocks(12, n0, budget=3 * n0 - 1) == [4, 6, 8]
    assert bwd_trace_blocks(8) == [8] and bwd_trace_blocks(9) == [4, 6, 8]


def test_extrapolated_lnc2_forward_matches_the_full_trace() -> None:
    """The benchmark's LNC 2 forward rows are extrapolated too: the programs take
    alternate blocks (increments of period 2); 13 blocks, so program 0 runs one more."""
    p = MoEProblem(1024, 256, 512, 4, 2)
    cfg = MoEMLPConfig(128, 256, "h_outer", 256, 2, 2)
    est = price_blocks("fwd", p, cfg, 13, TRN2, lnc=2)
    exact = _price("fwd", p, cfg, (13,), TRN2, True, 2)
    assert not est.exact
    assert abs(est.latency_ns / exact.latency_ns - 1) < 0.01
    assert est.busiest == exact.bottleneck


@pytest.mark.parametrize("lnc", [1, 2])
def test_forward_with_blocks_of_several_sizes_matches_the_full_trace(lnc: int) -> None:
    """The sized plan's blocks (4, 3, 2 and 1 sub-tiles of 128 rows): priced per size
    (`price_fwd_kinds`) against one trace of the whole plan."""
    p = MoEProblem(1024, 256, 512, 4, 2)
    cfg = MoEMLPConfig(512, 256, "h_outer", 256, 2, 2)
    kinds = (4, 3, 5, 4)  # more blocks than the exactly priced plans (n0 + 2 lnc)
    est = price_blocks("fwd", p, cfg, kinds, TRN2, lnc=lnc)
    exact = _price("fwd", p, cfg, kinds, TRN2, True, lnc)
    assert not est.exact
    assert abs(est.latency_ns / exact.latency_ns - 1) < 0.02
    # a block of s sub-tiles costs less than one of s + 1
    one = [price_blocks("fwd", p, cfg, tuple(8 if q == j else 0 for q in range(4)), TRN2)
           for j in range(4)]  # fmt: skip
    assert [o.latency_ns for o in one] == sorted((o.latency_ns for o in one), reverse=True)


def test_layer_row_is_labeled_modeled() -> None:
    shape = MoEShape("tiny", hidden=256, intermediate=512, num_experts=4, top_k=2)
    row = layer_row(shape, 512, "uniform", "trn2")
    assert row["label"] == "modeled (cost model v3, trn2)"
    assert 0 < row["mfu_routed_pct"] < 100
    b = row["config"]["block_size"]
    assert row["blocks"] == used_blocks(routing("uniform", 512, 4, 2), 4, b) == 4 * -(-256 // b)
    assert row["latency_ms"] == pytest.approx(row["mlp_ms"] + row["router_ms"])


def test_price_kernel_prices_the_ops_launch() -> None:
    # the autotuner's entry point: the block extrapolation, balanced routing, and the
    # may_drop flag the op launches with (True); without drops no zero row is written
    p = MoEProblem(1024, 256, 512, 4, 2)
    cfg = MoEMLPConfig(128, 256, "h_outer", 256, 2, 2)
    got = price_kernel("fwd", p, cfg, "trn2")
    blocks = used_blocks(routing("uniform", 1024, 4, 2), 4, 128)
    assert blocks == 16 and not got.exact
    assert got == price_blocks("fwd", p, cfg, blocks, TRN2, True)
    dropless = price_kernel("fwd", p, cfg, TRN2, routing=blocks, may_drop=False)
    assert dropless.latency_ns < got.latency_ns
    with pytest.raises(ValueError, match="kind: expected one of"):
        price_kernel("fwd2", p, cfg, TRN2)
    with pytest.raises(ValueError, match="blocks: expected a positive int; got 0"):
        price_kernel("bwd", p, cfg, TRN2, routing=0)


def test_layer_row_at_lnc2_traces_kernel_2_launches(monkeypatch) -> None:
    # LNC 2: the router and the expert kernel are traced as kernel[2] on the whole batch
    # (both programs, each on its own core), not an LNC 1 figure halved
    import pytest

    from nki_kernels.perfmodel import api

    seen: list[int] = []
    real = api.run

    def run(kernel, *args, lnc=1, **kwargs):
        seen.append(lnc)
        return real(kernel, *args, lnc=lnc, **kwargs)

    monkeypatch.setattr(api, "run", run)
    shape = MoEShape("tiny-lnc", hidden=1024, intermediate=512, num_experts=4, top_k=2)
    one = layer_row(shape, 512, "uniform", "trn2")
    assert seen and set(seen) == {1}
    seen.clear()
    two = layer_row(shape, 512, "uniform", "trn2", lnc=2)
    assert seen and set(seen) == {2}
    # the second core takes half of the down projection and the combine, not the gate/up
    assert one["latency_ms"] / 2 < two["latency_ms"] < one["latency_ms"]
    with pytest.raises(ValueError, match="lnc: expected 1 or 2; got 4"):
        layer_row(shape, 512, "uniform", "trn2", lnc=4)


def test_layer_row_prices_the_backward_as_kernel_2(monkeypatch) -> None:
    # the backward's kernels (router recompute, expert backward, router backward) are
    # traced as kernel[2] too: the programs split phase A's blocks, phase B's columns and
    # the combine's token tiles, so the second core buys most of a 2x
    from nki_kernels.perfmodel import api

    seen: list[int] = []
    real = api.run

    def run(kernel, *args, lnc=1, **kwargs):
        seen.append(lnc)
        return real(kernel, *args, lnc=lnc, **kwargs)

    monkeypatch.setattr(api, "run", run)
    shape = MoEShape("tiny-bwd-lnc", hidden=1024, intermediate=512, num_experts=4, top_k=2)
    one = layer_row(shape, 512, "uniform", "trn2", backward=True)
    seen.clear()
    two = layer_row(shape, 512, "uniform", "trn2", backward=True, lnc=2)
    assert seen and set(seen) == {2}
    assert two["bwd_blocks"] == one["bwd_blocks"] >= 2
    assert one["bwd_ms"] / 2 < two["bwd_ms"] < 0.8 * one["bwd_ms"]
