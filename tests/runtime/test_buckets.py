"""The one bucketing function and its policies."""

from __future__ import annotations

import pytest

from nki_kernels.runtime.buckets import (
    DEFAULT_POLICY,
    BucketOverflow,
    ExplicitBuckets,
    GeometricThenLinear,
    bucket,
    bucket_id,
)

SIZES = range(1, 40_000)


def test_default_policy_documented_values() -> None:
    # floor 128; powers of two up to 4096; multiples of 1024 above
    assert [bucket(n) for n in (1, 127, 128)] == [128, 128, 128]
    small = [bucket(n) for n in (129, 256, 257, 1000, 4095, 4096)]
    assert small == [256, 256, 512, 1024, 4096, 4096]
    large = [bucket(n) for n in (4097, 5120, 5121, 32768, 32769)]
    assert large == [5120, 5120, 6144, 32768, 33792]


def test_default_policy_invariants() -> None:
    prev = 0
    for n in SIZES:
        b = bucket(n)
        assert b >= n and b % 128 == 0
        assert bucket(b) == b, "a bucket is its own bucket"
        assert b >= prev, "monotonic"
        prev = b


def test_padding_waste_bounds() -> None:
    for n in SIZES:
        b = bucket(n)
        if n > 4096:
            assert b - n < 1024
        elif n > 128:
            assert b < 2 * n


def test_buckets_lists_exactly_the_reachable_buckets() -> None:
    listed = DEFAULT_POLICY.buckets(32768)
    assert listed == tuple(sorted({bucket(n) for n in range(1, 32769)}))
    assert len(listed) == 34


def test_custom_policy_and_explicit_boundaries() -> None:
    p = GeometricThenLinear(minimum=32, linear_from=256, step=64, maximum=1024)
    assert [p.bucket(n) for n in (1, 33, 100, 256, 257, 1000)] == [32, 64, 128, 256, 320, 1024]
    with pytest.raises(BucketOverflow, match="n: expected a size <= 1024"):
        p.bucket(1025)
    e = ExplicitBuckets((100, 300, 1000))
    assert [bucket(n, e) for n in (1, 100, 101, 999)] == [100, 100, 300, 1000]
    assert e.buckets(200) == (100, 300)
    with pytest.raises(BucketOverflow, match="got 1001"):
        bucket(1001, e)


def test_bucket_id_names_the_bucket() -> None:
    assert bucket_id(300) == "n512"
    assert bucket_id(5, ExplicitBuckets((8,)), prefix="rows") == "rows8"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"minimum": 100}, "minimum: expected a power of two; got 100"),
        ({"linear_from": 64}, "linear_from: expected >= minimum"),
        ({"step": 3000}, "step: expected a divisor of linear_from"),
        ({"step": 0}, "step: expected an int >= 1; got 0"),
    ],
)
def test_bad_policies_name_the_argument(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GeometricThenLinear(**kwargs)


def test_bad_sizes_name_the_argument() -> None:
    with pytest.raises(ValueError, match="n: expected an int >= 1; got 0"):
        bucket(0)
    with pytest.raises(TypeError, match="n: expected an int; got float"):
        bucket(3.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="strictly ascending"):
        ExplicitBuckets((4, 4))
