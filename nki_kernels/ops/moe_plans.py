"""Host block plans of the MoE ops: the padded routing grouped into expert blocks
(`moe/grouping.py`) and the forward's save plan of the pre-activation gate / up for the
backward's blocks. Each is a host op (`nki_host::moe_block_plan`, `nki_host::moe_save_plan`)
while an op body is traced; its static block count depends on shapes only."""

from __future__ import annotations

import torch
from torch import Tensor

from ..moe.config import MoEProblem
from ..moe.grouping import PARTITIONS, gate_up_columns, max_blocks, min_blocks, plan_blocks
from ..moe.reference import capacity
from ..runtime.buckets import current_policy
from ..runtime.host_array import host_numpy
from .moe_checks import gate_up_width
from .registry import call_host_op, define_host_op, tracing


def _dtype_name(t: Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _bucket_floor(tb: int) -> int:
    """The smallest token count that pads to bucket `tb` (static plan bounds hold for it)."""
    lower = [b for b in current_policy().buckets(tb) if b < tb]
    return (lower[-1] + 1) if lower else 1


PLAN_TENSORS = (
    "slot_token",
    "slot_weight",
    "block_expert",
    "block_keep",
    "block_count",
    "token_slot",
    "token_weight",
    "kind_bounds",
)


def _block_plan(
    weights: Tensor,
    ids: Tensor,
    tokens: int,
    experts: int,
    block: int,
    capacity_factor: float | None,
    min_tokens: int,
    sized: bool,
) -> list[Tensor]:
    """The host block plan (grouping.py; `sized`: variable-size blocks, the forward's) of
    the padded routing as tensors on its device (`PLAN_TENSORS`); the body of the
    `nki_host::moe_block_plan` node under tracing."""
    tb = weights.shape[0]
    w, i = host_numpy(weights[:tokens]), host_numpy(ids[:tokens])
    plan = plan_blocks(
        i, w, experts, block, capacity_factor, num_tokens=tb, min_tokens=min_tokens, sized=sized
    )
    return [torch.from_numpy(getattr(plan, n)).to(weights.device) for n in PLAN_TENSORS]


def _block_plan_fake(
    weights: Tensor,
    ids: Tensor,
    tokens: int,
    experts: int,
    block: int,
    capacity_factor: float | None,
    min_tokens: int,
    sized: bool,
) -> list[Tensor]:
    tb, k = ids.shape
    cap = None if capacity_factor is None else capacity(tb, experts, k, capacity_factor)
    nb = max_blocks(tb, k, experts, block, cap)
    ns = block // PARTITIONS
    i32, f32 = torch.int32, torch.float32
    shapes = (
        ((nb, PARTITIONS, ns), i32),
        ((nb, PARTITIONS, ns), f32),
        ((nb, 1), i32),
        ((nb, 1), f32),
        ((1, 1), i32),
        ((tb, k), i32),
        ((tb, k), f32),
        ((1, ns + 1), i32),
    )
    return [weights.new_empty(shape, dtype=dt) for shape, dt in shapes]


define_host_op("moe_block_plan", _block_plan, fake=_block_plan_fake)


def _plan(
    weights: Tensor,
    ids: Tensor,
    t: int,
    e: int,
    block: int,
    cf: float | None,
    sized: bool = False,
) -> tuple[dict[str, Tensor], int]:
    """(plan tensors by name, static block count) of the padded routing (`sized`: the
    forward's variable-size blocks). The static count depends on shapes only; the plan
    reads the routing, so while the op body is traced it is the `nki_host::moe_block_plan`
    node."""
    tb, k = ids.shape
    lowest = min(t, _bucket_floor(tb))
    static = min_blocks(lowest, k, e, block, None if cf is None else capacity(lowest, e, k, cf))
    if tracing(weights, ids):
        tensors = call_host_op("moe_block_plan", weights, ids, t, e, block, cf, lowest, sized)
    else:
        tensors = _block_plan(weights, ids, t, e, block, cf, lowest, sized)
    return dict(zip(PLAN_TENSORS, tensors)), static


def _problem(tb: int, w_gate_up: Tensor, top_k: int, w_up: Tensor | None = None) -> MoEProblem:
    e, h = int(w_gate_up.shape[0]), int(w_gate_up.shape[1])
    i = gate_up_width(w_gate_up, w_up) // 2
    return MoEProblem(tb, h, i, e, top_k, _dtype_name(w_gate_up))


def _save_plan(
    weights: Tensor,
    ids: Tensor,
    tokens: int,
    experts: int,
    block_fwd: int,
    block_bwd: int,
    capacity_factor: float | None,
    min_tokens: int,
) -> list[Tensor]:
    """[save_cols, save_holes] (`grouping.gate_up_columns`) of the forward's sized plan
    and the backward's fixed one (block sizes `block_fwd`, `block_bwd`) of the padded routing;
    the body of the `nki_host::moe_save_plan` node under tracing."""
    tb = weights.shape[0]
    w, i = host_numpy(weights[:tokens]), host_numpy(ids[:tokens])
    fwd = plan_blocks(
        i, w, experts, block_fwd, capacity_factor, num_tokens=tb, min_tokens=min_tokens, sized=True
    )
    bwd = plan_blocks(
        i, w, experts, block_bwd, capacity_factor, num_tokens=tb, min_tokens=min_tokens
    )
    return [torch.from_numpy(a).to(weights.device) for a in gate_up_columns(fwd, bwd)]


def _saved_gate_up(
    gate_up: Tensor | None, width: int, m: dict[str, Tensor], block: int, op: str
) -> Tensor | None:
    """The forward's saved gate / up for the backward plan `m` (None or empty: recomputed),
    its shape checked against that plan (`width`: 2I)."""
    if gate_up is None or not gate_up.numel():
        return None
    want = (width, (m["slot_token"].shape[0] + 2) * block)
    if tuple(gate_up.shape) != want:
        raise ValueError(
            f"gate_up: expected [2I, (NB + 2) * B] = {want} ({op}'s save for this bucket's "
            f"backward plan); got {tuple(gate_up.shape)}"
        )
    return gate_up.detach()


def _save_width(tb: int, k: int, e: int, block_bwd: int, cf: float | None) -> int:
    """Columns of the saved gate / up: (the backward plan's NB + 2) * its block size."""
    cap = None if cf is None else capacity(tb, e, k, cf)
    return (max_blocks(tb, k, e, block_bwd, cap) + 2) * block_bwd


def _save_plan_fake(
    weights: Tensor,
    ids: Tensor,
    tokens: int,
    experts: int,
    block_fwd: int,
    block_bwd: int,
    capacity_factor: float | None,
    min_tokens: int,
) -> list[Tensor]:
    tb, k = ids.shape
    cap = None if capacity_factor is None else capacity(tb, experts, k, capacity_factor)
    nb = max_blocks(tb, k, experts, block_fwd, cap)
    width = _save_width(tb, k, experts, block_bwd, capacity_factor)
    return [
        weights.new_empty((nb, 1), dtype=torch.int32),
        weights.new_empty((width // PARTITIONS + 1, 1), dtype=torch.int32),
    ]


define_host_op("moe_save_plan", _save_plan, fake=_save_plan_fake)
