"""`torch.ops.nki.grouped_mm(x_sorted, w, offs)`: the grouped matmul of MoE experts.

    grouped_mm(x_sorted [M, K], w [G, K, N], offs [G] int32) -> [M, N]
    out[offs[g-1] : offs[g]] = x_sorted[offs[g-1] : offs[g]] @ w[g]      (offs[-1] = 0)

The contract of `torch._grouped_mm(mat_a, mat_b, offs=offs)` in its 2-D x 3-D form (the
MoE forward; torch/_meta_registrations.py `_create_grouped_mm_output_tensor`, torch
2.13): offs are the cumulative *end* offsets of the groups along M, non-decreasing, the
last <= M; a group with offs[g] == offs[g-1] is empty (its weights get a zero gradient).
Rows past offs[-1] belong to no group: torch leaves them unwritten, here they are zeros
(and their gradient is zero). x and w share one dtype, bf16 / fp16 / fp32; the result has
it (fp32 accumulation, one rounding). `w` may be a transposed view (TorchTitan passes
`w.transpose(-2, -1)` of a [G, N, K] weight): the kernel then reads the [G, N, K] storage
directly, without a copy. torch._grouped_mm's other forms (2-D x 2-D with offs along K,
3-D x 2-D, batched 3-D x 3-D) are refused by name: the first is the weight gradient,
`grouped_mm_weight_grad` below; TorchTitan's seam and its backward need only 2-D x 3-D.
Offsets torch's CPU kernel takes without a check (decreasing, negative, past M) are errors.

Backward: dx = grouped_mm(dy, w^T, offs) (the same kernel, the other weight layout) and
dw = `torch.ops.nki.grouped_mm_weight_grad(x, dy, offs)` (dw[g] = x_g^T dy_g, one fp32
sum per group on chip). Eager, under `torch.compile(fullgraph=True)` (the row plan,
which reads offs, is one `nki_host::grouped_mm_plan` node), on CPU and the neuron device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..moe.group_plan import P, max_blocks, plan_row_blocks, plan_row_tiles
from ..moe.grouped_gemm import GATHER_COLS, W_BUFS, grouped_mm_fwd, grouped_mm_wgrad
from ..runtime import launch, pad_to_bucket, unpad
from ..runtime.host_array import host_numpy
from ..targets import get_target
from .checks import FLOAT_DTYPES, check_tensor
from .registry import call_host_op, define_host_op, define_op, tracing

SBUF_BUDGET = 160 * 1024  # bytes per partition the forward's tiles may use (trn2: 192 KiB)
WEIGHT_UNIT_BYTES = 8 * 1024  # bytes per partition of one weight unit (1 MiB per load)


def tile_sizes(k: int, n: int, itemsize: int) -> tuple[int, int]:
    """(block_rows, unit_bytes) of the forward: the largest block (weight reuse: a block
    streams its group's weights once) whose tiles fit `SBUF_BUDGET` per partition: the
    transposed rows ceil(K/128) * block_rows, a gathered column chunk and W_BUFS weight
    units of WEIGHT_UNIT_BYTES."""
    kt = -(-k // P)
    del n  # the units' width follows the block size in the kernel
    for rows in (512, 384, 256, 128):
        used = (kt * rows + (rows // P) * GATHER_COLS) * itemsize + W_BUFS * WEIGHT_UNIT_BYTES
        if used <= SBUF_BUDGET:
            return rows, WEIGHT_UNIT_BYTES
    return P, WEIGHT_UNIT_BYTES


# ---- checks -------------------------------------------------------------------------------
def _check(x: Tensor, w: Tensor, offs: Tensor) -> None:
    check_tensor("x_sorted", x, dtypes=FLOAT_DTYPES, min_dim=2, nonempty=False)
    if x.dim() != 2:
        raise ValueError(
            f"x_sorted: expected 2 dims [M, K] (torch._grouped_mm's 2-D x 3-D form only; its "
            f"3-D x 3-D form is torch.bmm); got {tuple(x.shape)}"
        )
    check_tensor("w", w, dtypes=FLOAT_DTYPES, min_dim=2, nonempty=False)
    if w.dim() != 3:
        raise ValueError(
            f"w: expected 3 dims [G, K, N] (torch._grouped_mm's 2-D x 3-D form only; its "
            f"2-D x 2-D weight-gradient form is torch.ops.nki.grouped_mm_weight_grad(x_sorted, "
            f"grad, offs)); got {tuple(w.shape)}"
        )
    if w.dtype != x.dtype:
        raise TypeError(f"w: expected dtype {x.dtype} (as x_sorted); got {w.dtype}")
    if w.shape[1] != x.shape[1]:
        raise ValueError(
            f"w: expected [G, K={x.shape[1]}, N] (K from x_sorted); got {tuple(w.shape)}"
        )
    if w.shape[0] < 1 or w.shape[1] < 1 or w.shape[2] < 1:
        raise ValueError(f"w: expected G, K, N >= 1; got {tuple(w.shape)}")
    check_tensor("offs", offs, dtypes=(torch.int32,), min_dim=1, nonempty=False)
    if tuple(offs.shape) != (w.shape[0],):
        raise ValueError(
            f"offs: expected shape ({w.shape[0]},) (one end offset per group of w); got "
            f"{tuple(offs.shape)}"
        )
    for arg, t in (("w", w), ("offs", offs)):
        if t.device != x.device:
            raise ValueError(f"{arg}: expected device {x.device} (as x_sorted); got {t.device}")


def _check_wgrad(x: Tensor, dy: Tensor, offs: Tensor) -> None:
    check_tensor("x_sorted", x, dtypes=FLOAT_DTYPES, min_dim=2, nonempty=False)
    check_tensor("grad", dy, dtypes=FLOAT_DTYPES, min_dim=2, nonempty=False)
    if x.dim() != 2 or dy.dim() != 2 or dy.shape[0] != x.shape[0]:
        raise ValueError(
            f"grad: expected [M={x.shape[0]}, N] beside x_sorted [M, K] = {tuple(x.shape)}; "
            f"got {tuple(dy.shape)}"
        )
    if dy.dtype != x.dtype:
        raise TypeError(f"grad: expected dtype {x.dtype} (as x_sorted); got {dy.dtype}")
    check_tensor("offs", offs, dtypes=(torch.int32,), min_dim=1)
    if offs.dim() != 1:
        raise ValueError(f"offs: expected 1 dim [G]; got {tuple(offs.shape)}")
    for arg, t in (("grad", dy), ("offs", offs)):
        if t.device != x.device:
            raise ValueError(f"{arg}: expected device {x.device} (as x_sorted); got {t.device}")


# ---- host plans ---------------------------------------------------------------------------
def _fwd_plan(offs: Tensor, m: int, rows: int, block_rows: int) -> list[Tensor]:
    """The forward's row-block plan of `m` rows padded to `rows` (group_plan.py)."""
    plan = plan_row_blocks(host_numpy(offs), m, block_rows, rows)
    arrays = (plan.slot_rows, plan.block_group, plan.kind_bounds)
    return [torch.from_numpy(a).to(offs.device) for a in arrays]


def _fwd_plan_fake(offs: Tensor, m: int, rows: int, block_rows: int) -> list[Tensor]:
    nb, ns = max_blocks(rows, offs.shape[0], block_rows, tail=True), block_rows // P
    return [offs.new_empty(s, dtype=torch.int32) for s in ((nb, P, ns), (nb, 1), (1, ns + 2))]


def _tile_plan(offs: Tensor, m: int, rows: int) -> list[Tensor]:
    """The weight gradient's 128-row tile plan of `m` rows padded to `rows`."""
    plan = plan_row_tiles(host_numpy(offs), m, rows)
    return [torch.from_numpy(a).to(offs.device) for a in (plan.tile_rows, plan.group_bounds)]


def _tile_plan_fake(offs: Tensor, m: int, rows: int) -> list[Tensor]:
    nt, g = max_blocks(rows, offs.shape[0], P), offs.shape[0]
    return [offs.new_empty(s, dtype=torch.int32) for s in ((nt, P, 1), (1, g + 1))]


define_host_op("grouped_mm_plan", _fwd_plan, fake=_fwd_plan_fake)
define_host_op("grouped_mm_tile_plan", _tile_plan, fake=_tile_plan_fake)


def _weight_layout(w: Tensor) -> tuple[Tensor, str]:
    """(the tensor the kernel reads, "kn" for [G, K, N] storage or "nk" for [G, N, K])."""
    if w.is_contiguous():
        return w, "kn"
    wt = w.transpose(-2, -1)
    if wt.is_contiguous():
        return wt, "nk"
    return w.contiguous(), "kn"


# ---- grouped_mm ---------------------------------------------------------------------------
def _setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, w, offs = inputs
    ctx.save_for_backward(x, w, offs)


def _backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    x, w, offs = ctx.saved_tensors
    dy = grad.to(x.dtype)
    dx = dw = None
    if ctx.needs_input_grad[0]:
        dx = torch.ops.nki.grouped_mm(dy, w.transpose(-2, -1), offs)
    if ctx.needs_input_grad[1]:
        dw = torch.ops.nki.grouped_mm_weight_grad(x, dy, offs)
    return dx, dw, None


def _examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 24, generator=g, requires_grad=True)
    w = torch.randn(3, 24, 20, generator=g, requires_grad=True)
    offs = torch.tensor([10, 10, 33], dtype=torch.int32)
    wb = torch.randn(2, 20, 24, generator=g).bfloat16().transpose(-2, -1)
    xb = torch.randn(9, 24, generator=g).bfloat16()
    return [((x, w, offs), {}), ((xb, wb, torch.tensor([4, 9], dtype=torch.int32)), {})]


@define_op(
    "grouped_mm",
    fake=lambda x, w, offs: x.new_empty((x.shape[0], w.shape[2])),
    validate=_check,
    backward=_backward,
    setup_context=_setup,
    examples=_examples,
    traceable=True,
)
def grouped_mm(x_sorted: Tensor, w: Tensor, offs: Tensor) -> Tensor:
    """Per group g: x_sorted[rows of g] @ w[g] (rows of g: offs[g-1] .. offs[g]) (NKI)."""
    return grouped_mm_forward(x_sorted, w, offs)


def grouped_mm_forward(x_sorted: Tensor, w: Tensor, offs: Tensor) -> Tensor:
    """The op's forward body (plan + kernel launch), for other ops' bodies to call (on
    detached tensors)."""
    m, n = x_sorted.shape[0], w.shape[2]
    if m == 0:
        return x_sorted.new_zeros((0, n))
    xp, _ = pad_to_bucket(x_sorted.detach(), 0)
    rows = xp.shape[0]
    wk, layout = _weight_layout(w.detach())
    block_rows, unit_bytes = tile_sizes(x_sorted.shape[1], n, x_sorted.element_size())
    if tracing(offs):
        plan = call_host_op("grouped_mm_plan", offs, m, rows, block_rows)
    else:
        plan = _fwd_plan(offs, m, rows, block_rows)
    out = launch(
        grouped_mm_fwd,
        xp,
        wk,
        *plan,
        target=get_target(None),
        w_layout=layout,
        unit_bytes=unit_bytes,
    )
    return unpad(out, 0, m).contiguous()


@define_op(
    "grouped_mm_weight_grad",
    fake=lambda x, grad, offs: x.new_empty((offs.shape[0], x.shape[1], grad.shape[1])),
    validate=_check_wgrad,
    examples=lambda: [
        (
            (
                torch.randn(37, 24),
                torch.randn(37, 20),
                torch.tensor([10, 10, 33], dtype=torch.int32),
            ),
            {},
        )
    ],
    traceable=True,
)
def grouped_mm_weight_grad(x_sorted: Tensor, grad: Tensor, offs: Tensor) -> Tensor:
    """dw [G, K, N]: per group g, x_sorted[rows of g]^T @ grad[rows of g] (NKI)."""
    g, k, n = offs.shape[0], x_sorted.shape[1], grad.shape[1]
    if x_sorted.shape[0] == 0:
        return x_sorted.new_zeros((g, k, n))
    xp, m = pad_to_bucket(x_sorted.detach(), 0)
    dp, _ = pad_to_bucket(grad.detach(), 0)
    rows = xp.shape[0]
    if tracing(offs):
        plan = call_host_op("grouped_mm_tile_plan", offs, m, rows)
    else:
        plan = _tile_plan(offs, m, rows)
    return launch(grouped_mm_wgrad, xp, dp, *plan, target=get_target(None))
