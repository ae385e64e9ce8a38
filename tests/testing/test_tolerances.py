"""Tolerance table and reference helpers."""

from __future__ import annotations

import math

import pytest
import torch

from nki_kernels.testing.reference import reference
from nki_kernels.testing.tolerances import TOLERANCES, UNIT_ROUNDOFF, assert_close, tolerance


def test_table_is_derived_from_unit_roundoff() -> None:
    assert TOLERANCES[torch.bfloat16].rtol == pytest.approx(2 * 2.0**-8 + 4 * 2.0**-24)
    assert TOLERANCES[torch.float16].rtol == pytest.approx(2 * 2.0**-11 + 4 * 2.0**-24)
    assert TOLERANCES[torch.float32].rtol == pytest.approx(16 * 2.0**-24)
    big = tolerance(torch.float32, reduction=1 << 20)
    assert big.rtol == pytest.approx(2 * 2.0**-24 + math.sqrt(1 << 20) * 4 * 2.0**-24)
    assert tolerance(torch.bfloat16, scale=10.0).atol == pytest.approx(
        10 * TOLERANCES[torch.bfloat16].rtol
    )
    with pytest.raises(ValueError, match="dtype: expected one of"):
        tolerance(torch.int32)


@pytest.mark.parametrize("dtype", list(UNIT_ROUNDOFF))
def test_one_rounding_passes_and_a_real_error_fails(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    exact = torch.randn(1000)
    assert_close(exact.to(dtype), exact)  # one rounding of the output: within tolerance
    wrong = exact.to(dtype).clone()
    wrong[17] += 8 * UNIT_ROUNDOFF[dtype] * max(1.0, abs(exact[17].item())) + 1e-3
    with pytest.raises(AssertionError, match="case 3"):
        assert_close(wrong, exact, msg="case 3")


def test_reference_runs_fp32_on_cpu_with_grads() -> None:
    x = torch.randn(3, 4, dtype=torch.bfloat16)
    w = torch.randn(4, dtype=torch.bfloat16)
    g = torch.ones(3, 4)
    out, grads = reference(lambda a, b, s: a * b * s, x, w, 2.0, grad_outputs=g)
    assert out.dtype == torch.float32 and not out.requires_grad
    torch.testing.assert_close(out, x.float() * w.float() * 2)
    torch.testing.assert_close(grads[0], (w.float() * 2).expand(3, 4))
    torch.testing.assert_close(grads[1], x.float().sum(0) * 2)
    assert grads[2] is None
