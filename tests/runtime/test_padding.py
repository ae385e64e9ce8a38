"""Padding the dynamic dimension to its bucket and slicing back."""

from __future__ import annotations

import pytest
import torch

from nki_kernels.runtime.buckets import ExplicitBuckets
from nki_kernels.runtime.padding import pad_dim, pad_to_bucket, unpad


def test_pad_to_bucket_and_back() -> None:
    x = torch.randn(5, 3, 7)
    xp, n = pad_to_bucket(x, 0)
    assert n == 5 and xp.shape == (128, 3, 7)
    assert torch.equal(xp[:5], x) and not xp[5:].any()
    assert torch.equal(unpad(xp, 0, n), x)


def test_other_dims_policies_and_values() -> None:
    x = torch.randn(2, 9, dtype=torch.bfloat16)
    xp, n = pad_to_bucket(x, -1, ExplicitBuckets((16,)), value=-1.0)
    assert n == 9 and xp.shape == (2, 16) and xp.dtype == torch.bfloat16
    assert (xp[:, 9:] == -1).all()


def test_no_copy_when_already_a_bucket() -> None:
    x = torch.randn(256, 4)
    xp, _ = pad_to_bucket(x)
    assert xp is x
    assert unpad(x, 0, 256) is x


def test_errors_name_the_argument() -> None:
    x = torch.randn(4, 4)
    with pytest.raises(ValueError, match=r"size: expected >= x\.shape"):
        pad_dim(x, 0, 3)
    with pytest.raises(ValueError, match="dim: expected a dim in"):
        pad_dim(x, 2, 8)
    with pytest.raises(ValueError, match=r"n: expected <= y\.shape"):
        unpad(x, 1, 5)
