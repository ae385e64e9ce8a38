"""The backward's DMA sizes and strip-set rotation move data, never arithmetic: the
heuristic's phase-A plans (8- or 4-tile weight DMAs, two or three strip sets) give
bit-identical gradients."""

from __future__ import annotations

import pytest
import torch
from moe_cases import bwd_kernel, make_layer, plan_for, random_routing, train_forward

BF16 = torch.bfloat16


@pytest.mark.parametrize("saved", [True, False], ids=["gate-up-saved", "recomputed"])
def test_dma_size_and_strip_sets_do_not_change_the_gradients(saved: bool) -> None:
    # H = 1152: nine 128-row H tiles, so 8-tile DMAs leave a ragged last piece
    t, h, i, e, k = 96, 1152, 256, 4, 2
    layer = make_layer(t, h, i, e, BF16, seed=5)
    ids, w = random_routing(t, e, k, seed=6)
    if saved:
        _, gate_up, plan = train_forward(layer, ids, w, (128, 128))
    else:
        gate_up, plan = None, plan_for(ids, w, e, 128)
    runs = [
        bwd_kernel(layer, plan, gate_up=gate_up, dma_h=dh, strip_bufs=sb, w_bufs=4)
        for dh, sb in ((4, 3), (8, 2), (8, 3))
    ]
    for other in runs[1:]:
        for name, a, b in zip(("dx", "d_weights", "dw_gate_up", "dw_down"), runs[0], other):
            assert torch.equal(a, b), name  # no NaN here: equal values are equal bits
