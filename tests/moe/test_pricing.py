"""Representative-block pricing of the MoE kernels (the benchmark's method) is faithful."""

from __future__ import annotations

import numpy as np
import pytest

from nki_kernels.model_shapes import MoEShape
from nki_kernels.moe.config import MoEMLPConfig, MoEProblem
from nki_kernels.moe.pricing import _price, layer_row, price_blocks, routing, used_blocks
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
    est = price_blocks(kind, p, cfg, blocks, TRN2)
    exact = _price(kind, p, cfg, blocks, TRN2)
    assert not est.exact
    assert abs(est.latency_ns / exact.latency_ns - 1) < 0.01
    assert est.busiest == exact.bottleneck


def test_layer_row_is_labeled_modeled() -> None:
    shape = MoEShape("tiny", hidden=256, intermediate=512, num_experts=4, top_k=2)
    row = layer_row(shape, 512, "uniform", "trn2")
    assert row["label"] == "modeled (cost model v1, trn2)"
    assert 0 < row["mfu_routed_pct"] < 100
    b = row["config"]["block_size"]
    assert row["blocks"] == used_blocks(routing("uniform", 512, 4, 2), 4, b) == 4 * -(-256 // b)
    assert row["latency_ms"] == pytest.approx(row["mlp_ms"] + row["router_ms"])
