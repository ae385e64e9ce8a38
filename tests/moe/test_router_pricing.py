"""moe/router_pricing.py: the NKI routing kernel priced with each model's options
(modeled, labelled, with bands), and exact instruction counts of its top-k rounds."""

from __future__ import annotations

import pytest

from nki_kernels.interp import TensorSpec
from nki_kernels.moe.router_options import moe_route_options_fwd
from nki_kernels.moe.router_pricing import ROUTER_ROWS, price_router_row
from nki_kernels.perfmodel import COST_MODEL_VERSION, trace_kernel


@pytest.mark.parametrize("row", ROUTER_ROWS, ids=lambda r: r[0].model)
def test_each_models_row_is_modeled_with_a_band(row: tuple) -> None:
    shape, router, biased = row
    r = price_router_row(shape, router, biased, tokens=384, target="trn2")
    assert r.label == f"modeled (cost model {COST_MODEL_VERSION}, trn2)"
    assert r.fwd_band[0] <= r.fwd_us <= r.fwd_band[1]
    assert r.bwd_band[0] <= r.bwd_us <= r.bwd_band[1]
    # the softmax-only router.py applies to Qwen3-MoE's settings alone (E <= 128, k <= 8)
    assert (r.softmax_router_fwd_us is not None) == (shape.model == "qwen3-moe-like")


@pytest.mark.parametrize(("k", "rounds"), [(4, 1), (8, 1), (9, 2), (16, 2)])
def test_top_k_rounds_of_eight(k: int, rounds: int) -> None:
    # T = 384 at LNC 2: 3 token tiles (core 0 takes tiles 0 and 2, core 1 tile 1);
    # per tile: `rounds` max8 + nc_find_index8, rounds - 1 nc_match_replace8
    tr = trace_kernel(
        moe_route_options_fwd, TensorSpec((384, 256), "float32"), TensorSpec((256,), "float32"),
        k, "sigmoid", False, 8, 4, True, 2.5, target="trn2", lnc=2,
    )  # fmt: skip
    assert tr.count("vector", "max8") == 3 * rounds
    assert tr.count("vector", "nc_find_index8") == 3 * rounds
    assert tr.count("vector", "nc_match_replace8") == 3 * (rounds - 1)
    # the bias path gathers the k unbiased scores: one select_reduce per slot, plus one
    # for the NaN select and two for the groups (second best, dropped groups) per tile
    assert tr.count("vector", "select_reduce") == 3 * (k + 3)
