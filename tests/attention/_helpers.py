"""Tolerance table and comparison helpers shared by the attention tests.

Tolerances are relative to the reference's largest magnitude (attention errors scale
with |V| and with the gradients' scale), derived from the unit roundoff u of the dtype
the kernels round to: an output goes through ~4 roundings to u (P, the P @ V operands,
the final cast), a gradient through ~8 (P, dS, dS^T, the dQ / dK operands, casts), each
bounded by u relative; fp32 (u = 2^-24) gets a floor for the fp32 exp / log / reciprocal
of the engines and sums over up to a few thousand keys.
"""

from __future__ import annotations

import torch

from nki_kernels.attention.reference import attention_reference

U = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
FP32_FLOOR = 2e-5

# dtype: (output tolerance, gradient tolerance), relative to max |reference|
TOLERANCES = {
    torch.float32: (FP32_FLOOR, 2 * FP32_FLOOR),
    torch.bfloat16: (4 * U[torch.bfloat16], 8 * U[torch.bfloat16]),
    torch.float16: (4 * U[torch.float16], 8 * U[torch.float16]),
}
LSE_ATOL = 1e-4  # lse is fp32 from fp32 statistics for every input dtype
# Magnitude floor: a reference that is exactly 0 (e.g. dq with a 1-key window, where
# softmax is identically 1) is judged at the scale of the unit-variance test data.
SCALE_FLOOR = 0.05


def assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str) -> None:
    """|actual - expected| <= tol * max|expected| elementwise (and finite)."""
    a = actual.detach().float().cpu()
    e = expected.detach().float().cpu()
    scale = max(float(e.abs().max()), SCALE_FLOOR) if e.numel() else 1.0
    torch.testing.assert_close(a, e, atol=tol * scale, rtol=0.0, msg=lambda m: f"{what}: {m}")


def assert_lse_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    a, e = actual.detach().float().cpu(), expected.detach().float().cpu()
    assert torch.equal(torch.isneginf(a), torch.isneginf(e)), "lse: -inf rows differ"
    fin = torch.isfinite(e)
    torch.testing.assert_close(a[fin], e[fin], atol=LSE_ATOL, rtol=1e-5, msg=lambda m: f"lse: {m}")


def make_inputs(
    b: int,
    hq: int,
    hkv: int,
    sq: int,
    sk: int,
    d: int,
    dtype: torch.dtype,
    seed: int = 0,
    device: str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, sq, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, sk, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, sk, d, generator=g).to(dtype)
    return tuple(t.to(device).requires_grad_() for t in (q, k, v))  # type: ignore[return-value]


def reference_grads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor, **kw: object
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """fp32 reference out, lse and (dq, dk, dv) on CPU copies of the inputs."""
    qf, kf, vf = (t.detach().cpu().float().requires_grad_() for t in (q, k, v))
    out, lse = attention_reference(qf, kf, vf, **kw)  # type: ignore[arg-type]
    out.backward(grad.detach().cpu().float())
    assert qf.grad is not None and kf.grad is not None and vf.grad is not None
    return out.detach(), lse.detach(), (qf.grad, kf.grad, vf.grad)
