"""Shared pieces of the property-based suite: the case counter, the device / compile
axes, and the comparison against the float64 references.

Tolerances are normalized by max |reference| (the errors of attention, MoE and norms
scale with the data's magnitude), from the unit roundoff u of the dtype the kernels
round to: a handful of roundings to u for an output, about twice that for gradients,
and for fp32 a floor for the engines' fp32 exp / rsqrt / sums (the unit tests'
tolerance tables, with the same reasoning).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st

from nki_kernels.testing import neuron_device

CASES: dict[str, int] = {}

U = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
FP32_FLOOR = 2e-5
# dtype: (output tolerance, gradient tolerance), relative to max |reference|
TOL = {
    torch.float32: (FP32_FLOOR, 4 * FP32_FLOOR),
    torch.bfloat16: (4 * U[torch.bfloat16], 8 * U[torch.bfloat16]),
    torch.float16: (4 * U[torch.float16], 8 * U[torch.float16]),
}
SCALE_FLOOR = 0.05  # a reference that is ~0 is judged at the scale of unit-variance data

DEVICES = ["cpu", "neuron"] if neuron_device.is_installed() else ["cpu"]
devices = st.sampled_from(DEVICES)
modes = st.sampled_from(["eager", "compile"])


def count_case(family: str) -> None:
    """Record one case of `family` (an op family or 'bad-input')."""
    CASES[family] = CASES.get(family, 0) + 1


def run(fn: Callable[..., Any], mode: str, *args: Any) -> Any:
    """fn(*args) eagerly or through torch.compile (aot_eager, fullgraph, fresh cache)."""
    if mode == "eager":
        return fn(*args)
    torch._dynamo.reset()
    return torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)


def leaf(t: torch.Tensor | None, device: str, grad: bool) -> torch.Tensor | None:
    if t is None:
        return None
    x = t.detach().to(device)
    return x.requires_grad_(True) if grad else x


def assert_rel(
    got: torch.Tensor | None, want: torch.Tensor, tol: float, what: str, floor: float = 0.0
) -> None:
    """|got - want| <= tol * max(max |want|, SCALE_FLOOR, floor) elementwise, got finite
    (`floor`: the magnitude of the terms a cancelling sum is made of)."""
    assert got is not None, f"{what}: missing"
    g = got.detach().to("cpu", torch.float64)
    w = want.detach().to(torch.float64)
    assert g.shape == w.shape, f"{what}: shape {tuple(g.shape)} != {tuple(w.shape)}"
    assert bool(torch.isfinite(g).all()), f"{what}: {int((~torch.isfinite(g)).sum())} non-finite"
    scale = max(float(w.abs().max()) if w.numel() else 0.0, SCALE_FLOOR, floor)
    err = float((g - w).abs().max()) if w.numel() else 0.0
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:.3g} * {scale:.3g}"
