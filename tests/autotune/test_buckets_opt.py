"""Bucket-boundary optimizer: exact (matches brute force), never worse than the defaults."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nki_kernels.autotune.buckets_opt import (
    LengthDistribution,
    candidates,
    evaluate,
    interpolated_cost,
    linear_cost,
    optimize,
    power_of_two_plan,
    quadratic_cost,
)
from nki_kernels.runtime.buckets import DEFAULT_POLICY, ExplicitBuckets


def brute_force(dist, max_buckets, cost, cands):
    best = None
    for k in range(1, max_buckets + 1):
        for combo in itertools.combinations(cands, k):
            if combo[-1] < dist.max_length:
                continue
            e = evaluate(dist, combo, cost).expected_time
            best = e if best is None else min(best, e)
    return best


@settings(max_examples=60, deadline=None)
@given(
    samples=st.lists(st.integers(1, 48), min_size=1, max_size=14),
    max_buckets=st.integers(1, 4),
    align=st.sampled_from([1, 4, 8]),
    wiggle=st.lists(st.floats(0.0, 5.0), min_size=64, max_size=64),
    fixed=st.floats(0.0, 50.0),
)
def test_matches_brute_force_on_small_cases(samples, max_buckets, align, wiggle, fixed):
    dist = LengthDistribution.from_samples(samples)
    # an arbitrary (non-monotone) cost: exactness must not rely on monotonicity
    cost = lambda b: fixed + b + wiggle[b % 64]  # noqa: E731
    extra = [16, 32, 64]
    plan = optimize(dist, max_buckets, cost, align=align, extra_candidates=extra)
    cands = candidates(dist, align, extra)
    expect = brute_force(dist, max_buckets, cost, cands)
    assert plan.expected_time == pytest.approx(expect, rel=1e-12)
    assert len(plan.boundaries) <= max_buckets
    assert plan.boundaries[-1] >= dist.max_length
    assert all(b % align == 0 for b in plan.boundaries)


def skewed_lengths(seed: int = 0) -> LengthDistribution:
    # chat-like traffic: many short prompts, a long tail of long documents
    rng = np.random.default_rng(seed)
    short = rng.lognormal(mean=5.5, sigma=0.6, size=4000)
    long = rng.lognormal(mean=8.6, sigma=0.5, size=400)
    lengths = np.clip(np.concatenate([short, long]).astype(int), 1, 32768)
    return LengthDistribution.from_samples(lengths.tolist())


@pytest.mark.parametrize("cost", [linear_cost(fixed=2000.0), quadratic_cost(linear=4096.0)])
def test_beats_or_ties_the_defaults_on_a_skewed_distribution(cost):
    dist = skewed_lengths()
    default = evaluate(dist, DEFAULT_POLICY, cost)
    pow2 = power_of_two_plan(dist, cost, minimum=128)
    # same compile budget as the default policy uses on this data
    best = optimize(dist, len(default.boundaries), cost, align=128)
    assert best.expected_time <= default.expected_time
    assert best.expected_time <= pow2.expected_time
    assert best.padding_waste < default.padding_waste
    # and with fewer compiled variants than pow2 it still ties or beats pow2 here
    fewer = optimize(dist, len(pow2.boundaries), cost, align=128)
    assert fewer.expected_time <= pow2.expected_time


def test_optimal_plan_is_a_valid_runtime_policy():
    dist = skewed_lengths(1)
    plan = optimize(dist, 6, linear_cost(), align=128)
    policy = plan.policy()
    assert isinstance(policy, ExplicitBuckets)
    for n in dist.lengths:
        assert policy.bucket(n) >= n
    assert evaluate(dist, policy, linear_cost()).expected_time == pytest.approx(plan.expected_time)


def test_more_buckets_never_cost_more():
    dist = skewed_lengths(2)
    cost = quadratic_cost(fixed=1e6)
    times = [optimize(dist, k, cost, align=64).expected_time for k in range(1, 9)]
    assert all(b <= a for a, b in itertools.pairwise(times))


def test_length_file_formats(tmp_path):
    f = tmp_path / "lengths.txt"
    f.write_text("# comment\n100\n200 3\n300,2\n\n100\n")
    dist = LengthDistribution.from_file(f)
    assert dist.lengths == (100, 200, 300) and dist.counts == (2, 3, 2)
    bad = tmp_path / "bad.txt"
    bad.write_text("100\nabc\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: expected"):
        LengthDistribution.from_file(bad)


def test_interpolated_cost_passes_through_its_points():
    cost = interpolated_cost({128: 10.0, 256: 14.0, 1024: 50.0})
    assert cost(128) == 10.0 and cost(256) == 14.0 and cost(192) == pytest.approx(12.0)
    assert cost(2048) == pytest.approx(50.0 + (50.0 - 14.0) / 768 * 1024)


def test_bad_arguments_name_the_argument():
    dist = LengthDistribution.from_samples([5, 9])
    with pytest.raises(ValueError, match="max_buckets"):
        optimize(dist, 0, linear_cost())
    with pytest.raises(ValueError, match="align"):
        optimize(dist, 2, linear_cost(), align=0)
    with pytest.raises(ValueError, match="lengths"):
        LengthDistribution.from_samples([])
