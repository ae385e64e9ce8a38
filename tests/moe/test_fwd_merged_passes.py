"""The forward's merged gate/up passes (`fwd_stream.merged_chunks`): a small block of the
sized plan contracts m tile_i chunks per gate/up pass (longer weight DMA runs) while its
down projection stays per chunk, so the outputs and the saved gate / up are bit-identical
to m = 1."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from moe_cases import (
    assert_close_scaled,
    fwd_kernel,
    make_layer,
    mlp_with_routing,
    plan_for,
    train_forward,
)

from nki_kernels.moe import blockwise_mlp
from nki_kernels.moe.fwd_stream import merged_chunks
from nki_kernels.moe.grouping import kind_counts

BF16 = torch.bfloat16
T, H, I, E, K, B = 600, 136, 640, 4, 2, 512  # ragged H; I = 5 chunks of tile_i 128
CFG = {"tile_i": 128, "dma_h": 4, "w_bufs": 3}


def _routing() -> tuple[np.ndarray, np.ndarray]:
    """Expert 0: every token (600 rows: blocks of 3 and 2 sub-tiles); second choices:
    tokens < 400 expert 1 (4 sub-tiles), the next 100 expert 2, the last 100 expert 3
    (1 sub-tile each)."""
    t = np.arange(T)
    ids = np.stack([np.zeros(T, dtype=np.int64), 1 + (t >= 400) + (t >= 500)], axis=1)
    w = np.random.default_rng(3).uniform(0.1, 1.0, (T, K)).astype(np.float32)
    return ids, w / w.sum(1, keepdims=True)


def _dims() -> dict[str, Any]:
    return {"NS": B // 128, "I": I, "H": H, "HT": 2, "dt": blockwise_mlp.nl.bfloat16}


def test_merge_factor_per_block_size() -> None:
    # a full block's 2 accumulators [128, 512] fp32 take 2 PSUM banks; 2 sub-tiles pack
    # 2 accumulators to a bank (m = 2: 4 accumulators, 2 banks), 1 sub-tile packs 4
    # (m = 4: 8 accumulators, 2 banks); 3 sub-tiles (1,536 B) pack none: m = 1
    d, cfg = {**_dims(), "gu_t": False}, {**CFG, "loop_order": "h_outer"}
    assert [merged_chunks(d, cfg, s) for s in (4, 3, 2, 1)] == [1, 1, 2, 4]
    # never past dma_h (a unit keeps its bytes), nor for i_outer or transposed gate/up
    assert merged_chunks(d, {**cfg, "dma_h": 2}, 1) == 2
    assert merged_chunks(d, {**cfg, "loop_order": "i_outer"}, 1) == 1
    assert merged_chunks({**d, "gu_t": True}, cfg, 1) == 1


@pytest.mark.parametrize("lnc", [1, 2])
def test_merged_passes_are_bit_identical(lnc: int, monkeypatch: pytest.MonkeyPatch) -> None:
    layer = make_layer(T, H, I, E, BF16, seed=5)
    ids, w = _routing()
    plan = plan_for(ids, w, E, B, sized=True)
    assert kind_counts(plan.kind_bounds) == (1, 1, 1, 2)
    seen: list[int] = []

    def spy(d: Any, cfg: Any, s: int) -> int:
        seen.append(merged_chunks(d, cfg, s))
        return seen[-1]

    monkeypatch.setattr(blockwise_mlp, "merged_chunks", spy)
    merged = fwd_kernel(layer, plan, lnc=lnc, **CFG)
    merged_static = fwd_kernel(layer, plan, static=True, lnc=lnc, **CFG)
    out_t, gu, _ = train_forward(layer, ids, w, (B, B), lnc=lnc, **CFG)
    assert {2, 4} <= set(seen)
    monkeypatch.setattr(blockwise_mlp, "merged_chunks", lambda d, cfg, s: 1)
    plain = fwd_kernel(layer, plan, lnc=lnc, **CFG)
    plain_t, gu_plain, _ = train_forward(layer, ids, w, (B, B), lnc=lnc, **CFG)
    assert torch.equal(merged, plain) and torch.equal(merged_static, plain)
    assert torch.equal(out_t, plain_t) and torch.equal(gu, gu_plain)
    ref = mlp_with_routing(layer, ids, torch.from_numpy(w), None)
    assert_close_scaled(merged, ref, BF16, "merged passes: out")
