"""MoE compositions AWS's stack runs without a fused kernel, as native steps.

Three compositions, all a router (softmax over [T, E] logits, top-k) followed by
per-group expert MLPs (gather rows -> x W_gate_up -> silu(g) * u -> h W_down -> weighted
combine, scattered back):

- `blockwise_fwd` -- NxD's dropless `forward_blockwise` (aws-neuron/neuronx-distributed
  @ fbac349b, `modules/moe/expert_mlps_v2.py`; its pure-PyTorch variant
  `torch_blockwise_matmul_inference`): a static number of blocks of B rows,
  N = ceil((T k - (E - 1)) / B) + (E - 1), each block owned by one expert, so any routing
  fits without dropping a token. The shape is static: the cost does not depend on the
  routing. B = 512 here, the block size of our blockwise kernel (NxD takes it from its
  `BlockwiseMatmulConfig`).
- `grouped_mm_fwd` -- TorchNeuron's `aten::_grouped_mm` (registered on neuron, 128-aligned
  group offsets): the T k routed rows sorted by expert, each expert's group padded to a
  multiple of 128 rows; routing-aware (the group sizes come from the routing).
- `capacity_factor_fwd` -- GShard capacity C = ceil(cf T k / E) per expert (NxD's
  `forward_capacity_factor`): tokens over capacity are DROPPED, so it is not a dropless
  baseline and is labelled as such wherever it is shown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..interp import TensorSpec
from . import steps
from .native import F32, Step

NXD_BLOCK = 512  # rows per block of the blockwise composition
GROUP_ALIGN = 128  # _grouped_mm's group-offset alignment on neuron


def _t(shape: tuple[int, ...], dtype: str) -> TensorSpec:
    return TensorSpec(shape, dtype)


def blockwise_blocks(tokens: int, experts: int, top_k: int, block: int = NXD_BLOCK) -> int:
    """NxD's static block count: ceil((T k - (E - 1)) / B) + (E - 1), the first term
    clamped at 0 when T k < E - 1."""
    return max(0, math.ceil((tokens * top_k - (experts - 1)) / block)) + (experts - 1)


def moe_capacity(tokens: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """GShard capacity per expert: ceil(cf T k / E), at least 1, at most T."""
    return min(tokens, max(1, math.ceil(capacity_factor * tokens * top_k / experts)))


def _router(tokens: int, experts: int) -> list[Step]:
    logits = _t((tokens, experts), F32)
    return [
        Step("router softmax", steps.softmax_rows, (logits, 1.0, F32)),
        Step("top-k", steps.reduce_rows, (logits, False, 2)),
    ]


def _expert_mlp(rows: int, hidden: int, inter: int, dtype: str, repeat: int) -> list[Step]:
    """The expert MLP on one group of `rows` gathered rows, `repeat` identical groups."""
    return [
        Step(
            "x W_gate_up",
            steps.matmul_step,
            (_t((hidden, rows), dtype), _t((hidden, 2 * inter), dtype), dtype),
            repeat,
        ),
        Step(
            "silu(g) * u",
            steps.stream_rows,
            (_t((rows, inter), dtype), _t((rows, inter), dtype), None, None, 1, 1, dtype),
            repeat,
        ),
        Step(
            "h W_down",
            steps.matmul_step,
            (_t((inter, rows), dtype), _t((inter, hidden), dtype), dtype),
            repeat,
        ),
    ]


def _gather_combine(rows: int, tokens: int, hidden: int, dtype: str, repeat: int) -> list[Step]:
    idx = _t((rows, 1), "int32")
    return [
        Step("gather out rows", steps.gather_rows, (_t((tokens, hidden), dtype), idx), repeat),
        Step(
            "out += w * y",
            steps.stream_rows,
            (
                _t((rows, hidden), dtype),
                _t((rows, hidden), dtype),
                _t((rows, 1), F32),
                None,
                0,
                0,
                dtype,
            ),
            repeat,
        ),
        Step("scatter out rows", steps.gather_rows, (_t((rows, hidden), dtype), idx), repeat),
    ]


def _grouped(
    tokens: int, hidden: int, inter: int, experts: int, dtype: str, groups: Sequence[int]
) -> list[Step]:
    """Router, then per group size (identical sizes priced once, repeated): gather, MLP,
    combine."""
    out = _router(tokens, experts)
    sizes: dict[int, int] = {}
    for g in groups:
        if g > 0:
            sizes[g] = sizes.get(g, 0) + 1
    for rows, n in sizes.items():
        idx = _t((rows, 1), "int32")
        out.append(
            Step(
                f"gather {rows} token rows",
                steps.gather_rows,
                (_t((tokens, hidden), dtype), idx),
                n,
            )
        )
        out += _expert_mlp(rows, hidden, inter, dtype, n)
        out += _gather_combine(rows, tokens, hidden, dtype, n)
    return out


def blockwise_fwd(
    tokens: int,
    hidden: int,
    inter: int,
    experts: int,
    top_k: int,
    dtype: str,
    block: int = NXD_BLOCK,
) -> list[Step]:
    """NxD's static dropless blockwise composition (routing-independent)."""
    n = blockwise_blocks(tokens, experts, top_k, block)
    return _grouped(tokens, hidden, inter, experts, dtype, [block] * n)


def grouped_mm_fwd(
    tokens: int, hidden: int, inter: int, experts: int, dtype: str, counts: Sequence[int]
) -> list[Step]:
    """`aten::_grouped_mm` with each expert's `counts[e]` routed rows padded to 128."""
    if len(counts) != experts:
        raise ValueError(f"counts: expected {experts} per-expert counts; got {len(counts)}")
    groups = [GROUP_ALIGN * math.ceil(c / GROUP_ALIGN) for c in counts]
    return _grouped(tokens, hidden, inter, experts, dtype, groups)


def capacity_factor_fwd(
    tokens: int,
    hidden: int,
    inter: int,
    experts: int,
    top_k: int,
    dtype: str,
    capacity_factor: float = 1.25,
) -> list[Step]:
    """GShard capacity-factor composition (MAY DROP TOKENS): E groups of C rows."""
    c = moe_capacity(tokens, experts, top_k, capacity_factor)
    return _grouped(tokens, hidden, inter, experts, dtype, [c] * experts)
