"""`torch.ops.nki.moe_dispatch` / `moe_combine`: the row gathers around the expert
matmuls of `moe_gated_experts`, on the NKI kernels of `moe/row_gather.py`.

    moe_dispatch(hidden [T, H], row_token [R] int32, slot [T, k] int32) -> [R, H]
        x_sorted[r] = hidden[row_token[r]]      (row_token[r] = T: a zero row)
    moe_combine(y [R, H], weights [T, k], slot [T, k] int32, row_token [R] int32,
                row_slot [R] int32) -> [T, H] fp32
        out[t] = sum_j weights[t, j] y[slot[t, j]]   (slot[t, j] = R: nothing, whatever
                                                      the weight: it is selected to 0)

`row_token` / `row_slot` (each sorted row's token and flat slot t * k + j, or T / T * k
for a row that serves no slot) and `slot` (each (token, j)'s sorted row, or R) are the
two directions of one routing permutation; each op's backward is the other direction on
the same kernels: d hidden[t] = sum_j d x[slot[t, j]]; d y[r] = w(r) d out[row_token[r]]
and d w[t, j] = <d out[t], y[slot[t, j]]> (`gather_rows_dot`; 0 where slot = R).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..moe.row_gather import gather_rows_dot, gather_rows_sum
from ..runtime import launch
from ..targets import get_target
from .checks import FLOAT_DTYPES, check_tensor
from .registry import define_op

INDEX = (torch.int32,)


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _sum(src: Tensor, index: Tensor, weight: Tensor | None, dtype: torch.dtype) -> Tensor:
    """gather_rows_sum (NKI): out[m] = sum_j weight[m, j] src[index[m, j]]."""
    if index.shape[0] == 0:
        return src.new_zeros((0, src.shape[1]), dtype=dtype)
    w = None if weight is None else weight.detach().to(torch.float32).contiguous()
    return launch(gather_rows_sum, src.detach().contiguous(), index.contiguous(), w, _dt(dtype),
                  target=get_target(None))  # fmt: skip


def _check_index(arg: str, index: Tensor, shape: tuple[int, ...], device: Any) -> None:
    check_tensor(arg, index, dtypes=INDEX, min_dim=1, nonempty=False)
    if tuple(index.shape) != shape:
        raise ValueError(f"{arg}: expected shape {shape}; got {tuple(index.shape)}")
    if index.device != device:
        raise ValueError(f"{arg}: expected device {device}; got {index.device}")


# ---- dispatch -----------------------------------------------------------------------------
def _dispatch_check(hidden: Tensor, row_token: Tensor, slot: Tensor) -> None:
    check_tensor("hidden", hidden, dtypes=FLOAT_DTYPES, min_dim=2)
    if hidden.dim() != 2:
        raise ValueError(f"hidden: expected 2 dims [T, H]; got {tuple(hidden.shape)}")
    if row_token.dim() != 1 or slot.dim() != 2 or slot.shape[0] != hidden.shape[0]:
        raise ValueError(
            f"row_token / slot: expected [R] and [T={hidden.shape[0]}, k]; got "
            f"{tuple(row_token.shape)} / {tuple(slot.shape)}"
        )
    _check_index("row_token", row_token, tuple(row_token.shape), hidden.device)
    _check_index("slot", slot, tuple(slot.shape), hidden.device)


def _dispatch_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    _, _, slot = inputs
    ctx.save_for_backward(slot)


def _dispatch_backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    (slot,) = ctx.saved_tensors
    return torch.ops.nki.moe_dispatch_backward(grad, slot), None, None


def _dispatch_examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    x = torch.randn(5, 24, generator=torch.Generator().manual_seed(0), requires_grad=True)
    # 5 tokens x 2 slots; token 3's second slot is not on this rank (R = 9 rows)
    slot = torch.tensor([[0, 5], [1, 6], [2, 7], [3, 9], [4, 8]], dtype=torch.int32)
    row_token = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 4], dtype=torch.int32)
    return [((x, row_token, slot), {})]


@define_op(
    "moe_dispatch",
    fake=lambda hidden, row_token, slot: hidden.new_empty((row_token.shape[0], hidden.shape[1])),
    validate=_dispatch_check,
    backward=_dispatch_backward,
    setup_context=_dispatch_setup,
    examples=_dispatch_examples,
    traceable=True,
)
def moe_dispatch(hidden: Tensor, row_token: Tensor, slot: Tensor) -> Tensor:
    """x_sorted [R, H] = hidden[row_token] (T: a zero row), NKI row gather."""
    return _sum(hidden, row_token.unsqueeze(1), None, hidden.dtype)


@define_op(
    "moe_dispatch_backward",
    fake=lambda grad, slot: grad.new_empty((slot.shape[0], grad.shape[1])),
    validate=lambda grad, slot: check_tensor("grad", grad, dtypes=FLOAT_DTYPES, min_dim=2),
    examples=lambda: [((torch.randn(9, 24), _dispatch_examples()[0][0][2]), {})],
    traceable=True,
)
def moe_dispatch_backward(grad: Tensor, slot: Tensor) -> Tensor:
    """d hidden [T, H] = sum_j grad[slot[t, j]] (R: nothing), fp32 sums, one rounding."""
    return _sum(grad, slot, None, grad.dtype)


# ---- combine ------------------------------------------------------------------------------
def _combine_check(
    y: Tensor, weights: Tensor, slot: Tensor, row_token: Tensor, row_slot: Tensor
) -> None:
    check_tensor("y", y, dtypes=FLOAT_DTYPES, min_dim=2)
    check_tensor("weights", weights, dtypes=FLOAT_DTYPES, min_dim=2)
    if y.dim() != 2 or weights.dim() != 2 or tuple(slot.shape) != tuple(weights.shape):
        raise ValueError(
            f"y / weights / slot: expected [R, H], [T, k], [T, k]; got {tuple(y.shape)} / "
            f"{tuple(weights.shape)} / {tuple(slot.shape)}"
        )
    r = (y.shape[0],)
    _check_index("slot", slot, tuple(weights.shape), y.device)
    _check_index("row_token", row_token, r, y.device)
    _check_index("row_slot", row_slot, r, y.device)
    if weights.device != y.device:
        raise ValueError(f"weights: expected device {y.device} (as y); got {weights.device}")


def _live_weights(weights: Tensor, slot: Tensor, rows: int) -> Tensor:
    """fp32 weights, 0 (a select) where the slot has no row."""
    w = weights.to(torch.float32)
    return torch.where(slot < rows, w, torch.zeros_like(w))


def _combine_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _combine_backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    y, weights, slot, row_token, row_slot = ctx.saved_tensors
    dy, dw = torch.ops.nki.moe_combine_backward(grad, y, weights, slot, row_token, row_slot)
    return dy, dw.to(weights.dtype), None, None, None


def _combine_examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(1)
    _, row_token, slot = _dispatch_examples()[0][0]
    y = torch.randn(9, 24, generator=g, requires_grad=True)
    w = torch.rand(5, 2, generator=g, requires_grad=True)
    row_slot = torch.tensor([0, 2, 4, 6, 8, 1, 3, 5, 9], dtype=torch.int32)
    return [((y, w, slot, row_token, row_slot), {})]


def _combine_fake(y: Tensor, weights: Tensor, *a: Any) -> Tensor:
    return y.new_empty((weights.shape[0], y.shape[1]), dtype=torch.float32)


@define_op(
    "moe_combine",
    fake=_combine_fake,
    validate=_combine_check,
    backward=_combine_backward,
    setup_context=_combine_setup,
    examples=_combine_examples,
    traceable=True,
)
def moe_combine(
    y: Tensor, weights: Tensor, slot: Tensor, row_token: Tensor, row_slot: Tensor
) -> Tensor:
    """out [T, H] fp32 = sum_j weights[t, j] y[slot[t, j]] (NKI; slot R: nothing)."""
    return _sum(y, slot, _live_weights(weights, slot, y.shape[0]), torch.float32)


def _combine_bwd_fake(grad: Tensor, y: Tensor, weights: Tensor, *a: Any) -> Any:
    return torch.empty_like(y), weights.new_empty(weights.shape, dtype=torch.float32)


@define_op(
    "moe_combine_backward",
    fake=_combine_bwd_fake,
    validate=lambda grad, *a: _combine_check(*a),
    examples=lambda: [((torch.randn(5, 24), *(t.detach() for t in _combine_examples()[0][0])), {})],
    traceable=True,
)
def moe_combine_backward(
    grad: Tensor, y: Tensor, weights: Tensor, slot: Tensor, row_token: Tensor, row_slot: Tensor
) -> tuple[Tensor, Tensor]:
    """(d y [R, H] in y's dtype, d weights [T, k] fp32) of `moe_combine` (NKI gathers)."""
    t, k = weights.shape
    w_flat = _live_weights(weights, slot, y.shape[0]).reshape(-1)
    serves = row_slot < t * k
    w_row = torch.where(serves, w_flat[row_slot.clamp(max=t * k - 1).long()], 0.0)
    dy = _sum(grad, row_token.unsqueeze(1), w_row.unsqueeze(1), y.dtype)
    if t == 0:
        return dy, weights.new_zeros((0, k), dtype=torch.float32)
    dw = launch(gather_rows_dot, grad.detach().contiguous(), y.detach().contiguous(),
                slot.contiguous(), target=get_target(None))  # fmt: skip
    return dy, torch.where(slot < y.shape[0], dw, torch.zeros_like(dw))
