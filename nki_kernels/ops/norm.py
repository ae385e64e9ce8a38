"""Norm ops: `torch.ops.nki.rms_norm`, `layer_norm`, `add_rms_norm` (+ their backward ops).

    rms_norm(x [..., H], weight [H] | None, eps) -> y [..., H]
    layer_norm(x [..., H], weight [H] | None, bias [H] | None, eps) -> y [..., H]
    add_rms_norm(x [..., H], residual [..., H], weight [H] | None, eps)
        -> (y = rms_norm(x + residual), h = x + residual)

x, residual, weight, bias share one dtype (fp32, bf16 or fp16) and one device; statistics
are fp32. A call flattens the leading dims to N rows, pads N to its bucket
(`runtime.bucket`, the default policy: 128, powers of two to 4096, then multiples of
1024; padded rows are zeros and are dropped), looks up the config of the bucket, runs
the NKI kernel and slices the rows back.

Autograd runs NKI backward kernels (dx, dweight, dbias, with the weight / bias gradient
reduced across rows on chip). A custom op's autograd can save only inputs and outputs, so
the backward recomputes the per-row statistics instead of keeping them from the forward:
inside the backward kernel when its config holds row tiles in SBUF (x read once), else
with an NKI statistics kernel first (one more read of x). `add_rms_norm`'s backward folds the
gradient of h into dx inside the kernel; x and residual receive the same gradient.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..norm.config import NormProblem, stats_in_kernel
from ..norm.layernorm import layer_norm_fwd, layer_norm_stats
from ..norm.layernorm_bwd import layer_norm_bwd
from ..norm.limits import max_hidden
from ..norm.rmsnorm import add_rms_norm_fwd, rms_norm_fwd, rms_norm_stats
from ..norm.rmsnorm_bwd import rms_norm_bwd
from ..norm.tiling import COLSUM_MAX_H
from ..runtime import launch, lookup_config, pad_to_bucket, unpad
from ..targets import get_target
from .checks import FLOAT_DTYPES, check_same, check_shape, check_tensor
from .registry import define_op


# ---- argument checks (metadata only: they also run on FakeTensors) ------------------------
def _check_eps(eps: Any) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps: expected a float; got {type(eps).__name__} {eps!r}")
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps: expected a finite number > 0; got {eps}")


def _check_x(arg: str, x: Any) -> int:
    check_tensor(arg, x, dtypes=FLOAT_DTYPES, min_dim=1)
    return int(x.shape[-1])


def _check_affine(arg: str, t: Any, x: Tensor, hidden: int) -> None:
    if t is None:
        return
    check_tensor(arg, t, dtypes=FLOAT_DTYPES, min_dim=1)
    check_same(arg, t, "x", x)
    check_shape(arg, t, (hidden,))


def _check_grad(arg: str, g: Any, like: Tensor, like_arg: str) -> None:
    if g is None:
        return
    check_tensor(arg, g, dtypes=FLOAT_DTYPES, min_dim=1)
    if g.device != like.device:
        raise ValueError(f"{arg}: expected device {like.device} (as {like_arg}); got {g.device}")
    check_shape(arg, g, tuple(like.shape))


def _check_hidden(
    op: str, x: Tensor, weight: Tensor | None, bias: Tensor | None, backward: bool, arg: str = "x"
) -> None:
    """H within what the op's SBUF / PSUM plans hold (`norm.limits`), else a ValueError
    naming the argument, the limit and the value."""
    hidden = int(x.shape[-1])
    dtype = str(x.dtype).removeprefix("torch.")
    affine = ("w" if weight is not None else "") + ("b" if bias is not None else "") or "none"
    target = get_target(None).name
    limit = max_hidden(op, backward, dtype, affine, target)
    if hidden > limit:
        params = {"none": "no weight", "w": "weight", "b": "bias", "wb": "weight and bias"}
        raise ValueError(
            f"{arg}: expected hidden size (last dim) <= {limit} for {op} "
            f"{'backward' if backward else 'forward'} ({dtype}, {params[affine]}, {target}); "
            f"got {hidden}"
        )


def _check_rms(x: Tensor, weight: Tensor | None, eps: float) -> None:
    h = _check_x("x", x)
    _check_affine("weight", weight, x, h)
    _check_eps(eps)


def _check_ln(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> None:
    h = _check_x("x", x)
    _check_affine("weight", weight, x, h)
    _check_affine("bias", bias, x, h)
    _check_eps(eps)


def _check_add_rms(x: Tensor, residual: Tensor, weight: Tensor | None, eps: float) -> None:
    _check_rms(x, weight, eps)
    check_tensor("residual", residual, dtypes=FLOAT_DTYPES, min_dim=1)
    check_same("residual", residual, "x", x)
    check_shape("residual", residual, tuple(x.shape))
    _check_hidden("add_rms_norm", x, weight, None, backward=False)


def _check_rms_fwd(x: Tensor, weight: Tensor | None, eps: float) -> None:
    _check_rms(x, weight, eps)
    _check_hidden("rms_norm", x, weight, None, backward=False)


def _check_ln_fwd(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> None:
    _check_ln(x, weight, bias, eps)
    _check_hidden("layer_norm", x, weight, bias, backward=False)


# ---- host plumbing ----------------------------------------------------------------------
def _rows(x: Tensor) -> tuple[Tensor, int]:
    """x as [N_bucket, H] (contiguous, zero-padded rows) and the true N."""
    return pad_to_bucket(x.reshape(-1, x.shape[-1]).contiguous(), dim=0)


def _problem(xp: Tensor, weight: Tensor | None, bias: Tensor | None = None) -> NormProblem:
    affine = ("w" if weight is not None else "") + ("b" if bias is not None else "")
    return NormProblem(
        rows=int(xp.shape[0]),
        hidden=int(xp.shape[1]),
        dtype=str(xp.dtype).removeprefix("torch."),
        affine=affine or "none",
    )


def _back(t: Tensor, n: int, shape: torch.Size) -> Tensor:
    return unpad(t, 0, n).reshape(shape)


def _no_grad_tensor(like: Tensor) -> Tensor:
    """Stands for an absent parameter's gradient (custom ops cannot return None)."""
    return like.new_empty((0,))


def _rms_forward(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    target = get_target(None)
    xp, n = _rows(x)
    cfg = lookup_config("rms_norm", _problem(xp, weight), rms_norm_fwd, target=target)
    y, _ = launch(rms_norm_fwd, xp, weight, float(eps), config=cfg, target=target)
    return _back(y, n, x.shape)


def _colsums(g: Tensor, like: Tensor) -> Tensor:
    """A weight gradient from the backward kernel: [H] as is, or (LNC 2) the [2, H] fp32
    column sums of the two programs, added here and rounded once to `like`'s dtype."""
    return g if g.dim() == 1 else g.sum(0).to(like.dtype)


def _rms_backward(
    grad: Tensor, x: Tensor, weight: Tensor | None, eps: float, grad_h: Tensor | None, op: str
) -> tuple[Tensor, Tensor]:
    """(dx, dweight) through the NKI backward kernel (after the statistics kernel when the
    backward's config does not compute rstd itself); grad_h is added to dx."""
    target = get_target(None)
    xp, n = _rows(x)
    gp, _ = _rows(grad.to(x.dtype))
    hp = _rows(grad_h.to(x.dtype))[0] if grad_h is not None else None
    problem = _problem(xp, weight)
    bcfg = lookup_config(op, problem, rms_norm_bwd, target=target)
    rstd = None
    if not stats_in_kernel(bcfg):
        fcfg = lookup_config("rms_norm", problem, rms_norm_stats, target=target)
        rstd = launch(rms_norm_stats, xp, float(eps), config=fcfg, target=target)
    out = launch(rms_norm_bwd, gp, xp, weight, rstd, hp, config=bcfg, target=target, eps=float(eps))
    if weight is None:
        return _back(out, n, x.shape), _no_grad_tensor(x)
    dx, dw = out
    return _back(dx, n, x.shape), _colsums(dw, weight if weight is not None else x)


def _ln_forward(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    target = get_target(None)
    xp, n = _rows(x)
    cfg = lookup_config("layer_norm", _problem(xp, weight, bias), layer_norm_fwd, target=target)
    y, _, _ = launch(layer_norm_fwd, xp, weight, bias, float(eps), config=cfg, target=target)
    return _back(y, n, x.shape)


def _ln_backward(
    grad: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    target = get_target(None)
    xp, n = _rows(x)
    gp, _ = _rows(grad.to(x.dtype))
    problem = _problem(xp, weight, bias)
    bcfg = lookup_config("layer_norm_bwd", problem, layer_norm_bwd, target=target)
    mean = rstd = None
    if not stats_in_kernel(bcfg):
        fcfg = lookup_config("layer_norm", problem, layer_norm_stats, target=target)
        mean, rstd = launch(layer_norm_stats, xp, float(eps), config=fcfg, target=target)
    dx, dw, db = launch(
        layer_norm_bwd,
        gp,
        xp,
        weight,
        bias is not None,
        mean,
        rstd,
        config=bcfg,
        target=target,
        eps=float(eps),
    )
    dw = _colsums(dw, weight if weight is not None else x) if dw is not None else _no_grad_tensor(x)
    db = _colsums(db, weight if weight is not None else x) if db is not None else _no_grad_tensor(x)
    return _back(dx, n, x.shape), dw, db


def _add_rms_forward(
    x: Tensor, residual: Tensor, weight: Tensor | None, eps: float
) -> tuple[Tensor, Tensor]:
    target = get_target(None)
    xp, n = _rows(x)
    rp, _ = _rows(residual)
    cfg = lookup_config("add_rms_norm", _problem(xp, weight), add_rms_norm_fwd, target=target)
    y, h, _ = launch(add_rms_norm_fwd, xp, rp, weight, float(eps), config=cfg, target=target)
    return _back(y, n, x.shape), _back(h, n, x.shape)


# ---- the ops --------------------------------------------------------------------------------
def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _rms_examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = _gen()
    x = torch.randn(3, 50, 96, generator=g, requires_grad=True)
    w = torch.randn(96, generator=g, requires_grad=True)
    return [((x, w, 1e-6), {}), ((torch.randn(7, 33, generator=g), None, 1e-5), {})]


def _rms_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_grad(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    x, weight = ctx.saved_tensors
    dx, dw = torch.ops.nki.rms_norm_backward(grad, x, weight, ctx.eps)
    return dx, (dw if weight is not None else None), None


@define_op(
    "rms_norm",
    fake=lambda x, weight, eps: torch.empty_like(x),
    validate=_check_rms_fwd,
    backward=_rms_grad,
    setup_context=_rms_setup,
    examples=_rms_examples,
    traceable=True,
)
def _rms_norm_op(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """y = x / sqrt(mean(x^2, last dim) + eps) * weight."""
    return _rms_forward(x, weight, eps)


def _check_rms_bwd(grad: Tensor, x: Tensor, weight: Tensor | None, eps: float) -> None:
    _check_rms(x, weight, eps)
    _check_grad("grad", grad, x, "x")
    _check_hidden("rms_norm", x, weight, None, backward=True)


def _rms_bwd_fake(grad: Tensor, x: Tensor, weight: Tensor | None, eps: float) -> Any:
    return torch.empty_like(x), (torch.empty_like(weight) if weight is not None else x.new_empty(0))


def _rms_bwd_examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = _gen()
    x = torch.randn(3, 50, 96, generator=g)
    return [((torch.randn(3, 50, 96, generator=g), x, torch.randn(96, generator=g), 1e-6), {})]


@define_op(
    "rms_norm_backward",
    fake=_rms_bwd_fake,
    validate=_check_rms_bwd,
    examples=_rms_bwd_examples,
    traceable=True,
)
def _rms_norm_backward_op(
    grad: Tensor, x: Tensor, weight: Tensor | None, eps: float
) -> tuple[Tensor, Tensor]:
    """(dx, dweight) of rms_norm; dweight is empty when weight is None."""
    return _rms_backward(grad, x, weight, eps, None, "rms_norm_bwd")


def _ln_examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = _gen()
    x = torch.randn(3, 50, 96, generator=g, requires_grad=True)
    w = torch.randn(96, generator=g, requires_grad=True)
    b = torch.randn(96, generator=g, requires_grad=True)
    return [((x, w, b, 1e-5), {}), ((torch.randn(7, 33, generator=g), None, None, 1e-5), {})]


def _ln_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.eps = eps


def _ln_grad(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    x, weight, bias = ctx.saved_tensors
    dx, dw, db = torch.ops.nki.layer_norm_backward(grad, x, weight, bias, ctx.eps)
    return dx, (dw if weight is not None else None), (db if bias is not None else None), None


@define_op(
    "layer_norm",
    fake=lambda x, weight, bias, eps: torch.empty_like(x),
    validate=_check_ln_fwd,
    backward=_ln_grad,
    setup_context=_ln_setup,
    examples=_ln_examples,
    traceable=True,
)
def _layer_norm_op(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim."""
    return _ln_forward(x, weight, bias, eps)


def _check_ln_bwd(
    grad: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> None:
    _check_ln(x, weight, bias, eps)
    _check_grad("grad", grad, x, "x")
    _check_hidden("layer_norm", x, weight, bias, backward=True)


def _ln_bwd_fake(
    grad: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> Any:
    def like(t: Tensor | None) -> Tensor:
        return torch.empty_like(t) if t is not None else x.new_empty(0)

    return torch.empty_like(x), like(weight), like(bias)


def _ln_bwd_examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = _gen()
    x = torch.randn(3, 50, 96, generator=g)
    w, b = torch.randn(96, generator=g), torch.randn(96, generator=g)
    return [((torch.randn(3, 50, 96, generator=g), x, w, b, 1e-5), {})]


@define_op(
    "layer_norm_backward",
    fake=_ln_bwd_fake,
    validate=_check_ln_bwd,
    examples=_ln_bwd_examples,
    traceable=True,
)
def _layer_norm_backward_op(
    grad: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias) of layer_norm; absent parameters get empty gradients."""
    return _ln_backward(grad, x, weight, bias, eps)


def _add_examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = _gen()
    x = torch.randn(3, 50, 96, generator=g, requires_grad=True)
    r = torch.randn(3, 50, 96, generator=g, requires_grad=True)
    w = torch.randn(96, generator=g, requires_grad=True)
    return [((x, r, w, 1e-6), {})]


def _add_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, _, weight, eps = inputs
    ctx.save_for_backward(output[1], weight)
    ctx.eps = eps


def _add_grad(ctx: Any, grad_y: Tensor | None, grad_h: Tensor | None) -> tuple[Any, ...]:
    h, weight = ctx.saved_tensors
    if grad_y is None:
        grad_y = torch.zeros_like(h)
    dx, dw = torch.ops.nki.add_rms_norm_backward(grad_y, grad_h, h, weight, ctx.eps)
    return dx, dx, (dw if weight is not None else None), None


@define_op(
    "add_rms_norm",
    fake=lambda x, residual, weight, eps: (torch.empty_like(x), torch.empty_like(x)),
    validate=_check_add_rms,
    backward=_add_grad,
    setup_context=_add_setup,
    examples=_add_examples,
    traceable=True,
)
def _add_rms_norm_op(
    x: Tensor, residual: Tensor, weight: Tensor | None, eps: float
) -> tuple[Tensor, Tensor]:
    """(rms_norm(x + residual), x + residual), the sum rounded to x.dtype, in one pass."""
    return _add_rms_forward(x, residual, weight, eps)


def _check_add_bwd(
    grad_y: Tensor, grad_h: Tensor | None, h: Tensor, weight: Tensor | None, eps: float
) -> None:
    _check_rms(h, weight, eps)
    _check_grad("grad_y", grad_y, h, "h")
    _check_grad("grad_h", grad_h, h, "h")
    _check_hidden("add_rms_norm", h, weight, None, backward=True, arg="h")


def _add_bwd_fake(
    grad_y: Tensor, grad_h: Tensor | None, h: Tensor, weight: Tensor | None, eps: float
) -> Any:
    return torch.empty_like(h), (torch.empty_like(weight) if weight is not None else h.new_empty(0))


def _add_bwd_examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = _gen()
    h = torch.randn(3, 50, 96, generator=g)
    gy, gh = torch.randn(3, 50, 96, generator=g), torch.randn(3, 50, 96, generator=g)
    w = torch.randn(96, generator=g)
    return [((gy, gh, h, w, 1e-6), {}), ((gy, None, h, w, 1e-6), {})]


@define_op(
    "add_rms_norm_backward",
    fake=_add_bwd_fake,
    validate=_check_add_bwd,
    examples=_add_bwd_examples,
    traceable=True,
)
def _add_rms_norm_backward_op(
    grad_y: Tensor, grad_h: Tensor | None, h: Tensor, weight: Tensor | None, eps: float
) -> tuple[Tensor, Tensor]:
    """(d(x + residual), dweight) of add_rms_norm from the gradients of y and h."""
    return _rms_backward(grad_y, h, weight, eps, grad_h, "add_rms_norm_bwd")


__all__ = ["COLSUM_MAX_H"]
