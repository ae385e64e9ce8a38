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
    assert [merged_chunks(d, cfg, s)[0] for s in (4, 3, 2, 1)] == [1, 1, 2, 4]
    # never past dma_h (a unit keeps its bytes), nor for i_outer or transposed gate/up
    assert merged_chunks(d, {**cfg, "dma_h": 2}, 1) == (2, False)
    assert merged_chunks(d, {**cfg, "loop_order": "i_outer"}, 1) == (1, False)
    assert merged_chunks({**d, "gu_t": True}, cfg, 1) == (1, False)
    # SBUF per partition (bf16; what differs between block sizes): a full block's xT
    # 2 * 512 * 2 + y 4 * 136 * 4 + act 512 * 2 + SwiGLU scratch 512 * 4 + one down tile
    # 136 * 2 = 7,568 B; 1 sub-tile, m = 4: 512 + 544 + 4 * 256 + 512 + 4 * 272 = 3,680 B
    # with its 4 down tiles live, so not serial; with H = 2048 (16 H tiles, down tiles of
    # 4 KiB) the full block needs 16,384 + 32,768 + 1,024 + 2,048 + 4,096 = 56,320 B and
    # m = 4 with 4 down tiles 4,096 + 8,192 + 1,024 + 512 + 16,384 = 30,208: still not
    wide = {**d, "H": 2048, "HT": 16}
    assert merged_chunks(wide, cfg, 1) == (4, False)
    # merged runs stop at 2 KiB: tile_i 1024 in bf16 is there already
    assert merged_chunks(wide, {**cfg, "tile_i": 1024}, 1) == (1, False)
    # a block of 2 sub-tiles (B 256), H 512, I 1024, tile_i 512 (nit 4): the full
    # block's 8 accumulators [128, 256] take 4 banks, 1 sub-tile with m = 2: 16 at 4 to a
    # bank, 4 banks. SBUF: the full block xT 4 * 256 * 2 + y 2 * 512 * 4 + act 4 * 256 * 2
    # + scratch 256 * 4 + one down tile 4 * 512 * 2 = 13,312 B; m = 2 with its 2 down
    # tiles 1,024 + 2,048 + 2,048 + 512 + 8,192 = 13,824 (does not fit), with 1: 9,728
    small = {**d, "NS": 2, "H": 512, "HT": 4, "I": 1024}
    assert merged_chunks(small, {**cfg, "tile_i": 512}, 1) == (2, True)


# (H, I, B, tile_i, the (m, serial) the blocks take; 1: the largest blocks): the test
# shape (2 and 4 chunks, down tiles together); H 512, I 1024, B 256, tile_i 512, where
# the 1-sub-tile blocks load their 2 down tiles one at a time (SBUF as in
# test_merge_factor_per_block_size)
SHAPES = [
    (H, I, B, 128, {(1, False), (2, False), (4, False)}),
    (512, 1024, 256, 512, {(1, False), (2, True)}),
]


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_merged_passes_are_bit_identical(
    lnc: int, shape: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, i, b, tile_i, merges = SHAPES[shape]
    cfg = {**CFG, "tile_i": tile_i}
    layer = make_layer(T, h, i, E, BF16, seed=5)
    ids, w = _routing()
    plan = plan_for(ids, w, E, b, sized=True)
    # expert 0: 5 sub-tiles (3 + 2, or 2 + 2 + 1 at B 256), expert 1: 4, experts 2, 3: 1
    assert kind_counts(plan.kind_bounds) == ((1, 1, 1, 2) if b == 512 else (4, 3))
    seen: list[int] = []

    def spy(d: Any, cfg: Any, s: int) -> tuple[int, bool]:
        seen.append(merged_chunks(d, cfg, s))
        return seen[-1]

    monkeypatch.setattr(blockwise_mlp, "merged_chunks", spy)
    merged = fwd_kernel(layer, plan, lnc=lnc, **cfg)
    merged_static = fwd_kernel(layer, plan, static=True, lnc=lnc, **cfg)
    out_t, gu, _ = train_forward(layer, ids, w, (b, b), lnc=lnc, **cfg)
    assert set(seen) == merges
    monkeypatch.setattr(blockwise_mlp, "merged_chunks", lambda d, cfg, s: (1, False))
    plain = fwd_kernel(layer, plan, lnc=lnc, **cfg)
    plain_t, gu_plain, _ = train_forward(layer, ids, w, (b, b), lnc=lnc, **cfg)
    assert torch.equal(merged, plain) and torch.equal(merged_static, plain)
    assert torch.equal(out_t, plain_t) and torch.equal(gu, gu_plain)
    ref = mlp_with_routing(layer, ids, torch.from_numpy(w), None)
    assert_close_scaled(merged, ref, BF16, "merged passes: out")
