"""Per-dtype tolerances for comparing kernel outputs with fp32 references.

Derived, not guessed. `u` is the unit roundoff of the output dtype (half an ulp at 1.0):
fp32 2^-24, bf16 2^-8, fp16 2^-11. A kernel that computes in fp32 and rounds once on
store is within u of the fp32 reference, plus the rounding of low-precision inputs that
the reference reads exactly; `rtol = 2u` covers both. `atol` handles results near zero
(cancellation) at the magnitude of the inputs: 2u for unit-scale data.

Reductions over n terms accumulated in fp32 add an error growing like sqrt(n) * u_fp32
(random-walk bound); `tolerance(dtype, reduction=n)` adds that term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

UNIT_ROUNDOFF: dict[torch.dtype, float] = {
    torch.float32: 2.0**-24,
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
}


@dataclass(frozen=True)
class Tolerance:
    """Absolute and relative tolerance for `torch.testing.assert_close`."""

    atol: float
    rtol: float


def tolerance(dtype: torch.dtype, reduction: int = 1, scale: float = 1.0) -> Tolerance:
    """Tolerance for outputs of `dtype` from fp32 math over `reduction` summed terms.

    `scale` is the magnitude of the data (atol grows with it).
    """
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype: expected one of {list(UNIT_ROUNDOFF)}; got {dtype}")
    if reduction < 1:
        raise ValueError(f"reduction: expected >= 1; got {reduction}")
    u = UNIT_ROUNDOFF[dtype]
    acc = math.sqrt(reduction) * UNIT_ROUNDOFF[torch.float32] * 4
    rtol = 2 * u + acc
    # fp32 outputs: a floor of a few ulps for the engine's fp32 transcendental/divide error
    if dtype == torch.float32:
        rtol = max(rtol, 16 * u)
    return Tolerance(atol=rtol * scale, rtol=rtol)


TOLERANCES: dict[torch.dtype, Tolerance] = {d: tolerance(d) for d in UNIT_ROUNDOFF}


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
    tol: Tolerance | None = None,
    msg: str = "",
) -> None:
    """Compare `actual` (any device, any dtype) with an fp32 `expected` on CPU."""
    d = dtype or actual.dtype
    t = tol or TOLERANCES[d]
    a = actual.detach().to("cpu", torch.float32)
    e = expected.detach().to("cpu", torch.float32)
    if msg:
        torch.testing.assert_close(a, e, atol=t.atol, rtol=t.rtol, msg=lambda m: f"{msg}: {m}")
    else:
        torch.testing.assert_close(a, e, atol=t.atol, rtol=t.rtol)


__all__ = ["TOLERANCES", "UNIT_ROUNDOFF", "Tolerance", "assert_close", "tolerance"]
