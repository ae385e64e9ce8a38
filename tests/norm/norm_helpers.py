"""Shared pieces of the norm tests: inputs, fp32 references and derived error bounds.

Every comparison is elementwise: |got - ref| <= bound, where the bound is derived from
how the kernel computes the value (see the kernels' docstrings):

- each rounding to the output dtype costs u * |value rounded| + tiny / 2 (u = the dtype's
  unit roundoff, tiny its smallest subnormal: below the normal range rounding is
  absolute), both from the tolerance table of the calling test module;
- each fp32 statistic or gradient sum over n terms costs at most sqrt(n) * 2^-22 of the
  sum of the terms' magnitudes (random-walk growth of 2^-24 per add, with a 4x margin),
  which the bound carries as `acc(n) * magnitude`.

The magnitudes are computed from the fp32 reference's own intermediates, so a bound is
tight where the values are small and never hides a wrong result behind a global atol.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from nki_kernels.norm import reference as ref

EPS = 1e-6
# Tolerance table of every norm test module: (u, tiny) per dtype -- unit roundoff (half an
# ulp at 1.0) and smallest subnormal. The bounds below take them as u * |value| + tiny / 2
# per rounding to the dtype, plus the fp32 summation terms of the statistics and gradients.
TOL = {
    torch.float32: (2.0**-24, 2.0**-149),
    torch.bfloat16: (2.0**-8, 2.0**-133),
    torch.float16: (2.0**-11, 2.0**-24),
}


def acc(n: int) -> float:
    """Relative error of an fp32 sum over n terms (random walk, 4x margin), plus a floor for
    the engines' fp32 rsqrt / products."""
    return math.sqrt(max(n, 1)) * 2.0**-22 + 2.0**-20


def make(shape: tuple[int, ...], dtype: torch.dtype, seed: int, loc: float = 0.0) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return (loc + torch.randn(shape, generator=g)).to(dtype)


def assert_within(name: str, got: Tensor, want: Tensor, bound: Tensor) -> None:
    """|got - want| <= bound elementwise (want, bound fp32 on CPU), with a clear message."""
    g = got.detach().to("cpu", torch.float32)
    assert g.shape == want.shape, f"{name}: shape {tuple(g.shape)} != {tuple(want.shape)}"
    err = (g - want).abs()
    excess = err - bound
    if not bool((excess <= 0).all()) or not bool(torch.isfinite(g).all()):
        i = int(torch.argmax(torch.nan_to_num(excess, nan=float("inf"))))
        raise AssertionError(
            f"{name}: |got - ref| exceeds the derived bound at flat index {i}: got "
            f"{g.reshape(-1)[i].item():.6g}, ref {want.reshape(-1)[i].item():.6g}, "
            f"err {err.reshape(-1)[i].item():.3g} > bound {bound.reshape(-1)[i].item():.3g} "
            f"(max err {err.max().item():.3g})"
        )


def rms_fwd_bound(
    x: Tensor, w: Tensor | None, u: float, tiny: float, eps: float = EPS
) -> tuple[Tensor, Tensor]:
    """(y_ref, bound): y = round(round(x * rstd) * w), rstd from an fp32 sum over H."""
    y, _ = ref.rms_norm_ref(x, w, eps)
    rounds = 2 if w is not None else 1
    wmag = w.float().abs() if w is not None else 1.0
    return y, (rounds * u + acc(x.shape[-1])) * y.abs() + tiny * (1.0 + wmag)


def ln_fwd_bound(
    x: Tensor, w: Tensor | None, b: Tensor | None, u: float, tiny: float, eps: float = 1e-5
) -> tuple[Tensor, Tensor]:
    """(y_ref, bound): xn = round((x - mean) * rstd); y = round(round(xn * w) + b).

    The statistics' fp32 error (relative acc(H) of the row's magnitude |x|) moves xn by
    acc(H) * max|x| * rstd; each rounding costs u of the value rounded.
    """
    y, mean, rstd = ref.layer_norm_ref(x, w, b, eps)
    xf = x.float()
    xn = (xf - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    wf = w.float() if w is not None else torch.ones(x.shape[-1])
    xw = (xn * wf).abs()
    rowmax = xf.abs().amax(dim=-1, keepdim=True) * rstd.unsqueeze(-1)
    stat = acc(x.shape[-1]) * (xw + rowmax * wf.abs())
    rounds = (w is not None) + (b is not None)
    bound = u * xw * (1 + (w is not None)) + (u * y.abs() if b is not None else 0) + stat
    if rounds == 0:
        bound = u * y.abs() + stat
    return y, bound + tiny * (2.0 + wf.abs())


def rms_bwd_bounds(
    dy: Tensor, x: Tensor, w: Tensor | None, u: float, tiny: float
) -> dict[str, tuple[Tensor, Tensor]]:
    """{'dx': (ref, bound), 'dw': (ref, bound)} of the RMSNorm backward.

    dx = rstd * g + x * coef (fp32, one rounding): u * |dx| + acc(H) * (|rstd g| + |x coef|).
    dw = sum_rows(dy * x * rstd) in fp32 (one rounding to w's dtype, the same as x's).
    """
    dx, dw = ref.rms_norm_bwd_ref(dy, x, w, EPS)
    xf, dyf = x.float(), dy.float()
    _, rstd = ref.rms_norm_ref(xf, None, EPS)
    r = rstd.unsqueeze(-1)
    g = dyf * (w.float() if w is not None else 1.0)
    h = x.shape[-1]
    coef = r**3 * (g * xf).sum(-1, keepdim=True) / h
    terms = (r * g).abs() + (xf * coef).abs()
    out = {"dx": (dx, u * dx.abs() + acc(h) * terms + tiny)}
    if w is not None:
        t = (dyf * xf * r).reshape(-1, h).abs().sum(0)
        out["dw"] = (dw, u * dw.abs() + acc(x.numel() // h) * t + tiny)
    return out


def ln_bwd_bounds(
    dy: Tensor, x: Tensor, w: Tensor | None, b: Tensor | None, u: float, tiny: float
) -> dict[str, tuple[Tensor, Tensor]]:
    """Bounds of the LayerNorm backward, as `rms_bwd_bounds` (dx = rstd g + c1 x + c0)."""
    dx, dw, db = ref.layer_norm_bwd_ref(dy, x, w, b, 1e-5)
    xf, dyf = x.float(), dy.float()
    _, mean, rstd = ref.layer_norm_ref(xf, None, None, 1e-5)
    r, m = rstd.unsqueeze(-1), mean.unsqueeze(-1)
    g = dyf * (w.float() if w is not None else 1.0)
    h = x.shape[-1]
    xm = xf - m
    c1 = r**3 * (g * xm).sum(-1, keepdim=True) / h
    terms = (r * g).abs() + (xm * c1).abs() + (r * g.sum(-1, keepdim=True) / h).abs()
    terms = terms + (xf * c1).abs()
    out = {"dx": (dx, u * dx.abs() + acc(h) * terms + tiny)}
    rows = x.numel() // h
    if w is not None:
        t = (dyf * xm * r).reshape(-1, h).abs().sum(0)
        out["dw"] = (dw, u * dw.abs() + acc(rows) * t + tiny)
    if b is not None:
        t = dyf.reshape(-1, h).abs().sum(0)
        out["db"] = (db, u * db.abs() + acc(rows) * t + tiny)
    return out


def check_all(
    got: Mapping[str, Tensor | None], want: Mapping[str, tuple[Tensor, Tensor]], where: str
) -> None:
    for name, (r, bnd) in want.items():
        g = got[name]
        assert g is not None, f"{where}: {name} missing"
        assert_within(f"{where}: {name}", g, r, bnd)
