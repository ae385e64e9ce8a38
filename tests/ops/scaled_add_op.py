"""A test-only op family that proves the op framework end to end.

`torch.ops.nki.testonly_scaled_add(x, y, alpha) = x + alpha * y` and
`torch.ops.nki.testonly_scale(x, alpha) = alpha * x`, each a small NKI kernel run through
the whole runtime: rows padded to their bucket, config looked up in the store, the kernel
specialized once per bucket shape, and the result sliced back. The autograd formula of
scaled_add calls scale, so the backward pass also runs NKI kernels.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from nki_kernels.kernel_config import InvalidConfig, KernelConfig
from nki_kernels.nki import nisa, nki, nl
from nki_kernels.ops import define_op
from nki_kernels.ops.checks import check_same, check_shape, check_tensor
from nki_kernels.runtime import launch, lookup_config, pad_to_bucket, unpad
from nki_kernels.targets import Target, get_target

# --- kernels (NKI dialect) ---------------------------------------------------------------


@nki.jit
def scaled_add_kernel(x, y, alpha, tile_cols):
    """out[N, H] = x + alpha * y, one (128 x tile_cols) tile at a time."""
    n, h = x.shape
    out = nl.ndarray((n, h), dtype=x.dtype, buffer=nl.shared_hbm)
    p = nl.tile_size.pmax
    for r in range(0, n, p):
        rows = min(p, n - r)
        for c in range(0, h, tile_cols):
            cols = min(tile_cols, h - c)
            xt = nl.ndarray((p, tile_cols), dtype=x.dtype, buffer=nl.sbuf)
            yt = nl.ndarray((p, tile_cols), dtype=y.dtype, buffer=nl.sbuf)
            ot = nl.ndarray((p, tile_cols), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xt[0:rows, 0:cols], src=x[r : r + rows, c : c + cols])
            nisa.dma_copy(dst=yt[0:rows, 0:cols], src=y[r : r + rows, c : c + cols])
            nisa.scalar_tensor_tensor(
                dst=ot[0:rows, 0:cols],
                data=yt[0:rows, 0:cols],
                op0=nl.multiply,
                operand0=alpha,
                op1=nl.add,
                operand1=xt[0:rows, 0:cols],
            )
            nisa.dma_copy(dst=out[r : r + rows, c : c + cols], src=ot[0:rows, 0:cols])
    return out


@nki.jit
def scale_kernel(x, alpha, tile_cols):
    """out[N, H] = alpha * x."""
    n, h = x.shape
    out = nl.ndarray((n, h), dtype=x.dtype, buffer=nl.shared_hbm)
    p = nl.tile_size.pmax
    for r in range(0, n, p):
        rows = min(p, n - r)
        for c in range(0, h, tile_cols):
            cols = min(tile_cols, h - c)
            xt = nl.ndarray((p, tile_cols), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xt[0:rows, 0:cols], src=x[r : r + rows, c : c + cols])
            nisa.tensor_scalar(
                dst=xt[0:rows, 0:cols], data=xt[0:rows, 0:cols], op0=nl.multiply, operand0=alpha
            )
            nisa.dma_copy(dst=out[r : r + rows, c : c + cols], src=xt[0:rows, 0:cols])
    return out


# --- config -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Problem:
    """The bucketed problem: padded rows, hidden size, dtype."""

    rows: int
    hidden: int
    dtype: str


@dataclasses.dataclass(frozen=True)
class ElementwiseConfig(KernelConfig):
    """Tunables of the test kernels: the free-dim tile width."""

    op_name = "testonly_scaled_add"
    tile_cols: int = 512

    @classmethod
    def heuristic(cls, problem: Any, target: Target) -> ElementwiseConfig:
        return cls(tile_cols=min(512, problem.hidden))

    @classmethod
    def search_space(cls, problem: Any, target: Target) -> dict[str, tuple[Any, ...]]:
        return {"tile_cols": (64, 128, 256, 512, 1024)}

    def validate(self, problem: Any, target: Target) -> None:
        if self.tile_cols > problem.hidden:
            raise InvalidConfig(f"tile_cols {self.tile_cols} > hidden {problem.hidden}")
        if 3 * self.tile_cols * 4 > target.sbuf_usable_bytes:
            raise InvalidConfig(f"tile_cols {self.tile_cols}: three fp32 tiles exceed SBUF")


def _run(kernel: Any, x: Tensor, *rest: Any) -> Tensor:
    """Pad rows to the bucket, look the config up, launch, slice back."""
    h = x.shape[-1]
    tensors = [t.reshape(-1, h) if isinstance(t, Tensor) else t for t in (x, *rest)]
    padded = [pad_to_bucket(t, 0)[0] if isinstance(t, Tensor) else t for t in tensors]
    n = tensors[0].shape[0]
    target = get_target(None)
    problem = Problem(rows=padded[0].shape[0], hidden=h, dtype=str(x.dtype).removeprefix("torch."))
    cfg = lookup_config("testonly_scaled_add", problem, kernel, target=target)
    out = launch(kernel, *padded, config=cfg, target=target)
    return unpad(out, 0, n).reshape(x.shape)


# --- ops --------------------------------------------------------------------------------


def _validate_add(x: Tensor, y: Tensor, alpha: float) -> None:
    check_tensor("x", x)
    check_tensor("y", y)
    check_same("y", y, "x", x)
    check_shape("y", y, x.shape)


def _setup_add(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.alpha = inputs[2]


def _backward_add(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
    return grad, torch.ops.nki.testonly_scale(grad, ctx.alpha), None


def _examples_add() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    x = torch.randn(5, 40, requires_grad=True)
    y = torch.randn(5, 40, requires_grad=True)
    z = torch.randn(2, 3, 130, dtype=torch.bfloat16)
    return [((x, y, 0.5), {}), ((z, z.clone(), -2.0), {})]


@define_op(
    "testonly_scaled_add",
    fake=lambda x, y, alpha: torch.empty_like(x),
    validate=_validate_add,
    backward=_backward_add,
    setup_context=_setup_add,
    examples=_examples_add,
)
def scaled_add(x: Tensor, y: Tensor, alpha: float) -> Tensor:
    """x + alpha * y through an NKI kernel."""
    return _run(scaled_add_kernel, x, y, alpha)


def _setup_scale(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.alpha = inputs[1]


def _backward_scale(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
    return torch.ops.nki.testonly_scale(grad, ctx.alpha), None


@define_op(
    "testonly_scale",
    fake=lambda x, alpha: torch.empty_like(x),
    validate=lambda x, alpha: check_tensor("x", x),
    backward=_backward_scale,
    setup_context=_setup_scale,
    examples=lambda: [((torch.randn(3, 7, requires_grad=True), 3.0), {})],
)
def scale(x: Tensor, alpha: float) -> Tensor:
    """alpha * x through an NKI kernel."""
    return _run(scale_kernel, x, alpha)
