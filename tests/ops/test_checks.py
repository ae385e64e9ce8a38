"""The shared argument checks: each error names the argument, what was expected and what
was received; they read metadata only, so they also run on meta / fake tensors."""

from __future__ import annotations

import pytest
import torch

from nki_kernels.ops.checks import check_positive, check_same, check_shape, check_tensor


def test_a_good_tensor_passes_and_is_returned() -> None:
    x = torch.ones(2, 3, dtype=torch.bfloat16)
    assert check_tensor("x", x) is x
    assert check_tensor("x", torch.empty(2, 3, device="meta")).device.type == "meta"
    check_shape("x", x, (2, 3))
    check_same("w", torch.ones(3, dtype=torch.bfloat16), "x", x)
    check_positive("eps", 1e-6)
    check_positive("eps", 3)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: check_tensor("x", [1.0]), TypeError, "x: expected a tensor; got list"),
        (
            lambda: check_tensor("x", torch.ones(2, dtype=torch.int32)),
            TypeError,
            "x: expected dtype float32, bfloat16, float16; got int32",
        ),
        (
            lambda: check_tensor("idx", torch.ones(2), dtypes=(torch.int32,)),
            TypeError,
            "idx: expected dtype int32; got float32",
        ),
        (
            lambda: check_tensor("x", torch.ones(()), min_dim=1),
            ValueError,
            "x: expected at least 1 dim(s); got shape ()",
        ),
        (
            lambda: check_tensor("x", torch.ones(4), min_dim=2),
            ValueError,
            "x: expected at least 2 dim(s); got shape (4,)",
        ),
        (
            lambda: check_tensor("x", torch.ones(0, 4)),
            ValueError,
            "x: expected a non-empty tensor; got shape (0, 4)",
        ),
        (
            lambda: check_shape("weight", torch.ones(5), (4,)),
            ValueError,
            "weight: expected shape (4,); got (5,)",
        ),
        (
            lambda: check_same("w", torch.ones(2), "x", torch.ones(2, dtype=torch.float16)),
            TypeError,
            "w: expected dtype float16 (as x); got float32",
        ),
        (
            lambda: check_same("w", torch.ones(2), "x", torch.ones(2, device="meta")),
            ValueError,
            "w: expected device meta (as x); got cpu",
        ),
        (lambda: check_positive("eps", 0.0), ValueError, "eps: expected a number > 0; got 0.0"),
        (lambda: check_positive("eps", -1), ValueError, "eps: expected a number > 0; got -1"),
        (
            lambda: check_positive("eps", float("nan")),
            ValueError,
            "eps: expected a number > 0; got nan",
        ),
        (lambda: check_positive("eps", True), TypeError, "eps: expected a number; got bool"),
        (lambda: check_positive("eps", "1e-6"), TypeError, "eps: expected a number; got str"),
    ],
)
def test_errors_name_the_argument_the_expectation_and_the_value(call, error, message) -> None:
    with pytest.raises(error) as e:
        call()
    assert str(e.value) == message


def test_the_empty_check_can_be_turned_off() -> None:
    assert check_tensor("mask", torch.ones(0, 4), nonempty=False).shape == (0, 4)
