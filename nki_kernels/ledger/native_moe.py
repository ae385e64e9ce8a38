"""The backward of the dropless `_grouped_mm` MoE as native steps (for the ledger's training rows).

`baselines.moe_native` composes the forward TorchNeuron runs for the plain PyTorch MoE
(TorchTitan's `GroupedExperts` on `aten::_grouped_mm`, torch-neuronx 2.34 release notes).
Autograd's backward of that forward, per expert group of `rows` routed rows (padded to
128 as the forward), is four matmuls and two fused element-wise passes:

    dY_rows  = gather(dY)                      gather
    dY_w     = w * dY_rows, dw = rowsum(...)   one streaming pass
    dH       = dY_w W_down^T                   [rows, H] x [H, I]
    dW_down  = H^T dY_w                        [I, rows] x [rows, H]
    dG, dU   = silu'(G) U dH, silu(G) dH       one streaming pass over (dH, G, U)
    dX_rows  = [dG dU] W_gate_up^T             [rows, 2I] x [2I, H]
    dW_gu    = X_rows^T [dG dU]                [H, rows] x [rows, 2I]
    dX      += scatter(dX_rows)                scatter

then the router's backward (softmax backward over [T, E], one streaming pass). Each step
is a well-tiled kernel from `baselines.steps`, priced like every native composition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..baselines import steps
from ..baselines.moe_native import GROUP_ALIGN
from ..baselines.native import F32, Step
from ..interp import TensorSpec


def _t(shape: tuple[int, ...], dtype: str) -> TensorSpec:
    return TensorSpec(shape, dtype)


def _group_bwd(rows: int, tokens: int, hidden: int, inter: int, dtype: str, n: int) -> list[Step]:
    idx = _t((rows, 1), "int32")
    rh, ri = _t((rows, hidden), dtype), _t((rows, inter), dtype)
    return [
        Step("gather dY rows", steps.gather_rows, (_t((tokens, hidden), dtype), idx), n),
        Step("dY * w, dw", steps.stream_rows, (rh, rh, _t((rows, 1), F32), None, 0, 1, dtype), n),
        Step(
            "dH = dY W_down^T",
            steps.matmul_step,
            (_t((hidden, rows), dtype), _t((hidden, inter), dtype), dtype),
            n,
        ),
        Step(
            "dW_down = H^T dY",
            steps.matmul_step,
            (_t((rows, inter), dtype), _t((rows, hidden), dtype), dtype),
            n,
        ),
        Step("dG, dU (silu')", steps.stream_rows, (ri, ri, None, None, 1, 3, dtype), n),
        Step(
            "dX = dGU W_gu^T",
            steps.matmul_step,
            (_t((2 * inter, rows), dtype), _t((2 * inter, hidden), dtype), dtype),
            n,
        ),
        Step(
            "dW_gu = X^T dGU",
            steps.matmul_step,
            (_t((rows, hidden), dtype), _t((rows, 2 * inter), dtype), dtype),
            n,
        ),
        Step("scatter dX rows", steps.gather_rows, (rh, idx), n),
    ]


def grouped_mm_bwd(
    tokens: int, hidden: int, inter: int, experts: int, dtype: str, counts: Sequence[int]
) -> list[Step]:
    """Backward of `moe_native.grouped_mm_fwd` for per-expert routed-row `counts`."""
    if len(counts) != experts:
        raise ValueError(f"counts: expected {experts} per-expert counts; got {len(counts)}")
    logits = _t((tokens, experts), F32)
    out = [Step("router softmax bwd", steps.stream_rows, (logits, logits, None, None, 0, 2, F32))]
    sizes: dict[int, int] = {}
    for c in counts:
        g = GROUP_ALIGN * math.ceil(c / GROUP_ALIGN)
        if g > 0:
            sizes[g] = sizes.get(g, 0) + 1
    for rows, n in sizes.items():
        out += _group_bwd(rows, tokens, hidden, inter, dtype, n)
    return out
