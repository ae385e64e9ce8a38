"""The host block plan: every kept assignment in exactly one single-expert block slot."""

from __future__ import annotations

import math

import numpy as np
import pytest
from moe_cases import random_routing

from nki_kernels.moe.grouping import PARTITIONS, max_blocks, min_blocks, plan_blocks
from nki_kernels.moe.reference import capacity


def _slots(plan):  # slot s = b*B + c*128 + p  ->  (token, weight)
    tok = plan.slot_token.transpose(0, 2, 1).reshape(-1)
    w = plan.slot_weight.transpose(0, 2, 1).reshape(-1)
    return tok, w


CASES = [
    # (T, E, k, B, capacity_factor)
    (1, 4, 2, 128, None),
    (37, 8, 2, 128, None),
    (300, 8, 2, 256, None),
    (500, 64, 6, 128, None),
    (130, 8, 8, 512, None),
    (200, 8, 2, 128, 0.5),
    (200, 8, 3, 256, 1.25),
]


@pytest.mark.parametrize(("t", "e", "k", "b", "cf"), CASES)
def test_plan_invariants(t: int, e: int, k: int, b: int, cf: float | None) -> None:
    ids, w = random_routing(t, e, k, seed=t + e)
    plan = plan_blocks(ids, w, e, b, cf)
    nb = plan.num_blocks
    assert plan.slot_token.shape == (nb, PARTITIONS, b // PARTITIONS)
    # static worst case: never more than ceil(T*k/B) + E and never below what is used
    assert plan.used_blocks <= nb <= math.ceil(t * k / b) + e
    assert plan.static_blocks <= plan.used_blocks
    tok, sw = _slots(plan)
    # every kept (t, j) sits in exactly one slot, with its weight, in a block of its expert
    for tt in range(t):
        for j in range(k):
            s = plan.token_slot[tt, j]
            if plan.kept[tt, j]:
                assert tok[s] == tt and sw[s] == w[tt, j]
                assert plan.block_expert[s // b, 0] == ids[tt, j]
            else:
                assert s == nb * b
    # padding slots hold the out-of-range token T and weight 0
    real = np.zeros(nb * b, dtype=bool)
    real[plan.token_slot[plan.kept]] = True
    assert (tok[~real] == t).all() and (sw[~real] == 0).all()
    assert real.sum() == plan.kept.sum() == plan.expert_counts.sum()
    # blocks are sorted by expert; used blocks of an expert = ceil(count / B)
    used = plan.block_expert[: plan.used_blocks, 0]
    assert (np.diff(used) >= 0).all()
    assert (np.bincount(used, minlength=e) == -(-plan.expert_counts // b)).all()
    assert plan.block_count[0, 0] == plan.used_blocks
    assert plan.may_drop == (not plan.kept.all())


def test_capacity_order_first_choices_then_token_order() -> None:
    # 6 tokens, E = 2, k = 2 -> capacity(0.5) = ceil(0.5 * 12 / 2) = 3 per expert
    ids = np.array([[0, 1], [0, 1], [1, 0], [0, 1], [0, 1], [1, 0]])
    w = np.full((6, 2), 0.5, dtype=np.float32)
    cap = capacity(6, 2, 2, 0.5)
    assert cap == 3
    plan = plan_blocks(ids, w, 2, 128, 0.5)
    # expert 0's first choices: tokens 0, 1, 3, 4 -> tokens 0, 1, 3 kept (token order)
    # expert 1's first choices: tokens 2, 5 -> kept; then second choices by token: 0 kept
    expected = np.array(
        [[True, True], [True, False], [True, False], [True, False], [False, False], [True, False]]
    )
    assert (plan.kept == expected).all()
    assert plan.expert_counts.tolist() == [3, 3]


def test_skewed_routing_fills_one_expert() -> None:
    t, e, b = 300, 8, 128
    ids = np.zeros((t, 1), dtype=np.int64)
    plan = plan_blocks(ids, np.ones((t, 1), np.float32), e, b)
    assert plan.used_blocks == math.ceil(t / b) == plan.static_blocks
    assert (plan.block_expert[: plan.used_blocks, 0] == 0).all()
    assert plan.expert_counts.tolist() == [t] + [0] * (e - 1)


def test_padded_tokens_route_nowhere_and_bounds_are_static() -> None:
    ids, w = random_routing(150, 8, 2, seed=3)
    plan = plan_blocks(ids, w, 8, 128, num_tokens=256, min_tokens=129)
    assert plan.token_slot.shape == (256, 2) and plan.may_drop
    assert (plan.token_slot[150:] == plan.num_blocks * 128).all()
    assert (plan.token_weight[150:] == 0).all()
    # the static sizes depend on the bucket only
    assert plan.num_blocks == max_blocks(256, 2, 8, 128)
    assert plan.static_blocks == min_blocks(129, 2, 8, 128) <= plan.used_blocks


@pytest.mark.parametrize("seed", range(20))
def test_worst_case_bound_holds_for_adversarial_counts(seed: int) -> None:
    rng = np.random.default_rng(seed)
    t, e, k, b = int(rng.integers(1, 400)), int(rng.integers(2, 65)), 0, 128
    k = int(rng.integers(1, min(e, 8) + 1))
    # skew: most tokens pick from a few experts, leaving partial blocks everywhere
    hot = rng.permutation(e)[: max(k, 2)]
    ids = np.stack(
        [
            rng.permutation(hot)[:k] if rng.random() < 0.7 else rng.permutation(e)[:k]
            for _ in range(t)
        ]
    )
    plan = plan_blocks(ids, np.ones((t, k), np.float32), e, b)
    assert plan.used_blocks <= plan.num_blocks


def test_bad_plan_arguments() -> None:
    ids, w = random_routing(10, 4, 2)
    with pytest.raises(
        ValueError, match="block_size: expected a positive multiple of 128; got 100"
    ):
        plan_blocks(ids, w, 4, 100)
    with pytest.raises(ValueError, match=r"ids: expected expert ids in \[0, 3\)"):
        plan_blocks(ids, w, 3, 128)


@pytest.mark.parametrize(("t", "e", "k", "b", "cf"), CASES)
def test_sized_plan_pads_each_expert_to_128_rows_only(
    t: int, e: int, k: int, b: int, cf: float | None
) -> None:
    """The forward's variable-size blocks: every kept assignment in one slot of a block of
    its expert, inside the block's s sub-tiles; an expert's blocks differ by at most one
    sub-tile and pad it to round_up(count, 128) only; blocks ordered by size; the static
    shapes and block count are the fixed plan's."""
    ids, w = random_routing(t, e, k, seed=t + e)
    fixed = plan_blocks(ids, w, e, b, cf)
    plan = plan_blocks(ids, w, e, b, cf, sized=True)
    ns = b // PARTITIONS
    assert plan.slot_token.shape == fixed.slot_token.shape
    assert plan.used_blocks == fixed.used_blocks and plan.num_blocks == fixed.num_blocks
    bounds = plan.kind_bounds[0]
    assert bounds[0] == 0 and bounds[ns] == plan.used_blocks and (np.diff(bounds) >= 0).all()
    size = np.zeros(plan.num_blocks, dtype=np.int64)
    for j in range(ns):
        size[bounds[j] : bounds[j + 1]] = ns - j
    tok, sw = _slots(plan)
    for tt in range(t):
        for j in range(k):
            s = plan.token_slot[tt, j]
            if plan.kept[tt, j]:
                assert tok[s] == tt and sw[s] == w[tt, j]
                assert plan.block_expert[s // b, 0] == ids[tt, j]
                assert s % b < size[s // b] * PARTITIONS
            else:
                assert s == plan.num_blocks * b
    tiles = -(-plan.expert_counts // PARTITIONS)
    assert plan.padded_slots == tiles.sum() * PARTITIONS
    for ex in range(e):
        mine = size[: plan.used_blocks][plan.block_expert[: plan.used_blocks, 0] == ex]
        if plan.expert_counts[ex]:
            assert mine.sum() == tiles[ex] and mine.max() - mine.min() <= 1
            assert len(mine) == -(-plan.expert_counts[ex] // b)


def test_sized_plan_of_skewed_mixtral_routing() -> None:
    # every token's first choice expert 0 (4096 rows), the others 585 / 586 rows each
    t, e, b = 4096, 8, 512
    ids = np.stack([np.zeros(t, np.int64), 1 + np.arange(t) % 7], axis=1)
    w = np.full((t, 2), 0.5, np.float32)
    fixed, sized = plan_blocks(ids, w, e, b), plan_blocks(ids, w, e, b, sized=True)
    assert fixed.padded_slots == 22 * 512 == 11264
    assert sized.padded_slots == 8576  # 8192 rows + 384 of padding
    assert sized.kind_bounds.tolist() == [[0, 8, 15, 22, 22]]  # 8 x 512, 7 x 384, 7 x 256
